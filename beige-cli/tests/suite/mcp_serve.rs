//! beige as an MCP server, end to end through the built binary and a real gateway
//! daemon with a Docker sandbox: an rmcp client (test side only) starts
//! `beige mcp serve --agent a` and lists the tools, runs `exec`, calls a plugin tool
//! and a denied one; the audit log has `channel: "mcp"` and the principal. Over HTTP
//! (raw JSON-RPC): no token 401, a browser `Origin` 403, an unknown agent 404, and a
//! `notifications/cancelled` during `exec sleep 30` ends the process in the sandbox.
//! `beige mcp serve` says what to do when the agent or the token is wrong.
//!
//! Docker tests skip outside CI with a printed reason when a Docker piece is missing.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use beige_testkit::llm::FakeLlmServer;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt as _;
use serde_json::{json, Map, Value};

use super::daemon::{beige, DaemonGuard};
use super::{free_port, TestEnv};
use crate::docker_or_skip;

fn write_config(home: &Path, provider_url: &str, port: u16, image: &str) {
    let config = format!(
        r#"// written by the MCP server test
{{
  llm: {{ providers: {{ anthropic: {{ apiKey: "sk-test-mcp", baseUrl: "{provider_url}" }} }} }},
  plugins: {{ kv: {{}} }},
  agents: {{
    a: {{
      model: {{ provider: "anthropic", model: "claude-sonnet-4-6" }},
      tools: ["kv"],
      policy: {{ rules: [ {{ id: "no-del", tool: "kv", pattern: ["del"], decision: "deny" }} ] }},
      sandbox: {{ image: "{image}", memoryLimit: "256m", pidsLimit: 128 }},
    }},
  }},
  gateway: {{ host: "127.0.0.1", port: {port} }},
}}
"#
    );
    std::fs::write(home.join("config.json5"), config).unwrap();
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object: {v}"),
    }
}

fn text(result: &rmcp::model::CallToolResult) -> String {
    let v = serde_json::to_value(result).unwrap();
    v["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn audit(home: &Path) -> Vec<Value> {
    std::fs::read_to_string(home.join("logs/audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_serve_exposes_the_agents_tools_through_the_gateway() {
    let docker = docker_or_skip!();
    let fake = FakeLlmServer::start().await;
    let env = TestEnv::new();
    let _guard = DaemonGuard(&env);
    let run = beige(&env, &["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let port = free_port();
    write_config(&env.home(), &fake.url(), port, &docker.image);
    let run = beige(&env, &["gateway", "start", "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);

    // What `beige mcp serve` says when it cannot serve.
    let run = beige(&env, &["mcp", "serve", "--agent", "nobody"]);
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert!(run.stderr.contains("no agent 'nobody'"), "{}", run.stderr);
    assert!(run.stderr.contains("(agents: a)"), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    let run = tokio::task::block_in_place(|| {
        env.command(&["mcp", "serve", "--agent", "a"])
            .env("BEIGE_TOKEN", "not-the-token")
            .output()
            .unwrap()
    });
    assert_eq!(run.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("refused the token from $BEIGE_TOKEN"),
        "{stderr}"
    );
    let run = tokio::task::block_in_place(|| {
        env.command(&[
            "mcp",
            "serve",
            "--agent",
            "a",
            "--token-file",
            "/nonexistent/token",
        ])
        .output()
        .unwrap()
    });
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("cannot read the token file"));

    // An MCP client starts `beige mcp serve` the way Claude Code or Codex would.
    let command = tokio::process::Command::from(env.command(&["mcp", "serve", "--agent", "a"]));
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.unwrap();
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "beige");
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["read", "write", "patch", "exec", "kv"]);
    let exec = tools.iter().find(|t| t.name == "exec").unwrap();
    assert_eq!(
        exec.annotations.as_ref().and_then(|a| a.destructive_hint),
        Some(true)
    );

    let call = |name: &'static str, args: Value| {
        CallToolRequestParams::new(name).with_arguments(object(args))
    };
    let r = client
        .call_tool(call("exec", json!({"command": "echo hi"})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    assert!(text(&r).contains("hi"), "{}", text(&r));
    let r = client
        .call_tool(call(
            "exec",
            json!({"command": "echo \"$BEIGE_SESSION_KEY $BEIGE_CHANNEL\""}),
        ))
        .await
        .unwrap();
    assert!(text(&r).contains("mcp:a:owner mcp"), "{}", text(&r));
    let r = client
        .call_tool(call("kv", json!({"args": ["set", "k", "v1"]})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = client
        .call_tool(call("kv", json!({"args": ["get", "k"]})))
        .await
        .unwrap();
    assert_eq!(text(&r).trim(), "v1");
    // Denied by the agent's rules: an error result, and nothing deleted.
    let r = client
        .call_tool(call("kv", json!({"args": ["del", "k"]})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("Permission denied"), "{}", text(&r));
    let r = client
        .call_tool(call("kv", json!({"args": ["get", "k"]})))
        .await
        .unwrap();
    assert_eq!(text(&r).trim(), "v1");
    // A client that gives up on a call cancels it (rmcp sends `notifications/cancelled`
    // to `beige mcp serve`, which passes it on): the exec ends in the sandbox.
    let gave_up = tokio::time::timeout(
        Duration::from_secs(3),
        client.call_tool(call("exec", json!({"command": "sleep 31"}))),
    )
    .await;
    assert!(gave_up.is_err(), "sleep 31 finished: {gave_up:?}");
    let cancelled_at = Instant::now();
    loop {
        let list = beige(&env, &["exec", "a", "--", "ps"]).stdout;
        if !list.contains("sleep 31") {
            break;
        }
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(15),
            "the exec the client gave up on still runs:\n{list}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    client.cancel().await.unwrap();

    let records = audit(&env.home());
    let exec = records
        .iter()
        .find(|r| {
            r["tool"] == "exec" && r["phase"] == "finished" && r["args"] == json!(["echo hi"])
        })
        .unwrap_or_else(|| panic!("no exec record: {records:?}"));
    assert_eq!(exec["channel"], "mcp", "{exec}");
    assert_eq!(exec["principal"], "owner", "{exec}");
    assert_eq!(exec["via"], "mcp:owner", "{exec}");
    assert_eq!(exec["session"], "mcp:a:owner", "{exec}");
    assert_eq!(exec["decision"], "allowed", "{exec}");
    let denied = records
        .iter()
        .find(|r| r["tool"] == "kv" && r["decision"] == "denied")
        .unwrap_or_else(|| panic!("no denied record: {records:?}"));
    assert_eq!(denied["args"], json!(["del", "k"]));
    assert_eq!(denied["channel"], "mcp");
    assert_eq!(denied["principal"], "owner");

    // Over HTTP.
    let token = std::fs::read_to_string(env.home().join("gateway.token"))
        .unwrap()
        .trim()
        .to_string();
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let rpc = |path: &str, body: Value, session: Option<&str>| {
        let mut r = http
            .post(format!("{url}{path}"))
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(id) = session {
            r = r
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-06-18");
        }
        r
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "0"}}});
    let r = rpc("/mcp/agents/a", initialize.clone(), None)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = rpc("/mcp/agents/a", initialize.clone(), None)
        .bearer_auth(&token)
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = rpc("/mcp/agents/nobody", initialize.clone(), None)
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    let r = rpc("/mcp/agents/a", initialize, None)
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let _ = r.text().await.unwrap();
    let r = rpc(
        "/mcp/agents/a",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(&session),
    )
    .bearer_auth(&token)
    .send()
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let sleeping = rpc(
        "/mcp/agents/a",
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "exec", "arguments": {"command": "sleep 30"}}}),
        Some(&session),
    )
    .bearer_auth(&token)
    .send();
    let call = tokio::spawn(async move {
        match sleeping.await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        }
    });
    let ps = || async {
        let run = beige(&env, &["exec", "a", "--", "ps"]);
        run.stdout
    };
    let started = Instant::now();
    loop {
        if ps().await.contains("sleep 30") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "sleep 30 never started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cancelled_at = Instant::now();
    let r = rpc(
        "/mcp/agents/a",
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": 7, "reason": "test"}}),
        Some(&session),
    )
    .bearer_auth(&token)
    .send()
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    loop {
        let list = ps().await;
        if !list.contains("sleep 30") {
            break;
        }
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(15),
            "the cancelled exec still runs:\n{list}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(15),
        "the exec ended by itself, not by the cancellation"
    );
    // The call's stream ends too.
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the cancelled call's stream ends")
        .unwrap();
}
