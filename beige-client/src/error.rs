//! [`GatewayError`]: every error at the gateway boundary, whichever gateway answers
//! (in process, over HTTP, a fake), and [`BoxError`], which carries the engine's own
//! errors (sandbox, config, plugins, audit, skills, store, disk) without this crate
//! knowing their types.
//!
//! An engine variant holds its error as a [`BoxError`] source and shows its text as it
//! is (`Display` is the source's); read the concrete error with
//! `source.downcast_ref::<T>()`. beige-core has the `From` conversions, so `?` works
//! there as before.

use crate::home::HomeError;
use crate::hooks::HookName;
use crate::tools::InvalidCall;

/// An error of any type, as an engine variant of [`GatewayError`] holds it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors at the gateway boundary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// No agent of that name is configured.
    #[error("unknown agent '{agent}'; configured agents: {known}")]
    UnknownAgent {
        /// The name asked for.
        agent: String,
        /// The configured agents, comma-separated.
        known: String,
    },
    /// A core-tool call whose parameters do not parse (HTTP 400).
    #[error(transparent)]
    InvalidCall(#[from] InvalidCall),
    /// The sandbox failed (beige-core's `SandboxError`).
    #[error(transparent)]
    Sandbox {
        /// The `SandboxError`.
        source: BoxError,
    },
    /// The config is invalid (beige-core's `ConfigError`).
    #[error(transparent)]
    Config {
        /// The `ConfigError`.
        source: BoxError,
    },
    /// A plugin failed (beige-core's `PluginError`).
    #[error(transparent)]
    Plugin {
        /// The `PluginError`.
        source: BoxError,
    },
    /// The audit record could not be written (beige-core's `AuditError`).
    #[error(transparent)]
    Audit {
        /// The `AuditError`.
        source: BoxError,
    },
    /// A skill could not be loaded (beige-core's `SkillError`).
    #[error(transparent)]
    Skill {
        /// The `SkillError`.
        source: BoxError,
    },
    /// `BEIGE_HOME`'s installation id could not be read or made.
    #[error(transparent)]
    Home(#[from] HomeError),
    /// The store failed (beige-core's `StoreError`).
    #[error(transparent)]
    Store {
        /// The `StoreError`.
        source: BoxError,
    },
    /// A filesystem the agent needs is below `gateway.minFreeSpace`: it is paused
    /// (beige-core's `disk::DiskLow`; HTTP 503).
    #[error(transparent)]
    DiskLow {
        /// The `DiskLow`.
        source: BoxError,
    },
    /// A hook event that does not parse as the hook's event (HTTP 400).
    #[error("invalid {} event: {source}", .hook.as_str())]
    InvalidHookEvent {
        /// The hook the event was for.
        hook: HookName,
        /// Why it does not parse.
        source: serde_json::Error,
    },
    /// A hook that only the gateway itself fires, such as `gatewayStarted` (HTTP 400).
    #[error("the {} hook cannot be triggered from outside the gateway", .hook.as_str())]
    HookNotTriggerable {
        /// The hook asked for.
        hook: HookName,
    },
    /// Compacting a session failed: the model call that writes the summary did not
    /// succeed (HTTP 400).
    #[error("compaction failed: {source}")]
    Compaction {
        /// The model router's error.
        source: BoxError,
    },
    /// A model override that is not one of the agent's models (HTTP 403).
    #[error("model '{requested}' is not allowed for agent '{agent}'; allowed models: {allowed}")]
    ModelNotAllowed {
        /// The agent.
        agent: String,
        /// The model asked for, `provider/model`.
        requested: String,
        /// The agent's models, comma-separated.
        allowed: String,
    },
    /// The agent has no session of that id.
    #[error("no session '{session}' for agent '{agent}'")]
    UnknownSession {
        /// The agent.
        agent: String,
        /// The session id asked for.
        session: String,
    },
    /// A remote gateway answered with an error status (`RemoteGateway`).
    #[error("the gateway answered {status}: {message}")]
    Remote {
        /// The HTTP status.
        status: u16,
        /// The answer's `error` text (or body).
        message: String,
    },
    /// A remote gateway could not be reached (`RemoteGateway`).
    #[error("cannot reach the beige gateway at {url} ({message}); is it running? Start it with `beige gateway start` (check with `beige gateway status`)")]
    Unreachable {
        /// The gateway's URL.
        url: String,
        /// The root cause.
        message: String,
    },
    /// An approval decision that was not taken: `status` 403 (the approver may not),
    /// 404 (no such request), 409 (already decided, or about another call), 400.
    #[error("{message}")]
    Approval {
        /// The HTTP status that fits.
        status: u16,
        /// What was wrong, and what to do.
        message: String,
    },
    /// This gateway does not offer the operation (an [`Admin`](crate::Admin) method it
    /// leaves at its default); HTTP 501.
    #[error("this gateway does not support {what}")]
    Unsupported {
        /// The operation, e.g. `sandbox_status`.
        what: &'static str,
    },
    /// The caller's roles do not allow the request (HTTP 403, or 404 for an agent they
    /// have no role on): the refusal names the user, their role and what is required.
    #[error(transparent)]
    Refused(#[from] crate::auth::Refusal),
    /// A token or user operation that cannot be done as asked (HTTP 400, or 404 for an
    /// unknown token): the message names the thing and what to do.
    #[error("{message}")]
    InvalidAuth {
        /// The HTTP status that fits.
        status: u16,
        /// What is wrong.
        message: String,
    },
    /// No schedule has that id (HTTP 404).
    #[error("no schedule '{id}'; list the schedules with `beige schedule list`")]
    UnknownSchedule {
        /// The id asked for.
        id: String,
    },
    /// A schedule that cannot be made or changed as asked (HTTP 400): the message
    /// names the field, what is wrong and what to do.
    #[error("{message}")]
    InvalidSchedule {
        /// What is wrong.
        message: String,
    },
    /// A `RemoteGateway` could not be set up (bad URL, unreadable token file).
    #[error("cannot use the gateway at {url}: {message}")]
    RemoteSetup {
        /// The URL given.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// The config names a piece this build of beige-core leaves out: its cargo feature
    /// is off.
    #[error("{what} is not compiled in (cargo feature `{feature}`); enable the feature in the dependency on beige-core")]
    NotCompiledIn {
        /// What is missing, e.g. `llm.providers.claude: the anthropic provider`.
        what: String,
        /// The cargo feature of beige-core that compiles it in.
        feature: &'static str,
    },
    /// No store was given and the default one (SQLite) is not compiled in.
    #[error("no store: beige-core is built without the `sqlite` feature (the default SQLite store); pass a store to GatewayBuilder::store")]
    NoStore,
    /// No sandbox was given and the default backend (Docker) is not compiled in.
    #[error("no sandbox: beige-core is built without the `docker` feature (the default Docker backend); pass a sandbox to GatewayBuilder::sandbox")]
    NoSandbox,
}
