//! The OpenAI Chat Completions client (`openai-completions`, also spoken by Groq, Ollama,
//! vLLM and other compatible servers): builds `POST {base}/chat/completions` with
//! `stream: true` and `stream_options.include_usage` from the provider-neutral
//! [`ModelRequest`], and decodes the chunk stream (`choices[0].delta` text, reasoning and
//! partial `tool_calls` assembled by `index`, `finish_reason`, the usage chunk, `[DONE]`)
//! into [`StreamEvent`]s. Tool results become `role: tool` messages; images inside tool
//! results (which `role: tool` cannot carry) follow in one user message. Thinking blocks
//! are never sent. The key travels only in `Authorization: Bearer` (omitted without a
//! key); a stream without `[DONE]` is [`LlmError::Truncated`]; nothing is retried here.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Event;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::{json, Value};

use super::sse::{self, SseDecoder};
use super::{
    ApiKey, Block, EventStream, LlmError, LlmProvider, Message, ModelRequest, ModelResponse, Role,
    StopReason, StreamEvent, ToolResultPart, Usage,
};
use crate::config::ThinkingLevel;

/// A client of one Chat-Completions-compatible provider.
pub struct OpenAiCompletionsClient {
    ep: sse::Endpoint,
}

impl std::fmt::Debug for OpenAiCompletionsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OpenAiCompletionsClient")
            .field(&self.ep)
            .finish()
    }
}

impl OpenAiCompletionsClient {
    /// A client for provider `name` at `base_url` (e.g. `https://api.openai.com/v1`, or
    /// `http://localhost:11434/v1` for Ollama), with extra request headers from the config.
    pub fn new(
        name: &str,
        base_url: &str,
        api_key: ApiKey,
        headers: Vec<(String, String)>,
    ) -> Result<Self, LlmError> {
        let mut ep = sse::Endpoint::new(name, base_url, api_key, &headers)?;
        ep.headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(key) = ep.api_key.expose() {
            let value = sse::secret_header(name, &format!("Bearer {key}"))?;
            ep.headers.insert(AUTHORIZATION, value);
        }
        Ok(Self { ep })
    }

    /// Abandon a stream when no event arrives for this long (default 120 s).
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.ep.idle = idle;
        self
    }
}

#[async_trait]
impl LlmProvider for OpenAiCompletionsClient {
    fn name(&self) -> &str {
        &self.ep.name
    }

    async fn stream(&self, request: ModelRequest) -> Result<EventStream, LlmError> {
        let body = request_body(&request);
        let req = self
            .ep
            .http
            .post(format!("{}/chat/completions", self.ep.base_url))
            .headers(self.ep.headers.clone())
            .body(body.to_string());
        let resp = sse::send(&self.ep.name, req, self.ep.idle)
            .await
            .map_err(|e| sse::redact(e, &self.ep.api_key))?;
        let stream = sse::decode_stream(
            &self.ep.name,
            resp,
            self.ep.idle,
            Decoder::new(&self.ep.name),
        );
        Ok(sse::redact_stream(stream, &self.ep.api_key))
    }
}

/// `reasoning_effort` for a level (`None` = off). `minimal` maps to `low`, which every
/// reasoning model accepts.
fn reasoning_effort(level: ThinkingLevel) -> Option<&'static str> {
    match level {
        ThinkingLevel::Off => None,
        ThinkingLevel::Minimal | ThinkingLevel::Low => Some("low"),
        ThinkingLevel::Medium => Some("medium"),
        ThinkingLevel::High => Some("high"),
    }
}

/// The JSON body of a Chat Completions request.
pub(crate) fn request_body(request: &ModelRequest) -> Value {
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for m in &request.messages {
        push_message(&mut messages, m);
    }
    let mut body = json!({
        "model": request.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_completion_tokens": request.max_tokens.max(1),
    });
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema
                }})
            })
            .collect();
    }
    if request.reasoning {
        if let Some(effort) = reasoning_effort(request.thinking) {
            body["reasoning_effort"] = json!(effort);
        }
    }
    body
}

fn image_part(data: &str, mime_type: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": format!("data:{mime_type};base64,{data}")}})
}

/// User content: a plain string for a single text, else an array of parts.
fn user_content(parts: Vec<Value>) -> Value {
    match parts.as_slice() {
        [one] if one["type"] == "text" => one["text"].clone(),
        _ => Value::Array(parts),
    }
}

fn push_message(out: &mut Vec<Value>, m: &Message) {
    match m.role {
        Role::Assistant => {
            let text: String = m
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            let calls: Vec<Value> = m
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => Some(json!({
                        "id": id, "type": "function",
                        "function": {"name": name, "arguments": input.to_string()}
                    })),
                    _ => None,
                })
                .collect();
            let mut msg = json!({"role": "assistant"});
            msg["content"] = if text.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                json!(text)
            };
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
        Role::User => {
            // Tool results first (they must follow the assistant's tool calls), then the
            // images they returned, then the user's own content.
            let mut result_images: Vec<Value> = Vec::new();
            let mut own: Vec<Value> = Vec::new();
            for b in &m.content {
                match b {
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    } => {
                        let mut texts: Vec<String> = Vec::new();
                        let mut images = Vec::new();
                        for p in content {
                            match p {
                                ToolResultPart::Text { text } => texts.push(text.clone()),
                                ToolResultPart::Image { data, mime_type } => {
                                    texts.push(format!(
                                        "[image {mime_type}: sent in the next user message]"
                                    ));
                                    images.push(image_part(data, mime_type));
                                }
                            }
                        }
                        let mut text = texts.join("\n");
                        if *is_error {
                            text = format!("[error] {text}");
                        }
                        out.push(
                            json!({"role": "tool", "tool_call_id": tool_use_id, "content": text}),
                        );
                        if !images.is_empty() {
                            result_images.push(json!({"type": "text",
                                "text": format!("Images returned by tool call {tool_use_id}:")}));
                            result_images.extend(images);
                        }
                    }
                    Block::Text { text } if !text.is_empty() => {
                        own.push(json!({"type": "text", "text": text}));
                    }
                    Block::Image { data, mime_type } => own.push(image_part(data, mime_type)),
                    _ => {}
                }
            }
            if !result_images.is_empty() {
                out.push(json!({"role": "user", "content": result_images}));
            }
            let only_results = own.is_empty()
                && m.content
                    .iter()
                    .any(|b| matches!(b, Block::ToolResult { .. }));
            if !only_results {
                out.push(json!({"role": "user", "content": user_content(own)}));
            }
        }
    }
}

// ---- the chunk stream ----

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
    announced: bool,
}

/// Decodes one Chat Completions stream.
struct Decoder {
    provider: String,
    text: String,
    reasoning: String,
    calls: BTreeMap<u32, PartialCall>,
    finish_reason: Option<String>,
    usage: Usage,
}

impl Decoder {
    fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_string(),
            text: String::new(),
            reasoning: String::new(),
            calls: BTreeMap::new(),
            finish_reason: None,
            usage: Usage::default(),
        }
    }

    fn stream_error(&self, error: &Value) -> LlmError {
        let (error_type, message) = sse::parse_error_value(&json!({ "error": error }));
        let err = error.get("error").unwrap_or(error);
        let numeric = err
            .get("code")
            .and_then(|c| {
                c.as_u64()
                    .or_else(|| c.as_str().and_then(|s| s.parse().ok()))
            })
            .filter(|c| (400..600).contains(c));
        let code = err.get("code").and_then(Value::as_str);
        let kind_of = |t: Option<&str>| match t {
            Some("rate_limit_exceeded" | "rate_limit_error" | "insufficient_quota") => Some(429),
            Some("context_length_exceeded" | "invalid_request_error") => Some(400),
            Some("overloaded_error" | "overloaded" | "service_unavailable") => Some(503),
            _ => None,
        };
        let status = match numeric {
            Some(c) => u16::try_from(c).unwrap_or(500),
            None => kind_of(code)
                .or_else(|| kind_of(error_type.as_deref()))
                .unwrap_or(500),
        };
        LlmError::Api {
            provider: self.provider.clone(),
            status,
            retry_after: None,
            error_type,
            message: message.unwrap_or_else(|| "error in the stream".to_string()),
        }
    }

    fn finish(&mut self) -> Result<ModelResponse, LlmError> {
        let mut content = Vec::new();
        if !self.reasoning.is_empty() {
            content.push(Block::Thinking {
                thinking: std::mem::take(&mut self.reasoning),
                signature: None,
            });
        }
        if !self.text.is_empty() {
            content.push(Block::Text {
                text: std::mem::take(&mut self.text),
            });
        }
        for (index, call) in std::mem::take(&mut self.calls) {
            let input = if call.arguments.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&call.arguments).map_err(|e| LlmError::Decode {
                    provider: self.provider.clone(),
                    message: format!(
                        "tool call {} (index {index}) has invalid JSON arguments: {e}",
                        call.name
                    ),
                })?
            };
            let id = if call.id.is_empty() {
                format!("call_{index}")
            } else {
                call.id
            };
            content.push(Block::ToolUse {
                id,
                name: call.name,
                input,
            });
        }
        let has_calls = content.iter().any(|b| matches!(b, Block::ToolUse { .. }));
        let stop_reason = match self.finish_reason.as_deref() {
            _ if has_calls => StopReason::ToolUse,
            Some("stop") | None => StopReason::EndTurn,
            Some("length") => StopReason::MaxTokens,
            Some("tool_calls" | "function_call") => StopReason::ToolUse,
            Some(other) => StopReason::Other(other.to_string()),
        };
        Ok(ModelResponse {
            content,
            stop_reason,
            usage: self.usage,
        })
    }
}

impl SseDecoder for Decoder {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        if event.data.trim() == "[DONE]" {
            let response = self.finish()?;
            out.push(StreamEvent::Completed(response));
            return Ok(());
        }
        let chunk: Chunk = sse::decode(&self.provider, &event.data)?;
        if let Some(error) = chunk.error.as_ref().filter(|e| !e.is_null()) {
            return Err(self.stream_error(error));
        }
        if let Some(u) = &chunk.usage {
            let cached = u
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0);
            let prompt = u.prompt_tokens.unwrap_or(0);
            self.usage.input_tokens = prompt.saturating_sub(cached);
            self.usage.cache_read_tokens = cached;
            self.usage.output_tokens = u.completion_tokens.unwrap_or(0);
        }
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            for r in [delta.reasoning_content, delta.reasoning]
                .into_iter()
                .flatten()
            {
                if !r.is_empty() {
                    self.reasoning.push_str(&r);
                    out.push(StreamEvent::ThinkingDelta(r));
                }
            }
            if let Some(t) = delta.content.filter(|t| !t.is_empty()) {
                self.text.push_str(&t);
                out.push(StreamEvent::TextDelta(t));
            }
            for (pos, tc) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                let index = tc.index.unwrap_or(u32::try_from(pos).unwrap_or(u32::MAX));
                let call = self.calls.entry(index).or_default();
                if let Some(id) = tc.id.filter(|s| !s.is_empty()) {
                    call.id = id;
                }
                if let Some(f) = tc.function {
                    if let Some(name) = f.name.filter(|s| !s.is_empty()) {
                        call.name.push_str(&name);
                    }
                    if let Some(args) = f.arguments {
                        call.arguments.push_str(&args);
                    }
                }
                if !call.announced && !call.name.is_empty() {
                    call.announced = true;
                    let id = if call.id.is_empty() {
                        format!("call_{index}")
                    } else {
                        call.id.clone()
                    };
                    out.push(StreamEvent::ToolUseStarted {
                        id,
                        name: call.name.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "openai_completions_tests.rs"]
mod tests;
