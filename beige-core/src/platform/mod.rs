//! The built-in platform tools — `schedule`, `spawn` and `sessions` — that act through
//! the gateway itself rather than on the agent's behalf from outside it.
//!
//! Owns the seam they share: [`Host`], what such a tool may ask of the gateway (start a
//! prompt as the gateway's own trusted caller, read the store, look up the calling exec,
//! write audit records), and [`HostSlot`], through which a tool built before the gateway
//! reaches it once it is up, without keeping it alive. Like `kv`, each is enabled by
//! listing it under `plugins` without a `path` and in an agent's `tools`; its calls take
//! the guarded path of every plugin tool (policy, approvals, budgets, audit) before the
//! handler runs. Identity always comes from the call (the socket's agent, the exec the
//! kernel attributes the caller to, the session that exec was started in), never from
//! the arguments or the `sessionContext` a script sends. Nothing here opens a host path
//! an agent named: files an agent hands a tool are read in the sandbox and arrive as the
//! call's stdin.

pub(crate) mod schedule;
pub(crate) mod sessions;
pub(crate) mod spawn;

use std::sync::{Arc, OnceLock, Weak};

use async_trait::async_trait;

use crate::config::Config;
use crate::plugin::{Plugin, ToolError};
use crate::store::{SessionRecord, StoredMessage};

/// What a platform tool may ask of the gateway. Implemented by the gateway; each tool
/// adds the operations it needs.
#[async_trait]
pub(crate) trait Host: Send + Sync {
    /// The configuration the gateway runs with.
    #[allow(dead_code)] // part of the seam; the schedule tool reads the config through the gateway
    fn config(&self) -> &Config;

    /// Run one `spawn`: find the caller's session through its exec, check the target,
    /// depth, budgets and concurrency, create (or continue) the child session with its
    /// lineage and rights, run the child's prompt unattended and wait for its answer.
    async fn spawn(&self, request: spawn::SpawnRequest) -> Result<spawn::SpawnReport, ToolError>;

    /// `spawn --info` for the caller of `agent` in exec `exec`: its targets, the depth
    /// left and the budget left.
    async fn spawn_info(
        &self,
        agent: &str,
        exec: Option<&str>,
        config: &spawn::SpawnConfig,
    ) -> Result<crate::plugin::ToolResult, ToolError>;

    /// Every session of `agent`, newest (by creation) first, read through the store.
    async fn agent_sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, ToolError>;

    /// The session of `agent` that `key_or_id` names: a session id, or a session key
    /// (its current session, else the newest of the agent's with that key). `None` when
    /// there is none **or it belongs to another agent**: the two are not told apart.
    async fn agent_session(
        &self,
        agent: &str,
        key_or_id: &str,
    ) -> Result<Option<SessionRecord>, ToolError>;

    /// The messages of `agent`'s session `id` in order (compacted ones too when
    /// `include_compacted`); `None` when the session is missing or another agent's.
    async fn agent_session_messages(
        &self,
        agent: &str,
        id: &str,
        include_compacted: bool,
    ) -> Result<Option<Vec<StoredMessage>>, ToolError>;
}

/// Where a platform tool finds the gateway: empty while the gateway is being built,
/// then a weak handle on it.
#[derive(Clone, Default)]
pub(crate) struct HostSlot(Arc<OnceLock<Weak<dyn Host>>>);

impl std::fmt::Debug for HostSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSlot")
            .field("set", &self.0.get().is_some())
            .finish()
    }
}

impl HostSlot {
    /// Point the slot at the gateway (once; later calls are ignored).
    pub(crate) fn set(&self, host: Weak<dyn Host>) {
        let _ = self.0.set(host);
    }

    /// The gateway, or a tool error when it is not up (yet, or any more).
    pub(crate) fn get(&self) -> Result<Arc<dyn Host>, ToolError> {
        self.0
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| ToolError::Failed("the gateway is not running".into()))
    }
}

/// The names of the platform tools, which are always built in.
pub(crate) const NAMES: [&str; 3] = ["schedule", "spawn", "sessions"];

/// Whether the gateway serves plugin entry `name` with its built-in platform tool: the
/// entry has no `path`, or it names the original's toolkit (whose TypeScript `schedule`,
/// `spawn` and `sessions` read host files on the agent's behalf, and are never loaded).
pub(crate) fn serves(name: &str, entry: &crate::config::PluginEntry) -> bool {
    NAMES.contains(&name)
        && (entry.path.is_none()
            || entry
                .source
                .as_deref()
                .is_some_and(|s| s.starts_with(crate::plugin::TOOLKIT_NPM_SOURCE)))
}

/// The built-in platform plugin called `name`, if there is one, wired to `host`.
pub(crate) fn builtin_plugin(
    name: &str,
    host: &HostSlot,
    gateway: &crate::gateway::GatewaySlot,
) -> Option<Arc<dyn Plugin>> {
    // Each tool adds its arm here.
    match name {
        schedule::NAME => Some(Arc::new(schedule::SchedulePlugin::new(gateway.clone()))),
        sessions::NAME => Some(Arc::new(sessions::SessionsPlugin::new(host.clone()))),
        spawn::NAME => Some(Arc::new(spawn::SpawnPlugin::new(host.clone()))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginEntry;

    fn entry(path: Option<&str>, source: Option<&str>) -> PluginEntry {
        PluginEntry {
            path: path.map(Into::into),
            source: source.map(Into::into),
            ..PluginEntry::default()
        }
    }

    #[test]
    fn the_toolkit_versions_are_never_loaded_but_served_built_in() {
        let toolkit = "npm:@matthias-hausberger/beige-toolkit@0.4.1";
        for name in NAMES {
            assert!(serves(name, &entry(None, None)), "{name} without a path");
            // An old install left a path to the TypeScript plugin, which read host files.
            assert!(
                serves(
                    name,
                    &entry(Some("/home/u/.beige/plugins/x"), Some(toolkit))
                ),
                "{name} from the toolkit"
            );
            // A plugin of the user's own under that name is theirs to load.
            assert!(
                !serves(name, &entry(Some("./my-plugin"), None)),
                "{name} own"
            );
        }
        assert!(!serves("kv", &entry(None, None)));
        assert!(!serves("gh", &entry(Some("/x"), Some(toolkit))));
    }
}
