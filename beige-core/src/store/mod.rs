//! The store: everything the gateway must remember across restarts, behind six traits
//! split by owner — [`SessionStore`] (the agent loop, `Sessions`), [`HealthStore`] (the
//! router), [`ChannelState`] (channels), [`PluginData`] (plugins), [`UsageLedger`]
//! (the cost ledger budgets and `beige usage` read) and [`ScheduleStore`] (the schedule
//! engine: schedules and one run row per fire instant) — and [`Store`], all six in one
//! value. `SqliteStore` (`<BEIGE_HOME>/beige.db`, cargo feature `sqlite`) is
//! the implementation; `MemoryStore` (`beige_core::testing`, cargo feature `test-util`)
//! the one in memory. [`Stores`] holds one part per owner, so they may live apart.
//!
//! Owns the durable state and its guarantees: sessions and which one is *current* for a
//! session key, the messages of each session (provider-neutral JSON, one transaction per
//! turn, compaction that marks and never deletes), per-key settings and metadata, provider
//! health, channel offsets, the dedup window and the outbound queue, plugin key-value
//! data, and one ledger row per model call. It does not decide anything: which model to use, when to compact, what is allowed
//! and how settings resolve against channel defaults belong to the agent loop and the
//! channels. Only the gateway opens the database; clients ask the gateway.

mod coordination;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
mod copy;
mod credentials;
#[cfg(feature = "postgres")]
mod postgres;
mod schedule;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(test)]
#[cfg(all(feature = "sqlite", feature = "postgres"))]
mod tests;

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::llm::{Message, Usage};
pub use beige_client::usage::{UsageGroupBy, UsageQuery, UsageReport, UsageRow, UsageTotals};

pub(crate) use coordination::ttl_ms;
pub use coordination::{Coordination, Fence, LeaseInfo};
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub use copy::{copy_sqlite_to_postgres, CopiedTable};
pub use credentials::{CredentialStore, TokenInfo, TokenRecord, TokenScope};
#[cfg(feature = "postgres")]
pub use postgres::{redact_url, PostgresOptions, PostgresStore, PG_SCHEMA_VERSION};
pub use schedule::{
    Claim, RunFinish, RunStatus, ScheduleRecord, ScheduleRun, ScheduleSpec, ScheduleState,
    ScheduleStore, ScheduleView, RERUN_PREFIX,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SCHEMA_VERSION};

/// How many update ids [`ChannelState::mark_seen`] remembers per channel; older ones are pruned.
pub const SEEN_WINDOW: usize = 1000;

/// Longest session title, in characters (the first user message, shortened).
pub const TITLE_MAX_CHARS: usize = 80;

/// Milliseconds since the Unix epoch, the time unit of every record in the store.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A new session for a session key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewSession {
    /// The agent the session belongs to.
    pub agent: String,
    /// The session key (`tui:<agent>:default`, `telegram:<chatId>`, …).
    pub key: String,
    /// The session this one was started from (sub-sessions).
    pub parent_id: Option<String>,
    /// The model the session starts with (`provider/model`).
    pub model: Option<String>,
}

pub use beige_client::session::SessionRecord;

/// Where a sub-agent's session comes from (`spawn`, platform.md §2): stored with the
/// child session in the operation that creates it, and read back by the gateway — never
/// taken from anything a sandbox sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lineage {
    /// The session of the caller that spawned this one.
    pub parent_session_id: String,
    /// How many spawns deep the session is: a child of a root session is at depth 1.
    pub depth: u32,
    /// The exec whose script called `spawn`, as the kernel attributed it.
    pub invoked_by_exec: Option<String>,
    /// The child's rights, computed at spawn (a `RightSet` as JSON).
    pub rights: serde_json::Value,
}

/// One message to append, with what produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    /// The message itself, as the agent loop keeps it (provider-neutral).
    pub message: Message,
    /// The model that produced it (`provider/model`); `None` for user messages and tool
    /// results.
    pub model: Option<String>,
    /// Token usage of the model call that produced it.
    pub usage: Option<Usage>,
}

impl NewMessage {
    /// A message with no model and no usage (user messages, tool results).
    pub fn plain(message: Message) -> Self {
        Self {
            message,
            model: None,
            usage: None,
        }
    }
}

/// The stored answer of a prompt sent with an idempotency key (the HTTP API's
/// `Idempotency-Key` header): a retry of that prompt gets this answer instead of running
/// again. Stored in the transaction of the prompt's exchange, so a prompt's turn is
/// stored with its answer or not at all; kept for [`PROMPT_ANSWER_RETENTION_MS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptAnswer {
    /// The agent; with the session key and the client's key, the answer's identity.
    pub agent: String,
    /// The session key the prompt was sent to.
    pub session_key: String,
    /// The client's idempotency key.
    pub key: String,
    /// SHA-256 (hex) of what the prompt asked: the same key with another request is
    /// refused, not answered with this.
    pub request_sha256: String,
    /// The session the exchange was stored in.
    pub session_id: String,
    /// The final answer.
    pub response: String,
    /// Tokens of the whole prompt.
    pub usage: Usage,
    /// When it was stored (ms since the epoch): set by the store when it writes the
    /// answer, whatever the caller put here.
    pub created: i64,
}

/// How long a [`PromptAnswer`] answers retries: a day.
pub const PROMPT_ANSWER_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// One stored message.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Unique across the database, never reused.
    pub id: i64,
    /// Position in the session, from 1. A summary carries the `seq` of the last message it
    /// replaces and sorts after it.
    pub seq: i64,
    /// The message itself (or the summary, when [`summary`](Self::summary) is set).
    pub message: Message,
    /// The model that produced it (`provider/model`); `None` for user messages and tool
    /// results.
    pub model: Option<String>,
    /// Token usage of the model call that produced it, when it was recorded.
    pub usage: Option<Usage>,
    /// Replaced by a later summary; kept for history, left out of the model's context.
    pub compacted: bool,
    /// A compaction summary rather than a message of the conversation.
    pub summary: bool,
    /// Unix ms.
    pub created: i64,
}

pub use beige_client::session::{SessionSettings, SettingsPatch};

/// Health of one model, shared by every agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthRecord {
    /// `provider/model` (the model id may itself contain `/`).
    pub model_key: String,
    /// Unix ms until which the model cools down (rate limit).
    pub cooldown_until: Option<i64>,
    /// Failed calls since the last success; a success resets it to 0.
    pub consecutive_failures: u32,
    /// The error of the latest failed call; a success leaves it in place.
    pub last_error: Option<String>,
}

/// One queued outbound message.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxItem {
    /// Increasing in enqueue order, never reused.
    pub id: i64,
    /// The channel that sends it (`telegram`, …).
    pub channel: String,
    /// What the channel needs to send it (chat id, text, …).
    pub payload: serde_json::Value,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Unix ms.
    pub next_attempt_at: i64,
    /// Why the latest attempt failed; `None` before the first failure.
    pub last_error: Option<String>,
    /// Unix ms.
    pub created: i64,
}

/// Bounds that [`PluginData::kv_set_within`] checks in the same transaction as its write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvLimits {
    /// Entries (keys) the data may hold; only a new key counts against it.
    pub max_entries: Option<u64>,
    /// Bytes the data may take: keys plus values (UTF-8), plus
    /// [`entry_overhead`](Self::entry_overhead) per entry.
    pub max_bytes: Option<u64>,
    /// Bytes counted per entry on top of its key and value, so that many tiny entries
    /// cannot hide their row cost from `max_bytes`.
    pub entry_overhead: u64,
    /// Count the plugin's data in every scope, not only in the scope written.
    pub whole_plugin: bool,
}

/// What a plugin's data takes in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvUsage {
    /// Number of keys.
    pub entries: u64,
    /// Bytes of keys plus values, as UTF-8.
    pub bytes: u64,
}

/// The outcome of [`PluginData::kv_set_within`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvWrite {
    /// The value was stored.
    Stored,
    /// The key is new and the data already holds `max` entries; nothing was stored.
    TooManyEntries {
        /// Entries the data holds now.
        held: u64,
        /// [`KvLimits::max_entries`].
        max: u64,
    },
    /// Storing the value would take the data from `used` to `after` bytes, over `max`
    /// (counted as [`KvLimits::max_bytes`] says); nothing was stored.
    TooManyBytes {
        /// Bytes the data takes now.
        used: u64,
        /// Bytes it would take with the value stored.
        after: u64,
        /// [`KvLimits::max_bytes`].
        max: u64,
    },
}

/// The check of [`PluginData::kv_set_within`], the same on every backend: `None` when
/// writing `key` = `value` keeps the data within `limits`, else the refusal. `usage` is
/// what the data holds now (the plugin's or the scope's, as `limits` says) and
/// `old_bytes` the bytes of the entry the write replaces, if any.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "test-util", test)),
    allow(dead_code)
)]
pub(crate) fn kv_limit_check(
    limits: KvLimits,
    usage: KvUsage,
    old_bytes: Option<u64>,
    key: &str,
    value: &str,
) -> Option<KvWrite> {
    let new_entry = old_bytes.is_none();
    if let (true, Some(max)) = (new_entry, limits.max_entries) {
        if usage.entries >= max {
            return Some(KvWrite::TooManyEntries {
                held: usage.entries,
                max,
            });
        }
    }
    let max = limits.max_bytes?;
    let counted = |entries: u64, bytes: u64| {
        bytes.saturating_add(entries.saturating_mul(limits.entry_overhead))
    };
    let used = counted(usage.entries, usage.bytes);
    let new_bytes = (key.len() + value.len()) as u64;
    let after = counted(
        usage.entries + u64::from(new_entry),
        usage
            .bytes
            .saturating_sub(old_bytes.unwrap_or(0))
            .saturating_add(new_bytes),
    );
    // A write that does not grow the data passes even above the limit (after the limit
    // was lowered), so an agent can always shrink its data.
    (after > max && after > used).then_some(KvWrite::TooManyBytes { used, after, max })
}

/// A boxed error of a store backend (the SQLite driver's, another database client's).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A store operation failed. Messages name the database and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another process holds the database.
    #[error("the database {} is locked by another process; stop the other beige gateway using this BEIGE_HOME, or wait and retry", path.display())]
    Locked {
        /// The database file.
        path: PathBuf,
    },

    /// The database is damaged or not a beige database.
    #[error("the database {} is damaged or is not a beige database ({detail}); stop beige and move the file aside (a new one is created on the next start) or restore a backup", path.display())]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// What the backend said about it.
        detail: String,
    },

    /// The database was written by a newer beige.
    #[error("the database {} has schema version {found}, but this beige only knows versions up to {supported}; upgrade beige, or use a backup made by this version", path.display())]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// The schema version of the file.
        found: i64,
        /// The newest schema version this beige knows.
        supported: i64,
    },

    /// A schema migration failed.
    #[error("migrating the database {} to schema version {version} failed ({detail}); nothing of that version was applied — report this, and keep the file for diagnosis", path.display())]
    Migration {
        /// The database file.
        path: PathBuf,
        /// The schema version whose migration failed.
        version: i64,
        /// What the backend said.
        detail: String,
    },

    /// The database cannot be opened.
    #[error("cannot open the database {} ({detail}); check that its directory exists and that this user may read and write it", path.display())]
    CannotOpen {
        /// The database file.
        path: PathBuf,
        /// What the backend or the filesystem said.
        detail: String,
    },

    /// The disk is full.
    #[error("the database {} cannot be written: the disk is full; free some space and retry", path.display())]
    DiskFull {
        /// The database file.
        path: PathBuf,
    },

    /// The record asked for does not exist.
    #[error("{what} {id} does not exist")]
    NotFound {
        /// The kind of record (`session`, …).
        what: &'static str,
        /// The id that was asked for.
        id: String,
    },

    /// A lease this gateway needs is held by another gateway (`store.url` shared by
    /// several): it must not act for what the lease covers.
    #[error("{lease} is held by gateway '{holder}' until {until} unless it renews it; beige does not yet share agents between gateways on one database: stop that gateway, give each gateway its own agents, or wait for its lease to run out")]
    Leased {
        /// The lease (`agent:<name>`).
        lease: String,
        /// Who holds it.
        holder: String,
        /// When it runs out unless renewed (RFC 3339, the database's clock).
        until: String,
    },

    /// A write made under a lease this gateway no longer holds (another gateway took
    /// it over, or it expired): refused, nothing written.
    #[error("refused: this gateway no longer holds {lease} (epoch {epoch}); another gateway drives it now")]
    Fenced {
        /// The lease.
        lease: String,
        /// The epoch the write was made under.
        epoch: i64,
    },

    /// The request itself is invalid.
    #[error("invalid store request: {message}")]
    Invalid {
        /// What is wrong with the request.
        message: String,
    },

    /// Any other failure of the backend; `source` is its own error (read it with
    /// `downcast_ref`). The message keeps naming it, as it always did.
    #[error("the database {} failed: {source}", path.display())]
    Backend {
        /// The database file.
        path: PathBuf,
        /// The backend's own error.
        #[source]
        source: BoxError,
    },
}

/// Sessions, their messages, and the settings and metadata of each session key: what
/// the agent loop and the gateway's `Sessions` need (18 methods). Every method is one
/// atomic operation.
#[async_trait]
pub trait SessionStore: Send + Sync + Debug {
    // ---- sessions ----

    /// Create a session and make it the current session of its key. The previous current
    /// session of the key is kept (for `/resume`). Durable against a crash of the
    /// gateway when it returns; a store may leave durability against power loss to the
    /// next synchronous commit (the first turn's), as `SqliteStore` does.
    async fn create_session(&self, new: NewSession) -> Result<SessionRecord, StoreError>;

    /// Create a sub-agent's session as [`SessionStore::create_session`] does, with
    /// `parent_id` set to the lineage's parent and `lineage` stored with it, in one
    /// transaction: the session never exists without its lineage.
    /// [`StoreError::NotFound`] when the parent session does not exist.
    async fn create_child_session(
        &self,
        new: NewSession,
        lineage: Lineage,
    ) -> Result<SessionRecord, StoreError>;

    /// The lineage of session `id`; `None` for a session that was not spawned (or does
    /// not exist).
    async fn session_lineage(&self, id: &str) -> Result<Option<Lineage>, StoreError>;

    /// The current session of `key`, if the key has one.
    async fn current_session(&self, key: &str) -> Result<Option<SessionRecord>, StoreError>;

    /// Make an existing session the current one of `key` (`/resume`). Whether the caller
    /// may resume that session (same agent, same chat) is the caller's decision.
    async fn set_current_session(
        &self,
        key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, StoreError>;

    /// The session with this id, current or not; `None` when there is none.
    async fn get_session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError>;

    /// Every session of `agent`, sub-sessions included, newest (by creation) first.
    async fn list_sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, StoreError>;

    /// Set the title of a session (and `updated`); [`StoreError::NotFound`] when there is
    /// no such session.
    async fn set_session_title(&self, id: &str, title: &str) -> Result<(), StoreError>;

    /// Set the model of a session (`provider/model`, and `updated`);
    /// [`StoreError::NotFound`] when there is no such session.
    async fn set_session_model(&self, id: &str, model: &str) -> Result<(), StoreError>;

    /// Set `updated` to now.
    async fn touch(&self, id: &str) -> Result<(), StoreError>;

    // ---- messages ----

    /// Append the messages of one turn, in order, in one transaction: all of them are
    /// stored or none is. Sets the title from the first user text when the session has
    /// none, and `updated`. Returns the new message ids.
    async fn append_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<i64>, StoreError>;

    /// [`append_turn`](Self::append_turn), committed only while `fence` still holds its
    /// lease ([`Coordination`]): a gateway that lost an agent's lease cannot write that
    /// agent's turns, even before it notices ([`StoreError::Fenced`], nothing written).
    /// Stores shared by several gateways check the fence in the append's transaction;
    /// the default, for stores only one gateway uses, appends without looking.
    async fn append_turn_fenced(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        fence: &Fence,
    ) -> Result<Vec<i64>, StoreError> {
        let _ = fence;
        self.append_turn(session_id, messages).await
    }

    /// [`append_turn`](Self::append_turn) (or [`append_turn_fenced`](Self::append_turn_fenced)
    /// with `fence`) that stores `answer` in the same transaction: the turn and the
    /// answer are both stored or neither is. An answer already stored under the same
    /// identity is kept. The default, for stores that keep no answers, appends the turn
    /// and drops the answer: every retry of a keyed prompt then runs again.
    async fn append_answered_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        fence: Option<&Fence>,
        answer: PromptAnswer,
    ) -> Result<Vec<i64>, StoreError> {
        let _ = answer;
        match fence {
            Some(fence) => self.append_turn_fenced(session_id, messages, fence).await,
            None => self.append_turn(session_id, messages).await,
        }
    }

    /// The answer stored by [`append_answered_turn`](Self::append_answered_turn) for this
    /// agent, session key and idempotency key, unless it is older than
    /// [`PROMPT_ANSWER_RETENTION_MS`]. The default: `None`.
    async fn prompt_answer(
        &self,
        agent: &str,
        session_key: &str,
        key: &str,
    ) -> Result<Option<PromptAnswer>, StoreError> {
        let _ = (agent, session_key, key);
        Ok(None)
    }

    /// The messages of a session in order. Without `include_compacted`: the latest summary
    /// (if any) followed by the messages after it — the model's context.
    async fn messages(
        &self,
        session_id: &str,
        include_compacted: bool,
    ) -> Result<Vec<StoredMessage>, StoreError>;

    /// The revision of the messages of session `session_id`: a number that grows by
    /// exactly one with each [`append_turn`](Self::append_turn) of at least one message and
    /// each [`compact`](Self::compact), and never changes otherwise, so that two reads
    /// that return the same number saw the same messages. One cheap lookup: the gateway
    /// reads it before each prompt to tell whether its copy of the session's context
    /// (kept in memory between prompts) is still the stored one, and reads
    /// [`messages`](Self::messages) again when it is not. `Ok(None)` (the default): the
    /// store cannot tell, and the gateway reads the messages for every prompt.
    /// [`StoreError::NotFound`] when there is no such session.
    async fn message_revision(&self, session_id: &str) -> Result<Option<u64>, StoreError> {
        let _ = session_id;
        Ok(None)
    }

    /// Mark every message with `seq <= upto_seq` (earlier summaries included) as compacted
    /// and store `summary` in their place, before the remaining messages. Nothing is
    /// deleted. Fails with [`StoreError::Invalid`] when nothing up to `upto_seq` is left
    /// to compact.
    async fn compact(
        &self,
        session_id: &str,
        upto_seq: i64,
        summary: Message,
    ) -> Result<(), StoreError>;

    // ---- per-key settings and metadata ----

    /// The overrides of `key` (all `None` when nothing was set).
    async fn get_settings(&self, key: &str) -> Result<SessionSettings, StoreError>;

    /// Apply `patch` and return the resulting settings.
    async fn update_settings(
        &self,
        key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, StoreError>;

    /// Free JSON object of `key` for plugins and channels (`{}` when nothing was set).
    async fn get_metadata(&self, key: &str) -> Result<serde_json::Value, StoreError>;

    /// Set one top-level field of the metadata of `key`; `Value::Null` removes it.
    async fn set_metadata(
        &self,
        key: &str,
        field: &str,
        value: serde_json::Value,
    ) -> Result<(), StoreError>;
}

/// Health of every model, shared by all agents: what the router persists so that a
/// cooldown survives a restart.
#[async_trait]
pub trait HealthStore: Send + Sync + Debug {
    /// Every stored health record, ordered by model key.
    async fn load_health(&self) -> Result<Vec<HealthRecord>, StoreError>;

    /// Insert or replace the record of `record.model_key`.
    async fn save_health(&self, record: HealthRecord) -> Result<(), StoreError>;

    /// Remove the record of `model_key`, if there is one.
    async fn clear_health(&self, model_key: &str) -> Result<(), StoreError>;
}

/// What channels keep across restarts: the offset of each channel, the window of update
/// ids already seen, and the outbound queue (7 methods).
#[async_trait]
pub trait ChannelState: Send + Sync + Debug {
    /// The stored offset of `channel` (for Telegram, the next update id to fetch); `None`
    /// when none was set.
    async fn get_offset(&self, channel: &str) -> Result<Option<i64>, StoreError>;

    /// Insert or replace the offset of `channel`.
    async fn set_offset(&self, channel: &str, value: i64) -> Result<(), StoreError>;

    /// Remember `update_id`; `false` when it was already seen. The last [`SEEN_WINDOW`]
    /// ids per channel are kept.
    async fn mark_seen(&self, channel: &str, update_id: i64) -> Result<bool, StoreError>;

    /// Queue `payload` for sending now; returns its id.
    async fn enqueue_outbox(
        &self,
        channel: &str,
        payload: serde_json::Value,
    ) -> Result<i64, StoreError>;

    /// Up to `limit` items of `channel` with `next_attempt_at <= now_ms`, oldest first.
    async fn due_outbox(
        &self,
        channel: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<OutboxItem>, StoreError>;

    /// The item was delivered: remove it.
    async fn outbox_done(&self, id: i64) -> Result<(), StoreError>;

    /// The attempt failed: count it, record `error`, try again at `next_attempt_at` (ms).
    async fn outbox_retry(
        &self,
        id: i64,
        next_attempt_at: i64,
        error: &str,
    ) -> Result<(), StoreError>;
}

/// Plugin key-value data, scoped by plugin name and a scope (usually the agent name).
/// All a plugin gets of the store: it cannot read sessions.
#[async_trait]
pub trait PluginData: Send + Sync + Debug {
    /// The value of `key`; `None` when it is not set.
    async fn kv_get(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError>;

    /// Insert or replace the value of `key`, with no limits checked.
    async fn kv_set(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StoreError>;

    /// Store `value` under `key` unless that would take the data over `limits`; the
    /// check and the write are one transaction, so concurrent writers cannot overshoot.
    /// Overwriting a key counts only the difference in size; a write that does not grow
    /// the data is always stored.
    async fn kv_set_within(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
        limits: KvLimits,
    ) -> Result<KvWrite, StoreError>;

    /// What `plugin` holds in `scope`, or in all its scopes when `scope` is `None`.
    async fn kv_usage(&self, plugin: &str, scope: Option<&str>) -> Result<KvUsage, StoreError>;

    /// `true` when the key existed.
    async fn kv_del(&self, plugin: &str, scope: &str, key: &str) -> Result<bool, StoreError>;

    /// Keys of `plugin` in `scope` starting with `prefix`, sorted.
    async fn kv_list(
        &self,
        plugin: &str,
        scope: &str,
        prefix: &str,
    ) -> Result<Vec<String>, StoreError>;
}

/// One model call, as the cost ledger records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Unix ms of the call's end.
    pub ts: i64,
    /// The agent that made the call.
    pub agent: String,
    /// The session it was made for (`None` outside a session).
    pub session_id: Option<String>,
    /// The session key, for reading the ledger.
    pub session_key: Option<String>,
    /// The turn (one prompt run) it belongs to; `None` for e.g. a compaction outside one.
    pub turn_id: Option<String>,
    /// `provider/model`.
    pub model: String,
    /// The tokens the provider reported.
    pub usage: Usage,
    /// Millionths of a US dollar.
    pub cost_micros: i64,
    /// The model had no price: the call counts at no cost.
    pub unpriced: bool,
    /// The parent of the session, when it is a sub-agent's (`spawn`): the child's
    /// spending is the parent's too.
    pub parent_session_id: Option<String>,
}

/// Which ledger rows [`UsageLedger::usage_totals`] sums; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerFilter {
    /// Only this agent's calls.
    pub agent: Option<String>,
    /// Only this session's calls.
    pub session_id: Option<String>,
    /// Only calls at or after this time (Unix ms).
    pub since_ms: Option<i64>,
    /// With `session_id`: the calls of its sub-agents' sessions too, at any depth
    /// (rows linked by `parent_session_id`).
    pub with_children: bool,
}

/// The cost ledger: one row per model call, kept across restarts. What budgets and
/// `beige usage` read; it decides nothing.
#[async_trait]
pub trait UsageLedger: Send + Sync + Debug {
    /// Append one row. Durable against a crash of the gateway when it returns; a store
    /// may leave durability against power loss to the next synchronous commit (the
    /// turn's, which follows the call), as `SqliteStore` does.
    async fn record_usage(&self, entry: LedgerEntry) -> Result<(), StoreError>;

    /// The totals of the rows `filter` matches.
    async fn usage_totals(&self, filter: LedgerFilter) -> Result<UsageTotals, StoreError>;

    /// The rows `query` matches, grouped as it says, ordered by group key.
    async fn usage_report(&self, query: UsageQuery) -> Result<UsageReport, StoreError>;
}

/// Durable state of the gateway: all six parts in one value (`SqliteStore`'s one file,
/// or `MemoryStore` of `beige_core::testing`). Implemented for every type that implements
/// the six; shared as `Arc<dyn Store>` and callable from any task. To keep the parts in
/// different places, give the gateway a [`Stores`].
///
/// Rust 1.85 has no trait upcasting: to pass an `Arc<dyn Store>` where one part is
/// wanted, wrap it once more (`Arc::new(store)`: `Arc<S>` implements each part `S`
/// does), or take the part from [`Stores::from`].
pub trait Store:
    SessionStore
    + HealthStore
    + ChannelState
    + PluginData
    + UsageLedger
    + ScheduleStore
    + CredentialStore
    + Coordination
{
}

impl<
        T: SessionStore
            + HealthStore
            + ChannelState
            + PluginData
            + UsageLedger
            + ScheduleStore
            + CredentialStore
            + Coordination
            + ?Sized,
    > Store for T
{
}

/// The store of a gateway, one part per owner: sessions for the agent loop and
/// `Sessions`, health for the router, channel state for channels, plugin data for
/// plugins, the ledger for budgets and `beige usage`. Usually all six are one store (`Stores::from(Arc::new(store))`); mix them
/// with struct update syntax:
///
/// ```
/// # use std::sync::Arc;
/// # use beige_core::store::{PluginData, Store, Stores};
/// # fn mixed(store: Arc<dyn Store>, my_kv: Arc<dyn PluginData>) -> Stores {
/// Stores { data: my_kv, ..Stores::from(store) }
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Stores {
    /// Sessions, messages, per-key settings and metadata.
    pub sessions: Arc<dyn SessionStore>,
    /// Provider health.
    pub health: Arc<dyn HealthStore>,
    /// Channel offsets, the dedup window and the outbox.
    pub channels: Arc<dyn ChannelState>,
    /// Plugin key-value data.
    pub data: Arc<dyn PluginData>,
    /// The cost ledger.
    pub usage: Arc<dyn UsageLedger>,
    /// Schedules and their runs.
    pub schedules: Arc<dyn ScheduleStore>,
    /// The users' personal API tokens.
    pub credentials: Arc<dyn CredentialStore>,
    /// Leases of gateways that share the database.
    pub coordination: Arc<dyn Coordination>,
}

/// One value that is the whole store (`Arc<SqliteStore>`, `Arc<dyn Store>`, …).
impl<T: Store + ?Sized + 'static> From<Arc<T>> for Stores {
    fn from(store: Arc<T>) -> Self {
        Self {
            sessions: Arc::new(store.clone()),
            health: Arc::new(store.clone()),
            channels: Arc::new(store.clone()),
            data: Arc::new(store.clone()),
            usage: Arc::new(store.clone()),
            schedules: Arc::new(store.clone()),
            credentials: Arc::new(store.clone()),
            coordination: Arc::new(store),
        }
    }
}

/// `Arc<S>` and `Box<S>` implement each part that `S` implements, by forwarding: the way
/// to turn an `Arc<dyn Store>` into an `Arc<dyn SessionStore>` without trait upcasting.
macro_rules! forward_store {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<S: SessionStore + ?Sized> SessionStore for $ptr {
            async fn create_session(&self, new: NewSession) -> Result<SessionRecord, StoreError> {
                (**self).create_session(new).await
            }
            async fn create_child_session(
                &self,
                new: NewSession,
                lineage: Lineage,
            ) -> Result<SessionRecord, StoreError> {
                (**self).create_child_session(new, lineage).await
            }
            async fn session_lineage(&self, id: &str) -> Result<Option<Lineage>, StoreError> {
                (**self).session_lineage(id).await
            }
            async fn current_session(&self, key: &str) -> Result<Option<SessionRecord>, StoreError> {
                (**self).current_session(key).await
            }
            async fn set_current_session(
                &self,
                key: &str,
                session_id: &str,
            ) -> Result<SessionRecord, StoreError> {
                (**self).set_current_session(key, session_id).await
            }
            async fn get_session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
                (**self).get_session(id).await
            }
            async fn list_sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, StoreError> {
                (**self).list_sessions(agent).await
            }
            async fn set_session_title(&self, id: &str, title: &str) -> Result<(), StoreError> {
                (**self).set_session_title(id, title).await
            }
            async fn set_session_model(&self, id: &str, model: &str) -> Result<(), StoreError> {
                (**self).set_session_model(id, model).await
            }
            async fn touch(&self, id: &str) -> Result<(), StoreError> {
                (**self).touch(id).await
            }
            async fn append_turn(
                &self,
                session_id: &str,
                messages: Vec<NewMessage>,
            ) -> Result<Vec<i64>, StoreError> {
                (**self).append_turn(session_id, messages).await
            }
            async fn append_turn_fenced(
                &self,
                session_id: &str,
                messages: Vec<NewMessage>,
                fence: &Fence,
            ) -> Result<Vec<i64>, StoreError> {
                (**self).append_turn_fenced(session_id, messages, fence).await
            }
            async fn append_answered_turn(
                &self,
                session_id: &str,
                messages: Vec<NewMessage>,
                fence: Option<&Fence>,
                answer: PromptAnswer,
            ) -> Result<Vec<i64>, StoreError> {
                (**self).append_answered_turn(session_id, messages, fence, answer).await
            }
            async fn prompt_answer(
                &self,
                agent: &str,
                session_key: &str,
                key: &str,
            ) -> Result<Option<PromptAnswer>, StoreError> {
                (**self).prompt_answer(agent, session_key, key).await
            }
            async fn messages(
                &self,
                session_id: &str,
                include_compacted: bool,
            ) -> Result<Vec<StoredMessage>, StoreError> {
                (**self).messages(session_id, include_compacted).await
            }
            async fn compact(
                &self,
                session_id: &str,
                upto_seq: i64,
                summary: Message,
            ) -> Result<(), StoreError> {
                (**self).compact(session_id, upto_seq, summary).await
            }
            async fn message_revision(&self, session_id: &str) -> Result<Option<u64>, StoreError> {
                (**self).message_revision(session_id).await
            }
            async fn get_settings(&self, key: &str) -> Result<SessionSettings, StoreError> {
                (**self).get_settings(key).await
            }
            async fn update_settings(
                &self,
                key: &str,
                patch: SettingsPatch,
            ) -> Result<SessionSettings, StoreError> {
                (**self).update_settings(key, patch).await
            }
            async fn get_metadata(&self, key: &str) -> Result<serde_json::Value, StoreError> {
                (**self).get_metadata(key).await
            }
            async fn set_metadata(
                &self,
                key: &str,
                field: &str,
                value: serde_json::Value,
            ) -> Result<(), StoreError> {
                (**self).set_metadata(key, field, value).await
            }
        }

        #[async_trait]
        impl<S: HealthStore + ?Sized> HealthStore for $ptr {
            async fn load_health(&self) -> Result<Vec<HealthRecord>, StoreError> {
                (**self).load_health().await
            }
            async fn save_health(&self, record: HealthRecord) -> Result<(), StoreError> {
                (**self).save_health(record).await
            }
            async fn clear_health(&self, model_key: &str) -> Result<(), StoreError> {
                (**self).clear_health(model_key).await
            }
        }

        #[async_trait]
        impl<S: ChannelState + ?Sized> ChannelState for $ptr {
            async fn get_offset(&self, channel: &str) -> Result<Option<i64>, StoreError> {
                (**self).get_offset(channel).await
            }
            async fn set_offset(&self, channel: &str, value: i64) -> Result<(), StoreError> {
                (**self).set_offset(channel, value).await
            }
            async fn mark_seen(&self, channel: &str, update_id: i64) -> Result<bool, StoreError> {
                (**self).mark_seen(channel, update_id).await
            }
            async fn enqueue_outbox(
                &self,
                channel: &str,
                payload: serde_json::Value,
            ) -> Result<i64, StoreError> {
                (**self).enqueue_outbox(channel, payload).await
            }
            async fn due_outbox(
                &self,
                channel: &str,
                now_ms: i64,
                limit: usize,
            ) -> Result<Vec<OutboxItem>, StoreError> {
                (**self).due_outbox(channel, now_ms, limit).await
            }
            async fn outbox_done(&self, id: i64) -> Result<(), StoreError> {
                (**self).outbox_done(id).await
            }
            async fn outbox_retry(
                &self,
                id: i64,
                next_attempt_at: i64,
                error: &str,
            ) -> Result<(), StoreError> {
                (**self).outbox_retry(id, next_attempt_at, error).await
            }
        }

        #[async_trait]
        impl<S: PluginData + ?Sized> PluginData for $ptr {
            async fn kv_get(
                &self,
                plugin: &str,
                scope: &str,
                key: &str,
            ) -> Result<Option<String>, StoreError> {
                (**self).kv_get(plugin, scope, key).await
            }
            async fn kv_set(
                &self,
                plugin: &str,
                scope: &str,
                key: &str,
                value: &str,
            ) -> Result<(), StoreError> {
                (**self).kv_set(plugin, scope, key, value).await
            }
            async fn kv_set_within(
                &self,
                plugin: &str,
                scope: &str,
                key: &str,
                value: &str,
                limits: KvLimits,
            ) -> Result<KvWrite, StoreError> {
                (**self).kv_set_within(plugin, scope, key, value, limits).await
            }
            async fn kv_usage(&self, plugin: &str, scope: Option<&str>) -> Result<KvUsage, StoreError> {
                (**self).kv_usage(plugin, scope).await
            }
            async fn kv_del(&self, plugin: &str, scope: &str, key: &str) -> Result<bool, StoreError> {
                (**self).kv_del(plugin, scope, key).await
            }
            async fn kv_list(
                &self,
                plugin: &str,
                scope: &str,
                prefix: &str,
            ) -> Result<Vec<String>, StoreError> {
                (**self).kv_list(plugin, scope, prefix).await
            }
        }

        #[async_trait]
        impl<S: UsageLedger + ?Sized> UsageLedger for $ptr {
            async fn record_usage(&self, entry: LedgerEntry) -> Result<(), StoreError> {
                (**self).record_usage(entry).await
            }
            async fn usage_totals(&self, filter: LedgerFilter) -> Result<UsageTotals, StoreError> {
                (**self).usage_totals(filter).await
            }
            async fn usage_report(&self, query: UsageQuery) -> Result<UsageReport, StoreError> {
                (**self).usage_report(query).await
            }
        }
    )*};
}

forward_store!(Arc<S>, Box<S>);

/// The title for a session whose first user message says `text`: whitespace collapsed,
/// shortened to [`TITLE_MAX_CHARS`] with an ellipsis; `None` for blank text.
pub fn title_from(text: &str) -> Option<String> {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return None;
    }
    if collapsed.chars().count() <= TITLE_MAX_CHARS {
        return Some(collapsed);
    }
    let mut short: String = collapsed.chars().take(TITLE_MAX_CHARS - 1).collect();
    short.truncate(short.trim_end().len());
    short.push('…');
    Some(short)
}
