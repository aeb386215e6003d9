//! Sandboxes: where an agent's code runs.
//!
//! This module owns the [`Sandbox`] trait (bring an agent's sandbox up, run core-tool
//! operations in it, remove it), the portable [`SandboxSpec`] computed from config, the
//! [`SandboxHost`] a backend calls back (plugin tool calls from inside the sandbox,
//! refused requests, security events), the host-side preparation of an agent's
//! workspace (private `host`), the check that the shim is static ([`check_static`]), the
//! gateway side of the shim link ([`LinkHub`]) and the Docker backend (`docker::DockerSandbox`, feature
//! `docker`), which owns the shim, the launchers, the link and the tool endpoint.
//! It never decides *whether* a call may run — that is policy's job — and never formats
//! results for the model — that is the gateway's.

pub(crate) mod host;
pub(crate) mod link;
pub(crate) mod shim;
pub mod spec;
mod stream;

#[cfg(feature = "docker")]
pub mod docker;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use beige_protocol::op::{OpReply, OpRequest};

use crate::ident::{Attribution, ExecRegistry};

/// The operations a backend runs (`read`, `write`, `patch`, `exec`, `kill`) and their
/// replies: the types of [`Sandbox::run_op`].
pub use beige_protocol::op;
/// A plugin tool call from inside a sandbox and its answer: the types of
/// [`SandboxHost::tool_call`].
pub use beige_protocol::socket::{ToolRequest, ToolResponse};

pub use crate::tools::to_request;
/// Which of PID 1's listeners took an [`EgressStream`] in.
pub use beige_protocol::link::EgressEntry;
#[cfg_attr(not(feature = "mcp"), allow(unused_imports))]
pub(crate) use link::spawn_exit_message;
pub use link::{LinkError, LinkHub, LinkStatus, SpawnError, SpawnedProcess};
pub use shim::{check_static, locate as locate_shim, BEIGE_SHIM_ENV};
pub use spec::{
    EgressSpec, Limits, Mount, SandboxSpec, SandboxUser, Share, ShareKind, SpecError, SpecInput,
};
pub use stream::{EgressStream, StreamReader, StreamWriter};

/// Why a sandbox operation failed (as opposed to the operation reporting an error, which
/// is an [`OpReply::Error`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The Docker engine cannot be reached or used.
    #[error("Docker is not usable: {message}. Start the Docker engine (e.g. `scripts/setup-docker`) and check that this user may use it (`docker info`).")]
    DockerUnavailable {
        /// The Docker client's error.
        message: String,
    },
    /// A Docker API call failed.
    #[error("Docker API error while trying to {action}: {message}")]
    Docker {
        /// What beige was doing, e.g. `create container beige-…`.
        action: String,
        /// The Docker client's error.
        message: String,
    },
    /// The sandbox image is not on the engine.
    #[error("image '{image}' is not present on the Docker engine. {hint}")]
    ImageMissing {
        /// The image reference of the spec.
        image: String,
        /// How to get the image onto the engine.
        hint: String,
    },
    /// Building the sandbox image failed.
    #[error("building image '{image}' failed: {message}")]
    ImageBuild {
        /// The tag being built.
        image: String,
        /// The build's or the client's error.
        message: String,
    },
    /// The gateway's lease of the agent is no longer confirmed (another gateway may have
    /// taken it over): it does not act on the agent's sandbox (spec/scale.md §3).
    #[error("refused: this gateway no longer holds {lease} (epoch {epoch}), so it does not act on agent '{agent}''s sandbox; another gateway drives it now. Restart this gateway to take part again")]
    Fenced {
        /// The agent.
        agent: String,
        /// The lease (`agent:<name>`).
        lease: String,
        /// The epoch this gateway held.
        epoch: i64,
    },
    /// The backend has no sandbox for the agent.
    #[error("no sandbox is configured for agent '{agent}'")]
    UnknownAgent {
        /// The agent asked for.
        agent: String,
    },
    /// The agent's sandbox spec is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A container of that name belongs to another installation (or none).
    #[error("a container named {name} exists on the Docker engine but belongs to {} — not to this installation — so it is left alone. If it is stale, remove it with `docker rm -f {name}`; if another beige uses it, give this one another agent name.", match .owner { Some(o) => format!("installation {o}"), None => "no beige installation".to_string() })]
    NameTaken {
        /// The container name.
        name: String,
        /// The installation id on the container's label; `None` when it has none.
        owner: Option<String>,
    },
    /// The spec is for another installation than the backend manages.
    #[error("the spec of agent '{agent}' is for installation {spec}, but this Docker sandbox manages installation {sandbox}: connect it with the id in BEIGE_HOME/installation.id (BeigeHome::ensure_installation_id)")]
    Installation {
        /// The agent of the spec.
        agent: String,
        /// The installation id the spec carries (`none` when it has none).
        spec: String,
        /// The installation id the backend manages.
        sandbox: String,
    },
    /// The engine refused `sandbox.diskLimit`.
    #[error("agent '{agent}': the Docker engine refused sandbox.diskLimit ({limit}): {message}. A size limit on the container's root file system needs a storage driver that can keep one — overlay2 on an xfs filesystem mounted with the pquota option (Docker's data root, usually /var/lib/docker), btrfs, zfs or devicemapper; docs/sandbox.md#disk-space says more. Remove sandbox.diskLimit from the agent, or move Docker's data root to such a filesystem.")]
    DiskLimit {
        /// The agent whose container could not be created.
        agent: String,
        /// The configured limit, formatted as a size (`10.0 GiB`).
        limit: String,
        /// The engine's error.
        message: String,
    },
    /// The shim binary cannot be used.
    #[error("the shim at {path} cannot be used: {reason}")]
    Shim {
        /// The shim's path (the first place looked at, when none was found).
        path: String,
        /// Why it cannot be used (missing, not static, unreadable, …).
        reason: String,
    },
    /// A folder or file on the gateway's host could not be made ready.
    #[error("could not prepare {}: {source}", path.display())]
    Host {
        /// The folder or file on the host.
        path: PathBuf,
        /// The filesystem's error.
        #[source]
        source: std::io::Error,
    },
    /// The endpoint where an agent's launchers send plugin tool calls could not be
    /// opened (Docker: the tool socket `run/<agent>/gateway.sock`).
    #[error("could not open the tool socket {}: {source}", path.display())]
    ToolEndpoint {
        /// Where the endpoint was to be opened.
        path: PathBuf,
        /// The error of opening it.
        #[source]
        source: std::io::Error,
    },
    /// The backend was asked to reconcile before it was set up.
    #[error("the {backend} sandbox is not set up: {hint}")]
    NotConfigured {
        /// The backend's name (`Docker`).
        backend: &'static str,
        /// What to call first.
        hint: &'static str,
    },
    /// The sandbox answered an operation with something unreadable.
    #[error("the sandbox of agent '{agent}' gave no valid answer to `{op}`: {message}")]
    Protocol {
        /// The agent whose sandbox answered.
        agent: String,
        /// The operation's name (`read`, `write`, `patch`, `exec`, `kill`).
        op: String,
        /// What was wrong with the answer.
        message: String,
    },
    /// An operation did not finish within its time limit.
    #[error("`{op}` in the sandbox of agent '{agent}' did not finish within {secs} s")]
    Timeout {
        /// The agent whose sandbox ran the operation.
        agent: String,
        /// The operation's name (`read`, `write`, `patch`, `exec`, `kill`).
        op: String,
        /// The time limit, in seconds.
        secs: u64,
    },
    /// A process of its own (an MCP server) could not be started in the sandbox.
    #[error("could not start `{program}` in the sandbox of agent '{agent}': {message}")]
    Spawn {
        /// The agent whose sandbox was to run it.
        agent: String,
        /// The program.
        program: String,
        /// Why not.
        message: String,
    },
}

impl SandboxError {
    /// [`SandboxError::Host`] for `path`.
    pub fn host(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SandboxError::Host {
            path: path.into(),
            source,
        }
    }
}

/// The outcome of one operation, plus what the model must be told about the sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct OpOutcome {
    /// What the sandbox answered (a result, or an error the operation reported).
    pub reply: OpReply,
    /// Set when the container had died and was recreated before this operation.
    pub restarted: Option<RestartNotice>,
    /// How the operation reached the sandbox.
    pub transport: Transport,
}

pub use beige_client::events::OutputStream;

/// A piece of an `exec`'s output while it runs (progress only: the result carries the
/// output in full).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// Standard output or standard error.
    pub stream: OutputStream,
    /// The bytes as they came, not necessarily whole lines or valid UTF-8.
    pub bytes: Vec<u8>,
}

/// Where live output goes.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<OutputChunk>;

pub use beige_client::tools::Transport;

/// Why a container was recreated under a running gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartNotice {
    /// The exit code of the stopped container, when the engine reported one.
    pub exit_code: Option<i64>,
    /// The engine killed the container for running out of memory.
    pub oom_killed: bool,
    /// The container was gone entirely (removed from outside).
    pub missing: bool,
}

impl RestartNotice {
    /// The sentence put in front of the tool result.
    pub fn message(&self) -> String {
        let cause = if self.missing {
            "its container had been removed".to_string()
        } else {
            let mut c = "its container had stopped".to_string();
            match (self.exit_code, self.oom_killed) {
                (Some(code), true) => c.push_str(&format!(
                    " (exit code {code}, killed for running out of memory)"
                )),
                (_, true) => c.push_str(" (killed for running out of memory)"),
                (Some(code), false) => c.push_str(&format!(" (exit code {code})")),
                (None, false) => {}
            }
            c
        };
        format!(
            "[beige] The sandbox was restarted before this call because {cause}. Files in /workspace are kept; installed packages, files elsewhere and background processes were lost."
        )
    }
}

/// What [`Sandbox::reconcile`] did, per agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Running with the same spec: kept as they were.
    pub reattached: Vec<String>,
    /// Created (new agent, changed spec, stopped or unhealthy container).
    pub created: Vec<String>,
    /// Containers of agents no longer in the config.
    pub removed_orphans: Vec<String>,
}

pub use beige_client::status::SandboxStatus;

/// What the sandbox layer reports for the audit log: refused peers and bounds reached
/// (`security.*` records), and results of operations a previous gateway started.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SecurityEvent {
    /// A peer other than the agent's PID 1 connected to the link's control socket and
    /// was refused (`security.link_reject`).
    LinkRejected {
        /// The agent whose control socket it was.
        agent: String,
        /// The peer's pid, when the kernel told it.
        pid: Option<u32>,
        /// The peer's uid, when the kernel told it.
        uid: Option<u32>,
        /// Why it was refused.
        reason: String,
    },
    /// The agent reached a bound of its tool endpoint (`security.socket_limit`); once
    /// when it first hits it, until it is back under it.
    ToolEndpointLimit {
        /// The agent whose endpoint it is.
        agent: String,
        /// The bound: `connections`, `descriptors`, `buffered` or `in_flight`.
        limit: String,
        /// What the caller was told.
        message: String,
    },
    /// The result of an operation that ran while no gateway waited for it (a restart),
    /// replayed by PID 1: its `finished` record, marked as recovered.
    OpRecovered {
        /// The agent whose sandbox ran the operation.
        agent: String,
        /// The link's id of the operation.
        op_id: String,
        /// The reply; `None` when it could not be read.
        reply: Option<OpReply>,
    },
}

/// The gateway, as a sandbox backend sees it: where plugin tool calls made from inside a
/// sandbox go, and where the backend reports what it refused. The agent is always the
/// one the backend's transport belongs to (the socket, pod or vsock it came in on),
/// never something a request says.
#[async_trait]
pub trait SandboxHost: Send + Sync {
    /// A plugin tool call from inside the agent's sandbox, through the guarded path
    /// (policy, hooks, audit). `caller` is the exec the backend attributed the calling
    /// process to (from the kernel's view of it, see [`ExecRegistry::attribute`]), or
    /// [`Attribution::unbound`] when it found none or cannot tell.
    async fn tool_call(
        &self,
        agent: &str,
        caller: &Attribution,
        request: ToolRequest,
    ) -> ToolResponse;

    /// A request the endpoint refused before it reached [`SandboxHost::tool_call`] (it
    /// could not be parsed, or was too large): `tool` when it was readable, `raw` the
    /// bytes received (or the start of them). Audited as denied.
    async fn rejected(&self, agent: &str, tool: Option<&str>, error: &str, raw: &[u8]);

    /// Something the sandbox layer refused or recovered, for the audit log.
    async fn security_event(&self, event: SecurityEvent);

    /// The gateway's record of the execs it starts, where a backend reports each exec's
    /// root process and looks up who calls ([`ExecRegistry`]). `None` (the default):
    /// every caller is unbound.
    fn exec_registry(&self) -> Option<Arc<ExecRegistry>> {
        None
    }

    /// An outbound connection from inside the agent's sandbox (egress): the gateway
    /// decides, audits and carries it. By default it is dropped unanswered, which the
    /// client sees as a closed connection.
    async fn egress(&self, agent: &str, stream: EgressStream) {
        let _ = (agent, stream);
    }

    /// What happened to the agent's link to its sandbox's PID 1 (for the metrics).
    /// Nothing by default.
    fn link_event(&self, agent: &str, event: LinkEvent) {
        let _ = (agent, event);
    }
}

/// A change of an agent's link to its sandbox's PID 1, as [`SandboxHost::link_event`]
/// hears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkEvent {
    /// The link came up; `reconnect` when it is not the agent's first since the hub
    /// started (PID 1 dialled again, or a newer connection replaced an older one).
    Up {
        /// Not the first connection.
        reconnect: bool,
    },
    /// The link went down (and no newer connection had replaced it).
    Down,
    /// A peer that is not the sandbox's PID 1 was refused.
    RejectedPeer,
    /// A keepalive was answered after this long.
    Ping(std::time::Duration),
}

/// A [`SandboxHost`] that answers every call with an error and records nothing (a
/// backend reconciled outside a gateway).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHost;

#[async_trait]
impl SandboxHost for NoHost {
    async fn tool_call(
        &self,
        _agent: &str,
        _caller: &Attribution,
        _request: ToolRequest,
    ) -> ToolResponse {
        ToolResponse::error("no gateway serves this sandbox's tools", 1)
    }

    async fn rejected(&self, _agent: &str, _tool: Option<&str>, _error: &str, _raw: &[u8]) {}

    async fn security_event(&self, _event: SecurityEvent) {}
}

/// `&dyn Any` of a sandbox, so that the gateway can hand a [`docker::DockerSandbox`]
/// given to it the builder's Docker options. Implemented for every type.
#[doc(hidden)]
pub trait AsAny {
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: std::any::Any> AsAny for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A place where agents' code runs. One sandbox (container, pod, VM…) per agent.
#[async_trait]
pub trait Sandbox: Send + Sync + std::fmt::Debug + AsAny {
    /// Make the running sandboxes match `specs`: reattach those whose spec is unchanged,
    /// recreate changed or stopped ones, remove those of agents not in `specs`; serve
    /// each agent's plugin tool calls by calling `host`.
    async fn reconcile(
        &self,
        specs: Vec<SandboxSpec>,
        host: Arc<dyn SandboxHost>,
    ) -> Result<ReconcileReport, SandboxError>;

    /// Run one core-tool operation in the agent's sandbox, recreating the sandbox first
    /// if it died.
    async fn run_op(&self, agent: &str, request: &OpRequest) -> Result<OpOutcome, SandboxError>;

    /// Remove every sandbox of this gateway (clean stop without `keepSandboxes`), and
    /// stop serving their tool calls.
    async fn remove_all(&self) -> Result<(), SandboxError>;

    /// [`Sandbox::run_op`], also sending the output of an `exec` to `output` while it
    /// runs, where the transport can (the shim link). Others just run the op.
    async fn run_op_streaming(
        &self,
        agent: &str,
        request: &OpRequest,
        output: OutputSink,
    ) -> Result<OpOutcome, SandboxError> {
        let _ = output;
        self.run_op(agent, request).await
    }

    /// Let go of the sandboxes without removing them (a gateway stopping with
    /// `keepSandboxes`, or replaced by an in-place restart): stop serving their tool
    /// calls and end their links, so that they reach whichever gateway comes next.
    /// [`Sandbox::reconcile`] may follow.
    async fn detach(&self) {}

    /// Start `request.argv` in the agent's sandbox as a process of its own whose stdin
    /// and stdout are returned (an MCP server, `spec/mcp.md` §1.2), recreating the
    /// sandbox first if it died. Backends without a way to do that (the default) say so.
    async fn spawn(
        &self,
        agent: &str,
        request: beige_protocol::spawn::SpawnRequest,
    ) -> Result<SpawnedProcess, SandboxError> {
        Err(SandboxError::Spawn {
            agent: agent.to_string(),
            program: request.argv.first().cloned().unwrap_or_default(),
            message: "this sandbox backend cannot run processes of their own".to_string(),
        })
    }

    /// How the agent's sandbox is reached, with the health of its link (a keepalive
    /// measured now, where there is one).
    async fn status(&self, agent: &str) -> SandboxStatus {
        SandboxStatus::unlinked(agent)
    }
}
