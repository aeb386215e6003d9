//! MCP servers as CLIs on the real Docker engine (`spec/mcp.md` §1, §3): the test
//! server (`beige-mcp-testserver`, a static binary built by `scripts/build-shim`) runs
//! inside the agent's sandbox under a uid of its own, started by PID 1 over the shim
//! link; scripts call its tools through `/tools/bin/testsrv`, and every call takes the
//! gateway's guarded path (policy, audit) under the name `testsrv.<tool>`.

use std::path::PathBuf;
use std::sync::Arc;

use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext, ToolOutput};
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway};
use serde_json::{json, Value};

use super::support::{required, DockerEnv, TestHome};
use crate::docker_or_skip;

/// The static test server, or `None` (skipping) when it was not built.
pub(super) fn testserver() -> Option<PathBuf> {
    let path = std::env::var_os("BEIGE_MCP_TESTSERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/shim/beige-mcp-testserver")
        });
    if path.is_file() {
        return Some(path);
    }
    let why = format!(
        "no MCP test server at {}: run scripts/build-shim or set BEIGE_MCP_TESTSERVER",
        path.display()
    );
    assert!(!required(), "MCP test cannot run in CI: {why}");
    eprintln!("SKIPPED (not in CI): {why}");
    None
}

/// A gateway whose agent `m` has the test server as `testsrv`, with `tools` patterns.
async fn start(
    t: &TestHome,
    env: &DockerEnv,
    server: &std::path::Path,
    tools: Value,
) -> LocalGateway {
    start_with(t, env, server, tools, json!({})).await
}

/// [`start`] with more settings merged into the server's definition.
async fn start_with(
    t: &TestHome,
    env: &DockerEnv,
    server: &std::path::Path,
    tools: Value,
    extra: Value,
) -> LocalGateway {
    let dir = server.parent().unwrap().canonicalize().unwrap();
    let name = server.file_name().unwrap().to_str().unwrap();
    let agent = json!({
        "tools": tools,
        "sandbox": {
            "image": env.image,
            "memoryLimit": "256m",
            "pidsLimit": 128,
            "extraMounts": { dir.to_str().unwrap(): "/opt/mcp:ro" },
        },
    });
    let mut config = t.config(env, &[("m", agent)]);
    let mut def = json!({ "command": format!("/opt/mcp/{name}"), "timeout": "20s" });
    for (k, v) in extra.as_object().unwrap() {
        def[k] = v.clone();
    }
    config.mcp = Some(serde_json::from_value(json!({ "servers": { "testsrv": def } })).unwrap());
    GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .build()
        .await
        .unwrap()
}

async fn exec(gw: &LocalGateway, command: &str) -> ToolOutput {
    let ctx = ToolContext {
        session_key: Some("api:mcp".into()),
        channel: Some("api".into()),
        ..Default::default()
    };
    let call = CoreToolCall::Exec(ExecParams {
        command: command.into(),
        timeout: Some(120),
    });
    gw.call_tool("m", call, ctx).await.unwrap()
}

fn audit(home: &BeigeHome) -> Vec<Value> {
    std::fs::read_to_string(home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| !beige_core::audit::chain::is_chain_record(v))
        .collect()
}

/// The first line of an exec's text that is a JSON object.
fn json_line(text: &str) -> Value {
    text.lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line in: {text}"))
}

fn records<'a>(all: &'a [Value], tool: &str, phase: &str) -> Vec<&'a Value> {
    all.iter()
        .filter(|r| r["tool"] == tool && r["phase"] == phase)
        .collect()
}

#[tokio::test]
async fn a_script_calls_a_sandboxed_mcp_tool_a_hundred_times_and_each_call_is_audited() {
    let env = docker_or_skip!();
    let Some(server) = testserver() else { return };
    let t = TestHome::new();
    let gw = start(&t, &env, &server, json!(["testsrv", "!testsrv.fail"])).await;

    // One exec, one model round trip: a hundred calls, each checked and audited.
    let out = exec(
        &gw,
        "i=0; s=0; while [ $i -lt 100 ]; do r=$(testsrv add --a $i --b 1) || exit 9; s=$((s+r)); i=$((i+1)); done; echo total=$s",
    )
    .await;
    let text = out.joined_text();
    assert!(!out.is_error, "{text}");
    // Σ (i + 1) for i in 0..100.
    assert!(text.contains("total=5050"), "{text}");
    let all = audit(&t.home);
    let finished = records(&all, "testsrv.add", "finished");
    assert_eq!(finished.len(), 100, "one finished record per call");
    assert!(finished
        .iter()
        .all(|r| r["decision"] == "allowed" && r["exitCode"] == 0));
    assert_eq!(records(&all, "testsrv.add", "started").len(), 100);

    // A denied tool is not listed, and calling it is refused with the reason: exit 1
    // and one denied record.
    let listing = exec(&gw, "testsrv").await.joined_text();
    assert!(listing.contains("add"), "{listing}");
    assert!(!listing.contains("fail"), "{listing}");
    let denied = exec(&gw, "testsrv fail --message boom; echo rc=$?")
        .await
        .joined_text();
    assert!(denied.contains("rc=1"), "{denied}");
    assert!(
        denied.contains("testsrv.fail"),
        "the refusal names the tool: {denied}"
    );
    // What `beige mcp list` shows: every tool, with whether the patterns allow it.
    let servers = beige_core::api::Admin::mcp_servers(&gw, "m").await.unwrap();
    assert_eq!(servers.len(), 1);
    assert_eq!(
        (servers[0].server.as_str(), servers[0].kind.as_str()),
        ("testsrv", "sandbox")
    );
    let allowed = |name: &str| {
        servers[0]
            .tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.allowed)
    };
    assert_eq!(allowed("add"), Some(true));
    assert_eq!(allowed("fail"), Some(false));
    // A typo never names the denied tool ("did you mean" knows only allowed ones).
    let typo = exec(&gw, "testsrv fial; echo rc=$?").await.joined_text();
    assert!(typo.contains("rc=2"), "{typo}");
    assert!(!typo.contains("fail"), "a denied tool leaked: {typo}");
    let all = audit(&t.home);
    let refusals: Vec<&Value> = all
        .iter()
        .filter(|r| r["tool"] == "testsrv.fail" && r["decision"] == "denied")
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(records(&all, "testsrv.fail", "started").is_empty());

    // Arguments that break the schema are refused before the server sees them: exit 2
    // naming the field, and the server's counter of `add` calls is unchanged.
    let bad = exec(
        &gw,
        r#"testsrv add --json '{"a": "seven", "b": 1}'; echo rc=$?"#,
    )
    .await
    .joined_text();
    assert!(bad.contains("rc=2"), "{bad}");
    assert!(bad.contains("a"), "{bad}");
    let calls = exec(&gw, "testsrv calls").await.joined_text();
    let counts = json_line(&calls);
    assert_eq!(counts["calls"]["add"], 100, "{counts}");
}

#[tokio::test]
async fn the_server_runs_in_the_sandbox_under_a_uid_of_its_own() {
    let env = docker_or_skip!();
    let Some(server) = testserver() else { return };
    let t = TestHome::new();
    let gw = start(&t, &env, &server, json!(["testsrv.*"])).await;
    let me = exec(&gw, "testsrv whoami; echo; echo agent=$(id -u)")
        .await
        .joined_text();
    let who = json_line(&me);
    assert_eq!(who["uid"], 61000, "{who}");
    let agent_uid = me.lines().find_map(|l| l.strip_prefix("agent=")).unwrap();
    assert_ne!(who["uid"].to_string(), agent_uid.trim());
    // The agent's user cannot read the server's environment.
    let pid = who["pid"].as_u64().unwrap();
    let environ = exec(
        &gw,
        &format!("cat /proc/{pid}/environ >/dev/null 2>&1 && echo readable || echo refused"),
    )
    .await
    .joined_text();
    assert!(environ.contains("refused"), "{environ}");
    // On the host, every test-server process lives in another pid namespace (a
    // container's), never in the gateway's.
    let own = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains("/opt/mcp/") {
            seen += 1;
            let ns = std::fs::read_link(entry.path().join("ns/pid")).unwrap();
            assert_ne!(ns, own, "an MCP server runs in the gateway's pid namespace");
        }
    }
    assert!(seen >= 1, "the server process was not found at all");
}

#[tokio::test]
async fn files_in_and_out_time_limits_and_a_changed_tool_list() {
    let env = docker_or_skip!();
    let Some(server) = testserver() else { return };
    let t = TestHome::new();
    let extra = json!({ "toolTimeouts": { "slow": 2 } });
    let gw = start_with(&t, &env, &server, json!(["testsrv"]), extra).await;

    // `--json @file` reads beneath the workspace, relative to the working directory.
    let sum = exec(
        &gw,
        r#"mkdir -p sub && cd sub && echo '{"a": 2, "b": 3}' > args.json && testsrv add --json @args.json"#,
    )
    .await
    .joined_text();
    assert!(sum.lines().any(|l| l.trim() == "5"), "{sum}");
    let outside = exec(&gw, "testsrv add --json @/etc/passwd; echo rc=$?")
        .await
        .joined_text();
    assert!(
        outside.contains("rc=2") && outside.contains("/workspace"),
        "{outside}"
    );

    // An image in a result is saved in the workspace, readable by the agent.
    let image = exec(&gw, "testsrv image && ls -n .beige/mcp-out/ && id -u")
        .await
        .joined_text();
    assert!(image.contains(".beige/mcp-out/"), "{image}");
    let dir = t.home.default_workspace("m").join(".beige/mcp-out");
    let saved: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(saved.len(), 1, "{image}");
    let png = std::fs::read(saved[0].path()).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let agent_uid: u32 = image.lines().last().unwrap().trim().parse().unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(saved[0].metadata().unwrap().uid(), agent_uid);

    // A call past its tool's time limit exits 124 and is cancelled at the server.
    let slow = exec(&gw, "testsrv slow --seconds 30; echo rc=$?")
        .await
        .joined_text();
    assert!(slow.contains("rc=124"), "{slow}");
    let mut cancelled = Value::Null;
    for _ in 0..50 {
        cancelled = json_line(&exec(&gw, "testsrv calls").await.joined_text());
        if cancelled["cancellations"].as_u64() >= Some(1) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        cancelled["cancellations"].as_u64() >= Some(1),
        "{cancelled}"
    );

    // A tool added at run time becomes a subcommand without a restart.
    let before = exec(&gw, "testsrv extra; echo rc=$?").await.joined_text();
    assert!(before.contains("rc=2"), "{before}");
    exec(&gw, "testsrv change_tools").await;
    let mut after = String::new();
    for _ in 0..50 {
        after = exec(&gw, "testsrv extra; echo rc=$?").await.joined_text();
        if after.contains("rc=0") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(after.contains("rc=0") && after.contains("extra"), "{after}");
}
