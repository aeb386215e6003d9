//! The gateway's copy of recent sessions' contexts, so that a prompt costs the same
//! however long its session is: the messages the next model call starts from (a shared
//! [`Messages`] list, roles already alternating) and their token estimate, kept between
//! prompts and grown by each stored exchange instead of being read and parsed again.
//!
//! Owns only this cache; the store stays the truth. An entry carries the store's
//! [`message_revision`](SessionStore::message_revision) of the messages it holds and is
//! used only while the store still reports that revision — one cheap read per prompt — so
//! a write by anyone else (another replica, a compaction, a `Sessions` call) makes the
//! next prompt read the messages again. A store that reports no revision is read every
//! time. Bounded: at most [`MAX_SESSIONS`] sessions and about [`MAX_BYTES`] of message
//! JSON, least recently used dropped first, and an entry unused for [`IDLE`] is dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::llm::{Message, Messages};
use crate::store::{SessionStore, StoreError};

/// Most sessions whose context is kept.
pub(crate) const MAX_SESSIONS: usize = 128;
/// Most message JSON kept, all sessions together (estimated as four bytes a token); a
/// session larger than this is never kept.
pub(crate) const MAX_BYTES: u64 = 64 * 1024 * 1024;
/// An entry unused this long is dropped.
pub(crate) const IDLE: Duration = Duration::from_secs(30 * 60);

/// Estimated tokens of a message list (about four characters a token).
pub(crate) fn estimate_tokens<'a>(messages: impl IntoIterator<Item = &'a Message>) -> u64 {
    messages
        .into_iter()
        .map(|m| serde_json::to_string(m).map(|s| s.len()).unwrap_or(0) as u64 / 4)
        .sum()
}

/// Add `message` after the last one, merged into it when both have the same role, so the
/// context always alternates (a cancelled or failed exchange can leave two user messages
/// in a row; a compaction summary is a user message before the kept user message).
pub(crate) fn push_alternating(list: &mut Messages, message: Message) {
    // `last_mut` copies a shared chunk: only for a merge, never to look.
    if list.last().is_some_and(|last| last.role == message.role) {
        if let Some(last) = list.last_mut() {
            last.content.extend(message.content);
            return;
        }
    }
    list.push(message);
}

/// A session's context as the model sees it, and what the gateway knows of its origin.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The store's revision of these messages; `None` when the store reports none (the
    /// context is then never kept).
    pub(crate) revision: Option<u64>,
    /// The stored messages, consecutive ones of the same role merged.
    pub(crate) messages: Messages,
    /// Estimated tokens of the stored messages (each counted as stored, unmerged).
    pub(crate) tokens: u64,
}

impl Context {
    /// This context followed by an exchange the store has just appended (raising the
    /// revision by one).
    pub(crate) fn appended<'a>(&self, exchange: impl IntoIterator<Item = &'a Message>) -> Self {
        let mut messages = self.messages.clone();
        let mut tokens = self.tokens;
        for m in exchange {
            tokens += estimate_tokens(std::iter::once(m));
            push_alternating(&mut messages, m.clone());
        }
        Self {
            revision: self.revision.map(|r| r + 1),
            messages,
            tokens,
        }
    }
}

#[derive(Debug)]
struct Entry {
    context: Context,
    /// When it was last used, for [`IDLE`].
    used: Instant,
    /// Order of last use, for the least recently used.
    tick: u64,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<String, Entry>,
    tick: u64,
}

impl Entries {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

/// The contexts of recently prompted sessions, by session id.
#[derive(Debug, Default)]
pub(crate) struct HistoryCache {
    entries: Mutex<Entries>,
}

impl HistoryCache {
    /// The context of session `id`: the kept one when the store still reports its
    /// revision, else read from the store (and not kept until [`HistoryCache::keep`]).
    pub(crate) async fn load(
        &self,
        store: &dyn SessionStore,
        id: &str,
    ) -> Result<Context, StoreError> {
        // The revision first: messages read after it are at least that new, so a later
        // change shows as a revision this entry does not have.
        let revision = store.message_revision(id).await?;
        if let Some(r) = revision {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let tick = entries.next_tick();
            if let Some(e) = entries.map.get_mut(id) {
                if e.context.revision == Some(r) {
                    e.used = Instant::now();
                    e.tick = tick;
                    return Ok(e.context.clone());
                }
                entries.map.remove(id);
            }
        }
        let stored = store.messages(id, false).await?;
        let tokens = estimate_tokens(stored.iter().map(|m| &m.message));
        let mut messages = Messages::new();
        for m in stored {
            push_alternating(&mut messages, m.message);
        }
        Ok(Context {
            revision,
            messages,
            tokens,
        })
    }

    /// Keep `context` as session `id`'s, dropping idle and least recently used entries
    /// beyond the bounds.
    pub(crate) fn keep(&self, id: &str, context: Context) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.map.remove(id);
        let bytes = context.tokens.saturating_mul(4);
        if context.revision.is_none() || bytes > MAX_BYTES {
            return;
        }
        let now = Instant::now();
        entries.map.retain(|_, e| now.duration_since(e.used) < IDLE);
        let mut total = bytes;
        for e in entries.map.values() {
            total = total.saturating_add(e.context.tokens.saturating_mul(4));
        }
        while entries.map.len() >= MAX_SESSIONS || total > MAX_BYTES {
            let Some(oldest) = entries
                .map
                .iter()
                .min_by_key(|(_, e)| e.tick)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = entries.map.remove(&oldest) {
                total = total.saturating_sub(e.context.tokens.saturating_mul(4));
            }
        }
        let tick = entries.next_tick();
        entries.map.insert(
            id.to_string(),
            Entry {
                context,
                used: now,
                tick,
            },
        );
    }

    /// How many sessions are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Role;
    use crate::store::{NewMessage, NewSession};
    use crate::testing::MemoryStore;

    async fn session(store: &MemoryStore) -> String {
        store
            .create_session(NewSession {
                agent: "a".into(),
                key: "k".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .id
    }

    fn exchange(i: usize) -> Vec<NewMessage> {
        vec![
            NewMessage::plain(Message::user_text(format!("q{i}"))),
            NewMessage::plain(Message::assistant_text(format!("a{i}"))),
        ]
    }

    fn texts(c: &Context) -> Vec<String> {
        c.messages.iter().map(Message::text).collect()
    }

    #[tokio::test]
    async fn a_kept_context_is_served_until_the_store_changes_behind_it() {
        let store = MemoryStore::new();
        let id = session(&store).await;
        store.append_turn(&id, exchange(1)).await.unwrap();
        let cache = HistoryCache::default();
        let first = cache.load(&store, &id).await.unwrap();
        assert_eq!(first.revision, Some(1));
        // The gateway stores its exchange and keeps the grown context.
        let ex = exchange(2);
        store.append_turn(&id, ex.clone()).await.unwrap();
        let grown = first.appended(ex.iter().map(|m| &m.message));
        cache.keep(&id, grown.clone());
        let again = cache.load(&store, &id).await.unwrap();
        assert_eq!(texts(&again), ["q1", "a1", "q2", "a2"]);
        assert_eq!(again.tokens, grown.tokens);
        // Someone else appends: the next load reads the store.
        store.append_turn(&id, exchange(3)).await.unwrap();
        let fresh = cache.load(&store, &id).await.unwrap();
        assert_eq!(texts(&fresh), ["q1", "a1", "q2", "a2", "q3", "a3"]);
        assert_eq!(fresh.revision, Some(3));
        assert_eq!(cache.len(), 0, "the stale entry is gone");
    }

    #[tokio::test]
    async fn a_write_between_load_and_append_is_never_served() {
        let store = MemoryStore::new();
        let id = session(&store).await;
        let cache = HistoryCache::default();
        let loaded = cache.load(&store, &id).await.unwrap();
        // Another writer appends while this prompt runs; then this prompt's exchange.
        store.append_turn(&id, exchange(1)).await.unwrap();
        let ex = exchange(2);
        store.append_turn(&id, ex.clone()).await.unwrap();
        cache.keep(&id, loaded.appended(ex.iter().map(|m| &m.message)));
        let next = cache.load(&store, &id).await.unwrap();
        assert_eq!(texts(&next), ["q1", "a1", "q2", "a2"]);
    }

    #[tokio::test]
    async fn compaction_invalidates_and_roles_alternate_like_a_fresh_read() {
        let store = MemoryStore::new();
        let id = session(&store).await;
        for i in 0..3 {
            store.append_turn(&id, exchange(i)).await.unwrap();
        }
        let cache = HistoryCache::default();
        cache.keep(&id, cache.load(&store, &id).await.unwrap());
        store
            .compact(&id, 4, Message::user_text("summary"))
            .await
            .unwrap();
        let after = cache.load(&store, &id).await.unwrap();
        // The summary (a user message) merges with the kept user message.
        assert_eq!(after.messages.len(), 2);
        assert_eq!(after.messages[0].role, Role::User);
        assert_eq!(after.messages[0].content.len(), 2);
        assert_eq!(after.tokens, {
            let stored = store.messages(&id, false).await.unwrap();
            estimate_tokens(stored.iter().map(|m| &m.message))
        });
    }

    #[test]
    fn a_request_shares_the_history_and_never_copies_it() {
        let history: Messages = (0..100)
            .map(|i| {
                if i % 2 == 0 {
                    Message::user_text(format!("q{i}"))
                } else {
                    Message::assistant_text(format!("a{i}"))
                }
            })
            .collect();
        let mut request = history.clone();
        push_alternating(&mut request, Message::user_text("next"));
        push_alternating(&mut request, Message::assistant_text("answer"));
        assert_eq!(request.len(), 102);
        assert!(request.shares_oldest_chunk_with(&history));
        // A merge into the shared history copies it for this request only.
        let mut merged = request.clone();
        push_alternating(&mut merged, Message::assistant_text("more"));
        assert_eq!((merged.len(), request.len()), (102, 102));
        assert!(merged.shares_oldest_chunk_with(&history));
    }

    #[tokio::test]
    async fn bounded_by_sessions_and_bytes() {
        let cache = HistoryCache::default();
        let context = |tokens| Context {
            revision: Some(1),
            messages: Messages::new(),
            tokens,
        };
        for i in 0..MAX_SESSIONS + 10 {
            cache.keep(&format!("s{i}"), context(1));
        }
        assert_eq!(cache.len(), MAX_SESSIONS);
        cache.keep("big", context(MAX_BYTES / 4 + 1));
        assert_eq!(
            cache.len(),
            MAX_SESSIONS,
            "too big to keep; replaces nothing"
        );
        cache.keep("half", context(MAX_BYTES / 8));
        cache.keep("half2", context(MAX_BYTES / 8));
        cache.keep("half3", context(MAX_BYTES / 8));
        let kept = &cache.entries.lock().unwrap().map;
        assert!(kept.contains_key("half3") && kept.contains_key("half2"));
        assert!(
            !kept.contains_key("half"),
            "the least recently used went first"
        );
        let total: u64 = kept.values().map(|e| e.context.tokens * 4).sum();
        assert!(total <= MAX_BYTES);
    }
}
