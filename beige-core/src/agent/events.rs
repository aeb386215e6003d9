//! `AgentEvent`: what one prompt produces, in order. Every channel — HTTP SSE, TUI,
//! Telegram, `beige run` — renders this same stream.

use serde::{Deserialize, Serialize};

use crate::llm::{ErrorKind, Usage};

/// One event of a running prompt. Serialized with a `type` tag in snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// A model call starts (1-based turn number).
    TurnStarted {
        turn: u32,
        model: String,
    },
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        text: String,
    },
    /// The model asked for a tool call; it is about to run.
    ToolCallStarted {
        id: String,
        name: String,
        args: serde_json::Value,
    },
    /// Output of a running `exec`, as it comes (progress for a live view, best effort:
    /// `ToolCallFinished` carries the result the model sees). `stream` is `stdout` or
    /// `stderr`.
    ToolOutput {
        id: String,
        stream: crate::sandbox::OutputStream,
        text: String,
    },
    /// A tool call ended (also when denied: `is_error` and the reason as output).
    ToolCallFinished {
        id: String,
        name: String,
        output: String,
        #[serde(rename = "isError")]
        is_error: bool,
        #[serde(rename = "durationMs")]
        duration_ms: u64,
    },
    /// The prompt is answered by another model than the first candidate.
    ModelSwitched {
        from: String,
        to: String,
        reason: String,
    },
    /// A `prePrompt` hook stopped the prompt.
    Blocked {
        reason: String,
    },
    /// The session's history was compacted into a summary.
    Compacted {
        #[serde(rename = "summarizedMessages")]
        summarized_messages: usize,
    },
    /// Usage of one model call.
    Usage {
        model: String,
        usage: Usage,
        /// US dollars, from the model catalogue.
        cost: f64,
    },
    /// The prompt finished; `response` is the final text after `postResponse` hooks.
    Done {
        response: String,
        #[serde(rename = "sessionId")]
        session_id: String,
        usage: Usage,
    },
    /// The prompt failed; `hint` says what the user can do.
    Error {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<ErrorKind>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
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
        ErrorKind::InvalidRequest | ErrorKind::Other => return None,
    })
}
