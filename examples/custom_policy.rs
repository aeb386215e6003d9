//! Run with `cargo run -p beige-examples --example custom_policy` (no Docker, no
//! network, no API key).
//!
//! A policy of your own on top of the config's: a [`PolicyStack`] over [`ConfigPolicy`]
//! (the `tools` allow-lists of `config.json5`) and `HouseRules`, which
//!
//! - denies `exec` of `git push` when the call comes from a Telegram session, and
//! - asks before a `write` outside `notes/`.
//!
//! The stack resolves deny > ask > allow. An `Ask` goes to the gateway's [`Approver`];
//! this one (`NobodyHome`) refuses every request, as an unattended gateway should. The
//! gateway runs on the in-memory stand-ins of `beige_core::testing` and a **scripted
//! model** (`ScriptedProvider`, clearly not a real model) that makes the calls; the
//! audit records show what was allowed and denied, and why.

use std::sync::Arc;

use async_trait::async_trait;
use beige_core::config::Config;
use beige_core::policy::{
    Approver, ConfigPolicy, Decision, Policy, PolicyRequest, PolicyStack, ToolKind,
};
use beige_core::testing::{MemoryAudit, MemorySandbox, MemoryStore, ScriptedProvider};
use beige_core::AgentEvent;
use beige_core::{BeigeHome, Gateway, GatewayBuilder, PromptRequest};
use serde_json::json;

/// The house rules (see the module docs).
#[derive(Debug)]
struct HouseRules;

#[async_trait]
impl Policy for HouseRules {
    async fn check(&self, r: &PolicyRequest<'_>) -> Decision {
        let first = r.args.first().map(String::as_str).unwrap_or("");
        match (r.kind, r.tool) {
            (ToolKind::Core, "exec")
                if r.channel == Some("telegram") && first.trim_start().starts_with("git push") =>
            {
                Decision::deny("house rule: no `git push` from Telegram; push from the terminal")
            }
            (ToolKind::Core, "write") if !first.starts_with("notes/") => Decision::ask(format!(
                "house rule: writing {first} (outside notes/) needs an OK"
            )),
            _ => Decision::allow("house rules: nothing against it"),
        }
    }
}

/// An approver for a gateway nobody watches: every question is answered no.
#[derive(Debug)]
struct NobodyHome;

#[async_trait]
impl Approver for NobodyHome {
    async fn approve(&self, request: &PolicyRequest<'_>, reason: &str) -> Decision {
        Decision::deny(format!(
            "nobody is there to approve `{}` ({reason})",
            request.tool
        ))
    }
}

/// What one prompt's tool calls answered: (tool, is_error, output).
async fn run(
    gateway: &beige_core::LocalGateway,
    session_key: &str,
) -> anyhow::Result<Vec<(String, bool, String)>> {
    let events = gateway
        .prompt(PromptRequest::new("assistant", session_key, "tidy up"))
        .await?
        .collect_all()
        .await;
    Ok(events
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallFinished {
                name,
                output,
                is_error,
                ..
            } => Some((name, is_error, output)),
            _ => None,
        })
        .collect())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config: Config = serde_json::from_value(json!({
        "llm": {"providers": {"scripted": {}}},
        "agents": {"assistant": {"model": {"provider": "scripted", "model": "demo"}, "tools": []}},
    }))?;
    // Two prompts, the same three calls each: one from Telegram, one from the API.
    let mut model = ScriptedProvider::new("scripted");
    for _ in 0..2 {
        model = model
            .then_tool("t1", "exec", json!({"command": "git push origin main"}))
            .then_tool(
                "t2",
                "write",
                json!({"path": "notes/todo.md", "content": "- tidy up\n"}),
            )
            .then_tool(
                "t3",
                "write",
                json!({"path": "src/main.rs", "content": "fn main() {}\n"}),
            )
            .then_text("[scripted model] done");
    }
    let policy = PolicyStack::new()
        .with(Arc::new(ConfigPolicy::from_config(&config)))
        .with(Arc::new(HouseRules));
    let audit = Arc::new(MemoryAudit::new());
    let sandbox = Arc::new(MemorySandbox::new());
    let gateway = GatewayBuilder::new(config, BeigeHome::new(dir.path()))
        .provider(Arc::new(model))
        .sandbox(sandbox.clone())
        .store(Arc::new(MemoryStore::new()))
        .policy(Arc::new(policy))
        .approver(Arc::new(NobodyHome))
        .audit(audit.clone())
        .build()
        .await?;

    let from_telegram = run(&gateway, "telegram:42").await?;
    let from_api = run(&gateway, "api:assistant:default").await?;
    for (who, calls) in [("telegram", &from_telegram), ("api", &from_api)] {
        for (tool, is_error, output) in calls.iter() {
            let verdict = if *is_error { "refused" } else { "ran" };
            println!(
                "{who:8} {tool:5} {verdict:7} {}",
                output.lines().next().unwrap_or("")
            );
        }
    }
    // `git push` is refused from Telegram and runs from the API; the write under notes/
    // runs; the other write asked, and nobody approved it.
    assert!(from_telegram[0].1 && from_telegram[0].2.contains("no `git push` from Telegram"));
    assert!(!from_api[0].1, "{:?}", from_api[0]);
    assert!(!from_telegram[1].1 && !from_api[1].1);
    assert!(from_api[2].1 && from_api[2].2.contains("nobody is there to approve"));
    assert_eq!(sandbox.executed("assistant"), ["git push origin main"]);
    assert!(sandbox.file("assistant", "src/main.rs").is_none());

    println!("\naudit records:");
    for r in audit.records() {
        println!(
            "{:?} {:?} {:?} {} {:?}{}",
            r.phase,
            r.decision,
            r.channel.as_deref().unwrap_or("-"),
            r.tool,
            r.args.first().map(String::as_str).unwrap_or(""),
            r.error.map(|e| format!(" — {e}")).unwrap_or_default()
        );
    }
    gateway.shutdown().await?;
    Ok(())
}
