//! [`PromptRequest`]: one message to an agent, what [`Gateway::prompt`](crate::Gateway)
//! takes (beige-core re-exports it from `gateway`).

use serde::{Deserialize, Serialize};

use crate::approvals::ApprovalMode;
use crate::principal::Principal;

/// One message to an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptRequest {
    /// The agent.
    pub agent: String,
    /// `channel:id…`, e.g. `api:assistant:default`, `telegram:42`.
    pub session_key: String,
    /// The user's message.
    pub message: String,
    /// Defaults to the first segment of the session key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The channel's chat (Telegram: the chat id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    /// The channel's thread in the chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// When the session is busy: wait for it (default) or fail at once.
    #[serde(default = "yes")]
    pub wait: bool,
    /// Whether the sender answers approvals on the event stream (`"stream"`); without
    /// it the run is unattended and a call that needs approval is denied at once. The
    /// HTTP API honours it only for SSE prompts.
    #[serde(default, skip_serializing_if = "is_none_mode")]
    pub approvals: ApprovalMode,
    /// Who sent the message, set by the channel from its connection (never read from a
    /// payload; the model's tool calls inherit it). Default `Unverified`.
    #[serde(skip)]
    pub principal: Principal,
}

fn yes() -> bool {
    true
}

fn is_none_mode(m: &ApprovalMode) -> bool {
    *m == ApprovalMode::None
}

impl PromptRequest {
    /// A message to `agent` on `session_key`, waiting when the session is busy, from
    /// [`Principal::Unverified`].
    pub fn new(
        agent: impl Into<String>,
        session_key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            agent: agent.into(),
            session_key: session_key.into(),
            message: message.into(),
            channel: None,
            chat_id: None,
            thread_id: None,
            wait: true,
            approvals: ApprovalMode::None,
            principal: Principal::Unverified,
        }
    }

    /// The sender answers approvals on the event stream.
    pub fn attended(mut self) -> Self {
        self.approvals = ApprovalMode::Stream;
        self
    }

    /// The channel: explicit, else the key's first segment.
    pub fn channel(&self) -> String {
        self.channel.clone().unwrap_or_else(|| {
            self.session_key
                .split(':')
                .next()
                .unwrap_or("unknown")
                .to_string()
        })
    }
}
