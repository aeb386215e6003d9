//! A hostile sandbox against its tool socket, on the real Docker engine, everything run
//! from inside the sandbox (the shim, or raw socket clients in Python): a forged session
//! context must not reach a Telegram chat outside `allowedChats` (attack 4 of issue 13);
//! a flood of connections and unterminated lines must leave other agents and the HTTP
//! API answering with the gateway's memory bounded (attack 5); a flood of oversized
//! denied requests must not push the earliest audit record out of the log (attack 6).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext, ToolOutput};
use beige_core::channel::http::{ApiState, HttpApiChannel};
use beige_core::channel::telegram::{TelegramChannel, TelegramConfig, TelegramPlugin};
use beige_core::channel::{Channel, ChannelContext};
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::LlmProvider;
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::store::{SqliteStore, Store};
use beige_core::{BeigeHome, Gateway, GatewayBuilder, GatewayFull, LocalGateway};
use beige_testkit::telegram::FakeTelegram;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::support::{DockerEnv, TestHome};
use crate::docker_or_skip;

/// The image with python3 for raw socket clients (built by `scripts/setup-docker
/// --debian-base`).
const PYTHON_IMAGE: &str = "beige-test-debian:bookworm";

async fn python_image_present() -> bool {
    let docker = DockerSandbox::connect("probe").await.unwrap();
    if docker.client().inspect_image(PYTHON_IMAGE).await.is_ok() {
        return true;
    }
    if super::support::required() {
        panic!("{PYTHON_IMAGE} missing in CI: scripts/setup-docker --debian-base builds it");
    }
    eprintln!(
        "SKIPPED (not in CI): {PYTHON_IMAGE} missing; run scripts/setup-docker --debian-base"
    );
    false
}

async fn exec_t(gw: &LocalGateway, agent: &str, command: &str, timeout: u64) -> ToolOutput {
    gw.call_tool(
        agent,
        CoreToolCall::Exec(ExecParams {
            command: command.into(),
            timeout: Some(timeout),
        }),
        ToolContext::default(),
    )
    .await
    .unwrap()
}

async fn build(t: &TestHome, env: &DockerEnv, config: Value) -> LocalGateway {
    let mut base = serde_json::to_value(t.config(env, &[])).unwrap();
    if let (Some(b), Value::Object(extra)) = (base.as_object_mut(), config) {
        b.extend(extra);
    }
    let docker = t.docker().await;
    GatewayBuilder::new(serde_json::from_value(base).unwrap(), t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker))
        .build()
        .await
        .unwrap()
}

fn agent(image: &str, tools: Value) -> Value {
    json!({
        "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
        "tools": tools,
        "sandbox": {"image": image, "memoryLimit": "512m", "pidsLimit": 128},
    })
}

/// Every audit record, oldest file first.
fn all_audit(home: &BeigeHome) -> (Vec<Value>, u64, usize) {
    let path = home.audit_log_path();
    let mut files: Vec<_> = (1..200)
        .map(|i| Path::new(&format!("{}.{i}", path.display())).to_path_buf())
        .filter(|p| p.exists())
        .collect();
    let rotated = files.len();
    files.reverse();
    files.push(path);
    let mut bytes = 0;
    let mut records = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        bytes += text.len() as u64;
        records.extend(
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()),
        );
    }
    (records, bytes, rotated)
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

const TOKEN: &str = "123456:HOSTILE-test-token";
const USER: i64 = 4242;
const ALLOWED: i64 = -100777;
const OUTSIDE: i64 = -999;

/// Attack 4: inside a Telegram prompt the model's script forges the session context in
/// every way a sandbox can — the chat id, the session key, an explicit `--chat` — and
/// only the session's own chat (as the gateway recorded it) and `allowedChats` are
/// reached.
#[tokio::test]
async fn a_forged_session_context_cannot_send_outside_allowed_chats() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let tg = FakeTelegram::start(TOKEN).await;
    let tg_config = json!({
        "token": TOKEN,
        "allowedUsers": [USER],
        "agentMapping": {"default": "a"},
        "allowedChats": [ALLOWED],
        "apiBaseUrl": tg.url(),
        "pollTimeout": 1,
        "watchdogGrace": 1,
    });
    // The script the model runs: every forged field, then an honest send.
    let script = format!(
        "BEIGE_CHAT_ID={OUTSIDE} telegram send forged-chat-id; echo rc=$?; \
         BEIGE_SESSION_KEY=telegram:{OUTSIDE} BEIGE_CHAT_ID={OUTSIDE} telegram send forged-key; echo rc=$?; \
         BEIGE_THREAD_ID=7 BEIGE_CHAT_ID={OUTSIDE} telegram send forged-thread; echo rc=$?; \
         telegram send --chat {OUTSIDE} explicit; echo rc=$?; \
         telegram send --chat {ALLOWED} to-the-team; echo rc=$?"
    );
    let model = ScriptedProvider::new("anthropic")
        .then_tool(
            "t1",
            "exec",
            json!({"command": format!("{{ {script}; }} > out.txt 2>&1")}),
        )
        .then_text("done");
    let mut config = serde_json::to_value(t.config(&env, &[])).unwrap();
    config["agents"] = json!({"a": agent(&env.image, json!(["telegram"]))});
    config["plugins"] = json!({"telegram": {"config": tg_config.clone()}});
    let store: Arc<dyn Store> = Arc::new({
        std::fs::create_dir_all(t.home.root()).unwrap();
        SqliteStore::open(t.home.db_path()).unwrap()
    });
    let docker = t.docker().await;
    let gw = Arc::new(
        GatewayBuilder::new(serde_json::from_value(config).unwrap(), t.home.clone())
            .shim(&env.shim)
            .sandbox(Arc::new(docker))
            .store(store.clone())
            .provider(Arc::new(model) as Arc<dyn LlmProvider>)
            .plugin(Arc::new(TelegramPlugin::new()))
            .build()
            .await
            .unwrap(),
    );
    let channel = Arc::new(
        TelegramChannel::new(TelegramConfig::from_value(&tg_config).unwrap(), store).unwrap(),
    );
    let stop = CancellationToken::new();
    let run = {
        let (channel, gw, stop) = (
            channel.clone(),
            gw.clone() as Arc<dyn GatewayFull>,
            stop.clone(),
        );
        tokio::spawn(async move { channel.run(ChannelContext::new(gw, stop)).await })
    };

    // The user writes; the channel prompts the agent with the chat it came from.
    tg.send_text(USER, USER, "please post the report");
    let done = tokio::time::timeout(
        Duration::from_secs(90),
        tg.wait_for_message(|m| m.chat_id == USER && m.visible.contains("done")),
    )
    .await;
    let out = std::fs::read_to_string(gw.config().agent_workspace(gw.home(), "a").join("out.txt"))
        .unwrap_or_default();
    assert!(done.is_ok(), "no answer; the script said: {out}");

    // Nothing reached the chat outside allowedChats, whatever the script claimed.
    assert!(
        tg.messages_in(OUTSIDE).is_empty(),
        "{:?}",
        tg.messages_in(OUTSIDE)
    );
    let rcs: Vec<&str> = out.lines().filter(|l| l.starts_with("rc=")).collect();
    assert_eq!(rcs, ["rc=0", "rc=0", "rc=0", "rc=1", "rc=0"], "{out}");
    // A forged chat id or session key is ignored: the call runs in the exec's session,
    // so the message goes to that session's own chat …
    let own: Vec<String> = tg
        .messages_in(USER)
        .into_iter()
        .map(|m| m.visible)
        .collect();
    assert!(own.iter().any(|m| m == "forged-chat-id"), "{own:?}");
    assert!(own.iter().any(|m| m == "forged-thread"), "{own:?}");
    assert!(own.iter().any(|m| m == "forged-key"), "{own:?}");
    assert!(tg.messages_in(USER).iter().all(|m| m.thread_id.is_none()));
    // … and an explicit chat must be allowed.
    assert!(
        out.contains(&format!("agent 'a' may not send to chat {OUTSIDE}")),
        "{out}"
    );
    let team: Vec<String> = tg
        .messages_in(ALLOWED)
        .into_iter()
        .map(|m| m.visible)
        .collect();
    assert_eq!(team, ["to-the-team"]);

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
    gw.shutdown().await.unwrap();
}

/// The flood of attack 5, held open from the sandbox of agent `flood`.
const FLOOD: &str = r#"
import json, os, resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
P = "/beige/run/gateway.sock"
held, connect_errors = [], 0
for i in range(4500):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(P)
        held.append(s)
    except OSError:
        connect_errors += 1
        s.close()
time.sleep(1.5)
refused, messages, live = 0, set(), []
for s in held:
    s.setblocking(False)
    try:
        data = s.recv(65536)
        refused += 1
        if data:
            messages.add(json.loads(data.split(b"\n")[0])["error"])
    except BlockingIOError:
        live.append(s)
# Twenty unterminated lines of 11 MiB each (under the 12 MB line bound).
MiB = 1 << 20
over, budget_messages = 0, set()
for s in live[:20]:
    s.setblocking(True)
    s.settimeout(10)
    try:
        s.sendall(b'{"type":"tool_request","tool":"kv","args":["')
        for _ in range(11):
            s.sendall(b"x" * MiB)
    except OSError:
        pass
    s.settimeout(0.3)
    try:
        data = s.recv(65536)
        if data:
            over += 1
            budget_messages.add(json.loads(data.split(b"\n")[0])["error"])
    except (socket.timeout, OSError):
        pass
stats = {"connected": len(held), "connect_errors": connect_errors, "refused": refused,
         "live": len(live), "over_budget": over, "messages": sorted(messages),
         "budget_messages": sorted(budget_messages)}
with open("/workspace/holding.json", "w") as f:
    json.dump(stats, f)
time.sleep(12)
print(json.dumps(stats))
"#;

/// Attack 5: one agent opens 4,500 connections and sends 20 unterminated 11 MiB lines;
/// meanwhile another agent's tool calls and the HTTP API answer, the gateway's memory
/// stays bounded, and the flooder is told which limit it hit.
#[tokio::test]
async fn a_connection_and_line_flood_leaves_other_agents_and_the_api_answering() {
    let env = docker_or_skip!();
    if !python_image_present().await {
        return;
    }
    let t = TestHome::new();
    let gw = Arc::new(
        build(
            &t,
            &env,
            json!({
                "agents": {
                    "flood": agent(PYTHON_IMAGE, json!(["kv"])),
                    "calm": agent(&env.image, json!(["kv"])),
                },
                "plugins": {"kv": {}},
            }),
        )
        .await,
    );
    let (api, addr) = HttpApiChannel::bind(
        "127.0.0.1",
        0,
        ApiState::new(gw.clone(), Some("hostile-api-token-0123456789".into())),
    )
    .unwrap();
    let stop = CancellationToken::new();
    let served = {
        let (gw, stop) = (gw.clone() as Arc<dyn GatewayFull>, stop.clone());
        tokio::spawn(async move { api.run(ChannelContext::new(gw, stop)).await })
    };
    let workspace = gw.config().agent_workspace(gw.home(), "flood");
    std::fs::write(workspace.join("flood.py"), FLOOD).unwrap();
    // Warm up both sandboxes and the allocator before measuring.
    assert!(!exec_t(&gw, "calm", "kv set warm 1", 30).await.is_error);
    let baseline = rss_bytes();

    let flood = {
        let gw = gw.clone();
        tokio::spawn(async move { exec_t(&gw, "flood", "python3 flood.py 2>&1", 120).await })
    };
    let started = Instant::now();
    while !workspace.join("holding.json").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the flood never got going"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let during = rss_bytes();

    // While the flood is held: the other agent's tool calls answer …
    let t0 = Instant::now();
    let calm = exec_t(&gw, "calm", "kv set during flood && kv get during", 30).await;
    let text = calm.joined_text();
    assert!(!calm.is_error && text.contains("flood"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    // … and so does the HTTP API, with and without the token.
    let client = reqwest::Client::new();
    let health = client
        .get(format!("http://{addr}/api/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let agents = client
        .get(format!("http://{addr}/api/agents"))
        .bearer_auth("hostile-api-token-0123456789")
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(agents.status(), 200);

    let out = flood.await.unwrap().joined_text();
    let stats: Value = out
        .lines()
        .find_map(|l| {
            serde_json::from_str(l)
                .ok()
                .filter(|v: &Value| v.is_object())
        })
        .unwrap_or_else(|| panic!("no stats from the flood: {out}"));
    // The gateway held at most its per-agent share of connections …
    let live = stats["live"].as_u64().unwrap();
    assert!((1..=64).contains(&live), "{stats}");
    assert!(stats["refused"].as_u64().unwrap() >= 4400, "{stats}");
    let messages = stats["messages"].to_string();
    assert!(
        messages.contains(
            "agent 'flood' already has 64 connections open to the tool socket (the limit)"
        ),
        "{messages}"
    );
    // … and at most its budget of unfinished lines.
    assert!(stats["over_budget"].as_u64().unwrap() >= 18, "{stats}");
    assert!(
        stats["budget_messages"]
            .to_string()
            .contains("bytes of requests held by the gateway at once"),
        "{stats}"
    );
    // 20 lines of 11 MiB were 220 MiB before the bound; now at most the 16 MiB budget and
    // the connections' read buffers.
    let grew = during.saturating_sub(baseline);
    assert!(
        grew < 100 * 1024 * 1024,
        "the gateway grew by {} MiB during the flood",
        grew >> 20
    );
    // One record per limit reached, not one per refused connection.
    let (records, _, _) = all_audit(gw.home());
    let limits: Vec<&Value> = records
        .iter()
        .filter(|r| r["tool"] == "security.socket_limit")
        .collect();
    assert_eq!(
        limits
            .iter()
            .filter(|r| r["args"][0] == "limit=connections")
            .count(),
        1,
        "{limits:?}"
    );
    assert!(limits.iter().all(|r| r["agent"] == "flood"));

    stop.cancel();
    let _ = served.await;
    gw.shutdown().await.unwrap();
}

/// The flood of attack 6: oversized denied requests and oversized garbage, then one call
/// that policy would allow.
const NOISE: &str = r#"
import json, socket
P = "/beige/run/gateway.sock"
def call(s, line):
    s.sendall(line + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        d = s.recv(65536)
        if not d:
            break
        buf += d
    return json.loads(buf) if buf else None
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(P)
big = "A" * 1_000_000
errors = {}
for i in range(20):
    r = call(s, b"{" + b"B" * 1_000_000)
    errors[r["error"][:40]] = errors.get(r["error"][:40], 0) + 1
for i in range(150):
    r = call(s, json.dumps({"type": "tool_request", "tool": "git", "args": [big, str(i)]}).encode())
    errors[r["error"][:40]] = errors.get(r["error"][:40], 0) + 1
after = call(s, json.dumps({"type": "tool_request", "tool": "kv", "args": ["set", "after-flood", "1"]}).encode())
print(json.dumps({"errors": errors, "after": after}))
"#;

/// Attack 6: a flood of oversized denied requests no longer erases the log: records of
/// refused requests are excerpts with a hash, the agent is throttled (its calls refused,
/// one record saying so) before it writes much, and rotation keeps what is younger than
/// the retention — the first record is still there.
#[tokio::test]
async fn a_flood_of_oversized_denied_requests_leaves_the_first_record_in_the_log() {
    let env = docker_or_skip!();
    if !python_image_present().await {
        return;
    }
    let t = TestHome::new();
    let gw = build(
        &t,
        &env,
        json!({
            "agents": {
                "noisy": agent(PYTHON_IMAGE, json!(["kv"])),
                "calm": agent(&env.image, json!(["kv"])),
            },
            "plugins": {"kv": {}},
            "gateway": {
                "log": {"maxSizeBytes": 20000, "maxFiles": 2},
                "audit": {"budgetBytesPerMinute": 100000},
            },
        }),
    )
    .await;
    let first = exec_t(&gw, "noisy", "kv set first-record-marker 1", 30).await;
    assert!(!first.is_error, "{}", first.joined_text());
    let workspace = gw.config().agent_workspace(gw.home(), "noisy");
    std::fs::write(workspace.join("noise.py"), NOISE).unwrap();
    let out = exec_t(&gw, "noisy", "python3 noise.py 2>&1", 120).await;
    let text = out.joined_text();
    let stats: Value = text
        .lines()
        .find_map(|l| {
            serde_json::from_str(l)
                .ok()
                .filter(|v: &Value| v.is_object())
        })
        .unwrap_or_else(|| panic!("no stats from the flood: {text}"));
    // Denied is denied; the call policy would allow is refused too, with the reason.
    let after = stats["after"]["error"].as_str().unwrap_or_default();
    assert!(
        after
            .contains("agent 'noisy' made more than 100000 bytes of audit records within a minute"),
        "{stats}"
    );

    let (records, bytes, rotated) = all_audit(gw.home());
    // The earliest record survived, with more files kept than maxFiles rather than lost.
    assert!(
        records
            .iter()
            .any(|r| r["tool"] == "kv" && r["args"][1] == "first-record-marker"),
        "the first record is gone ({} records, {rotated} rotated files)",
        records.len()
    );
    assert!(rotated > 2, "{rotated}");
    // 170 MB of requests left well under a megabyte of audit.
    assert!(bytes < 1_000_000, "{bytes}");
    let denied: Vec<&Value> = records
        .iter()
        .filter(|r| r["agent"] == "noisy" && r["decision"] == "denied" && r["type"] == "tool")
        .collect();
    assert!(!denied.is_empty());
    for r in &denied {
        let kept: usize = r["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().len())
            .sum();
        assert!(kept <= 1024 + 8, "{kept}");
        assert!(r["argsBytes"].as_u64().unwrap() >= 1_000_000, "{r}");
        assert_eq!(r["argsSha256"].as_str().unwrap().len(), 64);
        assert_eq!(r["argsTruncated"], true);
    }
    assert!(denied.iter().any(|r| r["tool"] == "(unparsed)"));
    // One record for the throttling, not one per refused call; the allowed call that was
    // refused never started.
    let throttled = records
        .iter()
        .filter(|r| r["tool"] == "security.audit_throttled")
        .count();
    assert_eq!(throttled, 1);
    assert!(!records
        .iter()
        .any(|r| r["tool"] == "kv" && r["args"][1] == "after-flood"));
    // Another agent has its own budget.
    let calm = exec_t(&gw, "calm", "kv set k v && kv get k", 30).await;
    assert!(!calm.is_error && calm.joined_text().contains('v'));
    gw.shutdown().await.unwrap();
}
