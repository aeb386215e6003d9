//! One prompt from a Telegram message to its queued answer.
//!
//! Each session key has a queue served by its own task, so messages of one chat are
//! answered in order while chats run in parallel, and the polling and dispatching never
//! wait for a model. For one message: recovery check (see the crash-safety design in
//! [`super`]), a marker with the session's message count, `typing…` every few seconds,
//! the prompt through [`Gateway::prompt`](crate::api::Gateway::prompt), a streamed
//! plain-text preview (`sendMessage`, then `editMessageText` at most about once a
//! second), verbose tool lines, and finally the whole answer as one outbox item that
//! replaces the preview (split at 4096 characters, Markdown rendered as HTML).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::format::{render_chunks, tg_len, MAX_MESSAGE_LEN};
use super::outbox::{OutItem, KV};
use super::{Ctx, Job, CHANNEL};
use crate::api::{hint_for, AgentEvent, AgentEventStream, PromptRequest};
use crate::llm::{ErrorKind, Role};
use crate::store::StoredMessage;

/// Plugin-data scope of the per-update markers.
pub(crate) const KV_INFLIGHT: &str = "inflight";
/// Least time between two preview updates.
const PREVIEW_EVERY: Duration = Duration::from_millis(1000);
/// How often `typing…` is renewed (Telegram shows it for about five seconds).
const TYPING_EVERY: Duration = Duration::from_secs(4);
/// Longest tool line, in characters.
const TOOL_LINE_MAX: usize = 80;

/// Serve one session's queue.
pub(crate) async fn run_queue(ctx: Arc<Ctx>, mut rx: mpsc::UnboundedReceiver<Job>) {
    while let Some(job) = rx.recv().await {
        let key = job.key.clone();
        if ctx.is_stale(&job) {
            ctx.finish(job.update_id, job.inbox_id, None).await;
        } else {
            run_job(&ctx, job).await;
        }
        ctx.job_done(&key);
    }
}

/// The answer of a turn the gateway already stored, if the messages after the marker
/// are `text` from the user followed by a completed answer.
pub(crate) fn completed_answer(after: &[&StoredMessage], text: &str) -> Option<String> {
    let first = after.first()?;
    if first.message.role != Role::User || first.message.text() != text {
        return None;
    }
    let last = after
        .iter()
        .rev()
        .find(|m| m.message.role == Role::Assistant)?;
    let answer = last.message.text();
    if answer.starts_with("[cancelled") || answer.starts_with("[the answer was interrupted") {
        return None;
    }
    Some(answer)
}

/// The stored answer when this update's turn completed before a crash.
async fn recovered_answer(ctx: &Ctx, job: &Job) -> Option<String> {
    let marker = ctx
        .data
        .kv_get(KV, KV_INFLIGHT, &job.update_id.to_string())
        .await
        .ok()
        .flatten()?;
    let marker: Value = serde_json::from_str(&marker).ok()?;
    let session = ctx
        .sessions
        .current_session(&job.key)
        .await
        .ok()
        .flatten()?;
    let skip = if marker.get("sessionId").and_then(Value::as_str) == Some(session.id.as_str()) {
        marker
            .get("count")
            .and_then(Value::as_u64)
            .and_then(|c| usize::try_from(c).ok())
            .unwrap_or(0)
    } else {
        0
    };
    let messages = ctx.sessions.messages(&session.id, true).await.ok()?;
    let plain: Vec<&StoredMessage> = messages.iter().filter(|m| !m.summary).collect();
    let answer = completed_answer(plain.get(skip..)?, &job.text)?;
    tracing::info!(
        update_id = job.update_id,
        "the turn of this Telegram update completed before the restart; sending its stored answer"
    );
    Some(answer)
}

/// How a prompt ended.
#[derive(Debug)]
enum Outcome {
    Answer(String),
    Failed(String),
    Cancelled,
}

/// The text a user sees when a prompt failed: what happened and what to do.
pub(crate) fn error_text(message: &str, kind: Option<ErrorKind>, hint: Option<&str>) -> String {
    let head = match kind {
        Some(ErrorKind::RateLimit) => "⏳ The model is rate-limited right now.",
        Some(ErrorKind::Overloaded) => "🔥 The model's provider is overloaded right now.",
        Some(ErrorKind::ContextOverflow) => {
            "📚 This conversation no longer fits into the model's context."
        }
        Some(ErrorKind::Auth) => "🔑 The model provider rejected the gateway's API key.",
        Some(ErrorKind::Timeout) => "⌛ The model stopped answering.",
        _ => "⚠️ The agent could not answer.",
    };
    let hint = hint
        .map(str::to_string)
        .or_else(|| kind.and_then(hint_for).map(str::to_string));
    let details: String = message.chars().take(300).collect();
    let mut out = head.to_string();
    if let Some(h) = hint {
        out.push('\n');
        out.push_str(&h);
    }
    out.push_str("\n\nDetails: ");
    out.push_str(&details);
    out
}

/// `🔧 exec: ls -la` — a short line for a tool call.
pub(crate) fn tool_line(name: &str, args: &Value) -> String {
    let s = |k: &str| args.get(k).and_then(Value::as_str).unwrap_or("");
    let body = match name {
        "exec" => format!("exec: {}", s("command")),
        "read" => format!("read: {}", s("path")),
        "write" => format!("write: {} ({} bytes)", s("path"), s("content").len()),
        "patch" => format!("patch: {}", s("path")),
        other => {
            let args = match args {
                Value::Object(m) => m
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => format!("{k}={s}"),
                        v => format!("{k}={v}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
                Value::Null => String::new(),
                v => v.to_string(),
            };
            format!("{other}: {args}")
        }
    };
    let body = body.replace('\n', " ");
    let short: String = if body.chars().count() > TOOL_LINE_MAX {
        let mut s: String = body.chars().take(TOOL_LINE_MAX - 1).collect();
        s.push('…');
        s
    } else {
        body
    };
    format!("🔧 {short}")
}

/// The preview of a partial answer: the text, or its end when it is too long.
fn preview_of(text: &str) -> String {
    let t = text.trim();
    if tg_len(t) <= MAX_MESSAGE_LEN {
        return t.to_string();
    }
    let mut tail: Vec<char> = Vec::new();
    let mut units = 1; // the ellipsis
    for c in t.chars().rev() {
        units += c.len_utf16();
        if units > MAX_MESSAGE_LEN {
            break;
        }
        tail.push(c);
    }
    let mut out = String::from("…");
    out.extend(tail.into_iter().rev());
    out
}

/// Renews `typing…` until dropped.
struct Typing(#[allow(dead_code)] tokio_util::sync::DropGuard);

fn start_typing(ctx: &Arc<Ctx>, job: &Job) -> Typing {
    let token = ctx.token.child_token();
    let api = ctx.api.clone();
    let (chat, thread) = (job.chat_id, job.thread_id);
    let t = token.clone();
    super::spawn_until(&t, async move {
        loop {
            if let Err(e) = api.send_chat_action(chat, thread, "typing").await {
                tracing::debug!(chat, error = %e, "sendChatAction failed");
            }
            tokio::time::sleep(TYPING_EVERY).await;
        }
    });
    Typing(token.drop_guard())
}

/// Streams one prompt into the chat.
struct Streamer<'a> {
    ctx: &'a Ctx,
    job: &'a Job,
    streaming: bool,
    verbose: bool,
    /// Text of the current turn.
    buffer: String,
    /// The preview message and what it shows.
    preview: Option<(i64, String)>,
    /// No preview update before this instant.
    next_update: Instant,
}

impl Streamer<'_> {
    async fn drive(&mut self, mut stream: AgentEventStream) -> Outcome {
        loop {
            let dirty = self.streaming && self.wanted_preview().is_some();
            let wake = if dirty {
                self.next_update
            } else {
                Instant::now() + Duration::from_secs(3600)
            };
            tokio::select! {
                event = stream.next() => {
                    let Some(event) = event else {
                        return Outcome::Failed(error_text("the prompt ended without an answer", None, None));
                    };
                    match event {
                        AgentEvent::TurnStarted { turn, .. } if turn > 1 => {
                            self.close_preview().await;
                            self.buffer.clear();
                        }
                        AgentEvent::TextDelta { text } => {
                            self.buffer.push_str(&text);
                            if self.streaming && Instant::now() >= self.next_update {
                                self.update_preview().await;
                            }
                        }
                        AgentEvent::ToolCallStarted { name, args, .. } if self.verbose => {
                            self.direct(&tool_line(&name, &args)).await;
                        }
                        AgentEvent::ModelSwitched { to, reason, .. } if self.verbose => {
                            self.direct(&format!("↪️ switched to {to} ({reason})")).await;
                        }
                        AgentEvent::Compacted { summarized_messages } => {
                            self.direct(&format!(
                                "🗜️ The conversation was compacted ({summarized_messages} earlier messages summarised)."
                            ))
                            .await;
                        }
                        AgentEvent::ApprovalRequest { approval } => {
                            self.close_preview().await;
                            self.ctx.show_approval(self.job.chat_id, self.job.thread_id, &approval).await;
                        }
                        AgentEvent::Done { response, .. } => return Outcome::Answer(response),
                        AgentEvent::Blocked { reason } => {
                            return Outcome::Failed(format!("🚫 This message was blocked: {reason}"))
                        }
                        AgentEvent::Error { message, kind, hint } => {
                            if kind.is_none() && message.starts_with("cancelled") {
                                return Outcome::Cancelled;
                            }
                            return Outcome::Failed(error_text(&message, kind, hint.as_deref()));
                        }
                        _ => {}
                    }
                }
                _ = tokio::time::sleep_until(wake), if dirty => {
                    self.update_preview().await;
                }
            }
        }
    }

    /// The preview text to show now, when it differs from what is shown.
    fn wanted_preview(&self) -> Option<String> {
        let p = preview_of(&self.buffer);
        if p.is_empty() || self.preview.as_ref().is_some_and(|(_, shown)| *shown == p) {
            return None;
        }
        Some(p)
    }

    async fn update_preview(&mut self) {
        let Some(text) = self.wanted_preview() else {
            return;
        };
        let api = &self.ctx.api;
        let result = match &self.preview {
            None => api
                .send_message(
                    self.job.chat_id,
                    self.job.thread_id,
                    &text,
                    false,
                    self.job.reply_to(),
                )
                .await
                .map(Some),
            Some((id, _)) => api
                .edit_message_text(self.job.chat_id, *id, &text, false)
                .await
                .map(|()| None),
        };
        let mut wait = PREVIEW_EVERY;
        match result {
            Ok(Some(id)) => self.preview = Some((id, text)),
            Ok(None) => {
                if let Some((_, shown)) = &mut self.preview {
                    *shown = text;
                }
            }
            Err(e) => {
                if let Some(s) = e.retry_after() {
                    wait = wait.max(Duration::from_secs(s));
                }
                tracing::debug!(chat = self.job.chat_id, error = %e, "preview update failed");
            }
        }
        self.next_update = Instant::now() + wait;
    }

    /// A new turn begins: bring the preview up to date and start a new one later.
    async fn close_preview(&mut self) {
        if self.preview.is_some() && self.wanted_preview().is_some() {
            self.update_preview().await;
        }
        self.preview = None;
    }

    /// A best-effort message outside the outbox (tool lines, notices).
    async fn direct(&mut self, text: &str) {
        if let Err(e) = self
            .ctx
            .api
            .send_message(self.job.chat_id, self.job.thread_id, text, false, None)
            .await
        {
            tracing::debug!(chat = self.job.chat_id, error = %e, "could not send a notice");
        }
    }
}

/// A text reply to `job`, rendered from Markdown.
fn reply(job: &Job, markdown: &str, edit: Option<i64>) -> OutItem {
    let mut chunks = render_chunks(markdown, MAX_MESSAGE_LEN);
    if chunks.is_empty() {
        chunks = render_chunks("(empty response)", MAX_MESSAGE_LEN);
    }
    OutItem::Text {
        chat_id: job.chat_id,
        thread_id: job.thread_id,
        chunks,
        edit_message_id: edit,
        reply_to: if edit.is_none() { job.reply_to() } else { None },
        update_id: Some(job.update_id),
    }
}

/// Answer one message.
async fn run_job(ctx: &Arc<Ctx>, job: Job) {
    if let Some(answer) = recovered_answer(ctx, &job).await {
        ctx.finish(
            job.update_id,
            job.inbox_id,
            Some(reply(&job, &answer, None)),
        )
        .await;
        return;
    }
    let before = ctx.sessions.current_session(&job.key).await.ok().flatten();
    let marker = json!({
        "sessionId": before.as_ref().map(|s| s.id.clone()),
        "count": before.as_ref().map(|s| s.message_count).unwrap_or(0),
    });
    if let Err(e) = ctx
        .data
        .kv_set(
            KV,
            KV_INFLIGHT,
            &job.update_id.to_string(),
            &marker.to_string(),
        )
        .await
    {
        tracing::warn!(update_id = job.update_id, error = %e, "cannot record the start of a prompt");
    }
    let settings = ctx.gateway.settings(&job.key).await.unwrap_or_default();
    let verbose = settings.verbose.unwrap_or(ctx.cfg.defaults.verbose);
    let streaming = settings.streaming.unwrap_or(ctx.cfg.defaults.streaming);
    let _typing = start_typing(ctx, &job);

    let mut request = PromptRequest::new(job.agent.clone(), job.key.clone(), job.text.clone());
    request.channel = Some(CHANNEL.to_string());
    request.chat_id = Some(job.chat_id.to_string());
    request.thread_id = job.thread_id.map(|t| t.to_string());
    // The sender as Telegram told the poller (never read from the message text).
    request.principal = crate::api::Principal::user(CHANNEL, job.user_id.to_string());
    // A person is in the chat: approvals are asked there.
    request.approvals = beige_client::approvals::ApprovalMode::Stream;
    let stream = match ctx.gateway.prompt(request).await {
        Ok(s) => s,
        Err(e) => {
            let text = error_text(&e.to_string(), None, None);
            ctx.finish(job.update_id, job.inbox_id, Some(reply(&job, &text, None)))
                .await;
            return;
        }
    };
    if ctx.is_stale(&job) {
        drop(stream);
        ctx.finish(job.update_id, job.inbox_id, None).await;
        return;
    }
    let mut streamer = Streamer {
        ctx,
        job: &job,
        streaming,
        verbose,
        buffer: String::new(),
        preview: None,
        next_update: Instant::now(),
    };
    let outcome = streamer.drive(stream).await;
    let item = match outcome {
        Outcome::Answer(text) => {
            let edit = streamer.preview.as_ref().map(|(id, _)| *id);
            Some(reply(&job, &text, edit))
        }
        Outcome::Failed(text) => Some(reply(&job, &text, None)),
        Outcome::Cancelled => None,
    };
    ctx.finish(job.update_id, job.inbox_id, item).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Message;

    fn stored(m: Message) -> StoredMessage {
        StoredMessage {
            id: 1,
            seq: 1,
            message: m,
            model: None,
            usage: None,
            compacted: false,
            summary: false,
            created: 0,
        }
    }

    #[test]
    fn tool_lines() {
        assert_eq!(
            tool_line("exec", &json!({"command": "ls -la"})),
            "🔧 exec: ls -la"
        );
        assert_eq!(
            tool_line("write", &json!({"path": "a.txt", "content": "hello"})),
            "🔧 write: a.txt (5 bytes)"
        );
        let long = tool_line("exec", &json!({"command": "x".repeat(200)}));
        assert_eq!(long.chars().count(), 2 + TOOL_LINE_MAX);
        assert!(long.ends_with('…'));
        assert_eq!(
            tool_line("kv", &json!({"key": "a", "n": 1})),
            "🔧 kv: key=a n=1"
        );
    }

    #[test]
    fn errors_say_what_to_do() {
        let t = error_text(
            "anthropic answered HTTP 429",
            Some(ErrorKind::RateLimit),
            None,
        );
        assert!(t.starts_with("⏳ The model is rate-limited"), "{t}");
        assert!(t.contains("Wait a few minutes"), "{t}");
        let t = error_text("x", Some(ErrorKind::Auth), None);
        assert!(t.contains("apiKey"), "{t}");
        let t = error_text("x", Some(ErrorKind::ContextOverflow), None);
        assert!(t.contains("/new"), "{t}");
    }

    #[test]
    fn previews_keep_the_end_of_long_text() {
        let p = preview_of(&"a".repeat(5000));
        assert_eq!(tg_len(&p), MAX_MESSAGE_LEN);
        assert!(p.starts_with('…'));
    }

    #[test]
    fn completed_turns_are_recognised() {
        let u = stored(Message::user_text("hi"));
        let a = stored(Message::assistant_text("hello"));
        let c = stored(Message::assistant_text("[cancelled by the user]"));
        assert_eq!(completed_answer(&[&u, &a], "hi").as_deref(), Some("hello"));
        assert_eq!(completed_answer(&[&u, &a], "other"), None);
        assert_eq!(completed_answer(&[&u], "hi"), None);
        assert_eq!(completed_answer(&[&u, &c], "hi"), None);
        assert_eq!(completed_answer(&[], "hi"), None);
    }
}
