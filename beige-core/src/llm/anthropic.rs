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
mod tests {
    use super::*;
    use crate::llm::test_support::{completed, text_deltas};
    use crate::llm::{ErrorKind, ToolSpec};
    use beige_testkit::anthropic::{self as fake, MessageStream};
    use beige_testkit::llm::{FakeLlmServer, Reply};
    use futures_util::StreamExt;

    const KEY: &str = "sk-ant-test-0123456789";

    async fn server() -> FakeLlmServer {
        let s = FakeLlmServer::start().await;
        s.require_header("x-api-key", KEY)
            .require_header("anthropic-version", "2023-06-01")
            .require_header("content-type", "application/json")
            .check(|r| {
                if r.method != "POST" || r.path != "/v1/messages" {
                    return Err(format!("unexpected {} {}", r.method, r.path));
                }
                if r.body.get("stream") != Some(&json!(true)) {
                    return Err("stream is not true".into());
                }
                fake::check_tool_pairing(&r.body)
            })
            .check(|r| {
                let at = r.secret_locations(KEY);
                if at == ["header x-api-key"] {
                    Ok(())
                } else {
                    Err(format!("API key found at {at:?}"))
                }
            });
        s
    }

    fn client(s: &FakeLlmServer) -> AnthropicClient {
        AnthropicClient::new(
            "anthropic",
            &format!("{}/", s.url()),
            ApiKey::new(Some(KEY.into())),
            vec![("x-extra".into(), "1".into())],
        )
        .unwrap()
    }

    fn request(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: "claude-sonnet-4-5".into(),
            system: "You are a test.".into(),
            messages,
            tools: vec![ToolSpec {
                name: "exec".into(),
                description: "Run a command".into(),
                input_schema: json!({"type": "object", "properties": {"cmd": {"type": "string"}}}),
            }],
            max_tokens: 4096,
            thinking: ThinkingLevel::Off,
            reasoning: false,
        }
    }

    async fn collect(stream: EventStream) -> Vec<Result<StreamEvent, LlmError>> {
        stream.collect().await
    }

    #[tokio::test]
    async fn streams_text_split_at_awkward_places() {
        let s = server().await;
        let text = "Héllo, wörld — ünïcode ✓";
        let body = MessageStream::new()
            .text(text)
            .usage(25, 15)
            .cache(7, 3)
            .body();
        // Split inside "data:", inside a multi-byte character, between "\n" and "\n".
        let data_at = body.find("data:").unwrap() + 2;
        let utf8_at = body.find('é').unwrap() + 1;
        let blank_at = body.find("\n\n").unwrap() + 1;
        s.push(
            Reply::sse(body)
                .split_at(&[data_at, utf8_at, blank_at])
                .chunked(3),
        );
        let c = client(&s);
        assert!(!format!("{c:?}").contains(KEY));
        let events = collect(
            c.stream(request(vec![Message::user_text("hi")]))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(text_deltas(&events), text);
        let r = completed(&events);
        assert_eq!(r.content, vec![Block::Text { text: text.into() }]);
        assert_eq!(r.stop_reason, StopReason::EndTurn);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 25,
                output_tokens: 15,
                cache_read_tokens: 7,
                cache_write_tokens: 3
            }
        );
        assert_eq!(s.violations(), Vec::<String>::new());
        let req = s.last_request().unwrap();
        assert_eq!(req.header("x-extra"), Some("1"));
        assert_eq!(req.body["model"], "claude-sonnet-4-5");
        assert_eq!(req.body["system"], "You are a test.");
        assert_eq!(req.body["max_tokens"], 4096);
        assert_eq!(req.body["tools"][0]["name"], "exec");
        assert_eq!(req.body["tools"][0]["input_schema"]["type"], "object");
        assert!(req.body.get("thinking").is_none());
        assert_eq!(
            req.body["messages"],
            json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
        );
    }

    #[tokio::test]
    async fn tool_call_with_arguments_in_pieces() {
        let s = server().await;
        let input = json!({"cmd": "ls -la /workspace", "timeout": 30});
        s.push(
            MessageStream::new()
                .text("Let me look.")
                .tool_use("toolu_01", "exec", input.clone())
                .piece_size(3)
                .reply()
                .chunked(7),
        );
        let events = collect(
            client(&s)
                .stream(request(vec![Message::user_text("ls")]))
                .await
                .unwrap(),
        )
        .await;
        assert!(events.iter().any(|e| matches!(e,
            Ok(StreamEvent::ToolUseStarted { id, name }) if id == "toolu_01" && name == "exec")));
        let r = completed(&events);
        assert_eq!(r.stop_reason, StopReason::ToolUse);
        assert_eq!(
            r.content,
            vec![
                Block::Text {
                    text: "Let me look.".into()
                },
                Block::ToolUse {
                    id: "toolu_01".into(),
                    name: "exec".into(),
                    input
                }
            ]
        );
    }

    #[tokio::test]
    async fn two_tool_calls_then_results_are_paired() {
        let s = server().await;
        s.push(fake::tool_use_response(&[
            ("toolu_a", "exec", json!({"cmd": "date"})),
            ("toolu_b", "read", json!({"path": "/workspace/a.png"})),
        ]));
        s.push(fake::text_response("done"));
        let c = client(&s);
        let mut history = vec![Message::user_text("go")];
        let events = collect(c.stream(request(history.clone())).await.unwrap()).await;
        let r = completed(&events);
        let calls: Vec<_> = r
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(calls, ["toolu_a", "toolu_b"]);
        history.push(Message {
            role: Role::Assistant,
            content: r.content,
        });
        history.push(Message {
            role: Role::User,
            content: vec![
                Block::ToolResult {
                    tool_use_id: "toolu_a".into(),
                    content: vec![ToolResultPart::Text { text: "Mon".into() }],
                    is_error: false,
                },
                Block::ToolResult {
                    tool_use_id: "toolu_b".into(),
                    content: vec![
                        ToolResultPart::Text {
                            text: "an image".into(),
                        },
                        ToolResultPart::Image {
                            data: "iVBORw0KGgo=".into(),
                            mime_type: "image/png".into(),
                        },
                    ],
                    is_error: true,
                },
            ],
        });
        let events = collect(c.stream(request(history)).await.unwrap()).await;
        assert_eq!(
            completed(&events).content,
            vec![Block::Text {
                text: "done".into()
            }]
        );
        assert_eq!(s.violations(), Vec::<String>::new());
        let body = &s.requests()[1].body;
        assert_eq!(
            body["messages"][1]["content"][1]["input"],
            json!({"path": "/workspace/a.png"})
        );
        let results = &body["messages"][2]["content"];
        assert_eq!(
            results[0],
            json!({"type": "tool_result", "tool_use_id": "toolu_a",
            "content": [{"type": "text", "text": "Mon"}]})
        );
        assert_eq!(results[1]["is_error"], true);
        assert_eq!(
            results[1]["content"][1],
            json!({"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}})
        );
    }

    #[tokio::test]
    async fn thinking_is_streamed_kept_and_sent_back_with_signature() {
        let s = server().await;
        s.push(
            fake::thinking_response("Let me think…", "EqQBCgIYAhIM1gbcDa9GJwZA", "42").chunked(11),
        );
        s.push(fake::text_response("ok"));
        let c = client(&s);
        let mut req = request(vec![Message {
            role: Role::User,
            content: vec![
                Block::Text {
                    text: "what?".into(),
                },
                Block::Image {
                    data: "R0lGODlh".into(),
                    mime_type: "image/gif".into(),
                },
            ],
        }]);
        req.reasoning = true;
        req.thinking = ThinkingLevel::Medium;
        req.max_tokens = 4096;
        let events = collect(c.stream(req.clone()).await.unwrap()).await;
        let thinking: String = events
            .iter()
            .filter_map(|e| match e {
                Ok(StreamEvent::ThinkingDelta(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(thinking, "Let me think…");
        let r = completed(&events);
        assert_eq!(
            r.content,
            vec![
                Block::Thinking {
                    thinking: "Let me think…".into(),
                    signature: Some("EqQBCgIYAhIM1gbcDa9GJwZA".into())
                },
                Block::Text { text: "42".into() }
            ]
        );
        let first = &s.requests()[0].body;
        assert_eq!(
            first["thinking"],
            json!({"type": "enabled", "budget_tokens": 8192})
        );
        assert!(first["max_tokens"].as_u64().unwrap() > 8192);
        assert_eq!(
            first["messages"][0]["content"][1],
            json!({"type": "image",
            "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGODlh"}})
        );

        req.messages.push(Message {
            role: Role::Assistant,
            content: r.content,
        });
        req.messages.push(Message::user_text("and?"));
        collect(c.stream(req).await.unwrap()).await;
        let second = &s.requests()[1].body;
        assert_eq!(
            second["messages"][1]["content"][0],
            json!({"type": "thinking",
            "thinking": "Let me think…", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"})
        );
        assert_eq!(s.violations(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn thinking_budget_by_level_and_ignored_without_reasoning() {
        let mut req = request(vec![Message::user_text("x")]);
        req.thinking = ThinkingLevel::High;
        assert!(request_body(&req).get("thinking").is_none());
        req.reasoning = true;
        for (level, budget) in [
            (ThinkingLevel::Minimal, 1024),
            (ThinkingLevel::Low, 2048),
            (ThinkingLevel::Medium, 8192),
            (ThinkingLevel::High, 16384),
        ] {
            req.thinking = level;
            let b = request_body(&req);
            assert_eq!(b["thinking"]["budget_tokens"], budget);
            assert!(b["max_tokens"].as_u64().unwrap() > budget);
        }
        req.thinking = ThinkingLevel::Off;
        assert!(request_body(&req).get("thinking").is_none());
        // Unsigned thinking (from another provider) is not sent.
        req.messages.push(Message {
            role: Role::Assistant,
            content: vec![
                Block::Thinking {
                    thinking: "x".into(),
                    signature: None,
                },
                Block::Text { text: "y".into() },
            ],
        });
        assert_eq!(
            request_body(&req)["messages"][1]["content"],
            json!([{"type": "text", "text": "y"}])
        );
    }

    #[tokio::test]
    async fn error_event_mid_stream() {
        let s = server().await;
        s.push(
            MessageStream::new()
                .text("partial")
                .error("overloaded_error", "Overloaded")
                .reply()
                .chunked(9),
        );
        let events = collect(
            client(&s)
                .stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(text_deltas(&events), "partial");
        let Some(Err(e)) = events.last() else {
            panic!("{events:?}")
        };
        assert!(
            matches!(e, LlmError::Api { status: 529, error_type: Some(t), .. } if t == "overloaded_error"),
            "{e:?}"
        );
        assert_eq!(e.kind(), ErrorKind::Overloaded);
        assert!(!events
            .iter()
            .any(|e| matches!(e, Ok(StreamEvent::Completed(_)))));
    }

    #[tokio::test]
    async fn stream_cut_before_message_stop_is_truncated_and_not_retried() {
        for reply in [
            MessageStream::new()
                .text("half an ans")
                .without_stop()
                .reply(),
            MessageStream::new()
                .text("half an ans")
                .without_stop()
                .reply()
                .cut(),
        ] {
            let s = server().await;
            s.push(reply.chunked(16));
            s.push(fake::text_response("should never be fetched"));
            let events = collect(
                client(&s)
                    .stream(request(vec![Message::user_text("x")]))
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(text_deltas(&events), "half an ans");
            assert!(
                matches!(events.last(), Some(Err(LlmError::Truncated { .. }))),
                "{events:?}"
            );
            assert_eq!(s.request_count(), 1);
            assert_eq!(s.replies_left(), 1);
        }
    }

    #[tokio::test]
    async fn http_429_with_retry_after() {
        let s = server().await;
        s.push(
            fake::error_reply(
                429,
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            )
            .header("retry-after", "30"),
        );
        let Err(e) = client(&s)
            .stream(request(vec![Message::user_text("x")]))
            .await
        else {
            panic!()
        };
        assert!(
            matches!(&e, LlmError::Api { status: 429, retry_after: Some(d), error_type: Some(t), .. }
            if *d == Duration::from_secs(30) && t == "rate_limit_error"),
            "{e:?}"
        );
        assert_eq!(e.kind(), ErrorKind::RateLimit);
        assert_eq!(e.retry_after(), Some(Duration::from_secs(30)));
        crate::llm::test_support::assert_secret_absent(&e, KEY);
        assert_eq!(s.request_count(), 1);
    }

    #[tokio::test]
    async fn http_529_overloaded_and_echoed_key_is_redacted() {
        let s = server().await;
        s.push(fake::error_reply(529, "overloaded_error", "Overloaded"));
        s.push(fake::error_reply(
            401,
            "authentication_error",
            &format!("invalid x-api-key {KEY}"),
        ));
        let c = client(&s);
        let Err(e) = c.stream(request(vec![Message::user_text("x")])).await else {
            panic!()
        };
        assert_eq!(e.kind(), ErrorKind::Overloaded);
        assert!(e.to_string().contains("Overloaded"), "{e}");
        let Err(e) = c.stream(request(vec![Message::user_text("x")])).await else {
            panic!()
        };
        assert_eq!(e.kind(), ErrorKind::Auth);
        crate::llm::test_support::assert_secret_absent(&e, KEY);
    }

    #[tokio::test]
    async fn idle_timeout() {
        let s = server().await;
        let body = fake::text_response("slow").body_bytes();
        let half = body.len() / 2;
        s.push(
            Reply::sse(body)
                .split_at(&[half])
                .pause_at(half, Duration::from_secs(30)),
        );
        let c = client(&s).with_idle_timeout(Duration::from_millis(200));
        let events = collect(
            c.stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        let Some(Err(e)) = events.last() else {
            panic!("{events:?}")
        };
        assert!(matches!(e, LlmError::IdleTimeout { .. }), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::Timeout);

        // A server that never answers at all.
        s.push(Reply::hang());
        let Err(e) = c.stream(request(vec![Message::user_text("x")])).await else {
            panic!()
        };
        assert!(matches!(e, LlmError::IdleTimeout { .. }), "{e:?}");
        assert_eq!(s.request_count(), 2);
    }

    #[tokio::test]
    async fn invalid_tool_json_is_a_decode_error() {
        let s = server().await;
        let body = MessageStream::new()
            .tool_use("toolu_1", "exec", json!({"cmd": "ls"}))
            .body()
            .replace(r#""partial_json":"{\"cmd"#, r#""partial_json":"{cmd"#);
        s.push(Reply::sse(body));
        let events = collect(
            client(&s)
                .stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        assert!(
            matches!(events.last(), Some(Err(LlmError::Decode { .. }))),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn no_key_means_no_auth_header() {
        let s = FakeLlmServer::start().await;
        s.push(fake::text_response("hi"));
        let c = AnthropicClient::new("local", &s.url(), ApiKey::new(None), vec![]).unwrap();
        let events = collect(
            c.stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        completed(&events);
        let r = s.last_request().unwrap();
        assert_eq!(r.header("x-api-key"), None);
        assert_eq!(r.header("anthropic-version"), Some(ANTHROPIC_VERSION));
    }

    #[test]
    fn bad_config_is_a_typed_error() {
        let e = AnthropicClient::new("a", "not a url", ApiKey::default(), vec![]).unwrap_err();
        assert!(matches!(e, LlmError::Config { .. }));
        let e = AnthropicClient::new(
            "a",
            "http://127.0.0.1:1",
            ApiKey::default(),
            vec![("bad header".into(), "secret-value".into())],
        )
        .unwrap_err();
        assert!(matches!(e, LlmError::Config { .. }));
        assert!(!e.to_string().contains("secret-value"));
    }
}
