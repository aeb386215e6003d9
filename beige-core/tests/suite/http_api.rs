//! The HTTP API (`channel::http`) and its client (`RemoteGateway`), against a real
//! `LocalGateway` with the labelled `MemorySandbox` and a fake Anthropic server that speaks
//! the real wire format. Driven both in process (`tower::ServiceExt::oneshot`) and over
//! TCP on `127.0.0.1:0` (through `HttpApiChannel`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext};
use beige_core::channel::http::{
    router, routes, ApiState, HttpApiChannel, OPENAPI_JSON, UNAUTHORIZED_MESSAGE,
};
use beige_core::channel::{Channel, ChannelContext, ChannelError};
use beige_core::config::{Config, LinkMode};
use beige_core::hooks::HookName;
use beige_core::sandbox::LinkStatus;
use beige_core::sandbox::SandboxStatus;
use beige_core::store::SettingsPatch;
use beige_core::AgentEvent;
use beige_core::RemoteGateway;
use beige_core::{Admin as _, Sessions as _};
use beige_core::{
    BeigeHome, Gateway, GatewayBuilder, GatewayError, GatewayFull, LocalGateway, PromptRequest,
};
use beige_testkit::anthropic::{text_response, MessageStream};
use beige_testkit::llm::{FakeLlmServer, Reply};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use beige_core::testing::MemorySandbox;

const TOKEN: &str = "test-token-0123456789abcdef";
const KEY: &str = "sk-ant-test-key-0123456789";

/// A gateway with one agent `a` (model `anthropic/claude-sonnet-4-6`, fallback
/// `anthropic/claude-haiku-4-5`) talking to a fake Anthropic server, and the fake sandbox.
struct Fixture {
    _dir: tempfile::TempDir,
    llm: FakeLlmServer,
    gw: Arc<LocalGateway>,
}

impl Fixture {
    async fn new() -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let llm = FakeLlmServer::start().await;
        let config: Config = serde_json::from_value(json!({
            "llm": {"providers": {"anthropic": {"apiKey": KEY, "baseUrl": llm.url()}}},
            "agents": {"a": {
                "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                "fallbackModels": [{"provider": "anthropic", "model": "claude-haiku-4-5"}],
                "tools": [],
                "sandbox": {"image": super::support::test_image(), "memoryLimit": "256m"},
            }},
        }))
        .unwrap();
        let gw = GatewayBuilder::new(config, home)
            .sandbox(Arc::new(MemorySandbox::new()))
            .build()
            .await
            .unwrap();
        Some(Self {
            _dir: dir,
            llm,
            gw: Arc::new(gw),
        })
    }

    fn state(&self) -> ApiState {
        ApiState::new(self.gw.clone(), Some(TOKEN.to_string()))
    }

    fn app(&self) -> axum::Router {
        router(self.state())
    }

    /// The API on `127.0.0.1:0` through `HttpApiChannel`.
    async fn serve(&self, state: ApiState) -> Served {
        let (channel, addr) = HttpApiChannel::bind("127.0.0.1", 0, state).unwrap();
        assert_eq!(channel.name(), "api");
        let shutdown = CancellationToken::new();
        let gw: Arc<dyn GatewayFull> = self.gw.clone();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move { channel.run(ChannelContext::new(gw, stop)).await });
        Served {
            addr,
            shutdown,
            task,
        }
    }
}

struct Served {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ChannelError>>,
}

impl Served {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// A request to the in-process app, with `Host: localhost` and the token.
fn req(method: &str, path: &str) -> axum::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "localhost:7433")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
}

fn json_req(method: &str, path: &str, body: Value) -> Request<Body> {
    req(method, path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn send(app: &axum::Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let ct = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "{status}: not JSON ({ct:?}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(ct.as_deref(), Some("application/json"), "{status} {body}");
    (status, body)
}

/// A concrete path for a route of the table.
fn concrete(path: &str) -> String {
    path.replace("{name}", "a")
        .replace("{key}", "api:a:default")
        .replace("{id}", "s_0000000000000000")
}

/// Wait for a condition the code under test reaches on its own (no event to await).
async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn every_route_but_health_needs_the_token() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let app = f.app();
    for (method, path) in routes() {
        let path = concrete(path);
        for auth in [None, Some("Bearer wrong-token"), Some(TOKEN)] {
            let mut b = Request::builder()
                .method(method)
                .uri(&path)
                .header(header::HOST, "127.0.0.1:7433");
            if let Some(a) = auth {
                b = b.header(header::AUTHORIZATION, a);
            }
            let (status, body) = send(&app, b.body(Body::empty()).unwrap()).await;
            if path == "/api/health" {
                assert_eq!(status, StatusCode::OK, "{method} {path}");
            } else {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} {auth:?}");
                assert_eq!(body, json!({"error": UNAUTHORIZED_MESSAGE}));
            }
        }
    }
    // Unknown routes too, so they cannot be probed.
    let r = Request::builder()
        .uri("/api/nope")
        .header(header::HOST, "localhost")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, r).await.0, StatusCode::UNAUTHORIZED);
    let (status, body) = send(&app, req("GET", "/api/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(
        (status, body),
        (StatusCode::NOT_FOUND, json!({"error": "Not found"}))
    );
    let (status, body) = send(
        &app,
        req("DELETE", "/api/agents").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body, json!({"error": "Method not allowed"}));

    // The same over TCP.
    let served = f.serve(f.state()).await;
    let client = reqwest::Client::new();
    let r = client
        .get(format!("{}/api/agents", served.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": UNAUTHORIZED_MESSAGE})
    );
    let r = client
        .get(format!("{}/api/agents", served.url()))
        .bearer_auth("nearly-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .get(format!("{}/api/health", served.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let health: Value = r.json().await.unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(health["agents"], 1);
    served.stop().await;
}

#[tokio::test]
async fn every_route_of_the_table_is_served() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let app = f.app();
    for (method, path) in routes() {
        let request = match method {
            "GET" => req(method, &concrete(path)).body(Body::empty()).unwrap(),
            _ => json_req(method, &concrete(path), json!({})),
        };
        if path == "/api/approvals/events" {
            // A live stream: it answers with its headers and never ends.
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{method} {path}");
            let ct = response.headers().get(header::CONTENT_TYPE).unwrap();
            assert!(ct.to_str().unwrap().starts_with("text/event-stream"));
            continue;
        }
        let (status, body) = send(&app, request).await;
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(body, json!({"error": "Not found"}), "{method} {path}");
    }
}

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_served_routes() {
    let doc: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let mut served: Vec<(String, String)> = routes()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served);
    // Health is the one route without authentication.
    assert_eq!(doc["paths"]["/api/health"]["get"]["security"], json!([]));
    // Every `$ref` resolves.
    let text = OPENAPI_JSON;
    for r in text.split("\"$ref\": \"#/").skip(1) {
        let target = r.split('"').next().unwrap();
        let mut node = &doc;
        for part in target.split('/') {
            node = &node[part];
        }
        assert!(!node.is_null(), "dangling $ref #/{target}");
    }
    insta::assert_json_snapshot!("openapi", doc);

    // And the document is served.
    let Some(f) = Fixture::new().await else {
        return;
    };
    let (status, served_doc) = send(
        &f.app(),
        req("GET", "/api/openapi.json").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served_doc, doc);
}

#[tokio::test]
async fn foreign_hosts_and_origins_are_refused() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let app = f.app();
    let with_host = |host: &str| {
        Request::builder()
            .uri("/api/agents")
            .header(header::HOST, host)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap()
    };
    for bad in [
        "evil.example",
        "evil.example:7433",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
    ] {
        let (status, body) = send(&app, with_host(bad)).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{bad}");
        assert!(
            body["error"].as_str().unwrap().contains("not allowed"),
            "{body}"
        );
    }
    // Health is refused for a foreign host too (DNS rebinding could read it).
    let r = Request::builder()
        .uri("/api/health")
        .header(header::HOST, "evil.example")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, r).await.0, StatusCode::MISDIRECTED_REQUEST);
    for good in [
        "localhost",
        "localhost:9",
        "127.0.0.1:7433",
        "[::1]:7433",
        "[::1]",
        "LOCALHOST",
    ] {
        assert_eq!(
            send(&app, with_host(good)).await.0,
            StatusCode::OK,
            "{good}"
        );
    }
    // A name the operator allowed (a reverse proxy).
    let proxied = router(f.state().with_allowed_host("beige.example.com"));
    assert_eq!(
        send(&proxied, with_host("beige.example.com")).await.0,
        StatusCode::OK
    );

    // A cross-site POST (a "simple" request a web page can send) is refused.
    let evil = req("POST", "/api/agents/a/exec")
        .header(header::ORIGIN, "http://evil.example")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            json!({"tool": "exec", "params": {"command": "echo pwned"}}).to_string(),
        ))
        .unwrap();
    let (status, body) = send(&app, evil).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("http://evil.example"));
    for origin in ["null", "http://localhost.evil.example", "file://"] {
        let r = req("GET", "/api/agents")
            .header(header::ORIGIN, origin)
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, r).await.0, StatusCode::FORBIDDEN, "{origin}");
    }

    // Over TCP: the Origin must be the gateway itself, port included.
    let served = f.serve(f.state()).await;
    let port = served.addr.port();
    let client = reqwest::Client::new();
    for (origin, ok) in [
        (format!("http://127.0.0.1:{port}"), true),
        (format!("http://localhost:{port}"), true),
        (format!("http://localhost:{}", port.wrapping_add(1)), false),
        ("http://localhost:3000".to_string(), false),
        ("https://evil.example".to_string(), false),
    ] {
        let r = client
            .get(format!("{}/api/agents", served.url()))
            .bearer_auth(TOKEN)
            .header("origin", &origin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().is_success(), ok, "{origin}: {}", r.status());
    }
    let r = client
        .get(format!("http://127.0.0.1:{port}/api/agents"))
        .bearer_auth(TOKEN)
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 421);
    served.stop().await;
}

#[tokio::test]
async fn bodies_need_json_and_fit_the_limit() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let app = f.app();
    let plain = req("POST", "/api/agents/a/prompt")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(r#"{"message":"hi"}"#))
        .unwrap();
    let (status, body) = send(&app, plain).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(body["error"].as_str().unwrap().contains("application/json"));
    // No Content-Type at all, but a body.
    let bare = req("POST", "/api/agents/a/prompt")
        .body(Body::from(r#"{"message":"hi"}"#))
        .unwrap();
    assert_eq!(send(&app, bare).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // 11 MiB: refused from Content-Length, and when streamed without one.
    let big = vec![b' '; 11 * 1024 * 1024];
    let declared = req("POST", "/api/agents/a/prompt")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, big.len())
        .body(Body::from(big.clone()))
        .unwrap();
    let (status, body) = send(&app, declared).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body["error"].as_str().unwrap().contains("10 MiB"), "{body}");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let streamed = req("POST", "/api/agents/a/prompt")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap();
    assert_eq!(send(&app, streamed).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    // A smaller configured limit.
    let small = router(f.state().with_body_limit(64));
    let r = json_req(
        "POST",
        "/api/agents/a/prompt",
        json!({"message": "x".repeat(100)}),
    );
    assert_eq!(send(&small, r).await.0, StatusCode::PAYLOAD_TOO_LARGE);

    // Bad JSON, missing and mistyped fields: 400 naming what is wrong.
    let broken = req("POST", "/api/agents/a/prompt")
        .header(header::CONTENT_TYPE, "application/json; charset=utf-8")
        .body(Body::from("{\"message\": "))
        .unwrap();
    let (status, body) = send(&app, broken).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap().starts_with("Invalid JSON"),
        "{body}"
    );
    for (path, sent, expected) in [
        ("/api/agents/a/prompt", json!({}), "Missing message"),
        (
            "/api/agents/a/prompt",
            json!({"message": "  "}),
            "Missing message",
        ),
        (
            "/api/agents/a/prompt",
            json!({"message": 5}),
            "Invalid message: expected a string",
        ),
        (
            "/api/agents/a/prompt",
            json!({"message": "hi", "sessionKey": 1}),
            "Invalid sessionKey: expected a string",
        ),
        (
            "/api/agents/a/prompt",
            json!([1]),
            "The request body must be a JSON object",
        ),
        (
            "/api/agents/a/exec",
            json!({"tool": "exec"}),
            "Missing tool or params",
        ),
        (
            "/api/agents/a/sessions/k/resume",
            json!({}),
            "Missing sessionId",
        ),
        (
            "/api/agents/a/hooks/pre-prompt",
            json!({}),
            "Missing message",
        ),
        (
            "/api/agents/a/hooks/post-response",
            json!({}),
            "Missing response",
        ),
    ] {
        let (status, body) = send(&app, json_req("POST", path, sent.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {sent}");
        assert_eq!(body, json!({"error": expected}), "{path} {sent}");
    }
    let (status, body) = send(
        &app,
        json_req(
            "PATCH",
            "/api/agents/a/sessions/k/settings",
            json!({"verbos": true}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap().contains("'verbos'"),
        "{body}"
    );
    let (status, body) = send(
        &app,
        json_req(
            "PATCH",
            "/api/agents/a/sessions/k/settings",
            json!({"verbose": "yes"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "Invalid verbose: expected a boolean or null");
}

#[tokio::test]
async fn unknown_agents_sessions_and_models() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let app = f.app();
    let unknown = json!({"error": "Unknown agent: x"});
    for request in [
        req("GET", "/api/agents/x/models")
            .body(Body::empty())
            .unwrap(),
        req("GET", "/api/agents/x/sessions")
            .body(Body::empty())
            .unwrap(),
        req("GET", "/api/agents/x/sandbox")
            .body(Body::empty())
            .unwrap(),
        req("GET", "/api/agents/x/sessions/k/settings")
            .body(Body::empty())
            .unwrap(),
        json_req("POST", "/api/agents/x/prompt", json!({"message": "hi"})),
        json_req(
            "POST",
            "/api/agents/x/exec",
            json!({"tool": "exec", "params": {"command": "id"}}),
        ),
        json_req("POST", "/api/agents/x/sessions/k/cancel", json!({})),
        json_req("POST", "/api/agents/x/hooks/session-created", json!({})),
    ] {
        let what = format!("{} {}", request.method(), request.uri());
        let (status, body) = send(&app, request).await;
        assert_eq!((status, &body), (StatusCode::NOT_FOUND, &unknown), "{what}");
    }
    // Percent-encoded agent names are decoded.
    let (status, body) = send(
        &app,
        req("GET", "/api/agents/x%20y/models")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "Unknown agent: x y");

    let (status, body) = send(
        &app,
        req("GET", "/api/agents/a/sessions/s_0000000000000000/messages")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body["error"],
        "no session 's_0000000000000000' for agent 'a'"
    );

    // Model overrides: only the agent's models (403 otherwise), keys with `:` and `/`.
    let path = "/api/agents/a/sessions/telegram:42%2F7/model";
    let (status, body) = send(
        &app,
        json_req(
            "PATCH",
            path,
            json!({"provider": "openai", "modelId": "gpt-4o"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body,
        json!({"error": "Model openai/gpt-4o is not in the allowed list for agent 'a' (allowed: anthropic/claude-sonnet-4-6, anthropic/claude-haiku-4-5)"})
    );
    let (status, body) = send(
        &app,
        json_req(
            "PATCH",
            path,
            json!({"provider": "anthropic", "modelId": "claude-haiku-4-5"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(
        body["settings"]["modelOverride"],
        "anthropic/claude-haiku-4-5"
    );
    assert_eq!(
        f.gw.settings("telegram:42/7")
            .await
            .unwrap()
            .model_override
            .as_deref(),
        Some("anthropic/claude-haiku-4-5"),
        "the key was percent-decoded"
    );
    let (status, body) = send(&app, json_req("PATCH", path, json!({"model": null}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["settings"]["modelOverride"], Value::Null);
    let (status, body) = send(
        &app,
        json_req("PATCH", path, json!({"provider": "anthropic"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("Missing provider or modelId"));
}

#[tokio::test]
async fn exec_and_prompt_examples_of_the_original() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let app = f.app();
    let (status, body) = send(
        &app,
        json_req(
            "POST",
            "/api/agents/a/exec",
            json!({"tool": "exec", "params": {"command": "echo hi"}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"content": [{"type": "text", "text": "Exit code: 0\nfake: echo hi"}], "isError": false, "transport": "direct"})
    );
    let (status, body) = send(
        &app,
        json_req(
            "POST",
            "/api/agents/a/exec",
            json!({"tool": "rm", "params": {}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("unknown core tool 'rm'"));
    let (status, body) = send(
        &app,
        json_req(
            "POST",
            "/api/agents/a/exec",
            json!({"tool": "exec", "params": {"cmd": "x"}}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("invalid parameters for exec"),
        "{body}"
    );

    f.llm.push(text_response("Hello from the model"));
    let (status, body) = send(
        &app,
        json_req("POST", "/api/agents/a/prompt", json!({"message": "hi"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["response"], "Hello from the model");
    let session_id = body["sessionId"].as_str().unwrap().to_string();
    assert!(body["usage"]["inputTokens"].is_u64());
    // The default key of the API.
    let sessions = f.gw.sessions("a").await.unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].key, "api:a:default");
    assert_eq!(sessions[0].id, session_id);

    // Listing, transcript, settings, cancel and hooks through the API.
    let (_, body) = send(
        &app,
        req("GET", "/api/agents/a/sessions")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(body["sessions"][0]["id"], session_id.as_str());
    let (_, body) = send(
        &app,
        req(
            "GET",
            &format!("/api/agents/a/sessions/{session_id}/messages"),
        )
        .body(Body::empty())
        .unwrap(),
    )
    .await;
    assert_eq!(body["messages"][0]["role"], "user");
    assert_eq!(
        body["messages"][1]["content"][0]["text"],
        "Hello from the model"
    );
    let (status, body) = send(
        &app,
        json_req(
            "POST",
            "/api/agents/a/sessions",
            json!({"sessionKey": "api:a:default"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(body["id"], session_id.as_str());
    let (status, body) = send(
        &app,
        json_req(
            "POST",
            "/api/agents/a/sessions/api:a:default/resume",
            json!({"sessionId": session_id}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["id"], session_id.as_str());
    let (status, body) = send(
        &app,
        json_req(
            "PATCH",
            "/api/agents/a/sessions/api:a:default/settings",
            json!({"verbose": true, "streaming": false}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"verbose": true, "streaming": false, "modelOverride": null})
    );
    let (_, body) = send(
        &app,
        req("GET", "/api/agents/a/sessions/api:a:default/settings")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(body["verbose"], true);
    let cancel = req("POST", "/api/agents/a/sessions/api:a:default/cancel")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        send(&app, cancel).await,
        (StatusCode::OK, json!({"cancelled": false}))
    );
    let (status, body) = send(
        &app,
        json_req(
            "POST",
            "/api/agents/a/hooks/pre-prompt",
            json!({"message": "hi"}),
        ),
    )
    .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"message": "hi"})));
    let (status, body) = send(
        &app,
        json_req(
            "POST",
            "/api/agents/a/hooks/post-response",
            json!({"response": "r"}),
        ),
    )
    .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"response": "r"})));
    let observer = req("POST", "/api/agents/a/hooks/session-disposed")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        send(&app, observer).await,
        (StatusCode::OK, json!({"ok": true}))
    );

    // Listings.
    let (_, body) = send(&app, req("GET", "/api/agents").body(Body::empty()).unwrap()).await;
    let agent = &body["agents"][0];
    assert_eq!(agent["name"], "a");
    assert_eq!(agent["model"], "anthropic/claude-sonnet-4-6");
    assert_eq!(
        agent["fallbackModels"],
        json!(["anthropic/claude-haiku-4-5"])
    );
    assert!(agent["toolContext"].is_string() && agent["skillContext"].is_string());
    let (_, body) = send(
        &app,
        req("GET", "/api/agents/a/models")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(body["models"][0]["role"], "primary");
    assert_eq!(body["models"][1]["model"], "claude-haiku-4-5");
    let (_, body) = send(&app, req("GET", "/api/config").body(Body::empty()).unwrap()).await;
    assert_eq!(body["providers"]["anthropic"]["hasApiKey"], true);
    assert!(!body.to_string().contains(KEY), "no secrets in /api/config");
    let (status, body) = send(
        &app,
        req("GET", "/api/health/models")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"models": {}})));
}

#[tokio::test]
async fn a_failed_prompt_is_502_with_a_hint() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    for _ in 0..2 {
        f.llm.push(beige_testkit::anthropic::error_reply(
            401,
            "authentication_error",
            "invalid x-api-key",
        ));
    }
    let (status, body) = send(
        &f.app(),
        json_req("POST", "/api/agents/a/prompt", json!({"message": "hi"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("invalid x-api-key"),
        "{body}"
    );
    assert_eq!(body["kind"], "auth");
    assert!(body["hint"].as_str().unwrap().contains("apiKey"), "{body}");
}

/// A prompt with an `Idempotency-Key` header.
fn keyed_prompt(key: &str, message: &str, sse: bool) -> Request<Body> {
    let mut r = req("POST", "/api/agents/a/prompt")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key);
    if sse {
        r = r.header(header::ACCEPT, "text/event-stream");
    }
    r.body(Body::from(
        json!({"message": message, "sessionKey": "api:a:idem"}).to_string(),
    ))
    .unwrap()
}

#[tokio::test]
async fn a_prompt_retried_with_its_idempotency_key_runs_and_is_stored_once() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let app = f.app();
    f.llm.push(text_response("the first answer"));
    let (status, first) = send(&app, keyed_prompt("retry-1", "hi", false)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["response"], "the first answer");

    // The retry gets the stored answer: no model call, nothing stored again.
    let (status, again) = send(&app, keyed_prompt("retry-1", "hi", false)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first);
    assert_eq!(
        f.llm.requests().len(),
        1,
        "the retry did not call the model"
    );
    let session_id = first["sessionId"].as_str().unwrap().to_string();
    let messages = |app: axum::Router| {
        let path = format!("/api/agents/a/sessions/{session_id}/messages");
        async move {
            let (status, body) = send(&app, req("GET", &path).body(Body::empty()).unwrap()).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body["messages"].as_array().unwrap().len()
        }
    };
    assert_eq!(messages(app.clone()).await, 2, "one question, one answer");

    // Over SSE the retry is one `done` event with the same answer.
    let response = app
        .clone()
        .oneshot(keyed_prompt("retry-1", "hi", true))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let events = sse_events(response.into_body()).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "done");
    assert_eq!(events[0].1["response"], "the first answer");
    assert_eq!(events[0].1["sessionId"], first["sessionId"]);

    // The same key with another message is refused, and runs nothing.
    let (status, body) = send(&app, keyed_prompt("retry-1", "something else", false)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["kind"], "idempotency_conflict");
    assert!(
        body["error"].as_str().unwrap().contains("retry-1"),
        "{body}"
    );
    assert!(
        body["hint"]
            .as_str()
            .unwrap()
            .contains("new Idempotency-Key"),
        "{body}"
    );
    assert_eq!(f.llm.requests().len(), 1);

    // A prompt that failed stored no answer: its retry runs, once.
    for _ in 0..2 {
        f.llm.push(beige_testkit::anthropic::error_reply(
            401,
            "authentication_error",
            "invalid x-api-key",
        ));
    }
    let (status, body) = send(&app, keyed_prompt("retry-2", "and now?", false)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    f.llm.push(text_response("the second answer"));
    let (status, body) = send(&app, keyed_prompt("retry-2", "and now?", false)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["response"], "the second answer");
    let (_, body) = send(&app, keyed_prompt("retry-2", "and now?", false)).await;
    assert_eq!(body["response"], "the second answer");
    assert_eq!(f.llm.requests().len(), 4, "1 + 2 failed attempts + 1");

    // Keys that cannot be keys are a 400 naming the header.
    for bad in ["", "has space", &"k".repeat(256)] {
        let (status, body) = send(&app, keyed_prompt(bad, "hi", false)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("Idempotency-Key"),
            "{body}"
        );
    }
    assert_eq!(f.llm.requests().len(), 4);
}

#[tokio::test]
async fn restart_needs_a_hook() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let (status, body) = send(
        &f.app(),
        json_req("POST", "/api/gateway/restart", json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert!(body["error"].as_str().unwrap().contains("cannot restart"));
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = router(f.state().with_restart(Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })));
    let r = req("POST", "/api/gateway/restart")
        .body(Body::empty())
        .unwrap();
    let (status, body) = send(&app, r).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["status"], "restarting");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Event names of an SSE response body, and their data.
async fn sse_events(body: Body) -> Vec<(String, Value)> {
    body.into_data_stream()
        .eventsource()
        .map(|e| {
            let e = e.unwrap();
            (e.event, serde_json::from_str(&e.data).unwrap())
        })
        .collect()
        .await
}

#[tokio::test]
async fn sse_streams_every_event_in_order() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    f.llm.push(
        MessageStream::new()
            .text("one two three four")
            .piece_size(4)
            .usage(10, 5)
            .reply()
            .chunked(9),
    );
    let request = req("POST", "/api/agents/a/prompt")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "text/event-stream")
        .body(Body::from(
            json!({"message": "count", "sessionKey": "api:a:sse"}).to_string(),
        ))
        .unwrap();
    let response = f.app().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let events = sse_events(response.into_body()).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"turn_started"), "{names:?}");
    assert_eq!(names.last(), Some(&"done"), "{names:?}");
    let first_delta = names.iter().position(|n| *n == "text_delta").unwrap();
    let done = names.iter().position(|n| *n == "done").unwrap();
    assert!(first_delta < done);
    assert!(
        names.iter().filter(|n| **n == "text_delta").count() > 1,
        "{names:?}"
    );
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "text_delta")
        .map(|(_, d)| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "one two three four");
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "the data carries its type");
        // Every payload is an AgentEvent.
        serde_json::from_value::<AgentEvent>(data.clone()).unwrap();
    }
    assert_eq!(events[done].1["response"], "one two three four");
}

#[tokio::test]
async fn closing_the_stream_mid_prompt_cancels_it() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    // The model says something, then hangs forever.
    f.llm.push(
        Reply::sse(
            MessageStream::new()
                .text("partial")
                .piece_size(100)
                .without_stop()
                .body(),
        )
        .hang_after(),
    );
    let served = f.serve(f.state()).await;
    let response = reqwest::Client::new()
        .post(format!("{}/api/agents/a/prompt", served.url()))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .json(&json!({"message": "hang", "sessionKey": "api:a:hang"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut events = response.bytes_stream().eventsource();
    // The delta arrives while the model is still streaming.
    loop {
        let e = events.next().await.unwrap().unwrap();
        if e.event == "text_delta" {
            let data: Value = serde_json::from_str(&e.data).unwrap();
            assert_eq!(data["text"], "partial");
            break;
        }
    }
    assert_eq!(f.gw.running_prompts(), 1);
    assert_eq!(f.llm.in_flight(), 1);
    drop(events); // closes the connection
    eventually("the prompt to be cancelled", || f.gw.running_prompts() == 0).await;
    eventually("the model request to be dropped", || f.llm.in_flight() == 0).await;
    served.stop().await;
}

#[tokio::test]
async fn bind_refuses_unsafe_addresses_and_explains_a_busy_port() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let open = ApiState::new(f.gw.clone(), None);
    let err = HttpApiChannel::bind("0.0.0.0", 0, open.clone()).unwrap_err();
    assert!(err.to_string().contains("without authentication"), "{err}");
    // Loopback without a token is allowed (gateway.auth: false).
    let (open_channel, _) = HttpApiChannel::bind("127.0.0.1", 0, open).unwrap();
    drop(open_channel);

    let (first, addr) = HttpApiChannel::bind("127.0.0.1", 0, f.state()).unwrap();
    let err = HttpApiChannel::bind("127.0.0.1", addr.port(), f.state()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("already in use"), "{message}");
    assert!(message.contains("beige gateway status"), "{message}");
    drop(first);
}

#[tokio::test]
async fn remote_gateway_round_trip() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let served = f.serve(f.state()).await;
    let remote = RemoteGateway::new(&served.url(), Some(TOKEN.into())).unwrap();

    let status = remote.status().await.unwrap();
    assert_eq!(status["status"], "ok");
    let agents = remote.agents().await.unwrap();
    assert_eq!(agents, f.gw.agents().await.unwrap());
    assert_eq!(
        remote.models("a").await.unwrap(),
        f.gw.models("a").await.unwrap()
    );
    assert_eq!(
        remote.config_summary().await.unwrap(),
        f.gw.config_summary().await.unwrap()
    );
    assert!(remote.health().await.unwrap().is_empty());
    assert_eq!(
        remote.sandbox_status("a").await.unwrap(),
        f.gw.sandbox_status("a").await.unwrap()
    );

    let out = remote
        .call_tool(
            "a",
            CoreToolCall::Exec(ExecParams {
                command: "echo hi".into(),
                timeout: None,
            }),
            ToolContext {
                session_key: Some("api:a:tools".into()),
                ..ToolContext::default()
            },
        )
        .await
        .unwrap();
    assert!(!out.is_error);
    assert_eq!(out.joined_text(), "Exit code: 0\nfake: echo hi");

    // A prompt, streamed.
    f.llm.push(
        MessageStream::new()
            .text("streamed answer")
            .piece_size(3)
            .reply(),
    );
    let key = "api:a:remote/1"; // a `/` in the key survives the path
    let events = remote
        .prompt(PromptRequest::new("a", key, "hello"))
        .await
        .unwrap()
        .collect_all()
        .await;
    let Some(AgentEvent::Done {
        response,
        session_id,
        ..
    }) = events.last().cloned()
    else {
        panic!("{events:?}")
    };
    assert_eq!(response, "streamed answer");
    assert!(events
        .iter()
        .any(|e| matches!(e, AgentEvent::TextDelta { .. })));

    // Sessions.
    let sessions = remote.sessions("a").await.unwrap();
    assert_eq!(sessions, f.gw.sessions("a").await.unwrap());
    assert_eq!(sessions[0].key, key);
    let messages = remote.session_messages("a", &session_id).await.unwrap();
    assert_eq!(messages[1].text(), "streamed answer");
    let fresh = remote.new_session("a", key).await.unwrap();
    assert_ne!(fresh.id, session_id);
    let resumed = remote.resume_session("a", key, &session_id).await.unwrap();
    assert_eq!(resumed.id, session_id);

    // A keyed prompt sent twice through the client runs once.
    f.llm.push(text_response("keyed answer"));
    let calls = f.llm.requests().len();
    let mut keyed = PromptRequest::new("a", "api:a:remote-keyed", "once");
    keyed.idempotency_key = Some("remote-retry-1".into());
    for _ in 0..2 {
        let events = remote
            .prompt(keyed.clone())
            .await
            .unwrap()
            .collect_all()
            .await;
        assert!(
            matches!(events.last(), Some(AgentEvent::Done { response, .. }) if response == "keyed answer"),
            "{events:?}"
        );
    }
    assert_eq!(f.llm.requests().len(), calls + 1, "the retry did not run");

    // Settings and cancel.
    let settings = remote
        .update_settings(
            "a",
            key,
            SettingsPatch {
                verbose: Some(Some(true)),
                model_override: Some(Some("anthropic/claude-haiku-4-5".into())),
                ..SettingsPatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(settings.verbose, Some(true));
    assert_eq!(remote.settings(key).await.unwrap(), settings);
    assert_eq!(f.gw.settings(key).await.unwrap(), settings);
    let cleared = remote
        .update_settings(
            "a",
            key,
            SettingsPatch {
                model_override: Some(None),
                ..SettingsPatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(cleared.model_override, None);
    assert_eq!(cleared.verbose, Some(true));
    assert!(!remote.cancel("a", key).await.unwrap());

    // Hooks.
    let result = remote
        .run_hook(
            "a",
            HookName::PrePrompt,
            json!({"message": "hi", "sessionKey": key}),
        )
        .await
        .unwrap();
    assert_eq!(result, json!({"message": "hi"}));
    let result = remote
        .run_hook("a", HookName::SessionCreated, json!({"sessionKey": key}))
        .await
        .unwrap();
    assert_eq!(result, json!({}));
    assert!(matches!(
        remote
            .run_hook("a", HookName::GatewayStarted, json!({}))
            .await,
        Err(GatewayError::HookNotTriggerable {
            hook: HookName::GatewayStarted
        })
    ));

    // Errors come back typed.
    match remote.models("x").await {
        Err(GatewayError::UnknownAgent { agent, known }) => {
            assert_eq!(agent, "x");
            assert_eq!(known, "a");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        remote
            .prompt(PromptRequest::new("x", "api:x:default", "hi"))
            .await,
        Err(GatewayError::UnknownAgent { .. })
    ));
    match remote.sandbox_status("x").await {
        Err(GatewayError::UnknownAgent { agent, known }) => {
            assert_eq!((agent.as_str(), known.as_str()), ("x", "a"));
        }
        other => panic!("{other:?}"),
    }
    match remote.session_messages("a", "s_ffffffffffffffff").await {
        Err(GatewayError::UnknownSession { agent, session }) => {
            assert_eq!(
                (agent.as_str(), session.as_str()),
                ("a", "s_ffffffffffffffff")
            );
        }
        other => panic!("{other:?}"),
    }
    match remote
        .update_settings(
            "a",
            key,
            SettingsPatch {
                model_override: Some(Some("openai/gpt-4o".into())),
                ..SettingsPatch::default()
            },
        )
        .await
    {
        Err(GatewayError::ModelNotAllowed {
            agent,
            requested,
            allowed,
        }) => {
            assert_eq!(agent, "a");
            assert_eq!(requested, "openai/gpt-4o");
            assert_eq!(
                allowed,
                "anthropic/claude-sonnet-4-6, anthropic/claude-haiku-4-5"
            );
        }
        other => panic!("{other:?}"),
    }
    let wrong = RemoteGateway::new(&served.url(), Some("wrong".into())).unwrap();
    match wrong.agents().await {
        Err(GatewayError::Remote { status, message }) => {
            assert_eq!(status, 401);
            assert_eq!(message, UNAUTHORIZED_MESSAGE);
        }
        other => panic!("{other:?}"),
    }
    // Health needs no token, so a client can tell "wrong token" from "not running".
    assert!(wrong.status().await.is_ok());

    served.stop().await;

    // Nothing listens any more.
    match remote.agents().await {
        Err(e @ GatewayError::Unreachable { .. }) => {
            assert!(e.to_string().contains("beige gateway start"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dropping_a_remote_prompt_cancels_it_on_the_gateway() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    f.llm.push(
        Reply::sse(
            MessageStream::new()
                .text("thinking about it")
                .piece_size(100)
                .without_stop()
                .body(),
        )
        .hang_after(),
    );
    let served = f.serve(f.state()).await;
    let remote = RemoteGateway::new(&served.url(), Some(TOKEN.into())).unwrap();
    let mut stream = remote
        .prompt(PromptRequest::new("a", "api:a:drop", "hang"))
        .await
        .unwrap();
    loop {
        match stream.next().await {
            Some(AgentEvent::TextDelta { text }) => {
                assert_eq!(text, "thinking about it");
                break;
            }
            Some(_) => {}
            None => panic!("the stream ended early"),
        }
    }
    assert_eq!(f.gw.running_prompts(), 1);
    drop(stream);
    eventually("the prompt to be cancelled", || f.gw.running_prompts() == 0).await;
    eventually("the model request to be dropped", || f.llm.in_flight() == 0).await;
    served.stop().await;
}

#[tokio::test]
async fn remote_gateway_from_home_reads_the_token() {
    let Some(f) = Fixture::new().await else {
        return;
    };
    let served = f.serve(f.state()).await;
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path());
    std::fs::write(home.token_path(), format!("{TOKEN}\n")).unwrap();
    let remote = RemoteGateway::from_home(&home, Some(&served.url())).unwrap();
    assert_eq!(remote.agents().await.unwrap().len(), 1);
    // Without a token file: no token, so the gateway says how to get one.
    std::fs::remove_file(home.token_path()).unwrap();
    let remote = RemoteGateway::from_home(&home, Some(&served.url())).unwrap();
    assert!(matches!(
        remote.agents().await,
        Err(GatewayError::Remote { status: 401, .. })
    ));
    served.stop().await;
}

/// A gateway whose agents cover every link mode: `a` the default (`unix`), `b`
/// `attach`, `c` `off`, and `r` a root sandbox (always `off`). The memory sandbox
/// reports for each what the Docker backend reports when the link is down (that the
/// Docker backend does so is checked on Docker, in `link.rs`).
async fn link_modes_gateway(dir: &std::path::Path) -> Option<LocalGateway> {
    let agent = |sandbox: Value| {
        let mut sb = json!({"image": super::support::test_image(), "memoryLimit": "256m"});
        for (k, v) in sandbox.as_object().unwrap() {
            sb[k] = v.clone();
        }
        json!({
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": [],
            "sandbox": sb,
        })
    };
    let config: Config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": KEY, "baseUrl": "http://127.0.0.1:9"}}},
        "agents": {
            "a": agent(json!({})),
            "b": agent(json!({"link": "attach"})),
            "c": agent(json!({"link": "off"})),
            "r": agent(json!({"user": "root"})),
        },
    }))
    .unwrap();
    let sandbox = MemorySandbox::new();
    for (agent, mode) in [
        ("a", LinkMode::Unix),
        ("b", LinkMode::Attach),
        ("c", LinkMode::Off),
        ("r", LinkMode::Off),
    ] {
        sandbox.set_status(SandboxStatus {
            agent: agent.into(),
            container: link_modes_container(agent),
            link_mode: mode,
            link: (mode != LinkMode::Off).then(|| LinkStatus {
                agent: agent.into(),
                ..Default::default()
            }),
            ping_us: None,
        });
    }
    Some(
        GatewayBuilder::new(config, BeigeHome::new(dir.join("home")))
            .sandbox(Arc::new(sandbox))
            .build()
            .await
            .unwrap(),
    )
}

fn link_modes_container(agent: &str) -> String {
    format!("beige-{agent}-0123456789ab")
}

#[tokio::test]
async fn sandbox_route_reports_the_link_of_each_agent() {
    let dir = tempfile::tempdir().unwrap();
    let Some(gw) = link_modes_gateway(dir.path()).await else {
        return;
    };
    let gw = Arc::new(gw);
    let container = link_modes_container;
    let app = router(ApiState::new(gw.clone(), Some(TOKEN.to_string())));
    let get = |path: &str| req("GET", path).body(Body::empty()).unwrap();

    // A link mode with no link up: the link is reported down, with its counters.
    for (agent, mode) in [("a", "unix"), ("b", "attach")] {
        let (status, body) = send(&app, get(&format!("/api/agents/{agent}/sandbox"))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body,
            json!({
                "agent": agent,
                "container": container(agent),
                "linkMode": mode,
                "link": {
                    "agent": agent,
                    "connected": false,
                    "connects": 0,
                    "rejectedPeers": 0,
                    "opsLink": 0,
                    "opsFallback": 0,
                    "duplicatesDropped": 0,
                },
                "pingUs": null,
            })
        );
        let typed: SandboxStatus = serde_json::from_value(body).unwrap();
        assert_eq!(typed, gw.sandbox_status(agent).await.unwrap());
    }
    // `off`, configured or forced by a root sandbox: no link at all.
    for agent in ["c", "r"] {
        let (status, body) = send(&app, get(&format!("/api/agents/{agent}/sandbox"))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body,
            json!({
                "agent": agent,
                "container": container(agent),
                "linkMode": "off",
                "link": null,
                "pingUs": null,
            })
        );
    }

    // Unknown agents are 404 like on every per-agent route, in process and typed.
    let (status, body) = send(&app, get("/api/agents/x/sandbox")).await;
    assert_eq!(
        (status, body),
        (StatusCode::NOT_FOUND, json!({"error": "Unknown agent: x"}))
    );
    assert!(matches!(
        gw.sandbox_status("x").await,
        Err(GatewayError::UnknownAgent { .. })
    ));

    // The token is needed.
    for auth in [None, Some("Bearer wrong-token")] {
        let mut b = Request::builder()
            .uri("/api/agents/a/sandbox")
            .header(header::HOST, "localhost:7433");
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        let (status, body) = send(&app, b.body(Body::empty()).unwrap()).await;
        assert_eq!(
            (status, body),
            (
                StatusCode::UNAUTHORIZED,
                json!({"error": UNAUTHORIZED_MESSAGE})
            ),
            "{auth:?}"
        );
    }
}

#[test]
fn sandbox_status_parses_older_and_newer_answers() {
    // A link reported with only some fields (an older gateway) and with fields this
    // build does not know (a newer one).
    let older: SandboxStatus = serde_json::from_value(json!({
        "agent": "a",
        "container": "beige-x-a",
        "linkMode": "unix",
        "link": {"connected": true, "carrier": "attach"},
    }))
    .unwrap();
    let link = older.link.unwrap();
    assert!(link.connected);
    assert_eq!(link.ops_link, 0);
    assert_eq!(older.ping_us, None);
    let newer: SandboxStatus = serde_json::from_value(json!({
        "agent": "a",
        "container": "beige-x-a",
        "linkMode": "attach",
        "link": {"agent": "a", "connected": false, "connects": 3, "opsLink": 7, "opsFallback": 2,
                 "rejectedPeers": 0, "duplicatesDropped": 0, "somethingNew": {"x": 1}},
        "pingUs": null,
        "alsoNew": true,
    }))
    .unwrap();
    let link = newer.link.unwrap();
    assert_eq!((link.connects, link.ops_link, link.ops_fallback), (3, 7, 2));
    // And what the gateway writes reads back the same.
    let off = SandboxStatus {
        agent: "r".into(),
        container: "beige-x-r".into(),
        link_mode: beige_core::config::LinkMode::Off,
        link: None,
        ping_us: None,
    };
    let text = serde_json::to_value(&off).unwrap();
    assert_eq!(text["linkMode"], "off");
    assert_eq!(serde_json::from_value::<SandboxStatus>(text).unwrap(), off);
}
