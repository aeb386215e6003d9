//! A script's call of an MCP tool through `/tools/bin/<server>` (`spec/mcp.md` §1.3–
//! §1.4): the argv is read by the tool's grammar ([`crate::mcp::cli`]) against the
//! server's live tool list, then the call takes the guarded path every tool call takes
//! under its policy name `<server>.<tool>` — policy, approvals, hooks, audit — and, once
//! allowed, is checked against the tool's `inputSchema` and sent to the server by the
//! gateway's client ([`crate::mcp::client`]). Listings and help print only the tools
//! the agent's patterns allow, and run nothing.

use beige_protocol::socket::ToolResponse;

use super::{CallMeta, Guarded, Inner};
use crate::mcp::cli::{self, Invocation, ToolSpec};
use crate::mcp::client::McpError;
use crate::plugin::ToolResult;

/// How long a prompt waits for an MCP server's tool list.
const PROMPT_LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Inner {
    /// Whether `tool` (a launcher's name) is an MCP server of this gateway's config.
    pub(super) fn is_mcp_server(&self, tool: &str) -> bool {
        self.config
            .mcp
            .as_ref()
            .is_some_and(|m| m.servers.contains_key(tool))
    }

    /// The system prompt's entries for `agent`'s MCP servers: one signature line per
    /// allowed tool (the server is started for its list when it is not running; one
    /// that does not answer within [`PROMPT_LIST_WAIT`] is listed as unavailable).
    pub(super) async fn mcp_prompt_tools(&self, agent: &str) -> Vec<crate::PromptTool> {
        let mut out = Vec::new();
        for server in self.config.agent_mcp_servers(agent) {
            let description = match self.allowed_mcp_tools(agent, &server, PROMPT_LIST_WAIT).await {
                Ok(allowed) => cli::prompt_lines(&server, &allowed),
                Err(e) => format!(
                    "`{server}`: an MCP server as a CLI, unavailable right now ({e}); run `{server}` to retry and list its tools.\n"
                ),
            };
            out.push(crate::PromptTool {
                name: server,
                description: description.trim_end().to_string(),
                commands: Vec::new(),
                docs: false,
            });
        }
        out
    }

    /// `agent`'s MCP servers with every tool, allowed or not (`beige mcp list`); a
    /// server that does not list its tools within [`PROMPT_LIST_WAIT`] has its error.
    pub(super) async fn mcp_servers(&self, agent: &str) -> Vec<beige_client::McpServerView> {
        let mut out = Vec::new();
        for server in self.config.agent_mcp_servers(agent) {
            let kind = match self.config.mcp_server(agent, &server) {
                Ok(def) if def.url.is_some() => "remote",
                _ => "sandbox",
            };
            let listed = match self.config.mcp_server(agent, &server) {
                Ok(def) => {
                    tokio::time::timeout(PROMPT_LIST_WAIT, self.mcp.tools(agent, &server, &def))
                        .await
                        .map_err(|_| {
                            format!(
                                "it did not list its tools within {} s",
                                PROMPT_LIST_WAIT.as_secs()
                            )
                        })
                        .and_then(|r| r.map_err(|e| e.to_string()))
                }
                Err(e) => Err(e),
            };
            let (tools, error) = match listed {
                Ok(tools) => {
                    let (specs, _) = ToolSpec::from_tools(&tools);
                    let mut views = Vec::with_capacity(specs.len());
                    for spec in specs {
                        let allowed = self
                            .policy
                            .exposes(agent, &format!("{server}.{}", spec.name))
                            .await;
                        let description = spec
                            .description
                            .as_deref()
                            .and_then(|d| d.lines().next())
                            .map(|d| d.chars().filter(|c| !c.is_control()).take(200).collect());
                        views.push(beige_client::McpToolView::new(
                            spec.name,
                            spec.cli_name,
                            allowed,
                            description,
                        ));
                    }
                    (views, None)
                }
                Err(e) => (Vec::new(), Some(e)),
            };
            out.push(beige_client::McpServerView::new(server, kind, tools, error));
        }
        out
    }

    /// The tools of `server` the agent's patterns allow, waiting at most `wait` for the
    /// server.
    async fn allowed_mcp_tools(
        &self,
        agent: &str,
        server: &str,
        wait: std::time::Duration,
    ) -> Result<Vec<ToolSpec>, String> {
        let def = self.config.mcp_server(agent, server)?;
        let tools = tokio::time::timeout(wait, self.mcp.tools(agent, server, &def))
            .await
            .map_err(|_| format!("it did not list its tools within {} s", wait.as_secs()))?
            .map_err(|e| e.to_string())?;
        let (specs, _) = ToolSpec::from_tools(&tools);
        let mut allowed = Vec::with_capacity(specs.len());
        for spec in specs {
            if self
                .policy
                .exposes(agent, &format!("{server}.{}", spec.name))
                .await
            {
                allowed.push(spec);
            }
        }
        Ok(allowed)
    }

    /// Handles `<server> <argv…>` from a script of `meta.agent` (the socket checks of
    /// `handle_tool_request_in` already passed).
    pub(super) async fn handle_mcp_call(
        &self,
        meta: CallMeta<'_>,
        server: &str,
        argv: &[String],
        stdin: Option<Vec<u8>>,
    ) -> ToolResponse {
        let agent = meta.agent;
        if !self
            .config
            .agent_mcp_servers(agent)
            .iter()
            .any(|s| s == server)
        {
            let msg = crate::policy::not_allowed_message(server, agent);
            self.audit_denied(&meta, &msg).await;
            return ToolResponse::error(msg, cli::EXIT_TOOL_ERROR);
        }
        let def = match self.config.mcp_server(agent, server) {
            Ok(def) => def,
            Err(msg) => return ToolResponse::error(msg, cli::EXIT_SERVER_UNAVAILABLE),
        };
        let tools = match self.mcp.tools(agent, server, &def).await {
            Ok(tools) => tools,
            Err(e) => return ToolResponse::error(format!("{server}: {e}"), exit_code(&e)),
        };
        let (specs, _collisions) = ToolSpec::from_tools(&tools);
        let mut allowed = Vec::with_capacity(specs.len());
        for spec in &specs {
            if self
                .policy
                .exposes(agent, &format!("{server}.{}", spec.name))
                .await
            {
                allowed.push(spec.clone());
            }
        }
        let workspace = self.config.agent_workspace(&self.home, agent);
        let files = Files {
            workspace: &workspace,
            cwd: meta.cwd.as_deref(),
        };
        let invocation = match read_argv(server, &specs, &allowed, argv, stdin.as_deref(), &files) {
            Ok(invocation) => invocation,
            Err(response) => return response,
        };
        let Invocation::Call {
            tool,
            arguments,
            output,
        } = invocation
        else {
            return ToolResponse::error("unreachable: help after a call", cli::EXIT_USAGE);
        };
        let Some(spec) = specs.iter().find(|s| s.name == tool).cloned() else {
            return ToolResponse::error(
                format!("{server}: the server has no tool '{tool}'"),
                cli::EXIT_USAGE,
            );
        };
        let policy_name = format!("{server}.{tool}");
        // A stdio server's work happens in the sandbox; a remote one's, from the gateway.
        let target = if def.command.is_some() {
            crate::audit::Target::Sandbox
        } else {
            crate::audit::Target::Gateway
        };
        let meta = CallMeta {
            tool: &policy_name,
            target,
            ..meta
        };
        let limit = def.timeout_of(&tool);
        let call_id = format!("{:016x}", rand::random::<u64>());
        let mcp = self.mcp.clone();
        let workspace_dir = workspace.clone();
        let owner = self
            .specs
            .iter()
            .find(|s| s.agent == agent)
            .and_then(|s| match s.user {
                crate::config::SandboxUser::Id { uid, gid } => Some((uid, gid)),
                _ => None,
            });
        let (agent_name, server_name) = (agent.to_string(), server.to_string());
        let run = async move {
            let (agent, server) = (agent_name.as_str(), server_name.as_str());
            // Checked before the server sees anything: a model fixes its call from the
            // message on the next try.
            if let Err(e) = cli::validate(server, &spec, &arguments) {
                return Ok(ToolResult::fail(e.to_string(), e.exit_code()));
            }
            match mcp.call(agent, server, &def, &tool, arguments, limit).await {
                Ok(result) => {
                    let rendered = cli::render(server, &spec, &result, output, &call_id);
                    let mut out = rendered.stdout;
                    for (rel, bytes) in &rendered.files {
                        if let Err(e) = save_file(&workspace_dir, owner, rel, bytes) {
                            out.push_str(&format!(
                                "[beige] could not save /workspace/{rel}: {e}\n"
                            ));
                        }
                    }
                    if !rendered.stderr.is_empty() {
                        if rendered.exit_code == 0 {
                            out.push_str(&rendered.stderr);
                        } else {
                            out = format!("{}{out}", rendered.stderr);
                        }
                    }
                    Ok(ToolResult {
                        output: out,
                        exit_code: rendered.exit_code,
                    })
                }
                Err(e) => Ok(ToolResult::fail(format!("{e}\n"), exit_code(&e))),
            }
        };
        match self
            .guarded(
                meta,
                run,
                ToolResult::clone,
                |r: &ToolResult| (r.exit_code, r.output.len() as u64),
                |_, r| r,
            )
            .await
        {
            Ok(Guarded::Ran(mut result)) => {
                super::truncate_output(&mut result.output);
                ToolResponse::from_result(result.output, result.exit_code)
            }
            Ok(Guarded::Denied(r)) => ToolResponse::error(r.message, r.exit_code),
            Ok(Guarded::Failed(reason)) => ToolResponse::error(reason, cli::EXIT_TOOL_ERROR),
            Err(e) => ToolResponse::error(e.to_string(), cli::EXIT_TOOL_ERROR),
        }
    }
}

/// What `argv` asks of `server`: a call, or `Err` with the answer to give at once —
/// help and listings (of the `allowed` tools only) or a usage error. A call of a denied
/// tool is returned as a call (the guarded path refuses it: one denied record, exit 1).
fn read_argv(
    server: &str,
    specs: &[ToolSpec],
    allowed: &[ToolSpec],
    argv: &[String],
    stdin: Option<&[u8]>,
    files: &Files<'_>,
) -> Result<Invocation, ToolResponse> {
    let input = |source: cli::Source| match source {
        cli::Source::Stdin => stdin
            .map(<[u8]>::to_vec)
            .ok_or_else(|| "`--json -` reads the data piped in, and none was".to_string()),
        cli::Source::File(path) => files.read(&path),
    };
    match cli::parse(server, allowed, argv, &input) {
        Ok(Invocation::Help(text)) => Err(ToolResponse::from_result(text, 0)),
        Ok(call) => Ok(call),
        // A denied tool is not known to the grammar (no listing, help or "did you
        // mean" ever names it), but calling it by name is one denied record.
        Err(e) => match argv.first().and_then(|a| denied_named(a, specs, allowed)) {
            Some(tool) => Ok(Invocation::Call {
                tool,
                arguments: serde_json::Map::new(),
                output: cli::OutputMode::Text,
            }),
            None => Err(ToolResponse::error(e.message, e.exit_code)),
        },
    }
}

/// Where `--json @file` reads: the agent's workspace, beneath which every path is
/// opened (no links, no `..` out of it), relative to the call's working directory.
struct Files<'a> {
    workspace: &'a std::path::Path,
    /// The call's working directory, relative to the workspace.
    cwd: Option<&'a str>,
}

impl Files<'_> {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        let rel = match path.strip_prefix(crate::sandbox::spec::WORKSPACE) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                rest.trim_start_matches('/').to_string()
            }
            _ if path.starts_with('/') => {
                return Err(format!(
                    "`--json @{path}`: only files in /workspace can be read this way; pipe it in instead: `--json - < {path}`"
                ))
            }
            _ => match self.cwd.filter(|c| !c.is_empty() && *c != ".") {
                Some(cwd) => format!("{cwd}/{path}"),
                None => path.to_string(),
            },
        };
        let beneath = crate::fsutil::Beneath::open(self.workspace).map_err(|e| e.to_string())?;
        let capped = beneath
            .read(&rel, cli::MAX_ARGUMENT_BYTES)
            .map_err(|e| format!("`--json @{path}`: {e}"))?;
        if capped.truncated {
            return Err(format!(
                "`--json @{path}`: the file is larger than {} bytes, the limit for arguments",
                cli::MAX_ARGUMENT_BYTES
            ));
        }
        Ok(capped.bytes)
    }
}

/// Writes a file of a result (an image, audio, a resource) at `rel` (under
/// `.beige/mcp-out/`) beneath the workspace, new (never replacing anything), mode 0600,
/// handed to the sandbox user. The folders are made when missing and must be real
/// folders, not links.
fn save_file(
    workspace: &std::path::Path,
    owner: Option<(u32, u32)>,
    rel: &str,
    bytes: &[u8],
) -> Result<(), String> {
    use rustix::fs::{mkdirat, Mode};
    let beneath = crate::fsutil::Beneath::open(workspace).map_err(|e| e.to_string())?;
    let mut dir = String::new();
    let parts: Vec<&str> = rel.split('/').collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        let parent = beneath.open_dir(&dir).map_err(|e| e.to_string())?;
        match mkdirat(&parent, *part, Mode::from_raw_mode(0o700)) {
            Ok(()) => {
                if let Some((uid, gid)) = owner {
                    rustix::fs::chownat(
                        &parent,
                        *part,
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| format!("cannot hand {part} to the sandbox user: {e}"))?;
                }
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(format!("cannot make {dir}/{part}: {e}")),
        }
        if !dir.is_empty() {
            dir.push('/');
        }
        dir.push_str(part);
    }
    beneath
        .create_new(rel, bytes, 0o600, owner)
        .map_err(|e| e.to_string())
        .and_then(|made| {
            if made {
                Ok(())
            } else {
                Err("a file of that name is already there".to_string())
            }
        })
}

/// The server's name of the tool whose subcommand is `word`, when the agent may not
/// use it.
fn denied_named(word: &str, specs: &[ToolSpec], allowed: &[ToolSpec]) -> Option<String> {
    let spec = specs.iter().find(|s| s.cli_name == word)?;
    (!allowed.iter().any(|a| a.name == spec.name)).then(|| spec.name.clone())
}

/// The exit code of a call that failed around the server.
fn exit_code(e: &McpError) -> i32 {
    match e {
        McpError::Timeout { .. } => cli::EXIT_TIMEOUT,
        _ => cli::EXIT_SERVER_UNAVAILABLE,
    }
}
