//! Plugin tools as CLI executables in a real container: launchers, the agent's socket,
//! policy, audit, identity, paths and socket abuse.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use beige_core::plugin::Beneath;
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::sandbox_docker::exec;
use super::support::{DockerEnv, TestHome};
use crate::docker_or_skip;

/// `probe` reports what the gateway told it: session, cwd, config; `probe cat <path>`
/// reads a workspace file beneath a handle on the workspace, as handlers should.
#[derive(Debug)]
struct Probe;

#[async_trait]
impl Tool for Probe {
    fn name(&self) -> &str {
        "probe"
    }
    fn description(&self) -> &str {
        "test tool"
    }
    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        if call.args.first().map(String::as_str) == Some("cat") {
            let rel = call.args.get(1).cloned().unwrap_or_default();
            let read = Beneath::open(&call.workspace).and_then(|ws| ws.read(&rel, 1 << 20));
            return Ok(match read {
                Ok(c) => ToolResult::ok(String::from_utf8_lossy(&c.bytes).into_owned()),
                Err(e) => ToolResult::fail(e.to_string(), 1),
            });
        }
        Ok(ToolResult::ok(
            json!({
                "agent": call.session.agent,
                "session": call.session.key,
                "channel": call.session.channel,
                "cwd": call.cwd,
                "config": call.config,
                "args": call.args,
                "stdin": call.stdin.map(|s| String::from_utf8_lossy(&s).into_owned()),
            })
            .to_string(),
        ))
    }
}

#[derive(Debug)]
struct ProbePlugin;

#[async_trait]
impl Plugin for ProbePlugin {
    fn name(&self) -> &str {
        "probe"
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(Probe))
    }
}

async fn start(
    t: &TestHome,
    env: &DockerEnv,
    agents: &[(&str, serde_json::Value)],
) -> LocalGateway {
    let mut config = t.config(env, agents);
    config.plugins = serde_json::from_value(json!({
        "kv": {"config": {"maxKeys": 1000}},
        "probe": {"config": {"base": 1, "nested": {"a": 1}}},
    }))
    .unwrap();
    let docker = t.docker().await;
    GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker))
        .plugin(Arc::new(ProbePlugin))
        .build()
        .await
        .unwrap()
}

fn audit(home: &BeigeHome) -> Vec<serde_json::Value> {
    std::fs::read_to_string(home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| !beige_core::audit::chain::is_chain_record(v))
        .collect()
}

async fn raw(home: &BeigeHome, agent: &str, line: &str) -> serde_json::Value {
    let mut s = UnixStream::connect(home.socket_path(agent)).await.unwrap();
    s.write_all(line.as_bytes()).await.unwrap();
    s.write_all(b"\n").await.unwrap();
    let mut out = String::new();
    BufReader::new(s).read_line(&mut out).await.unwrap();
    serde_json::from_str(&out).unwrap()
}

#[tokio::test]
async fn a_script_calls_kv_fifty_times_and_every_call_is_audited() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env, &[("loop", json!({"tools": ["kv"]}))]).await;
    let out = exec(&gw, "loop", "for i in $(seq 1 50); do kv set user:$i \"name $i\"; done; for i in $(seq 1 50); do kv get user:$i; done | wc -l; kv get user:7; ls /tools/bin; cat /tools/packages/kv/SKILL.md | head -1").await;
    let text = out.joined_text();
    assert!(!out.is_error, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1].trim(), "50", "{text}");
    assert_eq!(lines[2], "name 7");
    assert_eq!(lines[3], "kv");
    let records = audit(&t.home);
    let exec_records: Vec<_> = records.iter().filter(|r| r["tool"] == "exec").collect();
    assert_eq!(exec_records.len(), 2);
    assert_eq!(exec_records[0]["phase"], "started");
    assert_eq!(exec_records[0]["type"], "core_tool");
    let kv: Vec<_> = records.iter().filter(|r| r["tool"] == "kv").collect();
    assert_eq!(kv.len(), 2 * 101);
    for pair in kv.chunks(2).take(50) {
        assert_eq!(pair[0]["phase"], "started");
        assert_eq!(pair[1]["phase"], "finished");
        assert_eq!(pair[0]["agent"], "loop");
        assert_eq!(pair[0]["type"], "tool");
        assert_eq!(pair[0]["session"], "socket:loop");
        assert_eq!(pair[1]["exitCode"], 0);
    }
    assert_eq!(kv[12]["args"], json!(["set", "user:7", "name 7"]));
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_tool_not_allowed_has_no_launcher_and_is_denied_on_the_raw_socket() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    // A stale launcher from an earlier config must disappear.
    std::fs::create_dir_all(t.home.launchers_dir("intern")).unwrap();
    std::os::unix::fs::symlink("/beige/shim", t.home.launchers_dir("intern").join("probe"))
        .unwrap();
    let gw = start(&t, &env, &[("intern", json!({"tools": ["kv"]}))]).await;
    let out = exec(&gw, "intern", "ls /tools/bin; /beige/shim tool probe x; echo rc=$?; ln -s /beige/shim /tmp/probe; /tmp/probe y; echo rc=$?").await;
    let text = out.joined_text();
    let denied = "Permission denied: tool 'probe' is not allowed for agent 'intern'";
    assert!(text.starts_with("Exit code: 0\nkv\n"), "{text}");
    assert_eq!(text.matches(denied).count(), 2, "{text}");
    assert_eq!(text.matches("rc=1").count(), 2, "{text}");
    let records = audit(&t.home);
    let probe: Vec<_> = records.iter().filter(|r| r["tool"] == "probe").collect();
    assert_eq!(probe.len(), 2, "one record per denied call");
    assert!(probe
        .iter()
        .all(|r| r["decision"] == "denied" && r["phase"] == "finished"));
    assert_eq!(probe[0]["error"], denied);
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn identity_cwd_and_symlinks() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(
        &t,
        &env,
        &[
            (
                "a",
                json!({"tools": ["probe"], "pluginConfigs": {"probe": {"nested": {"b": 2}}}}),
            ),
            ("b", json!({"tools": ["probe"]})),
        ],
    )
    .await;
    gw.register_session("b", "telegram:b-chat");
    gw.register_session("a", "telegram:a-chat");

    // A script's calls run in its exec's session (here the exec has none: `socket:a`),
    // whatever session its environment names — another agent's or the agent's own.
    let out = exec(&gw, "a", "mkdir -p sub/dir && cd sub/dir && BEIGE_SESSION_KEY=telegram:b-chat BEIGE_CHANNEL=telegram BEIGE_AGENT_NAME=b probe one; echo; BEIGE_SESSION_KEY=telegram:a-chat BEIGE_CHANNEL=telegram probe two").await;
    let text = out.joined_text();
    let mut lines = text.lines().skip(1);
    let forged: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(forged["agent"], "a");
    assert_eq!(forged["session"], "socket:a");
    assert_eq!(forged["channel"], "socket");
    assert_eq!(forged["cwd"], "sub/dir");
    assert_eq!(
        forged["config"],
        json!({"base": 1, "nested": {"a": 1, "b": 2}})
    );
    let own: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(own["session"], "socket:a");
    assert_eq!(own["channel"], "socket");

    // cwd escaping the workspace is rejected (straight to the socket).
    let r = raw(
        &t.home,
        "a",
        r#"{"type":"tool_request","tool":"probe","args":[],"cwd":"../../etc"}"#,
    )
    .await;
    assert_eq!(r["success"], false);
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("leaves the workspace"),
        "{r}"
    );

    // A symlink planted in the workspace never lets the host-side handler out.
    let secret = t.dir.path().join("host-secret.txt");
    std::fs::write(&secret, "top secret").unwrap();
    let cmd = format!("echo inside > ok.txt; ln -s {} leak; ln -s /etc/passwd pw; ln -s .. up; probe cat ok.txt; probe cat leak; echo rc=$?; probe cat pw; probe cat up/home/x; echo rc=$?", secret.display());
    let out = exec(&gw, "a", &cmd).await;
    let text = out.joined_text();
    assert!(text.contains("inside"), "{text}");
    assert!(!text.contains("top secret"), "{text}");
    assert!(!text.contains("root:"), "{text}");
    assert_eq!(text.matches("symbolic link").count(), 3, "{text}");

    // Stdin piped into a tool reaches the handler.
    let out = exec(&gw, "a", "printf 'piped data' | probe in").await;
    let v: serde_json::Value =
        serde_json::from_str(out.joined_text().lines().nth(1).unwrap()).unwrap();
    assert_eq!(v["stdin"], "piped data");
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_original_clients_request_lines_get_the_original_response_shape() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env, &[("assistant", json!({"tools": ["kv"]}))]).await;
    // Exactly what the TypeScript tool client writes.
    let set = raw(&t.home, "assistant", r#"{"type":"tool_request","tool":"kv","args":["set","user:7","Ada"],"sessionContext":{"sessionKey":"telegram:42","channel":"telegram","agentName":"assistant","chatId":"42"}}"#).await;
    assert_eq!(
        set,
        json!({"type": "tool_response", "success": true, "output": "", "exitCode": 0})
    );
    let get = raw(
        &t.home,
        "assistant",
        r#"{"type":"tool_request","tool":"kv","args":["get","user:7"],"cwd":"projects/x"}"#,
    )
    .await;
    assert_eq!(
        get,
        json!({"type": "tool_response", "success": true, "output": "Ada\n", "exitCode": 0})
    );
    let missing = raw(
        &t.home,
        "assistant",
        r#"{"type":"tool_request","tool":"kv","args":["get","nope"]}"#,
    )
    .await;
    assert_eq!(missing["success"], false);
    assert_eq!(missing["exitCode"], 1);
    assert_eq!(missing["error"], missing["output"]);
    let denied = raw(
        &t.home,
        "assistant",
        r#"{"type":"tool_request","tool":"git","args":["status"]}"#,
    )
    .await;
    assert_eq!(
        denied,
        json!({"type": "tool_response", "success": false, "error": "Permission denied: tool 'git' is not allowed for agent 'assistant'", "exitCode": 1})
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn socket_abuse_leaves_other_agents_served() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(
        &t,
        &env,
        &[
            ("noisy", json!({"tools": ["kv"]})),
            ("calm", json!({"tools": ["kv"]})),
        ],
    )
    .await;
    let path = t.home.socket_path("noisy");

    // Invalid JSON and a 2 MiB line on the noisy agent's socket.
    let r = raw(&t.home, "noisy", "{not json").await;
    assert!(r["error"].as_str().unwrap().starts_with("Invalid request"));
    let mut big = UnixStream::connect(&path).await.unwrap();
    let mut line = vec![b'a'; 2 * 1024 * 1024];
    line.push(b'\n');
    let _ = big.write_all(&line).await;
    let mut answer = String::new();
    BufReader::new(&mut big)
        .read_line(&mut answer)
        .await
        .unwrap();
    assert!(answer.contains("line longer than"), "{answer}");

    drop(big);

    // 250 connections held open at once: the agent's first 64 are kept, every further
    // one gets one error line naming the limit and is closed.
    let mut held = Vec::new();
    for _ in 0..250 {
        held.push(UnixStream::connect(&path).await.unwrap());
    }
    // Meanwhile the calm agent is answered promptly, from its sandbox.
    let started = Instant::now();
    let out = exec(&gw, "calm", "kv set a 1 && kv get a").await;
    assert_eq!(out.joined_text(), "Exit code: 0\n1");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let mut refused = 0;
    for s in &mut held {
        let mut out = String::new();
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(50), s.read_to_string(&mut out)).await
        {
            assert!(n > 0);
            assert!(
                out.contains(
                    "agent 'noisy' already has 64 connections open to the tool socket (the limit)"
                ),
                "{out}"
            );
            refused += 1;
        }
    }
    assert!(refused >= 250 - 64, "{refused}");
    // Once they are closed, 50 calls at once all run.
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut calls = Vec::new();
    for i in 0..50 {
        let path = path.clone();
        calls.push(tokio::spawn(async move {
            let mut s = UnixStream::connect(&path).await.unwrap();
            s.write_all(format!("{{\"type\":\"tool_request\",\"tool\":\"kv\",\"args\":[\"set\",\"k{i}\",\"v\"]}}\n").as_bytes()).await.unwrap();
            let mut out = String::new();
            BufReader::new(s).read_line(&mut out).await.unwrap();
            out
        }));
    }
    for c in calls {
        assert!(c.await.unwrap().contains("\"success\":true"));
    }
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn unwritable_audit_log_refuses_calls_and_secrets_are_redacted() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env, &[("sec", json!({"tools": ["kv"]}))]).await;
    // The configured provider key (see TestHome::config) passed as a tool argument.
    let out = exec(
        &gw,
        "sec",
        "kv set token sk-test-secret-never-in-sandbox; kv get token",
    )
    .await;
    assert!(out
        .joined_text()
        .contains("sk-test-secret-never-in-sandbox"));
    let text = std::fs::read_to_string(t.home.audit_log_path()).unwrap();
    assert!(!text.contains("sk-test-secret"), "{text}");
    assert!(
        text.contains("\"args\":[\"set\",\"token\",\"***\"]"),
        "{text}"
    );

    // The audit folder becomes unusable: calls are refused, core and plugin alike.
    let logs = t.home.logs_dir();
    std::fs::remove_dir_all(&logs).unwrap();
    std::fs::write(&logs, "not a folder").unwrap();
    let err = gw
        .call_tool(
            "sec",
            beige_core::api::tools::CoreToolCall::parse("exec", json!({"command": "echo hi"}))
                .unwrap(),
            Default::default(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tool calls are refused"), "{err}");
    let r = raw(
        &t.home,
        "sec",
        r#"{"type":"tool_request","tool":"kv","args":["get","token"]}"#,
    )
    .await;
    assert_eq!(r["success"], false);
    assert!(r["error"].as_str().unwrap().contains("audit log"), "{r}");
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn skills_are_mounted_read_only_and_requirements_checked() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let skill = t.dir.path().join("skills/review");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("skill.json"),
        r#"{"name":"review","description":"How to review code","requires":{"tools":["kv"]}}"#,
    )
    .unwrap();
    std::fs::write(skill.join("README.md"), "Check the tests first.").unwrap();
    let mut config = t.config(
        &env,
        &[("rev", json!({"tools": ["kv"], "skills": ["review"]}))],
    );
    config.skills = serde_json::from_value(json!({"review": {"path": skill}})).unwrap();
    config.plugins = serde_json::from_value(json!({"kv": {}})).unwrap();
    let docker = t.docker().await;
    let gw = GatewayBuilder::new(config.clone(), t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker))
        .build()
        .await
        .unwrap();
    let out = exec(
        &gw,
        "rev",
        "cat /skills/review/README.md; echo; touch /skills/review/x 2>&1; true",
    )
    .await;
    let text = out.joined_text();
    assert!(text.contains("Check the tests first."), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");
    gw.shutdown().await.unwrap();

    // A skill whose required tool the agent lacks stops the start with a clear error.
    config.agents.get_mut("rev").unwrap().tools.clear();
    let docker = t.docker().await;
    let err = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker))
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("requires tool 'kv'"), "{err}");
}
