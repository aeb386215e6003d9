//! Long polling with a durable inbox, and the watchdog that keeps it alive.
//!
//! Each update from `getUpdates` is *accepted* before anything else happens to it, in
//! this order (each step one atomic store operation):
//!
//! 1. the raw update is queued in the inbox (the store's outbox table, channel
//!    [`INBOX`]);
//! 2. its id is marked seen ([`ChannelState::mark_seen`]); when it was seen before, the entry
//!    from step 1 is removed again and the update is dropped as a duplicate;
//! 3. the offset is persisted as `update_id + 1`.
//!
//! Only then is the update handed to the dispatcher. A crash between 1 and 2 leaves an
//! inbox entry whose id is not marked seen: [`recover`] marks every inbox entry seen at
//! start, so when Telegram delivers the update again (the offset was not advanced), step 2
//! recognises it. A crash between 2 and 3 is caught by step 2 alone. A failing store step
//! is retried on its own (never repeating an earlier, successful step).
//!
//! The watchdog has two layers. Every `getUpdates` runs under a deadline of
//! `pollTimeout + watchdogGrace`; when Telegram has not answered by then, the request is
//! abandoned, the HTTP client is replaced (fresh connections) and polling continues.
//! Above that, a supervisor restarts the whole polling task when it has not reported
//! progress by its own deadline (for example when it is stuck anywhere else).

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::api::{ApiError, BotApi};
use super::outbox::CHANNEL;
use crate::store::{now_ms, ChannelState, StoreError};

/// Channel name of the inbox in the store's outbox table.
pub const INBOX: &str = "telegram.inbox";

/// An accepted update, waiting in the inbox until it is finished.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Inbound {
    /// The inbox entry (removed when the update is finished).
    pub inbox_id: i64,
    pub update_id: i64,
    pub update: Value,
}

/// Progress of polling, shared with the supervisor and visible to tests.
#[derive(Debug, Default)]
pub(crate) struct PollHealth {
    /// Unix ms by which the poller promises to report again.
    deadline_ms: AtomicI64,
    /// Polling restarts by the watchdog (either layer).
    pub restarts: AtomicU64,
    /// Successful `getUpdates` answers.
    pub polls: AtomicU64,
}

impl PollHealth {
    fn promise(&self, within: Duration) {
        let ms = i64::try_from(within.as_millis()).unwrap_or(i64::MAX / 4);
        self.deadline_ms.store(now_ms() + ms, Ordering::SeqCst);
    }

    fn overdue(&self) -> bool {
        now_ms() > self.deadline_ms.load(Ordering::SeqCst)
    }
}

/// Run `step` until it succeeds or `shutdown` fires (then `None`), waiting between
/// failures.
async fn retry<T, F, Fut>(
    what: &str,
    health: &PollHealth,
    shutdown: &CancellationToken,
    mut step: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut wait = Duration::from_millis(200);
    loop {
        match step().await {
            Ok(v) => return Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "Telegram polling: {what} failed; retrying");
                health.promise(wait + Duration::from_secs(30));
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Accept one update (see the module docs). `Ok(None)`: a duplicate.
pub(crate) async fn accept(
    state: &dyn ChannelState,
    update_id: i64,
    update: Value,
    health: &PollHealth,
    shutdown: &CancellationToken,
) -> Option<Option<Inbound>> {
    let payload = json!({"updateId": update_id, "update": update});
    let inbox_id = retry("queueing an update", health, shutdown, || {
        state.enqueue_outbox(INBOX, payload.clone())
    })
    .await?;
    let fresh = retry("marking an update seen", health, shutdown, || {
        state.mark_seen(CHANNEL, update_id)
    })
    .await?;
    if !fresh {
        retry("dropping a duplicate update", health, shutdown, || {
            state.outbox_done(inbox_id)
        })
        .await?;
    }
    retry("saving the offset", health, shutdown, || {
        state.set_offset(CHANNEL, update_id + 1)
    })
    .await?;
    if !fresh {
        tracing::info!(update_id, "Telegram update already handled; ignored");
        return Some(None);
    }
    Some(Some(Inbound {
        inbox_id,
        update_id,
        update,
    }))
}

/// At start: everything still in the inbox, oldest first, each marked seen; entries
/// whose reply is already queued are removed (they were finished); the offset is moved
/// past every inbox entry.
pub(crate) async fn recover(state: &dyn ChannelState) -> Result<Vec<Inbound>, StoreError> {
    let entries = state.due_outbox(INBOX, i64::MAX, 100_000).await?;
    let answered: HashSet<i64> = state
        .due_outbox(CHANNEL, i64::MAX, 100_000)
        .await?
        .iter()
        .filter_map(|i| i.payload.get("updateId").and_then(Value::as_i64))
        .collect();
    let stored_offset = state.get_offset(CHANNEL).await?;
    let mut offset = stored_offset.unwrap_or(0);
    let mut ids = HashSet::new();
    let mut out = Vec::new();
    for entry in entries {
        let (Some(update_id), Some(update)) = (
            entry.payload.get("updateId").and_then(Value::as_i64),
            entry.payload.get("update"),
        ) else {
            tracing::warn!(id = entry.id, "dropping an unreadable Telegram inbox entry");
            state.outbox_done(entry.id).await?;
            continue;
        };
        state.mark_seen(CHANNEL, update_id).await?;
        offset = offset.max(update_id + 1);
        if !ids.insert(update_id) || answered.contains(&update_id) {
            state.outbox_done(entry.id).await?;
            continue;
        }
        out.push(Inbound {
            inbox_id: entry.id,
            update_id,
            update: update.clone(),
        });
    }
    if Some(offset) != stored_offset && offset > 0 {
        state.set_offset(CHANNEL, offset).await?;
    }
    if !out.is_empty() {
        tracing::info!(
            count = out.len(),
            "resuming Telegram updates that were received but not finished before the last stop"
        );
    }
    Ok(out)
}

/// The polling loop.
#[derive(Debug, Clone)]
pub(crate) struct Poller {
    pub api: BotApi,
    pub state: Arc<dyn ChannelState>,
    pub wait: Duration,
    pub grace: Duration,
    pub tx: mpsc::UnboundedSender<Inbound>,
    pub health: Arc<PollHealth>,
}

impl Poller {
    /// How long one `getUpdates` may take before it counts as hung.
    fn limit(&self) -> Duration {
        self.wait + self.grace
    }

    /// Poll until `shutdown`.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let health = self.health.clone();
        let state = self.state.clone();
        let Some(stored) = retry("reading the offset", &health, &shutdown, || {
            state.get_offset(CHANNEL)
        })
        .await
        else {
            return;
        };
        let mut offset = stored.unwrap_or(0);
        let mut failures: u32 = 0;
        loop {
            let limit = self.limit();
            self.health.promise(limit + self.grace);
            let call = self
                .api
                .get_updates(offset, self.wait, limit + Duration::from_secs(1));
            let answer = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = tokio::time::timeout(limit, call) => a,
            };
            let updates = match answer {
                Err(_) | Ok(Err(ApiError::Timeout { .. })) => {
                    self.health.restarts.fetch_add(1, Ordering::SeqCst);
                    tracing::warn!(
                        after_ms = limit.as_millis() as u64,
                        "Telegram getUpdates gave no answer in time; restarting polling on a new connection"
                    );
                    self.api = self.api.renewed();
                    continue;
                }
                Ok(Err(e)) => {
                    failures += 1;
                    let delay = match e.retry_after() {
                        Some(s) => Duration::from_secs(s),
                        None => Duration::from_secs(1u64 << failures.min(5).saturating_sub(1)),
                    };
                    if e.code() == Some(409) {
                        tracing::warn!(error = %e, "another program is polling with this bot token (409 Conflict); make sure only one beige gateway uses it");
                    } else if e.is_auth() {
                        tracing::error!(error = %e, "Telegram rejected the bot token; check plugins.telegram.config.token");
                    } else {
                        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "Telegram getUpdates failed");
                    }
                    self.health.promise(delay + limit + self.grace);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
                Ok(Ok(u)) => u,
            };
            failures = 0;
            self.health.polls.fetch_add(1, Ordering::SeqCst);
            for (update_id, update) in updates {
                if update_id < offset {
                    continue;
                }
                let Some(accepted) =
                    accept(&*self.state, update_id, update, &self.health, &shutdown).await
                else {
                    return;
                };
                offset = update_id + 1;
                if let Some(inbound) = accepted {
                    if self.tx.send(inbound).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Keep a [`Poller`] running: restart it when it misses its deadline or ends.
pub(crate) async fn supervise(poller: Poller, shutdown: CancellationToken) {
    let health = poller.health.clone();
    loop {
        health.promise(poller.limit() + poller.grace * 2 + Duration::from_secs(5));
        let task_token = shutdown.child_token();
        let mut handle = tokio::spawn(poller.clone().run(task_token.clone()));
        let check = (poller.grace / 2).clamp(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    handle.abort();
                    return;
                }
                ended = &mut handle => {
                    if let Err(e) = ended {
                        tracing::error!(error = %e, "Telegram polling task failed; restarting it");
                    } else if !shutdown.is_cancelled() {
                        tracing::warn!("Telegram polling ended unexpectedly; restarting it");
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    break;
                }
                _ = tokio::time::sleep(check) => {
                    if health.overdue() {
                        health.restarts.fetch_add(1, Ordering::SeqCst);
                        tracing::warn!("Telegram polling stopped making progress; restarting it");
                        task_token.cancel();
                        handle.abort();
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryStore;

    fn store() -> Arc<MemoryStore> {
        Arc::new(MemoryStore::new())
    }

    fn update(id: i64) -> Value {
        json!({"update_id": id, "message": {"message_id": 1, "chat": {"id": 5, "type": "private"}, "text": "hi"}})
    }

    #[tokio::test]
    async fn an_update_is_accepted_once() {
        let s = store();
        let h = PollHealth::default();
        let t = CancellationToken::new();
        let a = accept(&*s, 10, update(10), &h, &t).await.unwrap();
        assert!(a.is_some());
        assert_eq!(s.get_offset(CHANNEL).await.unwrap(), Some(11));
        let again = accept(&*s, 10, update(10), &h, &t).await.unwrap();
        assert!(again.is_none());
        assert_eq!(s.due_outbox(INBOX, i64::MAX, 10).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_crash_after_queueing_never_duplicates() {
        let s = store();
        // Crash right after step 1: queued, not marked seen, offset not moved.
        s.enqueue_outbox(INBOX, json!({"updateId": 20, "update": update(20)}))
            .await
            .unwrap();
        let recovered = recover(&*s).await.unwrap();
        assert_eq!(recovered.len(), 1);
        assert_eq!(recovered[0].update_id, 20);
        assert_eq!(s.get_offset(CHANNEL).await.unwrap(), Some(21));
        // Telegram delivers it again anyway: recognised.
        let h = PollHealth::default();
        let t = CancellationToken::new();
        assert!(accept(&*s, 20, update(20), &h, &t).await.unwrap().is_none());
        assert_eq!(s.due_outbox(INBOX, i64::MAX, 10).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_crash_after_the_reply_was_queued_finishes_the_entry() {
        let s = store();
        s.enqueue_outbox(INBOX, json!({"updateId": 30, "update": update(30)}))
            .await
            .unwrap();
        s.enqueue_outbox(
            CHANNEL,
            json!({"kind": "text", "chatId": 5, "chunks": [], "updateId": 30}),
        )
        .await
        .unwrap();
        assert!(recover(&*s).await.unwrap().is_empty());
        assert!(s.due_outbox(INBOX, i64::MAX, 10).await.unwrap().is_empty());
        assert_eq!(s.due_outbox(CHANNEL, i64::MAX, 10).await.unwrap().len(), 1);
    }
}
