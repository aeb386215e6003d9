//! The built-in `sessions` tool (platform.md §3) and the original's holes that stay
//! closed (§4): an agent reads its own sessions only, whatever it writes into the
//! request; a call's output and a grep's work are bounded; files handed to `spawn` and
//! `schedule` are read in the sandbox; nothing in a sandbox reaches the HTTP API.
//!
//! The ownership and limit tests run the whole gateway with the SQLite store and a
//! `MemorySandbox`, calling the tool through the socket's guarded path
//! (`LocalGateway::handle_tool_request`); the rest run in real Docker sandboxes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use beige_core::channel::http::{ApiState, HttpApiChannel};
use beige_core::llm::{Block, Message, Role};
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::store::{NewMessage, NewSession, SessionStore, SqliteStore};
use beige_core::testing::MemorySandbox;
use beige_core::{
    BeigeHome, Channel as _, ChannelContext, GatewayBuilder, GatewayFull, LocalGateway,
};
use beige_protocol::socket::{ToolRequest, ToolResponse};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::sandbox_docker::exec;
use super::support::TestHome;
use crate::docker_or_skip;

/// What the tool answers for a session that is missing or another agent's.
const NOT_FOUND: &str =
    "sessions: session not found; `sessions list` shows this agent's sessions\n";

struct Fixture {
    _dir: tempfile::TempDir,
    gw: LocalGateway,
    store: Arc<SqliteStore>,
}

fn config(agent_extra: serde_json::Value) -> beige_core::config::Config {
    let agent = |extra: &serde_json::Value| {
        let mut a = json!({
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": ["sessions"],
        });
        if let (Some(a), Some(e)) = (a.as_object_mut(), extra.as_object()) {
            a.extend(e.clone());
        }
        a
    };
    serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789"}}},
        "plugins": {"sessions": {}},
        "agents": {"a": agent(&agent_extra), "b": agent(&json!({}))},
    }))
    .unwrap()
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("beige.db")).unwrap());
    let gw = GatewayBuilder::new(config(json!({})), BeigeHome::new(dir.path().join("home")))
        .sandbox(Arc::new(MemorySandbox::new()))
        .store(store.clone())
        .build()
        .await
        .unwrap();
    Fixture {
        _dir: dir,
        gw,
        store,
    }
}

/// A session of `agent` under `key` holding one user and one assistant message.
async fn session(
    store: &SqliteStore,
    agent: &str,
    key: &str,
    parent: Option<&str>,
    user: &str,
    answer: &str,
) -> String {
    let s = store
        .create_session(NewSession {
            agent: agent.into(),
            key: key.into(),
            parent_id: parent.map(str::to_string),
            model: None,
        })
        .await
        .unwrap();
    store
        .append_turn(
            &s.id,
            vec![
                NewMessage::plain(Message::user_text(user)),
                NewMessage::plain(Message::assistant_text(answer)),
            ],
        )
        .await
        .unwrap();
    s.id
}

async fn call(gw: &LocalGateway, agent: &str, args: &[&str]) -> ToolResponse {
    gw.handle_tool_request(
        agent,
        ToolRequest::new("sessions", args.iter().map(|s| s.to_string()).collect()),
    )
    .await
}

fn output(r: &ToolResponse) -> String {
    serde_json::to_value(r).unwrap()["output"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn code(r: &ToolResponse) -> i64 {
    serde_json::to_value(r).unwrap()["exitCode"]
        .as_i64()
        .unwrap()
}

/// `sessions_own_only`: only the agent's sessions are listed, read and searched; a `get`
/// of another agent's session, with forged args, payload and `sessionContext`, answers
/// byte for byte what a missing id answers.
#[tokio::test]
async fn sessions_own_only() {
    let f = fixture().await;
    let a1 = session(
        &f.store,
        "a",
        "telegram:100",
        None,
        "plan the trip",
        "here is a plan",
    )
    .await;
    let a2 = session(
        &f.store,
        "a",
        "schedule:daily:20261201080000:ab12",
        None,
        "daily digest",
        "three issues open",
    )
    .await;
    let child = session(
        &f.store,
        "a",
        "spawn:telegram:100:a:20261201-101500-a1b2c3",
        Some(&a1),
        "look it up",
        "found it",
    )
    .await;
    let b1 = session(
        &f.store,
        "b",
        "telegram:200",
        None,
        "b-secret question",
        "b-secret answer",
    )
    .await;
    f.gw.register_session("b", "telegram:200");
    f.gw.register_session("a", "telegram:100");

    // list: a's own sessions, the schedule run marked, the SELF child hidden.
    let r = call(&f.gw, "a", &["list"]).await;
    let text = output(&r);
    assert_eq!(code(&r), 0, "{text}");
    assert!(text.contains(&a1) && text.contains(&a2), "{text}");
    assert!(
        !text.contains(&b1) && !text.contains("telegram:200"),
        "{text}"
    );
    assert!(!text.contains(&child), "{text}");
    assert!(
        text.contains("schedule:daily:20261201080000:ab12  2 messages [schedule run]"),
        "{text}"
    );
    assert!(
        text.contains("1 child sessions of `spawn --target SELF` hidden"),
        "{text}"
    );
    // --all shows the child under its parent.
    let text = output(&call(&f.gw, "a", &["list", "--all"]).await);
    let parent_at = text.find(&a1).unwrap();
    let child_at = text.find(&format!("  ↳ {child}")).unwrap();
    assert!(child_at > parent_at, "{text}");
    // --json: exactly a's two top-level sessions.
    let v: serde_json::Value =
        serde_json::from_str(&output(&call(&f.gw, "a", &["list", "--json"]).await)).unwrap();
    let mut ids: Vec<&str> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut want = vec![a1.as_str(), a2.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want);
    assert_eq!(v["hiddenChildren"], 1);
    assert_eq!(
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == a2.as_str())
            .unwrap()["kind"],
        "schedule"
    );
    // b sees only its own.
    let text = output(&call(&f.gw, "b", &["list"]).await);
    assert!(text.contains(&b1) && !text.contains(&a1), "{text}");

    // get: a reads its own session, by id or by key.
    for target in [a1.as_str(), "telegram:100"] {
        let r = call(&f.gw, "a", &["get", target]).await;
        let text = output(&r);
        assert_eq!(code(&r), 0, "{text}");
        assert!(
            text.starts_with(&format!("SESSION {a1} (telegram:100)")),
            "{text}"
        );
        assert!(
            text.contains("user")
                && text.contains("plan the trip")
                && text.contains("here is a plan"),
            "{text}"
        );
    }

    // b's session from a: by id, by key, and with every forgery the request can carry.
    let missing = call(&f.gw, "a", &["get", "s_00000000000000ff"]).await;
    let missing_line = serde_json::to_string(&missing).unwrap();
    assert_eq!(output(&missing), NOT_FOUND);
    assert_eq!(code(&missing), 1);
    let forged: ToolRequest = serde_json::from_value(json!({
        "type": "tool_request",
        "tool": "sessions",
        "args": ["get", b1],
        "agent": "b",
        "agentName": "b",
        "session": b1,
        "sessionContext": {"sessionKey": "telegram:200", "channel": "telegram", "agentName": "b", "chatId": 200},
    }))
    .unwrap();
    let forged_key: ToolRequest = serde_json::from_value(json!({
        "type": "tool_request", "tool": "sessions", "args": ["get", "telegram:200"],
        "agent": "b", "sessionContext": {"sessionKey": "telegram:200", "agentName": "b"},
    }))
    .unwrap();
    let grep_forged: ToolRequest = serde_json::from_value(json!({
        "type": "tool_request", "tool": "sessions", "args": ["grep", "b-secret", "--session", b1],
        "sessionContext": {"sessionKey": "telegram:200", "agentName": "b"},
    }))
    .unwrap();
    for request in [forged, forged_key, grep_forged] {
        let r = f.gw.handle_tool_request("a", request).await;
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            missing_line,
            "byte-identical to a missing id"
        );
    }
    // Unknown options (`--agent b`) are usage errors, never a way in.
    let r = call(&f.gw, "a", &["list", "--agent", "b"]).await;
    assert_eq!(code(&r), 2);
    assert!(!output(&r).contains(&b1));
    // grep over a's sessions never finds b's text; b finds it.
    let r = call(&f.gw, "a", &["grep", "b-secret"]).await;
    assert_eq!(code(&r), 1, "{}", output(&r));
    assert!(
        output(&r).starts_with("(0 matching lines in 0 sessions; searched 3 of 3 sessions"),
        "{}",
        output(&r)
    );
    let r = call(&f.gw, "b", &["grep", "b-secret"]).await;
    assert_eq!(code(&r), 0);
    assert_eq!(output(&r).matches(&b1).count(), 2, "{}", output(&r));
    // a's own grep finds its lines, regex too.
    let r = call(&f.gw, "a", &["grep", "--regex", "^(found|three) "]).await;
    let text = output(&r);
    assert!(
        text.contains(&format!("{child} spawn:")) && text.contains(&format!("{a2} schedule:")),
        "{text}"
    );
    assert!(text.contains("#2 assistant: three issues open"), "{text}");
}

/// `sessions_limits`: a 1 MB transcript is cut at 64 KiB with a note; a pathological
/// regex returns within 5 s; a regex too big to compile is refused at once.
#[tokio::test]
async fn sessions_limits() {
    let f = fixture().await;
    let big = f
        .store
        .create_session(NewSession {
            agent: "a".into(),
            key: "api:a:big".into(),
            ..NewSession::default()
        })
        .await
        .unwrap();
    // 16 messages of 64 KiB of 'x' each, plus a few of 'a…': a 1 MiB transcript.
    let mut turn = Vec::new();
    for i in 0..16 {
        let text = format!("{i:02}{}", "x".repeat(64 * 1024 - 2));
        let role = if i % 2 == 0 {
            Message::user_text(text)
        } else {
            Message::assistant_text(text)
        };
        turn.push(NewMessage::plain(role));
    }
    turn.push(NewMessage::plain(Message::user_text("a".repeat(30_000))));
    turn.push(NewMessage::plain(Message::assistant_text(
        "the last answer",
    )));
    f.store.append_turn(&big.id, turn).await.unwrap();

    let r = call(&f.gw, "a", &["get", &big.id]).await;
    let text = output(&r);
    assert_eq!(code(&r), 0);
    assert!(text.len() <= 64 * 1024, "{} bytes", text.len());
    assert!(text.len() > 60 * 1024, "{} bytes", text.len());
    assert!(
        text.ends_with("; use --last N for the latest messages only]\n"),
        "{}",
        &text[text.len() - 200..]
    );
    assert!(
        text.contains("[sessions: output cut at 65536 bytes (64 KiB) of"),
        "{}",
        &text[text.len() - 200..]
    );
    // --last shows the end; JSON stays valid JSON and says what it left out.
    let text = output(&call(&f.gw, "a", &["get", &big.id, "--last", "1"]).await);
    assert!(
        text.contains("1 of 18 messages") && text.contains("the last answer"),
        "{text}"
    );
    let text = output(&call(&f.gw, "a", &["get", &big.id, "--format", "json"]).await);
    assert!(text.len() <= 64 * 1024, "{} bytes", text.len());
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["totalMessages"], 18);
    let kept = v["messages"].as_array().unwrap().len();
    assert!(kept < 18, "{kept}");
    assert!(v["truncated"].as_str().unwrap().contains(&format!(
        "the last {} of these 18 messages were left out",
        18 - kept
    )));

    // A pathological regex (exponential for a backtracking engine) over the 1 MB.
    for pattern in ["(x+x+)+y", "(a|aa)*(a|aa)*c", "^(\\w+\\s?)*$z"] {
        let started = Instant::now();
        let r = call(
            &f.gw,
            "a",
            &["grep", "--regex", pattern, "--max-sessions", "200"],
        )
        .await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5) + Duration::from_millis(900),
            "{pattern}: {took:?}"
        );
        assert!(output(&r).contains("searched"), "{}", output(&r));
        assert!(output(&r).len() <= 64 * 1024);
    }
    // A regex too large to compile is refused at once, naming what to do.
    let started = Instant::now();
    let r = call(&f.gw, "a", &["grep", "--regex", "((a{100}){100}){100}"]).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(code(&r), 2);
    assert!(
        output(&r).contains("the pattern is not a usable regex"),
        "{}",
        output(&r)
    );
    // Substring search finds the one line, cut to its context.
    let r = call(&f.gw, "a", &["grep", "last answer"]).await;
    assert_eq!(code(&r), 0);
    assert!(
        output(&r).contains("#18 assistant: the last answer"),
        "{}",
        output(&r)
    );
    // Many matching lines: --max-matches stops it, and the output stays within 64 KiB.
    let r = call(&f.gw, "a", &["grep", "xxxx", "--max-matches", "1000"]).await;
    assert!(output(&r).len() <= 64 * 1024);
    assert!(
        output(&r).contains("16 matching lines in 1 sessions"),
        "{}",
        &output(&r)[output(&r).len().saturating_sub(300)..]
    );
}

/// `--all` includes compacted messages; without it, the summary and what follows.
#[tokio::test]
async fn sessions_get_all_includes_compacted_messages() {
    let f = fixture().await;
    let id = session(&f.store, "a", "api:a:c", None, "old question", "old answer").await;
    f.store
        .append_turn(
            &id,
            vec![NewMessage::plain(Message::user_text("new question"))],
        )
        .await
        .unwrap();
    f.store
        .compact(
            &id,
            2,
            Message {
                role: Role::User,
                content: vec![Block::Text {
                    text: "summary of the old talk".into(),
                }],
            },
        )
        .await
        .unwrap();
    let text = output(&call(&f.gw, "a", &["get", &id]).await);
    assert!(
        text.contains("summary of the old talk") && text.contains("new question"),
        "{text}"
    );
    assert!(!text.contains("\nold question"), "{text}");
    let text = output(&call(&f.gw, "a", &["get", &id, "--all"]).await);
    assert!(
        text.contains("old question") && text.contains("(compacted)"),
        "{text}"
    );
    assert!(text.contains("compacted ones included"), "{text}");
}

/// The calls a [`Recorder`] saw: arguments and stdin.
type Seen = Arc<Mutex<Vec<(Vec<String>, Option<String>)>>>;

/// A test tool under a platform tool's name (`spawn`, `schedule`): it records the
/// arguments and stdin it was handed.
#[derive(Debug)]
struct Recorder {
    name: &'static str,
    seen: Seen,
}

#[async_trait]
impl Tool for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "records its calls"
    }
    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        let stdin = call.stdin.map(|s| String::from_utf8_lossy(&s).into_owned());
        self.seen
            .lock()
            .unwrap()
            .push((call.args.clone(), stdin.clone()));
        Ok(ToolResult::ok(format!(
            "args={:?} stdin={:?}\n",
            call.args, stdin
        )))
    }
}

#[derive(Debug)]
struct RecorderPlugin(&'static str, Seen);

#[async_trait]
impl Plugin for RecorderPlugin {
    fn name(&self) -> &str {
        self.0
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(Recorder {
            name: self.0,
            seen: self.1.clone(),
        }))
    }
}

/// `message_file_in_sandbox`: `spawn --message-file ~/.beige/config.json5` sends what
/// that path holds in the sandbox, as stdin, with the flag gone; a path that exists only
/// on the host fails in the sandbox and nothing is sent; the host's file never reaches
/// the handler.
#[tokio::test]
async fn message_file_in_sandbox() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    const HOST_MARKER: &str = "HOST-SECRET-MARKER-3f9a";
    // The host's files at the same path: under BEIGE_HOME (the gateway's config) and a
    // `.beige/config.json5` next to it.
    std::fs::create_dir_all(t.home.root().join(".beige")).unwrap();
    let host_file = t.home.root().join(".beige/config.json5");
    std::fs::write(&host_file, format!("{{ secret: \"{HOST_MARKER}\" }}")).unwrap();
    std::fs::write(t.home.config_path(), format!("// {HOST_MARKER}\n{{}}")).unwrap();

    let spawn_seen = Arc::new(Mutex::new(Vec::new()));
    let schedule_seen = Arc::new(Mutex::new(Vec::new()));
    let mut config = t.config(
        &env,
        &[("a", json!({"tools": ["spawn", "schedule", "sessions"]}))],
    );
    config.plugins =
        serde_json::from_value(json!({"spawn": {}, "schedule": {}, "sessions": {}})).unwrap();
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .plugin(Arc::new(RecorderPlugin("spawn", spawn_seen.clone())))
        .plugin(Arc::new(RecorderPlugin("schedule", schedule_seen.clone())))
        .build()
        .await
        .unwrap();

    let out = exec(
        &gw,
        "a",
        "mkdir -p ~/.beige && printf 'sandbox text only' > ~/.beige/config.json5 && \
         spawn --target researcher --message-file '~/.beige/config.json5'; echo rc=$?; \
         schedule add --cron '0 8 * * *' --prompt-file=/workspace/.beige/config.json5; echo rc=$?",
    )
    .await;
    let text = out.joined_text();
    assert!(
        text.contains("rc=0\n") && !text.contains(HOST_MARKER),
        "{text}"
    );
    {
        let seen = spawn_seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{text}");
        assert_eq!(seen[0].0, ["--target", "researcher"]);
        assert_eq!(seen[0].1.as_deref(), Some("sandbox text only"));
        let seen = schedule_seen.lock().unwrap();
        assert_eq!(seen[0].0, ["add", "--cron", "0 8 * * *"]);
        assert_eq!(seen[0].1.as_deref(), Some("sandbox text only"));
    }

    // Host paths mean nothing in the sandbox: the call fails there and is never sent.
    let cmd = format!(
        "spawn --target researcher --message-file {}; echo rc=$?; rm ~/.beige/config.json5; \
         spawn --target researcher --message-file '~/.beige/config.json5'; echo rc=$?; \
         spawn --target researcher --message-file /dev/zero; echo rc=$?",
        host_file.display()
    );
    let out = exec(&gw, "a", &cmd).await;
    let text = out.joined_text();
    assert_eq!(text.matches("rc=2").count(), 3, "{text}");
    assert!(text.contains("spawn: cannot read --message-file ~/.beige/config.json5 (/workspace/.beige/config.json5)"), "{text}");
    assert!(
        text.contains("the file is read inside the sandbox, and nothing was sent to spawn"),
        "{text}"
    );
    assert!(text.contains("not a regular file"), "{text}");
    assert!(!text.contains(HOST_MARKER), "{text}");
    let seen = spawn_seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        1,
        "no further call reached the handler: {seen:?}"
    );
    assert!(seen
        .iter()
        .all(|(args, stdin)| !format!("{args:?}{stdin:?}").contains(HOST_MARKER)));
    gw.shutdown().await.unwrap();
}

/// In a real sandbox: a script's `sessions` calls run as its agent whatever its
/// environment claims, and one exec may make 10 of them.
#[tokio::test]
async fn sessions_in_a_sandbox_own_only_and_ten_calls_per_exec() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("beige.db")).unwrap());
    let b1 = session(&store, "b", "telegram:200", None, "b-only words", "ok").await;
    let a1 = session(&store, "a", "telegram:100", None, "a-only words", "ok").await;
    let mut config = t.config(
        &env,
        &[
            ("a", json!({"tools": ["sessions"]})),
            ("b", json!({"tools": ["sessions"]})),
        ],
    );
    config.plugins = serde_json::from_value(json!({"sessions": {}})).unwrap();
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .store(store.clone())
        .build()
        .await
        .unwrap();
    gw.register_session("b", "telegram:200");
    let cmd = format!(
        "BEIGE_AGENT_NAME=b BEIGE_SESSION_KEY=telegram:200 sessions get {b1}; echo rc=$?; \
         sessions list; for i in $(seq 1 9); do sessions list >/dev/null; echo n=$?; done"
    );
    let out = exec(&gw, "a", &cmd).await;
    let text = out.joined_text();
    assert!(text.contains(NOT_FOUND) && text.contains("rc=1"), "{text}");
    assert!(text.contains(&a1) && !text.contains(&b1), "{text}");
    // Calls 3 to 10 pass, the 11th is refused (exit 77).
    assert_eq!(text.matches("n=0").count(), 8, "{text}");
    assert_eq!(text.matches("n=77").count(), 1, "{text}");
    assert!(
        text.contains("sessions: budget exhausted: exec x"),
        "{text}"
    );
    // A new exec has its own count.
    let out = exec(&gw, "a", "sessions list >/dev/null; echo n=$?").await;
    assert!(out.joined_text().contains("n=0"), "{}", out.joined_text());
    gw.shutdown().await.unwrap();
}

/// Nothing inside a sandbox reaches the HTTP API: it listens on the host's 127.0.0.1,
/// which the host reaches, while the container has no route out (`network: none`) and
/// its own 127.0.0.1 is not the host's.
#[tokio::test]
async fn the_sandbox_cannot_reach_the_http_api() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = Arc::new(t.gateway(&env, t.config(&env, &[("a", json!({}))])).await);
    let state = ApiState::new(gw.clone(), Some("http-api-token-0123456789".to_string()));
    let (channel, addr) = HttpApiChannel::bind("127.0.0.1", 0, state).unwrap();
    let shutdown = CancellationToken::new();
    let full: Arc<dyn GatewayFull> = gw.clone();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { channel.run(ChannelContext::new(full, stop)).await });
    // The API is up for the host …
    let health = reqwest::get(format!("http://{addr}/api/health"))
        .await
        .unwrap();
    assert!(health.status().is_success(), "{}", health.status());
    // … and not for the sandbox, by any address of the host.
    let port = addr.port();
    let cmd = format!(
        "printf 'GET /api/health HTTP/1.0\\r\\n\\r\\n' | nc -w 3 127.0.0.1 {port}; echo nc=$?; \
         printf 'GET /api/health HTTP/1.0\\r\\n\\r\\n' | nc -w 3 172.17.0.1 {port}; echo nc=$?; \
         printf 'GET /api/health HTTP/1.0\\r\\n\\r\\n' | nc -w 3 10.0.2.2 {port}; echo nc=$?; \
         echo routes=$(tail -n +2 /proc/net/route | wc -l); ip -o link | cut -d: -f2 | tr -d ' '; echo end"
    );
    let out = exec(&gw, "a", &cmd).await;
    let text = out.joined_text();
    assert_eq!(text.matches("nc=1").count(), 3, "{text}");
    assert!(!text.contains("HTTP/1."), "{text}");
    assert!(text.contains("routes=0"), "{text}");
    assert!(
        text.contains("\nlo\n") && !text.contains("eth"),
        "only the loopback link: {text}"
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
    gw.shutdown().await.unwrap();
}
