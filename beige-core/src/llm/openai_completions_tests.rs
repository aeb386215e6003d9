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
        messages: messages.into(),
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
    let c =
        OpenAiCompletionsClient::new("ollama", &s.url(), ApiKey::new(Some(String::new())), vec![])
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
