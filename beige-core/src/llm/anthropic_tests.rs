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
        messages: messages.into(),
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
    s.push(fake::thinking_response("Let me think…", "EqQBCgIYAhIM1gbcDa9GJwZA", "42").chunked(11));
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
