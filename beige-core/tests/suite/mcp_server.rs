//! beige as an MCP server (`mcp::serve`), on a real gateway with the labelled
//! `MemorySandbox`: the tool listing (core tools with the model's schemas and their
//! annotations, allowed plugin tools, a denied one absent), calls through the guarded
//! path with `channel: "mcp"`, the principal and `via` in the audit, a denied call as
//! `isError` with a denied record, the limit of concurrent calls, cancellation, and the
//! streamable-HTTP endpoint on the API router (initialize, tools/list, tools/call,
//! unknown agent, browser `Origin`, a session replayed with another token).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use beige_core::channel::http::{router, ApiState};
use beige_core::mcp::serve::{
    AgentServer, EndpointOptions, McpCaller, McpEndpoint, MAX_CALLS_PER_PRINCIPAL,
};
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::testing::MemorySandbox;
use beige_core::{BeigeHome, GatewayBuilder, GatewayFull, LocalGateway};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

const TOKEN: &str = "test-token-mcp-0123456789";

/// `echo` answers with its arguments and stdin; `wait` runs until it is dropped.
#[derive(Debug)]
struct TestTool(&'static str);

#[async_trait]
impl Tool for TestTool {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        match self.0 {
            "echo" => "echoes its arguments",
            "wait" => "waits until cancelled",
            _ => "reads the vault of secrets",
        }
    }
    fn commands(&self) -> Vec<String> {
        vec![format!("{} <words…>", self.0)]
    }
    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        if self.0 == "wait" {
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
        let stdin = call
            .stdin
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Ok(ToolResult::ok(format!(
            "{}: {} [{stdin}] session={} channel={}",
            self.0,
            call.args.join(" "),
            call.session.key,
            call.session.channel
        )))
    }
}

#[derive(Debug)]
struct OneTool(&'static str);

#[async_trait]
impl Plugin for OneTool {
    fn name(&self) -> &str {
        self.0
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(TestTool(self.0)))?;
        Ok(())
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    home: BeigeHome,
    gw: LocalGateway,
    sandbox: Arc<MemorySandbox>,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-key-0123456789"}}},
        "plugins": {"echo": {}, "secret": {}, "wait": {}},
        "agents": {"a": {
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": ["echo", "secret", "wait"],
            "denyTools": ["secret"]
        }}
    }))
    .unwrap();
    let sandbox = Arc::new(MemorySandbox::new().on_exec(|_, command| {
        (command == "echo hi").then(|| MemorySandbox::exec_reply("hi\n", 0))
    }));
    let gw = GatewayBuilder::new(config, home.clone())
        .sandbox(sandbox.clone())
        .plugin(Arc::new(OneTool("echo")))
        .plugin(Arc::new(OneTool("secret")))
        .plugin(Arc::new(OneTool("wait")))
        .build()
        .await
        .unwrap();
    Setup {
        _dir: dir,
        home,
        gw,
        sandbox,
    }
}

impl Setup {
    fn server(&self) -> AgentServer {
        AgentServer::new(Arc::new(self.gw.clone()) as Arc<dyn GatewayFull>, "a")
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.home.audit_log_path())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|v: &Value| !beige_core::audit::chain::is_chain_record(v))
            .collect()
    }
}

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn the_listing_has_the_core_tools_and_the_allowed_plugin_tools_only() {
    let s = setup().await;
    let tools: Vec<Value> = s
        .server()
        .tools()
        .await
        .unwrap()
        .iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["read", "write", "patch", "exec", "echo", "wait"]);
    let by = |n: &str| tools.iter().find(|t| t["name"] == n).unwrap().clone();
    // The model's schemas.
    assert_eq!(by("exec")["inputSchema"]["required"], json!(["command"]));
    assert_eq!(
        by("patch")["inputSchema"]["required"],
        json!(["path", "oldText", "newText"])
    );
    assert!(by("read")["description"]
        .as_str()
        .unwrap()
        .starts_with("Read a file in your sandbox."));
    // Annotations: read is read-only, the others destructive.
    assert_eq!(by("read")["annotations"]["readOnlyHint"], true);
    assert_eq!(by("read")["annotations"]["destructiveHint"], false);
    for t in ["write", "patch", "exec"] {
        assert_eq!(by(t)["annotations"]["destructiveHint"], true, "{t}");
        assert_eq!(by(t)["annotations"]["readOnlyHint"], false, "{t}");
    }
    // A plugin tool: {args: string[], stdin?: string}, described by the tool.
    let echo = by("echo");
    assert_eq!(echo["inputSchema"]["properties"]["args"]["type"], "array");
    assert_eq!(
        echo["inputSchema"]["properties"]["args"]["items"]["type"],
        "string"
    );
    assert_eq!(echo["inputSchema"]["properties"]["stdin"]["type"], "string");
    assert_eq!(echo["inputSchema"]["required"], json!(["args"]));
    let description = echo["description"].as_str().unwrap();
    assert!(
        description.starts_with("echoes its arguments"),
        "{description}"
    );
    assert!(description.contains("echo <words…>"), "{description}");
}

#[tokio::test]
async fn calls_run_through_the_guarded_path_as_the_principal_with_channel_mcp() {
    let s = setup().await;
    let server = s.server();
    let owner = McpCaller::owner();
    let r = server
        .call(
            &owner,
            "exec",
            args(json!({"command": "echo hi"})),
            CancellationToken::new(),
        )
        .await;
    let r = serde_json::to_value(&r).unwrap();
    assert_eq!(r["isError"], false, "{r}");
    assert!(text(&r).contains("hi"), "{r}");
    assert_eq!(s.sandbox.executed("a"), ["echo hi"]);

    let r = serde_json::to_value(
        server
            .call(
                &owner,
                "echo",
                args(json!({"args": ["a", "b c"], "stdin": "in"})),
                CancellationToken::new(),
            )
            .await,
    )
    .unwrap();
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(text(&r), "echo: a b c [in] session=mcp:a:owner channel=mcp");

    let audit = s.audit();
    let exec: Vec<&Value> = audit.iter().filter(|r| r["tool"] == "exec").collect();
    assert_eq!(exec.len(), 2, "{audit:?}");
    for r in &exec {
        assert_eq!(r["channel"], "mcp", "{r}");
        assert_eq!(r["principal"], "owner", "{r}");
        assert_eq!(r["via"], "mcp:owner", "{r}");
        assert_eq!(r["session"], "mcp:a:owner", "{r}");
        assert_eq!(r["decision"], "allowed", "{r}");
    }
    let echo: Vec<&Value> = audit.iter().filter(|r| r["tool"] == "echo").collect();
    assert_eq!(echo.len(), 2, "{audit:?}");
    assert_eq!(echo[1]["args"], json!(["a", "b c"]));
    assert_eq!(echo[1]["principal"], "owner");
    assert_eq!(echo[1]["type"], "tool");
}

#[tokio::test]
async fn a_denied_tool_is_an_error_result_with_a_denied_record() {
    let s = setup().await;
    let server = s.server();
    let owner = McpCaller::owner();
    for tool in ["secret", "nosuch"] {
        let r = serde_json::to_value(
            server
                .call(
                    &owner,
                    tool,
                    args(json!({"args": []})),
                    CancellationToken::new(),
                )
                .await,
        )
        .unwrap();
        assert_eq!(r["isError"], true, "{r}");
        assert!(
            text(&r).contains(&format!("tool '{tool}' is not allowed for agent 'a'")),
            "{r}"
        );
    }
    let audit = s.audit();
    for tool in ["secret", "nosuch"] {
        let denied: Vec<&Value> = audit.iter().filter(|r| r["tool"] == tool).collect();
        assert_eq!(denied.len(), 1, "{audit:?}");
        assert_eq!(denied[0]["decision"], "denied");
        assert_eq!(denied[0]["channel"], "mcp");
        assert_eq!(denied[0]["principal"], "owner");
        assert_eq!(denied[0]["via"], "mcp:owner");
    }
    // Bad arguments are the caller's error, not a call.
    let r = serde_json::to_value(
        server
            .call(
                &owner,
                "echo",
                args(json!({"args": "one"})),
                CancellationToken::new(),
            )
            .await,
    )
    .unwrap();
    assert_eq!(r["isError"], true);
    assert!(text(&r).starts_with("Invalid arguments for echo"), "{r}");
    let r = serde_json::to_value(
        server
            .call(&owner, "read", args(json!({})), CancellationToken::new())
            .await,
    )
    .unwrap();
    assert_eq!(r["isError"], true, "{r}");
}

#[tokio::test]
async fn at_most_eight_calls_of_a_principal_run_at_once_and_cancelling_ends_one() {
    let s = setup().await;
    let server = s.server();
    let owner = McpCaller::owner();
    let cancel = CancellationToken::new();
    let mut running = Vec::new();
    for _ in 0..MAX_CALLS_PER_PRINCIPAL {
        let (server, owner, cancel) = (server.clone(), owner.clone(), cancel.clone());
        running.push(tokio::spawn(async move {
            server
                .call(&owner, "wait", args(json!({"args": []})), cancel)
                .await
        }));
    }
    // Let them take their permits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ninth = serde_json::to_value(
        server
            .call(
                &owner,
                "echo",
                args(json!({"args": ["x"]})),
                CancellationToken::new(),
            )
            .await,
    )
    .unwrap();
    assert_eq!(ninth["isError"], true, "{ninth}");
    assert!(
        text(&ninth).starts_with("Too many calls at once"),
        "{ninth}"
    );
    cancel.cancel();
    for r in running {
        let r = tokio::time::timeout(Duration::from_secs(5), r)
            .await
            .expect("a cancelled call ends")
            .unwrap();
        let r = serde_json::to_value(r).unwrap();
        assert_eq!(r["isError"], true);
        assert!(text(&r).contains("Cancelled by the client"), "{r}");
    }
    // The permits are back.
    let r = serde_json::to_value(
        server
            .call(
                &owner,
                "echo",
                args(json!({"args": ["y"]})),
                CancellationToken::new(),
            )
            .await,
    )
    .unwrap();
    assert_eq!(r["isError"], false, "{r}");
}

fn post(path: &str, body: Value, session: Option<&str>) -> Request<Body> {
    let mut b = Request::builder()
        .method("POST")
        .uri(path)
        .header(header::HOST, "127.0.0.1:7433")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream");
    if let Some(id) = session {
        b = b
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-06-18");
    }
    b.body(Body::from(body.to_string())).unwrap()
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test-client", "version": "1.0"}}})
}

/// The JSON-RPC messages of an answer (JSON, or the `data:` lines of an SSE body).
async fn messages(response: axum::response::Response) -> Vec<Value> {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return vec![v];
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

#[tokio::test]
async fn the_http_endpoint_serves_the_agent_behind_the_api_checks() {
    let s = setup().await;
    let app = router(ApiState::new(
        Arc::new(s.gw.clone()) as Arc<dyn GatewayFull>,
        Some(TOKEN.to_string()),
    ));
    // No token: 401, like every route.
    let mut r = post("/mcp/agents/a", initialize(), None);
    r.headers_mut().remove(header::AUTHORIZATION);
    assert_eq!(
        app.clone().oneshot(r).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    // A browser Origin, foreign or the gateway's own: 403.
    for origin in ["https://evil.example", "http://127.0.0.1:7433"] {
        let mut r = post("/mcp/agents/a", initialize(), None);
        r.headers_mut()
            .insert(header::ORIGIN, origin.parse().unwrap());
        assert_eq!(
            app.clone().oneshot(r).await.unwrap().status(),
            StatusCode::FORBIDDEN,
            "{origin}"
        );
    }
    // An unknown agent: 404.
    let r = app
        .clone()
        .oneshot(post("/mcp/agents/nobody", initialize(), None))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    let r = app
        .clone()
        .oneshot(post("/mcp/agents/a", initialize(), None))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let init = messages(r).await;
    assert_eq!(init[0]["result"]["serverInfo"]["name"], "beige", "{init:?}");
    let r = app
        .clone()
        .oneshot(post(
            "/mcp/agents/a",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            Some(&session),
        ))
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = app
        .clone()
        .oneshot(post(
            "/mcp/agents/a",
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            Some(&session),
        ))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let listed = messages(r).await;
    let names: Vec<&str> = listed[0]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read", "write", "patch", "exec", "echo", "wait"]);
    let r = app
        .clone()
        .oneshot(post(
            "/mcp/agents/a",
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"args": ["over", "http"]}}}),
            Some(&session),
        ))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let called = messages(r).await;
    let result = called.iter().find(|m| m["id"] == 3).unwrap();
    assert_eq!(
        text(&result["result"]),
        "echo: over http [] session=mcp:a:owner channel=mcp"
    );
    let record = s
        .audit()
        .into_iter()
        .find(|r| r["tool"] == "echo" && r["phase"] == "finished")
        .unwrap();
    assert_eq!(record["principal"], "owner");
    assert_eq!(record["via"], "mcp:owner");
}

#[tokio::test]
async fn a_session_presented_with_another_token_is_not_found() {
    let s = setup().await;
    let gw = Arc::new(s.gw.clone()) as Arc<dyn GatewayFull>;
    let endpoint = McpEndpoint::new();
    let options = EndpointOptions {
        allowed_hosts: Some(vec!["127.0.0.1".into()]),
        body_limit: 1 << 20,
    };
    let owner = McpCaller::owner();
    // Another token (there is one today; users bring more): the same rights, its own
    // sessions.
    let other = McpCaller {
        principal: beige_core::Principal::ApiToken,
        token_id: "t2".into(),
    };
    let member = McpCaller {
        principal: beige_core::Principal::user("api", "ada"),
        token_id: "t3".into(),
    };
    let r = endpoint
        .handle(
            gw.clone(),
            "a",
            owner.clone(),
            &options,
            post("/mcp/agents/a", initialize(), None),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let list = || json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let r = endpoint
        .handle(
            gw.clone(),
            "a",
            other,
            &options,
            post("/mcp/agents/a", list(), Some(&session)),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // A principal without direct tool use is refused outright.
    let r = endpoint
        .handle(
            gw.clone(),
            "a",
            member,
            &options,
            post("/mcp/agents/a", initialize(), None),
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The owner's token still reaches its session.
    let r = endpoint
        .handle(
            gw.clone(),
            "a",
            owner,
            &options,
            post(
                "/mcp/agents/a",
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                Some(&session),
            ),
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
}
