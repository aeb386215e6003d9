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

#![allow(dead_code)] // until the first platform tool lands on this seam

use std::sync::{Arc, OnceLock, Weak};

use async_trait::async_trait;

use crate::config::Config;
use crate::plugin::{Plugin, ToolError};

/// What a platform tool may ask of the gateway. Implemented by the gateway; each tool
/// adds the operations it needs.
#[async_trait]
pub(crate) trait Host: Send + Sync {
    /// The configuration the gateway runs with.
    fn config(&self) -> &Config;
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

/// The built-in platform plugin called `name`, if there is one, wired to `host`.
pub(crate) fn builtin_plugin(name: &str, host: &HostSlot) -> Option<Arc<dyn Plugin>> {
    // Each tool adds its arm here: `"sessions" => Some(Arc::new(SessionsPlugin::new(host.clone())))`.
    let _ = (name, host);
    None
}
