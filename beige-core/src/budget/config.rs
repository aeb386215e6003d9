//! The `budgets` block of the config (top level and `agents.<a>.budgets`): plain serde
//! values, each limit optional. Resolution (the agent's key over the top-level one) is
//! [`super::Limits::for_agent`]'s.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `budgets`: limits on model tokens and cost per session, turn and agent-day, on model
/// calls and wall time per turn, and on tool calls per exec. `agents.<a>.budgets`
/// overrides it key by key. Every limit is optional; none is set by default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BudgetsConfig {
    /// Per session (all its turns, across restarts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<ScopeLimits>,
    /// Per turn: one prompt, from the user's message to the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnLimits>,
    /// Per agent and period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentLimits>,
    /// Per `exec`: what the commands it starts may do over the tool socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecLimits>,
    /// What a `costUsd` limit does with a model that has no price: `refuse` (the
    /// default: the config is refused, naming `llm.providers.<p>.models.<id>.cost`) or
    /// `uncounted` (its calls cost nothing and are recorded `unpriced`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_model_price: Option<UnknownModelPrice>,
}

/// Token and cost limits of one scope.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScopeLimits {
    /// US dollars, priced from the model catalogue or `llm.providers.<p>.models.<id>.cost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Input + output + cache-write tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// `budgets.turn`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnLimits {
    /// US dollars per turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Input + output + cache-write tokens per turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Model calls per turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<u64>,
    /// Seconds from the user's message; checked before each model call (a running tool
    /// call is not cut short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<u64>,
}

/// `budgets.agent`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentLimits {
    /// Per UTC day, over all the agent's sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<ScopeLimits>,
}

/// `budgets.exec`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecLimits {
    /// Plugin tool calls per exec; the call over it fails with exit code 77.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
}

/// `budgets.unknownModelPrice`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnknownModelPrice {
    /// A model without a price cannot be used under a `costUsd` limit.
    #[default]
    Refuse,
    /// A model without a price costs nothing; its ledger rows say `unpriced`.
    Uncounted,
}
