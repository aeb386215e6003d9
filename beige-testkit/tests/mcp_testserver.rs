//! The MCP test server, driven by an rmcp client: every tool over stdio (a child
//! process), and `headers` over streamable HTTP with a bearer token.
//!
//! The binary is `BEIGE_MCP_TESTSERVER` (the static one from `scripts/build-shim`, which
//! CI must test: with `CI=true` a missing variable fails); outside CI, when it is unset,
//! the debug build cargo made for this test is used instead, with a note.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, JsonObject};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// The server binary to test.
fn server_binary() -> PathBuf {
    match std::env::var_os("BEIGE_MCP_TESTSERVER").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(
                !ci,
                "BEIGE_MCP_TESTSERVER is not set: in CI the static test server must be tested \
                 (scripts/build-shim builds it into target/shim/beige-mcp-testserver)"
            );
            eprintln!(
                "note: BEIGE_MCP_TESTSERVER is not set (not in CI): testing cargo's debug build; \
                 run scripts/build-shim and set it to test the static binary"
            );
            PathBuf::from(env!("CARGO_BIN_EXE_beige-mcp-testserver"))
        }
    }
}

/// A client that reports `notifications/tools/list_changed`.
#[derive(Debug, Clone)]
struct Client {
    changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }
}

fn params(name: &'static str, args: Value) -> CallToolRequestParams {
    let args: JsonObject = match args {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    };
    CallToolRequestParams::new(name).with_arguments(args)
}

async fn call(
    client: &RunningService<RoleClient, Client>,
    name: &'static str,
    args: Value,
) -> CallToolResult {
    tokio::time::timeout(
        Duration::from_secs(30),
        client.call_tool(params(name, args)),
    )
    .await
    .unwrap_or_else(|_| panic!("{name}: no answer in 30 s"))
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|b| b.as_text().map(|t| t.text.clone()))
        .collect()
}

fn json_of(r: &CallToolResult) -> Value {
    serde_json::from_str(&text_of(r)).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

/// The real uid of this process.
fn own_uid() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test]
async fn every_tool_over_stdio() {
    let mut cmd = tokio::process::Command::new(server_binary());
    cmd.env_clear()
        .env("BEIGE_PLACEHOLDER", "beige-ph-1")
        .env("MCP_MODE", "test")
        .env("TOKEN", "t0k")
        .env("OTHER_SECRET", "must not show")
        .stderr(Stdio::inherit());
    let transport = TokioChildProcess::new(cmd).unwrap();
    let (changed_tx, mut changed) = mpsc::unbounded_channel();
    let client = Client {
        changed: changed_tx,
    }
    .serve(transport)
    .await
    .unwrap();

    let info = client.peer_info().unwrap();
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("beige-mcp-testserver")
    );

    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "echo",
            "add",
            "fail",
            "slow",
            "calls",
            "image",
            "big",
            "junk_stdout",
            "change_tools",
            "whoami",
            "headers",
            "headers_digest"
        ]
    );
    let add = tools.iter().find(|t| t.name == "add").unwrap();
    assert!(add.output_schema.is_some());

    // echo, add, fail
    assert_eq!(
        text_of(&call(&client, "echo", json!({"text": "hi"})).await),
        "hi"
    );
    let r = call(&client, "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(text_of(&r), "5");
    assert_eq!(r.structured_content, Some(json!({"sum": 5})));
    assert_ne!(r.is_error, Some(true));
    let r = call(&client, "fail", json!({"message": "boom"})).await;
    assert_eq!((r.is_error, text_of(&r).as_str()), (Some(true), "boom"));
    let r = call(&client, "fail", json!({})).await;
    assert_eq!(r.is_error, Some(true));

    // Bad arguments and unknown tools are protocol errors.
    assert!(client.call_tool(params("echo", json!({}))).await.is_err());
    assert!(client.call_tool(params("nope", json!({}))).await.is_err());

    // image: a PNG
    let r = call(&client, "image", json!({})).await;
    let image = r.content.iter().find_map(ContentBlock::as_image).unwrap();
    assert_eq!(image.mime_type, "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&image.data)
        .unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));

    // big: exactly that many bytes, also past 1 MiB
    for n in [0usize, 1000, 3 * 1024 * 1024] {
        let r = call(&client, "big", json!({"bytes": n})).await;
        assert_eq!(text_of(&r).len(), n);
    }

    // junk_stdout: the call works and so does the next one (rmcp skips the line)
    let r = call(&client, "junk_stdout", json!({})).await;
    assert_eq!(text_of(&r), "wrote a junk line to stdout");
    assert_eq!(
        text_of(&call(&client, "echo", json!({"text": "after junk"})).await),
        "after junk"
    );

    // whoami: ids and only the BEIGE_*, MCP_* and TOKEN variables
    let who = json_of(&call(&client, "whoami", json!({})).await);
    assert_eq!(who["uid"], json!(own_uid()), "{who}");
    assert!(who["gid"].is_u64(), "{who}");
    assert_eq!(
        who["env"],
        json!({"BEIGE_PLACEHOLDER": "beige-ph-1", "MCP_MODE": "test", "TOKEN": "t0k"}),
        "{who}"
    );

    // headers: there is no HTTP request over stdio
    let r = call(&client, "headers", json!({})).await;
    assert_eq!(r.is_error, Some(true));

    // slow: finishes, or is cancelled when the call is dropped
    assert_eq!(
        text_of(&call(&client, "slow", json!({"seconds": 0.05})).await),
        "slept 0.05 s"
    );
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        client.call_tool(params("slow", json!({"seconds": 60}))),
    )
    .await;
    assert!(dropped.is_err(), "slow 60 answered: {dropped:?}");
    let mut cancellations = json!(null);
    for _ in 0..50 {
        cancellations = json_of(&call(&client, "calls", json!({})).await)["cancellations"].clone();
        if cancellations == json!(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        cancellations,
        json!(1),
        "the server never saw the cancellation"
    );

    // change_tools: a list_changed notification, then `extra` is listed and callable
    assert!(client.call_tool(params("extra", json!({}))).await.is_err());
    call(&client, "change_tools", json!({})).await;
    tokio::time::timeout(Duration::from_secs(10), changed.recv())
        .await
        .expect("no tools/list_changed within 10 s")
        .unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "extra"));
    assert_eq!(text_of(&call(&client, "extra", json!({})).await), "extra");

    // calls: every call counted by name (refused ones too), this one included
    let counts = json_of(&call(&client, "calls", json!({})).await);
    let calls: BTreeMap<String, u64> = serde_json::from_value(counts["calls"].clone()).unwrap();
    let want: BTreeMap<String, u64> = [
        ("echo", 3),
        ("add", 1),
        ("fail", 2),
        ("nope", 1),
        ("image", 1),
        ("big", 3),
        ("junk_stdout", 1),
        ("whoami", 1),
        ("headers", 1),
        ("slow", 2),
        ("extra", 2),
        ("change_tools", 1),
        ("calls", calls.get("calls").copied().unwrap_or(0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(calls, want);
    assert!(calls["calls"] >= 2);
    assert_eq!(counts["junkLines"], json!(1));

    client.cancel().await.unwrap();
}

#[tokio::test]
async fn headers_over_http() {
    let mut child = tokio::process::Command::new(server_binary())
        .args(["--http", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("no first line in 30 s")
        .unwrap()
        .unwrap();
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line: {first:?}"))
        .to_string();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );

    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header("s3cret-token"),
    );
    let (changed_tx, _changed) = mpsc::unbounded_channel();
    let client = Client {
        changed: changed_tx,
    }
    .serve(transport)
    .await
    .unwrap();
    assert_eq!(
        text_of(&call(&client, "echo", json!({"text": "over http"})).await),
        "over http"
    );
    let headers = json_of(&call(&client, "headers", json!({})).await);
    assert_eq!(
        headers["authorization"],
        json!("Bearer s3cret-token"),
        "{headers}"
    );
    assert!(
        headers["host"]
            .as_str()
            .is_some_and(|h| h.starts_with("127.0.0.1:")),
        "{headers}"
    );
    client.cancel().await.unwrap();
    child.kill().await.unwrap();
}

#[tokio::test]
async fn refuses_addresses_off_loopback_and_bad_arguments() {
    for args in [
        &["--http", "0.0.0.0:0"][..],
        &["--http", "192.0.2.1:80"],
        &["--bogus"],
    ] {
        let out = tokio::process::Command::new(server_binary())
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("usage: beige-mcp-testserver"),
            "{args:?}: {stderr}"
        );
        if args[0] == "--http" {
            assert!(
                stderr.contains("only a loopback address is allowed"),
                "{stderr}"
            );
        }
    }
    let out = tokio::process::Command::new(server_binary())
        .arg("--version")
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("beige-mcp-testserver "));
}
