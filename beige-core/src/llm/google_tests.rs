use super::*;
use crate::llm::test_support::{completed, text_deltas};
use crate::llm::{ErrorKind, ToolSpec};
use beige_testkit::google::{self as fake, GeminiStream};
use beige_testkit::llm::{FakeLlmServer, Reply};

const KEY: &str = "AIzaSy-test-Gemini-SECRET-77";

fn client(server: &FakeLlmServer) -> GoogleClient {
    GoogleClient::new(
        "google",
        &server.url(),
        ApiKey::new(Some(KEY.into())),
        vec![],
    )
    .unwrap()
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "exec".into(),
        description: "Run a command".into(),
        input_schema: json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "cmd": {"type": "string", "description": "the command"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "mode": {"type": ["string", "null"], "enum": ["fast", "slow"]},
                "args": {"type": "array", "items": {"type": "string", "$comment": "x"}},
                "kind": {"const": "shell"}
            },
            "required": ["cmd"]
        }),
    }]
}

fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model: "gemini-2.5-flash".into(),
        system: "You are beige.".into(),
        messages: messages.into(),
        tools: tools(),
        max_tokens: 8192,
        thinking: ThinkingLevel::Off,
        reasoning: false,
    }
}

async fn run(
    client: &GoogleClient,
    req: ModelRequest,
) -> Result<Vec<Result<StreamEvent, LlmError>>, LlmError> {
    Ok(client.stream(req).await?.collect().await)
}

#[tokio::test]
async fn streams_text_and_sends_a_proper_request() {
    let server = FakeLlmServer::start().await;
    server.push(
        GeminiStream::new()
            .text("Hello from Gemini — ünïcode")
            .piece_size(4)
            .reply()
            .chunked(9),
    );
    let events = run(&client(&server), request(vec![Message::user_text("hi")]))
        .await
        .unwrap();
    assert_eq!(text_deltas(&events), "Hello from Gemini — ünïcode");
    let resp = completed(&events);
    assert_eq!(
        resp.content,
        vec![Block::Text {
            text: "Hello from Gemini — ünïcode".into()
        }]
    );
    assert_eq!(resp.stop_reason, StopReason::EndTurn);

    let req = server.last_request().unwrap();
    assert_eq!(req.method, "POST");
    assert_eq!(
        req.path,
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    );
    assert_eq!(req.query.as_deref(), Some("alt=sse"));
    assert_eq!(req.header("x-goog-api-key"), Some(KEY));
    assert_eq!(req.header("authorization"), None);
    assert_eq!(
        req.secret_locations(KEY),
        vec!["header x-goog-api-key".to_string()]
    );
    let b = &req.body;
    assert_eq!(
        b["systemInstruction"],
        json!({"parts": [{"text": "You are beige."}]})
    );
    assert_eq!(
        b["contents"],
        json!([{"role": "user", "parts": [{"text": "hi"}]}])
    );
    assert_eq!(b["generationConfig"], json!({"maxOutputTokens": 8192}));
    assert_eq!(
        b["tools"][0]["functionDeclarations"][0]["parameters"],
        json!({
            "type": "object",
            "properties": {
                "cmd": {"type": "string", "description": "the command"},
                "env": {"type": "object"},
                "mode": {"nullable": true, "type": "string", "enum": ["fast", "slow"]},
                "args": {"type": "array", "items": {"type": "string"}},
                "kind": {"enum": ["shell"]}
            },
            "required": ["cmd"]
        })
    );
}

#[tokio::test]
async fn function_call_gets_a_generated_id() {
    let server = FakeLlmServer::start().await;
    let args = json!({"cmd": "ls -la", "env": {"A": "1"}});
    server.push(
        GeminiStream::new()
            .function_call("exec", args.clone())
            .reply()
            .chunked(5),
    );
    let events = run(&client(&server), request(vec![Message::user_text("list")]))
        .await
        .unwrap();
    assert!(events.iter().any(|e| matches!(e, Ok(StreamEvent::ToolUseStarted { id, name }) if id == "call_1" && name == "exec")));
    let resp = completed(&events);
    assert_eq!(
        resp.content,
        vec![Block::ToolUse {
            id: "call_1".into(),
            name: "exec".into(),
            input: args
        }]
    );
    assert_eq!(resp.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn two_function_calls_with_thoughts_and_usage() {
    let server = FakeLlmServer::start().await;
    server.push(
        GeminiStream::new()
            .thought("Two things to check.")
            .text("Checking.")
            .function_call("exec", json!({"cmd": "pwd"}))
            .function_call("read", json!({"path": "a.txt"}))
            .usage(1500, 40, 1024, 120)
            .reply(),
    );
    // Two calls already in the history: the new ids continue after them.
    let history = vec![
        Message::user_text("first"),
        Message {
            role: Role::Assistant,
            content: vec![
                Block::ToolUse {
                    id: "call_1".into(),
                    name: "exec".into(),
                    input: json!({"cmd": "a"}),
                },
                Block::ToolUse {
                    id: "call_2".into(),
                    name: "exec".into(),
                    input: json!({"cmd": "b"}),
                },
            ],
        },
        Message {
            role: Role::User,
            content: vec![
                Block::ToolResult {
                    tool_use_id: "call_1".into(),
                    content: vec![],
                    is_error: false,
                },
                Block::ToolResult {
                    tool_use_id: "call_2".into(),
                    content: vec![],
                    is_error: false,
                },
            ],
        },
    ];
    let events = run(&client(&server), request(history)).await.unwrap();
    let thinking: String = events
        .iter()
        .filter_map(|e| match e {
            Ok(StreamEvent::ThinkingDelta(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(thinking, "Two things to check.");
    let resp = completed(&events);
    assert_eq!(
        resp.content,
        vec![
            Block::Thinking {
                thinking: "Two things to check.".into(),
                signature: None
            },
            Block::Text {
                text: "Checking.".into()
            },
            Block::ToolUse {
                id: "call_3".into(),
                name: "exec".into(),
                input: json!({"cmd": "pwd"})
            },
            Block::ToolUse {
                id: "call_4".into(),
                name: "read".into(),
                input: json!({"path": "a.txt"})
            },
        ]
    );
    assert_eq!(resp.stop_reason, StopReason::ToolUse);
    assert_eq!(
        resp.usage,
        Usage {
            input_tokens: 476,
            output_tokens: 160,
            cache_read_tokens: 1024,
            cache_write_tokens: 0
        }
    );
}

#[tokio::test]
async fn max_tokens_finish_reason() {
    let server = FakeLlmServer::start().await;
    server.push(
        GeminiStream::new()
            .text("cut by")
            .finish_reason("MAX_TOKENS")
            .reply(),
    );
    let events = run(&client(&server), request(vec![Message::user_text("hi")]))
        .await
        .unwrap();
    assert_eq!(completed(&events).stop_reason, StopReason::MaxTokens);
}

#[tokio::test]
async fn error_chunk_mid_stream_is_typed() {
    let server = FakeLlmServer::start().await;
    server.push(
        GeminiStream::new()
            .text("partial")
            .error(
                429,
                "RESOURCE_EXHAUSTED",
                "Resource has been exhausted (e.g. check quota).",
            )
            .reply(),
    );
    let events = run(&client(&server), request(vec![Message::user_text("hi")]))
        .await
        .unwrap();
    assert_eq!(text_deltas(&events), "partial");
    let err = events.last().unwrap().as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RateLimit);
    assert!(
        matches!(err, LlmError::Api { status: 429, error_type: Some(t), .. } if t == "RESOURCE_EXHAUSTED"),
        "{err:?}"
    );
    assert!(!events
        .iter()
        .any(|e| matches!(e, Ok(StreamEvent::Completed(_)))));
}

#[tokio::test]
async fn stream_without_finish_reason_is_truncated_and_not_retried() {
    let server = FakeLlmServer::start().await;
    server.push(
        GeminiStream::new()
            .text("half an answer")
            .without_finish()
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

    // A clean end of body without any finishReason is cut off too.
    let server = FakeLlmServer::start().await;
    server.push(GeminiStream::new().text("half").without_finish().reply());
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
        fake::error_reply(429, "RESOURCE_EXHAUSTED", "Quota exceeded", Some("30s"))
            .header("retry-after", "12"),
    );
    let client = client(&server);
    let err = client
        .stream(request(vec![Message::user_text("hi")]))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::RateLimit);
    assert_eq!(
        err.retry_after(),
        Some(Duration::from_secs(12)),
        "the header wins"
    );

    // Without the header, RetryInfo.retryDelay is used.
    server.push(fake::error_reply(
        429,
        "RESOURCE_EXHAUSTED",
        "Quota exceeded",
        Some("30s"),
    ));
    let err = client
        .stream(request(vec![Message::user_text("hi")]))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::RateLimit);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
    assert!(
        matches!(&err, LlmError::Api { error_type: Some(t), .. } if t == "RESOURCE_EXHAUSTED"),
        "{err:?}"
    );
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn http_503_is_overloaded() {
    let server = FakeLlmServer::start().await;
    server.push(fake::error_reply(
        503,
        "UNAVAILABLE",
        "The model is overloaded. Please try again later.",
        None,
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
        GeminiStream::new()
            .text("slow")
            .without_finish()
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

    server.push(Reply::hang());
    let err = client
        .stream(request(vec![Message::user_text("hi")]))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn history_pairs_function_responses_by_name() {
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
                    signature: None,
                },
                Block::Text {
                    text: "Checking.".into(),
                },
                Block::ToolUse {
                    id: "toolu_A".into(),
                    name: "exec".into(),
                    input: json!({"cmd": "pwd"}),
                },
                Block::ToolUse {
                    id: "toolu_B".into(),
                    name: "screenshot".into(),
                    input: json!({}),
                },
            ],
        },
        Message {
            role: Role::User,
            content: vec![
                Block::ToolResult {
                    tool_use_id: "toolu_A".into(),
                    content: vec![ToolResultPart::Text {
                        text: "/workspace".into(),
                    }],
                    is_error: false,
                },
                Block::ToolResult {
                    tool_use_id: "toolu_B".into(),
                    content: vec![
                        ToolResultPart::Text {
                            text: "no display".into(),
                        },
                        ToolResultPart::Image {
                            data: "R0lGOD==".into(),
                            mime_type: "image/gif".into(),
                        },
                    ],
                    is_error: true,
                },
            ],
        },
    ];
    let mut req = request(history);
    req.model = "gemini-3-pro-preview".into();
    req.reasoning = true;
    req.thinking = ThinkingLevel::Medium;
    let events = run(&client(&server), req).await.unwrap();
    assert_eq!(
        completed(&events).content,
        vec![Block::Text {
            text: "done".into()
        }]
    );
    assert_eq!(server.violations(), Vec::<String>::new());

    let r = server.last_request().unwrap();
    assert_eq!(
        r.path,
        "/v1beta/models/gemini-3-pro-preview:streamGenerateContent"
    );
    assert_eq!(
        r.body["generationConfig"],
        json!({"maxOutputTokens": 8192, "thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": true}})
    );
    assert_eq!(
        r.body["contents"],
        json!([
            {"role": "user", "parts": [
                {"text": "look"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]},
            {"role": "model", "parts": [
                {"text": "Checking."},
                {"functionCall": {"name": "exec", "args": {"cmd": "pwd"}},
                 "thoughtSignature": "skip_thought_signature_validator"},
                {"functionCall": {"name": "screenshot", "args": {}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "exec", "response": {"content": "/workspace", "isError": false}}},
                {"functionResponse": {"name": "screenshot", "response": {"content": "no display", "isError": true}}},
                {"inlineData": {"mimeType": "image/gif", "data": "R0lGOD=="}}]}
        ])
    );
}

#[test]
fn older_models_get_no_signature_and_base_urls_are_normalised() {
    let history = vec![Message {
        role: Role::Assistant,
        content: vec![Block::ToolUse {
            id: "c".into(),
            name: "exec".into(),
            input: json!({}),
        }],
    }];
    let body = request_body(&request(history));
    assert!(
        body["contents"][0]["parts"][0]
            .get("thoughtSignature")
            .is_none(),
        "{body}"
    );

    let c = GoogleClient::new(
        "g",
        "https://generativelanguage.googleapis.com/v1beta/",
        ApiKey::default(),
        vec![],
    )
    .unwrap();
    assert_eq!(
        c.url("models/gemini-2.5-pro").unwrap(),
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
    assert!(matches!(
        c.url("../secrets?x=1"),
        Err(LlmError::Config { .. })
    ));
}

#[tokio::test]
async fn key_stays_out_of_errors_and_debug() {
    let server = FakeLlmServer::start().await;
    server.push(fake::error_reply(
        400,
        "INVALID_ARGUMENT",
        &format!("API key not valid: {KEY}"),
        None,
    ));
    let client = client(&server);
    let err = client
        .stream(request(vec![Message::user_text("hi")]))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    crate::llm::test_support::assert_secret_absent(&err, KEY);
    assert!(!format!("{client:?}").contains(KEY));
    let req = server.last_request().unwrap();
    assert_eq!(
        req.secret_locations(KEY),
        vec!["header x-goog-api-key".to_string()]
    );
}
