//! Run with `cargo run -p beige-examples --example embed` (needs a Docker engine, the
//! static shim from `scripts/build-shim` and the image `beige-test-busybox:latest` from
//! `scripts/setup-docker`; no network, no API key).
//!
//! Embeds the gateway in a program: builds a `LocalGateway` in code with one agent, the
//! built-in `kv` plugin and a **scripted model** (`ScriptedProvider`, a deterministic
//! stand-in for an LLM — clearly not a real model), sends one prompt and prints the
//! events as they stream. The scripted model writes a script that calls `kv` in a loop,
//! runs it with one `exec`, and reports the result.

use std::sync::Arc;

use beige_core::config::Config;
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::{Block, Role};
use beige_core::AgentEvent;
use beige_core::{BeigeHome, Gateway, GatewayBuilder, PromptRequest};
use futures_util::StreamExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let image =
        std::env::var("BEIGE_TEST_IMAGE").unwrap_or_else(|_| "beige-test-busybox:latest".into());
    let dir = tempfile::tempdir()?;
    let home = BeigeHome::new(dir.path());
    let config: Config = serde_json::from_value(serde_json::json!({
        "llm": {"providers": {"scripted": {"api": "anthropic-messages"}}},
        "plugins": {"kv": {}},
        "agents": {"assistant": {
            "model": {"provider": "scripted", "model": "scripted-demo"},
            "tools": ["kv"],
            "sandbox": {"image": image, "memoryLimit": "256m"}
        }}
    }))?;

    // The scripted model: write a script, run it, then answer with what it printed.
    let model = ScriptedProvider::new("scripted")
        .then_tool("t1", "write", serde_json::json!({
            "path": "scripts/fill.sh",
            "content": "for i in $(seq 1 10); do kv set item:$i $((i*i)); done\nkv list item: | wc -l\n"
        }))
        .then_tool("t2", "exec", serde_json::json!({"command": "sh scripts/fill.sh"}))
        .then(|req| {
            let last = req.messages.iter().rev().find(|m| m.role == Role::User);
            let output = last
                .map(|m| serde_json::to_string(&m.content).unwrap_or_default())
                .unwrap_or_default();
            Ok(vec![Block::Text { text: format!("[scripted model] The script ran; the tool said: {output}") }])
        });

    let gateway = GatewayBuilder::new(config, home)
        .provider(Arc::new(model))
        .build()
        .await?;
    let mut events = gateway
        .prompt(PromptRequest::new(
            "assistant",
            "api:assistant:default",
            "Store ten squares in kv",
        ))
        .await?;
    while let Some(event) = events.next().await {
        match event {
            AgentEvent::ToolCallStarted { name, args, .. } => println!("→ {name} {args}"),
            AgentEvent::ToolCallFinished { output, .. } => println!("← {output}"),
            AgentEvent::Done { response, .. } => println!("{response}"),
            AgentEvent::Error { message, .. } => eprintln!("error: {message}"),
            _ => {}
        }
    }
    gateway.shutdown().await?;
    Ok(())
}
