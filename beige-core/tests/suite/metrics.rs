//! `GET /metrics` (observability.md §2) after a scripted workload: a prompt answered by
//! the fake Anthropic server (a scripted model on 127.0.0.1), three allowed `kv` calls,
//! a call of a tool the agent lacks and one of a tool nobody configured. The scrape is
//! read back with an independent parser of the Prometheus text format; the test checks
//! exact counter values, histogram counts equal to call counts, the naming conventions,
//! that no label carries a session key or a made-up tool name, and the route's refusals
//! (no token, metrics not enabled).
//!
//! The gateway runs whole with a `MemorySandbox` (no sandbox behaviour is measured: the
//! plugin calls take the socket's guarded path, `LocalGateway::handle_tool_request`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use beige_core::channel::http::{router, ApiState};
use beige_core::testing::MemorySandbox;
use beige_core::{BeigeHome, Gateway as _, GatewayBuilder, LocalGateway, PromptRequest};
use beige_protocol::socket::ToolRequest;
use beige_testkit::anthropic::MessageStream;
use beige_testkit::llm::FakeLlmServer;
use serde_json::json;
use tower::ServiceExt;

const TOKEN: &str = "metrics-test-token-0123456789";
const SESSION: &str = "api:a:metrics-session-4711";

async fn gateway(dir: &tempfile::TempDir, llm: &FakeLlmServer, enabled: bool) -> LocalGateway {
    let agent = |tools: serde_json::Value| {
        json!({
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": tools,
        })
    };
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": llm.url()}}},
        "plugins": {"kv": {}},
        "agents": {"a": agent(json!(["kv"])), "b": agent(json!([]))},
        "telemetry": {"metrics": {"enabled": enabled}},
    }))
    .unwrap();
    GatewayBuilder::new(config, BeigeHome::new(dir.path().join("home")))
        .sandbox(Arc::new(MemorySandbox::new()))
        .build()
        .await
        .unwrap()
}

async fn scrape(gw: &LocalGateway, token: Option<&str>) -> (StatusCode, String) {
    let app = router(ApiState::new(Arc::new(gw.clone()), Some(TOKEN.to_string())));
    let mut req = Request::get("/metrics").header(header::HOST, "127.0.0.1");
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let response = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// The value of the sample `name` whose labels include all of `labels`.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(h) => h.last().map_or(0.0, |b| b.count),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

#[tokio::test]
async fn a_scrape_after_a_scripted_workload_has_the_expected_counters() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlmServer::start().await;
    llm.push(MessageStream::new().text("hello").usage(120, 7).reply());
    let gw = gateway(&dir, &llm, true).await;

    let events = gw
        .prompt(PromptRequest::new("a", SESSION, "say hello"))
        .await
        .unwrap()
        .collect_all()
        .await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, beige_core::AgentEvent::Done { .. })),
        "{events:?}"
    );
    for i in 0..3 {
        let r = gw
            .handle_tool_request(
                "a",
                ToolRequest::new("kv", vec!["set".into(), format!("k{i}"), "v".into()]),
            )
            .await;
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["exitCode"], 0, "{v}");
    }
    // b lacks kv; nobody configured "made-up-tool-4711".
    for (agent, tool) in [("b", "kv"), ("a", "made-up-tool-4711")] {
        let r = gw
            .handle_tool_request(
                agent,
                ToolRequest::new(tool, vec!["get".into(), "k0".into()]),
            )
            .await;
        let v = serde_json::to_value(&r).unwrap();
        assert_ne!(v["exitCode"], 0, "{v}");
    }

    // Two core tool ops reach the (in-memory) sandbox: one write, one read.
    for (tool, params) in [
        ("write", json!({"path": "notes.txt", "content": "hi"})),
        ("read", json!({"path": "notes.txt"})),
    ] {
        let call = beige_core::api::CoreToolCall::parse(tool, params).unwrap();
        let out = gw
            .call_tool("a", call, beige_core::api::ToolContext::default())
            .await
            .unwrap();
        assert!(!out.is_error, "{out:?}");
    }

    // Refused without the token; answered with it.
    let (status, _) = scrape(&gw, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, text) = scrape(&gw, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");

    let lines = text.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines).unwrap();
    assert!(!parsed.samples.is_empty(), "{text}");

    let kv_allowed = [
        ("agent", "a"),
        ("kind", "plugin"),
        ("tool", "kv"),
        ("decision", "allowed"),
    ];
    assert_eq!(
        value(&parsed, "beige_tool_calls_total", &kv_allowed),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(
            &parsed,
            "beige_tool_calls_total",
            &[("agent", "b"), ("tool", "kv"), ("decision", "denied")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &parsed,
            "beige_tool_calls_total",
            &[("agent", "a"), ("tool", "other"), ("decision", "denied")]
        ),
        Some(1.0),
        "{text}"
    );
    // The histogram counted every timed call of kv.
    assert_eq!(
        value(
            &parsed,
            "beige_tool_call_duration_seconds",
            &[("agent", "a"), ("tool", "kv")]
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(
            &parsed,
            "beige_prompts_total",
            &[("agent", "a"), ("channel", "api"), ("outcome", "done")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&parsed, "beige_prompt_duration_seconds", &[("agent", "a")]),
        Some(1.0),
        "{text}"
    );
    let model = [("provider", "anthropic"), ("model", "claude-sonnet-4-6")];
    assert_eq!(
        value(&parsed, "beige_model_calls_total", &model),
        Some(1.0),
        "{text}"
    );
    let input: Vec<(&str, &str)> = model.iter().copied().chain([("kind", "input")]).collect();
    let output: Vec<(&str, &str)> = model.iter().copied().chain([("kind", "output")]).collect();
    assert_eq!(
        value(&parsed, "beige_model_tokens_total", &input),
        Some(120.0),
        "{text}"
    );
    assert_eq!(
        value(&parsed, "beige_model_tokens_total", &output),
        Some(7.0),
        "{text}"
    );
    assert!(
        value(&parsed, "beige_model_cost_usd_total", &[("agent", "a")]).is_some_and(|c| c > 0.0),
        "{text}"
    );
    assert_eq!(
        value(&parsed, "beige_approvals_pending", &[("agent", "a")]),
        Some(0.0),
        "{text}"
    );
    assert!(
        value(&parsed, "beige_audit_records_total", &[("type", "tool")]).is_some_and(|n| n >= 5.0),
        "{text}"
    );

    // Each core op timed once, by op and the transport it took.
    for op in ["write", "read"] {
        assert_eq!(
            value(
                &parsed,
                "beige_sandbox_op_duration_seconds",
                &[("op", op), ("transport", "direct")]
            ),
            Some(1.0),
            "{text}"
        );
    }
    // Every record written was timed, and none failed; nobody waited for a session or
    // a provider slot (no gauge was ever made).
    let records: f64 = parsed
        .samples
        .iter()
        .filter(|s| s.metric == "beige_audit_records_total")
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum();
    assert!(records >= 9.0, "{text}");
    assert_eq!(
        value(&parsed, "beige_audit_commit_duration_seconds", &[]),
        Some(records),
        "{text}"
    );
    assert_eq!(
        value(&parsed, "beige_audit_write_failures_total", &[]),
        Some(0.0),
        "{text}"
    );
    assert_eq!(value(&parsed, "beige_session_waiters", &[]), None, "{text}");
    assert_eq!(
        value(&parsed, "beige_provider_queue_depth", &[]),
        None,
        "{text}"
    );

    // Conventions: the beige_ prefix, valid names, _total on counters, base units, and
    // bounded labels only.
    let mut types: HashMap<String, String> = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line["# TYPE ".len()..].split(' ');
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        types.insert(name.to_string(), kind.to_string());
        assert!(name.starts_with("beige_"), "{line}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{line}"
        );
        if kind == "histogram" {
            assert!(
                name.ends_with("_seconds"),
                "a histogram in base units: {line}"
            );
        }
    }
    for sample in &parsed.samples {
        let family = sample
            .metric
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count")
            .trim_end_matches("_total")
            .trim_end_matches("_created");
        let kind = types
            .get(family)
            .or_else(|| types.get(&sample.metric))
            .unwrap_or_else(|| panic!("{} has no TYPE line", sample.metric));
        if kind == "counter" {
            assert!(sample.metric.ends_with("_total"), "{}", sample.metric);
        }
        for (k, v) in sample.labels.iter() {
            assert!(
                !v.contains("metrics-session-4711") && !v.contains("made-up-tool"),
                "{} has an unbounded label {k}={v}",
                sample.metric
            );
        }
    }
}

#[tokio::test]
async fn metrics_are_not_served_unless_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlmServer::start().await;
    let gw = gateway(&dir, &llm, false).await;
    let (status, body) = scrape(&gw, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{body}");
    assert!(body.contains("telemetry.metrics.enabled"), "{body}");
}

/// A gateway whose `telemetry.metrics` is `metrics` (no model is called).
async fn gateway_with(dir: &tempfile::TempDir, metrics: serde_json::Value) -> LocalGateway {
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": "http://127.0.0.1:9"}}},
        "agents": {"a": {"model": {"provider": "anthropic", "model": "claude-sonnet-4-6"}, "tools": []}},
        "telemetry": {"metrics": metrics},
    }))
    .unwrap();
    GatewayBuilder::new(config, BeigeHome::new(dir.path().join("home")))
        .sandbox(Arc::new(MemorySandbox::new()))
        .build()
        .await
        .unwrap()
}

/// `GET path` over plain HTTP/1.1 to `addr` with this `Host` (and `Origin`): the status
/// and the body.
async fn raw_get(
    addr: std::net::SocketAddr,
    path: &str,
    host: &str,
    origin: Option<&str>,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{origin}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

#[tokio::test]
async fn the_loopback_listener_serves_metrics_without_a_token_and_checks_host() {
    use beige_core::Shutdown;
    use tokio_util::sync::CancellationToken;

    let dir = tempfile::tempdir().unwrap();
    // Not enabled on the API's port: the listener serves on its own.
    let gw = gateway_with(&dir, json!({"listen": "127.0.0.1:0"})).await;
    let token = CancellationToken::new();
    let serving = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(token.clone()).drain(std::time::Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    let addr = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            if let Some(addr) = gw.metrics_listen_addr() {
                return addr;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the metrics listener started");
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_ne!(addr.port(), 0);

    // No token needed; the same text as the API's route.
    let host = format!("127.0.0.1:{}", addr.port());
    let (status, body) = raw_get(addr, "/metrics", &host, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(
        body.contains("beige_approvals_pending{agent=\"a\"} 0"),
        "{body}"
    );
    let (status, _) = raw_get(addr, "/metrics", "localhost", None).await;
    assert_eq!(status, 200);

    // The API's Host and Origin checks.
    let (status, body) = raw_get(addr, "/metrics", "metrics.attacker.example", None).await;
    assert_eq!(status, 421, "{body}");
    assert!(body.contains("metrics.attacker.example"), "{body}");
    let (status, body) = raw_get(addr, "/metrics", &host, Some("http://attacker.example")).await;
    assert_eq!(status, 403, "{body}");
    // Only /metrics.
    let (status, _) = raw_get(addr, "/api/agents", &host, None).await;
    assert_eq!(status, 404);

    // The API's own /metrics is still off (not enabled).
    let (status, _) = scrape(&gw, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);

    token.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(20), serving)
        .await
        .expect("serve ends")
        .unwrap()
        .unwrap();
    assert_eq!(gw.metrics_listen_addr(), None);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener closed with the gateway"
    );
}

#[tokio::test]
async fn a_metrics_listener_on_a_non_loopback_address_is_refused() {
    use beige_core::{ServeError, Shutdown};
    use tokio_util::sync::CancellationToken;

    for listen in [
        "0.0.0.0:9464",
        "10.1.2.3:9464",
        "[::]:9464",
        "metrics.example:9464",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway_with(&dir, json!({"listen": listen})).await;
        let result = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            gw.serve(
                Shutdown::on(CancellationToken::new()).drain(std::time::Duration::from_secs(1)),
            ),
        )
        .await
        .expect("serve refuses at once");
        match result {
            Err(e @ ServeError::MetricsListen { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains("telemetry.metrics.listen") && message.contains(listen),
                    "{message}"
                );
                assert!(
                    message.contains("127.0.0.1:9464"),
                    "says what to use: {message}"
                );
            }
            other => panic!("{listen}: {other:?}"),
        }
        assert_eq!(gw.metrics_listen_addr(), None);
    }
}

/// A Docker sandbox on the Unix link: the link's gauge and an op's transport, as the
/// link hub and the gateway report them.
#[tokio::test]
async fn a_docker_sandbox_reports_its_link_and_the_ops_transport() {
    use beige_core::Admin as _;

    let env = crate::docker_or_skip!();
    let t = super::support::TestHome::new();
    let mut config = t.config(&env, &[("a", json!({"sandbox": {"link": "unix"}}))]);
    config.telemetry = Some(serde_json::from_value(json!({"metrics": {"enabled": true}})).unwrap());
    let gw = t.gateway(&env, config).await;
    let call = beige_core::api::CoreToolCall::parse("exec", json!({"command": "true"})).unwrap();
    let out = gw
        .call_tool("a", call, beige_core::api::ToolContext::default())
        .await
        .unwrap();
    assert!(!out.is_error, "{out:?}");
    assert_eq!(
        out.transport.map(|t| t.as_str().to_string()).as_deref(),
        Some("link-unix")
    );
    let text = gw.metrics().await.unwrap();
    let sample = |series: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    };
    assert_eq!(sample(r#"beige_link_up{agent="a"}"#), Some(1.0), "{text}");
    assert_eq!(
        sample(r#"beige_sandbox_op_duration_seconds_count{op="exec",transport="link-unix"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(r#"beige_link_rejected_peers_total{agent="a"}"#),
        None
    );
    gw.shutdown().await.unwrap();
}
