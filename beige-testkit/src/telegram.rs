//! [`FakeTelegram`]: a fake Telegram Bot API server on `127.0.0.1:0`, for testing bots
//! against real HTTP and the documented JSON shapes.
//!
//! Serves `POST|GET /bot<token>/<method>` with parameters as JSON, query string,
//! url-encoded form or multipart (file uploads), and answers with the Bot API envelope
//! `{"ok": true, "result": …}` / `{"ok": false, "error_code", "description",
//! "parameters"}`. Implemented methods: `getUpdates` (long polling with `timeout`;
//! `offset` confirms every earlier update and returns those with `update_id >= offset`;
//! a second poller makes the first answer 409 Conflict, as Telegram does),
//! `sendMessage`, `editMessageText`, `deleteMessage`, `sendChatAction`, `setMyCommands`,
//! `deleteMyCommands`, `sendPhoto`, `getMe`. A wrong token gets 401.
//!
//! Like Telegram, it **validates** what it is sent: text with `parse_mode: "HTML"` must
//! use only Telegram's tags (`b strong i em u ins s strike del code pre a span
//! tg-spoiler blockquote tg-emoji`), properly nested and closed, with `<`, `>` and `&`
//! outside tags escaped ([`validate_html`]); otherwise the answer is `400 Bad Request:
//! can't parse entities: …` and the reason is kept in [`FakeTelegram::violations`].
//! Texts over 4096 characters (after entity parsing) get `400 Bad Request: message is too
//! long`. Editing a message to the same content gets `message is not modified`.
//!
//! Faults on demand: the next N `sendMessage` calls answer 429 with `retry_after`
//! ([`FakeTelegram::rate_limit_sends`]) or never answer
//! ([`FakeTelegram::hang_sends`]); the next N `getUpdates` never answer
//! ([`FakeTelegram::hang_polls`]). Every call is recorded ([`BotCall`]), every message
//! the bot sent is kept with its edits ([`SentMessage`]), and tests await conditions with
//! [`FakeTelegram::wait_until`] instead of sleeping.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Router;
use serde_json::{json, Map, Value};
use tokio::sync::watch;

/// Telegram's limit for a message text.
pub const MAX_TEXT: usize = 4096;

/// One call the bot made.
#[derive(Debug, Clone, PartialEq)]
pub struct BotCall {
    pub method: String,
    /// All parameters as JSON (strings for query, form and multipart fields).
    pub params: Value,
    /// HTTP status of the answer; `0` while unanswered (or never, for hung calls).
    pub status: u16,
    /// The answer's envelope (`Value::Null` while unanswered).
    pub response: Value,
    /// When the call arrived.
    pub at: Instant,
}

/// An uploaded photo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Photo {
    pub file_name: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
    pub caption: Option<String>,
}

/// A message the bot sent, as it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct SentMessage {
    pub message_id: i64,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    /// The text as sent (HTML source when `parse_mode` is HTML).
    pub text: String,
    pub parse_mode: Option<String>,
    /// The text as the user sees it (entities parsed).
    pub visible: String,
    /// How often it was edited.
    pub edits: usize,
    /// Every text it had, first to last.
    pub history: Vec<String>,
    pub reply_to: Option<i64>,
    pub photo: Option<Photo>,
    /// The inline keyboard it was sent with (`reply_markup.inline_keyboard`), as
    /// `(label, callback_data)` rows; an edit without one removes it, as in Telegram.
    pub buttons: Vec<Vec<(String, String)>>,
}

fn buttons_of(params: &Value) -> Vec<Vec<(String, String)>> {
    let markup = match params.get("reply_markup") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::Null),
        Some(v) => v.clone(),
        None => Value::Null,
    };
    markup
        .get("inline_keyboard")
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .map(|row| {
                    row.as_array()
                        .map(|b| {
                            b.iter()
                                .map(|b| {
                                    (
                                        b["text"].as_str().unwrap_or_default().to_string(),
                                        b["callback_data"].as_str().unwrap_or_default().to_string(),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Debug)]
struct StateInner {
    next_update_id: i64,
    next_user_message_id: i64,
    next_message_id: i64,
    /// Updates not yet confirmed by an offset.
    queue: Vec<Value>,
    calls: Vec<BotCall>,
    messages: Vec<SentMessage>,
    commands: Vec<Value>,
    violations: Vec<String>,
    rate_limit: (usize, u64),
    hang_sends: usize,
    hang_polls: usize,
    poll_generation: u64,
    /// `answerCallbackQuery` calls: (callback query id, text).
    callback_answers: Vec<(String, String)>,
}

struct Shared {
    token: String,
    state: Mutex<StateInner>,
    version: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, StateInner> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// A fake Bot API server on `127.0.0.1:<random port>`. Stops when dropped.
pub struct FakeTelegram {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeTelegram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.lock();
        f.debug_struct("FakeTelegram")
            .field("addr", &self.addr)
            .field("calls", &s.calls.len())
            .field("messages", &s.messages.len())
            .field("queued_updates", &s.queue.len())
            .finish_non_exhaustive()
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeTelegram {
    /// Start on `127.0.0.1:0`, accepting `token`.
    ///
    /// # Panics
    /// When no loopback port can be bound (test support: failing loudly is the point).
    pub async fn start(token: &str) -> Self {
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", 0)).await {
            Ok(l) => l,
            Err(e) => panic!("fake Telegram: cannot bind 127.0.0.1:0: {e}"),
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => panic!("fake Telegram: no local address: {e}"),
        };
        let shared = Arc::new(Shared {
            token: token.to_string(),
            state: Mutex::new(StateInner {
                next_update_id: 100,
                next_user_message_id: 1000,
                next_message_id: 1,
                queue: Vec::new(),
                calls: Vec::new(),
                messages: Vec::new(),
                commands: Vec::new(),
                violations: Vec::new(),
                rate_limit: (0, 0),
                hang_sends: 0,
                hang_polls: 0,
                poll_generation: 0,
                callback_answers: Vec::new(),
            }),
            version: watch::channel(0).0,
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>`: the `apiBaseUrl` for the bot.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Queue an update; an `update_id` is assigned when it has none. Returns the id.
    pub fn push_update(&self, mut update: Value) -> i64 {
        let id = {
            let mut s = self.shared.lock();
            let id = match update.get("update_id").and_then(Value::as_i64) {
                Some(id) => {
                    s.next_update_id = s.next_update_id.max(id + 1);
                    id
                }
                None => {
                    let id = s.next_update_id;
                    s.next_update_id += 1;
                    update["update_id"] = json!(id);
                    id
                }
            };
            s.queue.push(update);
            id
        };
        self.shared.bump();
        id
    }

    /// A text message from `user_id` in `chat_id` (a private chat when they are equal,
    /// else a supergroup). Returns the update id.
    pub fn send_text(&self, chat_id: i64, user_id: i64, text: &str) -> i64 {
        self.push_message(chat_id, user_id, text, None)
    }

    /// A text message in forum topic `thread_id` of supergroup `chat_id`.
    pub fn send_topic_text(&self, chat_id: i64, thread_id: i64, user_id: i64, text: &str) -> i64 {
        self.push_message(chat_id, user_id, text, Some(thread_id))
    }

    fn push_message(&self, chat_id: i64, user_id: i64, text: &str, thread: Option<i64>) -> i64 {
        let message_id = {
            let mut s = self.shared.lock();
            s.next_user_message_id += 1;
            s.next_user_message_id
        };
        let mut chat = json!({"id": chat_id, "type": if chat_id == user_id { "private" } else { "supergroup" }});
        if chat_id != user_id {
            chat["title"] = json!("Test group");
        }
        let mut message = json!({
            "message_id": message_id,
            "from": {"id": user_id, "is_bot": false, "first_name": "Tester", "username": format!("user{user_id}")},
            "chat": chat,
            "date": 1_700_000_000,
            "text": text,
        });
        if let Some(t) = thread {
            message["chat"]["is_forum"] = json!(true);
            message["message_thread_id"] = json!(t);
            message["is_topic_message"] = json!(true);
        }
        if text.starts_with('/') {
            let len = text
                .split_whitespace()
                .next()
                .map_or(0, |w| w.encode_utf16().count());
            message["entities"] = json!([{"type": "bot_command", "offset": 0, "length": len}]);
        }
        self.push_update(json!({ "message": message }))
    }

    /// `user_id` presses the inline button with `data` on the bot's message
    /// `message_id` in `chat_id`. Returns the callback query's id.
    pub fn press_button(&self, chat_id: i64, user_id: i64, message_id: i64, data: &str) -> String {
        let id = format!("cb{}", self.shared.lock().next_update_id);
        self.push_update(json!({
            "callback_query": {
                "id": id,
                "from": {"id": user_id, "is_bot": false, "first_name": "Tester"},
                "message": {
                    "message_id": message_id,
                    "chat": {"id": chat_id, "type": if chat_id == user_id { "private" } else { "supergroup" }},
                    "date": 1_700_000_000,
                    "text": "",
                },
                "chat_instance": "1",
                "data": data,
            }
        }));
        id
    }

    /// The answers the bot gave to button presses: (callback query id, text).
    pub fn callback_answers(&self) -> Vec<(String, String)> {
        self.shared.lock().callback_answers.clone()
    }

    /// Updates not yet confirmed by an offset.
    pub fn pending_updates(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// Every call so far, in arrival order.
    pub fn calls(&self) -> Vec<BotCall> {
        self.shared.lock().calls.clone()
    }

    /// The calls of one method.
    pub fn calls_to(&self, method: &str) -> Vec<BotCall> {
        self.shared
            .lock()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// Every message the bot sent, oldest first, as it is now.
    pub fn messages(&self) -> Vec<SentMessage> {
        self.shared.lock().messages.clone()
    }

    /// The messages in one chat.
    pub fn messages_in(&self, chat_id: i64) -> Vec<SentMessage> {
        self.messages()
            .into_iter()
            .filter(|m| m.chat_id == chat_id)
            .collect()
    }

    /// The commands registered with `setMyCommands`.
    pub fn commands(&self) -> Vec<Value> {
        self.shared.lock().commands.clone()
    }

    /// Why requests were refused (bad HTML, too long, …).
    pub fn violations(&self) -> Vec<String> {
        self.shared.lock().violations.clone()
    }

    /// The next `n` `sendMessage` calls answer 429 with `retry_after`.
    pub fn rate_limit_sends(&self, n: usize, retry_after: u64) {
        self.shared.lock().rate_limit = (n, retry_after);
    }

    /// The next `n` `sendMessage` calls are accepted and never answered.
    pub fn hang_sends(&self, n: usize) {
        self.shared.lock().hang_sends = n;
    }

    /// The next `n` `getUpdates` calls are accepted and never answered.
    pub fn hang_polls(&self, n: usize) {
        self.shared.lock().hang_polls = n;
    }

    /// Wait until `done(self)` holds, re-checking after every change (a call, a message,
    /// an update). Wrap it in a timeout.
    pub async fn wait_until(&self, done: impl Fn(&Self) -> bool) {
        let mut rx = self.shared.version.subscribe();
        loop {
            if done(self) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Wait for a message (as it is now) that satisfies `pred`, and return it.
    ///
    /// # Panics
    ///
    /// After [`Self::WAIT_LIMIT`] without such a message, listing the messages there are, so
    /// a test that misses its message fails with the evidence instead of hanging.
    pub async fn wait_for_message(&self, pred: impl Fn(&SentMessage) -> bool) -> SentMessage {
        let mut rx = self.shared.version.subscribe();
        let wait = async {
            loop {
                if let Some(m) = self.messages().into_iter().find(|m| pred(m)) {
                    return m;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        match tokio::time::timeout(Self::WAIT_LIMIT, wait).await {
            Ok(m) => m,
            Err(_) => panic!(
                "no matching message within {:?}; the bot sent: {:#?}",
                Self::WAIT_LIMIT,
                self.messages()
                    .iter()
                    .map(|m| (m.chat_id, m.visible.clone()))
                    .collect::<Vec<_>>()
            ),
        }
    }

    /// How long [`Self::wait_for_message`] waits before it fails the test.
    pub const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
}

/// Check `text` the way Telegram parses `parse_mode: "HTML"`. Returns the visible text.
pub fn validate_html(text: &str) -> Result<String, String> {
    const ALLOWED: [&str; 16] = [
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "code",
        "pre",
        "a",
        "span",
        "tg-spoiler",
        "blockquote",
        "tg-emoji",
    ];
    let mut stack: Vec<String> = Vec::new();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < text.len() {
        let c = bytes[i];
        match c {
            b'<' => {
                let Some(end) = text[i..].find('>') else {
                    return Err(format!("unclosed start tag at byte offset {i}"));
                };
                let inner = &text[i + 1..i + end];
                if let Some(name) = inner.strip_prefix('/') {
                    let name = name.trim().to_ascii_lowercase();
                    match stack.pop() {
                        Some(top) if top == name => {}
                        Some(top) => {
                            return Err(format!(
                                "unmatched end tag at byte offset {i}, expected \"</{top}>\", found \"</{name}>\""
                            ))
                        }
                        None => {
                            return Err(format!(
                                "unexpected end tag \"</{name}>\" at byte offset {i}"
                            ))
                        }
                    }
                } else {
                    let (name, attrs) =
                        parse_tag(inner).map_err(|e| format!("{e} at byte offset {i}"))?;
                    if !ALLOWED.contains(&name.as_str()) {
                        return Err(format!(
                            "unsupported start tag \"{name}\" at byte offset {i}"
                        ));
                    }
                    if stack.iter().any(|t| t == "code")
                        || (stack.last().is_some_and(|t| t == "pre") && name != "code")
                        || (stack.iter().any(|t| t == "pre") && name == "pre")
                    {
                        return Err(format!(
                            "tag \"{name}\" is not allowed inside a code entity at byte offset {i}"
                        ));
                    }
                    if name == "a" && stack.iter().any(|t| t == "a") {
                        return Err(format!("nested links at byte offset {i}"));
                    }
                    for (k, v) in &attrs {
                        let ok = match (name.as_str(), k.as_str()) {
                            ("a", "href") => !v.is_empty(),
                            ("code", "class") => v.starts_with("language-"),
                            ("span", "class") => v == "tg-spoiler",
                            ("blockquote", "expandable") => true,
                            ("tg-emoji", "emoji-id") => true,
                            _ => false,
                        };
                        if !ok {
                            return Err(format!(
                                "unsupported attribute \"{k}\" of tag \"{name}\" at byte offset {i}"
                            ));
                        }
                    }
                    if name == "a" && !attrs.iter().any(|(k, _)| k == "href") {
                        return Err(format!("a link without href at byte offset {i}"));
                    }
                    stack.push(name);
                }
                i += end + 1;
            }
            b'&' => {
                let Some(end) = text[i..].find(';').filter(|e| *e <= 10) else {
                    return Err(format!(
                        "unsupported start tag or entity: unescaped '&' at byte offset {i}"
                    ));
                };
                let entity = &text[i + 1..i + end];
                let decoded = decode_entity(entity).ok_or_else(|| {
                    format!("unsupported HTML entity \"&{entity};\" at byte offset {i}")
                })?;
                out.push(decoded);
                i += end + 1;
            }
            b'>' => return Err(format!("unescaped '>' at byte offset {i}")),
            _ => {
                let ch_len = text[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&text[i..i + ch_len]);
                i += ch_len;
            }
        }
    }
    if let Some(top) = stack.last() {
        return Err(format!(
            "can't find end tag corresponding to start tag \"{top}\""
        ));
    }
    Ok(out)
}

fn decode_entity(e: &str) -> Option<char> {
    match e {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        _ => {
            let n = e.strip_prefix('#')?;
            let code = match n.strip_prefix(['x', 'X']) {
                Some(h) => u32::from_str_radix(h, 16).ok()?,
                None => n.parse().ok()?,
            };
            char::from_u32(code)
        }
    }
}

/// `name attr="v" attr2='w' flag` → (lower-case name, attributes with decoded values).
fn parse_tag(inner: &str) -> Result<(String, Vec<(String, String)>), String> {
    let inner = inner.trim();
    let name_end = inner.find(char::is_whitespace).unwrap_or(inner.len());
    let name = inner[..name_end].to_ascii_lowercase();
    if name.is_empty() {
        return Err("empty tag".into());
    }
    let mut attrs = Vec::new();
    let mut rest = inner[name_end..].trim_start();
    while !rest.is_empty() {
        let key_end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let key = rest[..key_end].to_ascii_lowercase();
        rest = rest[key_end..].trim_start();
        let value = if let Some(r) = rest.strip_prefix('=') {
            let r = r.trim_start();
            let (v, after) = match r.chars().next() {
                Some(q @ ('"' | '\'')) => {
                    let close = r[1..]
                        .find(q)
                        .ok_or_else(|| format!("unclosed attribute value of \"{key}\""))?;
                    (&r[1..1 + close], &r[close + 2..])
                }
                _ => {
                    let e = r.find(char::is_whitespace).unwrap_or(r.len());
                    (&r[..e], &r[e..])
                }
            };
            rest = after.trim_start();
            let decoded = validate_html(v).map_err(|e| format!("bad attribute value: {e}"))?;
            decoded
        } else {
            String::new()
        };
        attrs.push((key, value));
    }
    Ok((name, attrs))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_urlencoded(s: &str, into: &mut Map<String, Value>) {
    for pair in s.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        into.insert(percent_decode(k), Value::String(percent_decode(v)));
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Parse a multipart body: text fields into `into`, files returned.
fn parse_multipart(
    body: &[u8],
    boundary: &str,
    into: &mut Map<String, Value>,
) -> Result<Vec<(String, Photo)>, String> {
    let delim = format!("--{boundary}");
    let mut files = Vec::new();
    let mut pos = find(body, delim.as_bytes(), 0).ok_or("no multipart boundary in the body")?;
    loop {
        pos += delim.len();
        if body[pos..].starts_with(b"--") {
            break;
        }
        let head_start = pos + 2; // CRLF
        let head_end = find(body, b"\r\n\r\n", head_start).ok_or("a part without headers")?;
        let head = String::from_utf8_lossy(&body[head_start..head_end]).into_owned();
        let data_start = head_end + 4;
        let next = find(body, delim.as_bytes(), data_start).ok_or("an unterminated part")?;
        let data = &body[data_start..next.saturating_sub(2).max(data_start)];
        let mut name = None;
        let mut file_name = None;
        let mut content_type = "application/octet-stream".to_string();
        for line in head.lines() {
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("content-disposition:") {
                for part in line.split(';').map(str::trim) {
                    if let Some(v) = part.strip_prefix("name=") {
                        name = Some(v.trim_matches('"').to_string());
                    } else if let Some(v) = part.strip_prefix("filename=") {
                        file_name = Some(v.trim_matches('"').to_string());
                    }
                }
            } else if lower.starts_with("content-type:") {
                content_type = line["content-type:".len()..].trim().to_string();
            }
        }
        let name = name.ok_or("a part without a name")?;
        match file_name {
            Some(f) => files.push((
                name,
                Photo {
                    file_name: f,
                    content_type,
                    bytes: data.to_vec(),
                    caption: None,
                },
            )),
            None => {
                into.insert(
                    name,
                    Value::String(String::from_utf8_lossy(data).into_owned()),
                );
            }
        }
        pos = next;
    }
    Ok(files)
}

fn int(params: &Value, key: &str) -> Option<i64> {
    match params.get(key)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn string(params: &Value, key: &str) -> Option<String> {
    match params.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn reply(status: u16, body: Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn ok(result: Value) -> (u16, Value) {
    (200, json!({"ok": true, "result": result}))
}

fn fail(code: u16, description: &str) -> (u16, Value) {
    (
        code,
        json!({"ok": false, "error_code": code, "description": description}),
    )
}

fn message_json(m: &SentMessage) -> Value {
    let mut v = json!({
        "message_id": m.message_id,
        "from": {"id": 1, "is_bot": true, "first_name": "Fake bot", "username": "fake_bot"},
        "chat": {"id": m.chat_id, "type": if m.chat_id < 0 { "supergroup" } else { "private" }},
        "date": 1_700_000_000,
    });
    if m.photo.is_some() {
        v["photo"] = json!([{"file_id": format!("photo-{}", m.message_id), "file_unique_id": "u", "width": 1, "height": 1}]);
        if let Some(c) = m.photo.as_ref().and_then(|p| p.caption.clone()) {
            v["caption"] = json!(c);
        }
    } else {
        v["text"] = json!(m.visible);
    }
    if let Some(t) = m.thread_id {
        v["message_thread_id"] = json!(t);
        v["is_topic_message"] = json!(true);
    }
    v
}

/// Check a text for `sendMessage`/`editMessageText`; returns the visible text.
fn check_text(params: &Value) -> Result<(String, String, Option<String>), (u16, Value)> {
    let text = string(params, "text").unwrap_or_default();
    if text.is_empty() {
        return Err(fail(400, "Bad Request: message text is empty"));
    }
    let mode = string(params, "parse_mode");
    let visible = match mode.as_deref() {
        Some(m) if m.eq_ignore_ascii_case("html") => validate_html(&text)
            .map_err(|e| fail(400, &format!("Bad Request: can't parse entities: {e}")))?,
        _ => text.clone(),
    };
    if visible.encode_utf16().count() > MAX_TEXT {
        return Err(fail(400, "Bad Request: message is too long"));
    }
    Ok((text, visible, mode))
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let query = request.uri().query().map(str::to_string);
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match to_bytes(request.into_body(), 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(_) => {
            return reply(
                400,
                json!({"ok": false, "error_code": 400, "description": "Bad Request: body too large"}),
            )
        }
    };
    let Some(rest) = path.strip_prefix("/bot") else {
        return reply(
            404,
            json!({"ok": false, "error_code": 404, "description": "Not Found"}),
        );
    };
    let Some((token, method)) = rest.split_once('/') else {
        return reply(
            404,
            json!({"ok": false, "error_code": 404, "description": "Not Found"}),
        );
    };
    if token != shared.token {
        return reply(
            401,
            json!({"ok": false, "error_code": 401, "description": "Unauthorized"}),
        );
    }
    let mut map = Map::new();
    if let Some(q) = &query {
        parse_urlencoded(q, &mut map);
    }
    let mut files = Vec::new();
    let ct = content_type.to_ascii_lowercase();
    if ct.starts_with("application/json") {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(o)) => map.extend(o),
            _ => {
                return reply(
                    400,
                    json!({"ok": false, "error_code": 400, "description": "Bad Request: invalid JSON"}),
                )
            }
        }
    } else if ct.starts_with("application/x-www-form-urlencoded") {
        parse_urlencoded(&String::from_utf8_lossy(&body), &mut map);
    } else if ct.starts_with("multipart/form-data") {
        let boundary = content_type
            .split(';')
            .filter_map(|p| p.trim().strip_prefix("boundary="))
            .next()
            .unwrap_or("")
            .trim_matches('"')
            .to_string();
        match parse_multipart(&body, &boundary, &mut map) {
            Ok(f) => files = f,
            Err(e) => {
                return reply(
                    400,
                    json!({"ok": false, "error_code": 400, "description": format!("Bad Request: {e}")}),
                )
            }
        }
    }
    let params = Value::Object(map);
    let method = method.to_string();
    let index = {
        let mut s = shared.lock();
        s.calls.push(BotCall {
            method: method.clone(),
            params: params.clone(),
            status: 0,
            response: Value::Null,
            at: Instant::now(),
        });
        s.calls.len() - 1
    };
    shared.bump();
    let (status, envelope) = answer(&shared, &method, &params, files).await;
    {
        let mut s = shared.lock();
        if let Some(c) = s.calls.get_mut(index) {
            c.status = status;
            c.response = envelope.clone();
        }
        if status == 400 {
            if let Some(d) = envelope.get("description").and_then(Value::as_str) {
                s.violations.push(format!("{method}: {d}"));
            }
        }
    }
    shared.bump();
    reply(status, envelope)
}

async fn answer(
    shared: &Arc<Shared>,
    method: &str,
    params: &Value,
    files: Vec<(String, Photo)>,
) -> (u16, Value) {
    match method {
        "getUpdates" => get_updates(shared, params).await,
        "sendMessage" => {
            let Some(chat_id) = int(params, "chat_id") else {
                return fail(400, "Bad Request: chat_id is empty");
            };
            let (hang, limited) = {
                let mut s = shared.lock();
                if s.hang_sends > 0 {
                    s.hang_sends -= 1;
                    (true, None)
                } else if s.rate_limit.0 > 0 {
                    s.rate_limit.0 -= 1;
                    (false, Some(s.rate_limit.1))
                } else {
                    (false, None)
                }
            };
            if hang {
                std::future::pending::<()>().await;
            }
            if let Some(after) = limited {
                return (
                    429,
                    json!({"ok": false, "error_code": 429,
                           "description": format!("Too Many Requests: retry after {after}"),
                           "parameters": {"retry_after": after}}),
                );
            }
            let (text, visible, mode) = match check_text(params) {
                Ok(t) => t,
                Err(e) => return e,
            };
            let reply_to = params
                .get("reply_parameters")
                .and_then(|r| int(r, "message_id"))
                .or_else(|| int(params, "reply_to_message_id"));
            let mut s = shared.lock();
            let m = SentMessage {
                message_id: s.next_message_id,
                chat_id,
                thread_id: int(params, "message_thread_id"),
                history: vec![text.clone()],
                text,
                parse_mode: mode,
                visible,
                edits: 0,
                reply_to,
                photo: None,
                buttons: buttons_of(params),
            };
            s.next_message_id += 1;
            let v = message_json(&m);
            s.messages.push(m);
            ok(v)
        }
        "editMessageText" => {
            let (Some(chat_id), Some(message_id)) =
                (int(params, "chat_id"), int(params, "message_id"))
            else {
                return fail(400, "Bad Request: message identifier is not specified");
            };
            let (text, visible, mode) = match check_text(params) {
                Ok(t) => t,
                Err(e) => return e,
            };
            let mut s = shared.lock();
            let Some(m) = s
                .messages
                .iter_mut()
                .find(|m| m.chat_id == chat_id && m.message_id == message_id)
            else {
                return fail(400, "Bad Request: message to edit not found");
            };
            let same_markup = m.text == text || (!m.text.contains('<') && !text.contains('<'));
            if m.visible == visible && same_markup {
                return fail(400, "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message");
            }
            m.history.push(text.clone());
            m.text = text;
            m.visible = visible;
            m.parse_mode = mode;
            m.edits += 1;
            m.buttons = buttons_of(params);
            ok(message_json(m))
        }
        "deleteMessage" => {
            let (Some(chat_id), Some(message_id)) =
                (int(params, "chat_id"), int(params, "message_id"))
            else {
                return fail(400, "Bad Request: message identifier is not specified");
            };
            let mut s = shared.lock();
            let before = s.messages.len();
            s.messages
                .retain(|m| !(m.chat_id == chat_id && m.message_id == message_id));
            if s.messages.len() == before {
                return fail(400, "Bad Request: message to delete not found");
            }
            ok(json!(true))
        }
        "sendChatAction" => {
            if int(params, "chat_id").is_none() {
                return fail(400, "Bad Request: chat_id is empty");
            }
            match string(params, "action").as_deref() {
                Some(
                    "typing" | "upload_photo" | "record_voice" | "upload_document"
                    | "choose_sticker" | "find_location" | "record_video" | "upload_video"
                    | "upload_voice" | "record_video_note" | "upload_video_note",
                ) => ok(json!(true)),
                _ => fail(400, "Bad Request: wrong parameter action in request"),
            }
        }
        "setMyCommands" => {
            let commands = match params.get("commands") {
                Some(Value::Array(a)) => a.clone(),
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(Value::Array(a)) => a,
                    _ => return fail(400, "Bad Request: can't parse commands JSON object"),
                },
                _ => return fail(400, "Bad Request: parameter \"commands\" is required"),
            };
            for c in &commands {
                let name = c.get("command").and_then(Value::as_str).unwrap_or("");
                let desc = c.get("description").and_then(Value::as_str).unwrap_or("");
                let valid = !name.is_empty()
                    && name.len() <= 32
                    && name
                        .chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_');
                if !valid {
                    return fail(400, "Bad Request: BOT_COMMAND_INVALID");
                }
                if desc.is_empty() || desc.chars().count() > 256 {
                    return fail(400, "Bad Request: command description is invalid");
                }
            }
            shared.lock().commands = commands;
            ok(json!(true))
        }
        "deleteMyCommands" => {
            shared.lock().commands.clear();
            ok(json!(true))
        }
        "answerCallbackQuery" => {
            let Some(id) = string(params, "callback_query_id") else {
                return fail(400, "Bad Request: query id is empty");
            };
            shared
                .lock()
                .callback_answers
                .push((id, string(params, "text").unwrap_or_default()));
            ok(json!(true))
        }
        "getMe" => {
            ok(json!({"id": 1, "is_bot": true, "first_name": "Fake bot", "username": "fake_bot"}))
        }
        "sendPhoto" => {
            let Some(chat_id) = int(params, "chat_id") else {
                return fail(400, "Bad Request: chat_id is empty");
            };
            let Some((_, mut photo)) = files.into_iter().find(|(n, _)| n == "photo") else {
                return fail(400, "Bad Request: there is no photo in the request");
            };
            if photo.bytes.is_empty() {
                return fail(400, "Bad Request: file must be non-empty");
            }
            photo.caption = string(params, "caption");
            let mut s = shared.lock();
            let m = SentMessage {
                message_id: s.next_message_id,
                chat_id,
                thread_id: int(params, "message_thread_id"),
                text: String::new(),
                parse_mode: None,
                visible: String::new(),
                edits: 0,
                history: Vec::new(),
                reply_to: None,
                photo: Some(photo),
                buttons: Vec::new(),
            };
            s.next_message_id += 1;
            let v = message_json(&m);
            s.messages.push(m);
            ok(v)
        }
        _ => fail(404, "Not Found"),
    }
}

async fn get_updates(shared: &Arc<Shared>, params: &Value) -> (u16, Value) {
    let offset = int(params, "offset");
    let timeout = int(params, "timeout").unwrap_or(0).clamp(0, 50);
    let limit = usize::try_from(int(params, "limit").unwrap_or(100).clamp(1, 100)).unwrap_or(100);
    let hang = {
        let mut s = shared.lock();
        let hang = s.hang_polls > 0;
        s.hang_polls = s.hang_polls.saturating_sub(1);
        hang
    };
    if hang {
        std::future::pending::<()>().await;
    }
    let generation = {
        let mut s = shared.lock();
        if let Some(off) = offset {
            s.queue
                .retain(|u| u.get("update_id").and_then(Value::as_i64).unwrap_or(0) >= off);
        }
        s.poll_generation += 1;
        s.poll_generation
    };
    shared.bump();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout as u64);
    let mut rx = shared.version.subscribe();
    loop {
        {
            let s = shared.lock();
            if s.poll_generation != generation {
                return fail(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                );
            }
            let ready: Vec<Value> = s
                .queue
                .iter()
                .filter(|u| {
                    offset.is_none_or(|off| {
                        u.get("update_id").and_then(Value::as_i64).unwrap_or(0) >= off
                    })
                })
                .take(limit)
                .cloned()
                .collect();
            if !ready.is_empty() {
                return ok(Value::Array(ready));
            }
        }
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return ok(json!([]));
                }
            }
            _ = tokio::time::sleep_until(deadline) => return ok(json!([])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_validation_like_telegram() {
        assert_eq!(
            validate_html("<b>bold</b> &lt;x&gt; &amp; <a href=\"https://a.b/?q=1&amp;r=2\">l</a>"),
            Ok("bold <x> & l".to_string())
        );
        assert_eq!(
            validate_html("<pre><code class=\"language-rust\">a &lt; b</code></pre>"),
            Ok("a < b".to_string())
        );
        assert!(validate_html("a < b").is_err());
        assert!(validate_html("a > b").is_err());
        assert!(validate_html("a & b").is_err());
        assert!(validate_html("<b>x").is_err());
        assert!(validate_html("<b><i>x</b></i>").is_err());
        assert!(validate_html("<div>x</div>").is_err());
        assert!(validate_html("<code><b>x</b></code>").is_err());
        assert!(validate_html("<b onclick=\"x\">x</b>").is_err());
        assert!(validate_html("</b>").is_err());
    }

    #[test]
    fn multipart_parsing() {
        let body = b"--XX\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n--XX\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n\x89PNG\r\n--XX--\r\n";
        let mut map = Map::new();
        let files = parse_multipart(body, "XX", &mut map).unwrap();
        assert_eq!(map["chat_id"], "42");
        assert_eq!(files[0].1.file_name, "a.png");
        assert_eq!(files[0].1.bytes, b"\x89PNG");
    }

    #[test]
    fn url_decoding() {
        assert_eq!(percent_decode("a%20b+c%26"), "a b c&");
    }
}
