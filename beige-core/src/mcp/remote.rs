//! Remote MCP servers (`mcp.servers.<name>.url`, `spec/mcp.md` §1.2): the gateway is the
//! client, and every connection it opens to the server goes out through the agent's
//! egress.
//!
//! This module owns the client side of that: reading the server's URL, asking the
//! gateway's [`McpEgress`] whether the agent may reach it (the one rule matcher and the
//! one address classifier sandbox traffic gets), and starting rmcp's streamable-HTTP
//! client over a reqwest client that cannot dial anything itself. reqwest is pointed at
//! a private Unix socket of this module's own (a [`Relay`]); each connection accepted
//! there is opened by [`McpEgress::open`], which decides it again with the agent's
//! rules, resolves the name, checks every address, pins one, writes the egress audit
//! record and dials it with the egress engine's `Dialer`. So a reconnect is checked and
//! audited like the first connection, and reqwest's own DNS and TCP never run.
//!
//! The server's `credentials` name `egress.credentials` entries; [`McpEgress`] turns
//! them into headers (the credential's `inject` header, or `Authorization: Bearer` for a
//! placeholder credential) that only the gateway's requests carry. The sandbox never
//! sees them: calls reach the server from the gateway, and results come back as text.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::RoleClient;
use tokio_util::sync::CancellationToken;

use super::client::{McpError, STARTUP_TIMEOUT};
use crate::config::mcp::McpServerConfig;
use crate::egress::upstream::BoxUpstream;

/// Where a remote server is: from its `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTarget {
    /// The server's name.
    pub server: String,
    /// The URL as configured.
    pub url: String,
    /// `http` or `https`.
    pub scheme: String,
    /// The host, lower case (an IP address without brackets).
    pub host: String,
    /// The port (the scheme's default when the URL has none).
    pub port: u16,
    /// The path requests go to (no query).
    pub path: String,
}

impl RemoteTarget {
    /// Reads `url` of `server`.
    pub fn parse(server: &str, url: &str) -> Result<Self, McpError> {
        let bad = |why: String| McpError::Unavailable {
            server: server.to_string(),
            message: format!("its url {url:?} cannot be used: {why}"),
        };
        let parsed = reqwest_mcp::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let scheme = parsed.scheme().to_string();
        if scheme != "http" && scheme != "https" {
            return Err(bad("only http:// and https:// URLs are served".into()));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "a URL must not carry credentials; name an egress credential in `credentials`"
                    .into(),
            ));
        }
        let host = match parsed.host_str() {
            Some(h) if !h.is_empty() => h
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim_end_matches('.')
                .to_ascii_lowercase(),
            _ => return Err(bad("it names no host".into())),
        };
        let port = parsed
            .port_or_known_default()
            .ok_or_else(|| bad("it names no port".into()))?;
        Ok(Self {
            server: server.to_string(),
            url: url.to_string(),
            scheme,
            host,
            port,
            path: parsed.path().to_string(),
        })
    }
}

/// One connection [`McpEgress::open`] opened: the upstream and what the gateway needs
/// to record its end.
pub struct Opened {
    /// The connection to the pinned address.
    pub upstream: BoxUpstream,
    /// Called once with the bytes carried (to the server, from it) and the error it
    /// ended with, if any: it writes the `finished` record.
    pub finished: Box<dyn FnOnce(u64, u64, Option<String>) -> FinishFuture + Send>,
}

/// What [`Opened::finished`] returns.
pub type FinishFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened").finish_non_exhaustive()
    }
}

/// A credential header for a remote server: the name and the value, secret included.
/// Its `Debug` never shows the value.
#[derive(Clone)]
pub struct CredentialHeader {
    /// The header, lower case.
    pub name: String,
    /// Its value (the secret in its format).
    pub value: String,
}

impl fmt::Debug for CredentialHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialHeader")
            .field("name", &self.name)
            .field("value", &"[redacted]")
            .finish()
    }
}

/// The gateway's egress as remote MCP servers use it. The gateway implements it with
/// its egress engine, the agents' rules and its audit log.
#[async_trait]
pub trait McpEgress: Send + Sync + fmt::Debug {
    /// Whether `agent` may reach `target` now (rules, then every resolved address
    /// through the classifier). `Err` says why, naming the host and the rule to add.
    async fn check(&self, agent: &str, target: &RemoteTarget) -> Result<(), String>;

    /// Opens one connection of `agent` to `target`: decided, classified, pinned,
    /// audited (`egress.connect`, naming the server) and dialled. `Err` says why not
    /// (the refusal is recorded).
    async fn open(&self, agent: &str, target: &RemoteTarget) -> Result<Opened, String>;

    /// The headers the server's `credentials` become for `agent`: each must be an
    /// `egress.credentials` entry bound to the target's host.
    fn credential_headers(
        &self,
        agent: &str,
        target: &RemoteTarget,
        credentials: &[String],
    ) -> Result<Vec<CredentialHeader>, String>;
}

/// A private Unix socket the gateway's reqwest client connects to; each connection
/// accepted is carried to the server through [`McpEgress::open`]. Dropping it stops
/// accepting and removes the socket (open connections end with the client).
#[derive(Debug)]
pub struct Relay {
    dir: PathBuf,
    stop: CancellationToken,
    /// The last refusal, for the error of a handshake that failed because of it.
    refused: Arc<Mutex<Option<String>>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Relay {
    /// Starts a relay for `agent`'s connections to `target` as a local task (on the
    /// MCP clients' thread).
    fn start(
        egress: Arc<dyn McpEgress>,
        agent: &str,
        target: &RemoteTarget,
    ) -> std::io::Result<(Self, PathBuf)> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!(
            "beige-mcp-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let socket = dir.join("relay.sock");
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let stop = CancellationToken::new();
        let refused = Arc::new(Mutex::new(None));
        let (agent, target) = (agent.to_string(), target.clone());
        let (stopped, last) = (stop.clone(), refused.clone());
        tokio::task::spawn_local(async move {
            loop {
                let accepted = tokio::select! {
                    () = stopped.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else {
                    continue;
                };
                let (egress, agent, target, last, stopped) = (
                    egress.clone(),
                    agent.clone(),
                    target.clone(),
                    last.clone(),
                    stopped.clone(),
                );
                tokio::task::spawn_local(async move {
                    carry(egress, &agent, &target, client, last, stopped).await;
                });
            }
        });
        Ok((Self { dir, stop, refused }, socket))
    }

    fn last_refusal(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Carries one accepted connection to the server, or drops it when egress refuses.
async fn carry(
    egress: Arc<dyn McpEgress>,
    agent: &str,
    target: &RemoteTarget,
    mut client: tokio::net::UnixStream,
    last: Arc<Mutex<Option<String>>>,
    stop: CancellationToken,
) {
    let opened = match egress.open(agent, target).await {
        Ok(opened) => opened,
        Err(why) => {
            tracing::warn!(
                agent,
                server = target.server,
                "mcp: a connection to the remote server was refused: {why}"
            );
            *last.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
            return;
        }
    };
    let Opened {
        mut upstream,
        finished,
    } = opened;
    let (up, down, error) = tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match copied {
            Ok((up, down)) => (up, down, None),
            Err(e) => (0, 0, Some(format!("the connection broke: {e}"))),
        },
        () = stop.cancelled() => (0, 0, Some("the client stopped".to_string())),
    };
    finished(up, down, error).await;
}

/// A running remote client and the relay it needs.
pub(crate) type Started = (RunningService<RoleClient, ()>, Relay);

/// Starts the client of remote `server` for `agent` (on the MCP clients' thread).
pub(crate) async fn start(
    egress: Option<Arc<dyn McpEgress>>,
    agent: &str,
    server: &str,
    def: &McpServerConfig,
    url: &str,
) -> Result<Started, McpError> {
    let target = RemoteTarget::parse(server, url)?;
    let refused = |message: String| McpError::EgressRefused {
        server: server.to_string(),
        host: format!("{}:{}", target.host, target.port),
        message,
    };
    let Some(egress) = egress else {
        return Err(refused(format!(
            "a remote server is reached through the agent's egress, and no agent of this gateway has egress; add agents.{agent}.egress with a rule {{ id: \"mcp-{server}\", hosts: [\"{}\"], ports: [{}] }}",
            target.host, target.port
        )));
    };
    egress.check(agent, &target).await.map_err(refused)?;
    let headers = egress
        .credential_headers(agent, &target, &def.credentials)
        .map_err(|message| McpError::Unavailable {
            server: server.to_string(),
            message,
        })?;
    let unavailable = |message: String| McpError::Unavailable {
        server: server.to_string(),
        message,
    };
    let mut custom = std::collections::HashMap::new();
    for h in headers {
        let name = reqwest_mcp::header::HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| unavailable(format!("'{}' is not a header name", h.name)))?;
        let mut value = reqwest_mcp::header::HeaderValue::from_str(&h.value).map_err(|_| {
            unavailable(format!(
                "the value of credential header '{}' is not a valid header value",
                h.name
            ))
        })?;
        value.set_sensitive(true);
        custom.insert(name, value);
    }
    let (relay, socket) = Relay::start(egress, agent, &target)
        .map_err(|e| unavailable(format!("cannot make the gateway's relay socket: {e}")))?;
    let http = reqwest_mcp::Client::builder()
        .unix_socket(socket)
        .redirect(reqwest_mcp::redirect::Policy::none())
        .build()
        .map_err(|e| unavailable(format!("cannot build the HTTP client: {e}")))?;
    let config =
        StreamableHttpClientTransportConfig::with_uri(target.url.as_str()).custom_headers(custom);
    let transport = StreamableHttpClientTransport::with_client(http, config);
    match tokio::time::timeout(STARTUP_TIMEOUT, rmcp::serve_client((), transport)).await {
        Ok(Ok(client)) => Ok((client, relay)),
        Ok(Err(e)) => match relay.last_refusal() {
            Some(why) => Err(refused(why)),
            None => Err(unavailable(format!(
                "it did not complete the MCP handshake: {e}"
            ))),
        },
        Err(_) => Err(unavailable(format!(
            "it did not answer initialize within {} s",
            STARTUP_TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = RemoteTarget::parse("remote", "http://MCP.Example.test:8123/mcp?x=1").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("mcp.example.test", 8123, "/mcp")
        );
        let t = RemoteTarget::parse("remote", "https://api.example.com/mcp").unwrap();
        assert_eq!(t.port, 443);
        assert!(RemoteTarget::parse("remote", "ftp://x/").is_err());
        assert!(RemoteTarget::parse("remote", "https://u:p@x/").is_err());
        let headers = CredentialHeader {
            name: "authorization".into(),
            value: "Bearer s3cret".into(),
        };
        assert!(!format!("{headers:?}").contains("s3cret"));
    }
}
