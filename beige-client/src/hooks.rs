//! [`HookName`]: the nine hooks, by the original's names — what
//! [`Admin::run_hook`](crate::Admin::run_hook) names (beige-core re-exports it from
//! `hooks`, which runs them).

use serde::{Deserialize, Serialize};

/// The nine hooks, with the original's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookName {
    /// Before a prompt reaches the model: may rewrite or block it.
    PrePrompt,
    /// After the model's final answer: may rewrite it.
    PostResponse,
    /// Before a tool call runs: may rewrite or deny it.
    PreToolExec,
    /// After a tool call ran: may rewrite its result.
    PostToolExec,
    /// A session was created.
    SessionCreated,
    /// A session was replaced or ended.
    SessionDisposed,
    /// A prompt is answered by another model than the first candidate.
    ModelSwitched,
    /// The gateway started.
    GatewayStarted,
    /// The gateway is stopping.
    GatewayShutdown,
}

impl HookName {
    /// Every hook, in the original's order.
    pub const ALL: [HookName; 9] = [
        HookName::PrePrompt,
        HookName::PostResponse,
        HookName::PreToolExec,
        HookName::PostToolExec,
        HookName::SessionCreated,
        HookName::SessionDisposed,
        HookName::ModelSwitched,
        HookName::GatewayStarted,
        HookName::GatewayShutdown,
    ];

    /// The hook's name in config and manifests (`prePrompt`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            HookName::PrePrompt => "prePrompt",
            HookName::PostResponse => "postResponse",
            HookName::PreToolExec => "preToolExec",
            HookName::PostToolExec => "postToolExec",
            HookName::SessionCreated => "sessionCreated",
            HookName::SessionDisposed => "sessionDisposed",
            HookName::ModelSwitched => "modelSwitched",
            HookName::GatewayStarted => "gatewayStarted",
            HookName::GatewayShutdown => "gatewayShutdown",
        }
    }

    /// The hook of a name, if it is one.
    pub fn parse(s: &str) -> Option<HookName> {
        HookName::ALL.into_iter().find(|h| h.as_str() == s)
    }
}
