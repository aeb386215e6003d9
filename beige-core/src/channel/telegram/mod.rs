//! The Telegram channel: a bot that lets allowed users talk to agents, over the Bot API
//! with long polling.
//!
//! Owns the bot's side of the conversation — polling, who may talk, which agent answers
//! in which chat, session keys (`telegram:<chatId>` or `telegram:<chatId>:<threadId>` in
//! forum topics), commands, streaming replies, formatting, delivery and the `telegram`
//! plugin tool ([`TelegramPlugin`]). It reaches agents only through the [`Gateway`](crate::Gateway)
//! trait, and it writes to the store only its own records: the offset, the dedup window,
//! its inbox and outbox ([`ChannelState`]), and its plugin data (`telegram`,
//! [`PluginData`]); of the sessions ([`SessionStore`]) it only reads a chat's current one
//! and its messages. It never calls a model or a sandbox itself.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | `plugins.telegram.config` and its errors |
//! | `api` | the Bot API client (token redaction) and its errors ([`ApiError`]) |
//! | [`format`](mod@format) | Markdown → Telegram HTML, 4096-character splitting |
//! | `poll` | long polling, the durable inbox, the watchdog |
//! | `outbox` | queued replies: retry, backoff, `retry_after` |
//! | `commands` | `/start /new /status /verbose /streaming /model /stop /help` |
//! | `worker` | one prompt: typing, streamed preview, verbose tool lines, the answer |
//! | `tool` | the `telegram` plugin tool |
//! | `approvals` | approval requests as messages with buttons, presses, unattended reports |
//!
//! # Crash safety: every update handled once, every reply sent once
//!
//! Updates travel through the store in three durable steps, so that a `SIGKILL` at any
//! point neither loses nor repeats one:
//!
//! 1. **Accepted** (`poll`): the raw update is written to an inbox (the store's outbox
//!    table under channel `telegram.inbox`), marked seen in the dedup window, and only
//!    then the offset is persisted past it. Polling never waits for anything else.
//! 2. **Handled** (`worker`/`commands`): before a prompt starts, a marker records the
//!    session's message count (plugin data `telegram`/`inflight`). The prompt runs in
//!    its own task per chat; the channel's I/O never waits on a model call.
//! 3. **Finished**: the whole reply (all its chunks) is queued as *one* outbox item
//!    carrying the update id, and then the inbox entry is removed. While the two writes
//!    happen the outbox sender leaves that reply alone.
//!
//! At start, [`TelegramChannel::run`] recovers: every inbox entry is marked seen and the
//! offset moved past it; an entry whose reply is already queued is finished (removed);
//! every other entry is handled again — but if its marker shows that the gateway
//! already stored the completed turn, the stored answer is queued without calling the
//! model again. A turn the gateway closed as cancelled counts as not done. The reply
//! itself is delivered from the outbox, chunk by chunk, with progress recorded after each
//! Bot API call. The one window that cannot be closed is the Bot API call itself: if the
//! process dies after Telegram accepted a message but before the store recorded it, that
//! one message is sent again (Telegram has no idempotency key).
//!
//! Streamed previews (`sendMessage` then throttled `editMessageText`), `typing…` and
//! verbose tool lines are sent directly and are best effort; the final answer replaces
//! the preview through the outbox.

mod api;
mod approvals;
mod commands;
pub mod config;
pub mod format;
mod outbox;
mod poll;
pub mod tool;
mod worker;

pub use api::ApiError;
pub use config::{is_builtin, AgentMapping, ChannelDefaults, TelegramConfig};
pub use outbox::CHANNEL;
pub use poll::INBOX;
pub use tool::TelegramPlugin;

/// The outbox payload of one unprompted text message to `chat_id` (a schedule's result
/// or report), for [`crate::store::ChannelState::enqueue_outbox`] on [`CHANNEL`]; the
/// text is Markdown, split and rendered like an answer.
pub(crate) fn outbox_text(chat_id: i64, text: &str) -> serde_json::Value {
    let chunks = format::render_chunks(text, format::MAX_MESSAGE_LEN);
    serde_json::to_value(outbox::OutItem::text(chat_id, None, chunks)).unwrap_or_default()
}

/// Wake the outbox sender after items were queued outside it.
pub(crate) fn wake_outbox() {
    outbox::wake();
}

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use self::api::{BotApi, Update};
use self::format::{render_chunks, MAX_MESSAGE_LEN};
use self::outbox::{OutItem, KV};
use self::poll::{Inbound, PollHealth, Poller};
use super::{Channel, ChannelContext, ChannelError};
use crate::api::{GatewayError, GatewayFull};
use crate::store::{ChannelState, PluginData, SessionStore, StoreError, Stores};

/// Errors of the Telegram channel and plugin.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelegramError {
    /// `plugins.telegram.config<path>` is wrong.
    #[error("plugins.telegram.config{path}: {message}")]
    Config {
        /// Where in `plugins.telegram.config` the problem is, as a path such as
        /// `.agentMapping.default` (empty for the config as a whole).
        path: String,
        /// What is wrong there.
        message: String,
    },
    /// A Bot API call failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The channel's state could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The gateway refused or failed a request.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
}

impl From<TelegramError> for ChannelError {
    fn from(e: TelegramError) -> Self {
        ChannelError::Failed {
            channel: CHANNEL.to_string(),
            message: e.to_string(),
        }
    }
}

/// The session key of a chat, or of a forum topic in it.
pub fn session_key(chat_id: i64, thread_id: Option<i64>) -> String {
    match thread_id {
        Some(t) => format!("telegram:{chat_id}:{t}"),
        None => format!("telegram:{chat_id}"),
    }
}

/// Spawn `fut` so that it ends when `token` fires.
pub(crate) fn spawn_until<F>(token: &CancellationToken, fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let token = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = token.cancelled() => {}
            _ = fut => {}
        }
    });
}

/// One message to answer, in the order it arrived in its chat.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub inbox_id: i64,
    pub update_id: i64,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub message_id: i64,
    /// The Telegram user who sent the message (checked against `allowedUsers`).
    pub user_id: i64,
    pub text: String,
    pub key: String,
    pub agent: String,
    /// The chat's `/stop` count when the job was queued.
    pub epoch: u64,
}

impl Job {
    /// Reply to the user's message in groups (in a private chat it is noise).
    pub(crate) fn reply_to(&self) -> Option<i64> {
        (self.chat_id < 0).then_some(self.message_id)
    }
}

#[derive(Debug)]
struct Queue {
    tx: mpsc::UnboundedSender<Job>,
    /// Incremented by `/stop`: queued jobs of an older epoch are dropped.
    epoch: u64,
    /// Jobs queued or running.
    pending: usize,
}

/// What the tasks of one run share.
pub(crate) struct Ctx {
    pub cfg: TelegramConfig,
    pub api: BotApi,
    /// The inbox, the outbox, the offset and the dedup window.
    pub state: Arc<dyn ChannelState>,
    /// The channel's own records (plugin data `telegram`): prompts in flight, progress
    /// and failures of outgoing messages.
    pub data: Arc<dyn PluginData>,
    /// Read only: the current session of a key and its stored messages (the answer of a
    /// turn that completed before a crash, `/status`). Sessions change only through the
    /// gateway (`/new`, `/resume`, prompts).
    pub sessions: Arc<dyn SessionStore>,
    pub gateway: Arc<dyn GatewayFull>,
    pub token: CancellationToken,
    pub finishing: Arc<Mutex<HashSet<i64>>>,
    queues: Mutex<HashMap<String, Queue>>,
    /// Approval requests shown in a chat: id → (chat, message), to edit when decided.
    pub approval_messages: Mutex<HashMap<String, (i64, i64)>>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}

impl Ctx {
    /// Finish an update: queue its reply (if any) and remove it from the inbox.
    pub(crate) async fn finish(&self, update_id: i64, inbox_id: i64, reply: Option<OutItem>) {
        self.finishing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(update_id);
        let mut ok = true;
        if let Some(item) = reply {
            if let Err(e) = outbox::enqueue(&*self.state, &item).await {
                tracing::error!(update_id, error = %e, "cannot queue a Telegram reply; the update is handled again at the next start");
                ok = false;
            }
        }
        if ok {
            if let Err(e) = self.state.outbox_done(inbox_id).await {
                tracing::warn!(update_id, error = %e, "cannot remove a finished update from the inbox");
            }
            let _ = self
                .data
                .kv_del(KV, worker::KV_INFLIGHT, &update_id.to_string())
                .await;
        }
        self.finishing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&update_id);
        outbox::wake();
    }

    /// Queue a job behind the earlier messages of its session.
    fn enqueue_job(self: &Arc<Self>, mut job: Job) {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if queues.get(&job.key).is_none_or(|q| q.tx.is_closed()) {
            let (tx, rx) = mpsc::unbounded_channel();
            spawn_until(&self.token, worker::run_queue(self.clone(), rx));
            queues.insert(
                job.key.clone(),
                Queue {
                    tx,
                    epoch: 0,
                    pending: 0,
                },
            );
        }
        let Some(q) = queues.get_mut(&job.key) else {
            return;
        };
        job.epoch = q.epoch;
        q.pending += 1;
        if q.tx.send(job).is_err() {
            q.pending = q.pending.saturating_sub(1);
        }
    }

    /// Whether a job was stopped by `/stop` after it was queued.
    pub(crate) fn is_stale(&self, job: &Job) -> bool {
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&job.key)
            .is_some_and(|q| q.epoch != job.epoch)
    }

    pub(crate) fn job_done(&self, key: &str) {
        if let Some(q) = self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(key)
        {
            q.pending = q.pending.saturating_sub(1);
        }
    }

    /// `/stop`: drop the session's queued jobs; returns how many were queued or running.
    pub(crate) fn stop_queue(&self, key: &str) -> usize {
        match self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(key)
        {
            Some(q) => {
                q.epoch += 1;
                q.pending
            }
            None => 0,
        }
    }

    /// Route one accepted update.
    async fn dispatch(self: &Arc<Self>, inbound: Inbound) {
        let Inbound {
            inbox_id,
            update_id,
            update,
        } = inbound;
        let update: Update = match serde_json::from_value(update) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(update_id, error = %e, "ignoring an unreadable Telegram update");
                self.finish(update_id, inbox_id, None).await;
                return;
            }
        };
        if let Some(q) = update.callback_query {
            // A button press: decided at once (a press is not a prompt, and pressing it
            // again after a crash is refused as already decided).
            self.finish(update_id, inbox_id, None).await;
            let ctx = self.clone();
            spawn_until(&self.token, async move { ctx.on_callback(q).await });
            return;
        }
        let Some(msg) = update.message else {
            self.finish(update_id, inbox_id, None).await;
            return;
        };
        let (Some(text), Some(from)) = (msg.text.clone(), msg.from.clone()) else {
            tracing::debug!(update_id, "ignoring a Telegram message without text");
            self.finish(update_id, inbox_id, None).await;
            return;
        };
        let chat_id = msg.chat.id;
        let thread_id = msg.topic();
        if !self.cfg.is_allowed(from.id) {
            tracing::warn!(
                user = from.id,
                username = from.username.as_deref().unwrap_or(""),
                chat = chat_id,
                "refused a Telegram message from a user not in allowedUsers"
            );
            let text = format!(
                "⛔ Unauthorized. Your Telegram user id is {} — ask the owner of this bot to add it to allowedUsers.",
                from.id
            );
            let mut item = OutItem::text(chat_id, thread_id, render_chunks(&text, MAX_MESSAGE_LEN));
            if let OutItem::Text {
                update_id: u,
                reply_to,
                ..
            } = &mut item
            {
                *u = Some(update_id);
                *reply_to = (chat_id < 0).then_some(msg.message_id);
            }
            self.finish(update_id, inbox_id, Some(item)).await;
            return;
        }
        let job = Job {
            inbox_id,
            update_id,
            chat_id,
            thread_id,
            message_id: msg.message_id,
            user_id: from.id,
            key: session_key(chat_id, thread_id),
            agent: self.cfg.agent_for(chat_id, from.id).to_string(),
            text,
            epoch: 0,
        };
        match commands::parse(&job.text) {
            Some(cmd) => {
                let ctx = self.clone();
                spawn_until(&self.token, async move {
                    commands::run(&ctx, job, cmd).await;
                });
            }
            None => self.enqueue_job(job),
        }
    }
}

/// The Telegram channel. Create it with [`TelegramChannel::new`] (or
/// [`TelegramChannel::from_config`]) and serve it with [`Channel::run`].
pub struct TelegramChannel {
    config: TelegramConfig,
    /// Where its records go: given to `new`, or the gateway's from the run's context.
    stores: std::sync::OnceLock<Stores>,
    api: BotApi,
    health: Arc<PollHealth>,
}

impl std::fmt::Debug for TelegramChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramChannel")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl TelegramChannel {
    /// A channel with this config, keeping its records in `store` (the gateway's: one
    /// value, or [`Stores`]). It uses the channel state and plugin data, and reads the
    /// current session of a chat; it never changes sessions itself.
    pub fn new(config: TelegramConfig, store: impl Into<Stores>) -> Result<Self, ChannelError> {
        let channel = Self::with_gateway_store(config);
        let _ = channel.stores.set(store.into());
        Ok(channel)
    }

    /// A channel that keeps its records in the store of the gateway that runs it (the
    /// [`ChannelContext`]'s): what a channel registered with `GatewayBuilder::channel`
    /// wants, so that the gateway and the channel share one store handle.
    pub fn with_gateway_store(config: TelegramConfig) -> Self {
        let api = BotApi::new(&config.api_base_url, &config.token);
        Self {
            config,
            stores: std::sync::OnceLock::new(),
            api,
            health: Arc::default(),
        }
    }

    /// The channel configured under `plugins.telegram` (built-in, no `path`), or `None`;
    /// it keeps its records in the store of the gateway that runs it.
    pub fn from_config(config: &crate::Config) -> Result<Option<Self>, ChannelError> {
        Ok(TelegramConfig::from_config(config)?.map(Self::with_gateway_store))
    }

    /// The stores given to `new`, else those of `ctx` (remembered for `send`).
    fn stores_for(&self, ctx: &ChannelContext) -> Result<Stores, ChannelError> {
        if let Some(s) = self.stores.get() {
            return Ok(s.clone());
        }
        let given = ctx.stores.clone().ok_or_else(|| ChannelError::Failed {
            channel: CHANNEL.into(),
            message: "no store to keep the channel's records in: create it with TelegramChannel::new(config, store), or run it from LocalGateway::serve".into(),
        })?;
        Ok(self.stores.get_or_init(|| given).clone())
    }

    /// The configuration the channel was created with.
    pub fn config(&self) -> &TelegramConfig {
        &self.config
    }

    /// How often the watchdog restarted polling since the channel was created.
    pub fn polling_restarts(&self) -> u64 {
        self.health.restarts.load(Ordering::SeqCst)
    }

    /// Successful `getUpdates` answers since the channel was created.
    pub fn polls(&self) -> u64 {
        self.health.polls.load(Ordering::SeqCst)
    }

    async fn check_agents(&self, gateway: &dyn GatewayFull) -> Result<(), ChannelError> {
        let known: Vec<String> = gateway
            .agents()
            .await
            .map_err(TelegramError::from)?
            .into_iter()
            .map(|a| a.name)
            .collect();
        for agent in self.config.agents() {
            if !known.iter().any(|k| k == agent) {
                let field = if agent == self.config.agent_mapping.default {
                    ".agentMapping.default".to_string()
                } else {
                    ".agentMapping".to_string()
                };
                return Err(TelegramError::Config {
                    path: field,
                    message: format!(
                        "names agent '{agent}', which is not configured; configured agents: {}",
                        known.join(", ")
                    ),
                }
                .into());
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Channel for TelegramChannel {
    fn name(&self) -> &str {
        CHANNEL
    }

    fn plugin(&self) -> Option<Arc<dyn crate::plugin::Plugin>> {
        Some(Arc::new(TelegramPlugin::new()))
    }

    async fn run(&self, ctx: ChannelContext) -> Result<(), ChannelError> {
        let stores = self.stores_for(&ctx)?;
        let ChannelContext {
            gateway, shutdown, ..
        } = ctx;
        // Everything this run spawns stops when the run ends, however it ends.
        let token = shutdown.child_token();
        let _stop_all = token.clone().drop_guard();

        self.check_agents(&*gateway).await?;
        match self.api.set_my_commands(&commands::bot_commands()).await {
            Ok(()) => {}
            Err(e) if e.is_auth() => {
                return Err(ChannelError::Failed {
                    channel: CHANNEL.into(),
                    message: format!(
                        "the bot token was rejected ({e}); check plugins.telegram.config.token (BotFather shows it with /token)"
                    ),
                })
            }
            Err(e) => tracing::warn!(error = %e, "could not register the bot's commands with Telegram"),
        }
        let recovered = poll::recover(&*stores.channels)
            .await
            .map_err(TelegramError::from)?;
        let live: HashSet<String> = recovered.iter().map(|r| r.update_id.to_string()).collect();
        if let Ok(markers) = stores.data.kv_list(KV, worker::KV_INFLIGHT, "").await {
            for m in markers.into_iter().filter(|m| !live.contains(m)) {
                let _ = stores.data.kv_del(KV, worker::KV_INFLIGHT, &m).await;
            }
        }

        let finishing = Arc::new(Mutex::new(HashSet::new()));
        let ctx = Arc::new(Ctx {
            cfg: self.config.clone(),
            api: self.api.clone(),
            state: stores.channels.clone(),
            data: stores.data.clone(),
            sessions: stores.sessions.clone(),
            gateway,
            token: token.clone(),
            finishing: finishing.clone(),
            queues: Mutex::default(),
            approval_messages: Mutex::default(),
        });
        // Subscribe before the first update is polled, so no report raised from then on is
        // missed by a follower task that has not been scheduled yet.
        match ctx.gateway.approval_events().await {
            Ok(events) => spawn_until(&token, approvals::follow(ctx.clone(), events)),
            Err(e) => {
                tracing::debug!(error = %e, "this gateway has no approval events; Telegram shows only its own")
            }
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        for r in recovered {
            let _ = tx.send(r);
        }
        outbox::clear_failures(&*stores.data).await;
        let sender = outbox::Sender {
            state: stores.channels.clone(),
            data: stores.data.clone(),
            api: self.api.clone(),
            finishing,
            sent: Arc::default(),
        };
        spawn_until(&token, sender.run(token.clone()));
        let poller = Poller {
            api: self.api.renewed(),
            state: stores.channels.clone(),
            wait: self.config.poll_timeout,
            grace: self.config.watchdog_grace,
            tx,
            health: self.health.clone(),
        };
        spawn_until(&token, poll::supervise(poller, token.clone()));
        tracing::info!(
            allowed_users = self.config.allowed_users.len(),
            default_agent = %self.config.agent_mapping.default,
            "Telegram channel started"
        );
        loop {
            tokio::select! {
                _ = token.cancelled() => break,
                next = rx.recv() => match next {
                    Some(inbound) => ctx.dispatch(inbound).await,
                    None => break,
                },
            }
        }
        tracing::info!("Telegram channel stopped");
        Ok(())
    }

    async fn send(
        &self,
        chat_id: &str,
        thread_id: Option<&str>,
        text: &str,
    ) -> Result<(), ChannelError> {
        let bad = |what: &str, v: &str| ChannelError::Failed {
            channel: CHANNEL.into(),
            message: format!("{what} must be a numeric Telegram id, not {v:?}"),
        };
        let chat: i64 = chat_id
            .trim()
            .parse()
            .map_err(|_| bad("chat id", chat_id))?;
        let thread: Option<i64> = match thread_id {
            Some(t) => Some(t.trim().parse().map_err(|_| bad("thread id", t))?),
            None => None,
        };
        let chunks = render_chunks(text, MAX_MESSAGE_LEN);
        if chunks.is_empty() {
            return Err(ChannelError::Failed {
                channel: CHANNEL.into(),
                message: "cannot send an empty message".into(),
            });
        }
        let Some(stores) = self.stores.get() else {
            return Err(ChannelError::Failed {
                channel: CHANNEL.into(),
                message: "the channel has not run yet, so it has no store to queue the message in"
                    .into(),
            });
        };
        outbox::enqueue(&*stores.channels, &OutItem::text(chat, thread, chunks))
            .await
            .map_err(TelegramError::from)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_keys() {
        assert_eq!(session_key(42, None), "telegram:42");
        assert_eq!(session_key(-100, Some(7)), "telegram:-100:7");
    }
}
