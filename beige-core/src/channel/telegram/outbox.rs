//! The outbox: every reply, command answer, proactive message and tool message is an
//! [`OutItem`] queued in the store (`ChannelState::enqueue_outbox`, channel `telegram`) and
//! delivered by one [`Sender`] task with retry and backoff.
//!
//! - One item is one logical message (an answer split into several chunks is one item);
//!   the chunks already sent are recorded in the store (plugin data `telegram` /
//!   `outbox-progress`) after each call, so a restart resumes with the next chunk.
//! - Per chat, items go out strictly in order: only the oldest pending item of a chat is
//!   tried; a later one waits even when it is due.
//! - 429 answers wait exactly `retry_after`; network errors and 5xx back off
//!   exponentially (1 s … 5 min); 400/403 (bad request, bot blocked) and items that
//!   failed [`MAX_ATTEMPTS`] times are dropped, logged, and recorded under
//!   `outbox-failed` so the `telegram` tool can report them.
//! - HTML Telegram refuses (`can't parse entities`) is sent again as plain text; an edit
//!   of a message that is gone becomes a new message.
//! - An item whose update is still being finished (its inbox entry not yet removed) is
//!   not sent yet — see the crash-safety design in the module docs of
//!   [`super`].

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::api::{ApiError, BotApi, Upload};
use super::format::{split_plain, Chunk, MAX_MESSAGE_LEN};
use crate::store::{now_ms, ChannelState, OutboxItem, PluginData, StoreError};

/// Channel name of replies in the outbox, of the offset and of the dedup window.
pub const CHANNEL: &str = "telegram";
/// Plugin name of the channel's records in the store's plugin data.
pub(crate) const KV: &str = "telegram";
const KV_PROGRESS: &str = "outbox-progress";
const KV_FAILED: &str = "outbox-failed";

/// Attempts before an item is given up.
pub(crate) const MAX_ATTEMPTS: u32 = 30;
/// Longest wait between attempts (except when Telegram asks for more).
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The sender looks at the queue at least this often.
const IDLE_TICK: Duration = Duration::from_secs(5);

/// Bumped on every enqueue: wakes every sender in the process.
static WAKE: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);
/// Bumped whenever an item leaves the outbox (sent or given up).
static SETTLED: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);

/// Wake the senders (after an enqueue, or when an update finished).
pub(crate) fn wake() {
    WAKE.send_modify(|v| *v = v.wrapping_add(1));
}

fn settled() {
    SETTLED.send_modify(|v| *v = v.wrapping_add(1));
}

/// One queued message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub(crate) enum OutItem {
    /// A text message in chunks; the first may replace a streamed preview.
    #[serde(rename_all = "camelCase")]
    Text {
        chat_id: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<i64>,
        chunks: Vec<Chunk>,
        /// The preview message the first chunk replaces.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        edit_message_id: Option<i64>,
        /// Reply to this message (groups).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to: Option<i64>,
        /// The update this answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        update_id: Option<i64>,
    },
    /// A photo upload.
    #[serde(rename_all = "camelCase")]
    Photo {
        chat_id: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<i64>,
        file_name: String,
        mime: String,
        /// Base64 of the file.
        data: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caption: Option<String>,
    },
}

impl OutItem {
    /// A text item from ready chunks.
    pub(crate) fn text(chat_id: i64, thread_id: Option<i64>, chunks: Vec<Chunk>) -> Self {
        OutItem::Text {
            chat_id,
            thread_id,
            chunks,
            edit_message_id: None,
            reply_to: None,
            update_id: None,
        }
    }

    pub(crate) fn chat_id(&self) -> i64 {
        match self {
            OutItem::Text { chat_id, .. } | OutItem::Photo { chat_id, .. } => *chat_id,
        }
    }

    pub(crate) fn update_id(&self) -> Option<i64> {
        match self {
            OutItem::Text { update_id, .. } => *update_id,
            OutItem::Photo { .. } => None,
        }
    }
}

/// Queue `item` and wake the sender. Returns the outbox id.
pub(crate) async fn enqueue(state: &dyn ChannelState, item: &OutItem) -> Result<i64, StoreError> {
    let payload = serde_json::to_value(item).map_err(|e| StoreError::Invalid {
        message: format!("cannot encode a Telegram outbox item: {e}"),
    })?;
    let id = state.enqueue_outbox(CHANNEL, payload).await?;
    wake();
    Ok(id)
}

/// What became of an outbox item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delivery {
    Sent,
    Failed(String),
    /// Still queued when the wait ended.
    Pending,
}

/// Wait up to `limit` for item `id` to leave the outbox.
pub(crate) async fn wait_settled(
    state: &dyn ChannelState,
    data: &dyn PluginData,
    id: i64,
    limit: Duration,
) -> Result<Delivery, StoreError> {
    let mut rx = SETTLED.subscribe();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let pending = state
            .due_outbox(CHANNEL, i64::MAX, 100_000)
            .await?
            .iter()
            .any(|i| i.id == id);
        if !pending {
            let key = id.to_string();
            return Ok(match data.kv_get(KV, KV_FAILED, &key).await? {
                Some(error) => {
                    let _ = data.kv_del(KV, KV_FAILED, &key).await;
                    Delivery::Failed(error)
                }
                None => Delivery::Sent,
            });
        }
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(Delivery::Pending),
        }
    }
}

/// Delivers the outbox. One per channel run.
#[derive(Debug, Clone)]
pub(crate) struct Sender {
    /// The outbox.
    pub state: Arc<dyn ChannelState>,
    /// Progress of long messages and failure records (plugin data `telegram`).
    pub data: Arc<dyn PluginData>,
    pub api: BotApi,
    /// Updates whose inbox entry is being removed; their replies wait.
    pub finishing: Arc<Mutex<HashSet<i64>>>,
    /// Items Telegram accepted but the store could not remove yet: never sent again.
    pub sent: Arc<Mutex<HashSet<i64>>>,
}

/// Why one delivery attempt failed.
#[derive(Debug)]
enum Failure {
    Api(ApiError),
    /// The item cannot be sent at all (undecodable).
    Invalid(String),
}

impl Sender {
    /// Send until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut wake_rx = WAKE.subscribe();
        loop {
            let next = self.pass().await;
            let wait = next.unwrap_or(IDLE_TICK).min(IDLE_TICK);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake_rx.changed() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Send everything that is due, chat by chat in order. Returns how long until the
    /// next item is due, if any is waiting.
    async fn pass(&self) -> Option<Duration> {
        loop {
            let items = match self.state.due_outbox(CHANNEL, i64::MAX, 1000).await {
                Ok(items) => items,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the Telegram outbox");
                    return Some(IDLE_TICK);
                }
            };
            let now = now_ms();
            let mut chats = HashSet::new();
            let mut batch = Vec::new();
            let mut next: Option<i64> = None;
            for item in items {
                let out: OutItem = match serde_json::from_value(item.payload.clone()) {
                    Ok(o) => o,
                    Err(e) => {
                        tracing::warn!(id = item.id, error = %e, "dropping an unreadable Telegram outbox item");
                        self.give_up(&item, &format!("unreadable item: {e}")).await;
                        continue;
                    }
                };
                if !chats.insert(out.chat_id()) {
                    continue;
                }
                if self.was_sent(item.id) {
                    // Delivered before; only its removal failed. Try that again.
                    if self.state.outbox_done(item.id).await.is_ok() {
                        self.sent
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&item.id);
                        settled();
                    } else {
                        next = Some(next.map_or(now + 5000, |n| n.min(now + 5000)));
                    }
                    continue;
                }
                if let Some(u) = out.update_id() {
                    if self
                        .finishing
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&u)
                    {
                        continue;
                    }
                }
                if item.next_attempt_at > now {
                    next = Some(next.map_or(item.next_attempt_at, |n| n.min(item.next_attempt_at)));
                    continue;
                }
                batch.push((item, out));
            }
            if batch.is_empty() {
                return next.map(|t| Duration::from_millis(u64::try_from(t - now).unwrap_or(0)));
            }
            futures_util::future::join_all(
                batch.into_iter().map(|(item, out)| self.attempt(item, out)),
            )
            .await;
        }
    }

    fn was_sent(&self, id: i64) -> bool {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }

    async fn attempt(&self, item: OutboxItem, out: OutItem) {
        match self.deliver(item.id, &out).await {
            Ok(()) => {
                if let Err(e) = self.state.outbox_done(item.id).await {
                    tracing::warn!(id = item.id, error = %e, "sent, but could not remove it from the outbox");
                    self.sent
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(item.id);
                    return;
                }
                let _ = self
                    .data
                    .kv_del(KV, KV_PROGRESS, &item.id.to_string())
                    .await;
                settled();
            }
            Err(Failure::Invalid(why)) => {
                tracing::warn!(
                    id = item.id,
                    chat = out.chat_id(),
                    "dropping a Telegram message: {why}"
                );
                self.give_up(&item, &why).await;
            }
            Err(Failure::Api(e)) => {
                let attempts = item.attempts + 1;
                if e.is_permanent() || attempts >= MAX_ATTEMPTS {
                    tracing::warn!(
                        id = item.id,
                        chat = out.chat_id(),
                        attempts,
                        error = %e,
                        "giving up on a Telegram message"
                    );
                    self.give_up(&item, &e.to_string()).await;
                    return;
                }
                let delay = match e.retry_after() {
                    Some(s) => Duration::from_secs(s),
                    None => backoff(attempts),
                };
                tracing::info!(
                    id = item.id,
                    chat = out.chat_id(),
                    attempts,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %e,
                    "Telegram message not sent yet; will retry"
                );
                let at = now_ms() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2);
                if let Err(se) = self.state.outbox_retry(item.id, at, &e.to_string()).await {
                    tracing::warn!(id = item.id, error = %se, "cannot record the failed attempt");
                }
            }
        }
    }

    async fn give_up(&self, item: &OutboxItem, why: &str) {
        let key = item.id.to_string();
        // Only messages nobody else tracks (tool, proactive) are reported back.
        if item.payload.get("updateId").is_none() {
            let _ = self.data.kv_set(KV, KV_FAILED, &key, why).await;
        }
        let _ = self.data.kv_del(KV, KV_PROGRESS, &key).await;
        if let Err(e) = self.state.outbox_done(item.id).await {
            tracing::warn!(id = item.id, error = %e, "cannot remove a failed item from the outbox");
        }
        settled();
    }

    async fn deliver(&self, id: i64, out: &OutItem) -> Result<(), Failure> {
        match out {
            OutItem::Text {
                chat_id,
                thread_id,
                chunks,
                edit_message_id,
                reply_to,
                ..
            } => {
                let key = id.to_string();
                let done: usize = match self.data.kv_get(KV, KV_PROGRESS, &key).await {
                    Ok(v) => v.and_then(|s| s.parse().ok()).unwrap_or(0),
                    Err(e) => {
                        return Err(Failure::Api(ApiError::Transport {
                            method: "outbox".into(),
                            message: format!("cannot read the progress of the message: {e}"),
                        }))
                    }
                };
                for (i, chunk) in chunks.iter().enumerate().skip(done) {
                    match (i, edit_message_id) {
                        (0, Some(m)) => self.edit(*chat_id, *thread_id, *m, chunk).await?,
                        (0, None) => self.send(*chat_id, *thread_id, chunk, *reply_to).await?,
                        _ => self.send(*chat_id, *thread_id, chunk, None).await?,
                    }
                    if i + 1 < chunks.len() {
                        if let Err(e) = self
                            .data
                            .kv_set(KV, KV_PROGRESS, &key, &(i + 1).to_string())
                            .await
                        {
                            tracing::warn!(id, error = %e, "cannot record the progress of a long message");
                        }
                    }
                }
                Ok(())
            }
            OutItem::Photo {
                chat_id,
                thread_id,
                file_name,
                mime,
                data,
                caption,
            } => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| Failure::Invalid(format!("the photo data is damaged: {e}")))?;
                let upload = Upload {
                    field: "photo".into(),
                    file_name: file_name.clone(),
                    mime: mime.clone(),
                    data: bytes,
                };
                self.api
                    .send_photo(*chat_id, *thread_id, &upload, caption.as_deref())
                    .await
                    .map(|_| ())
                    .map_err(Failure::Api)
            }
        }
    }

    /// Send one chunk as HTML; as plain text if Telegram refuses the HTML.
    async fn send(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        chunk: &Chunk,
        reply_to: Option<i64>,
    ) -> Result<(), Failure> {
        match self
            .api
            .send_message(chat_id, thread_id, &chunk.html, true, reply_to)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_parse_error() => {
                tracing::warn!(chat = chat_id, error = %e, "Telegram refused the HTML; sending plain text");
                for (i, piece) in split_plain(&chunk.plain, MAX_MESSAGE_LEN)
                    .iter()
                    .enumerate()
                {
                    self.api
                        .send_message(
                            chat_id,
                            thread_id,
                            piece,
                            false,
                            reply_to.filter(|_| i == 0),
                        )
                        .await
                        .map_err(Failure::Api)?;
                }
                Ok(())
            }
            Err(e) => Err(Failure::Api(e)),
        }
    }

    /// Replace a preview with the first chunk; a new message when the preview is gone.
    async fn edit(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        message_id: i64,
        chunk: &Chunk,
    ) -> Result<(), Failure> {
        match self
            .api
            .edit_message_text(chat_id, message_id, &chunk.html, true)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.is_parse_error() => {
                tracing::warn!(chat = chat_id, error = %e, "Telegram refused the HTML; using plain text");
                let pieces = split_plain(&chunk.plain, MAX_MESSAGE_LEN);
                let mut rest = pieces.iter();
                if let Some(first) = rest.next() {
                    match self
                        .api
                        .edit_message_text(chat_id, message_id, first, false)
                        .await
                    {
                        Ok(()) => {}
                        Err(e) if e.is_edit_impossible() => {
                            self.api
                                .send_message(chat_id, thread_id, first, false, None)
                                .await
                                .map_err(Failure::Api)?;
                        }
                        Err(e) => return Err(Failure::Api(e)),
                    }
                }
                for piece in rest {
                    self.api
                        .send_message(chat_id, thread_id, piece, false, None)
                        .await
                        .map_err(Failure::Api)?;
                }
                Ok(())
            }
            Err(e) if e.is_edit_impossible() => {
                tracing::info!(
                    chat = chat_id,
                    "the preview message is gone; sending the answer as a new message"
                );
                self.send(chat_id, thread_id, chunk, None).await
            }
            Err(e) => Err(Failure::Api(e)),
        }
    }
}

/// Forget the failure records of an earlier run (nobody waits for them any more).
pub(crate) async fn clear_failures(data: &dyn PluginData) {
    if let Ok(keys) = data.kv_list(KV, KV_FAILED, "").await {
        for k in keys {
            let _ = data.kv_del(KV, KV_FAILED, &k).await;
        }
    }
}

/// Exponential backoff from 1 s, capped at [`MAX_BACKOFF`].
fn backoff(attempts: u32) -> Duration {
    let secs = 1u64 << attempts.saturating_sub(1).min(16);
    Duration::from_secs(secs).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(29), MAX_BACKOFF);
    }

    #[test]
    fn items_round_trip() {
        let item = OutItem::Text {
            chat_id: -100,
            thread_id: Some(7),
            chunks: vec![Chunk {
                html: "<b>x</b>".into(),
                plain: "**x**".into(),
            }],
            edit_message_id: Some(3),
            reply_to: None,
            update_id: Some(9),
        };
        let v = serde_json::to_value(&item).unwrap();
        assert_eq!(v["kind"], "text");
        assert_eq!(v["chatId"], -100);
        assert_eq!(serde_json::from_value::<OutItem>(v).unwrap(), item);
    }
}
