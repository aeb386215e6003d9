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
        messages: messages.into(),
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
