//! Run with `cargo run -p beige-examples --example custom_sandbox` (no Docker, no
//! network, no API key).
//!
//! A sandbox backend of your own: `VirtualSandbox` keeps each agent's files in memory
//! and understands three commands — `echo`, `cat` and `ls` — plus `tool <name> <args…>`,
//! which calls a plugin tool through the [`SandboxHost`] the gateway hands to
//! `reconcile`, the way a real backend's tool endpoint does. It never starts a host
//! process: a backend that ran `sh -c` on the host would break beige's first promise
//! (an agent never gets the host), and examples get copied.
//!
//! The gateway drives it with a **scripted model** (`ScriptedProvider`, clearly not a real
//! model): write a file, `cat` it, and call the `kv` plugin from inside the sandbox.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_core::config::Config;
use beige_core::ident::Attribution;
use beige_core::sandbox::op::{
    ExecReply, OpError, OpErrorKind, OpReply, OpRequest, PatchReply, ReadReply, WriteReply,
};
use beige_core::sandbox::{
    OpOutcome, ReconcileReport, Sandbox, SandboxError, SandboxHost, SandboxSpec, ToolRequest,
    Transport,
};
use beige_core::testing::{MemoryStore, ScriptedProvider};
use beige_core::AgentEvent;
use beige_core::{BeigeHome, Gateway, GatewayBuilder, PromptRequest};
use serde_json::json;

/// The state of one agent's virtual sandbox.
#[derive(Debug, Default)]
struct Agent {
    /// Path under `/workspace` → contents.
    files: BTreeMap<String, String>,
}

/// An in-memory sandbox backend (see the module docs).
#[derive(Default)]
struct VirtualSandbox {
    agents: Mutex<HashMap<String, Agent>>,
    host: Mutex<Option<Arc<dyn SandboxHost>>>,
}

impl std::fmt::Debug for VirtualSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualSandbox").finish_non_exhaustive()
    }
}

impl VirtualSandbox {
    fn with_agent<T>(&self, agent: &str, f: impl FnOnce(&mut Agent) -> T) -> Option<T> {
        let mut agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        agents.get_mut(agent).map(f)
    }

    /// `echo`, `cat`, `ls` and `tool`: (stdout, exit code).
    async fn exec(&self, agent: &str, command: &str) -> (String, i32) {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["echo", rest @ ..] => (format!("{}\n", rest.join(" ")), 0),
            ["cat", path] => self
                .with_agent(agent, |a| a.files.get(&key(path)).cloned())
                .flatten()
                .map_or_else(|| (format!("cat: {path}: no such file\n"), 1), |t| (t, 0)),
            ["ls"] => {
                let names = self.with_agent(agent, |a| a.files.keys().cloned().collect::<Vec<_>>());
                (names.unwrap_or_default().join("\n") + "\n", 0)
            }
            ["tool", name, args @ ..] => {
                let host = self.host.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let Some(host) = host else {
                    return ("tool: no gateway serves this sandbox\n".into(), 1);
                };
                // The agent is the sandbox's own: a request never names its caller. This
                // backend cannot tell which exec a call comes from, so it is unbound.
                let request = ToolRequest::new(*name, args.iter().map(|a| a.to_string()).collect());
                let response = host
                    .tool_call(agent, &Attribution::unbound(), request)
                    .await;
                let text = response.output.or(response.error).unwrap_or_default();
                (text, response.exit_code)
            }
            _ => (
                format!("virtual sandbox: unknown command: {command}\n"),
                127,
            ),
        }
    }
}

/// Files are kept by their path under `/workspace`.
fn key(path: &str) -> String {
    path.trim_start_matches("/workspace/")
        .trim_start_matches("./")
        .to_string()
}

fn not_found(path: &str) -> OpReply {
    OpReply::Error(OpError {
        kind: OpErrorKind::NotFound,
        message: format!("{path}: no such file"),
    })
}

#[async_trait]
impl Sandbox for VirtualSandbox {
    async fn reconcile(
        &self,
        specs: Vec<SandboxSpec>,
        host: Arc<dyn SandboxHost>,
    ) -> Result<ReconcileReport, SandboxError> {
        let mut agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        let mut report = ReconcileReport::default();
        for spec in &specs {
            if !agents.contains_key(&spec.agent) {
                agents.insert(spec.agent.clone(), Agent::default());
                report.created.push(spec.agent.clone());
            } else {
                report.reattached.push(spec.agent.clone());
            }
        }
        agents.retain(|name, _| specs.iter().any(|s| &s.agent == name));
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = Some(host);
        Ok(report)
    }

    async fn run_op(&self, agent: &str, request: &OpRequest) -> Result<OpOutcome, SandboxError> {
        let reply = match request {
            OpRequest::Exec(e) => {
                let (stdout, code) = self.exec(agent, &e.command).await;
                OpReply::Exec(ExecReply {
                    exit_code: Some(code),
                    signal: None,
                    stdout,
                    stderr: String::new(),
                    stdout_omitted: 0,
                    stderr_omitted: 0,
                    timed_out: false,
                    duration_ms: 0,
                    survivors: Vec::new(),
                    output_file: None,
                })
            }
            OpRequest::Write(w) => {
                let bytes = w.content.len() as u64;
                self.with_agent(agent, |a| a.files.insert(key(&w.path), w.content.clone()));
                OpReply::Write(WriteReply { bytes })
            }
            OpRequest::Read(r) => {
                match self.with_agent(agent, |a| a.files.get(&key(&r.path)).cloned()) {
                    Some(Some(content)) => {
                        let lines = content.lines().count() as u64;
                        OpReply::Read(ReadReply::Text {
                            content,
                            total_lines: lines,
                            first_line: 1,
                            last_line: lines,
                            truncated: false,
                        })
                    }
                    _ => not_found(&r.path),
                }
            }
            OpRequest::Patch(p) => {
                let patched = self.with_agent(agent, |a| {
                    let text = a.files.get_mut(&key(&p.path))?;
                    (text.matches(&p.old_text).count() == 1).then(|| {
                        *text = text.replacen(&p.old_text, &p.new_text, 1);
                        text.len() as u64
                    })
                });
                match patched.flatten() {
                    Some(bytes) => OpReply::Patch(PatchReply { bytes }),
                    None => not_found(&p.path),
                }
            }
            other => OpReply::Error(OpError {
                kind: OpErrorKind::BadRequest,
                message: format!("the virtual sandbox has no `{}`", other.name()),
            }),
        };
        Ok(OpOutcome {
            reply,
            restarted: None,
            transport: Transport::DIRECT,
        })
    }

    async fn remove_all(&self) -> Result<(), SandboxError> {
        self.agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        *self.host.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config: Config = serde_json::from_value(json!({
        "llm": {"providers": {"scripted": {}}},
        "plugins": {"kv": {}},
        "agents": {"assistant": {
            "model": {"provider": "scripted", "model": "demo"},
            "tools": ["kv"],
        }},
    }))?;
    let model = ScriptedProvider::new("scripted")
        .then_tool(
            "t1",
            "write",
            json!({"path": "notes/hello.txt", "content": "hello from a virtual sandbox\n"}),
        )
        .then_tool("t2", "exec", json!({"command": "cat notes/hello.txt"}))
        .then_tool("t3", "exec", json!({"command": "tool kv set greeting hi"}))
        .then_tool("t4", "exec", json!({"command": "tool kv get greeting"}))
        .then_text("[scripted model] done");
    let sandbox = Arc::new(VirtualSandbox::default());
    let gateway = GatewayBuilder::new(config, BeigeHome::new(dir.path()))
        .provider(Arc::new(model))
        .sandbox(sandbox.clone())
        .store(Arc::new(MemoryStore::new()))
        .build()
        .await?;

    let events = gateway
        .prompt(PromptRequest::new(
            "assistant",
            "api:assistant:default",
            "show me",
        ))
        .await?
        .collect_all()
        .await;
    let mut outputs = Vec::new();
    for event in &events {
        if let AgentEvent::ToolCallFinished { name, output, .. } = event {
            println!("{name}: {}", output.trim_end());
            outputs.push(output.clone());
        }
    }
    assert!(outputs
        .iter()
        .any(|o| o.contains("hello from a virtual sandbox")));
    assert!(
        outputs.last().is_some_and(|o| o.contains("hi")),
        "{outputs:?}"
    );
    assert!(matches!(events.last(), Some(AgentEvent::Done { .. })));
    gateway.shutdown().await?;
    println!("the custom sandbox served one prompt with no Docker and no host process");
    Ok(())
}
