//! [`MemoryStore`]: the whole [`Store`](crate::store::Store) in memory, with the
//! semantics of `SqliteStore` — the same contract suite (`store/tests.rs`) runs against
//! both.
//!
//! One mutex guards all the state and no call awaits while holding it, so every method is
//! one atomic step, as a transaction is in SQLite: a turn is appended whole, a limit is
//! checked and written together. Nothing survives the process.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use crate::llm::{Message, Role, Usage};
use crate::store::{
    now_ms, title_from, ChannelState, HealthRecord, HealthStore, KvLimits, KvUsage, KvWrite,
    Lineage, NewMessage, NewSession, OutboxItem, PluginData, PromptAnswer, SessionRecord,
    SessionSettings, SessionStore, SettingsPatch, StoreError, StoredMessage,
    PROMPT_ANSWER_RETENTION_MS, SEEN_WINDOW,
};
// The `ScheduleStore` half, in its own file; a child module so it shares the state.
#[path = "memory_schedules.rs"]
mod schedules;
// The `CredentialStore` half.
#[path = "memory_coordination.rs"]
mod coordination;
#[path = "memory_credentials.rs"]
mod credentials;

use crate::store::{
    LedgerEntry, LedgerFilter, UsageLedger, UsageQuery, UsageReport, UsageRow, UsageTotals,
};

/// A store that keeps everything in memory: sessions (with the current session of each
/// key), messages (compaction marks, never deletes), settings and metadata, provider
/// health, channel offsets, the dedup window ([`SEEN_WINDOW`] ids per channel), the
/// outbox, and plugin data with the limits of [`PluginData::kv_set_within`]. Clones share
/// the same state, as clones of `SqliteStore` share one database.
///
/// ```
/// use beige_core::store::{NewSession, SessionStore};
/// use beige_core::testing::MemoryStore;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let new = NewSession {
///     agent: "a".into(),
///     key: "api:a:default".into(),
///     ..Default::default()
/// };
/// let session = store.create_session(new).await.unwrap();
/// assert_eq!(store.current_session("api:a:default").await.unwrap(), Some(session));
/// // A gateway takes it as its store: `GatewayBuilder::store(Arc::new(store))`.
/// # });
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("MemoryStore");
        // `try_lock`: printing the store must never wait for (or deadlock on) a call.
        if let Ok(state) = self.state.try_lock() {
            d.field("sessions", &state.sessions.len())
                .field("outbox", &state.outbox.len())
                .field("kv", &state.kv.len());
        }
        d.finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Insert a session, with its lineage when it is a sub-agent's, as one step.
    fn insert_session(
        &self,
        new: NewSession,
        lineage: Option<Lineage>,
    ) -> Result<SessionRecord, StoreError> {
        let mut state = self.lock();
        if let Some(parent) = &new.parent_id {
            state.session(parent)?;
        }
        let now = now_ms();
        let id = loop {
            let id = format!("s_{:016x}", rand::random::<u64>());
            if !state.sessions.contains_key(&id) {
                break id;
            }
        };
        state.session_rows += 1;
        let session = Session {
            row: state.session_rows,
            agent: new.agent,
            key: new.key.clone(),
            parent_id: new.parent_id,
            title: None,
            model: new.model,
            created: now,
            updated: now,
            messages: Vec::new(),
            revision: 0,
        };
        let record = session.record(&id);
        state.sessions.insert(id.clone(), session);
        if let Some(l) = lineage {
            state.lineage.insert(id.clone(), l);
        }
        state.keys.entry(new.key).or_default().current = Some(id);
        Ok(record)
    }

    /// Append one turn under the lock, with `answer` when it has one.
    fn append(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        answer: Option<PromptAnswer>,
    ) -> Result<Vec<i64>, StoreError> {
        // As SQLite does: a message that cannot be encoded fails the turn before anything
        // is written.
        for (i, m) in messages.iter().enumerate() {
            serde_json::to_string(&m.message).map_err(|e| StoreError::Invalid {
                message: format!("message {i} of the turn cannot be encoded as JSON: {e}"),
            })?;
        }
        let mut state = self.lock();
        let last_seq = state
            .session(session_id)?
            .messages
            .iter()
            .map(|m| m.seq)
            .max()
            .unwrap_or(0);
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_ms();
        let mut new_title = None;
        let mut rows = Vec::with_capacity(messages.len());
        for (seq, m) in (last_seq + 1..).zip(messages) {
            if new_title.is_none() && m.message.role == Role::User {
                new_title = title_from(&m.message.text());
            }
            rows.push(Row {
                id: state.next_message_id(),
                seq,
                sub: 0,
                message: m.message,
                model: m.model,
                usage: m.usage,
                summary: false,
                compacted: false,
                created: now,
            });
        }
        let ids = rows.iter().map(|r| r.id).collect();
        let session = state.session_mut(session_id)?;
        session.messages.extend(rows);
        if session.title.is_none() {
            session.title = new_title;
        }
        session.updated = now;
        session.revision += 1;
        if let Some(mut a) = answer {
            a.created = now;
            state
                .answers
                .retain(|_, a| a.created >= now - PROMPT_ANSWER_RETENTION_MS);
            state
                .answers
                .entry((a.agent.clone(), a.session_key.clone(), a.key.clone()))
                .or_insert(a);
        }
        Ok(ids)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No method panics while holding the lock with the state half changed: every
        // check comes before the first write.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct State {
    /// Leases by name: (holder, epoch, expires ms).
    leases: HashMap<String, (Option<String>, i64, i64)>,
    /// By id.
    sessions: HashMap<String, Session>,
    /// Incremented per created session: the tie-break of `list_sessions` (SQLite's rowid).
    session_rows: u64,
    keys: HashMap<String, KeyRow>,
    /// The last message id handed out (ids are unique across the store, never reused).
    message_ids: i64,
    health: BTreeMap<String, HealthRecord>,
    offsets: HashMap<String, i64>,
    seen: HashMap<String, Seen>,
    /// By id, so in enqueue order.
    outbox: BTreeMap<i64, OutboxItem>,
    /// The last outbox id handed out (never reused).
    outbox_ids: i64,
    /// By (plugin, scope, key): keys of one scope in byte order, as `kv_list` returns them.
    kv: BTreeMap<(String, String, String), String>,
    /// The cost ledger, in the order recorded.
    ledger: Vec<LedgerEntry>,
    /// The lineage of sub-agents' sessions, by session id.
    lineage: HashMap<String, Lineage>,
    /// Schedules by id, and their runs.
    schedules: schedules::Schedules,
    /// Personal API tokens by id.
    tokens: HashMap<String, crate::store::TokenRecord>,
    /// Answers of keyed prompts by (agent, session key, idempotency key).
    answers: HashMap<(String, String, String), PromptAnswer>,
}

struct Session {
    row: u64,
    agent: String,
    key: String,
    parent_id: Option<String>,
    title: Option<String>,
    model: Option<String>,
    created: i64,
    updated: i64,
    /// In `(seq, sub)` order.
    messages: Vec<Row>,
    /// Raised by each append and compaction (`SessionStore::message_revision`).
    revision: u64,
}

/// One stored message. Order within a session is `(seq, sub)`: messages have `sub = 0`,
/// a summary the `seq` of the last message it replaces and `sub = 1, 2, …`.
struct Row {
    id: i64,
    seq: i64,
    sub: i64,
    message: Message,
    model: Option<String>,
    usage: Option<Usage>,
    summary: bool,
    compacted: bool,
    created: i64,
}

#[derive(Default)]
struct KeyRow {
    current: Option<String>,
    settings: SessionSettings,
    metadata: serde_json::Map<String, serde_json::Value>,
}

/// The update ids seen on one channel, oldest first, at most [`SEEN_WINDOW`].
#[derive(Default)]
struct Seen {
    order: VecDeque<i64>,
    ids: HashSet<i64>,
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        what: "session",
        id: id.to_string(),
    }
}

impl Session {
    fn record(&self, id: &str) -> SessionRecord {
        let mut usage = Usage::default();
        for u in self.messages.iter().filter_map(|m| m.usage.as_ref()) {
            usage.input_tokens += u.input_tokens;
            usage.output_tokens += u.output_tokens;
            usage.cache_read_tokens += u.cache_read_tokens;
            usage.cache_write_tokens += u.cache_write_tokens;
        }
        SessionRecord {
            id: id.to_string(),
            agent: self.agent.clone(),
            key: self.key.clone(),
            parent_id: self.parent_id.clone(),
            title: self.title.clone(),
            model: self.model.clone(),
            created: self.created,
            updated: self.updated,
            message_count: self.messages.iter().filter(|m| !m.summary).count() as u64,
            usage,
        }
    }
}

impl State {
    fn session(&self, id: &str) -> Result<&Session, StoreError> {
        self.sessions.get(id).ok_or_else(|| not_found(id))
    }

    fn session_mut(&mut self, id: &str) -> Result<&mut Session, StoreError> {
        self.sessions.get_mut(id).ok_or_else(|| not_found(id))
    }

    fn record(&self, id: &str) -> Option<SessionRecord> {
        self.sessions.get(id).map(|s| s.record(id))
    }

    /// Queue `payload` on `channel` for sending now; its id.
    fn enqueue(&mut self, channel: &str, payload: serde_json::Value) -> i64 {
        self.outbox_ids += 1;
        let id = self.outbox_ids;
        let now = now_ms();
        self.outbox.insert(
            id,
            OutboxItem {
                id,
                channel: channel.to_string(),
                payload,
                attempts: 0,
                next_attempt_at: now,
                last_error: None,
                created: now,
            },
        );
        id
    }

    fn next_message_id(&mut self) -> i64 {
        self.message_ids += 1;
        self.message_ids
    }

    /// Entries and bytes (keys plus values, UTF-8) of `plugin` in `scope`, or in all its
    /// scopes.
    fn usage(&self, plugin: &str, scope: Option<&str>) -> KvUsage {
        let mut usage = KvUsage::default();
        for ((p, s, k), v) in &self.kv {
            if p == plugin && scope.is_none_or(|scope| scope == s) {
                usage.entries += 1;
                usage.bytes += (k.len() + v.len()) as u64;
            }
        }
        usage
    }
}

fn kv_key(plugin: &str, scope: &str, key: &str) -> (String, String, String) {
    (plugin.to_string(), scope.to_string(), key.to_string())
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn create_session(&self, new: NewSession) -> Result<SessionRecord, StoreError> {
        self.insert_session(new, None)
    }

    async fn create_child_session(
        &self,
        mut new: NewSession,
        lineage: Lineage,
    ) -> Result<SessionRecord, StoreError> {
        new.parent_id = Some(lineage.parent_session_id.clone());
        self.insert_session(new, Some(lineage))
    }

    async fn session_lineage(&self, id: &str) -> Result<Option<Lineage>, StoreError> {
        Ok(self.lock().lineage.get(id).cloned())
    }

    async fn current_session(&self, key: &str) -> Result<Option<SessionRecord>, StoreError> {
        let state = self.lock();
        Ok(state
            .keys
            .get(key)
            .and_then(|k| k.current.as_deref())
            .and_then(|id| state.record(id)))
    }

    async fn set_current_session(
        &self,
        key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, StoreError> {
        let mut state = self.lock();
        let record = state
            .record(session_id)
            .ok_or_else(|| not_found(session_id))?;
        state.keys.entry(key.to_string()).or_default().current = Some(session_id.to_string());
        Ok(record)
    }

    async fn get_session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.lock().record(id))
    }

    async fn list_sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let state = self.lock();
        let mut found: Vec<(&String, &Session)> = state
            .sessions
            .iter()
            .filter(|(_, s)| s.agent == agent)
            .collect();
        found.sort_by(|(_, a), (_, b)| b.created.cmp(&a.created).then(b.row.cmp(&a.row)));
        Ok(found.into_iter().map(|(id, s)| s.record(id)).collect())
    }

    async fn set_session_title(&self, id: &str, title: &str) -> Result<(), StoreError> {
        let mut state = self.lock();
        let session = state.session_mut(id)?;
        session.title = Some(title.to_string());
        session.updated = now_ms();
        Ok(())
    }

    async fn set_session_model(&self, id: &str, model: &str) -> Result<(), StoreError> {
        let mut state = self.lock();
        let session = state.session_mut(id)?;
        session.model = Some(model.to_string());
        session.updated = now_ms();
        Ok(())
    }

    async fn touch(&self, id: &str) -> Result<(), StoreError> {
        self.lock().session_mut(id)?.updated = now_ms();
        Ok(())
    }

    async fn append_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<i64>, StoreError> {
        self.append(session_id, messages, None)
    }

    async fn append_answered_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        fence: Option<&crate::store::Fence>,
        answer: PromptAnswer,
    ) -> Result<Vec<i64>, StoreError> {
        // As `append_turn_fenced`'s default: one gateway uses this store.
        let _ = fence;
        self.append(session_id, messages, Some(answer))
    }

    async fn prompt_answer(
        &self,
        agent: &str,
        session_key: &str,
        key: &str,
    ) -> Result<Option<PromptAnswer>, StoreError> {
        let oldest = now_ms() - PROMPT_ANSWER_RETENTION_MS;
        Ok(self
            .lock()
            .answers
            .get(&(agent.to_string(), session_key.to_string(), key.to_string()))
            .filter(|a| a.created >= oldest)
            .cloned())
    }

    async fn messages(
        &self,
        session_id: &str,
        include_compacted: bool,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let state = self.lock();
        let session = state.session(session_id)?;
        Ok(session
            .messages
            .iter()
            .filter(|m| include_compacted || !m.compacted)
            .map(|m| StoredMessage {
                id: m.id,
                seq: m.seq,
                message: m.message.clone(),
                model: m.model.clone(),
                usage: m.usage,
                compacted: m.compacted,
                summary: m.summary,
                created: m.created,
            })
            .collect())
    }

    async fn compact(
        &self,
        session_id: &str,
        upto_seq: i64,
        summary: Message,
    ) -> Result<(), StoreError> {
        serde_json::to_string(&summary).map_err(|e| StoreError::Invalid {
            message: format!("the summary cannot be encoded as JSON: {e}"),
        })?;
        let mut state = self.lock();
        let left = state
            .session(session_id)?
            .messages
            .iter()
            .any(|m| m.seq <= upto_seq && !m.compacted && !m.summary);
        if !left {
            return Err(StoreError::Invalid {
                message: format!(
                    "session {session_id} has no uncompacted message up to seq {upto_seq}"
                ),
            });
        }
        let id = state.next_message_id();
        let now = now_ms();
        let session = state.session_mut(session_id)?;
        // The messages up to `upto_seq` and the earlier summaries among them.
        for m in session.messages.iter_mut().filter(|m| m.seq <= upto_seq) {
            m.compacted = true;
        }
        let sub = session
            .messages
            .iter()
            .filter(|m| m.seq == upto_seq)
            .map(|m| m.sub)
            .max()
            .unwrap_or(0)
            + 1;
        let at = session
            .messages
            .iter()
            .position(|m| (m.seq, m.sub) > (upto_seq, sub))
            .unwrap_or(session.messages.len());
        session.messages.insert(
            at,
            Row {
                id,
                seq: upto_seq,
                sub,
                message: summary,
                model: None,
                usage: None,
                summary: true,
                compacted: false,
                created: now,
            },
        );
        session.updated = now;
        session.revision += 1;
        Ok(())
    }

    async fn message_revision(&self, session_id: &str) -> Result<Option<u64>, StoreError> {
        Ok(Some(self.lock().session(session_id)?.revision))
    }

    async fn get_settings(&self, key: &str) -> Result<SessionSettings, StoreError> {
        Ok(self
            .lock()
            .keys
            .get(key)
            .map(|k| k.settings.clone())
            .unwrap_or_default())
    }

    async fn update_settings(
        &self,
        key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, StoreError> {
        let mut state = self.lock();
        let settings = &mut state.keys.entry(key.to_string()).or_default().settings;
        if let Some(v) = patch.verbose {
            settings.verbose = v;
        }
        if let Some(v) = patch.streaming {
            settings.streaming = v;
        }
        if let Some(v) = patch.model_override {
            settings.model_override = v;
        }
        Ok(settings.clone())
    }

    async fn get_metadata(&self, key: &str) -> Result<serde_json::Value, StoreError> {
        Ok(serde_json::Value::Object(
            self.lock()
                .keys
                .get(key)
                .map(|k| k.metadata.clone())
                .unwrap_or_default(),
        ))
    }

    async fn set_metadata(
        &self,
        key: &str,
        field: &str,
        value: serde_json::Value,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let metadata = &mut state.keys.entry(key.to_string()).or_default().metadata;
        if value.is_null() {
            metadata.remove(field);
        } else {
            metadata.insert(field.to_string(), value);
        }
        Ok(())
    }
}

/// One ledger row as totals.
fn totals_of(e: &LedgerEntry) -> UsageTotals {
    UsageTotals {
        calls: 1,
        input_tokens: e.usage.input_tokens,
        output_tokens: e.usage.output_tokens,
        cache_read_tokens: e.usage.cache_read_tokens,
        cache_write_tokens: e.usage.cache_write_tokens,
        cost_micros: e.cost_micros,
        unpriced_calls: u64::from(e.unpriced),
    }
}

#[async_trait]
impl UsageLedger for MemoryStore {
    async fn record_usage(&self, entry: LedgerEntry) -> Result<(), StoreError> {
        self.lock().ledger.push(entry);
        Ok(())
    }

    async fn usage_totals(&self, filter: LedgerFilter) -> Result<UsageTotals, StoreError> {
        let state = self.lock();
        let mut total = UsageTotals::default();
        // With `with_children`: the session and every session below it, linked by the
        // rows' parents.
        let mut tree: HashSet<&str> = HashSet::new();
        if let (Some(root), true) = (&filter.session_id, filter.with_children) {
            tree.insert(root.as_str());
            loop {
                let before = tree.len();
                for e in &state.ledger {
                    if let (Some(s), Some(p)) = (&e.session_id, &e.parent_session_id) {
                        if tree.contains(p.as_str()) {
                            tree.insert(s.as_str());
                        }
                    }
                }
                if tree.len() == before {
                    break;
                }
            }
        }
        for e in state.ledger.iter().filter(|e| {
            filter.agent.as_ref().is_none_or(|a| *a == e.agent)
                && match (&filter.session_id, filter.with_children) {
                    (None, _) => true,
                    (Some(s), false) => Some(s) == e.session_id.as_ref(),
                    (Some(_), true) => e.session_id.as_deref().is_some_and(|s| tree.contains(s)),
                }
                && filter.since_ms.is_none_or(|t| e.ts >= t)
        }) {
            total.add(&totals_of(e));
        }
        Ok(total)
    }

    async fn usage_report(&self, query: UsageQuery) -> Result<UsageReport, StoreError> {
        use crate::store::UsageGroupBy;
        let state = self.lock();
        let mut groups: BTreeMap<String, UsageTotals> = BTreeMap::new();
        for e in state.ledger.iter().filter(|e| {
            query.agent.as_ref().is_none_or(|a| *a == e.agent)
                && query.since_ms.is_none_or(|t| e.ts >= t)
        }) {
            let key = match query.by {
                UsageGroupBy::Agent => e.agent.clone(),
                UsageGroupBy::Session => e.session_id.clone().unwrap_or_default(),
                UsageGroupBy::Model => e.model.clone(),
                UsageGroupBy::Day => crate::budget::day_of(e.ts),
            };
            groups.entry(key).or_default().add(&totals_of(e));
        }
        let rows = groups
            .into_iter()
            .map(|(key, totals)| UsageRow { key, totals })
            .collect();
        Ok(UsageReport::new(query.by, rows))
    }
}

#[async_trait]
impl HealthStore for MemoryStore {
    async fn load_health(&self) -> Result<Vec<HealthRecord>, StoreError> {
        Ok(self.lock().health.values().cloned().collect())
    }

    async fn save_health(&self, record: HealthRecord) -> Result<(), StoreError> {
        self.lock().health.insert(record.model_key.clone(), record);
        Ok(())
    }

    async fn clear_health(&self, model_key: &str) -> Result<(), StoreError> {
        self.lock().health.remove(model_key);
        Ok(())
    }
}

#[async_trait]
impl ChannelState for MemoryStore {
    async fn get_offset(&self, channel: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.lock().offsets.get(channel).copied())
    }

    async fn set_offset(&self, channel: &str, value: i64) -> Result<(), StoreError> {
        self.lock().offsets.insert(channel.to_string(), value);
        Ok(())
    }

    async fn mark_seen(&self, channel: &str, update_id: i64) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let seen = state.seen.entry(channel.to_string()).or_default();
        if !seen.ids.insert(update_id) {
            return Ok(false);
        }
        seen.order.push_back(update_id);
        while seen.order.len() > SEEN_WINDOW {
            if let Some(old) = seen.order.pop_front() {
                seen.ids.remove(&old);
            }
        }
        Ok(true)
    }

    async fn enqueue_outbox(
        &self,
        channel: &str,
        payload: serde_json::Value,
    ) -> Result<i64, StoreError> {
        Ok(self.lock().enqueue(channel, payload))
    }

    async fn due_outbox(
        &self,
        channel: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<OutboxItem>, StoreError> {
        Ok(self
            .lock()
            .outbox
            .values()
            .filter(|i| i.channel == channel && i.next_attempt_at <= now_ms)
            .take(limit)
            .cloned()
            .collect())
    }

    async fn outbox_done(&self, id: i64) -> Result<(), StoreError> {
        self.lock().outbox.remove(&id);
        Ok(())
    }

    async fn outbox_retry(
        &self,
        id: i64,
        next_attempt_at: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let item = state
            .outbox
            .get_mut(&id)
            .ok_or_else(|| StoreError::NotFound {
                what: "outbox item",
                id: id.to_string(),
            })?;
        item.attempts += 1;
        item.next_attempt_at = next_attempt_at;
        item.last_error = Some(error.to_string());
        Ok(())
    }
}

#[async_trait]
impl PluginData for MemoryStore {
    async fn kv_get(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self.lock().kv.get(&kv_key(plugin, scope, key)).cloned())
    }

    async fn kv_set(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StoreError> {
        self.lock()
            .kv
            .insert(kv_key(plugin, scope, key), value.to_string());
        Ok(())
    }

    async fn kv_set_within(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
        limits: KvLimits,
    ) -> Result<KvWrite, StoreError> {
        // The check and the write under one lock: concurrent sets cannot overshoot.
        let mut state = self.lock();
        let full_key = kv_key(plugin, scope, key);
        let old = state
            .kv
            .get(&full_key)
            .map(|v| (key.len() + v.len()) as u64);
        let usage = if limits.whole_plugin {
            state.usage(plugin, None)
        } else {
            state.usage(plugin, Some(scope))
        };
        if let Some(refusal) = crate::store::kv_limit_check(limits, usage, old, key, value) {
            return Ok(refusal);
        }
        state.kv.insert(full_key, value.to_string());
        Ok(KvWrite::Stored)
    }

    async fn kv_usage(&self, plugin: &str, scope: Option<&str>) -> Result<KvUsage, StoreError> {
        Ok(self.lock().usage(plugin, scope))
    }

    async fn kv_del(&self, plugin: &str, scope: &str, key: &str) -> Result<bool, StoreError> {
        Ok(self.lock().kv.remove(&kv_key(plugin, scope, key)).is_some())
    }

    async fn kv_list(
        &self,
        plugin: &str,
        scope: &str,
        prefix: &str,
    ) -> Result<Vec<String>, StoreError> {
        let state = self.lock();
        Ok(state
            .kv
            .range(kv_key(plugin, scope, prefix)..)
            .take_while(|((p, s, k), _)| p == plugin && s == scope && k.starts_with(prefix))
            .map(|((_, _, k), _)| k.clone())
            .collect())
    }
}
