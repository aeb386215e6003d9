//! The `google-generative-ai` wire format (Gemini):
//! `POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse`, authenticated with
//! `x-goog-api-key` (never a URL parameter). Each SSE `data:` is a whole
//! `GenerateContentResponse` chunk. This module owns the translation between the
//! provider-neutral types and that API: `contents` with `functionCall`/`functionResponse`
//! parts (Gemini has no call ids, so results are paired by name and order and ids are
//! generated here), schema clean-up for `functionDeclarations`, thinking budgets, usage and
//! Google's error bodies. The HTTP/SSE plumbing comes from the shared `sse` module.

use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Event;
use futures_util::StreamExt;
use reqwest::header::{ACCEPT, RETRY_AFTER};
use serde_json::{json, Map, Value};

use crate::config::ThinkingLevel;

use super::sse::{self, SseDecoder};
use super::{
    parse_retry_after, ApiKey, Block, EventStream, LlmError, LlmProvider, Message, ModelRequest,
    ModelResponse, Role, StopReason, StreamEvent, ToolResultPart, Usage,
};

/// The most of an error body read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A client of one provider speaking the Gemini API (`generativelanguage.googleapis.com`).
pub struct GoogleClient {
    ep: sse::Endpoint,
}

impl std::fmt::Debug for GoogleClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("GoogleClient").field(&self.ep).finish()
    }
}

impl GoogleClient {
    /// A client for provider `name` at `base_url` (e.g.
    /// `https://generativelanguage.googleapis.com`; a base already ending in `/v1beta` or
    /// `/v1` is used as is). The key goes in `x-goog-api-key`, never in the URL; without
    /// a key none is sent. `headers` are sent with every request and override the
    /// client's own.
    pub fn new(
        name: &str,
        base_url: &str,
        api_key: ApiKey,
        headers: Vec<(String, String)>,
    ) -> Result<Self, LlmError> {
        let mut ep = sse::Endpoint::new(name, base_url, api_key, &headers)?;
        // `base_url` is the versioned API root, e.g.
        // `https://generativelanguage.googleapis.com/v1beta`.
        if !(ep.base_url.ends_with("/v1beta") || ep.base_url.ends_with("/v1")) {
            ep.base_url.push_str("/v1beta");
        }
        Ok(Self { ep })
    }

    /// Abandon a stream when no event arrives for this long (default 120 s).
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.ep.idle = idle;
        self
    }

    fn url(&self, model: &str) -> Result<String, LlmError> {
        let id = model.strip_prefix("models/").unwrap_or(model);
        let safe = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
        if !safe {
            return Err(LlmError::Config {
                provider: self.ep.name.clone(),
                message: format!("invalid model id {model:?}"),
            });
        }
        Ok(format!(
            "{}/models/{id}:streamGenerateContent?alt=sse",
            self.ep.base_url
        ))
    }

    async fn start(&self, request: &ModelRequest) -> Result<EventStream, LlmError> {
        let mut builder = self
            .ep
            .http
            .post(self.url(&request.model)?)
            .header(ACCEPT, "text/event-stream")
            .json(&request_body(request));
        if let Some(key) = self.ep.api_key.expose() {
            builder = builder.header("x-goog-api-key", sse::secret_header(&self.ep.name, key)?);
        }
        let builder = builder.headers(self.ep.headers.clone());
        let response = match tokio::time::timeout(self.ep.idle, builder.send()).await {
            Err(_) => {
                return Err(LlmError::IdleTimeout {
                    provider: self.ep.name.clone(),
                    idle: self.ep.idle,
                })
            }
            Ok(Err(e)) => return Err(sse::transport(&self.ep.name, &e)),
            Ok(Ok(response)) => response,
        };
        if !response.status().is_success() {
            return Err(self.http_error(response).await);
        }
        Ok(sse::decode_stream(
            &self.ep.name,
            response,
            self.ep.idle,
            GeminiParser::new(&self.ep.name, existing_tool_calls(request)),
        ))
    }

    /// A non-2xx answer: like [`sse::api_error`], plus Google's `RetryInfo.retryDelay`
    /// when there is no `retry-after` header.
    async fn http_error(&self, response: reqwest::Response) -> LlmError {
        let status = response.status().as_u16();
        let header_retry = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let read = async {
            let mut body = Vec::new();
            let mut chunks = response.bytes_stream();
            while let Some(Ok(chunk)) = chunks.next().await {
                body.extend_from_slice(&chunk);
                if body.len() >= MAX_ERROR_BODY {
                    body.truncate(MAX_ERROR_BODY);
                    break;
                }
            }
            body
        };
        let body = tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let error = sse::error_from_body(&self.ep.name, status, header_retry, &text);
        match error {
            LlmError::Api {
                provider,
                status,
                retry_after: None,
                error_type,
                message,
            } => {
                let delay = serde_json::from_str::<Value>(&text).ok().and_then(|v| {
                    let v = v.as_array().and_then(|a| a.first()).cloned().unwrap_or(v);
                    v.get("error").and_then(retry_delay)
                });
                LlmError::Api {
                    provider,
                    status,
                    retry_after: delay,
                    error_type,
                    message,
                }
            }
            other => other,
        }
    }
}

#[async_trait]
impl LlmProvider for GoogleClient {
    fn name(&self) -> &str {
        &self.ep.name
    }

    async fn stream(&self, request: ModelRequest) -> Result<EventStream, LlmError> {
        match self.start(&request).await {
            Ok(stream) => Ok(sse::redact_stream(stream, &self.ep.api_key)),
            Err(e) => Err(sse::redact(e, &self.ep.api_key)),
        }
    }
}

/// Sent as the `thoughtSignature` of replayed function calls. Gemini 3 rejects replayed
/// calls without a signature; beige keeps no provider-specific opaque data in history, so
/// it uses the value Google documents for history it did not produce.
const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

/// Schema keywords Gemini's `Schema` object accepts; everything else is dropped.
const SCHEMA_KEYS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

// ---------------------------------------------------------------------------------------
// Request body
// ---------------------------------------------------------------------------------------

/// The thinking budget (tokens) of a level, `None` for off.
fn thinking_budget(level: ThinkingLevel) -> Option<u32> {
    match level {
        ThinkingLevel::Off => None,
        ThinkingLevel::Minimal => Some(512),
        ThinkingLevel::Low => Some(2_048),
        ThinkingLevel::Medium => Some(8_192),
        ThinkingLevel::High => Some(24_576),
    }
}

/// Reduce a JSON Schema to the OpenAPI subset Gemini accepts: unknown keywords
/// (`additionalProperties`, `$schema`, `$ref`, `const`, …) are dropped, `type: [T, "null"]`
/// becomes `type: T, nullable: true`, `const` becomes a one-value `enum`.
pub(crate) fn clean_schema(schema: &Value) -> Value {
    let Value::Object(obj) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in obj {
        match key.as_str() {
            "properties" => {
                if let Value::Object(props) = value {
                    let props: Map<String, Value> = props
                        .iter()
                        .map(|(name, s)| (name.clone(), clean_schema(s)))
                        .collect();
                    out.insert(key.clone(), Value::Object(props));
                }
            }
            "items" => {
                out.insert(key.clone(), clean_schema(value));
            }
            "anyOf" => {
                if let Value::Array(options) = value {
                    out.insert(
                        key.clone(),
                        Value::Array(options.iter().map(clean_schema).collect()),
                    );
                }
            }
            "type" => match value {
                Value::Array(types) => {
                    let non_null: Vec<&Value> = types
                        .iter()
                        .filter(|t| t.as_str() != Some("null"))
                        .collect();
                    if non_null.len() < types.len() {
                        out.insert("nullable".into(), json!(true));
                    }
                    if let Some(first) = non_null.first() {
                        out.insert(key.clone(), (*first).clone());
                    }
                }
                other => {
                    out.insert(key.clone(), other.clone());
                }
            },
            "const" => {
                out.entry("enum").or_insert_with(|| json!([value]));
            }
            k if SCHEMA_KEYS.contains(&k) => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    Value::Object(out)
}

/// Whether the model needs a `thoughtSignature` on replayed function calls (Gemini 3+).
fn wants_signature(model: &str) -> bool {
    let id = model.strip_prefix("models/").unwrap_or(model);
    !(id.starts_with("gemini-1") || id.starts_with("gemini-2") || !id.starts_with("gemini-"))
}

/// The tool name of `tool_use_id`: looked up in the nearest preceding assistant message,
/// then in the whole earlier history.
fn tool_name(history: &[&Message], tool_use_id: &str) -> Option<String> {
    let find = |m: &&Message| {
        m.tool_uses()
            .into_iter()
            .find(|(id, _, _)| *id == tool_use_id)
            .map(|(_, name, _)| name.to_string())
    };
    let mut assistants = history.iter().rev().filter(|m| m.role == Role::Assistant);
    let nearest = assistants.next();
    nearest
        .and_then(find)
        .or_else(|| history.iter().rev().find_map(find))
}

fn inline_data(mime_type: &str, data: &str) -> Value {
    json!({ "inlineData": { "mimeType": mime_type, "data": data } })
}

/// Build the JSON body of one call.
pub(crate) fn request_body(request: &ModelRequest) -> Value {
    let signature = wants_signature(&request.model);
    let mut contents = Vec::new();
    let messages: Vec<&Message> = request.messages.iter().collect();
    for (i, message) in messages.iter().copied().enumerate() {
        let mut parts = Vec::new();
        match message.role {
            Role::User => {
                let mut tool_images = Vec::new();
                for block in &message.content {
                    match block {
                        Block::Text { text } => parts.push(json!({ "text": text })),
                        Block::Image { data, mime_type } => {
                            parts.push(inline_data(mime_type, data))
                        }
                        Block::ToolResult {
                            tool_use_id,
                            content,
                            is_error,
                        } => {
                            let mut texts = Vec::new();
                            for part in content {
                                match part {
                                    ToolResultPart::Text { text } => texts.push(text.as_str()),
                                    ToolResultPart::Image { data, mime_type } => {
                                        tool_images.push(inline_data(mime_type, data))
                                    }
                                }
                            }
                            let name = tool_name(&messages[..i], tool_use_id)
                                .unwrap_or_else(|| tool_use_id.clone());
                            parts.push(json!({
                                "functionResponse": {
                                    "name": name,
                                    "response": { "content": texts.join("\n"), "isError": is_error },
                                }
                            }));
                        }
                        Block::Thinking { .. } | Block::ToolUse { .. } => {}
                    }
                }
                parts.extend(tool_images);
            }
            Role::Assistant => {
                let mut first_call = true;
                for block in &message.content {
                    match block {
                        Block::Text { text } if !text.is_empty() => {
                            parts.push(json!({ "text": text }))
                        }
                        Block::ToolUse { name, input, .. } => {
                            let mut part =
                                json!({ "functionCall": { "name": name, "args": input } });
                            if signature && first_call {
                                part["thoughtSignature"] = json!(SKIP_SIGNATURE);
                            }
                            first_call = false;
                            parts.push(part);
                        }
                        _ => {}
                    }
                }
            }
        }
        if !parts.is_empty() {
            let role = match message.role {
                Role::User => "user",
                Role::Assistant => "model",
            };
            contents.push(json!({ "role": role, "parts": parts }));
        }
    }

    let mut body = Map::new();
    if !request.system.is_empty() {
        body.insert(
            "systemInstruction".into(),
            json!({ "parts": [{ "text": request.system }] }),
        );
    }
    body.insert("contents".into(), Value::Array(contents));
    if !request.tools.is_empty() {
        let declarations: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "description": t.description,
                    "parameters": clean_schema(&t.input_schema),
                })
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
    }
    let mut generation = Map::new();
    generation.insert("maxOutputTokens".into(), json!(request.max_tokens));
    if request.reasoning {
        if let Some(budget) = thinking_budget(request.thinking) {
            generation.insert(
                "thinkingConfig".into(),
                json!({ "thinkingBudget": budget, "includeThoughts": true }),
            );
        }
    }
    body.insert("generationConfig".into(), Value::Object(generation));
    Value::Object(body)
}

/// Number of tool calls already in the history: generated ids continue from there, so
/// they stay unique within a conversation and are the same on every run.
pub(crate) fn existing_tool_calls(request: &ModelRequest) -> usize {
    request
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.tool_uses().len())
        .sum()
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// `error.details[]` `RetryInfo.retryDelay` (`"30s"`, `"1.5s"`).
fn retry_delay(error: &Value) -> Option<std::time::Duration> {
    error
        .get("details")
        .and_then(Value::as_array)?
        .iter()
        .filter_map(|d| d.get("retryDelay").and_then(Value::as_str))
        .find_map(|d| parse_retry_after(d.trim().trim_end_matches('s')))
}

/// A Google error object (`{"code", "message", "status", "details"}`) as [`LlmError::Api`].
pub(crate) fn api_error(
    provider: &str,
    http_status: Option<u16>,
    header_retry_after: Option<std::time::Duration>,
    error: &Value,
) -> LlmError {
    let status = http_status
        .or_else(|| {
            error
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
        })
        .unwrap_or(500);
    LlmError::Api {
        provider: provider.to_string(),
        status,
        retry_after: header_retry_after.or_else(|| retry_delay(error)),
        error_type: error
            .get("status")
            .and_then(Value::as_str)
            .map(str::to_string),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("request failed")
            .to_string(),
    }
}

// ---------------------------------------------------------------------------------------
// Stream parsing
// ---------------------------------------------------------------------------------------

/// Turns the `data` of successive chunks into [`StreamEvent`]s.
#[derive(Debug)]
pub(crate) struct GeminiParser {
    provider: String,
    content: Vec<Block>,
    finish_reason: Option<String>,
    usage: Usage,
    next_call: usize,
}

impl GeminiParser {
    /// `existing_calls`: tool calls already in the history (see [`existing_tool_calls`]).
    pub(crate) fn new(provider: &str, existing_calls: usize) -> Self {
        Self {
            provider: provider.to_string(),
            content: Vec::new(),
            finish_reason: None,
            usage: Usage::default(),
            next_call: existing_calls,
        }
    }

    fn decode(&self, message: impl Into<String>) -> LlmError {
        LlmError::Decode {
            provider: self.provider.clone(),
            message: message.into(),
        }
    }

    /// Handle one chunk.
    pub(crate) fn feed(&mut self, data: &str) -> Result<Vec<StreamEvent>, LlmError> {
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| self.decode(format!("invalid chunk JSON: {e}")))?;
        if let Some(error) = chunk.get("error") {
            return Err(api_error(&self.provider, None, None, error));
        }
        if let Some(u) = chunk.get("usageMetadata") {
            self.usage = usage(u);
        }
        let candidate = chunk.get("candidates").and_then(|c| c.get(0));
        if candidate.is_none() {
            if let Some(reason) = chunk
                .get("promptFeedback")
                .and_then(|f| f.get("blockReason"))
                .and_then(Value::as_str)
            {
                return Err(LlmError::Api {
                    provider: self.provider.clone(),
                    status: 400,
                    retry_after: None,
                    error_type: Some("prompt_blocked".into()),
                    message: format!("the prompt was blocked ({reason})"),
                });
            }
        }
        let mut out = Vec::new();
        let Some(candidate) = candidate else {
            return Ok(out);
        };
        let parts = candidate
            .get("content")
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for part in parts {
            if let Some(call) = part.get("functionCall") {
                let name = call
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                self.next_call += 1;
                let id = call
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty())
                    .map_or_else(|| format!("call_{}", self.next_call), str::to_string);
                let input = match call.get("args") {
                    Some(args) if args.is_object() => args.clone(),
                    _ => json!({}),
                };
                out.push(StreamEvent::ToolUseStarted {
                    id: id.clone(),
                    name: name.clone(),
                });
                self.content.push(Block::ToolUse { id, name, input });
            } else if let Some(text) = part.get("text").and_then(Value::as_str) {
                if text.is_empty() {
                    continue;
                }
                if part.get("thought").and_then(Value::as_bool) == Some(true) {
                    match self.content.last_mut() {
                        Some(Block::Thinking { thinking, .. }) => thinking.push_str(text),
                        _ => self.content.push(Block::Thinking {
                            thinking: text.to_string(),
                            signature: None,
                        }),
                    }
                    out.push(StreamEvent::ThinkingDelta(text.to_string()));
                } else {
                    match self.content.last_mut() {
                        Some(Block::Text { text: acc }) => acc.push_str(text),
                        _ => self.content.push(Block::Text {
                            text: text.to_string(),
                        }),
                    }
                    out.push(StreamEvent::TextDelta(text.to_string()));
                }
            }
        }
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
        Ok(out)
    }

    /// The stream ended: the response when a `finishReason` was seen, else `None`
    /// (truncated).
    fn finish(&mut self) -> Option<ModelResponse> {
        let reason = self.finish_reason.take()?;
        let has_calls = self
            .content
            .iter()
            .any(|b| matches!(b, Block::ToolUse { .. }));
        let stop_reason = match reason.as_str() {
            "STOP" if has_calls => StopReason::ToolUse,
            "STOP" => StopReason::EndTurn,
            "MAX_TOKENS" => StopReason::MaxTokens,
            other => StopReason::Other(other.to_string()),
        };
        Some(ModelResponse {
            content: std::mem::take(&mut self.content),
            stop_reason,
            usage: self.usage,
        })
    }
}

impl SseDecoder for GeminiParser {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        out.extend(self.feed(data)?);
        Ok(())
    }

    /// Gemini has no completion event: the body ending after a `finishReason` is one.
    fn end_of_stream(&mut self) -> Result<Option<ModelResponse>, LlmError> {
        Ok(self.finish())
    }
}

/// `usageMetadata` (cumulative; the last chunk's wins). `promptTokenCount` includes
/// cached tokens and `thoughtsTokenCount` is billed as output: split and summed so the
/// fields mean the same as Anthropic's.
fn usage(u: &Value) -> Usage {
    let n = |key: &str| u.get(key).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("promptTokenCount");
    let cached = n("cachedContentTokenCount");
    Usage {
        input_tokens: prompt.saturating_sub(cached),
        output_tokens: n("candidatesTokenCount") + n("thoughtsTokenCount"),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    }
}

#[cfg(test)]
#[path = "google_tests.rs"]
mod tests;
