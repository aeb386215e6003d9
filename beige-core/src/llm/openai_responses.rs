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
mod tests {
    use super::*;
    use crate::llm::test_support::{completed, text_deltas};
    use crate::llm::{ErrorKind, Message, ToolSpec};
    use beige_testkit::llm::{FakeLlmServer, Reply};
    use beige_testkit::openai_responses::{self as fake, ResponsesStream};
    use futures_util::StreamExt;

    const KEY: &str = "sk-test-Responses-SECRET-42";

    fn client(server: &FakeLlmServer) -> OpenAiResponsesClient {
        OpenAiResponsesClient::new(
            "openai",
            &format!("{}/v1", server.url()),
            ApiKey::new(Some(KEY.into())),
            vec![("OpenAI-Organization".into(), "org-beige".into())],
        )
        .unwrap()
    }

    fn tools() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "exec".into(),
            description: "Run a command".into(),
            input_schema: json!({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}),
        }]
    }

    fn request(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: "gpt-5-mini".into(),
            system: "You are beige.".into(),
            messages,
            tools: tools(),
            max_tokens: 4096,
            thinking: ThinkingLevel::Off,
            reasoning: false,
        }
    }

    async fn run(
        client: &OpenAiResponsesClient,
        req: ModelRequest,
    ) -> Result<Vec<Result<StreamEvent, LlmError>>, LlmError> {
        Ok(client.stream(req).await?.collect().await)
    }

    #[tokio::test]
    async fn streams_text_and_sends_a_proper_request() {
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .text("Hello, wörld! ✓")
                .piece_size(3)
                .reply()
                .chunked(7),
        );
        let events = run(&client(&server), request(vec![Message::user_text("hi")]))
            .await
            .unwrap();

        assert_eq!(text_deltas(&events), "Hello, wörld! ✓");
        assert!(
            events
                .iter()
                .filter(|e| matches!(e, Ok(StreamEvent::TextDelta(_))))
                .count()
                > 1
        );
        let resp = completed(&events);
        assert_eq!(
            resp.content,
            vec![Block::Text {
                text: "Hello, wörld! ✓".into()
            }]
        );
        assert_eq!(resp.stop_reason, StopReason::EndTurn);

        let req = server.last_request().unwrap();
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/v1/responses");
        assert_eq!(req.query, None);
        assert_eq!(
            req.header("authorization"),
            Some(format!("Bearer {KEY}").as_str())
        );
        assert_eq!(req.header("openai-organization"), Some("org-beige"));
        assert_eq!(
            req.secret_locations(KEY),
            vec!["header authorization".to_string()]
        );
        let b = &req.body;
        assert_eq!(b["model"], "gpt-5-mini");
        assert_eq!(b["instructions"], "You are beige.");
        assert_eq!(b["stream"], true);
        assert_eq!(b["store"], false);
        assert_eq!(b["max_output_tokens"], 4096);
        assert!(b.get("reasoning").is_none(), "{b}");
        assert_eq!(
            b["input"],
            json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
        );
        assert_eq!(
            b["tools"],
            json!([{"type": "function", "name": "exec", "description": "Run a command",
                    "parameters": tools()[0].input_schema, "strict": false}])
        );
    }

    #[tokio::test]
    async fn assembles_a_tool_call_from_argument_pieces() {
        let server = FakeLlmServer::start().await;
        let args = json!({"cmd": "ls -la /workspace", "timeout": 30});
        server.push(
            ResponsesStream::new()
                .function_call("call_abc", "exec", args.clone())
                .piece_size(2)
                .reply(),
        );
        let events = run(&client(&server), request(vec![Message::user_text("list")]))
            .await
            .unwrap();
        assert!(events.iter().any(|e| matches!(e, Ok(StreamEvent::ToolUseStarted { id, name }) if id == "call_abc" && name == "exec")));
        let resp = completed(&events);
        assert_eq!(
            resp.content,
            vec![Block::ToolUse {
                id: "call_abc".into(),
                name: "exec".into(),
                input: args
            }]
        );
        assert_eq!(resp.stop_reason, StopReason::ToolUse);
    }

    #[tokio::test]
    async fn two_tool_calls_and_reasoning_in_one_turn() {
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .reasoning_summary("Need two commands.")
                .text("Running both.")
                .function_call("call_1", "exec", json!({"cmd": "pwd"}))
                .function_call("call_2", "read", json!({"path": "a.txt"}))
                .reply()
                .chunked(11),
        );
        let events = run(&client(&server), request(vec![Message::user_text("go")]))
            .await
            .unwrap();
        let thinking: String = events
            .iter()
            .filter_map(|e| match e {
                Ok(StreamEvent::ThinkingDelta(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(thinking, "Need two commands.");
        let started: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                Ok(StreamEvent::ToolUseStarted { id, .. }) => Some(id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(started, ["call_1", "call_2"]);
        let resp = completed(&events);
        assert_eq!(
            resp.content,
            vec![
                Block::Thinking {
                    thinking: "Need two commands.".into(),
                    signature: None
                },
                Block::Text {
                    text: "Running both.".into()
                },
                Block::ToolUse {
                    id: "call_1".into(),
                    name: "exec".into(),
                    input: json!({"cmd": "pwd"})
                },
                Block::ToolUse {
                    id: "call_2".into(),
                    name: "read".into(),
                    input: json!({"path": "a.txt"})
                },
            ]
        );
        assert_eq!(resp.stop_reason, StopReason::ToolUse);
    }

    #[tokio::test]
    async fn usage_splits_cached_tokens() {
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .text("ok")
                .usage(1200, 80, 1024, 30)
                .reply(),
        );
        let events = run(&client(&server), request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        assert_eq!(
            completed(&events).usage,
            Usage {
                input_tokens: 176,
                output_tokens: 80,
                cache_read_tokens: 1024,
                cache_write_tokens: 0
            }
        );
    }

    #[tokio::test]
    async fn incomplete_response_is_max_tokens() {
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .text("long")
                .incomplete("max_output_tokens")
                .reply(),
        );
        let events = run(&client(&server), request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        assert_eq!(completed(&events).stop_reason, StopReason::MaxTokens);
    }

    #[tokio::test]
    async fn error_event_mid_stream_is_typed() {
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .text("partial answer")
                .error("rate_limit_exceeded", "Rate limit reached for gpt-5-mini")
                .reply(),
        );
        let events = run(&client(&server), request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        assert_eq!(text_deltas(&events), "partial answer");
        let err = events.last().unwrap().as_ref().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RateLimit);
        match err {
            LlmError::Api {
                error_type,
                message,
                ..
            } => {
                assert_eq!(error_type.as_deref(), Some("rate_limit_exceeded"));
                assert_eq!(message, "Rate limit reached for gpt-5-mini");
            }
            other => panic!("{other:?}"),
        }
        assert!(!events
            .iter()
            .any(|e| matches!(e, Ok(StreamEvent::Completed(_)))));

        server.push(
            ResponsesStream::new()
                .text("x")
                .failed("server_error", "The server had an error")
                .reply(),
        );
        let events = run(&client(&server), request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        let err = events.last().unwrap().as_ref().unwrap_err();
        assert!(
            matches!(err, LlmError::Api { error_type: Some(t), .. } if t == "server_error"),
            "{err:?}"
        );
        assert_eq!(err.kind(), ErrorKind::Other);
    }

    #[tokio::test]
    async fn cut_stream_is_truncated_and_not_retried() {
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .text("half an answer")
                .without_completion()
                .reply()
                .cut(),
        );
        server.push(fake::text_response("must never be fetched"));
        let events = run(&client(&server), request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        assert!(
            matches!(events.last(), Some(Err(LlmError::Truncated { .. }))),
            "{events:?}"
        );
        assert_eq!(events.iter().filter(|e| e.is_err()).count(), 1);
        assert_eq!(server.request_count(), 1);
        assert_eq!(server.replies_left(), 1);

        // A body that ends cleanly without `response.completed` is cut off too.
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .text("half")
                .without_completion()
                .reply(),
        );
        let events = run(&client(&server), request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        assert!(
            matches!(events.last(), Some(Err(LlmError::Truncated { .. }))),
            "{events:?}"
        );
        assert_eq!(server.request_count(), 1);
    }

    #[tokio::test]
    async fn http_429_is_a_rate_limit_with_retry_after() {
        let server = FakeLlmServer::start().await;
        server.push(
            fake::error_reply(
                429,
                "requests",
                Some("rate_limit_exceeded"),
                "Rate limit reached",
            )
            .header("retry-after", "7"),
        );
        let err = client(&server)
            .stream(request(vec![Message::user_text("hi")]))
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::RateLimit);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
        assert!(matches!(&err, LlmError::Api { status: 429, .. }), "{err:?}");
        assert_eq!(server.request_count(), 1);
    }

    #[tokio::test]
    async fn http_503_is_overloaded() {
        let server = FakeLlmServer::start().await;
        server.push(fake::error_reply(
            503,
            "server_error",
            None,
            "The engine is currently overloaded",
        ));
        let err = client(&server)
            .stream(request(vec![Message::user_text("hi")]))
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::Overloaded);
        assert_eq!(server.request_count(), 1);
    }

    #[tokio::test]
    async fn idle_stream_times_out() {
        let server = FakeLlmServer::start().await;
        server.push(
            ResponsesStream::new()
                .text("slow")
                .without_completion()
                .reply()
                .hang_after(),
        );
        let client = client(&server).with_idle_timeout(Duration::from_millis(300));
        let events = run(&client, request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        assert_eq!(text_deltas(&events), "slow");
        let err = events.last().unwrap().as_ref().unwrap_err();
        assert!(matches!(err, LlmError::IdleTimeout { .. }), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::Timeout);

        // No response head at all.
        server.push(Reply::hang());
        let err = client
            .stream(request(vec![Message::user_text("hi")]))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, LlmError::IdleTimeout { .. }), "{err:?}");
        assert_eq!(server.request_count(), 2);
    }

    #[tokio::test]
    async fn history_pairs_tool_results_with_calls() {
        let server = FakeLlmServer::start().await;
        server.check(|r| fake::check_tool_pairing(&r.body));
        server.push(fake::text_response("done"));
        let history = vec![
            Message {
                role: Role::User,
                content: vec![
                    Block::Text {
                        text: "look".into(),
                    },
                    Block::Image {
                        data: "iVBORw0KGgo=".into(),
                        mime_type: "image/png".into(),
                    },
                ],
            },
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::Thinking {
                        thinking: "hmm".into(),
                        signature: Some("sig".into()),
                    },
                    Block::Text {
                        text: "Checking.".into(),
                    },
                    Block::ToolUse {
                        id: "call_1".into(),
                        name: "exec".into(),
                        input: json!({"cmd": "pwd"}),
                    },
                    Block::ToolUse {
                        id: "call_2".into(),
                        name: "screenshot".into(),
                        input: json!({}),
                    },
                ],
            },
            Message {
                role: Role::User,
                content: vec![
                    Block::ToolResult {
                        tool_use_id: "call_1".into(),
                        content: vec![ToolResultPart::Text {
                            text: "/workspace".into(),
                        }],
                        is_error: false,
                    },
                    Block::ToolResult {
                        tool_use_id: "call_2".into(),
                        content: vec![
                            ToolResultPart::Text {
                                text: "captured".into(),
                            },
                            ToolResultPart::Image {
                                data: "R0lGOD==".into(),
                                mime_type: "image/gif".into(),
                            },
                        ],
                        is_error: false,
                    },
                ],
            },
        ];
        let mut req = request(history);
        req.reasoning = true;
        req.thinking = ThinkingLevel::High;
        let events = run(&client(&server), req).await.unwrap();
        assert_eq!(
            completed(&events).content,
            vec![Block::Text {
                text: "done".into()
            }]
        );
        assert_eq!(server.violations(), Vec::<String>::new());

        let body = server.last_request().unwrap().body;
        assert_eq!(body["reasoning"], json!({"effort": "high"}));
        assert_eq!(
            body["input"],
            json!([
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "exec", "arguments": "{\"cmd\":\"pwd\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "screenshot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "/workspace"},
                {"type": "function_call_output", "call_id": "call_2", "output": "captured"},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_image", "image_url": "data:image/gif;base64,R0lGOD=="}]}
            ])
        );
    }

    #[test]
    fn thinking_off_or_unsupported_sends_no_reasoning() {
        let mut req = request(vec![Message::user_text("hi")]);
        req.thinking = ThinkingLevel::High;
        assert!(request_body(&req).get("reasoning").is_none());
        req.reasoning = true;
        req.thinking = ThinkingLevel::Off;
        assert!(request_body(&req).get("reasoning").is_none());
        req.thinking = ThinkingLevel::Minimal;
        assert_eq!(
            request_body(&req)["reasoning"],
            json!({"effort": "minimal"})
        );
    }

    #[tokio::test]
    async fn key_stays_out_of_errors_and_debug() {
        let server = FakeLlmServer::start().await;
        server.push(fake::error_reply(
            401,
            "invalid_request_error",
            Some("invalid_api_key"),
            &format!("Incorrect API key provided: {KEY}"),
        ));
        let client = client(&server);
        let err = client
            .stream(request(vec![Message::user_text("hi")]))
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::Auth);
        assert!(!err.to_string().contains(KEY), "{err}");
        assert!(!format!("{err:?}").contains(KEY), "{err:?}");
        assert!(!format!("{client:?}").contains(KEY));
        assert!(!format!("{client:?}").contains("org-beige"));
    }

    #[tokio::test]
    async fn no_key_no_authorization_header() {
        let server = FakeLlmServer::start().await;
        server.push(fake::text_response("local"));
        let client =
            OpenAiResponsesClient::new("vllm", &server.url(), ApiKey::new(None), vec![]).unwrap();
        let events = run(&client, request(vec![Message::user_text("hi")]))
            .await
            .unwrap();
        assert_eq!(text_deltas(&events), "local");
        let req = server.last_request().unwrap();
        assert_eq!(req.path, "/responses");
        assert_eq!(req.header("authorization"), None);
    }
}
