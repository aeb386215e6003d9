//! The session records a client reads and writes through [`Sessions`](crate::Sessions):
//! [`SessionRecord`], [`SessionSettings`] and the partial update [`SettingsPatch`]
//! (beige-core re-exports them from `store`, whose `Store` keeps them).

use serde::{Deserialize, Serialize};

use crate::llm::Usage;

/// One stored session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    /// `s_` and 16 hex digits.
    pub id: String,
    /// The agent the session belongs to.
    pub agent: String,
    /// The key the session was created for.
    pub key: String,
    /// The session this one was started from (sub-sessions).
    pub parent_id: Option<String>,
    /// The first user message, shortened to 80 characters; `None` until there is one.
    pub title: Option<String>,
    /// The model last recorded for the session (or at creation), `provider/model`.
    pub model: Option<String>,
    /// Unix ms.
    pub created: i64,
    /// Unix ms of the last turn, title or model change, or touch.
    pub updated: i64,
    /// Messages in the session, compacted ones included, summaries excluded.
    pub message_count: u64,
    /// Token usage summed over every stored message of the session.
    pub usage: Usage,
}

/// Per-key overrides; `None` means "not set here" (fall back to the channel default,
/// then the system default).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSettings {
    /// Show tool calls and their results.
    pub verbose: Option<bool>,
    /// Stream the answer as it comes.
    pub streaming: Option<bool>,
    /// `provider/model`; the caller checks it against the agent's allowed models.
    pub model_override: Option<String>,
}

/// A partial update of [`SessionSettings`]: `None` leaves a field alone, `Some(None)`
/// clears it, `Some(Some(v))` sets it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SettingsPatch {
    /// See [`SessionSettings::verbose`].
    pub verbose: Option<Option<bool>>,
    /// See [`SessionSettings::streaming`].
    pub streaming: Option<Option<bool>>,
    /// See [`SessionSettings::model_override`].
    pub model_override: Option<Option<String>>,
}
