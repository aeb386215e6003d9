//! Sub-agents, the `spawn` tool (platform.md §2, the `spawn_*` rows of §5), end to end with
//! real components: the Docker sandbox (the parent's script calls `spawn` through the
//! shim, the child's model runs its commands in its own agent's sandbox), the SQLite
//! store in a temp dir, the audit log file, and the fake LLM server on 127.0.0.1 speaking
//! the Anthropic wire format, whose replies are scripted in the order the gateway asks:
//! the parent's exec blocks on the child, so parent and child requests never interleave.
//!
//! Covered: a tool the parent lacks stays out of the child's system prompt and every call
//! of it from the child (its model's command and a raw shim call with a forged session)
//! is denied `parent lacks it` while the target agent itself may use it; a narrowed
//! schedule run passes its narrowed tools down; a child cannot add schedules (which run
//! later with its agent's own rights); a daemon the child leaves behind gets
//! none of the target's rights; a target with egress its parent lacks is not started
//! (the gateway's decision: streams are not attributed per child, so the intersection
//! cannot be enforced inside the sandbox yet); the depth limit read from the caller's
//! exec, not from a forged `BEIGE_SESSION_KEY`; the child's usage in the parent's ledger
//! totals, and the parent's session and turn budgets and the target's budget stopping
//! the child and further spawns; the child is unattended (an ask is denied at once, told
//! to the owner and becomes the spawn's failure reason; nothing waits for the parent to
//! approve); the `spawn` audit records and the child's tool records naming the parent
//! session and exec; the `SESSION: …\n---\n<answer>` output; `--session`, one spawn at a
//! time per child, `timeoutSeconds` and `--message-file`.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_core::api::approvals::ApprovalEvent;
use beige_core::api::schedules::{RunStatus, ScheduleAuthor, ScheduleSpec};
use beige_core::audit::chain::is_chain_record;
use beige_core::config::Config;
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::store::{LedgerFilter, SessionStore, SqliteStore, UsageLedger};
use beige_core::PromptRequest;
use beige_core::{Admin as _, AgentEvent, Gateway as _, GatewayBuilder, LocalGateway};
use beige_testkit::anthropic::MessageStream;
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
    MessageStream::new()
        .text(text)
        .usage(usage.0, usage.1)
        .reply()
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
    f.llm
        .push(answer("the researcher could not use gh", (100, 10)));
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
    assert!(
        child_system.contains("You are researcher"),
        "{child_system}"
    );
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

/// `spawn_depth`: `a` may spawn itself (`SELF`) with `maxDepth: 2`. The root's child
/// (depth 1) spawns a grandchild (depth 2), whose spawn is refused with the depth limit;
/// forging `BEIGE_SESSION_KEY` (and the rest of the session context) to the root
/// session, or `BEIGE_EXEC_ID` to another exec, changes nothing: depth comes from the
/// caller's exec and the lineage stored with its session.
#[tokio::test]
async fn spawn_depth() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({"a": {"tools": ["spawn"],
                     "pluginConfigs": {"spawn": {"targets": {"SELF": {"maxDepth": 2}}}}}}),
        json!({}),
    )
    .await;
    const ROOT: &str = "api:a:root";
    f.llm
        .push(run("tu_r", "spawn --target SELF 'level one'", (10, 1)));
    f.llm
        .push(run("tu_1", "spawn --target SELF 'level two'", (10, 1)));
    f.llm.push(run(
        "tu_2",
        &format!(
            "spawn --target SELF 'level three'; echo \"rc=$?\"; \
             BEIGE_SESSION_KEY={ROOT} BEIGE_CHANNEL=api BEIGE_AGENT_NAME=a \
             spawn --target SELF 'forged session'; echo \"forged=$?\"; \
             BEIGE_EXEC_ID=x0000000000000001 spawn --target SELF 'forged exec'; \
             echo \"forged_exec=$?\"; spawn --info"
        ),
        (10, 1),
    ));
    f.llm
        .push(answer("grandchild could not go deeper", (10, 1)));
    f.llm.push(answer("child relays: no deeper", (10, 1)));
    f.llm.push(answer("root: done", (10, 1)));
    let events = prompt(&f.gw, PromptRequest::new("a", ROOT, "go deep")).await;
    assert_eq!(done(&events), Some("root: done"), "{events:#?}");
    assert_eq!(
        f.llm.request_count(),
        6,
        "no model call at a third level: {:#?}",
        f.llm.requests()
    );
    let requests = f.llm.requests();

    // The grandchild's refusals: the limit, whatever the environment claims.
    let deepest = tool_results(&requests[3]);
    let refused = "SESSION: none\n---\nspawn failed: depth limit 2 reached: this session is at depth 2, and a chain through target 'SELF' may be at most 2 deep\n";
    assert_eq!(deepest.matches(refused).count(), 2, "{deepest}");
    assert!(
        deepest.contains("rc=1") && deepest.contains("forged=1"),
        "{deepest}"
    );
    assert!(
        deepest.contains("exec_id_mismatch") && !deepest.contains("forged_exec=0"),
        "{deepest}"
    );
    assert!(
        deepest.contains("spawn: agent a, at depth 2 (a sub-agent of session spawn:")
            && deepest.contains("depth left 0 (cannot spawn: depth limit reached)"),
        "{deepest}"
    );

    // The chain in the store: root → child (depth 1) → grandchild (depth 2), each
    // lineage naming its parent and the exec that spawned it; nothing deeper.
    let root = session(&f.store, ROOT).await;
    let child_out = tool_results(&requests[4]);
    let grand_key = child_key(&child_out);
    assert_key_format(&grand_key, &child_key(&tool_outputs(&events)[0]), "a");
    assert!(
        child_out.contains("---\ngrandchild could not go deeper"),
        "{child_out}"
    );
    let child = session(&f.store, &child_key(&tool_outputs(&events)[0])).await;
    let grand = session(&f.store, &grand_key).await;
    let l1 = f.store.session_lineage(&child.id).await.unwrap().unwrap();
    let l2 = f.store.session_lineage(&grand.id).await.unwrap().unwrap();
    assert_eq!(
        (l1.depth, l1.parent_session_id.as_str()),
        (1, root.id.as_str())
    );
    assert_eq!(
        (l2.depth, l2.parent_session_id.as_str()),
        (2, child.id.as_str())
    );
    assert!(l1.invoked_by_exec.is_some() && l2.invoked_by_exec.is_some());
    assert_ne!(l1.invoked_by_exec, l2.invoked_by_exec);
    assert_eq!(l2.rights["maxDepth"], 2);
    assert!(f.store.session_lineage(&root.id).await.unwrap().is_none());
    let sessions = f.store.list_sessions("a").await.unwrap();
    assert_eq!(sessions.len(), 3, "{sessions:#?}");

    // The root's own spawn (depth 0 → 1) was fine, and so the root is not limited by
    // its child's failure to go deeper.
    assert!(
        tool_outputs(&events)[0].contains("---\nchild relays: no deeper"),
        "{:?}",
        tool_outputs(&events)
    );
    f.gw.shutdown().await.unwrap();
}

/// `spawn_budget`: the child's usage rows carry the parent session, so the parent's
/// session total (children included) is exactly what the fake provider reported for
/// both, priced; the spawn's audit record carries the child's cost. A parent whose
/// session budget the child used up: the child stops before its next model call, the
/// spawn fails `budget exhausted` (exit 77), and the parent cannot spawn again.
#[tokio::test]
async fn spawn_budget() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn"],
                          "budgets": {"session": {"tokens": 10000}},
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {"budget": {"tokens": 9500}}}}}},
            "planner": {"tools": ["spawn"],
                        "budgets": {"turn": {"tokens": 5000}},
                        "pluginConfigs": {"spawn": {"targets": {"researcher": {}}}}},
            "researcher": {"tools": []},
        }),
        json!({}),
    )
    .await;

    // 1. Within the budget: parent 1000+100, child 2000+200 and 3000+300, parent 400+40.
    f.llm
        .push(run("tu_p1", "spawn --target researcher 'dig'", (1000, 100)));
    f.llm.push(run("tu_c1", "echo digging", (2000, 200)));
    f.llm.push(answer("found it", (3000, 300)));
    f.llm.push(answer("the researcher found it", (400, 40)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:one", "research this"),
    )
    .await;
    assert_eq!(
        done(&events),
        Some("the researcher found it"),
        "{events:#?}"
    );
    let key = child_key(&tool_outputs(&events)[0]);
    let parent = session(&f.store, "api:assistant:one").await;
    let child = session(&f.store, &key).await;
    assert_eq!(child.agent, "researcher");
    assert_eq!(child.parent_id.as_deref(), Some(parent.id.as_str()));
    let totals = |session_id: &str, with_children: bool| {
        f.store.usage_totals(LedgerFilter {
            session_id: Some(session_id.to_string()),
            with_children,
            ..LedgerFilter::default()
        })
    };
    // claude-sonnet-4-6: $3 / $15 per million input / output tokens.
    let own = totals(&parent.id, false).await.unwrap();
    assert_eq!(
        (
            own.calls,
            own.input_tokens,
            own.output_tokens,
            own.cost_micros
        ),
        (2, 1400, 140, 1400 * 3 + 140 * 15)
    );
    let theirs = totals(&child.id, false).await.unwrap();
    assert_eq!(
        (
            theirs.calls,
            theirs.input_tokens,
            theirs.output_tokens,
            theirs.cost_micros
        ),
        (2, 5000, 500, 5000 * 3 + 500 * 15)
    );
    // The parent's total holds the child's, linked by the rows' parent session.
    let tree = totals(&parent.id, true).await.unwrap();
    assert_eq!(
        (
            tree.calls,
            tree.input_tokens,
            tree.output_tokens,
            tree.cost_micros
        ),
        (4, 6400, 640, 6400 * 3 + 640 * 15)
    );
    // The researcher's agent total is the child's: it spent on its own agent's rows.
    let by_agent = f
        .store
        .usage_totals(LedgerFilter {
            agent: Some("researcher".into()),
            ..LedgerFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(by_agent, theirs);
    let finished: Vec<Value> = audit(&f.t)
        .into_iter()
        .filter(|r| r["type"] == "spawn" && r["phase"] == "finished")
        .collect();
    assert_eq!(finished.len(), 1, "{finished:#?}");
    assert_eq!(finished[0]["spawn"]["costMicros"], 5000 * 3 + 500 * 15);
    assert_eq!(finished[0]["spawn"]["status"], "ok");

    // 2. At the limit: the parent spent 1100 tokens, the child's first call 9000 more
    // (10100 of 10000): the child's command runs, then it stops before asking the model
    // again; the second spawn is refused before any child exists.
    f.llm.push(run(
        "tu_p2",
        "spawn --target researcher 'dig deeper' 2>&1; echo \"rc=$?\"; \
         spawn --target researcher 'and again' 2>&1; echo \"again=$?\"",
        (1000, 100),
    ));
    f.llm.push(run("tu_c2", "echo child-ran", (8000, 1000)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:two", "research more"),
    )
    .await;
    assert_eq!(f.llm.request_count(), 6, "the child stopped at the limit");
    let out = tool_outputs(&events).join("\n");
    let message = "Session budget of 10000 tokens reached (10100 used)";
    assert_eq!(
        out.matches("spawn failed: budget exhausted: ").count(),
        2,
        "{out}"
    );
    assert_eq!(out.matches(message).count(), 2, "{out}");
    assert!(out.contains("rc=77") && out.contains("again=77"), "{out}");
    assert!(
        out.contains("SESSION: spawn:api:assistant:two:researcher:"),
        "{out}"
    );
    assert!(out.contains("SESSION: none\n"), "{out}");
    assert!(
        tool_results(&f.llm.requests()[5]).is_empty(),
        "the child's tool ran but its result never went to the model"
    );
    // One child for this parent, none for the refused spawn; the parent's own next
    // model call was refused by the same budget.
    let two = session(&f.store, "api:assistant:two").await;
    let children: Vec<_> = f
        .store
        .list_sessions("researcher")
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.parent_id.as_deref() == Some(two.id.as_str()))
        .collect();
    assert_eq!(children.len(), 1, "{children:#?}");
    assert!(
        matches!(events.last(), Some(AgentEvent::Error { message: m, .. }) if m.contains(message)),
        "{events:#?}"
    );
    let tree = totals(&two.id, true).await.unwrap();
    assert_eq!((tree.calls, tree.tokens()), (2, 10100));

    // 3. The target's own budget (9500 tokens over the child and its children): a new
    // parent session spends 110, its child 9500, and stops there, well within the
    // parent's 10000; the parent goes on.
    f.llm.push(run(
        "tu_p3",
        "spawn --target researcher 'dig once more' 2>&1; echo \"rc=$?\"",
        (100, 10),
    ));
    f.llm.push(run("tu_c3", "echo child-ran", (8000, 1500)));
    f.llm.push(answer("the researcher ran out", (10, 1)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:three", "once more"),
    )
    .await;
    assert_eq!(done(&events), Some("the researcher ran out"), "{events:#?}");
    let out = tool_outputs(&events).join("\n");
    assert!(
        out.contains("---\nspawn failed: budget exhausted: Sub-agent budget of 9500 tokens reached (9500 used)"),
        "{out}"
    );
    assert!(out.contains("rc=77"), "{out}");
    assert_eq!(f.llm.request_count(), 9);

    // 4. What is left of the parent's turn (`planner`: 5000 tokens a turn, no session
    // limit): its call spent 110, the child's first 4900 (5010 in this turn). The child
    // stops, the turn can spawn no more, and the parent's own next model call is refused
    // too: the turn counts its children's spending.
    f.llm.push(run(
        "tu_p4",
        "spawn --target researcher 'one more' 2>&1; echo \"rc=$?\"; \
         spawn --target researcher 'and another' 2>&1; echo \"again=$?\"",
        (100, 10),
    ));
    f.llm.push(run("tu_c4", "echo child-ran", (4000, 900)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("planner", "api:planner:four", "one more"),
    )
    .await;
    assert_eq!(f.llm.request_count(), 11);
    let turn = "Turn budget of 5000 tokens reached (5010 used). Raise budgets.turn.tokens (or agents.planner.budgets.turn.tokens) to continue.";
    let out = tool_outputs(&events).join("\n");
    assert!(
        out.contains(&format!(
            "---\nspawn failed: budget exhausted: {turn}\nrc=77"
        )) && out.contains(&format!(
            "SESSION: none\n---\nspawn failed: budget exhausted: {turn}\nagain=77"
        )),
        "{out}"
    );
    assert!(
        matches!(events.last(), Some(AgentEvent::Error { message: m, .. }) if m == turn),
        "{events:#?}"
    );
    f.gw.shutdown().await.unwrap();
}

/// `spawn_unattended`: an ask rule of the parent (`kv set`) holds for the child, which
/// runs unattended even though the parent's prompt is attended: its call is denied at
/// once, the spawn fails with `child denied: …` naming why, and no approval waits for
/// anyone (the parent agent least). The target on its own, without the rule, may.
#[tokio::test]
async fn spawn_unattended() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn", "kv"],
                          "policy": {"rules": [{"id": "kv-set", "tool": "kv", "pattern": ["set"],
                                                "decision": "ask", "justification": "writes shared state"}]},
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}}}},
            "researcher": {"tools": ["kv"]},
        }),
        json!({"approvals": {"scriptHoldSeconds": 0}}),
    )
    .await;
    let mut approvals = f.gw.approval_receiver().await;

    f.llm
        .push(run("tu_p", "spawn --target researcher 'note it'", (10, 1)));
    f.llm.push(run(
        "tu_c",
        "kv set note hello </dev/null 2>&1; echo \"set=$?\"; kv get note </dev/null; echo \"get=$?\"",
        (10, 1),
    ));
    f.llm.push(answer("I could not write the note", (10, 1)));
    f.llm.push(answer("the researcher was denied", (10, 1)));
    let started = std::time::Instant::now();
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "note it").attended(),
    )
    .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert_eq!(
        done(&events),
        Some("the researcher was denied"),
        "{events:#?}"
    );

    let child_saw = tool_results(&f.llm.requests()[2]);
    let origin =
        "a sub-agent spawned by session 'api:assistant:main'; its parent agent cannot approve it";
    assert!(
        child_saw.contains(&format!(
            "Permission denied: 'kv set note hello' needs approval, but this run is unattended ({origin})"
        )),
        "{child_saw}"
    );
    assert!(child_saw.contains("set=1"), "{child_saw}");
    assert!(
        child_saw.contains("get=1"),
        "nothing was written: {child_saw}"
    );

    // The parent's output says why, and the spawn failed.
    let out = tool_outputs(&events).join("\n");
    assert!(out.starts_with("Exit code: 1\nSESSION: spawn:"), "{out}");
    assert!(
        out.contains("---\nspawn failed: child denied: Permission denied: 'kv set note hello' needs approval"),
        "{out}"
    );
    assert!(!out.contains("I could not write the note"), "{out}");

    // Nothing waits for a decision, and no request was raised on the parent's stream.
    assert!(f.gw.approvals(None).await.unwrap().is_empty());
    // The owner is told (one unattended denial, in the child's session), no request.
    let key = child_key(&out);
    let mut reported = Vec::new();
    while let Ok(e) = approvals.try_recv() {
        match e {
            ApprovalEvent::ApprovalRequest { .. } => panic!("{e:?}"),
            ApprovalEvent::UnattendedDenied {
                agent,
                session,
                call,
                origin,
                ..
            } => reported.push((agent, session, call, origin)),
            ApprovalEvent::ApprovalDecided { .. } => {}
        }
    }
    assert_eq!(
        reported,
        [(
            "researcher".to_string(),
            key,
            "kv set note hello".to_string(),
            origin.to_string()
        )]
    );
    let finished: Vec<Value> = audit(&f.t)
        .into_iter()
        .filter(|r| r["type"] == "spawn" && r["phase"] == "finished")
        .collect();
    assert_eq!(finished[0]["spawn"]["status"], "denied");

    // The researcher on its own has no such rule.
    let own = exec(
        &f.gw,
        "researcher",
        "kv set note hello </dev/null; echo \"set=$?\"",
    )
    .await;
    assert!(own.joined_text().contains("set=0"), "{}", own.joined_text());
    f.gw.shutdown().await.unwrap();
}

/// `spawn_audit_links`: the `spawn` started and finished records name the parent (agent,
/// session, the exec that called spawn) and the child (agent, session), the depth and
/// the rights (tools and digest); the child's tool records carry `parentSession`; the
/// lineage stored with the child names the same exec.
#[tokio::test]
async fn spawn_audit_links() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn", "kv"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {"maxDepth": 1}}}}},
            "researcher": {"tools": ["kv", "gh"]},
        }),
        json!({}),
    )
    .await;
    const PARENT: &str = "api:assistant:main";
    f.llm.push(run(
        "tu_p",
        "spawn --target researcher 'take a note'",
        (10, 1),
    ));
    f.llm
        .push(run("tu_c", "kv set note hello </dev/null", (10, 1)));
    f.llm.push(answer("noted", (10, 1)));
    f.llm.push(answer("the note is taken", (10, 1)));
    let events = prompt(&f.gw, PromptRequest::new("assistant", PARENT, "note")).await;
    assert_eq!(done(&events), Some("the note is taken"), "{events:#?}");
    let outputs = tool_outputs(&events);
    let key = child_key(&outputs[0]);
    assert_eq!(
        outputs,
        [format!("Exit code: 0\nSESSION: {key}\n---\nnoted")]
    );

    let records = audit(&f.t);
    // The parent's call of spawn, from its exec.
    let call = records
        .iter()
        .find(|r| r["tool"] == "spawn" && r["type"] != "spawn" && r["phase"] == "finished")
        .unwrap_or_else(|| panic!("{records:#?}"));
    let parent_exec = call["exec"].as_str().unwrap().to_string();
    assert_eq!(call["session"], PARENT);
    assert!(call.get("parentSession").is_none(), "{call}");

    let spawns: Vec<&Value> = records.iter().filter(|r| r["type"] == "spawn").collect();
    assert_eq!(
        spawns
            .iter()
            .map(|r| r["phase"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["started", "finished"]
    );
    for r in &spawns {
        assert_eq!(r["agent"], "assistant");
        assert_eq!(r["session"], PARENT);
        let s = &r["spawn"];
        assert_eq!(
            s["parent"],
            json!({"agent": "assistant", "session": PARENT, "exec": parent_exec})
        );
        assert_eq!(s["child"], json!({"agent": "researcher", "session": key}));
        assert_eq!(s["depth"], 1);
        assert_eq!(
            s["rights"]["tools"],
            json!(["kv"]),
            "gh is the researcher's only"
        );
        assert_eq!(s["rights"]["digest"].as_str().unwrap().len(), 64);
    }
    assert_eq!(spawns[1]["spawn"]["status"], "ok");
    assert_eq!(spawns[1]["spawn"]["costMicros"], 2 * (10 * 3 + 15));
    assert!(spawns[0]["spawn"].get("status").is_none());

    // The child's records: its exec and its kv call, in its session, naming the parent.
    let child_records: Vec<&Value> = records
        .iter()
        .filter(|r| r["session"] == key.as_str())
        .collect();
    let tools: Vec<&str> = child_records
        .iter()
        .map(|r| r["tool"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"exec") && tools.contains(&"kv"),
        "{child_records:#?}"
    );
    for r in &child_records {
        assert_eq!(r["parentSession"], PARENT, "{r}");
        assert_eq!(r["agent"], "researcher", "{r}");
    }
    let child_exec = child_records
        .iter()
        .find(|r| r["tool"] == "kv")
        .and_then(|r| r["exec"].as_str())
        .unwrap();
    assert_ne!(child_exec, parent_exec);
    // The parent's own records name no parent.
    assert!(records
        .iter()
        .filter(|r| r["session"] == PARENT)
        .all(|r| r.get("parentSession").is_none()));

    // The lineage names the same exec.
    let child = session(&f.store, &key).await;
    let lineage = f.store.session_lineage(&child.id).await.unwrap().unwrap();
    assert_eq!(
        lineage.invoked_by_exec.as_deref(),
        Some(parent_exec.as_str())
    );
    assert_eq!(lineage.rights["tools"], json!(["kv"]));
    f.gw.shutdown().await.unwrap();
}

/// A schedule run narrowed to `tools: ["spawn"]` is a parent whose effective rights are
/// the schedule's: its SELF child does not get back the agent's other tools. The run
/// itself cannot call `kv`; neither can the child it spawns, though agent `a` has `kv`.
#[tokio::test]
async fn spawn_from_a_narrowed_schedule_run_keeps_its_tools() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({"a": {"tools": ["spawn", "kv"],
                     "pluginConfigs": {"spawn": {"targets": {"SELF": {}}}}}}),
        json!({}),
    )
    .await;
    let spec: ScheduleSpec = serde_json::from_value(json!({
        "agent": "a", "cron": "0 8 * * *", "prompt": "nightly notes", "tools": ["spawn"],
    }))
    .unwrap();
    let view =
        f.gw.add_schedule(
            spec,
            ScheduleAuthor {
                owner: "api".into(),
                created_by: "api".into(),
            },
        )
        .await
        .unwrap();

    f.llm.push(run(
        "tu_s",
        "kv set from-run x </dev/null 2>&1; echo \"run_kv=$?\"; spawn --target SELF 'write the note'",
        (10, 1),
    ));
    f.llm.push(run(
        "tu_c",
        "kv set from-child x </dev/null 2>&1; echo \"child_kv=$?\"",
        (10, 1),
    ));
    f.llm.push(answer("could not write", (10, 1)));
    f.llm.push(answer("nightly done", (10, 1)));
    f.gw.run_schedule_now(&view.id).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let finished = loop {
        let runs = f.gw.schedule_history(&view.id, 5).await.unwrap();
        if let Some(r) = runs.iter().find(|r| r.finished_at.is_some()) {
            break r.clone();
        }
        assert!(std::time::Instant::now() < deadline, "{runs:#?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let requests = f.llm.requests();
    assert_eq!(requests.len(), 4, "{finished:#?}");
    // The run's own prompt has no kv; its call is refused by the narrowing.
    assert!(!system(&requests[0]).contains("### kv"));
    // The child's prompt has no kv either, and its call is refused as the parent's
    // rights say.
    assert!(
        !system(&requests[1]).contains("### kv"),
        "{}",
        system(&requests[1])
    );
    let child_saw = tool_results(&requests[2]);
    assert!(
        child_saw.contains("kv: not allowed for this sub-agent (parent lacks it)")
            && child_saw.contains("child_kv=1"),
        "{child_saw}"
    );
    let run_saw = tool_results(&requests[3]);
    assert!(run_saw.contains("run_kv=1"), "{run_saw}");
    assert!(run_saw.contains("---\ncould not write"), "{run_saw}");
    assert_eq!(finished.status, RunStatus::Ok, "{finished:#?}");
    // The rights stored with the child: the run's, not the agent's.
    let child = f
        .store
        .list_sessions("a")
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.key.starts_with("spawn:schedule:"))
        .unwrap();
    let lineage = f.store.session_lineage(&child.id).await.unwrap().unwrap();
    assert_eq!(lineage.rights["tools"], json!(["spawn"]));
    f.gw.shutdown().await.unwrap();
}

/// `--session KEY` continues an earlier child of the calling session only: the child
/// keeps its conversation; another session's child, the caller's own session and an
/// unknown key are refused before any model call.
#[tokio::test]
async fn spawn_session_continues_only_own_children() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}}}},
            "researcher": {"tools": []},
        }),
        json!({}),
    )
    .await;
    // Another session of the same agent has a child.
    f.llm.push(run(
        "tu_o",
        "spawn --target researcher 'other work'",
        (10, 1),
    ));
    f.llm.push(answer("other child", (10, 1)));
    f.llm.push(answer("other done", (10, 1)));
    let other = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:other", "work"),
    )
    .await;
    let other_child = child_key(&tool_outputs(&other)[0]);

    const MAIN: &str = "api:assistant:main";
    f.llm.push(run(
        "tu_m",
        &format!(
            "spawn --target researcher 'first question' > /tmp/first; cat /tmp/first; \
             key=$(sed -n 's/^SESSION: //p' /tmp/first); \
             spawn --target researcher --session \"$key\" 'second question'; echo \"cont=$?\"; \
             spawn --target researcher --session {other_child} 'steal' 2>&1; echo \"steal=$?\"; \
             spawn --target researcher --session {MAIN} 'self' 2>&1; echo \"own=$?\"; \
             spawn --target researcher --session spawn:nothing 'none' 2>&1; echo \"unknown=$?\""
        ),
        (10, 1),
    ));
    f.llm.push(answer("first answer", (10, 1)));
    f.llm.push(answer("second answer", (10, 1)));
    f.llm.push(answer("main done", (10, 1)));
    let events = prompt(&f.gw, PromptRequest::new("assistant", MAIN, "ask twice")).await;
    assert_eq!(done(&events), Some("main done"), "{events:#?}");
    assert_eq!(
        f.llm.request_count(),
        7,
        "no model call for a refused --session"
    );
    let out = tool_outputs(&events).join("\n");
    let key = child_key(&out);
    assert_ne!(key, other_child);
    assert!(
        out.contains(&format!("SESSION: {key}\n---\nfirst answer\n"))
            && out.contains(&format!("SESSION: {key}\n---\nsecond answer\ncont=0")),
        "{out}"
    );
    // The continued child saw its earlier exchange.
    let continued = &f.llm.requests()[5];
    let texts = continued.body["messages"].to_string();
    assert!(
        texts.contains("first question")
            && texts.contains("first answer")
            && texts.contains("second question"),
        "{texts}"
    );
    for (name, key) in [
        ("steal", other_child.as_str()),
        ("own", MAIN),
        ("unknown", "spawn:nothing"),
    ] {
        assert!(
            out.contains(&format!(
                "SESSION: none\n---\nspawn failed: session '{key}' is not a child of this session on target 'researcher'; `--session` continues only this session's own children\n{name}=1"
            )),
            "{name}: {out}"
        );
    }
    // The other session's child was not touched.
    let stolen = session(&f.store, &other_child).await;
    let messages = f.store.messages(&stolen.id, false).await.unwrap();
    assert_eq!(messages.len(), 2, "{messages:#?}");
    f.gw.shutdown().await.unwrap();
}

/// A child that does not finish within `timeoutSeconds` is cancelled and the spawn
/// exits 124 saying so; the parent goes on.
#[tokio::test]
async fn spawn_timeout_cancels_the_child() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}, "timeoutSeconds": 1}}},
            "researcher": {"tools": []},
        }),
        json!({}),
    )
    .await;
    f.llm.push(run(
        "tu_p",
        "spawn --target researcher 'slow work' 2>&1; echo \"rc=$?\"",
        (10, 1),
    ));
    f.llm.push(Reply::hang());
    f.llm.push(answer("the researcher was too slow", (10, 1)));
    let started = std::time::Instant::now();
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "slow"),
    )
    .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(
        done(&events),
        Some("the researcher was too slow"),
        "{events:#?}"
    );
    let out = tool_outputs(&events).join("\n");
    assert!(
        out.contains("---\nspawn failed: the child did not finish within 1 s (pluginConfigs.spawn.timeoutSeconds) and was cancelled\nrc=124"),
        "{out}"
    );
    let finished: Vec<Value> = audit(&f.t)
        .into_iter()
        .filter(|r| r["type"] == "spawn" && r["phase"] == "finished")
        .collect();
    assert_eq!(finished[0]["spawn"]["status"], "timeout");
    f.gw.shutdown().await.unwrap();
}

/// `spawn_child_cannot_reach_a_host_its_parent_lacks`, at the layer that decides it
/// today: the egress proxy decides a sandbox's streams by its agent's rules (streams are
/// not attributed to an exec or a session), so the gateway refuses to start a child whose
/// agent has egress its parent lacks, before any of the child's model calls or commands.
/// A target without egress, and a target whose egress block is the parent's own, start.
#[tokio::test]
async fn spawn_child_cannot_reach_a_host_its_parent_lacks() {
    let env = docker_or_skip!();
    let github = json!({"rules": [{"id": "github", "hosts": ["api.github.com"]}]});
    let targets = json!({"spawn": {"targets": {"researcher": {}, "helper": {}}}});
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn"], "pluginConfigs": targets},
            "twin": {"tools": ["spawn"], "pluginConfigs": targets, "egress": github},
            "researcher": {"tools": [], "egress": github},
            "helper": {"tools": []},
        }),
        json!({}),
    )
    .await;

    // No egress → a target with egress: refused, no child, no model call for one.
    f.llm.push(run(
        "tu_a",
        "spawn --target researcher 'fetch the issues' 2>&1; echo \"rc=$?\"; \
         spawn --target helper 'summarise' 2>&1; echo \"helper=$?\"",
        (10, 1),
    ));
    f.llm.push(answer("summary", (10, 1)));
    f.llm.push(answer("assistant done", (10, 1)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "go"),
    )
    .await;
    assert_eq!(done(&events), Some("assistant done"), "{events:#?}");
    assert_eq!(f.llm.request_count(), 3, "the researcher child never ran");
    let out = tool_outputs(&events).join("\n");
    assert!(
        out.contains("SESSION: none\n---\nspawn failed: target 'researcher' has egress rules (agents.researcher.egress) that agent 'assistant' does not have")
            && out.contains("it could reach hosts its parent cannot")
            && out.contains("\nrc=1\n"),
        "{out}"
    );
    assert!(out.contains("---\nsummary\nhelper=0"), "{out}");
    assert!(f
        .store
        .list_sessions("researcher")
        .await
        .unwrap()
        .is_empty());

    // The same egress block: the child can reach nothing its parent cannot.
    f.llm.push(run(
        "tu_t",
        "spawn --target researcher 'fetch' 2>&1; echo \"rc=$?\"",
        (10, 1),
    ));
    f.llm.push(answer("fetched", (10, 1)));
    f.llm.push(answer("twin done", (10, 1)));
    let events = prompt(&f.gw, PromptRequest::new("twin", "api:twin:main", "go")).await;
    assert_eq!(done(&events), Some("twin done"), "{events:#?}");
    let out = tool_outputs(&events).join("\n");
    assert!(out.contains("---\nfetched\nrc=0"), "{out}");
    f.gw.shutdown().await.unwrap();
}

/// One spawn at a time runs a child session: while a `--session` continuation of a
/// child runs, another continuation of the same child is refused at once (it would share
/// the running child's state), and once it has ended the child may be continued again.
#[tokio::test]
async fn spawn_session_runs_one_spawn_at_a_time() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}, "timeoutSeconds": 4}}},
            "researcher": {"tools": []},
        }),
        json!({}),
    )
    .await;
    f.llm.push(run(
        "tu_p",
        "spawn --target researcher 'first' > /tmp/first 2>&1; \
         key=$(sed -n 's/^SESSION: //p' /tmp/first); \
         spawn --target researcher --session \"$key\" 'slow' > /tmp/slow 2>&1 & \
         sleep 2; \
         spawn --target researcher --session \"$key\" 'meanwhile' 2>&1; echo \"meanwhile=$?\"; \
         wait; cat /tmp/slow; \
         spawn --target researcher --session \"$key\" 'later' 2>&1; echo \"later=$?\"",
        (10, 1),
    ));
    f.llm.push(answer("first answer", (10, 1)));
    f.llm.push(Reply::hang());
    f.llm.push(answer("later answer", (10, 1)));
    f.llm.push(answer("done", (10, 1)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "go"),
    )
    .await;
    assert_eq!(done(&events), Some("done"), "{events:#?}");
    assert_eq!(
        f.llm.request_count(),
        5,
        "no model call for the refused one"
    );
    let out = tool_outputs(&events).join("\n");
    assert!(
        out.contains("is still running for another spawn; wait for that spawn to finish before continuing it\nmeanwhile=1"),
        "{out}"
    );
    assert!(
        out.contains("spawn failed: the child did not finish within 4 s"),
        "{out}"
    );
    assert!(out.contains("---\nlater answer\nlater=0"), "{out}");
    f.gw.shutdown().await.unwrap();
}

/// A child cannot escape its rights by leaving its exec: a daemon it starts (`setsid`,
/// re-parented to PID 1, so bound to no exec) and that names the target agent's own
/// session is an unbound caller, and an agent that other agents may spawn refuses
/// unbound calls (`policy.unboundCalls` is `deny` for it) — else the daemon would run
/// `gh` with the target's rights, which the parent lacks.
#[tokio::test]
async fn spawn_child_daemon_gets_no_rights_of_the_target() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}}}},
            "researcher": {"tools": ["gh"]},
        }),
        json!({}),
    )
    .await;
    // The researcher's own session is known to the gateway.
    f.llm.push(answer("hello", (10, 1)));
    prompt(
        &f.gw,
        PromptRequest::new("researcher", "api:researcher:main", "hello"),
    )
    .await;

    f.llm
        .push(run("tu_p", "spawn --target researcher 'start it'", (10, 1)));
    f.llm.push(run(
        "tu_c",
        "(setsid sh -c 'sleep 2; BEIGE_SESSION_KEY=api:researcher:main BEIGE_CHANNEL=api \
         BEIGE_AGENT_NAME=researcher gh pr list > /workspace/daemon.out 2>&1; \
         echo \"rc=$?\" >> /workspace/daemon.out' </dev/null >/dev/null 2>&1 &); \
         sleep 1; echo started",
        (10, 1),
    ));
    f.llm.push(answer("started a helper", (10, 1)));
    f.llm.push(answer("done", (10, 1)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "go"),
    )
    .await;
    assert_eq!(done(&events), Some("done"), "{events:#?}");
    // Wait for the daemon's call.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let text = loop {
        let out = exec(&f.gw, "researcher", "cat /workspace/daemon.out 2>/dev/null").await;
        let text = out.joined_text();
        if text.lines().any(|l| l.starts_with("rc=")) {
            break text;
        }
        if std::time::Instant::now() > deadline {
            let ps = exec(&f.gw, "researcher", "ps -ef").await;
            panic!("no daemon output: {text}\n{}", ps.joined_text());
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    assert!(
        text.contains("\nrc=1")
            && text.contains("unbound_call: this process belongs to no exec of agent 'researcher'"),
        "{text}"
    );
    assert!(f.gh.lock().unwrap().is_empty(), "gh never ran: {text}");
    let unbound: Vec<Value> = audit(&f.t)
        .into_iter()
        .filter(|r| r["tool"] == "gh" && r["attribution"] == "unbound")
        .collect();
    assert_eq!(unbound.len(), 1, "{unbound:#?}");
    assert_eq!(unbound[0]["decision"], "denied");
    f.gw.shutdown().await.unwrap();
}

/// At load: an agent that other agents spawn may not let unbound callers use its rights
/// (`policy.unboundCalls: "session"`), naming the path and the target that needs it;
/// an agent that only spawns itself (`SELF`) may.
#[tokio::test]
async fn a_spawned_agent_may_not_serve_unbound_calls() {
    let dir = tempfile::tempdir().unwrap();
    let build = |researcher_policy: Value, targets: Value| {
        let config: Config = serde_json::from_value(json!({
            "llm": {"providers": {"anthropic": {"apiKey": KEY}}},
            "plugins": {"spawn": {}},
            "agents": {
                "assistant": {"model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                              "tools": ["spawn"],
                              "pluginConfigs": {"spawn": {"targets": targets}}},
                "researcher": {"model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                               "tools": ["spawn"], "policy": researcher_policy,
                               "pluginConfigs": {"spawn": {"targets": {"SELF": {}}}}},
            },
        }))
        .unwrap();
        GatewayBuilder::new(config, beige_core::BeigeHome::new(dir.path().join("home")))
            .sandbox(Arc::new(beige_core::testing::MemorySandbox::new()))
            .build()
    };
    let err = match build(
        json!({"unboundCalls": "session"}),
        json!({"researcher": {}}),
    )
    .await
    {
        Ok(_) => panic!("a spawned agent with unboundCalls: session was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("agents.researcher.policy.unboundCalls")
            && err.contains("agents.assistant.pluginConfigs.spawn.targets.researcher")
            && err.contains("needs 'deny'"),
        "{err}"
    );
    // Not a target of another agent (SELF only): its own choice.
    build(json!({"unboundCalls": "session"}), json!({"SELF": {}}))
        .await
        .unwrap();
    build(json!({"unboundCalls": "deny"}), json!({"researcher": {}}))
        .await
        .unwrap();
}

/// `message_file_in_sandbox` with the real tool: `spawn --message-file` sends what the
/// path holds in the sandbox as the child's message; the host's file at the same path
/// never reaches the fake LLM.
#[tokio::test]
async fn spawn_message_file_is_read_in_the_sandbox() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}}}},
            "researcher": {"tools": []},
        }),
        json!({}),
    )
    .await;
    const HOST_MARKER: &str = "HOST-ONLY-MARKER-77c1";
    std::fs::create_dir_all(f.t.home.root().join(".beige")).unwrap();
    std::fs::write(
        f.t.home.root().join(".beige/config.json5"),
        format!("{{ secret: \"{HOST_MARKER}\" }}"),
    )
    .unwrap();
    f.llm.push(run(
        "tu_p",
        "mkdir -p ~/.beige && printf 'the task from the sandbox file' > ~/.beige/config.json5 && \
         spawn --target researcher --message-file '~/.beige/config.json5'",
        (10, 1),
    ));
    f.llm.push(answer("task done", (10, 1)));
    f.llm.push(answer("all done", (10, 1)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "go"),
    )
    .await;
    assert_eq!(done(&events), Some("all done"), "{events:#?}");
    let requests = f.llm.requests();
    let child_messages = requests[1].body["messages"].to_string();
    assert!(
        child_messages.contains("the task from the sandbox file"),
        "{child_messages}"
    );
    for r in &requests {
        assert!(!r.raw_body.contains(HOST_MARKER));
    }
    assert!(tool_outputs(&events)[0].ends_with("---\ntask done"));
    f.gw.shutdown().await.unwrap();
}

/// A child cannot step out of its rights through a schedule: a schedule runs later as
/// its agent with the agent's own tools and rules, so a child with `schedule` in its
/// rights may list its agent's schedules but not add (or fire) one; the target on its
/// own may.
#[tokio::test]
async fn spawn_child_cannot_schedule_work_beyond_its_rights() {
    let env = docker_or_skip!();
    let f = fixture(
        &env,
        json!({
            "assistant": {"tools": ["spawn", "schedule"],
                          "pluginConfigs": {"spawn": {"targets": {"researcher": {}}}}},
            "researcher": {"tools": ["schedule", "gh"]},
        }),
        json!({"plugins": {"spawn": {}, "kv": {}, "schedule": {}}}),
    )
    .await;
    f.llm.push(run(
        "tu_p",
        "spawn --target researcher 'plan nightly gh work'",
        (10, 1),
    ));
    f.llm.push(run(
        "tu_c",
        "schedule add --cron '0 8 * * *' --prompt 'merge the PRs with gh' 2>&1; echo \"add=$?\"; \
         schedule list 2>&1; echo \"list=$?\"",
        (10, 1),
    ));
    f.llm.push(answer("could not schedule", (10, 1)));
    f.llm.push(answer("done", (10, 1)));
    let events = prompt(
        &f.gw,
        PromptRequest::new("assistant", "api:assistant:main", "go"),
    )
    .await;
    assert_eq!(done(&events), Some("done"), "{events:#?}");
    let child_saw = tool_results(&f.llm.requests()[2]);
    assert!(
        child_saw.contains("schedule add: not allowed for this sub-agent")
            && child_saw.contains("add=1"),
        "{child_saw}"
    );
    assert!(child_saw.contains("list=0"), "{child_saw}");
    assert!(f.gw.schedules(Some("researcher")).await.unwrap().is_empty());
    // The researcher on its own may.
    let own = exec(
        &f.gw,
        "researcher",
        "schedule add --cron '0 8 * * *' --prompt 'merge the PRs with gh' 2>&1; echo \"add=$?\"",
    )
    .await;
    assert!(own.joined_text().contains("add=0"), "{}", own.joined_text());
    assert_eq!(f.gw.schedules(Some("researcher")).await.unwrap().len(), 1);
    f.gw.shutdown().await.unwrap();
}
