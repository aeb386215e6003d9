//! The Policy seam on the gateway's guarded path: `Ask` without and with an approver,
//! the principal a policy sees (the sandbox's socket calls, a model's calls inheriting
//! their prompt's), and `exposes` deciding the launchers and the system prompt. Uses the
//! labelled `MemorySandbox`: these tests are about the gateway, not Docker.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_core::api::tools::{CoreToolCall, ToolContext};
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::policy::{Approver, Decision, Policy, PolicyRequest, Principal, ToolKind};
use beige_core::AgentEvent;
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway, PromptRequest};
use beige_protocol::socket::{ToolRequest, ToolResponse};
use beige_testkit::anthropic::{tool_use_response, MessageStream};
use beige_testkit::llm::FakeLlmServer;
use serde_json::json;

use beige_core::testing::MemorySandbox;

const KEY: &str = "sk-ant-test-key-0123456789";

/// A plugin tool that answers with its name and arguments.
#[derive(Debug)]
struct Named(&'static str);

#[async_trait]
impl Tool for Named {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        if self.0 == "secret" {
            "reads the vault of secrets"
        } else {
            "echoes its arguments"
        }
    }
    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok(format!(
            "{}: {}",
            self.0,
            call.args.join(" ")
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
        reg.tool(Arc::new(Named(self.0)))?;
        Ok(())
    }
}

/// What a policy saw of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    tool: String,
    kind: ToolKind,
    principal: Principal,
    session: Option<String>,
    channel: Option<String>,
    model: Option<String>,
}

impl Seen {
    fn of(r: &PolicyRequest<'_>) -> Self {
        Seen {
            tool: r.tool.to_string(),
            kind: r.kind,
            principal: r.principal.clone(),
            session: r.session.map(str::to_string),
            channel: r.channel.map(str::to_string),
            model: r.model.map(str::to_string),
        }
    }
}

/// Asks about `ask`, hides `hide`, allows the rest; records every call it decides.
#[derive(Debug, Default)]
struct Recording {
    ask: Option<&'static str>,
    hide: Option<&'static str>,
    seen: Mutex<Vec<Seen>>,
}

#[async_trait]
impl Policy for Recording {
    async fn check(&self, r: &PolicyRequest<'_>) -> Decision {
        self.seen.lock().unwrap().push(Seen::of(r));
        if Some(r.tool) == self.ask {
            Decision::ask(format!("'{}' talks to the world", r.tool))
        } else {
            Decision::allow("test policy")
        }
    }
    async fn exposes(&self, _agent: &str, tool: &str) -> bool {
        Some(tool) != self.hide
    }
}

/// Answers every question with `answer`, recording what it was asked.
#[derive(Debug)]
struct Fixed {
    answer: Decision,
    asked: Mutex<Vec<(Seen, String)>>,
}

#[async_trait]
impl Approver for Fixed {
    async fn approve(&self, r: &PolicyRequest<'_>, reason: &str) -> Decision {
        self.asked
            .lock()
            .unwrap()
            .push((Seen::of(r), reason.to_string()));
        self.answer.clone()
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    home: BeigeHome,
    gw: LocalGateway,
    sandbox: Arc<MemorySandbox>,
}

async fn setup(
    policy: Arc<Recording>,
    approver: Option<Arc<Fixed>>,
    llm: Option<&FakeLlmServer>,
) -> Option<Setup> {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let mut anthropic = json!({"apiKey": KEY});
    if let Some(s) = llm {
        anthropic["baseUrl"] = json!(s.url());
    }
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": anthropic}},
        "plugins": {"echo": {}, "secret": {}},
        "agents": {"a": {
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": ["echo", "secret"]
        }}
    }))
    .unwrap();
    let sandbox = Arc::new(MemorySandbox::new());
    let mut b = GatewayBuilder::new(config, home.clone())
        .sandbox(sandbox.clone())
        .plugin(Arc::new(OneTool("echo")))
        .plugin(Arc::new(OneTool("secret")))
        .policy(policy);
    if let Some(a) = approver {
        b = b.approver(a);
    }
    let gw = b.build().await.unwrap();
    Some(Setup {
        _dir: dir,
        home,
        gw,
        sandbox,
    })
}

fn audit_lines(home: &BeigeHome) -> Vec<serde_json::Value> {
    std::fs::read_to_string(home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| !beige_core::audit::chain::is_chain_record(v))
        .collect()
}

async fn socket(gw: &LocalGateway, tool: &str, args: &[&str]) -> ToolResponse {
    gw.handle_tool_request(
        "a",
        ToolRequest::new(tool, args.iter().map(|s| s.to_string()).collect()),
    )
    .await
}

#[tokio::test]
async fn policy_ask_in_an_unattended_run_is_refused_at_once_and_audited_denied() {
    let policy = Arc::new(Recording {
        ask: Some("echo"),
        ..Default::default()
    });
    let Some(s) = setup(policy.clone(), None, None).await else {
        return;
    };
    let r = socket(&s.gw, "echo", &["hi"]).await;
    assert!(!r.success);
    // No prompt attends the script's session: the ask is a denial, at once.
    let expected = "Permission denied: 'echo hi' needs approval, but this run is unattended (a script in session 'socket:a' with no attended prompt running), so it was denied without waiting; the agent's owner was told. 'echo' talks to the world";
    assert_eq!(r.error.as_deref(), Some(expected));
    // Two records: the unattended denial reported, and the call refused, never started.
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 2, "{audit:#?}");
    assert_eq!(audit[0]["type"], "approval");
    assert_eq!(audit[0]["approval"]["phase"], "unattended");
    assert_eq!(audit[1]["decision"], "denied");
    assert_eq!(audit[1]["phase"], "finished");
    assert_eq!(audit[1]["tool"], "echo");
    assert_eq!(audit[1]["error"], expected);
    // A tool the policy allows still runs.
    let r = socket(&s.gw, "secret", &["x"]).await;
    assert_eq!(r.output.as_deref(), Some("secret: x"));
}

#[tokio::test]
async fn policy_ask_goes_to_the_approver_whose_answer_is_final() {
    let policy = Arc::new(Recording {
        ask: Some("echo"),
        ..Default::default()
    });
    let yes = Arc::new(Fixed {
        answer: Decision::allow("the owner said yes"),
        asked: Mutex::new(Vec::new()),
    });
    let Some(s) = setup(policy.clone(), Some(yes.clone()), None).await else {
        return;
    };
    let r = socket(&s.gw, "echo", &["hi"]).await;
    assert_eq!(r.output.as_deref(), Some("echo: hi"), "{r:?}");
    let asked = yes.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].0.tool, "echo");
    assert_eq!(asked[0].0.principal, Principal::Sandbox);
    assert_eq!(asked[0].1, "'echo' talks to the world");
    // Allowed by the approver: started and finished, like any allowed call.
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 2, "{audit:#?}");
    assert!(audit.iter().all(|r| r["decision"] == "allowed"));
    assert_eq!(audit[0]["phase"], "started");

    // An approver saying no refuses the call with its own reason.
    let no = Arc::new(Fixed {
        answer: Decision::deny("the owner said no"),
        asked: Mutex::new(Vec::new()),
    });
    let policy = Arc::new(Recording {
        ask: Some("echo"),
        ..Default::default()
    });
    let Some(s) = setup(policy, Some(no.clone()), None).await else {
        return;
    };
    let r = socket(&s.gw, "echo", &["hi"]).await;
    assert_eq!(r.error.as_deref(), Some("the owner said no"));
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["decision"], "denied");
    assert_eq!(audit[0]["error"], "the owner said no");
}

#[tokio::test]
async fn policy_sees_the_sandbox_on_the_socket_and_the_prompts_principal_for_the_model() {
    let server = FakeLlmServer::start().await;
    server.push(tool_use_response(&[(
        "tu_1",
        "exec",
        json!({"command": "echo hi"}),
    )]));
    server.push(MessageStream::new().text("done").reply());
    let policy = Arc::new(Recording::default());
    let Some(s) = setup(policy.clone(), None, Some(&server)).await else {
        return;
    };

    // A script in the sandbox, over the tool socket.
    let r = socket(&s.gw, "echo", &["hi"]).await;
    assert_eq!(r.output.as_deref(), Some("echo: hi"));

    // A model's call, in a prompt a Telegram user sent.
    let mut request = PromptRequest::new("a", "telegram:42", "run it");
    request.principal = Principal::user("telegram", "7");
    let events = s.gw.prompt(request).await.unwrap().collect_all().await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::Done { response, .. } if response == "done")),
        "{events:#?}"
    );

    // An in-process call that names no principal.
    let out =
        s.gw.call_tool(
            "a",
            CoreToolCall::parse("exec", json!({"command": "ls"})).unwrap(),
            ToolContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.joined_text(), "Exit code: 0\nfake: ls");

    let seen = policy.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            Seen {
                tool: "echo".into(),
                kind: ToolKind::Plugin,
                principal: Principal::Sandbox,
                session: Some("socket:a".into()),
                channel: Some("socket".into()),
                model: None,
            },
            Seen {
                tool: "exec".into(),
                kind: ToolKind::Core,
                principal: Principal::User {
                    channel: "telegram".into(),
                    id: "7".into()
                },
                session: Some("telegram:42".into()),
                channel: Some("telegram".into()),
                model: Some("anthropic/claude-sonnet-4-6".into()),
            },
            Seen {
                tool: "exec".into(),
                kind: ToolKind::Core,
                principal: Principal::Unverified,
                session: None,
                channel: None,
                model: None,
            },
        ]
    );
}

#[tokio::test]
async fn policy_exposes_decides_the_launchers_and_the_prompts_tools() {
    let server = FakeLlmServer::start().await;
    server.push(MessageStream::new().text("hello").reply());
    let policy = Arc::new(Recording {
        hide: Some("secret"),
        ..Default::default()
    });
    let Some(s) = setup(policy.clone(), None, Some(&server)).await else {
        return;
    };
    // The tools the sandbox gets a launcher for (`/tools/bin/<tool>`).
    let mut launchers = s.gw.specs()[0].tools.clone();
    launchers.sort();
    assert_eq!(launchers, ["echo"]);

    let agents = s.gw.agents().await.unwrap();
    assert!(
        agents[0].tool_context.contains("### echo"),
        "{}",
        agents[0].tool_context
    );
    assert!(
        !agents[0].tool_context.contains("secret"),
        "{}",
        agents[0].tool_context
    );

    let events =
        s.gw.prompt(PromptRequest::new("a", "api:a:default", "hi"))
            .await
            .unwrap()
            .collect_all()
            .await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::Done { response, .. } if response == "hello")),
        "{events:#?}"
    );
    let system = server.requests()[0].body["system"].to_string();
    assert!(system.contains("echoes its arguments"), "{system}");
    assert!(!system.contains("vault of secrets"), "{system}");
    // Visibility is not permission: `exposes` alone decided, `check` saw no call.
    assert!(policy.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn policy_sees_the_api_token_for_http_calls_whatever_the_body_says() {
    use axum::body::Body;
    use axum::http::{header, Request, StatusCode};
    use beige_core::channel::http::{router, ApiState};
    use tower::ServiceExt;

    const TOKEN: &str = "test-token-0123456789abcdef";
    let server = FakeLlmServer::start().await;
    server.push(tool_use_response(&[(
        "tu_1",
        "exec",
        json!({"command": "echo hi"}),
    )]));
    server.push(MessageStream::new().text("done").reply());
    let policy = Arc::new(Recording::default());
    let Some(s) = setup(policy.clone(), None, Some(&server)).await else {
        return;
    };
    let app = router(ApiState::new(Arc::new(s.gw.clone()), Some(TOKEN.into())));
    let post = |path: &str, body: serde_json::Value| {
        Request::builder()
            .method("POST")
            .uri(path)
            .header(header::HOST, "localhost:7433")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    // A body naming a principal is not believed: the principal is the connection's.
    let forged = json!({"kind": "embedder"});
    let r = app
        .clone()
        .oneshot(post(
            "/api/agents/a/exec",
            json!({"tool": "exec", "params": {"command": "ls"}, "principal": forged}),
        ))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = app
        .oneshot(post(
            "/api/agents/a/prompt",
            json!({"message": "run it", "principal": forged}),
        ))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let seen = policy.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert!(
        seen.iter().all(|s| s.principal == Principal::ApiToken),
        "{seen:#?}"
    );
    assert_eq!(seen[1].session.as_deref(), Some("api:a:default"));
}

/// A plugin tool called from inside the sandbox reaches the gateway through the
/// `SandboxHost` the backend was reconciled with — here the memory sandbox, replaying
/// the call as a tool endpoint would — and takes the guarded path: the policy sees the
/// sandbox as the principal, the audit log gets the call, refusals and the sandbox's
/// security events. No Docker, no shim.
#[tokio::test]
async fn a_plugin_call_through_the_sandbox_host_meets_policy_and_audit() {
    use beige_core::sandbox::SecurityEvent;
    let policy = Arc::new(Recording {
        ask: Some("echo"),
        ..Default::default()
    });
    let s = setup(policy.clone(), None, None).await.unwrap();
    let call = |tool: &str, args: &[&str]| {
        ToolRequest::new(tool, args.iter().map(|a| a.to_string()).collect())
    };

    // Allowed: runs, with the sandbox as the principal, started and finished.
    let r = s.sandbox.call_tool("a", call("secret", &["x"])).await;
    assert_eq!(r.output.as_deref(), Some("secret: x"), "{r:?}");
    let seen = policy.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (seen.tool.as_str(), seen.kind, seen.principal),
        ("secret", ToolKind::Plugin, Principal::Sandbox)
    );
    assert_eq!(seen.session.as_deref(), Some("socket:a"));
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 2, "{audit:#?}");
    assert_eq!(
        (audit[0]["phase"].as_str(), audit[1]["phase"].as_str()),
        (Some("started"), Some("finished"))
    );
    assert!(audit
        .iter()
        .all(|r| r["decision"] == "allowed" && r["tool"] == "secret"));

    // Asked in an unattended run: reported, refused and audited denied.
    let r = s.sandbox.call_tool("a", call("echo", &["hi"])).await;
    assert!(!r.success);
    assert!(
        r.error.as_deref().unwrap_or("").contains("needs approval"),
        "{r:?}"
    );
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 4, "{audit:#?}");
    assert_eq!(audit[2]["approval"]["phase"], "unattended");
    assert_eq!(audit[3]["decision"], "denied");
    assert_eq!(audit[3]["tool"], "echo");

    // A request the endpoint could not parse: denied, attributed to the agent.
    s.sandbox
        .reject("a", None, "Invalid request: not JSON", b"{oops")
        .await;
    // A bound the endpoint reached: a security record.
    s.sandbox
        .report(SecurityEvent::ToolEndpointLimit {
            agent: "a".into(),
            limit: "connections".into(),
            message: "too many connections".into(),
        })
        .await;
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 6, "{audit:#?}");
    assert_eq!(audit[4]["decision"], "denied");
    assert_eq!(audit[4]["tool"], "(unparsed)");
    assert_eq!(audit[4]["agent"], "a");
    assert_eq!(audit[4]["error"], "Invalid request: not JSON");
    assert_eq!(audit[5]["tool"], "security.socket_limit");
    assert_eq!(audit[5]["args"], json!(["limit=connections"]));

    // No sandbox for another agent: nothing reaches the gateway.
    let r = s.sandbox.call_tool("b", call("secret", &["x"])).await;
    assert!(!r.success);
    assert_eq!(audit_lines(&s.home).len(), 6);

    // Once the gateway stops, the sandbox is no longer served.
    s.gw.shutdown().await.unwrap();
    let r = s.sandbox.call_tool("a", call("secret", &["x"])).await;
    assert!(!r.success, "{r:?}");
    assert_eq!(audit_lines(&s.home).len(), 6);
}

/// A memory sandbox whose `exec` of `boom` cannot be carried out (the backend's error,
/// as when the sandbox does not answer in time), for a run failure on the guarded path.
#[derive(Debug)]
struct Unreachable(Arc<MemorySandbox>);

#[async_trait]
impl beige_core::sandbox::Sandbox for Unreachable {
    async fn reconcile(
        &self,
        specs: Vec<beige_core::sandbox::SandboxSpec>,
        host: Arc<dyn beige_core::sandbox::SandboxHost>,
    ) -> Result<beige_core::sandbox::ReconcileReport, beige_core::sandbox::SandboxError> {
        self.0.reconcile(specs, host).await
    }
    async fn run_op(
        &self,
        agent: &str,
        request: &beige_core::sandbox::op::OpRequest,
    ) -> Result<beige_core::sandbox::OpOutcome, beige_core::sandbox::SandboxError> {
        match request {
            beige_core::sandbox::op::OpRequest::Exec(e) if e.command == "boom" => {
                Err(beige_core::sandbox::SandboxError::Timeout {
                    agent: agent.to_string(),
                    op: "exec".into(),
                    secs: 5,
                })
            }
            _ => self.0.run_op(agent, request).await,
        }
    }
    async fn remove_all(&self) -> Result<(), beige_core::sandbox::SandboxError> {
        self.0.remove_all().await
    }
}

/// A plugin tool whose handler fails (an `Err`, not a result with an exit code).
#[derive(Debug)]
struct Broken;

#[async_trait]
impl Tool for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn description(&self) -> &str {
        "always fails"
    }
    async fn call(&self, _call: ToolCall) -> Result<ToolResult, ToolError> {
        Err(ToolError::Failed("the backend is down".into()))
    }
}

#[derive(Debug)]
struct BrokenPlugin;

#[async_trait]
impl Plugin for BrokenPlugin {
    fn name(&self) -> &str {
        "broken"
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(Broken))?;
        Ok(())
    }
}

/// The guarded path tells a refusal from a failure: `ToolOutput::outcome` says `Ran`,
/// `Denied` or `Failed`, while the text the model and HTTP clients see is unchanged
/// (an error result with the reason). On the socket both are error responses; the
/// audit log tells them apart (`denied`, or `allowed` and finished with an error).
#[tokio::test]
async fn the_guarded_path_tells_denied_from_failed() {
    use beige_core::api::tools::ToolOutcome;

    /// Refuses `write` and `echo`, allows the rest.
    #[derive(Debug)]
    struct NoWrites;
    #[async_trait]
    impl Policy for NoWrites {
        async fn check(&self, r: &PolicyRequest<'_>) -> Decision {
            if r.tool == "write" || r.tool == "echo" {
                Decision::deny(format!("no {} here", r.tool))
            } else {
                Decision::allow("test policy")
            }
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": KEY}}},
        "plugins": {"echo": {}, "broken": {}},
        "agents": {"a": {
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": ["echo", "broken"]
        }}
    }))
    .unwrap();
    let memory = Arc::new(MemorySandbox::new());
    let sandbox = Arc::new(Unreachable(memory.clone()));
    let gw = GatewayBuilder::new(config, home.clone())
        .sandbox(sandbox)
        .plugin(Arc::new(OneTool("echo")))
        .plugin(Arc::new(BrokenPlugin))
        .policy(Arc::new(NoWrites))
        .build()
        .await
        .unwrap();
    let core = |tool: &str, params: serde_json::Value| {
        let gw = gw.clone();
        let call = CoreToolCall::parse(tool, params).unwrap();
        async move {
            gw.call_tool("a", call, ToolContext::default())
                .await
                .unwrap()
        }
    };

    // Ran: also when the result is an error (a non-zero exit, a missing file).
    let out = core("exec", json!({"command": "ls"})).await;
    assert_eq!(out.outcome(), ToolOutcome::Ran);
    assert!(!out.is_error);
    let out = core("read", json!({"path": "missing.txt"})).await;
    assert_eq!(out.outcome(), ToolOutcome::Ran);
    assert!(out.is_error, "{out:?}");

    // Denied by the policy: the reason as an error result.
    let out = core("write", json!({"path": "x", "content": "y"})).await;
    assert_eq!(out.outcome(), ToolOutcome::Denied);
    assert!(out.is_error);
    assert_eq!(out.joined_text(), "no write here");
    assert!(memory.file("a", "x").is_none());

    // Failed: allowed, but the sandbox could not run it; the error text as before.
    let out = core("exec", json!({"command": "boom"})).await;
    assert_eq!(out.outcome(), ToolOutcome::Failed);
    assert!(out.is_error);
    assert_eq!(
        out.joined_text(),
        "`exec` in the sandbox of agent 'a' did not finish within 5 s"
    );
    // The JSON is today's: the outcome is not part of it.
    assert_eq!(
        serde_json::to_value(&out).unwrap(),
        json!({"content": [{"type": "text", "text": "`exec` in the sandbox of agent 'a' did not finish within 5 s"}], "isError": true})
    );

    let audit = audit_lines(&home);
    let of = |tool: &str| {
        audit
            .iter()
            .filter(|r| r["tool"] == tool && r["phase"] == "finished")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(of("write")[0]["decision"], "denied");
    let boom = of("exec")
        .into_iter()
        .find(|r| r["args"] == json!(["boom"]))
        .unwrap();
    assert_eq!(boom["decision"], "allowed");
    assert_eq!(
        boom["error"],
        "`exec` in the sandbox of agent 'a' did not finish within 5 s"
    );

    // The socket: a refused and a failing plugin tool are both error responses, the
    // audit log says which.
    let r = socket(&gw, "echo", &["hi"]).await;
    assert_eq!(r.error.as_deref(), Some("no echo here"));
    let r = socket(&gw, "broken", &[]).await;
    assert!(!r.success);
    assert_eq!(
        r.error.as_deref(),
        Some("tool 'broken' failed: the backend is down")
    );
    let audit = audit_lines(&home);
    let last = |tool: &str| {
        audit
            .iter()
            .rev()
            .find(|r| r["tool"] == tool)
            .cloned()
            .unwrap()
    };
    assert_eq!(last("echo")["decision"], "denied");
    let broken = last("broken");
    assert_eq!(
        (broken["decision"].as_str(), broken["phase"].as_str()),
        (Some("allowed"), Some("finished"))
    );
    assert_eq!(broken["error"], "tool 'broken' failed: the backend is down");
}
