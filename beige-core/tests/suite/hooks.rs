//! Hooks on the gateway's guarded path: order across plugins, deny, time limit (fail
//! closed), result rewrite — for plugin tools and core tools alike. Uses the labelled
//! `MemorySandbox`: these tests are about the gateway, not Docker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use beige_core::api::tools::{CoreToolCall, ToolContext};
use beige_core::hooks::*;
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway};
use beige_protocol::socket::ToolRequest;
use serde_json::json;

use beige_core::testing::MemorySandbox;

#[derive(Debug, Clone)]
enum Behaviour {
    Allow,
    Deny(&'static str),
    Sleep(Duration),
    Fail,
    Rewrite(&'static str),
}

#[derive(Debug)]
struct HookPlugin {
    name: &'static str,
    behaviour: Behaviour,
    log: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl HookHandler for HookPlugin {
    fn hooks(&self) -> Vec<HookName> {
        vec![
            HookName::PreToolExec,
            HookName::PostToolExec,
            HookName::PrePrompt,
            HookName::PostResponse,
        ]
    }
    fn timeout(&self) -> Duration {
        Duration::from_millis(300)
    }
    async fn pre_tool_exec(&self, e: &PreToolExecEvent) -> Result<PreToolExecResult, HookError> {
        self.log.lock().unwrap().push(format!(
            "{}:pre:{}:{}",
            self.name,
            e.tool_name,
            e.args.join(" ")
        ));
        match &self.behaviour {
            Behaviour::Deny(r) => Ok(PreToolExecResult {
                allow: false,
                reason: Some(r.to_string()),
            }),
            Behaviour::Sleep(d) => {
                tokio::time::sleep(*d).await;
                Ok(PreToolExecResult::allow())
            }
            Behaviour::Fail => Err(HookError("boom".into())),
            _ => Ok(PreToolExecResult::allow()),
        }
    }
    async fn post_tool_exec(&self, e: &PostToolExecEvent) -> Result<PostToolExecResult, HookError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:post:{}", self.name, e.result.output));
        match &self.behaviour {
            Behaviour::Rewrite(s) => Ok(PostToolExecResult {
                result: Some(ToolResult::ok(format!("{s} (was: {})", e.result.output))),
            }),
            Behaviour::Fail => Err(HookError("post boom".into())),
            _ => Ok(PostToolExecResult::default()),
        }
    }
    async fn pre_prompt(&self, e: &PrePromptEvent) -> Result<PrePromptResult, HookError> {
        match &self.behaviour {
            Behaviour::Rewrite(s) => Ok(PrePromptResult {
                message: Some(format!("{} {s}", e.message)),
                ..Default::default()
            }),
            Behaviour::Deny(r) => Ok(PrePromptResult {
                block: true,
                reason: Some(r.to_string()),
                ..Default::default()
            }),
            Behaviour::Fail => Err(HookError("broken".into())),
            Behaviour::Sleep(d) => {
                tokio::time::sleep(*d).await;
                Ok(PrePromptResult::default())
            }
            Behaviour::Allow => Ok(PrePromptResult::default()),
        }
    }
    async fn post_response(&self, e: &PostResponseEvent) -> Result<PostResponseResult, HookError> {
        match &self.behaviour {
            Behaviour::Rewrite(s) => Ok(PostResponseResult {
                response: Some(format!("{} {s}", e.response)),
                block: false,
            }),
            Behaviour::Deny(_) => Ok(PostResponseResult {
                response: None,
                block: true,
            }),
            Behaviour::Fail => Err(HookError("broken".into())),
            _ => Ok(PostResponseResult::default()),
        }
    }
}

#[derive(Debug)]
struct Echo;

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "echoes its arguments"
    }
    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok(call.args.join(" ")))
    }
}

#[derive(Debug)]
struct TestPlugin {
    name: &'static str,
    hook: Option<HookPlugin>,
}

#[async_trait]
impl Plugin for TestPlugin {
    fn name(&self) -> &str {
        self.name
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        if self.name == "echo" {
            reg.tool(Arc::new(Echo))?;
        }
        if let Some(h) = &self.hook {
            reg.hooks(Arc::new(HookPlugin {
                name: h.name,
                behaviour: h.behaviour.clone(),
                log: h.log.clone(),
            }));
        }
        Ok(())
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    home: BeigeHome,
    gw: LocalGateway,
    log: Arc<Mutex<Vec<String>>>,
}

async fn setup(first: Behaviour, second: Behaviour) -> Option<Setup> {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let log = Arc::new(Mutex::new(Vec::new()));
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-very-secret-key"}}},
        "plugins": {"first": {}, "echo": {}, "second": {}},
        "agents": {"a": {"model": {"provider": "anthropic", "model": "m"}, "tools": ["echo"]}}
    }))
    .unwrap();
    let hp = |name, behaviour| HookPlugin {
        name,
        behaviour,
        log: log.clone(),
    };
    // The file the read tests find.
    let sandbox = MemorySandbox::new();
    sandbox.write_file("a", "f", "fake");
    let gw = GatewayBuilder::new(config, home.clone())
        .sandbox(Arc::new(sandbox))
        // Registered out of order on purpose: config order decides.
        .plugin(Arc::new(TestPlugin {
            name: "second",
            hook: Some(hp("second", second)),
        }))
        .plugin(Arc::new(TestPlugin {
            name: "echo",
            hook: None,
        }))
        .plugin(Arc::new(TestPlugin {
            name: "first",
            hook: Some(hp("first", first)),
        }))
        .build()
        .await
        .unwrap();
    Some(Setup {
        _dir: dir,
        home,
        gw,
        log,
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

async fn echo(gw: &LocalGateway, args: &[&str]) -> beige_protocol::socket::ToolResponse {
    gw.handle_tool_request(
        "a",
        ToolRequest::new("echo", args.iter().map(|s| s.to_string()).collect()),
    )
    .await
}

#[tokio::test]
async fn tool_hooks_run_in_plugin_order_for_plugin_and_core_tools() {
    let Some(s) = setup(Behaviour::Allow, Behaviour::Allow).await else {
        return;
    };
    let r = echo(&s.gw, &["hi"]).await;
    assert_eq!(r.output.as_deref(), Some("hi"));
    let out =
        s.gw.call_tool(
            "a",
            CoreToolCall::parse("exec", json!({"command": "ls"})).unwrap(),
            ToolContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.joined_text(), "Exit code: 0\nfake: ls");
    let log = s.log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            "first:pre:echo:hi",
            "second:pre:echo:hi",
            "first:post:hi",
            "second:post:hi",
            "first:pre:exec:ls",
            "second:pre:exec:ls",
            "first:post:Exit code: 0\nfake: ls",
            "second:post:Exit code: 0\nfake: ls",
        ]
    );
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 4);
    assert_eq!(audit[2]["type"], "core_tool");
    assert_eq!(audit[2]["args"], json!(["ls"]));
}

#[tokio::test]
async fn a_deny_stops_the_call_with_its_reason() {
    let Some(s) = setup(Behaviour::Deny("no echo on Sundays"), Behaviour::Allow).await else {
        return;
    };
    let r = echo(&s.gw, &["hi"]).await;
    assert!(!r.success);
    assert_eq!(r.error.as_deref(), Some("no echo on Sundays"));
    let out =
        s.gw.call_tool(
            "a",
            CoreToolCall::parse("write", json!({"path": "x", "content": "y"})).unwrap(),
            ToolContext::default(),
        )
        .await
        .unwrap();
    assert!(out.is_error);
    assert_eq!(out.joined_text(), "no echo on Sundays");
    // The second hook never ran, the handler never ran, one denied record each.
    assert!(s
        .log
        .lock()
        .unwrap()
        .iter()
        .all(|l| l.starts_with("first:")));
    let audit = audit_lines(&s.home);
    assert_eq!(audit.len(), 2);
    assert!(audit
        .iter()
        .all(|r| r["decision"] == "denied" && r["phase"] == "finished"));
    assert_eq!(audit[0]["error"], "no echo on Sundays");
}

#[tokio::test]
async fn a_hook_past_its_time_limit_blocks() {
    let Some(s) = setup(Behaviour::Allow, Behaviour::Sleep(Duration::from_secs(5))).await else {
        return;
    };
    let started = std::time::Instant::now();
    let r = echo(&s.gw, &["hi"]).await;
    assert!(started.elapsed() < Duration::from_secs(4));
    let err = r.error.unwrap();
    assert!(
        err.contains("preToolExec hook of plugin 'second' did not answer within 300 ms"),
        "{err}"
    );
    assert!(err.contains("fail closed"), "{err}");
}

#[tokio::test]
async fn a_failing_pre_hook_blocks_and_a_failing_post_hook_is_skipped() {
    let Some(s) = setup(Behaviour::Fail, Behaviour::Allow).await else {
        return;
    };
    let r = echo(&s.gw, &["hi"]).await;
    assert!(r
        .error
        .unwrap()
        .contains("preToolExec hook of plugin 'first' failed: boom"));
}

#[tokio::test]
async fn post_tool_exec_rewrites_results() {
    let Some(s) = setup(Behaviour::Rewrite("one"), Behaviour::Rewrite("two")).await else {
        return;
    };
    let r = echo(&s.gw, &["hi"]).await;
    assert_eq!(r.output.as_deref(), Some("two (was: one (was: hi))"));
    let out =
        s.gw.call_tool(
            "a",
            CoreToolCall::parse("read", json!({"path": "f"})).unwrap(),
            ToolContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.joined_text(), "two (was: one (was: fake))");
    let audit = audit_lines(&s.home);
    assert_eq!(audit[1]["outputBytes"], "two (was: one (was: hi))".len());
}

fn runner(behaviours: Vec<Behaviour>) -> HookRunner {
    let log = Arc::new(Mutex::new(Vec::new()));
    HookRunner::new(
        behaviours
            .into_iter()
            .enumerate()
            .map(|(i, b)| beige_core::plugin::RegisteredHooks {
                plugin: format!("p{i}"),
                handler: Arc::new(HookPlugin {
                    name: "h",
                    behaviour: b,
                    log: log.clone(),
                }),
            })
            .collect(),
    )
}

fn prompt(message: &str) -> PrePromptEvent {
    PrePromptEvent {
        message: message.into(),
        session_key: "k".into(),
        agent_name: "a".into(),
        channel: "api".into(),
    }
}

#[tokio::test]
async fn pre_prompt_chains_rewrites_and_first_block_wins() {
    let r = runner(vec![Behaviour::Rewrite("[1]"), Behaviour::Rewrite("[2]")]);
    assert_eq!(
        r.pre_prompt(prompt("hi")).await,
        PromptDecision::Continue("hi [1] [2]".into())
    );
    let r = runner(vec![
        Behaviour::Rewrite("[1]"),
        Behaviour::Deny("off topic"),
        Behaviour::Fail,
    ]);
    assert_eq!(
        r.pre_prompt(prompt("hi")).await,
        PromptDecision::Blocked("off topic".into())
    );
    let r = runner(vec![Behaviour::Allow, Behaviour::Fail]);
    match r.pre_prompt(prompt("hi")).await {
        PromptDecision::Blocked(reason) => assert!(
            reason.contains("plugin 'p1'") && reason.contains("fail closed"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    let r = runner(vec![Behaviour::Sleep(Duration::from_secs(3))]);
    assert!(matches!(
        r.pre_prompt(prompt("hi")).await,
        PromptDecision::Blocked(_)
    ));
}

#[tokio::test]
async fn post_response_chains_skips_failures_and_blocks() {
    let ev = |s: &str| PostResponseEvent {
        response: s.into(),
        session_key: "k".into(),
        agent_name: "a".into(),
        channel: "api".into(),
    };
    let r = runner(vec![
        Behaviour::Rewrite("[1]"),
        Behaviour::Fail,
        Behaviour::Rewrite("[2]"),
    ]);
    assert_eq!(
        r.post_response(ev("answer")).await,
        ResponseDecision::Continue("answer [1] [2]".into())
    );
    let r = runner(vec![Behaviour::Deny("x"), Behaviour::Rewrite("[2]")]);
    assert_eq!(
        r.post_response(ev("answer")).await,
        ResponseDecision::Blocked
    );
}
