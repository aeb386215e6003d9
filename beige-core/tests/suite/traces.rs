//! OpenTelemetry traces (observability.md §1, §4) against a fake OTLP collector: an axum
//! server on `127.0.0.1:0` that takes `POST /v1/traces` and decodes the protobuf body
//! with the opentelemetry-proto types, as a real collector would. The model is the
//! fake Anthropic server (a scripted model); the sandbox is real Docker, so the
//! script's `kv` calls travel the socket and are attributed to their exec by the kernel.
//!
//! Asserted: one root per turn, the tree `invoke_agent` → `chat` / `execute_tool exec` →
//! `beige.sandbox.op exec` → three `execute_tool kv`, token usage equal to the fake's,
//! audit records carrying their span's ids, and that no prompt text, command line or
//! configured secret is in what reached the collector (unless `capture` asks, and then
//! redacted); a collector answering 503 leaves prompts working and shows in the health.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::StatusCode;
use beige_core::testing::MemorySandbox;
use beige_core::{Admin as _, AgentEvent, BeigeHome, Gateway as _, GatewayBuilder, PromptRequest};
use beige_testkit::anthropic::MessageStream;
use beige_testkit::llm::FakeLlmServer;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;

use super::support::TestHome;
use crate::docker_or_skip;

const MARKER: &str = "PROMPT-MARKER-7731";
const OTLP_TOKEN: &str = "otlp-secret-token-4711-abcdef";
const API_KEY: &str = "sk-test-secret-never-in-sandbox";

/// What the fake collector received: the raw bodies and the decoded spans.
#[derive(Clone, Default)]
struct Collector {
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    spans: Arc<Mutex<Vec<Span>>>,
    headers: Arc<Mutex<Vec<String>>>,
    status: Arc<Mutex<u16>>,
}

impl Collector {
    async fn start(status: u16) -> (Self, String) {
        let c = Collector::default();
        *c.status.lock().unwrap() = status;
        let state = c.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: Bytes| async move {
                    let request = ExportTraceServiceRequest::decode(body.as_ref()).unwrap();
                    state.bodies.lock().unwrap().push(body.to_vec());
                    state.headers.lock().unwrap().push(
                        headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string(),
                    );
                    let mut spans = state.spans.lock().unwrap();
                    for rs in request.resource_spans {
                        for ss in rs.scope_spans {
                            spans.extend(ss.spans);
                        }
                    }
                    let status = *state.status.lock().unwrap();
                    (StatusCode::from_u16(status).unwrap(), Vec::<u8>::new())
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (c, url)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
        .map(|v| match v {
            Value::StringValue(s) => s,
            Value::IntValue(i) => i.to_string(),
            Value::BoolValue(b) => b.to_string(),
            Value::DoubleValue(d) => d.to_string(),
            other => format!("{other:?}"),
        })
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn otlp(url: &str, capture: serde_json::Value) -> serde_json::Value {
    json!({
        "endpoint": url,
        "traces": true,
        "headers": {"authorization": format!("Bearer {OTLP_TOKEN}")},
        "capture": capture,
    })
}

#[tokio::test]
async fn a_prompt_with_an_exec_and_script_calls_exports_its_span_tree() {
    let env = docker_or_skip!();
    let (collector, url) = Collector::start(200).await;
    let llm = FakeLlmServer::start().await;
    // Three plugin calls, then a request to a host no egress rule allows (refused by
    // the gateway's proxy; nothing leaves the machine).
    let command = "kv set alpha 1 && kv set beta 2 && kv get alpha; \
                   printf 'GET http://blocked.example.test/secret-path HTTP/1.1\\r\\nHost: blocked.example.test\\r\\n\\r\\n' \
                   | nc -w 10 127.0.0.1 3128; true";
    llm.push(
        MessageStream::new()
            .tool_use("tu_1", "exec", json!({"command": command}))
            .stop_reason("tool_use")
            .usage(321, 12)
            .reply(),
    );
    llm.push(MessageStream::new().text("all set").usage(400, 5).reply());

    let t = TestHome::new();
    let mut config = t.config(
        &env,
        &[(
            "a",
            json!({
                "tools": ["kv"],
                "egress": {"rules": [{"id": "api", "hosts": ["api.example.test"]}]},
            }),
        )],
    );
    config.plugins = serde_json::from_value(json!({"kv": {}})).unwrap();
    let mut value = serde_json::to_value(&config).unwrap();
    value["llm"]["providers"]["anthropic"]["baseUrl"] = json!(llm.url());
    value["telemetry"] = json!({"otlp": otlp(&url, json!({}))});
    let config = serde_json::from_value(value).unwrap();
    let gw = t.gateway(&env, config).await;

    let events = gw
        .prompt(PromptRequest::new(
            "a",
            "api:a:traces",
            format!("{MARKER}: set alpha and beta"),
        ))
        .await
        .unwrap()
        .collect_all()
        .await;
    assert!(
        events.iter().any(|e| matches!(e, AgentEvent::Done { .. })),
        "{events:#?}"
    );
    // Stopping flushes what is queued.
    gw.shutdown().await.unwrap();

    let spans = collector.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();

    // One root, the turn.
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "{names:?}");
    let root = roots[0];
    assert_eq!(root.name, "invoke_agent a");
    assert_eq!(attr(root, "gen_ai.agent.name").as_deref(), Some("a"));
    assert_eq!(attr(root, "beige.channel").as_deref(), Some("api"));
    assert_eq!(attr(root, "beige.outcome").as_deref(), Some("done"));
    let conversation = attr(root, "gen_ai.conversation.id").unwrap();
    assert_ne!(
        conversation, "api:a:traces",
        "the session id, never its key"
    );
    assert!(spans.iter().all(|s| s.trace_id == root.trace_id));

    // Two model calls under the root, with the fake's usage.
    let chats = named(&spans, "chat claude-sonnet-4-6");
    assert_eq!(chats.len(), 2, "{names:?}");
    assert!(chats.iter().all(|c| c.parent_span_id == root.span_id));
    let mut usage: Vec<(String, String)> = chats
        .iter()
        .map(|c| {
            (
                attr(c, "gen_ai.usage.input_tokens").unwrap(),
                attr(c, "gen_ai.usage.output_tokens").unwrap(),
            )
        })
        .collect();
    usage.sort();
    assert_eq!(
        usage,
        [("321".into(), "12".into()), ("400".into(), "5".into())]
    );
    assert!(chats
        .iter()
        .all(|c| attr(c, "gen_ai.provider.name").as_deref() == Some("anthropic")));

    // The model's exec, its sandbox op, and the script's three kv calls under that.
    let exec = named(&spans, "execute_tool exec");
    assert_eq!(exec.len(), 1, "{names:?}");
    let exec = exec[0];
    assert_eq!(exec.parent_span_id, root.span_id);
    assert_eq!(attr(exec, "beige.decision").as_deref(), Some("ran"));
    assert_eq!(attr(exec, "gen_ai.tool.call.id").as_deref(), Some("tu_1"));
    let op = named(&spans, "beige.sandbox.op exec");
    assert_eq!(op.len(), 1, "{names:?}");
    let op = op[0];
    assert_eq!(op.parent_span_id, exec.span_id);
    assert_eq!(attr(op, "beige.exit_code").as_deref(), Some("0"));
    assert!(
        attr(op, "beige.transport").is_some_and(|t| t.starts_with("link-") || t == "docker-exec"),
        "{:?}",
        attr(op, "beige.transport")
    );
    let kv = named(&spans, "execute_tool kv");
    assert_eq!(kv.len(), 3, "{names:?}");
    for call in &kv {
        assert_eq!(call.parent_span_id, op.span_id, "{names:?}");
        assert_eq!(attr(call, "beige.tool.kind").as_deref(), Some("plugin"));
        assert_eq!(attr(call, "beige.decision").as_deref(), Some("ran"));
        assert_eq!(attr(call, "beige.exec.id"), attr(op, "beige.exec.id"));
    }

    // The refused request, under the exec it came from.
    let egress = named(&spans, "beige.egress.request");
    let log = std::fs::read_to_string(t.home.logs_dir().join("audit.jsonl")).unwrap();
    let egress_log: Vec<&str> = log.lines().filter(|l| l.contains("egress")).collect();
    assert_eq!(egress.len(), 1, "{names:?} {egress_log:#?} {events:#?}");
    let egress = egress[0];
    assert_eq!(egress.parent_span_id, op.span_id);
    assert_eq!(
        attr(egress, "server.address").as_deref(),
        Some("blocked.example.test")
    );
    assert_eq!(attr(egress, "server.port").as_deref(), Some("80"));
    assert_eq!(attr(egress, "beige.decision").as_deref(), Some("denied"));
    assert!(attr(egress, "beige.egress.reason").is_some());

    // The audit records of the kv calls carry their spans' ids.
    let log = std::fs::read_to_string(t.home.logs_dir().join("audit.jsonl")).unwrap();
    let kv_span_ids: std::collections::HashSet<String> =
        kv.iter().map(|s| hex(&s.span_id)).collect();
    let trace_hex = hex(&root.trace_id);
    let kv_records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["tool"] == "kv")
        .collect();
    assert_eq!(kv_records.len(), 6, "started and finished of three calls");
    let egress_records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["type"] == "egress")
        .collect();
    assert!(!egress_records.is_empty());
    for r in &egress_records {
        assert_eq!(r["spanId"], hex(&egress.span_id).as_str(), "{r}");
    }
    for r in &kv_records {
        assert_eq!(r["traceId"], trace_hex.as_str(), "{r}");
        assert!(
            kv_span_ids.contains(r["spanId"].as_str().unwrap()),
            "{r} not in {kv_span_ids:?}"
        );
    }

    // Nothing the user typed, no command line, no secret left for the collector.
    let bodies = collector.bodies.lock().unwrap().clone();
    assert!(!bodies.is_empty());
    for body in &bodies {
        for needle in [MARKER, "kv set alpha", "secret-path", API_KEY, OTLP_TOKEN] {
            assert!(
                memchr_find(body, needle.as_bytes()).is_none(),
                "'{needle}' reached the collector"
            );
        }
    }
    // The configured header went with every export.
    let headers = collector.headers.lock().unwrap().clone();
    assert!(headers.iter().all(|h| h == &format!("Bearer {OTLP_TOKEN}")));
}

#[tokio::test]
async fn captured_prompts_are_redacted_and_a_failing_collector_never_stops_a_prompt() {
    for status in [200u16, 503] {
        let (collector, url) = Collector::start(status).await;
        let llm = FakeLlmServer::start().await;
        llm.push(MessageStream::new().text("hello").usage(10, 2).reply());
        let dir = tempfile::tempdir().unwrap();
        let config = serde_json::from_value(json!({
            "llm": {"providers": {"anthropic": {"apiKey": API_KEY, "baseUrl": llm.url()}}},
            "agents": {"a": {"model": {"provider": "anthropic", "model": "claude-sonnet-4-6"}, "tools": []}},
            "telemetry": {"otlp": otlp(&url, json!({"prompts": true}))},
        }))
        .unwrap();
        let gw = GatewayBuilder::new(config, BeigeHome::new(dir.path().join("home")))
            .sandbox(Arc::new(MemorySandbox::new()))
            .build()
            .await
            .unwrap();
        let events = gw
            .prompt(PromptRequest::new(
                "a",
                "api:a:capture",
                format!("{MARKER} with {API_KEY}"),
            ))
            .await
            .unwrap()
            .collect_all()
            .await;
        assert!(
            events.iter().any(|e| matches!(e, AgentEvent::Done { .. })),
            "collector answering {status}: {events:#?}"
        );
        gw.shutdown().await.unwrap();
        let spans = collector.spans();
        let root = spans
            .iter()
            .find(|s| s.parent_span_id.is_empty())
            .expect("a root span");
        assert_eq!(
            attr(root, "beige.prompt").as_deref(),
            Some(format!("{MARKER} with ***").as_str())
        );
        let health = gw.telemetry_health().expect("export is on");
        if status == 200 {
            assert!(health.last_success.is_some(), "{health:?}");
            assert!(health.last_error.is_none(), "{health:?}");
        } else {
            let (_, error) = health.last_error.expect("the 503 is remembered");
            assert!(error.contains("503"), "{error}");
        }
        // What `beige doctor` reads: the collector and the last outcome, never the
        // headers.
        let summary = gw.config_summary().await.unwrap();
        let traces = &summary["telemetry"]["traces"];
        assert_eq!(traces["enabled"], true, "{summary}");
        assert_eq!(traces["endpoint"], url.as_str(), "{summary}");
        assert!(!summary.to_string().contains(OTLP_TOKEN), "{summary}");
        if status == 503 {
            let message = traces["lastError"]["message"].as_str().unwrap();
            assert!(message.contains("HTTP 503"), "{summary}");
        } else {
            assert!(traces["lastSuccess"].is_string(), "{summary}");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}
