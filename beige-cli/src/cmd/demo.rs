//! `beige demo`: the offline demonstration — no daemon, no network, no API key.
//!
//! Starts an in-process gateway in a temporary `BEIGE_HOME` with one agent in a real
//! Docker sandbox (`BEIGE_TEST_IMAGE`, default `beige-test-busybox:latest`) and the
//! built-in `kv` plugin, and sends it one message. The model is the **scripted model**
//! (`ScriptedProvider`, clearly labelled in the output): it writes a shell script that
//! calls `kv` 50 times in a loop, runs it with one `exec`, and answers with the number the
//! script printed. With `ANTHROPIC_API_KEY` or `OPENAI_API_KEY` set, a real model gets
//! the same message instead. The demo prints the transcript, a summary of the audit log
//! and the timings, and removes the container and the temporary home at the end, also
//! after Ctrl+C.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use beige_core::audit::{AuditDecision, AuditRecord, AuditType, Phase};
use beige_core::config::Config;
use beige_core::home::BeigeHome;
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::{Block, LlmProvider, Messages, Role, ToolResultPart};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::sandbox::Sandbox;
use beige_core::AgentEvent;
use beige_core::{Gateway, GatewayBuilder, LocalGateway, PromptRequest};
use futures_util::StreamExt;
use serde_json::json;

use crate::{code, Exit};

/// The agent of the demo.
const AGENT: &str = "demo";

/// The image used when `BEIGE_TEST_IMAGE` is not set.
pub const DEFAULT_DEMO_IMAGE: &str = "beige-test-busybox:latest";

/// The label printed before anything the scripted model says.
pub const SCRIPTED_LABEL: &str = "model: scripted (deterministic demo model, not an LLM) — set ANTHROPIC_API_KEY or OPENAI_API_KEY to use a real one";

/// What the user asks.
const MESSAGE: &str = "Use the kv tool from a shell script: store the squares of the numbers 1 to 25 under the keys sq:1 … sq:25, read every value back, and tell me the sum of the values you read. Write the script to /workspace/kv-demo.sh and run it with a single exec.";

/// The script the scripted model writes: 25 × `kv set` + 25 × `kv get` = 50 kv calls.
const SCRIPT: &str = r#"#!/bin/sh
# Store the squares of 1..25 with kv, read each one back and add them up: 50 kv calls.
set -e
sum=0
i=1
while [ "$i" -le 25 ]; do
  kv set "sq:$i" "$((i * i))" >/dev/null
  value=$(kv get "sq:$i")
  sum=$((sum + value))
  i=$((i + 1))
done
echo "stored 25 values and read them back: 50 kv calls"
echo "sum=$sum"
"#;

/// Which model answers.
#[derive(Debug, Clone)]
enum Model {
    Scripted,
    Real {
        provider: &'static str,
        model: &'static str,
        key: String,
    },
}

impl Model {
    fn from_env() -> Self {
        let key = |name: &str| std::env::var(name).ok().filter(|k| !k.trim().is_empty());
        if let Some(key) = key("ANTHROPIC_API_KEY") {
            Model::Real {
                provider: "anthropic",
                model: "claude-sonnet-4-6",
                key,
            }
        } else if let Some(key) = key("OPENAI_API_KEY") {
            Model::Real {
                provider: "openai",
                model: "gpt-4o",
                key,
            }
        } else {
            Model::Scripted
        }
    }

    fn banner(&self) -> String {
        match self {
            Model::Scripted => SCRIPTED_LABEL.to_string(),
            Model::Real {
                provider, model, ..
            } => format!(
                "model: {provider}/{model} (a real model; its answers vary, and this run needs the network)"
            ),
        }
    }

    fn speaker(&self) -> &'static str {
        match self {
            Model::Scripted => "assistant (scripted model)",
            Model::Real { .. } => "assistant",
        }
    }
}

/// The scripted model's two steps: write + exec, then the answer computed from the
/// exec's output.
fn scripted_model() -> ScriptedProvider {
    ScriptedProvider::new("scripted")
        .then(|_| {
            Ok(vec![
                Block::Text {
                    text: "I'll write a script that stores the 25 squares with `kv set`, reads each one back with `kv get` and adds them up, then run it once.".into(),
                },
                Block::ToolUse {
                    id: "call_1".into(),
                    name: "write".into(),
                    input: json!({"path": "/workspace/kv-demo.sh", "content": SCRIPT}),
                },
                Block::ToolUse {
                    id: "call_2".into(),
                    name: "exec".into(),
                    input: json!({"command": "sh /workspace/kv-demo.sh"}),
                },
            ])
        })
        .then(|request| {
            let output = last_tool_result(&request.messages);
            let sum = output
                .lines()
                .find_map(|l| l.strip_prefix("sum="))
                .map(str::trim)
                .and_then(|s| s.parse::<u64>().ok());
            let text = match sum {
                Some(sum) => format!(
                    "Done. The script made 50 kv calls from inside the sandbox — 25 `kv set` and 25 `kv get` — and the values it read back add up to {sum}{}.",
                    if sum == 5525 {
                        " (1² + 2² + … + 25² = 5525, so every value came back intact)"
                    } else {
                        ""
                    }
                ),
                None => format!(
                    "The script did not print a sum, so I cannot give you one. Its output was:\n{output}"
                ),
            };
            Ok(vec![Block::Text { text }])
        })
}

/// The text of the last tool result in a conversation.
fn last_tool_result(messages: &Messages) -> String {
    messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| m.content.iter().rev())
        .find_map(|b| match b {
            Block::ToolResult { content, .. } => Some(
                content
                    .iter()
                    .filter_map(|p| match p {
                        ToolResultPart::Text { text } => Some(text.as_str()),
                        ToolResultPart::Image { .. } => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            _ => None,
        })
        .unwrap_or_default()
}

fn config(model: &Model, image: &str) -> Result<Config> {
    let (provider, model_name, providers) = match model {
        Model::Scripted => (
            "scripted",
            "scripted-demo",
            json!({"scripted": {"models": {"scripted-demo": {"contextWindow": 200000, "maxOutputTokens": 8192}}}}),
        ),
        Model::Real {
            provider,
            model,
            key,
        } => (*provider, *model, json!({ *provider: {"apiKey": key} })),
    };
    Ok(serde_json::from_value(json!({
        "llm": {"providers": providers},
        "plugins": {"kv": {}},
        "agents": {
            AGENT: {
                "model": {"provider": provider, "model": model_name},
                "tools": ["kv"],
                "maxTurns": 8,
                "sandbox": {"image": image, "memoryLimit": "256m", "pidsLimit": 128},
            }
        },
    }))?)
}

/// Indent every line of `text` under a bar.
fn block(text: &str, max_lines: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for l in lines.iter().take(max_lines) {
        out.push_str(&format!("      │ {l}\n"));
    }
    if lines.len() > max_lines {
        out.push_str(&format!(
            "      │ … ({} more lines)\n",
            lines.len() - max_lines
        ));
    }
    out
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// What the run measured.
#[derive(Debug, Default)]
struct Timings {
    sandbox: Duration,
    exec: Option<Duration>,
    total: Duration,
    /// Model calls that asked for tools.
    tool_turns: u32,
}

pub async fn run() -> Result<()> {
    let model = Model::from_env();
    println!("beige demo — one agent, one real Docker sandbox, the built-in kv plugin");
    println!("{}", model.banner());
    println!();

    // What the demo needs, with how to get it.
    let shim = crate::daemon::find_shim(None).map_err(|e| {
        Exit::new(
            1,
            format!("error: {e}\nThe demo needs the static shim: run `scripts/build-shim` (or `scripts/quickstart`)."),
        )
    })?;
    let probe = tokio::time::timeout(
        Duration::from_secs(10),
        DockerSandbox::connect("demo-probe"),
    )
    .await
    .map_err(|_| {
        Exit::new(
            1,
            "error: the Docker engine did not answer within 10 s; check it with `docker info`.",
        )
    })?
    .map_err(|e| Exit::new(1, format!("error: {e}")))?;
    let image = std::env::var("BEIGE_TEST_IMAGE")
        .ok()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| DEFAULT_DEMO_IMAGE.to_string());
    if probe.client().inspect_image(&image).await.is_err() {
        return Err(Exit::new(
            1,
            format!("error: the demo image {image} is not on this Docker engine. Build it offline with `scripts/setup-docker` (or set BEIGE_TEST_IMAGE to an image you have)."),
        )
        .into());
    }

    let dir = tempfile::Builder::new()
        .prefix("beige-demo-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let home = BeigeHome::new(dir.path().join("home"));
    let (installation, _) = home
        .ensure_installation_id()
        .map_err(|e| Exit::new(1, format!("error: {e}")))?;
    let docker = Arc::new(
        DockerSandbox::connect(installation.as_str())
            .await
            .map_err(|e| Exit::new(1, format!("error: {e}")))?,
    );
    let mut gateway: Option<LocalGateway> = None;
    let outcome = tokio::select! {
        r = play(&model, &image, &shim, &home, docker.clone(), &mut gateway) => r,
        _ = tokio::signal::ctrl_c() => Err(Exit::new(code::INTERRUPTED, "\ninterrupted — the demo's sandbox and temporary folder were removed").into()),
    };

    // Clean up whatever happened.
    if let Some(gw) = gateway.take() {
        if let Err(e) = gw.shutdown().await {
            tracing::warn!(error = %e, "demo gateway shutdown failed");
        }
    }
    if let Err(e) = docker.remove_all().await {
        eprintln!("warning: could not remove the demo's container: {e}");
    }
    let (timings, events_ok) = outcome?;

    summary(&home, &timings)?;
    drop(dir);
    if !events_ok {
        return Err(Exit::new(1, "the demo's prompt did not finish; see the error above").into());
    }
    Ok(())
}

/// Start the gateway, send the message, print the transcript.
async fn play(
    model: &Model,
    image: &str,
    shim: &Path,
    home: &BeigeHome,
    docker: Arc<DockerSandbox>,
    slot: &mut Option<LocalGateway>,
) -> Result<(Timings, bool)> {
    let total = Instant::now();
    let mut builder = GatewayBuilder::new(config(model, image)?, home.clone())
        .shim(shim)
        .sandbox(docker);
    if let Model::Scripted = model {
        let provider: Arc<dyn LlmProvider> = Arc::new(scripted_model());
        builder = builder.provider(provider);
    }
    print!("▸ starting the sandbox of agent \"{AGENT}\" (image {image})… ");
    flush();
    let started = Instant::now();
    let gw = builder
        .build()
        .await
        .map_err(|e| Exit::new(1, format!("\nerror: {e}")))?;
    let sandbox = started.elapsed();
    println!("ready in {}", secs(sandbox));
    println!();
    let gateway = slot.insert(gw).clone();

    println!("user ▸ {MESSAGE}");
    println!();
    let mut stream = gateway
        .prompt(PromptRequest::new(AGENT, "cli:demo:default", MESSAGE))
        .await?;
    let mut exec = None;
    let mut ok = false;
    let mut speaking = false;
    let mut tool_turns = 0;
    let mut turn_had_tools = false;
    while let Some(event) = stream.next().await {
        match event {
            AgentEvent::TextDelta { text } => {
                if !speaking {
                    print!("{} ▸ ", model.speaker());
                    speaking = true;
                }
                print!("{text}");
                flush();
            }
            AgentEvent::TurnStarted { .. } => turn_had_tools = false,
            AgentEvent::ToolCallStarted { name, args, .. } => {
                if !turn_had_tools {
                    turn_had_tools = true;
                    tool_turns += 1;
                }
                if speaking {
                    println!();
                    speaking = false;
                }
                match (
                    name.as_str(),
                    args.get("path"),
                    args.get("content"),
                    args.get("command"),
                ) {
                    ("write", Some(path), Some(content), _) => {
                        let content = content.as_str().unwrap_or_default();
                        println!(
                            "  → write {} ({} lines)",
                            path.as_str().unwrap_or("?"),
                            content.lines().count()
                        );
                        print!("{}", block(content, 30));
                    }
                    ("exec", _, _, Some(cmd)) => {
                        println!("  → exec {}", cmd.as_str().unwrap_or("?"))
                    }
                    _ => println!("  → {name} {args}"),
                }
            }
            AgentEvent::ToolCallFinished {
                name,
                output,
                is_error,
                duration_ms,
                ..
            } => {
                println!(
                    "  {} {name} ({duration_ms} ms)",
                    if is_error { "✗" } else { "✓" }
                );
                print!("{}", block(&output, 20));
                if name == "exec" {
                    exec = Some(Duration::from_millis(duration_ms));
                }
            }
            AgentEvent::ModelSwitched { from, to, reason } => {
                println!("  (switched from {from} to {to}: {reason})")
            }
            AgentEvent::Done { .. } => {
                if speaking {
                    println!();
                }
                ok = true;
            }
            AgentEvent::Error { message, hint, .. } => {
                if speaking {
                    println!();
                }
                eprintln!("error: {message}");
                if let Some(h) = hint {
                    eprintln!("hint: {h}");
                }
            }
            AgentEvent::Blocked { reason } => eprintln!("blocked: {reason}"),
            _ => {}
        }
    }
    Ok((
        Timings {
            sandbox,
            exec,
            total: total.elapsed(),
            tool_turns,
        },
        ok,
    ))
}

fn flush() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

/// Counts from the demo's audit log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AuditCounts {
    pub records: usize,
    /// Prompts recorded (each with who sent it).
    pub prompts: usize,
    pub calls: usize,
    pub denied: usize,
    pub writes: usize,
    pub execs: usize,
    pub kv: usize,
    pub other: usize,
}

/// Count the records of an `audit.jsonl`.
pub fn count_audit(path: &Path) -> Result<AuditCounts> {
    let mut c = AuditCounts::default();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        // No tool was called, so nothing was recorded.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(c),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot read the demo's audit log {}", path.display()))
        }
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("unreadable audit record: {line}"))?;
        // The chain's own records (genesis, checkpoints, rotations) are no calls.
        if beige_core::audit::chain::is_chain_record(&value) {
            continue;
        }
        let r: AuditRecord = serde_json::from_value(value)
            .with_context(|| format!("unreadable audit record: {line}"))?;
        // The prompt's own record (who sent it) is no call either.
        if r.kind == AuditType::Prompt {
            c.prompts += 1;
            continue;
        }
        c.records += 1;
        if r.phase != Phase::Finished {
            continue;
        }
        c.calls += 1;
        if r.decision == AuditDecision::Denied {
            c.denied += 1;
        }
        match (r.kind, r.tool.as_str()) {
            (AuditType::CoreTool, "write") => c.writes += 1,
            (AuditType::CoreTool, "exec") => c.execs += 1,
            (AuditType::Tool, "kv") => c.kv += 1,
            _ => c.other += 1,
        }
    }
    Ok(c)
}

fn summary(home: &BeigeHome, t: &Timings) -> Result<()> {
    let path: PathBuf = home.audit_log_path();
    let c = count_audit(&path)?;
    println!();
    println!("Audit log (every tool call, whoever made it):");
    let mut parts = vec![format!(
        "{} model round trip{} with tools",
        t.tool_turns,
        if t.tool_turns == 1 { "" } else { "s" }
    )];
    if c.writes > 0 {
        parts.push(format!("{} write", c.writes));
    }
    parts.push(format!("{} exec", c.execs));
    parts.push(format!("{} kv calls from inside the sandbox", c.kv));
    if c.other > 0 {
        parts.push(format!("{} other calls", c.other));
    }
    println!("  {}", parts.join(" · "));
    println!(
        "  {} audit records: each of the {} calls checked by policy and recorded when it started and when it finished; {} denied",
        c.records, c.calls, c.denied
    );
    if c.prompts > 0 {
        println!(
            "  and {} prompt record{}, each naming who sent it",
            c.prompts,
            if c.prompts == 1 { "" } else { "s" }
        );
    }
    println!();
    println!("Timings:");
    println!("  sandbox start                     {}", secs(t.sandbox));
    if let Some(exec) = t.exec {
        println!("  the exec with {} kv calls         {}", c.kv, secs(exec));
    }
    println!("  total                             {}", secs(t.total));
    println!();
    println!("The demo's container and temporary BEIGE_HOME are removed. Next: `beige setup`, then `beige gateway start` (docs/operating.md).");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use beige_core::llm::Message;

    #[test]
    fn scripted_answer_uses_the_tool_output() {
        let messages: Messages = vec![
            Message::user_text("hi"),
            Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "call_2".into(),
                    content: vec![ToolResultPart::Text {
                        text: "Exit code: 0\nstored\nsum=5525".into(),
                    }],
                    is_error: false,
                }],
            },
        ]
        .into();
        assert_eq!(
            last_tool_result(&messages),
            "Exit code: 0\nstored\nsum=5525"
        );
    }

    #[test]
    fn the_demo_config_is_valid_json() {
        let c = config(&Model::Scripted, "img").unwrap();
        assert_eq!(c.agents[AGENT].tools, vec!["kv"]);
        assert!(c.plugins.contains_key("kv"));
    }
}
