//! The gateway's MCP clients for its agents' servers (`spec/mcp.md` §1.2).
//!
//! [`McpClients`] owns one rmcp client per `(agent, server)`: it starts a stdio server
//! in the agent's sandbox through [`Sandbox::spawn`] (PID 1 runs it under its own uid;
//! no MCP server process ever runs on the host) and speaks MCP over that process's
//! stdin and stdout, or reaches a remote server (`url`) over streamable HTTP through
//! the agent's egress ([`super::remote`]). It keeps the tool list (rmcp caches it and drops the cache on
//! `notifications/tools/list_changed`), and restarts a server that ended on the next
//! call. Calls are bounded: at most [`MAX_CALLS_PER_SERVER`] at once per server, each
//! within its time limit; a call dropped early (timeout, the caller gone) is cancelled
//! at the server by rmcp. It never decides whether a call may run: the gateway's
//! guarded path did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use beige_protocol::spawn::{SpawnRequest, SpawnUser, DEFAULT_SPAWN_UID};
use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::RunningService;
use rmcp::RoleClient;

use crate::config::mcp::{McpServerConfig, McpUser};
use crate::sandbox::Sandbox;

/// Calls in flight per server; further calls wait.
pub const MAX_CALLS_PER_SERVER: usize = 4;
/// How long a server has to answer `initialize`.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest JSON-RPC line accepted from a server (rmcp's default is 16 MiB).
pub const MAX_LINE: usize = 8 * 1024 * 1024;

/// Why an MCP server could not be used. Each names the server and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server is remote (`url`), and this build has no egress (feature `egress`)
    /// to reach it through.
    #[error("MCP server '{server}' is a remote server (url), which is reached through egress, and this build has no egress (feature `egress`)")]
    Remote {
        /// The server.
        server: String,
    },
    /// The agent's egress does not let it reach the remote server.
    #[error("MCP server '{server}' at {host} cannot be reached: {message}")]
    EgressRefused {
        /// The server.
        server: String,
        /// `host:port` of its URL.
        host: String,
        /// Why, and the rule to add.
        message: String,
    },
    /// The server could not be started or did not initialize.
    #[error("MCP server '{server}' is unavailable: {message}")]
    Unavailable {
        /// The server.
        server: String,
        /// What went wrong (with the end of its stderr, when it died).
        message: String,
    },
    /// The call did not finish in time (it was cancelled at the server).
    #[error("{server}.{tool} did not finish within {} s and was cancelled", limit.as_secs())]
    Timeout {
        /// The server.
        server: String,
        /// The tool.
        tool: String,
        /// The limit.
        limit: Duration,
    },
    /// The server broke the protocol or the call failed in transport.
    #[error("MCP server '{server}' failed the call of {tool}: {message}")]
    Protocol {
        /// The server.
        server: String,
        /// The tool.
        tool: String,
        /// rmcp's error.
        message: String,
    },
}

type Client = RunningService<RoleClient, ()>;

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A running client, and for a remote server the relay its connections go through
/// (kept as long as the client).
#[derive(Debug)]
struct Running {
    client: Arc<Client>,
    #[cfg(feature = "egress")]
    _relay: Option<super::remote::Relay>,
}

/// One server of one agent: its client while it runs, and its call slots.
#[derive(Debug)]
struct Slot {
    client: tokio::sync::Mutex<Option<Running>>,
    calls: tokio::sync::Semaphore,
}

/// Where rmcp's client futures run: a thread of its own with a single-threaded runtime.
///
/// rmcp 3.11's client futures cannot be shown to be `Send` by the compiler (a
/// higher-ranked lifetime limitation inside `serve_client` and the request futures), so
/// they cannot be awaited inside the gateway's `Send` tool-call futures nor spawned on
/// its runtime. They run here instead, each job as a local task; a job whose caller
/// gave up (its answer channel closed) is dropped, which rmcp turns into
/// `notifications/cancelled` at the server. The thread ends when the clients are
/// dropped (the gateway stopped or was reloaded), and with it every server connection.
#[derive(Debug, Clone)]
struct Worker {
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
}

type LocalFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;
type Job = Box<dyn FnOnce() -> LocalFuture + Send>;

impl Worker {
    fn start() -> Self {
        let (jobs, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("beige-mcp".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the MCP clients' runtime");
                        return;
                    }
                };
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, async move {
                    while let Some(job) = rx.recv().await {
                        tokio::task::spawn_local(job());
                    }
                });
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the MCP clients' thread");
        }
        Self { jobs }
    }

    /// Runs `work` on the worker and waits for its output; dropping the returned future
    /// drops `work` there.
    async fn run<T, F, Fut>(&self, work: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            Box::pin(async move {
                let mut tx = tx;
                tokio::select! {
                    out = work() => { let _ = tx.send(out); }
                    _ = tx.closed() => {}
                }
            })
        });
        self.jobs
            .send(job)
            .map_err(|_| "the MCP clients' thread is not running".to_string())?;
        rx.await
            .map_err(|_| "the MCP clients' thread dropped the request".to_string())
    }
}

/// The MCP clients of a gateway's agents.
#[derive(Debug)]
pub struct McpClients {
    sandbox: Arc<dyn Sandbox>,
    /// How remote servers are reached; `None` when no agent has egress.
    #[cfg(feature = "egress")]
    egress: Option<Arc<dyn super::remote::McpEgress>>,
    worker: Worker,
    slots: Mutex<HashMap<(String, String), Arc<Slot>>>,
}

impl McpClients {
    /// Clients that start servers in `sandbox`.
    pub fn new(sandbox: Arc<dyn Sandbox>) -> Self {
        Self {
            sandbox,
            #[cfg(feature = "egress")]
            egress: None,
            worker: Worker::start(),
            slots: Mutex::default(),
        }
    }

    /// The same clients reaching remote servers through `egress`.
    #[cfg(feature = "egress")]
    pub fn with_egress(mut self, egress: Option<Arc<dyn super::remote::McpEgress>>) -> Self {
        self.egress = egress;
        self
    }

    fn slot(&self, agent: &str, server: &str) -> Arc<Slot> {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((agent.to_string(), server.to_string()))
            .or_insert_with(|| {
                Arc::new(Slot {
                    client: tokio::sync::Mutex::new(None),
                    calls: tokio::sync::Semaphore::new(MAX_CALLS_PER_SERVER),
                })
            })
            .clone()
    }

    /// The running client of `server` for `agent`, started when it is not running.
    async fn client(
        &self,
        agent: &str,
        server: &str,
        def: &McpServerConfig,
    ) -> Result<Arc<Client>, McpError> {
        let slot = self.slot(agent, server);
        let mut client = slot.client.lock().await;
        if let Some(c) = client.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(c.client.clone());
        }
        let unavailable = |message| McpError::Unavailable {
            server: server.to_string(),
            message,
        };
        let owned = (agent.to_string(), server.to_string(), def.clone());
        let running = match &def.url {
            #[cfg(feature = "egress")]
            Some(url) => {
                let (egress, url) = (self.egress.clone(), url.clone());
                let start = move || async move {
                    super::remote::start(egress, &owned.0, &owned.1, &owned.2, &url).await
                };
                let (started, relay) = self.worker.run(start).await.map_err(unavailable)??;
                Running {
                    client: Arc::new(started),
                    _relay: Some(relay),
                }
            }
            #[cfg(not(feature = "egress"))]
            Some(_) => {
                return Err(McpError::Remote {
                    server: server.to_string(),
                })
            }
            None => {
                let sandbox = self.sandbox.clone();
                let start = move || Self::start(sandbox, owned.0, owned.1, owned.2);
                let started = self.worker.run(start).await.map_err(unavailable)??;
                Running {
                    client: Arc::new(started),
                    #[cfg(feature = "egress")]
                    _relay: None,
                }
            }
        };
        let started = running.client.clone();
        *client = Some(running);
        Ok(started)
    }

    async fn start(
        sandbox: Arc<dyn Sandbox>,
        agent: String,
        server: String,
        def: McpServerConfig,
    ) -> Result<Client, McpError> {
        let (agent, server) = (agent.as_str(), server.as_str());
        let unavailable = |message: String| McpError::Unavailable {
            server: server.to_string(),
            message,
        };
        let Some(command) = &def.command else {
            return Err(McpError::Remote {
                server: server.to_string(),
            });
        };
        let mut argv = vec![command.clone()];
        argv.extend(def.args.iter().cloned());
        let request = SpawnRequest {
            argv,
            env: def
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cwd: Some(crate::sandbox::spec::WORKSPACE.to_string()),
            user: match def.user {
                None => SpawnUser::Uid(DEFAULT_SPAWN_UID),
                Some(McpUser::Uid(uid)) => SpawnUser::Uid(uid),
                Some(McpUser::Named(_)) => SpawnUser::Agent,
            },
            token: String::new(),
        };
        let process = sandbox
            .spawn(agent, request)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let crate::sandbox::SpawnedProcess {
            reader,
            writer,
            mut exit,
        } = process;
        let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(reader, writer)
            .with_max_line_length(MAX_LINE);
        let init = rmcp::serve_client((), transport);
        tokio::select! {
            client = tokio::time::timeout(STARTUP_TIMEOUT, init) => match client {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(e)) => {
                    // The process may have died: its stderr says why.
                    let why = match tokio::time::timeout(Duration::from_secs(2), &mut exit).await {
                        Ok(Ok(Ok(exit))) => format!("; {}", crate::sandbox::spawn_exit_message(&exit)),
                        _ => String::new(),
                    };
                    Err(unavailable(format!("it did not complete the MCP handshake: {e}{why}")))
                }
                Err(_) => Err(unavailable(format!(
                    "it did not answer initialize within {} s",
                    STARTUP_TIMEOUT.as_secs()
                ))),
            },
            ended = &mut exit => Err(unavailable(match ended {
                Ok(Ok(exit)) => crate::sandbox::spawn_exit_message(&exit),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the sandbox lost the process".to_string(),
            })),
        }
    }

    /// The tools `server` offers now (started when it is not running).
    /// (Boxed, like [`McpClients::call`], so the gateway's tool-call future stays small.)
    pub fn tools<'a>(
        &'a self,
        agent: &'a str,
        server: &'a str,
        def: &'a McpServerConfig,
    ) -> BoxFuture<'a, Result<Vec<Tool>, McpError>> {
        Box::pin(self.tools_inner(agent, server, def))
    }

    async fn tools_inner(
        &self,
        agent: &str,
        server: &str,
        def: &McpServerConfig,
    ) -> Result<Vec<Tool>, McpError> {
        let client = self.client(agent, server, def).await?;
        let listed = self
            .worker
            .run(move || async move { client.list_all_tools().await })
            .await;
        listed
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| McpError::Unavailable {
                server: server.to_string(),
                message: format!("tools/list failed: {e}"),
            })
    }

    /// Calls `tool` of `server` with `arguments`, within `limit`.
    pub fn call<'a>(
        &'a self,
        agent: &'a str,
        server: &'a str,
        def: &'a McpServerConfig,
        tool: &'a str,
        arguments: serde_json::Map<String, serde_json::Value>,
        limit: Duration,
    ) -> BoxFuture<'a, Result<CallToolResult, McpError>> {
        Box::pin(self.call_inner(agent, server, def, tool, arguments, limit))
    }

    async fn call_inner(
        &self,
        agent: &str,
        server: &str,
        def: &McpServerConfig,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        limit: Duration,
    ) -> Result<CallToolResult, McpError> {
        let slot = self.slot(agent, server);
        let work = async {
            let _permit = slot
                .calls
                .acquire()
                .await
                .map_err(|_| McpError::Unavailable {
                    server: server.to_string(),
                    message: "the gateway is stopping".to_string(),
                })?;
            let client = self.client(agent, server, def).await?;
            let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
            let called = self
                .worker
                .run(move || async move { client.call_tool(params).await })
                .await;
            called
                .and_then(|r| r.map_err(|e| e.to_string()))
                .map_err(|e| McpError::Protocol {
                    server: server.to_string(),
                    tool: tool.to_string(),
                    message: e.to_string(),
                })
        };
        match tokio::time::timeout(limit, work).await {
            Ok(result) => result,
            Err(_) => Err(McpError::Timeout {
                server: server.to_string(),
                tool: tool.to_string(),
                limit,
            }),
        }
    }

    /// Stops every server (their connections close, so they see end-of-file).
    pub async fn stop_all(&self) {
        let slots: Vec<Arc<Slot>> = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, s)| s)
            .collect();
        for slot in slots {
            if let Some(running) = slot.client.lock().await.take() {
                if let Ok(client) = Arc::try_unwrap(running.client) {
                    let _ = client.cancel().await;
                }
            }
        }
    }
}
