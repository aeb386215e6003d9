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
mod tests {
    use super::*;
    use crate::llm::test_support::{completed, text_deltas, thinking_deltas};
    use crate::llm::{ErrorKind, ToolSpec};
    use beige_testkit::llm::{FakeLlmServer, Reply};
    use beige_testkit::openai_completions::{self as fake, ChatStream};
    use futures_util::StreamExt;

    const KEY: &str = "sk-proj-test-0123456789";

    async fn server() -> FakeLlmServer {
        let s = FakeLlmServer::start().await;
        s.require_header("authorization", &format!("Bearer {KEY}"))
            .require_header("content-type", "application/json")
            .check(|r| {
                if r.method != "POST" || r.path != "/v1/chat/completions" {
                    return Err(format!("unexpected {} {}", r.method, r.path));
                }
                if r.body.get("stream") != Some(&json!(true))
                    || r.body["stream_options"]["include_usage"] != json!(true)
                {
                    return Err("stream / include_usage not set".into());
                }
                fake::check_tool_pairing(&r.body)
            })
            .check(|r| {
                let at = r.secret_locations(KEY);
                if at == ["header authorization"] {
                    Ok(())
                } else {
                    Err(format!("API key found at {at:?}"))
                }
            });
        s
    }

    fn client(s: &FakeLlmServer) -> OpenAiCompletionsClient {
        OpenAiCompletionsClient::new(
            "openai",
            &format!("{}/v1/", s.url()),
            ApiKey::new(Some(KEY.into())),
            vec![("OpenAI-Organization".into(), "org-1".into())],
        )
        .unwrap()
    }

    fn request(messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            model: "gpt-4o-mini".into(),
            system: "You are a test.".into(),
            messages,
            tools: vec![ToolSpec {
                name: "exec".into(),
                description: "Run a command".into(),
                input_schema: json!({"type": "object", "properties": {"cmd": {"type": "string"}}}),
            }],
            max_tokens: 1000,
            thinking: ThinkingLevel::Off,
            reasoning: false,
        }
    }

    async fn collect(stream: EventStream) -> Vec<Result<StreamEvent, LlmError>> {
        stream.collect().await
    }

    #[tokio::test]
    async fn streams_text_split_at_awkward_places_with_usage() {
        let s = server().await;
        let text = "Grüße — ☃ snowman";
        let body = ChatStream::new().text(text).usage(120, 30, 100).body();
        let data_at = body.find("data:").unwrap() + 3;
        let utf8_at = body.find('ü').unwrap() + 1;
        let done_at = body.find("[DONE]").unwrap() + 2;
        s.push(
            Reply::sse(body)
                .split_at(&[data_at, utf8_at, done_at])
                .chunked(5),
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
                input_tokens: 20,
                output_tokens: 30,
                cache_read_tokens: 100,
                cache_write_tokens: 0
            }
        );
        assert_eq!(s.violations(), Vec::<String>::new());
        let req = s.last_request().unwrap();
        assert_eq!(req.header("openai-organization"), Some("org-1"));
        assert_eq!(req.body["model"], "gpt-4o-mini");
        assert_eq!(req.body["max_completion_tokens"], 1000);
        assert!(req.body.get("reasoning_effort").is_none());
        assert_eq!(
            req.body["messages"],
            json!([{"role": "system", "content": "You are a test."}, {"role": "user", "content": "hi"}])
        );
        assert_eq!(
            req.body["tools"][0],
            json!({"type": "function", "function": {"name": "exec", "description": "Run a command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}})
        );
    }

    #[tokio::test]
    async fn tool_call_with_arguments_in_pieces() {
        let s = server().await;
        let args = json!({"cmd": "grep -r \"ünï\" /workspace", "timeout": 30});
        s.push(
            ChatStream::new()
                .tool_call("call_abc", "exec", args.clone())
                .piece_size(2)
                .reply()
                .chunked(13),
        );
        let events = collect(
            client(&s)
                .stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        assert!(events.iter().any(|e| matches!(e,
            Ok(StreamEvent::ToolUseStarted { id, name }) if id == "call_abc" && name == "exec")));
        let r = completed(&events);
        assert_eq!(r.stop_reason, StopReason::ToolUse);
        assert_eq!(
            r.content,
            vec![Block::ToolUse {
                id: "call_abc".into(),
                name: "exec".into(),
                input: args
            }]
        );
    }

    #[tokio::test]
    async fn two_tool_calls_then_results_with_an_image() {
        let s = server().await;
        s.push(
            ChatStream::new()
                .text("Checking.")
                .tool_call("call_1", "exec", json!({"cmd": "date"}))
                .tool_call("call_2", "read", json!({"path": "/workspace/p.png"}))
                .reply()
                .chunked(6),
        );
        s.push(fake::text_response("done"));
        let c = client(&s);
        let mut history = vec![Message {
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
        }];
        let events = collect(c.stream(request(history.clone())).await.unwrap()).await;
        let r = completed(&events);
        assert_eq!(r.content.len(), 3);
        assert_eq!(
            r.content[0],
            Block::Text {
                text: "Checking.".into()
            }
        );
        history.push(Message {
            role: Role::Assistant,
            content: r.content,
        });
        history.push(Message {
            role: Role::User,
            content: vec![
                Block::ToolResult {
                    tool_use_id: "call_1".into(),
                    content: vec![ToolResultPart::Text { text: "Mon".into() }],
                    is_error: false,
                },
                Block::ToolResult {
                    tool_use_id: "call_2".into(),
                    content: vec![ToolResultPart::Image {
                        data: "R0lGODlh".into(),
                        mime_type: "image/gif".into(),
                    }],
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
        let msgs = s.requests()[1].body["messages"].clone();
        assert_eq!(
            msgs[1]["content"][1],
            json!({"type": "image_url",
            "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}})
        );
        assert_eq!(msgs[2]["content"], "Checking.");
        assert_eq!(
            msgs[2]["tool_calls"][1],
            json!({"id": "call_2", "type": "function",
            "function": {"name": "read", "arguments": "{\"path\":\"/workspace/p.png\"}"}})
        );
        assert_eq!(
            msgs[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "Mon"})
        );
        assert_eq!(msgs[4]["role"], "tool");
        assert!(msgs[4]["content"]
            .as_str()
            .unwrap()
            .starts_with("[error] [image image/gif"));
        assert_eq!(msgs[5]["role"], "user");
        assert_eq!(
            msgs[5]["content"][1]["image_url"]["url"],
            "data:image/gif;base64,R0lGODlh"
        );
        assert_eq!(msgs.as_array().unwrap().len(), 6);
    }

    #[tokio::test]
    async fn reasoning_deltas_and_effort() {
        let s = server().await;
        s.push(
            ChatStream::new()
                .reasoning("think think")
                .text("42")
                .reply()
                .chunked(8),
        );
        let mut req = request(vec![Message::user_text("x")]);
        req.reasoning = true;
        req.thinking = ThinkingLevel::Minimal;
        let c = client(&s);
        let events = collect(c.stream(req.clone()).await.unwrap()).await;
        assert_eq!(thinking_deltas(&events), "think think");
        let r = completed(&events);
        assert_eq!(
            r.content[0],
            Block::Thinking {
                thinking: "think think".into(),
                signature: None
            }
        );
        assert_eq!(s.last_request().unwrap().body["reasoning_effort"], "low");
        // Thinking is not sent back.
        req.messages.push(Message {
            role: Role::Assistant,
            content: r.content,
        });
        req.messages.push(Message::user_text("y"));
        req.thinking = ThinkingLevel::High;
        let b = request_body(&req);
        assert_eq!(
            b["messages"][2],
            json!({"role": "assistant", "content": "42"})
        );
        assert_eq!(b["reasoning_effort"], "high");
        req.reasoning = false;
        assert!(request_body(&req).get("reasoning_effort").is_none());
    }

    #[tokio::test]
    async fn error_chunk_mid_stream() {
        let s = server().await;
        s.push(
            ChatStream::new()
                .text("part")
                .error("server_error", None, "The server had an error")
                .reply(),
        );
        s.push(
            ChatStream::new()
                .text("part")
                .error("tokens", Some("rate_limit_exceeded"), "Slow down")
                .reply(),
        );
        let c = client(&s);
        let events = collect(
            c.stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(text_deltas(&events), "part");
        let Some(Err(e)) = events.last() else {
            panic!("{events:?}")
        };
        assert!(
            matches!(e, LlmError::Api { status: 500, error_type: Some(t), .. } if t == "server_error"),
            "{e:?}"
        );
        let events = collect(
            c.stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        let Some(Err(e)) = events.last() else {
            panic!("{events:?}")
        };
        assert_eq!(e.kind(), ErrorKind::RateLimit, "{e:?}");
    }

    #[tokio::test]
    async fn stream_without_done_is_truncated_and_not_retried() {
        for reply in [
            ChatStream::new().text("half").without_done().reply(),
            ChatStream::new()
                .text("half")
                .without_usage()
                .without_done()
                .reply()
                .cut(),
        ] {
            let s = server().await;
            s.push(reply.chunked(10));
            s.push(fake::text_response("never"));
            let events = collect(
                client(&s)
                    .stream(request(vec![Message::user_text("x")]))
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(text_deltas(&events), "half");
            assert!(
                matches!(events.last(), Some(Err(LlmError::Truncated { .. }))),
                "{events:?}"
            );
            assert_eq!(s.request_count(), 1);
            assert_eq!(s.replies_left(), 1);
        }
    }

    #[tokio::test]
    async fn http_429_with_retry_after_and_503() {
        let s = server().await;
        s.push(
            fake::error_reply(
                429,
                "requests",
                Some("rate_limit_exceeded"),
                "Rate limit reached",
            )
            .header("retry-after", "30"),
        );
        s.push(fake::error_reply(
            503,
            "server_error",
            None,
            "The engine is currently overloaded",
        ));
        s.push(fake::error_reply(
            401,
            "invalid_request_error",
            Some("invalid_api_key"),
            &format!("Incorrect API key provided: {KEY}"),
        ));
        let c = client(&s);
        let Err(e) = c.stream(request(vec![Message::user_text("x")])).await else {
            panic!()
        };
        assert!(
            matches!(&e, LlmError::Api { status: 429, retry_after: Some(d), .. } if *d == Duration::from_secs(30)),
            "{e:?}"
        );
        assert_eq!(e.kind(), ErrorKind::RateLimit);
        crate::llm::test_support::assert_secret_absent(&e, KEY);
        let Err(e) = c.stream(request(vec![Message::user_text("x")])).await else {
            panic!()
        };
        assert_eq!(e.kind(), ErrorKind::Overloaded);
        let Err(e) = c.stream(request(vec![Message::user_text("x")])).await else {
            panic!()
        };
        assert_eq!(e.kind(), ErrorKind::Auth);
        crate::llm::test_support::assert_secret_absent(&e, KEY);
        assert_eq!(s.request_count(), 3);
    }

    #[tokio::test]
    async fn idle_timeout() {
        let s = server().await;
        s.push(Reply::sse(ChatStream::new().text("slow").without_done().body()).hang_after());
        let c = client(&s).with_idle_timeout(Duration::from_millis(200));
        let events = collect(
            c.stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(text_deltas(&events), "slow");
        let Some(Err(e)) = events.last() else {
            panic!("{events:?}")
        };
        assert!(matches!(e, LlmError::IdleTimeout { .. }), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::Timeout);
    }

    #[tokio::test]
    async fn unpaired_history_is_refused_by_the_fake_server() {
        let s = server().await;
        s.push(fake::text_response("never"));
        let bad = vec![
            Message::user_text("x"),
            Message {
                role: Role::Assistant,
                content: vec![Block::ToolUse {
                    id: "c1".into(),
                    name: "exec".into(),
                    input: json!({}),
                }],
            },
            Message::user_text("no result"),
        ];
        let Err(e) = client(&s).stream(request(bad)).await else {
            panic!()
        };
        assert_eq!(e.kind(), ErrorKind::InvalidRequest);
        assert_eq!(s.violations().len(), 1);
    }

    #[tokio::test]
    async fn local_server_without_key_gets_no_auth_header() {
        let s = FakeLlmServer::start().await;
        s.push(fake::text_response("hi"));
        let c = OpenAiCompletionsClient::new(
            "ollama",
            &s.url(),
            ApiKey::new(Some(String::new())),
            vec![],
        )
        .unwrap();
        let events = collect(
            c.stream(request(vec![Message::user_text("x")]))
                .await
                .unwrap(),
        )
        .await;
        completed(&events);
        let r = s.last_request().unwrap();
        assert_eq!(r.path, "/chat/completions");
        assert_eq!(r.header("authorization"), None);
    }

    #[tokio::test]
    async fn invalid_arguments_json_is_a_decode_error() {
        let s = server().await;
        let body = ChatStream::new()
            .tool_call("call_1", "exec", json!({"cmd": "ls"}))
            .piece_size(100)
            .body()
            .replace(
                r#""arguments":"{\"cmd\":\"ls\"}""#,
                r#""arguments":"{cmd: ls""#,
            );
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
}
