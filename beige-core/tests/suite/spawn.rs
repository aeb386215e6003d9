//! Sub-agents, the `spawn` tool (platform.md §2, the `spawn_*` rows of §5), end to end with
//! real components: the Docker sandbox (the parent's script calls `spawn` through the
//! shim, the child's model runs its commands in its own agent's sandbox), the SQLite
//! store in a temp dir, the audit log file, and the fake LLM server on 127.0.0.1 speaking
//! the Anthropic wire format, whose replies are scripted in the order the gateway asks:
//! the parent's exec blocks on the child, so parent and child requests never interleave.
//!
//! Covered: a tool the parent lacks stays out of the child's system prompt and every call
//! of it from the child (its model's command and a raw shim call with a forged session)
//! is denied `parent lacks it` while the target agent itself may use it; the depth limit
//! read from the caller's exec, not from a forged `BEIGE_SESSION_KEY`; the child's usage
//! in the parent's ledger totals and the parent's budget stopping the child and further
//! spawns; the child is unattended (an ask is denied at once and becomes the spawn's
//! failure reason, nothing waits for the parent to approve); the `spawn` audit records
//! and the child's tool records naming the parent session and exec; the
//! `SESSION: …\n---\n<answer>` output.
//!
//! Not covered here: egress. `RightSet::egress_agents` is computed and stored with the
//! child, but the gateway's egress proxy sees a stream per sandbox, not per exec or
//! session, so nothing narrows a child's destinations yet (see the report of issue #17).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_core::api::approvals::ApprovalEvent;
use beige_core::audit::chain::is_chain_record;
use beige_core::config::Config;
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::store::{LedgerFilter, SessionStore, SqliteStore, UsageLedger};
use beige_core::{Admin as _, AgentEvent, Gateway as _, GatewayBuilder, LocalGateway};
use beige_core::PromptRequest;
use beige_testkit::anthropic::{text_response, MessageStream};
use beige_testkit::llm::{FakeLlmServer, RecordedRequest, Reply};
use serde_json::{json, Value};

use super::sandbox_docker::exec;
use super::support::{DockerEnv, TestHome};
use crate::docker_or_skip;

const KEY: &str = "sk-ant-test-spawn-0123456789";

/// The calls the test `gh` tool received (its arguments).
type Seen = Arc<Mutex<Vec<Vec<String>>>>;

/// A stand-in for a `gh` plugin: records every call that reaches it.
#[derive(Debug)]
struct Gh(Seen);

#[async_trait]
impl Tool for Gh {
    fn name(&self) -> &str {
        "gh"
    }
    fn description(&self) -> &str {
        "GitHub from the command line (test double)"
    }
    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        self.0.lock().unwrap().push(call.args.clone());
        Ok(ToolResult::ok("gh ran\n"))
    }
}

#[derive(Debug)]
struct GhPlugin(Seen);

#[async_trait]
impl Plugin for GhPlugin {
    fn name(&self) -> &str {
        "gh"
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(Gh(self.0.clone())))
    }
}

/// One gateway on Docker, SQLite and the fake model, with the test `gh` tool.
struct Fixture {
    t: TestHome,
    llm: FakeLlmServer,
    store: Arc<SqliteStore>,
    gw: LocalGateway,
    gh: Seen,
}

/// A config with the given agents (each merged over a default agent on the test image)
/// and the `spawn` and `kv` plugins.
fn config(env: &DockerEnv, llm: &FakeLlmServer, agents: Value, extra: Value) -> Config {
    let mut map = serde_json::Map::new();
    for (name, overrides) in agents.as_object().unwrap() {
        let mut agent = json!({
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": [],
            "sandbox": {"image": env.image, "memoryLimit": "256m", "pidsLimit": 128},
        });
        agent
            .as_object_mut()
            .unwrap()
            .extend(overrides.as_object().unwrap().clone());
        map.insert(name.clone(), agent);
    }
    let mut config = json!({
        "llm": {"providers": {"anthropic": {"apiKey": KEY, "baseUrl": llm.url()}}},
        "plugins": {"spawn": {}, "kv": {}},
        "agents": map,
    });
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    serde_json::from_value(config).unwrap()
}

async fn fixture(env: &DockerEnv, agents: Value, extra: Value) -> Fixture {
    let t = TestHome::new();
    let llm = FakeLlmServer::start().await;
    let store = Arc::new(SqliteStore::open(t.dir.path().join("beige.db")).unwrap());
    let gh: Seen = Arc::default();
    let gw = GatewayBuilder::new(config(env, &llm, agents, extra), t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .store(store.clone())
        .plugin(Arc::new(GhPlugin(gh.clone())))
        .build()
        .await
        .unwrap();
    Fixture {
        t,
        llm,
        store,
        gw,
        gh,
    }
}

/// A model turn that runs `command` with the `exec` tool, reporting `usage`.
fn run(id: &str, command: &str, usage: (u64, u64)) -> Reply {
    MessageStream::new()
        .tool_use(id, "exec", json!({ "command": command }))
        .stop_reason("tool_use")
        .usage(usage.0, usage.1)
        .reply()
}

/// A final answer, reporting `usage`.
fn answer(text: &str, usage: (u64, u64)) -> Reply {
    MessageStream::new().text(text).usage(usage.0, usage.1).reply()
}

async fn prompt(gw: &LocalGateway, request: PromptRequest) -> Vec<AgentEvent> {
    gw.prompt(request).await.unwrap().collect_all().await
}

/// The outputs of the prompt's finished tool calls, in order.
fn tool_outputs(events: &[AgentEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallFinished { output, .. } => Some(output.clone()),
            _ => None,
        })
        .collect()
}

fn done(events: &[AgentEvent]) -> Option<&str> {
    events.iter().find_map(|e| match e {
        AgentEvent::Done { response, .. } => Some(response.as_str()),
        _ => None,
    })
}

/// The text of the tool results a request carries back to the model (its last message).
fn tool_results(r: &RecordedRequest) -> String {
    let last = r.body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null);
    let mut out = String::new();
    for block in last["content"].as_array().into_iter().flatten() {
        if block["type"] != "tool_result" {
            continue;
        }
        match &block["content"] {
            Value::String(s) => out.push_str(s),
            Value::Array(parts) => {
                for p in parts {
                    out.push_str(p["text"].as_str().unwrap_or_default());
                }
            }
            _ => {}
        }
    }
    out
}

/// The system prompt a request carries, as text.
fn system(r: &RecordedRequest) -> String {
    match &r.body["system"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| p["text"].as_str().unwrap_or_default())
            .collect(),
        other => other.to_string(),
    }
}

/// The audit log's records (without its chain records).
fn audit(t: &TestHome) -> Vec<Value> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| !is_chain_record(v))
        .collect()
}

/// The current session of `key` (it must exist).
async fn session(store: &SqliteStore, key: &str) -> beige_core::store::SessionRecord {
    store
        .current_session(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no session for {key}"))
}

/// The key of the child session a spawn output names (`SESSION: <key>` on its line).
fn child_key(output: &str) -> String {
    let at = output
        .find("SESSION: ")
        .unwrap_or_else(|| panic!("no SESSION line in {output}"));
    output[at + "SESSION: ".len()..]
        .lines()
        .next()
        .unwrap()
        .to_string()
}

/// A child key is `spawn:<parent key>:<agent>:<YYYYmmdd-HHMMSS>-<6 hex>`.
fn assert_key_format(key: &str, parent: &str, agent: &str) {
    let prefix = format!("spawn:{parent}:{agent}:");
    let stamp = key
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{key} does not start with {prefix}"));
    let parts: Vec<&str> = stamp.split('-').collect();
    assert_eq!(
        parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [8, 6, 6],
        "{key}"
    );
    assert!(
        parts[..2]
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_digit()))
            && parts[2].bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
}

/// `spawn_child_lacks_parent_tool`: `assistant` lacks `gh` and spawns `researcher`, which
/// has it. The child's system prompt leaves `gh` out (and keeps `kv`, which both have);
/// the child's model running `gh` and a raw shim call to `gh` with a forged session are
/// both denied `parent lacks it` and never reach the tool, while `kv` works in the same
/// exec and `researcher` on its own still runs `gh`.
#[tokio::test]
async fn spawn_child_lacks_parent_tool() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn", "kv"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}}}},
            "researcher": {"tools": ["gh", "kv"]},
        }),
        json!({}),
    )
    .await;

    // The target on its own: `gh` is in its prompt and runs.
    f.llm.push(answer("at your service", (10, 2)));
    let own = prompt(
        &f.gw,
        PromptRequest::new("researcher", "api:researcher:main", "hello"),
    )
    .await;
    assert_eq!(done(&own), Some("at your service"), "{own:#?}");
    let out = exec(&f.gw, "researcher", "gh pr list; echo \"rc=$?\"").await;
    assert!(
        out.joined_text().contains("gh ran\nrc=0"),
        "{}",
        out.joined_text()
    );
    assert_eq!(f.gh.lock().unwrap().len(), 1);

    f.llm.push(run(
        "tu_p1",
        "spawn --target researcher 'list the open PRs'",
        (100, 10),
    ));
    f.llm.push(run(
        "tu_c1",
        "gh pr list 2>&1; echo \"launcher=$?\"; \
         BEIGE_SESSION_KEY=api:researcher:main BEIGE_AGENT_NAME=researcher BEIGE_CHANNEL=api \
         /beige/shim tool gh pr list 2>&1; echo \"raw=$?\"; \
         kv set note hello </dev/null; echo \"kv=$?\"",
        (100, 10),
    ));
    f.llm.push(answer("gh is not available to me", (100, 10)));
    f.llm.push(answer("the researcher could not use gh", (100, 10)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "what PRs are open?"),
    )
    .await;
    assert_eq!(
        done(&events),
        Some("the researcher could not use gh"),
        "{events:#?}"
    );
    let requests = f.llm.requests();
    assert_eq!(requests.len(), 5, "own prompt, parent ×2, child ×2");

    // The system prompts: the target's own has gh; the child's only what both have.
    let own_system = system(&requests[0]);
    assert!(
        own_system.contains("### gh") && own_system.contains("### kv"),
        "{own_system}"
    );
    let child_system = system(&requests[2]);
    assert!(child_system.contains("You are researcher"), "{child_system}");
    assert!(child_system.contains("### kv"), "{child_system}");
    assert!(!child_system.contains("### gh"), "{child_system}");

    // Both calls denied with the reason, before the tool; kv, which both have, works.
    let child_saw = tool_results(&requests[3]);
    assert_eq!(
        child_saw
            .matches("gh: not allowed for this sub-agent (parent lacks it)")
            .count(),
        2,
        "{child_saw}"
    );
    assert!(
        child_saw.contains("launcher=1") && child_saw.contains("raw=1"),
        "{child_saw}"
    );
    assert!(child_saw.contains("kv=0"), "{child_saw}");
    assert_eq!(f.gh.lock().unwrap().len(), 1, "no call of the child ran gh");

    // The parent got the child's answer in the original's format.
    let outputs = tool_outputs(&events);
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    let key = child_key(&outputs[0]);
    assert_key_format(&key, "api:assistant:main", "researcher");
    assert_eq!(
        outputs[0],
        format!("Exit code: 0\nSESSION: {key}\n---\ngh is not available to me")
    );

    // The denials are audited in the child's session, naming the parent's.
    let records = audit(&f.t);
    let denied: Vec<&Value> = records
        .iter()
        .filter(|r| r["tool"] == "gh" && r["decision"] == "denied")
        .collect();
    assert_eq!(denied.len(), 2, "{denied:#?}");
    for r in denied {
        assert_eq!(r["session"], key.as_str());
        assert_eq!(r["parentSession"], "api:assistant:main");
        assert!(r["error"].as_str().unwrap().contains("parent lacks it"));
    }
    f.gw.shutdown().await.unwrap();
}
