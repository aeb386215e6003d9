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
    /// The client's idempotency key (the HTTP API's `Idempotency-Key` header): a prompt
    /// with the same key, agent, session key and message that completed within a day
    /// is answered from the store instead of running again; the same key with another
    /// message is refused. At most [`MAX_IDEMPOTENCY_KEY`] bytes of visible ASCII.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// The longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// Why `key` cannot be an idempotency key, or `None` when it can be: 1 to
/// [`MAX_IDEMPOTENCY_KEY`] bytes of visible ASCII (no spaces or control characters).
pub fn idempotency_key_problem(key: &str) -> Option<String> {
    if key.is_empty() {
        return Some("it is empty".into());
    }
    if key.len() > MAX_IDEMPOTENCY_KEY {
        return Some(format!(
            "it is {} bytes long; the most is {MAX_IDEMPOTENCY_KEY}",
            key.len()
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Some("it may only hold visible ASCII characters (no spaces)".into());
    }
    None
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
            idempotency_key: None,
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
