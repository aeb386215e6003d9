//! `beige mcp serve --agent NAME`: a stdio MCP server for a client's config (Claude
//! Code, Codex, editors) that forwards `tools/list`, `tools/call` and cancellations to
//! the running gateway's `/mcp/agents/{name}` with an rmcp streamable-HTTP client. It
//! decides nothing itself: the gateway's endpoint is the one implementation.
//!
//! Owns finding the gateway and the token (`--token-file`, else `BEIGE_TOKEN`, else
//! `<BEIGE_HOME>/gateway.token`), the checks before serving (the gateway runs, the
//! token is accepted, the agent exists: each failure is one message on stderr naming
//! what to do, and a non-zero exit), and the proxy handler. Nothing but MCP is written
//! to stdout.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use beige_core::home::BeigeHome;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, Implementation, ListToolsRequest, ListToolsResult, PaginatedRequestParams,
    ProtocolVersion, ServerCapabilities, ServerConfig, ServerResult,
};
use rmcp::service::{RequestContext, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ErrorData as McpError, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::client::{not_running_message, read_token, Target};
use crate::{code, Exit};

/// `beige mcp …`.
#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Serve an agent's tools to an MCP client over stdio, through the running gateway
    #[command(
        after_help = "Put it in an MCP client's config as the server command, e.g.
  {\"mcpServers\": {\"beige\": {\"command\": \"beige\", \"args\": [\"mcp\", \"serve\", \"--agent\", \"assistant\"]}}}

The client gets the agent's core tools (read, write, patch, exec) and its allowed plugin tools;
every call is checked by the gateway's policy and audited with channel \"mcp\".

The token: --token-file, else $BEIGE_TOKEN, else <BEIGE_HOME>/gateway.token.

Exit codes:
  1  the MCP session failed
  2  wrong usage, or the token file cannot be read
  3  the gateway is not running
  4  no such agent
  5  the gateway refused the token"
    )]
    Serve(McpServeArgs),
    /// The MCP servers an agent has and their tools (allowed or not), from the running
    /// gateway
    #[command(
        after_help = "Servers that are not running are started for their lists (in the agent's sandbox, or\nthrough its egress for a remote one). A server that cannot list its tools is shown with\nits error.\n\nExit codes:\n  1  the gateway answered with an error (e.g. no such agent)\n  3  the gateway is not running"
    )]
    List(McpListArgs),
}

/// `beige mcp list`.
#[derive(Debug, clap::Args)]
pub struct McpListArgs {
    /// The agent
    pub agent: String,
    /// Print the gateway's JSON answer instead of a table
    #[arg(long)]
    pub json: bool,
}

/// `beige mcp list AGENT`: the agent's servers and their tools.
pub async fn list(target: &crate::client::Target, args: &McpListArgs) -> anyhow::Result<()> {
    use beige_core::api::Admin as _;
    let gw = target.remote()?;
    let servers = match gw.mcp_servers(&args.agent).await {
        Ok(s) => s,
        Err(e) => return Err(crate::client::gateway_exit(target, e)),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&servers)?);
        return Ok(());
    }
    print!("{}", list_text(&args.agent, &servers));
    Ok(())
}

/// The table `beige mcp list` prints.
pub fn list_text(agent: &str, servers: &[beige_core::api::McpServerView]) -> String {
    use std::fmt::Write as _;
    if servers.is_empty() {
        return format!(
            "agent '{agent}' has no MCP server (a pattern in agents.{agent}.tools names one of mcp.servers)\n"
        );
    }
    let mut out = String::new();
    for s in servers {
        let allowed = s.tools.iter().filter(|t| t.allowed).count();
        let _ = write!(out, "{} ({}): ", s.server, s.kind);
        match &s.error {
            Some(e) => {
                let _ = writeln!(out, "unavailable: {e}");
            }
            None => {
                let _ = writeln!(out, "{} tools, {allowed} allowed", s.tools.len());
            }
        }
        for t in &s.tools {
            let mark = if t.allowed { " " } else { "✗" };
            let _ = write!(out, "  {mark} {} {}", s.server, t.command);
            if let Some(d) = &t.description {
                let _ = write!(out, "  — {d}");
            }
            out.push('\n');
        }
    }
    out
}

/// `beige mcp serve`.
#[derive(Debug, clap::Args)]
pub struct McpServeArgs {
    /// The agent whose tools are served
    #[arg(long, value_name = "NAME")]
    pub agent: String,
    /// Read the API token from this file [default: $BEIGE_TOKEN, else
    /// <BEIGE_HOME>/gateway.token]
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<std::path::PathBuf>,
}

/// The environment variable a token may come in.
pub const TOKEN_ENV: &str = "BEIGE_TOKEN";

/// Exit code when the gateway refuses the token.
const BAD_TOKEN: u8 = 5;

/// Where the token comes from: `--token-file`, else `BEIGE_TOKEN`, else the home's
/// `gateway.token`; the source is named in messages.
fn token(home: &BeigeHome, token_file: Option<&Path>) -> Result<(Option<String>, String), Exit> {
    if let Some(path) = token_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Exit::new(
                2,
                format!(
                    "error: cannot read the token file {}: {e} — pass a readable file to --token-file, or set {TOKEN_ENV}",
                    path.display()
                ),
            )
        })?;
        let t = text.trim().to_string();
        if t.is_empty() {
            return Err(Exit::new(
                2,
                format!("error: the token file {} is empty", path.display()),
            ));
        }
        return Ok((Some(t), path.display().to_string()));
    }
    if let Some(t) = std::env::var(TOKEN_ENV)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
    {
        return Ok((Some(t), format!("${TOKEN_ENV}")));
    }
    Ok((read_token(home), home.token_path().display().to_string()))
}

/// The checks before serving, each with its own message: the gateway answers, the
/// token is accepted, the agent exists.
async fn preflight(url: &str, token: Option<&str>, source: &str, agent: &str) -> Result<(), Exit> {
    if crate::client::health(url).await.is_none() {
        return Err(Exit::new(
            code::NOT_RUNNING,
            format!("error: {}", not_running_message(url)),
        ));
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Exit::new(1, format!("error: cannot make an HTTP client: {e}")))?;
    let mut request = client.get(format!("{url}/api/agents"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.map_err(|e| {
        Exit::new(
            code::NOT_RUNNING,
            format!("error: {}: {e}", not_running_message(url)),
        )
    })?;
    match response.status().as_u16() {
        401 => {
            return Err(Exit::new(
                BAD_TOKEN,
                match token {
                    None => format!("error: no token: the gateway at {url} needs one. Set {TOKEN_ENV}, pass --token-file, or run `beige setup` to create {source}"),
                    Some(_) => format!("error: the gateway at {url} refused the token from {source} — use the token of this gateway's home (BEIGE_HOME/gateway.token)"),
                },
            ))
        }
        s if !(200..300).contains(&s) => {
            let text = response.text().await.unwrap_or_default();
            return Err(Exit::new(
                1,
                format!("error: the gateway at {url} answered {s}: {text}"),
            ));
        }
        _ => {}
    }
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let names: Vec<&str> = body["agents"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["name"].as_str()).collect())
        .unwrap_or_default();
    if !names.contains(&agent) {
        return Err(Exit::new(
            code::UNKNOWN_AGENT,
            format!(
                "error: no agent '{agent}' in the gateway at {url} (agents: {}) — pass one of them to --agent",
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            ),
        ));
    }
    Ok(())
}

/// `beige mcp serve --agent NAME [--token-file F]`.
pub async fn serve(
    target: &Target,
    home: &BeigeHome,
    agent: &str,
    token_file: Option<&Path>,
) -> Result<()> {
    let (token, source) = token(home, token_file)?;
    preflight(&target.url, token.as_deref(), &source, agent).await?;
    let endpoint = format!("{}/mcp/agents/{agent}", target.url);
    let mut config = StreamableHttpClientTransportConfig::with_uri(endpoint.clone());
    if let Some(t) = &token {
        config = config.auth_header(t.clone());
    }
    let http = reqwest_rmcp::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| Exit::new(1, format!("error: cannot make an HTTP client: {e}")))?;
    let transport = StreamableHttpClientTransport::with_client(http, config);
    // A protocol version with sessions: a cancellation reaches the call it names.
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("beige-mcp-serve", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::V_2025_11_25);
    let upstream: RunningService<RoleClient, ClientConfig> =
        info.serve(transport).await.map_err(|e| {
            Exit::new(
                1,
                format!("error: could not open an MCP session at {endpoint}: {e}"),
            )
        })?;
    let proxy = Proxy {
        upstream: upstream.peer().clone(),
        info: upstream.peer().peer_info().map(|i| (*i).clone()),
    };
    let running = proxy.serve(rmcp::transport::stdio()).await.map_err(|e| {
        Exit::new(
            1,
            format!("error: the MCP client on stdin did not initialize: {e}"),
        )
    })?;
    running.waiting().await?;
    let _ = upstream.cancel().await;
    Ok(())
}

/// The stdio server: every request is the gateway's answer.
#[derive(Clone)]
struct Proxy {
    upstream: rmcp::Peer<RoleClient>,
    info: Option<rmcp::model::ServerPeerInfo>,
}

fn upstream_error(e: ServiceError) -> McpError {
    match e {
        ServiceError::McpError(e) => e,
        other => McpError::internal_error(
            format!("the beige gateway did not answer: {other} (is it still running? `beige gateway status`)"),
            None,
        ),
    }
}

impl ServerHandler for Proxy {
    fn get_info(&self) -> ServerConfig {
        match &self.info {
            Some(info) => {
                let mut config = ServerConfig::new(info.capabilities.clone());
                if let Some(s) = &info.server_info {
                    config = config.with_server_info(s.clone());
                }
                if let Some(i) = &info.instructions {
                    config = config.with_instructions(i.clone());
                }
                config
            }
            None => ServerConfig::new(ServerCapabilities::builder().enable_tools().build()),
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // Sent each time (not rmcp's cached list): a reload may change the tools.
        let request = ClientRequest::ListToolsRequest(ListToolsRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        match self.upstream.send_request(request).await {
            Ok(ServerResult::ListToolsResult(result)) => Ok(result),
            Ok(_) => Err(McpError::internal_error(
                "the beige gateway answered tools/list with something else",
                None,
            )),
            Err(e) => Err(upstream_error(e)),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // Dropping the upstream call sends `notifications/cancelled` to the gateway,
        // which kills a running exec.
        tokio::select! {
            r = self.upstream.call_tool_once(request) => r.map_err(upstream_error),
            // Not sent: rmcp drops the answer of a cancelled request.
            _ = context.ct.cancelled() => Ok(CallToolResult::error(vec![
                rmcp::model::ContentBlock::text("cancelled by the client"),
            ]).into()),
        }
    }
}

#[cfg(test)]
mod list_tests {
    use beige_core::api::{McpServerView, McpToolView};

    #[test]
    fn the_list_marks_denied_tools_and_shows_errors() {
        let servers = vec![
            McpServerView::new(
                "testsrv",
                "sandbox",
                vec![
                    McpToolView::new("add", "add", true, Some("Add two integers.".into())),
                    McpToolView::new("fail", "fail", false, None),
                ],
                None,
            ),
            McpServerView::new(
                "tracker",
                "remote",
                Vec::new(),
                Some("no egress rule".into()),
            ),
        ];
        let text = super::list_text("m", &servers);
        assert_eq!(
            text,
            "testsrv (sandbox): 2 tools, 1 allowed\n    testsrv add  — Add two integers.\n  ✗ testsrv fail\ntracker (remote): unavailable: no egress rule\n"
        );
        assert!(super::list_text("m", &[]).contains("no MCP server"));
    }
}
