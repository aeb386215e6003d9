//! [`AgentEvent`]: what one prompt produces, in order. Every channel — HTTP SSE, TUI,
//! Telegram, `beige run` — renders this same stream (beige-core re-exports it from
//! `agent::events`).

use serde::{Deserialize, Serialize};

use crate::llm::{ErrorKind, Usage};

/// Which stream a piece of live `exec` output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One event of a running prompt. Serialized with a `type` tag in snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// A model call starts (1-based turn number).
    TurnStarted {
        /// 1 for the first model call of the prompt.
        turn: u32,
        /// `provider/model`.
        model: String,
    },
    /// A piece of the answer's text.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// A piece of the model's reasoning.
    ThinkingDelta {
        /// The new text.
        text: String,
    },
    /// The model asked for a tool call; it is about to run.
    ToolCallStarted {
        /// The call's id.
        id: String,
        /// The tool.
        name: String,
        /// Its parameters.
        args: serde_json::Value,
    },
    /// Output of a running `exec`, as it comes (progress for a live view, best effort:
    /// `ToolCallFinished` carries the result the model sees). `stream` is `stdout` or
    /// `stderr`.
    ToolOutput {
        /// The call's id.
        id: String,
        /// Where the text came from.
        stream: OutputStream,
        /// The new output.
        text: String,
    },
    /// A tool call ended (also when denied: `is_error` and the reason as output).
    ToolCallFinished {
        /// The call's id.
        id: String,
        /// The tool.
        name: String,
        /// The result's text.
        output: String,
        /// The call failed or was refused.
        #[serde(rename = "isError")]
        is_error: bool,
        /// How long it ran.
        #[serde(rename = "durationMs")]
        duration_ms: u64,
    },
    /// The prompt is answered by another model than the first candidate.
    ModelSwitched {
        /// The model that failed, `provider/model`.
        from: String,
        /// The model that answers instead.
        to: String,
        /// Why the first one did not answer.
        reason: String,
    },
    /// A `prePrompt` hook stopped the prompt.
    Blocked {
        /// The hook's reason.
        reason: String,
    },
    /// The session's history was compacted into a summary.
    Compacted {
        /// How many messages the summary replaces.
        #[serde(rename = "summarizedMessages")]
        summarized_messages: usize,
    },
    /// Usage of one model call.
    Usage {
        /// `provider/model`.
        model: String,
        /// The call's tokens.
        usage: Usage,
        /// US dollars, from the model catalogue.
        cost: f64,
    },
    /// A budget (`budgets.*`) is 80 % used or more; sent once per scope and period.
    BudgetWarning {
        /// `session`, `turn`, `agent.day` or `exec`.
        scope: String,
        /// `tokens`, `costUsd`, `modelCalls`, `wallSeconds` or `toolCalls`.
        key: String,
        /// How much is used (US dollars for `costUsd`).
        used: f64,
        /// The limit.
        limit: f64,
        /// `used` as a percentage of `limit`, rounded down.
        pct: u32,
    },
    /// The prompt finished; `response` is the final text after `postResponse` hooks.
    Done {
        /// The final answer.
        response: String,
        /// The session the exchange was stored in.
        #[serde(rename = "sessionId")]
        session_id: String,
        /// Tokens of the whole prompt.
        usage: Usage,
    },
    /// A call of this prompt (the model's, or a script's in its exec) waits for a
    /// human's approval; answer it with `POST /api/approvals/{id}/decision`.
    ApprovalRequest {
        /// The request.
        approval: crate::approvals::Approval,
    },
    /// A request of this prompt was decided, expired or used.
    ApprovalDecided {
        /// The request as it is now.
        approval: crate::approvals::Approval,
    },
    /// The prompt failed; `hint` says what the user can do.
    Error {
        /// What went wrong.
        message: String,
        /// The kind of a model failure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<ErrorKind>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        /// What the user can do about it.
        hint: Option<String>,
    },
}

impl AgentEvent {
    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            AgentEvent::Done { .. } | AgentEvent::Error { .. } | AgentEvent::Blocked { .. }
        )
    }
}

/// A sentence telling the user what to do about an error of this kind.
pub fn hint_for(kind: ErrorKind) -> Option<&'static str> {
    Some(match kind {
        ErrorKind::RateLimit => "The model's provider is rate-limiting requests. Wait a few minutes, or switch to another allowed model (/model).",
        ErrorKind::Overloaded => "The provider is overloaded right now. Try again in a moment.",
        ErrorKind::ContextOverflow => "The conversation is too long for the model. Compact it (/compact) or start a new session (/new).",
        ErrorKind::Auth => "The provider rejected the API key. Check llm.providers.<name>.apiKey in the gateway's config.",
        ErrorKind::Timeout => "The model stopped answering. Try again; if it keeps happening, switch models.",
        ErrorKind::BudgetExhausted => "A budget in the gateway's config was reached; the message names it and how to raise it.",
        ErrorKind::IdempotencyConflict => "Send a new Idempotency-Key with a new message; reuse a key only to retry the same message.",
        ErrorKind::InvalidRequest | ErrorKind::Other => return None,
    })
}
