//! The `openai-responses` wire format: `POST {base}/responses` with `stream: true`,
//! answered by typed `response.*` SSE events. This module owns the translation between
//! the provider-neutral [`ModelRequest`]/[`StreamEvent`] types and that API (input items,
//! `function_call`/`function_call_output` pairing, argument assembly by item id, usage);
//! the HTTP/SSE plumbing (sending, idle timeout, error bodies) comes from the shared
//! `sse` module, and nothing here knows about sessions, fallback or tool execution.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Event;
use reqwest::header::{ACCEPT, AUTHORIZATION};
use serde_json::{json, Map, Value};

use crate::config::ThinkingLevel;

use super::sse::{self, SseDecoder};
use super::{
    ApiKey, Block, EventStream, LlmError, LlmProvider, ModelRequest, ModelResponse, Role,
    StopReason, StreamEvent, ToolResultPart, Usage,
};

/// A client of one provider speaking the OpenAI Responses API.
pub struct OpenAiResponsesClient {
    ep: sse::Endpoint,
}

impl std::fmt::Debug for OpenAiResponsesClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OpenAiResponsesClient")
            .field(&self.ep)
            .finish()
    }
}

impl OpenAiResponsesClient {
    /// A client for provider `name` at `base_url` (e.g. `https://api.openai.com/v1`).
    /// Without a key no `Authorization` header is sent. `headers` are sent with every
    /// request and override the client's own.
    pub fn new(
        name: &str,
        base_url: &str,
        api_key: ApiKey,
        headers: Vec<(String, String)>,
    ) -> Result<Self, LlmError> {
        Ok(Self {
            ep: sse::Endpoint::new(name, base_url, api_key, &headers)?,
        })
    }

    /// Abandon a stream when no event arrives for this long (default 120 s).
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.ep.idle = idle;
        self
    }

    async fn start(&self, request: &ModelRequest) -> Result<EventStream, LlmError> {
        let mut builder = self
            .ep
            .http
            .post(format!("{}/responses", self.ep.base_url))
            .header(ACCEPT, "text/event-stream")
            .json(&request_body(request));
        if let Some(key) = self.ep.api_key.expose() {
            builder = builder.header(
                AUTHORIZATION,
                sse::secret_header(&self.ep.name, &format!("Bearer {key}"))?,
            );
        }
        let builder = builder.headers(self.ep.headers.clone());
        let response = sse::send(&self.ep.name, builder, self.ep.idle).await?;
        Ok(sse::decode_stream(
            &self.ep.name,
            response,
            self.ep.idle,
            ResponsesParser::new(&self.ep.name),
        ))
    }
}

#[async_trait]
impl LlmProvider for OpenAiResponsesClient {
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

// ---------------------------------------------------------------------------------------
// Request body
// ---------------------------------------------------------------------------------------

/// The `reasoning.effort` value of a thinking level (`None` for off).
fn effort(level: ThinkingLevel) -> Option<&'static str> {
    match level {
        ThinkingLevel::Off => None,
        ThinkingLevel::Minimal => Some("minimal"),
        ThinkingLevel::Low => Some("low"),
        ThinkingLevel::Medium => Some("medium"),
        ThinkingLevel::High => Some("high"),
    }
}

fn data_url(mime_type: &str, data: &str) -> String {
    format!("data:{mime_type};base64,{data}")
}

/// Build the JSON body of one call.
pub(crate) fn request_body(request: &ModelRequest) -> Value {
    let mut input: Vec<Value> = Vec::new();
    for message in &request.messages {
        match message.role {
            Role::User => user_items(message.content.as_slice(), &mut input),
            Role::Assistant => assistant_items(message.content.as_slice(), &mut input),
        }
    }

    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    if !request.system.is_empty() {
        body.insert("instructions".into(), json!(request.system));
    }
    body.insert("input".into(), Value::Array(input));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                    // The Responses API defaults to strict schemas, which reject any
                    // schema that is not fully closed; ours are ordinary JSON Schema.
                    "strict": false,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("stream".into(), json!(true));
    body.insert("max_output_tokens".into(), json!(request.max_tokens));
    if request.reasoning {
        if let Some(effort) = effort(request.thinking) {
            body.insert("reasoning".into(), json!({ "effort": effort }));
        }
    }
    body.insert("store".into(), json!(false));
    Value::Object(body)
}

/// User content: text and images become `message` items; each tool result becomes a
/// `function_call_output` item, in block order. Images returned by tools go in one user
/// message after the outputs (a function output is plain text).
fn user_items(blocks: &[Block], input: &mut Vec<Value>) {
    let mut parts: Vec<Value> = Vec::new();
    let mut tool_images: Vec<Value> = Vec::new();
    let flush = |parts: &mut Vec<Value>, input: &mut Vec<Value>| {
        if !parts.is_empty() {
            input.push(
                json!({ "type": "message", "role": "user", "content": std::mem::take(parts) }),
            );
        }
    };
    for block in blocks {
        match block {
            Block::Text { text } => parts.push(json!({ "type": "input_text", "text": text })),
            Block::Image { data, mime_type } => {
                parts.push(json!({ "type": "input_image", "image_url": data_url(mime_type, data) }))
            }
            Block::ToolResult {
                tool_use_id,
                content,
                ..
            } => {
                flush(&mut parts, input);
                let mut texts = Vec::new();
                for part in content {
                    match part {
                        ToolResultPart::Text { text } => texts.push(text.as_str()),
                        ToolResultPart::Image { data, mime_type } => tool_images
                            .push(json!({ "type": "input_image", "image_url": data_url(mime_type, data) })),
                    }
                }
                input.push(json!({
                    "type": "function_call_output",
                    "call_id": tool_use_id,
                    "output": texts.join("\n"),
                }));
            }
            // Thinking and tool calls do not belong in user messages.
            Block::Thinking { .. } | Block::ToolUse { .. } => {}
        }
    }
    flush(&mut parts, input);
    if !tool_images.is_empty() {
        input.push(json!({ "type": "message", "role": "user", "content": tool_images }));
    }
}

/// Assistant content: text becomes `output_text` in `message` items, each tool call a
/// `function_call` item, in block order. Reasoning is not replayed (with `store: false`
/// the API only accepts its own encrypted reasoning items).
fn assistant_items(blocks: &[Block], input: &mut Vec<Value>) {
    let mut parts: Vec<Value> = Vec::new();
    let flush = |parts: &mut Vec<Value>, input: &mut Vec<Value>| {
        if !parts.is_empty() {
            input.push(
                json!({ "type": "message", "role": "assistant", "content": std::mem::take(parts) }),
            );
        }
    };
    for block in blocks {
        match block {
            Block::Text { text } if !text.is_empty() => {
                parts.push(json!({ "type": "output_text", "text": text }))
            }
            Block::ToolUse {
                id,
                name,
                input: args,
            } => {
                flush(&mut parts, input);
                input.push(json!({
                    "type": "function_call",
                    "call_id": id,
                    "name": name,
                    "arguments": args.to_string(),
                }));
            }
            _ => {}
        }
    }
    flush(&mut parts, input);
}

// ---------------------------------------------------------------------------------------
// Stream parsing
// ---------------------------------------------------------------------------------------

/// One output item being assembled.
#[derive(Debug)]
enum Item {
    Message {
        text: String,
    },
    Reasoning {
        text: String,
    },
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
    },
    Other,
}

/// Turns the `data` of successive SSE events into [`StreamEvent`]s.
#[derive(Debug)]
pub(crate) struct ResponsesParser {
    provider: String,
    /// Output items by `output_index` (the order of the final content).
    items: BTreeMap<u64, Item>,
    /// `item_id` → `output_index`.
    ids: HashMap<String, u64>,
    done: bool,
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

impl ResponsesParser {
    pub(crate) fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_string(),
            items: BTreeMap::new(),
            ids: HashMap::new(),
            done: false,
        }
    }

    fn decode(&self, message: impl Into<String>) -> LlmError {
        LlmError::Decode {
            provider: self.provider.clone(),
            message: message.into(),
        }
    }

    /// The output index an event refers to: by `item_id` when known, else `output_index`.
    fn index_of(&self, event: &Value) -> Option<u64> {
        str_field(event, "item_id")
            .and_then(|id| self.ids.get(id).copied())
            .or_else(|| event.get("output_index").and_then(Value::as_u64))
    }

    fn item_mut(&mut self, event: &Value, make: fn() -> Item) -> &mut Item {
        let index = self
            .index_of(event)
            .unwrap_or_else(|| self.items.keys().next_back().map_or(0, |k| k + 1));
        if let Some(id) = str_field(event, "item_id") {
            self.ids.entry(id.to_string()).or_insert(index);
        }
        self.items.entry(index).or_insert_with(make)
    }

    /// Handle one event's `data`. Returns the events to yield (a `Completed` one last).
    pub(crate) fn feed(&mut self, data: &str) -> Result<Vec<StreamEvent>, LlmError> {
        if self.done {
            return Ok(Vec::new());
        }
        let event: Value = serde_json::from_str(data)
            .map_err(|e| self.decode(format!("invalid event JSON: {e}")))?;
        let kind = str_field(&event, "type").unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "response.output_item.added" => {
                let item = event.get("item").unwrap_or(&Value::Null);
                let index = event
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .unwrap_or_else(|| self.items.keys().next_back().map_or(0, |k| k + 1));
                if let Some(id) = str_field(item, "id") {
                    self.ids.insert(id.to_string(), index);
                }
                let new = match str_field(item, "type") {
                    Some("message") => Item::Message {
                        text: String::new(),
                    },
                    Some("reasoning") => Item::Reasoning {
                        text: String::new(),
                    },
                    Some("function_call") => {
                        let call_id = str_field(item, "call_id")
                            .or_else(|| str_field(item, "id"))
                            .unwrap_or_default()
                            .to_string();
                        let name = str_field(item, "name").unwrap_or_default().to_string();
                        out.push(StreamEvent::ToolUseStarted {
                            id: call_id.clone(),
                            name: name.clone(),
                        });
                        Item::FunctionCall {
                            call_id,
                            name,
                            arguments: str_field(item, "arguments").unwrap_or_default().to_string(),
                        }
                    }
                    _ => Item::Other,
                };
                self.items.insert(index, new);
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let delta = str_field(&event, "delta").unwrap_or_default().to_string();
                if let Item::Message { text } = self.item_mut(&event, || Item::Message {
                    text: String::new(),
                }) {
                    text.push_str(&delta);
                }
                if !delta.is_empty() {
                    out.push(StreamEvent::TextDelta(delta));
                }
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                let delta = str_field(&event, "delta").unwrap_or_default().to_string();
                if let Item::Reasoning { text } = self.item_mut(&event, || Item::Reasoning {
                    text: String::new(),
                }) {
                    text.push_str(&delta);
                }
                if !delta.is_empty() {
                    out.push(StreamEvent::ThinkingDelta(delta));
                }
            }
            "response.reasoning_summary_part.done" => {
                // Separate summary parts like paragraphs.
                if let Item::Reasoning { text } = self.item_mut(&event, || Item::Reasoning {
                    text: String::new(),
                }) {
                    if !text.is_empty() && !text.ends_with("\n\n") {
                        text.push_str("\n\n");
                    }
                }
            }
            "response.function_call_arguments.delta" => {
                let delta = str_field(&event, "delta").unwrap_or_default();
                if let Item::FunctionCall { arguments, .. } =
                    self.item_mut(&event, || Item::FunctionCall {
                        call_id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    })
                {
                    arguments.push_str(delta);
                }
            }
            "response.function_call_arguments.done" => {
                if let Some(full) = str_field(&event, "arguments").map(str::to_string) {
                    if let Item::FunctionCall { arguments, .. } =
                        self.item_mut(&event, || Item::FunctionCall {
                            call_id: String::new(),
                            name: String::new(),
                            arguments: String::new(),
                        })
                    {
                        *arguments = full;
                    }
                }
            }
            "response.output_item.done" => self.item_done(&event),
            "response.completed" | "response.incomplete" => {
                let response = event.get("response").unwrap_or(&Value::Null);
                let completed = self.completed(kind, response)?;
                self.done = true;
                out.push(StreamEvent::Completed(completed));
            }
            "response.failed" => {
                let response = event.get("response").unwrap_or(&Value::Null);
                let error = response.get("error").unwrap_or(&Value::Null);
                return Err(self.api_error(error));
            }
            "error" => {
                // Documented as top-level `code`/`message`; some servers nest `error`.
                let error = event
                    .get("error")
                    .filter(|e| e.is_object())
                    .unwrap_or(&event);
                return Err(self.api_error(error));
            }
            _ => {}
        }
        Ok(out)
    }

    /// `response.output_item.done` carries the final item: trust it over the deltas.
    fn item_done(&mut self, event: &Value) {
        let Some(item) = event.get("item") else {
            return;
        };
        let index = str_field(item, "id")
            .and_then(|id| self.ids.get(id).copied())
            .or_else(|| event.get("output_index").and_then(Value::as_u64));
        let Some(index) = index else { return };
        match str_field(item, "type") {
            Some("function_call") => {
                let entry = self
                    .items
                    .entry(index)
                    .or_insert_with(|| Item::FunctionCall {
                        call_id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                if let Item::FunctionCall {
                    call_id,
                    name,
                    arguments,
                } = entry
                {
                    if let Some(v) = str_field(item, "call_id") {
                        *call_id = v.to_string();
                    }
                    if let Some(v) = str_field(item, "name") {
                        *name = v.to_string();
                    }
                    if let Some(v) = str_field(item, "arguments") {
                        *arguments = v.to_string();
                    }
                }
            }
            Some("message") => {
                let full: String = item
                    .get("content")
                    .and_then(Value::as_array)
                    .map(|parts| {
                        parts
                            .iter()
                            .filter_map(|p| {
                                str_field(p, "text").or_else(|| str_field(p, "refusal"))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let entry = self.items.entry(index).or_insert_with(|| Item::Message {
                    text: String::new(),
                });
                if let Item::Message { text } = entry {
                    if text.is_empty() {
                        *text = full;
                    }
                }
            }
            _ => {}
        }
    }

    fn api_error(&self, error: &Value) -> LlmError {
        let code = str_field(error, "code")
            .or_else(|| str_field(error, "type"))
            .map(str::to_string);
        let message = str_field(error, "message")
            .unwrap_or("the response failed")
            .to_string();
        LlmError::Api {
            provider: self.provider.clone(),
            status: stream_error_status(code.as_deref()),
            retry_after: None,
            error_type: code,
            message,
        }
    }

    /// Build the final response from the assembled items and the terminal event.
    fn completed(&mut self, kind: &str, response: &Value) -> Result<ModelResponse, LlmError> {
        let mut content = Vec::new();
        for item in std::mem::take(&mut self.items).into_values() {
            match item {
                Item::Reasoning { text } if !text.is_empty() => content.push(Block::Thinking {
                    thinking: text.trim_end().to_string(),
                    signature: None,
                }),
                Item::Message { text } if !text.is_empty() => content.push(Block::Text { text }),
                Item::FunctionCall {
                    call_id,
                    name,
                    arguments,
                } => {
                    let input = if arguments.trim().is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str(&arguments).map_err(|e| {
                            self.decode(format!(
                                "arguments of tool call {call_id} ({name}) are not JSON: {e}"
                            ))
                        })?
                    };
                    content.push(Block::ToolUse {
                        id: call_id,
                        name,
                        input,
                    });
                }
                _ => {}
            }
        }
        let stop_reason = if kind == "response.incomplete" {
            match response
                .get("incomplete_details")
                .and_then(|d| str_field(d, "reason"))
            {
                Some("max_output_tokens") => StopReason::MaxTokens,
                Some(other) => StopReason::Other(other.to_string()),
                None => StopReason::Other("incomplete".into()),
            }
        } else if content.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        };
        Ok(ModelResponse {
            content,
            stop_reason,
            usage: usage(response.get("usage").unwrap_or(&Value::Null)),
        })
    }
}

impl SseDecoder for ResponsesParser {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        let data = event.data.trim();
        // Not part of this API, but some compatible servers end with it.
        if data.is_empty() || data == "[DONE]" {
            return Ok(());
        }
        out.extend(self.feed(data)?);
        Ok(())
    }
}

/// The HTTP status an error event stands for (the stream itself was a 200).
fn stream_error_status(code: Option<&str>) -> u16 {
    match code {
        Some("rate_limit_exceeded" | "insufficient_quota") => 429,
        Some("server_is_overloaded" | "slow_down") => 503,
        Some("context_length_exceeded" | "invalid_prompt" | "invalid_request_error") => 400,
        _ => 500,
    }
}

/// `usage` of a response. `input_tokens` includes cached tokens in this API; here they
/// are split like Anthropic's (`input_tokens` = uncached, `cache_read_tokens` = cached).
fn usage(u: &Value) -> Usage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let input = n(u.get("input_tokens"));
    let cached = n(u
        .get("input_tokens_details")
        .and_then(|d| d.get("cached_tokens")));
    Usage {
        input_tokens: input.saturating_sub(cached),
        output_tokens: n(u.get("output_tokens")),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    }
}

#[cfg(test)]
#[path = "openai_responses_tests.rs"]
mod tests;
