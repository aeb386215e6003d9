//! Sandboxes: where an agent's code runs.
//!
//! This module owns the [`Sandbox`] trait (create/reattach/remove an agent's container
//! and run core-tool operations in it), the pure [`spec::ContainerSpec`] computed from
//! config, the host-side preparation of an agent's folders ([`host`]), the check that
//! the shim is static ([`shim`]), the gateway side of the shim link ([`link`]) and the
//! Docker backend (`docker::DockerSandbox`, feature `docker`).
//! It never decides *whether* a call may run — that is policy's job — and never formats
//! results for the model — that is [`crate::tools`]'.

pub mod host;
pub mod link;
pub mod shim;
pub mod spec;

#[cfg(feature = "docker")]
pub mod docker;

use async_trait::async_trait;
use beige_protocol::op::{OpReply, OpRequest};

pub use link::{LinkError, LinkHub, LinkStatus};
pub use spec::{ContainerSpec, Mount, SandboxUser, SpecError, SpecInput};

/// Why a sandbox operation failed (as opposed to the operation reporting an error, which
/// is an [`OpReply::Error`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    #[error("Docker is not usable: {message}. Start the Docker engine (e.g. `scripts/setup-docker`) and check that this user may use it (`docker info`).")]
    DockerUnavailable { message: String },
    #[error("Docker API error while trying to {action}: {message}")]
    Docker { action: String, message: String },
    #[error("image '{image}' is not present on the Docker engine. {hint}")]
    ImageMissing { image: String, hint: String },
    #[error("building image '{image}' failed: {message}")]
    ImageBuild { image: String, message: String },
    #[error("no sandbox is configured for agent '{agent}'")]
    UnknownAgent { agent: String },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("a container named {name} exists on the Docker engine but belongs to {} — not to this installation — so it is left alone. If it is stale, remove it with `docker rm -f {name}`; if another beige uses it, give this one another agent name.", match .owner { Some(o) => format!("installation {o}"), None => "no beige installation".to_string() })]
    NameTaken { name: String, owner: Option<String> },
    #[error("the spec of agent '{agent}' is for installation {spec}, but this Docker sandbox manages installation {sandbox}: connect it with the id in BEIGE_HOME/installation.id (BeigeHome::ensure_installation_id)")]
    Installation {
        agent: String,
        spec: String,
        sandbox: String,
    },
    #[error("agent '{agent}': the Docker engine refused sandbox.diskLimit ({limit}): {message}. A size limit on the container's root file system needs a storage driver that can keep one — overlay2 on an xfs filesystem mounted with the pquota option (Docker's data root, usually /var/lib/docker), btrfs, zfs or devicemapper; docs/sandbox.md#disk-space says more. Remove sandbox.diskLimit from the agent, or move Docker's data root to such a filesystem.")]
    DiskLimit {
        agent: String,
        limit: String,
        message: String,
    },
    #[error("the shim at {path} cannot be used: {reason}")]
    Shim { path: String, reason: String },
    #[error("could not prepare {path}: {message}")]
    Host { path: String, message: String },
    #[error("the sandbox of agent '{agent}' gave no valid answer to `{op}`: {message}")]
    Protocol {
        agent: String,
        op: String,
        message: String,
    },
    #[error("`{op}` in the sandbox of agent '{agent}' did not finish within {secs} s")]
    Timeout {
        agent: String,
        op: String,
        secs: u64,
    },
}

/// The outcome of one operation, plus what the model must be told about the sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct OpOutcome {
    pub reply: OpReply,
    /// Set when the container had died and was recreated before this operation.
    pub restarted: Option<RestartNotice>,
    /// How the operation reached the sandbox.
    pub transport: Transport,
}

/// Which stream a piece of live `exec` output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// A piece of an `exec`'s output while it runs (progress only: the result carries the
/// output in full).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    pub stream: OutputStream,
    pub bytes: Vec<u8>,
}

/// Where live output goes.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<OutputChunk>;

/// How an operation reached the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// The shim link over `run/<agent>/ctl.sock`.
    LinkUnix,
    /// The shim link over the container's attached stdin/stdout.
    LinkAttach,
    /// A `docker exec` per operation (no link, or the link was down).
    DockerExec,
    /// A sandbox that runs operations itself (tests, embedders).
    Direct,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::LinkUnix => "link-unix",
            Transport::LinkAttach => "link-attach",
            Transport::DockerExec => "docker-exec",
            Transport::Direct => "direct",
        }
    }
}

impl From<beige_protocol::link::Carrier> for Transport {
    fn from(c: beige_protocol::link::Carrier) -> Self {
        match c {
            beige_protocol::link::Carrier::Unix => Transport::LinkUnix,
            beige_protocol::link::Carrier::Attach => Transport::LinkAttach,
        }
    }
}

/// Why a container was recreated under a running gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartNotice {
    pub exit_code: Option<i64>,
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

/// A place where agents' code runs. One container (or equivalent) per agent.
#[async_trait]
pub trait Sandbox: Send + Sync + std::fmt::Debug {
    /// Make the running sandboxes match `specs`: reattach those whose spec is unchanged,
    /// recreate changed or stopped ones, remove those of agents not in `specs`.
    async fn reconcile(&self, specs: Vec<ContainerSpec>) -> Result<ReconcileReport, SandboxError>;

    /// Run one core-tool operation in the agent's sandbox, recreating the sandbox first
    /// if it died.
    async fn run_op(&self, agent: &str, request: &OpRequest) -> Result<OpOutcome, SandboxError>;

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

    /// Remove every sandbox of this gateway (clean stop without `keepSandboxes`).
    async fn remove_all(&self) -> Result<(), SandboxError>;

    /// Let go of the sandboxes without removing them (a gateway stopping with
    /// `keepSandboxes`, or replaced by an in-place restart): end their links so their
    /// PID 1 dials whichever gateway comes next.
    async fn detach(&self) {}

    /// Where security events of the sandbox layer (refused link peers) are recorded.
    fn set_audit(&self, _audit: std::sync::Arc<dyn crate::audit::AuditSink>) {}

    /// Health of the shim link of every agent (empty for sandboxes without one).
    fn link_status(&self) -> Vec<link::LinkStatus> {
        Vec::new()
    }

    /// One keepalive round trip over the agent's link, if it is up.
    async fn link_ping(&self, _agent: &str) -> Option<std::time::Duration> {
        None
    }
}
