//! A small Telegram Bot API client over reqwest: `POST {apiBaseUrl}/bot<token>/<method>`
//! with a JSON body (multipart for `sendPhoto`), the `{"ok", "result"}` envelope decoded,
//! and failures as [`ApiError`] with Telegram's `error_code`, `description` and
//! `parameters.retry_after`.
//!
//! The token is part of every URL, so it must never reach a log line or an error
//! message: transport errors are stripped of their URL and every text that leaves this
//! module passes through [`BotApi::redact`]. `Debug` shows `<redacted>`.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Time limit of an ordinary Bot API call.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// What a Bot API call failed with.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// Telegram answered `ok: false`.
    #[error("Telegram refused {method}: {description} (error {code})")]
    Api {
        /// The Bot API method called (`sendMessage`, `getUpdates`, …).
        method: String,
        /// Telegram's `error_code`, or the HTTP status when it gave none.
        code: i64,
        /// Telegram's `description` of the error, with the token redacted.
        description: String,
        /// `parameters.retry_after`, in seconds (flood control).
        retry_after: Option<u64>,
    },
    /// The request did not get an answer (connection, DNS, TLS, body).
    #[error("could not reach the Telegram Bot API for {method}: {message}")]
    Transport {
        /// The Bot API method called (`sendMessage`, `getUpdates`, …).
        method: String,
        /// The HTTP client's error with its causes, without the URL and with the token
        /// redacted.
        message: String,
    },
    /// No answer within the time limit.
    #[error("the Telegram Bot API did not answer {method} within {} s", .after.as_secs_f64())]
    Timeout {
        /// The Bot API method called (`sendMessage`, `getUpdates`, …).
        method: String,
        /// The time limit the call had.
        after: Duration,
    },
    /// An answer that is not the Bot API's JSON envelope.
    #[error("unreadable answer to {method}: {message}")]
    Decode {
        /// The Bot API method called (`sendMessage`, `getUpdates`, …).
        method: String,
        /// What was wrong with the answer (the HTTP status and the start of the body,
        /// token redacted).
        message: String,
    },
}

impl ApiError {
    /// Telegram's error code (HTTP status for envelope errors), if any.
    pub fn code(&self) -> Option<i64> {
        match self {
            ApiError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Seconds Telegram asked us to wait.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    fn description(&self) -> &str {
        match self {
            ApiError::Api { description, .. } => description,
            _ => "",
        }
    }

    /// The HTML was refused (`can't parse entities`).
    pub fn is_parse_error(&self) -> bool {
        self.code() == Some(400)
            && self
                .description()
                .to_ascii_lowercase()
                .contains("can't parse entities")
    }

    /// An edit that changes nothing (`message is not modified`): a success for us.
    pub fn is_not_modified(&self) -> bool {
        self.code() == Some(400)
            && self
                .description()
                .to_ascii_lowercase()
                .contains("message is not modified")
    }

    /// The message to edit is gone or cannot be edited: send a new one instead.
    pub fn is_edit_impossible(&self) -> bool {
        let d = self.description().to_ascii_lowercase();
        self.code() == Some(400)
            && (d.contains("message to edit not found")
                || d.contains("message can't be edited")
                || d.contains("message_id_invalid"))
    }

    /// The token was rejected (401) or the bot does not exist (404 on every method).
    pub fn is_auth(&self) -> bool {
        matches!(self.code(), Some(401 | 404))
    }

    /// Trying again cannot help (bad request, bot blocked, chat gone).
    pub fn is_permanent(&self) -> bool {
        matches!(self.code(), Some(400 | 403))
    }
}

/// The Bot API client. Cheap to clone.
#[derive(Clone)]
pub(crate) struct BotApi {
    http: reqwest::Client,
    base: Arc<str>,
    token: Arc<str>,
}

impl std::fmt::Debug for BotApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotApi")
            .field("base", &self.base)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Envelope of every Bot API answer.
#[derive(Debug, Deserialize)]
struct Envelope {
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error_code: Option<i64>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<ResponseParameters>,
}

#[derive(Debug, Deserialize)]
struct ResponseParameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// A Telegram user (`from`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct User {
    pub(crate) id: i64,
    #[serde(default)]
    pub(crate) is_bot: bool,
    #[serde(default)]
    pub(crate) first_name: String,
    #[serde(default)]
    pub(crate) username: Option<String>,
}

/// A chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Chat {
    pub(crate) id: i64,
    #[serde(default, rename = "type")]
    pub(crate) kind: String,
    /// A supergroup with topics.
    #[serde(default)]
    pub(crate) is_forum: bool,
}

/// The parts of a message the channel uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Message {
    pub(crate) message_id: i64,
    #[serde(default)]
    pub(crate) from: Option<User>,
    pub(crate) chat: Chat,
    #[serde(default)]
    pub(crate) text: Option<String>,
    #[serde(default)]
    pub(crate) message_thread_id: Option<i64>,
    #[serde(default)]
    pub(crate) is_topic_message: bool,
}

impl Message {
    /// The forum topic this message belongs to (only in forum supergroups; a reply
    /// thread in an ordinary group is not a topic).
    pub(crate) fn topic(&self) -> Option<i64> {
        if self.is_topic_message || self.chat.is_forum {
            self.message_thread_id
        } else {
            None
        }
    }
}

/// One update from `getUpdates` (only messages are used; the raw JSON is kept by the
/// poller).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Update {
    pub(crate) update_id: i64,
    #[serde(default)]
    pub(crate) message: Option<Message>,
    #[serde(default)]
    pub(crate) callback_query: Option<CallbackQuery>,
}

/// A press of an inline keyboard button.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CallbackQuery {
    pub(crate) id: String,
    /// Who pressed it: always a person (a bot's messages press nothing).
    pub(crate) from: User,
    /// The message the button was on.
    #[serde(default)]
    pub(crate) message: Option<Message>,
    #[serde(default)]
    pub(crate) data: Option<String>,
}

/// A command for `setMyCommands`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct BotCommand {
    pub(crate) command: String,
    pub(crate) description: String,
}

/// A file to upload.
#[derive(Debug, Clone)]
pub(crate) struct Upload {
    /// The form field (`photo`).
    pub(crate) field: String,
    pub(crate) file_name: String,
    pub(crate) mime: String,
    pub(crate) data: Vec<u8>,
}

impl BotApi {
    /// A client for `{base_url}/bot<token>/…`.
    pub(crate) fn new(base_url: &str, token: &str) -> Self {
        Self {
            http: Self::client(),
            base: Arc::from(base_url.trim_end_matches('/')),
            token: Arc::from(token),
        }
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(50))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new())
    }

    /// The same API with a fresh connection pool (the watchdog uses it after a hang: a
    /// half-dead keep-alive connection is the usual cause).
    pub(crate) fn renewed(&self) -> Self {
        Self {
            http: Self::client(),
            base: self.base.clone(),
            token: self.token.clone(),
        }
    }

    fn url(&self, method: &str) -> String {
        format!("{}/bot{}/{}", self.base, self.token, method)
    }

    /// Replace the token wherever it appears.
    pub(crate) fn redact(&self, text: &str) -> String {
        if self.token.is_empty() {
            return text.to_string();
        }
        text.replace(&*self.token, "<token>")
    }

    fn transport(&self, method: &str, e: reqwest::Error, timeout: Duration) -> ApiError {
        if e.is_timeout() {
            return ApiError::Timeout {
                method: method.to_string(),
                after: timeout,
            };
        }
        let e = e.without_url();
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        ApiError::Transport {
            method: method.to_string(),
            message: self.redact(&message),
        }
    }

    async fn decode(
        &self,
        method: &str,
        response: reqwest::Response,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| self.transport(method, e, timeout))?;
        let envelope: Envelope = serde_json::from_slice(&bytes).map_err(|_| {
            let body = String::from_utf8_lossy(&bytes);
            let short: String = body.chars().take(200).collect();
            ApiError::Decode {
                method: method.to_string(),
                message: self.redact(&format!("HTTP {status}: {short}")),
            }
        })?;
        if envelope.ok {
            return Ok(envelope.result.unwrap_or(Value::Null));
        }
        Err(ApiError::Api {
            method: method.to_string(),
            code: envelope
                .error_code
                .unwrap_or_else(|| i64::from(status.as_u16())),
            description: self.redact(envelope.description.as_deref().unwrap_or("no description")),
            retry_after: envelope.parameters.and_then(|p| p.retry_after),
        })
    }

    /// Call `method` with JSON `params`; `timeout` bounds the whole request.
    pub(crate) async fn call(
        &self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let response = self
            .http
            .post(self.url(method))
            .json(params)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.transport(method, e, timeout))?;
        self.decode(method, response, timeout).await
    }

    /// Call `method` with a multipart body: text `fields` and one file.
    pub(crate) async fn call_multipart(
        &self,
        method: &str,
        fields: &[(String, String)],
        file: &Upload,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let boundary = format!("beige-{:032x}", rand::random::<u128>());
        let mut body: Vec<u8> = Vec::with_capacity(file.data.len() + 1024);
        let clean = |s: &str| -> String {
            s.chars()
                .filter(|c| !matches!(c, '"' | '\r' | '\n' | '\\'))
                .collect()
        };
        for (name, value) in fields {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"\r\n\r\n",
                    clean(name)
                )
                .as_bytes(),
            );
            body.extend_from_slice(value.as_bytes());
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
                clean(&file.field),
                clean(&file.file_name),
                clean(&file.mime)
            )
            .as_bytes(),
        );
        body.extend_from_slice(&file.data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let response = self
            .http
            .post(self.url(method))
            .header(
                reqwest::header::CONTENT_TYPE,
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.transport(method, e, timeout))?;
        self.decode(method, response, timeout).await
    }

    /// Long-poll for updates with `update_id >= offset`, waiting up to `wait` on
    /// Telegram's side. The raw JSON of each update is returned with its id.
    pub(crate) async fn get_updates(
        &self,
        offset: i64,
        wait: Duration,
        timeout: Duration,
    ) -> Result<Vec<(i64, Value)>, ApiError> {
        let result = self
            .call(
                "getUpdates",
                &json!({
                    "offset": offset,
                    "timeout": wait.as_secs(),
                    "limit": 100,
                    "allowed_updates": ["message", "callback_query"],
                }),
                timeout,
            )
            .await?;
        let Value::Array(items) = result else {
            return Err(ApiError::Decode {
                method: "getUpdates".into(),
                message: "the result is not a list".into(),
            });
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            match item.get("update_id").and_then(Value::as_i64) {
                Some(id) => out.push((id, item)),
                None => tracing::warn!("getUpdates returned an update without update_id"),
            }
        }
        Ok(out)
    }

    /// `sendMessage`; returns the new message's id.
    pub(crate) async fn send_message(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        text: &str,
        html: bool,
        reply_to: Option<i64>,
    ) -> Result<i64, ApiError> {
        let mut params = json!({"chat_id": chat_id, "text": text});
        if html {
            params["parse_mode"] = json!("HTML");
        }
        if let Some(t) = thread_id {
            params["message_thread_id"] = json!(t);
        }
        if let Some(r) = reply_to {
            params["reply_parameters"] =
                json!({"message_id": r, "allow_sending_without_reply": true});
        }
        let result = self.call("sendMessage", &params, CALL_TIMEOUT).await?;
        message_id("sendMessage", &result)
    }

    /// `sendMessage` with an inline keyboard (`rows` of `(label, callback_data)`);
    /// returns the new message's id.
    pub(crate) async fn send_with_buttons(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        text: &str,
        rows: &[Vec<(String, String)>],
    ) -> Result<i64, ApiError> {
        let keyboard: Vec<Vec<Value>> = rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|(label, data)| json!({"text": label, "callback_data": data}))
                    .collect()
            })
            .collect();
        let mut params = json!({
            "chat_id": chat_id,
            "text": text,
            "reply_markup": {"inline_keyboard": keyboard},
        });
        if let Some(t) = thread_id {
            params["message_thread_id"] = json!(t);
        }
        let result = self.call("sendMessage", &params, CALL_TIMEOUT).await?;
        message_id("sendMessage", &result)
    }

    /// `answerCallbackQuery`: the small notice the presser sees.
    pub(crate) async fn answer_callback_query(&self, id: &str, text: &str) -> Result<(), ApiError> {
        self.call(
            "answerCallbackQuery",
            &json!({"callback_query_id": id, "text": text}),
            CALL_TIMEOUT,
        )
        .await
        .map(|_| ())
    }

    /// `editMessageText`. "Not modified" counts as success.
    pub(crate) async fn edit_message_text(
        &self,
        chat_id: i64,
        message_id: i64,
        text: &str,
        html: bool,
    ) -> Result<(), ApiError> {
        let mut params = json!({"chat_id": chat_id, "message_id": message_id, "text": text});
        if html {
            params["parse_mode"] = json!("HTML");
        }
        match self.call("editMessageText", &params, CALL_TIMEOUT).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_modified() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `sendChatAction` (`typing`).
    pub(crate) async fn send_chat_action(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        action: &str,
    ) -> Result<(), ApiError> {
        let mut params = json!({"chat_id": chat_id, "action": action});
        if let Some(t) = thread_id {
            params["message_thread_id"] = json!(t);
        }
        self.call("sendChatAction", &params, CALL_TIMEOUT)
            .await
            .map(|_| ())
    }

    /// `setMyCommands`.
    pub(crate) async fn set_my_commands(&self, commands: &[BotCommand]) -> Result<(), ApiError> {
        self.call(
            "setMyCommands",
            &json!({ "commands": commands }),
            CALL_TIMEOUT,
        )
        .await
        .map(|_| ())
    }

    /// `sendPhoto` with an uploaded file; returns the new message's id.
    pub(crate) async fn send_photo(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        photo: &Upload,
        caption: Option<&str>,
    ) -> Result<i64, ApiError> {
        let mut fields = vec![("chat_id".to_string(), chat_id.to_string())];
        if let Some(t) = thread_id {
            fields.push(("message_thread_id".into(), t.to_string()));
        }
        if let Some(c) = caption.filter(|c| !c.is_empty()) {
            fields.push(("caption".into(), c.to_string()));
        }
        let result = self
            .call_multipart("sendPhoto", &fields, photo, Duration::from_secs(120))
            .await?;
        message_id("sendPhoto", &result)
    }
}

fn message_id(method: &str, result: &Value) -> Result<i64, ApiError> {
    result
        .get("message_id")
        .and_then(Value::as_i64)
        .ok_or_else(|| ApiError::Decode {
            method: method.to_string(),
            message: "the result has no message_id".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_never_shows() {
        let api = BotApi::new("https://api.telegram.org/", "123:SECRET");
        assert_eq!(
            api.url("getMe"),
            "https://api.telegram.org/bot123:SECRET/getMe"
        );
        assert!(!format!("{api:?}").contains("SECRET"));
        assert_eq!(
            api.redact("GET /bot123:SECRET/getMe failed"),
            "GET /bot<token>/getMe failed"
        );
    }

    #[test]
    fn error_classes() {
        let e = |code, d: &str| ApiError::Api {
            method: "sendMessage".into(),
            code,
            description: d.into(),
            retry_after: None,
        };
        assert!(e(400, "Bad Request: can't parse entities: x").is_parse_error());
        assert!(e(400, "Bad Request: message is not modified: y").is_not_modified());
        assert!(e(400, "Bad Request: message to edit not found").is_edit_impossible());
        assert!(e(403, "Forbidden: bot was blocked by the user").is_permanent());
        assert!(!e(429, "Too Many Requests").is_permanent());
        assert!(e(401, "Unauthorized").is_auth());
    }

    #[test]
    fn topics_only_in_forums() {
        let m: Message = serde_json::from_value(json!({
            "message_id": 1, "chat": {"id": -5, "type": "supergroup"},
            "message_thread_id": 9, "text": "hi"
        }))
        .unwrap();
        assert_eq!(m.topic(), None, "a reply thread in a plain group");
        let m: Message = serde_json::from_value(json!({
            "message_id": 1, "chat": {"id": -5, "type": "supergroup", "is_forum": true},
            "message_thread_id": 9, "is_topic_message": true, "text": "hi"
        }))
        .unwrap();
        assert_eq!(m.topic(), Some(9));
    }
}
