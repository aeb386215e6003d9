//! The Anthropic Messages API client (`anthropic-messages`): builds `POST {base}/v1/messages`
//! with `stream: true` from the provider-neutral [`ModelRequest`] (text, base64 images,
//! thinking blocks sent back with their signatures, `tool_use` / `tool_result`, tools,
//! `thinking.budget_tokens` from the thinking level) and decodes the documented event
//! stream (`message_start`, `content_block_*`, `message_delta`, `message_stop`, `ping`,
//! `error`) into [`StreamEvent`]s. The key travels only in `x-api-key`; a stream that ends
//! without `message_stop` is [`LlmError::Truncated`]; nothing is ever retried here.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Event;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::{json, Value};

use super::sse::{self, SseDecoder};
use super::{
    ApiKey, Block, EventStream, LlmError, LlmProvider, Message, ModelRequest, ModelResponse, Role,
    StopReason, StreamEvent, ToolResultPart, Usage,
};
use crate::config::ThinkingLevel;

/// The API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A client of one Anthropic-compatible provider.
pub struct AnthropicClient {
    ep: sse::Endpoint,
}

impl std::fmt::Debug for AnthropicClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AnthropicClient").field(&self.ep).finish()
    }
}

impl AnthropicClient {
    /// A client for provider `name` at `base_url` (e.g. `https://api.anthropic.com`), with
    /// extra request headers from the config.
    pub fn new(
        name: &str,
        base_url: &str,
        api_key: ApiKey,
        headers: Vec<(String, String)>,
    ) -> Result<Self, LlmError> {
        let mut ep = sse::Endpoint::new(name, base_url, api_key, &headers)?;
        ep.headers.insert(
            "anthropic-version",
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        ep.headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(key) = ep.api_key.expose() {
            let value = sse::secret_header(name, key)?;
            ep.headers.insert("x-api-key", value);
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
impl LlmProvider for AnthropicClient {
    fn name(&self) -> &str {
        &self.ep.name
    }

    async fn stream(&self, request: ModelRequest) -> Result<EventStream, LlmError> {
        let body = request_body(&request);
        let req = self
            .ep
            .http
            .post(format!("{}/v1/messages", self.ep.base_url))
            .headers(self.ep.headers.clone())
            .body(body.to_string());
        let resp = sse::send(&self.ep.name, req, self.ep.idle)
            .await
            .map_err(|e| sse::redact(e, &self.ep.api_key))?;
        let decoder = Decoder::new(&self.ep.name);
        let stream = sse::decode_stream(&self.ep.name, resp, self.ep.idle, decoder);
        Ok(sse::redact_stream(stream, &self.ep.api_key))
    }
}

/// `thinking.budget_tokens` for a level (`None` = thinking off).
fn thinking_budget(level: ThinkingLevel) -> Option<u32> {
    match level {
        ThinkingLevel::Off => None,
        ThinkingLevel::Minimal => Some(1024),
        ThinkingLevel::Low => Some(2048),
        ThinkingLevel::Medium => Some(8192),
        ThinkingLevel::High => Some(16384),
    }
}

/// The JSON body of a Messages request.
pub(crate) fn request_body(request: &ModelRequest) -> Value {
    let mut max_tokens = request.max_tokens.max(1);
    let budget = if request.reasoning {
        thinking_budget(request.thinking)
    } else {
        None
    };
    let mut body = json!({
        "model": request.model,
        "max_tokens": max_tokens,
        "messages": request.messages.iter().map(message_json).collect::<Vec<_>>(),
        "stream": true,
    });
    if !request.system.is_empty() {
        body["system"] = json!(request.system);
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({"name": t.name, "description": t.description, "input_schema": t.input_schema})
            })
            .collect();
    }
    if let Some(budget) = budget {
        // max_tokens counts the thinking too, and must exceed the budget.
        if max_tokens <= budget {
            max_tokens = max_tokens.saturating_add(budget);
            body["max_tokens"] = json!(max_tokens);
        }
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    }
    body
}

fn image_json(data: &str, mime_type: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": mime_type, "data": data}})
}

fn message_json(m: &Message) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let mut content: Vec<Value> = Vec::new();
    // The API wants a user message's tool results before anything else in it.
    let (results, rest): (Vec<&Block>, Vec<&Block>) = m
        .content
        .iter()
        .partition(|b| matches!(b, Block::ToolResult { .. }));
    for b in results.into_iter().chain(rest) {
        match b {
            Block::Text { text } => {
                // Empty text blocks are rejected by the API.
                if !text.is_empty() {
                    content.push(json!({"type": "text", "text": text}));
                }
            }
            Block::Image { data, mime_type } => content.push(image_json(data, mime_type)),
            Block::Thinking {
                thinking,
                signature,
            } => {
                // Only signed thinking (produced by Anthropic) can be sent back.
                if let Some(sig) = signature {
                    content
                        .push(json!({"type": "thinking", "thinking": thinking, "signature": sig}));
                }
            }
            Block::ToolUse { id, name, input } => {
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            }
            Block::ToolResult {
                tool_use_id,
                content: parts,
                is_error,
            } => {
                let parts: Vec<Value> = parts
                    .iter()
                    .map(|p| match p {
                        ToolResultPart::Text { text } => json!({"type": "text", "text": text}),
                        ToolResultPart::Image { data, mime_type } => image_json(data, mime_type),
                    })
                    .filter(|p| p.get("text").and_then(Value::as_str) != Some(""))
                    .collect();
                let mut r =
                    json!({"type": "tool_result", "tool_use_id": tool_use_id, "content": parts});
                if *is_error {
                    r["is_error"] = json!(true);
                }
                content.push(r);
            }
        }
    }
    json!({"role": role, "content": content})
}

// ---- the event stream ----

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: usize,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: WireDelta,
    },
    ContentBlockStop {},
    MessageDelta {
        delta: WireMessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Deserialize)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireError {
    #[serde(rename = "type", default)]
    error_type: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// The HTTP status Anthropic uses for an error type (for errors that arrive as events).
fn status_of(error_type: &str) -> u16 {
    match error_type {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    }
}

#[derive(Debug)]
enum Partial {
    Text(String),
    Thinking {
        thinking: String,
        signature: Option<String>,
    },
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    /// A block type this client does not keep (e.g. `redacted_thinking`).
    Skipped,
}

/// Decodes one Messages stream.
struct Decoder {
    provider: String,
    blocks: BTreeMap<usize, Partial>,
    usage: Usage,
    stop_reason: Option<String>,
}

impl Decoder {
    fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_string(),
            blocks: BTreeMap::new(),
            usage: Usage::default(),
            stop_reason: None,
        }
    }

    fn add_usage(&mut self, u: &WireUsage) {
        if let Some(n) = u.input_tokens {
            self.usage.input_tokens = n;
        }
        if let Some(n) = u.output_tokens {
            self.usage.output_tokens = n;
        }
        if let Some(n) = u.cache_creation_input_tokens {
            self.usage.cache_write_tokens = n;
        }
        if let Some(n) = u.cache_read_input_tokens {
            self.usage.cache_read_tokens = n;
        }
    }

    fn decode_error(&self, message: String) -> LlmError {
        LlmError::Decode {
            provider: self.provider.clone(),
            message,
        }
    }

    fn finish(&mut self) -> Result<ModelResponse, LlmError> {
        let mut content = Vec::new();
        for (index, block) in std::mem::take(&mut self.blocks) {
            match block {
                Partial::Text(text) => content.push(Block::Text { text }),
                Partial::Thinking {
                    thinking,
                    signature,
                } => content.push(Block::Thinking {
                    thinking,
                    signature,
                }),
                Partial::ToolUse { id, name, json } => {
                    let input = if json.trim().is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str(&json).map_err(|e| {
                            self.decode_error(format!(
                                "tool call {name} (block {index}) has invalid JSON input: {e}"
                            ))
                        })?
                    };
                    content.push(Block::ToolUse { id, name, input });
                }
                Partial::Skipped => {}
            }
        }
        let stop_reason = match self.stop_reason.as_deref() {
            Some("end_turn") | Some("stop_sequence") | None => {
                if content.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
                    StopReason::ToolUse
                } else {
                    StopReason::EndTurn
                }
            }
            Some("tool_use") => StopReason::ToolUse,
            Some("max_tokens") => StopReason::MaxTokens,
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
        let wire: WireEvent = sse::decode(&self.provider, &event.data)?;
        match wire {
            WireEvent::MessageStart { message } => {
                if let Some(u) = &message.usage {
                    self.add_usage(u);
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => {
                let partial = match content_block {
                    WireBlock::Text { text } => {
                        if !text.is_empty() {
                            out.push(StreamEvent::TextDelta(text.clone()));
                        }
                        Partial::Text(text)
                    }
                    WireBlock::Thinking {
                        thinking,
                        signature,
                    } => {
                        if !thinking.is_empty() {
                            out.push(StreamEvent::ThinkingDelta(thinking.clone()));
                        }
                        Partial::Thinking {
                            thinking,
                            signature,
                        }
                    }
                    WireBlock::ToolUse { id, name } => {
                        out.push(StreamEvent::ToolUseStarted {
                            id: id.clone(),
                            name: name.clone(),
                        });
                        Partial::ToolUse {
                            id,
                            name,
                            json: String::new(),
                        }
                    }
                    WireBlock::Unknown => Partial::Skipped,
                };
                self.blocks.insert(index, partial);
            }
            WireEvent::ContentBlockDelta { index, delta } => {
                let Some(block) = self.blocks.get_mut(&index) else {
                    return Err(self.decode_error(format!("delta for unknown block {index}")));
                };
                match (block, delta) {
                    (Partial::Text(text), WireDelta::TextDelta { text: d }) => {
                        text.push_str(&d);
                        out.push(StreamEvent::TextDelta(d));
                    }
                    (
                        Partial::Thinking { thinking, .. },
                        WireDelta::ThinkingDelta { thinking: d },
                    ) => {
                        thinking.push_str(&d);
                        out.push(StreamEvent::ThinkingDelta(d));
                    }
                    (
                        Partial::Thinking { signature, .. },
                        WireDelta::SignatureDelta { signature: s },
                    ) => {
                        signature.get_or_insert_with(String::new).push_str(&s);
                    }
                    (Partial::ToolUse { json, .. }, WireDelta::InputJsonDelta { partial_json }) => {
                        json.push_str(&partial_json);
                    }
                    (Partial::Skipped, _) | (_, WireDelta::Unknown) => {}
                    (_, other) => {
                        return Err(self
                            .decode_error(format!("delta {other:?} does not fit block {index}")));
                    }
                }
            }
            WireEvent::ContentBlockStop {} | WireEvent::Ping | WireEvent::Unknown => {}
            WireEvent::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    self.stop_reason = delta.stop_reason;
                }
                if let Some(u) = &usage {
                    self.add_usage(u);
                }
            }
            WireEvent::MessageStop => {
                let response = self.finish()?;
                out.push(StreamEvent::Completed(response));
            }
            WireEvent::Error { error } => {
                let status = error.error_type.as_deref().map(status_of).unwrap_or(500);
                return Err(LlmError::Api {
                    provider: self.provider.clone(),
                    status,
                    retry_after: None,
                    error_type: error.error_type,
                    message: error.message.unwrap_or_else(|| "error event".to_string()),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
