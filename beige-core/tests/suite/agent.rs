//! The agent loop against fake provider servers that speak the real wire formats
//! (beige-testkit), with a real Docker sandbox where tools must really run and the
//! labelled `MemorySandbox` where the test is about routing and sessions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use beige_core::config::Config;
use beige_core::store::{HealthStore, SessionStore, SqliteStore, Stores};
use beige_core::testing::MemoryStore;
use beige_core::AgentEvent;
use beige_core::{Admin as _, Sessions as _};
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway, PromptRequest};
use beige_testkit::anthropic::{error_reply, text_response, tool_use_response, MessageStream};
use beige_testkit::llm::{FakeLlmServer, Part, Reply};
use futures_util::StreamExt;
use serde_json::json;

use super::sandbox_docker::exec;
use super::support::{DockerEnv, TestHome};
use crate::docker_or_skip;
use beige_core::testing::MemorySandbox;

const KEY: &str = "sk-ant-test-key-0123456789";

fn config(
    primary: &FakeLlmServer,
    spare: Option<&FakeLlmServer>,
    agent: serde_json::Value,
) -> Config {
    let mut providers = json!({"anthropic": {"apiKey": KEY, "baseUrl": primary.url()}});
    if let Some(s) = spare {
        providers["spare"] = json!({"api": "anthropic-messages", "apiKey": "sk-spare-key-0123456789", "baseUrl": s.url()});
    }
    let mut a = json!({
        "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
        "tools": [],
        "sandbox": {"image": super::support::test_image(), "memoryLimit": "256m"},
    });
    if spare.is_some() {
        a["fallbackModels"] = json!([{"provider": "spare", "model": "claude-haiku-4-5"}]);
    }
    if let (Some(o), serde_json::Value::Object(extra)) = (a.as_object_mut(), agent) {
        o.extend(extra);
    }
    serde_json::from_value(json!({"llm": {"providers": providers}, "agents": {"a": a}})).unwrap()
}

/// Metrics on, through the API's route (`Admin::metrics`).
fn with_metrics(mut config: Config) -> Config {
    config.telemetry = Some(serde_json::from_value(json!({"metrics": {"enabled": true}})).unwrap());
    config
}

/// The value of the gauge sample written exactly as `series` in `gw`'s metrics.
async fn gauge(gw: &LocalGateway, series: &str) -> Option<f64> {
    let text = gw.metrics().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

async fn fake_gateway(home: &BeigeHome, config: Config) -> Option<LocalGateway> {
    Some(
        GatewayBuilder::new(config, home.clone())
            .sandbox(Arc::new(MemorySandbox::new()))
            .build()
            .await
            .unwrap(),
    )
}

async fn docker_gateway(t: &TestHome, env: &DockerEnv, config: Config) -> LocalGateway {
    let docker = t.docker().await;
    GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker))
        .build()
        .await
        .unwrap()
}

async fn ask(gw: &LocalGateway, key: &str, message: &str) -> Vec<AgentEvent> {
    gw.prompt(PromptRequest::new("a", key, message))
        .await
        .unwrap()
        .collect_all()
        .await
}

fn done_text(events: &[AgentEvent]) -> Option<String> {
    events.iter().find_map(|e| match e {
        AgentEvent::Done { response, .. } => Some(response.clone()),
        _ => None,
    })
}

#[tokio::test]
async fn the_model_writes_a_script_runs_it_and_answers() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let server = FakeLlmServer::start().await;
    server.push(
        tool_use_response(&[(
            "tu_1",
            "write",
            json!({"path": "scripts/hello.sh", "content": "echo hi from the script\n"}),
        )])
        .chunked(7),
    );
    server.push(tool_use_response(&[(
        "tu_2",
        "exec",
        json!({"command": "sh scripts/hello.sh"}),
    )]));
    server.push(
        MessageStream::new()
            .text("The script printed: hi from the script")
            .usage(120, 12)
            .reply()
            .chunked(13),
    );
    let gw = docker_gateway(&t, &env, config(&server, None, json!({}))).await;

    let events = ask(&gw, "api:a:default", "Write a hello script and run it").await;
    assert_eq!(
        done_text(&events).as_deref(),
        Some("The script printed: hi from the script"),
        "{events:#?}"
    );
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            AgentEvent::TurnStarted { .. } => "turn",
            AgentEvent::ToolCallStarted { .. } => "tool_start",
            AgentEvent::ToolCallFinished { .. } => "tool_end",
            AgentEvent::TextDelta { .. } => "text",
            AgentEvent::Usage { .. } => "usage",
            AgentEvent::Done { .. } => "done",
            AgentEvent::ToolOutput { .. } => "live",
            _ => "other",
        })
        .filter(|k| *k != "text")
        .collect();
    let mut kinds = kinds;
    kinds.dedup_by(|a, b| *a == "live" && *b == "live");
    // The script's output streams while it runs (over the shim link), between the
    // start and the end of its call; the `write` prints nothing.
    assert_eq!(
        kinds,
        [
            "turn",
            "usage",
            "tool_start",
            "tool_end",
            "turn",
            "usage",
            "tool_start",
            "live",
            "tool_end",
            "turn",
            "usage",
            "done"
        ]
    );
    let outputs: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallFinished {
                output, is_error, ..
            } => Some(format!("{is_error}:{output}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        outputs,
        [
            "false:Successfully wrote 24 bytes to scripts/hello.sh",
            "false:Exit code: 0\nhi from the script"
        ]
    );

    // What the provider received: auth, version, tool results paired, key nowhere else.
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    for r in &requests {
        assert_eq!(r.header("x-api-key"), Some(KEY));
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(
            r.secret_locations(KEY),
            vec!["header x-api-key".to_string()],
            "{:?}",
            r.secret_locations(KEY)
        );
        beige_testkit::anthropic::check_tool_pairing(&r.body).unwrap();
    }
    let system = requests[0].body["system"].to_string();
    assert!(system.contains("You are a,"), "{system}");
    assert!(
        system.contains("AGENTS.md"),
        "the seeded AGENTS.md is part of the prompt"
    );
    let tools: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["read", "write", "patch", "exec"]);
    assert_eq!(requests[2].body["messages"].as_array().unwrap().len(), 5);

    // Audit: both tool calls, with session, channel and model.
    let audit: Vec<serde_json::Value> = std::fs::read_to_string(t.home.audit_log_path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| !beige_core::audit::chain::is_chain_record(v))
        .collect();
    let tools: Vec<(String, String)> = audit
        .iter()
        .map(|r| {
            (
                r["tool"].as_str().unwrap().into(),
                r["phase"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        tools,
        [
            // The prompt itself, with who sent it (`spec/people.md` §1.4).
            ("prompt".into(), "finished".into()),
            ("write".into(), "started".into()),
            ("write".into(), "finished".into()),
            ("exec".into(), "started".into()),
            ("exec".into(), "finished".into())
        ]
    );
    for r in &audit {
        assert_eq!(r["session"], "api:a:default");
        assert_eq!(r["channel"], "api");
        if r["type"] == "prompt" {
            continue;
        }
        assert_eq!(r["model"], "anthropic/claude-sonnet-4-6");
        assert_eq!(r["type"], "core_tool");
    }

    // Stored: the whole exchange, in order.
    let sessions = gw.sessions("a").await.unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(
        sessions[0].title.as_deref(),
        Some("Write a hello script and run it")
    );
    let messages = gw.session_messages("a", &sessions[0].id).await.unwrap();
    assert_eq!(messages.len(), 6);
    assert_eq!(messages[5].text(), "The script printed: hi from the script");
    assert!(
        std::fs::read_to_string(t.home.default_workspace("a").join("scripts/hello.sh"))
            .unwrap()
            .contains("hi from")
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn rate_limited_primary_falls_back_and_stays_cooling_down_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let primary = FakeLlmServer::start().await;
    let spare = FakeLlmServer::start().await;
    primary.push(
        error_reply(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
        )
        .header("retry-after", "30"),
    );
    spare.push(text_response("answer from the spare"));
    spare.push(text_response("second answer from the spare"));
    spare.push(text_response("third answer from the spare"));
    let cfg = config(&primary, Some(&spare), json!({}));
    let Some(gw) = fake_gateway(&home, cfg.clone()).await else {
        return;
    };

    let events = ask(&gw, "api:a:default", "hello").await;
    assert_eq!(done_text(&events).as_deref(), Some("answer from the spare"));
    let switched: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ModelSwitched { from, to, reason } => {
                Some((from.clone(), to.clone(), reason.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        switched,
        [(
            "anthropic/claude-sonnet-4-6".to_string(),
            "spare/claude-haiku-4-5".to_string(),
            "fallback_rate_limit".to_string()
        )]
    );
    let health = gw.health().await.unwrap();
    let left = health["anthropic/claude-sonnet-4-6"].cooling().unwrap();
    assert!(
        left > Duration::from_secs(25) && left <= Duration::from_secs(30),
        "{left:?}"
    );

    // The next prompt does not even try the primary.
    let events = ask(&gw, "api:a:other", "again").await;
    assert_eq!(
        done_text(&events).as_deref(),
        Some("second answer from the spare")
    );
    assert_eq!(primary.request_count(), 1);
    gw.shutdown().await.unwrap();
    drop(gw);
    tokio::time::sleep(Duration::from_millis(100)).await; // health is written in the background

    // After a restart the cooldown is read back from the store.
    let Some(gw) = fake_gateway(&home, cfg).await else {
        return;
    };
    assert!(gw.health().await.unwrap()["anthropic/claude-sonnet-4-6"]
        .cooling()
        .is_some());
    let events = ask(&gw, "api:a:third", "once more").await;
    assert_eq!(
        done_text(&events).as_deref(),
        Some("third answer from the spare")
    );
    assert_eq!(primary.request_count(), 1);
}

#[tokio::test]
async fn each_part_of_a_mixed_store_gets_only_its_owners_records() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let primary = FakeLlmServer::start().await;
    let spare = FakeLlmServer::start().await;
    primary.push(error_reply(429, "rate_limit_error", "slow down").header("retry-after", "30"));
    spare.push(text_response("answer from the spare"));
    let (sessions, health, rest) = (MemoryStore::new(), MemoryStore::new(), MemoryStore::new());
    let stores = Stores {
        sessions: Arc::new(sessions.clone()),
        health: Arc::new(health.clone()),
        ..Stores::from(Arc::new(rest.clone()))
    };
    let gw = GatewayBuilder::new(config(&primary, Some(&spare), json!({})), home.clone())
        .sandbox(Arc::new(MemorySandbox::new()))
        .stores(stores)
        .build()
        .await
        .unwrap();

    let events = ask(&gw, "api:a:default", "hello").await;
    assert_eq!(done_text(&events).as_deref(), Some("answer from the spare"));
    // The turn is in the sessions part, and only there.
    let s = sessions
        .current_session("api:a:default")
        .await
        .unwrap()
        .unwrap();
    let texts: Vec<String> = sessions
        .messages(&s.id, true)
        .await
        .unwrap()
        .iter()
        .map(|m| m.message.text())
        .collect();
    assert_eq!(texts, ["hello", "answer from the spare"]);
    for other in [&health, &rest] {
        assert_eq!(other.current_session("api:a:default").await.unwrap(), None);
        assert_eq!(other.list_sessions("a").await.unwrap(), []);
    }
    // The cooldown is in the health part (written in the background), and only there.
    let deadline = Instant::now() + Duration::from_secs(10);
    let records = loop {
        let records = health.load_health().await.unwrap();
        if !records.is_empty() || Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].model_key, "anthropic/claude-sonnet-4-6");
    assert!(records[0].cooldown_until.is_some(), "{records:?}");
    assert_eq!(sessions.load_health().await.unwrap(), []);
    assert_eq!(rest.load_health().await.unwrap(), []);
    // Nothing fell back to the default store.
    assert!(!home.db_path().exists());
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn overload_is_transient_and_total_failure_lists_every_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let primary = FakeLlmServer::start().await;
    let spare = FakeLlmServer::start().await;
    primary.push(error_reply(529, "overloaded_error", "Overloaded"));
    spare.push(text_response("spare answers"));
    let Some(gw) = fake_gateway(&home, config(&primary, Some(&spare), json!({}))).await else {
        return;
    };
    let events = ask(&gw, "api:a:default", "hi").await;
    assert_eq!(done_text(&events).as_deref(), Some("spare answers"));
    let h = &gw.health().await.unwrap()["anthropic/claude-sonnet-4-6"];
    assert!(
        h.cooling().is_none(),
        "overload must not cool the model down"
    );
    assert_eq!(h.consecutive_failures, 1);

    // Everything fails: three passes, at most three failures per model, one error.
    for _ in 0..3 {
        primary.push(error_reply(500, "api_error", "Internal server error"));
        spare.push(error_reply(503, "overloaded_error", "busy"));
    }
    let events = ask(&gw, "api:a:default", "hi again").await;
    let error = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::Error { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        error.contains("anthropic/claude-sonnet-4-6 — anthropic answered HTTP 500"),
        "{error}"
    );
    assert!(
        error.contains("spare/claude-haiku-4-5 — spare answered HTTP 503"),
        "{error}"
    );
    assert_eq!(primary.request_count(), 1 + 3);
    assert_eq!(spare.request_count(), 1 + 3);
}

#[tokio::test]
async fn provider_concurrency_is_capped_and_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let server = FakeLlmServer::start().await;
    for i in 0..6 {
        let body = MessageStream::new().text(&format!("answer {i}")).body();
        server.push(Reply::sse_parts(vec![
            Part::Pause(Duration::from_millis(1_000)),
            Part::Bytes(body.into()),
        ]));
    }
    let mut cfg = with_metrics(config(&server, None, json!({})));
    cfg.llm.providers.get_mut("anthropic").unwrap().concurrency = 2;
    let Some(gw) = fake_gateway(&home, cfg).await else {
        return;
    };
    let mut streams = Vec::new();
    for i in 0..6 {
        streams.push(
            gw.prompt(PromptRequest::new(
                "a",
                format!("api:a:s{i}"),
                format!("question {i}"),
            ))
            .await
            .unwrap(),
        );
        // A clear submission order, with room for a loaded machine: each prompt reaches
        // the provider's queue long before the next is submitted.
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    // Two calls run (each takes a second); the other four wait for a slot.
    let queued = r#"beige_provider_queue_depth{provider="anthropic"}"#;
    assert_eq!(gauge(&gw, queued).await, Some(4.0));
    let mut results = Vec::new();
    for s in streams {
        results.push(done_text(&s.collect_all().await));
    }
    assert!(results.iter().all(Option::is_some), "{results:?}");
    assert_eq!(gauge(&gw, queued).await, Some(0.0));
    assert!(server.max_in_flight() <= 2, "{}", server.max_in_flight());
    assert_eq!(server.max_in_flight(), 2);
    let order: Vec<String> = server
        .requests()
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        order,
        (0..6).map(|i| format!("question {i}")).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn one_prompt_at_a_time_per_session_and_sessions_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let server = FakeLlmServer::start().await;
    let Some(gw) = fake_gateway(&home, with_metrics(config(&server, None, json!({})))).await else {
        return;
    };
    for _ in 0..2 {
        let body = MessageStream::new().text("slow").body();
        server.push(Reply::sse_parts(vec![
            Part::Pause(Duration::from_millis(300)),
            Part::Bytes(body.into()),
        ]));
    }
    let a = gw
        .prompt(PromptRequest::new("a", "api:a:one", "first"))
        .await
        .unwrap();
    let b = gw
        .prompt(PromptRequest::new("a", "api:a:one", "second"))
        .await
        .unwrap();
    // The second prompt waits for the session while the first one's answer is slow.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiters = r#"beige_session_waiters{agent="a"}"#;
    assert_eq!(gauge(&gw, waiters).await, Some(1.0));
    let (ea, eb) = tokio::join!(a.collect_all(), b.collect_all());
    assert!(done_text(&ea).is_some() && done_text(&eb).is_some());
    assert_eq!(gauge(&gw, waiters).await, Some(0.0));
    assert_eq!(
        server.max_in_flight(),
        1,
        "same session: one after the other"
    );
    // The second prompt saw the first exchange.
    assert_eq!(
        server.requests()[1].body["messages"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // A session whose model call hangs does not delay another session.
    server.push(Reply::hang());
    server.push(text_response("quick"));
    let stuck = gw
        .prompt(PromptRequest::new("a", "api:a:stuck", "hang"))
        .await
        .unwrap();
    server.wait_for_requests(3).await;
    let started = Instant::now();
    let events = ask(&gw, "api:a:free", "are you there").await;
    assert_eq!(done_text(&events).as_deref(), Some("quick"));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(server.max_in_flight(), 2, "the two sessions overlapped");
    drop(stuck); // cancels the hanging prompt
}

#[tokio::test]
async fn cancelling_during_exec_kills_it() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let server = FakeLlmServer::start().await;
    server.push(tool_use_response(&[(
        "tu_1",
        "exec",
        json!({"command": "sleep 100"}),
    )]));
    let gw = docker_gateway(&t, &env, config(&server, None, json!({}))).await;
    let mut stream = gw
        .prompt(PromptRequest::new("a", "api:a:default", "sleep"))
        .await
        .unwrap();
    while let Some(e) = stream.next().await {
        if matches!(e, AgentEvent::ToolCallStarted { .. }) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // let the command start
    let started = Instant::now();
    assert!(gw.cancel("a", "api:a:default").await.unwrap());
    let mut rest = Vec::new();
    while let Some(e) = stream.next().await {
        rest.push(e);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        rest.iter()
            .any(|e| matches!(e, AgentEvent::Error { message, .. } if message == "cancelled")),
        "{rest:#?}"
    );
    let left = exec(&gw, "a", "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline; echo; done | grep -c '^sleep' || true").await;
    assert_eq!(left.joined_text(), "Exit code: 0\n0");
    // History keeps what happened, closed with a note.
    let s = &gw.sessions("a").await.unwrap()[0];
    let messages = gw.session_messages("a", &s.id).await.unwrap();
    assert!(messages.last().unwrap().text().contains("cancelled"));
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn long_sessions_are_compacted_and_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let server = FakeLlmServer::start().await;
    let cfg = config(
        &server,
        None,
        json!({"model": {"provider": "anthropic", "model": "claude-sonnet-4-6", "compactionThreshold": 600}}),
    );
    let Some(gw) = fake_gateway(&home, cfg).await else {
        return;
    };
    for i in 0..3 {
        server.push(text_response(&format!(
            "answer number {i} {}",
            "filler ".repeat(60)
        )));
        ask(
            &gw,
            "api:a:default",
            &format!("question number {i} {}", "words ".repeat(60)),
        )
        .await;
    }
    server.push(text_response(
        "SUMMARY: three questions were asked and answered.",
    ));
    server.push(text_response("fresh answer"));
    let events = ask(&gw, "api:a:default", "one more").await;
    assert_eq!(
        done_text(&events).as_deref(),
        Some("fresh answer"),
        "{events:#?}"
    );
    assert!(events
        .iter()
        .any(|e| matches!(e, AgentEvent::Compacted { .. })));
    let requests = server.requests();
    let summarise = &requests[requests.len() - 2];
    assert!(
        summarise.body["system"].to_string().contains("summarise"),
        "{}",
        summarise.body["system"]
    );
    let last = &requests[requests.len() - 1].body["messages"];
    assert!(
        last[0]["content"]
            .to_string()
            .contains("SUMMARY: three questions"),
        "{last}"
    );
    assert!(last.to_string().contains("one more"));
    assert!(!last.to_string().contains("question number 0"));

    // Everything is still in the store, the old messages marked compacted.
    let store = SqliteStore::open(home.db_path()).unwrap();
    let s = store
        .current_session("api:a:default")
        .await
        .unwrap()
        .unwrap();
    let all = store.messages(&s.id, true).await.unwrap();
    assert!(all.iter().filter(|m| m.compacted).count() >= 4);
    assert!(all
        .iter()
        .any(|m| m.message.text().contains("question number 0")));
}

#[tokio::test]
async fn a_session_model_override_must_be_allowed_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let primary = FakeLlmServer::start().await;
    let spare = FakeLlmServer::start().await;
    spare.push(text_response("the spare speaking"));
    let Some(gw) = fake_gateway(&home, config(&primary, Some(&spare), json!({}))).await else {
        return;
    };
    let patch = |m: &str| beige_core::store::SettingsPatch {
        model_override: Some(Some(m.to_string())),
        ..Default::default()
    };
    let err = gw
        .update_settings("a", "api:a:default", patch("openai/gpt-4o"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("allowed models: anthropic/claude-sonnet-4-6, spare/claude-haiku-4-5"),
        "{err}"
    );
    gw.update_settings("a", "api:a:default", patch("spare/claude-haiku-4-5"))
        .await
        .unwrap();
    let events = ask(&gw, "api:a:default", "hi").await;
    assert_eq!(done_text(&events).as_deref(), Some("the spare speaking"));
    assert!(events.iter().any(
        |e| matches!(e, AgentEvent::ModelSwitched { reason, .. } if reason == "user_override")
    ));
    assert_eq!(primary.request_count(), 0);
    let s = &gw.sessions("a").await.unwrap()[0];
    assert_eq!(s.model.as_deref(), Some("spare/claude-haiku-4-5"));

    // A prompt no model can answer keeps the user's message, closed with a note.
    spare.push(error_reply(
        401,
        "authentication_error",
        "invalid x-api-key",
    ));
    primary.push(error_reply(
        401,
        "authentication_error",
        "invalid x-api-key",
    ));
    let events = ask(&gw, "api:a:default", "second question").await;
    let (message, hint) = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::Error { message, hint, .. } => Some((message.clone(), hint.clone())),
            _ => None,
        })
        .unwrap();
    assert!(message.contains("HTTP 401"), "{message}");
    assert!(hint.unwrap().contains("API key"));
    assert_eq!(spare.request_count(), 2, "auth errors are not repeated");
    let messages = gw.session_messages("a", &s.id).await.unwrap();
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[2].text(), "second question");
    assert!(messages[3].text().starts_with("[no answer:"));
}
