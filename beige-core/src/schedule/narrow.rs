//! The tools a schedule run may use, by session key: a schedule's `tools` narrow its
//! agent's rights for the sessions its runs use. The gateway consults it when it
//! describes tools to the model and on every plugin call from the sandbox; the agent's
//! own tools and policy still apply on top, so a run never has more than its agent.

use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

static NARROWED: LazyLock<RwLock<HashMap<String, Vec<String>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// Restrict session `key` to `tools` until the guard drops.
pub(crate) fn narrow(key: &str, tools: Vec<String>) -> NarrowGuard {
    NARROWED
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.to_string(), tools);
    NarrowGuard(key.to_string())
}

/// Whether session `key` may use `tool` (`true` when the session is not narrowed).
pub(crate) fn allows(key: &str, tool: &str) -> bool {
    NARROWED
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(key)
        .is_none_or(|tools| tools.iter().any(|t| t == tool))
}

/// Ends a restriction of [`narrow`].
#[derive(Debug)]
pub(crate) struct NarrowGuard(String);

impl Drop for NarrowGuard {
    fn drop(&mut self) {
        NARROWED
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}
