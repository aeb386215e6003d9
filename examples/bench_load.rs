//! The load figures of the benchmark harness: 1,000 sessions prompting at once across
//! 50 agents (50 sandboxes), each prompt one `exec true` and an answer, against a
//! zero-latency model that keeps nothing (a *reflex*, labelled as what it is: not a
//! real model, it asks for `exec true` and then says "done").
//!
//! - `concurrent_1000_total`: wall time until every prompt finished;
//! - `concurrent_1000_prompt`: each prompt's time (its p99 is the gateway's added p99
//!   latency under this load: the model costs nothing, the `exec` is the floor that
//!   `exec_floor_sh_c_true` measures);
//! - `concurrent_1000_rss`: the harness process's peak resident memory during the run
//!   (the gateway runs in it), and `concurrent_1000_errors`: prompts that failed (must
//!   be 0).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use beige_core::llm::{
    Block, EventStream, LlmError, LlmProvider, ModelRequest, ModelResponse, StopReason,
    StreamEvent, Usage,
};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::{
    AgentEvent, BeigeHome, Gateway as _, GatewayBuilder, LocalGateway, PromptRequest,
};

use super::Figure;

const AGENTS: usize = 50;
const SESSIONS: usize = 1000;

/// A zero-latency model with no state: `exec true` first, then "done".
#[derive(Debug)]
struct Reflex;

#[async_trait]
impl LlmProvider for Reflex {
    fn name(&self) -> &str {
        "reflex"
    }

    async fn stream(&self, request: ModelRequest) -> Result<EventStream, LlmError> {
        let answered = request.messages.last().is_some_and(|m| {
            m.content
                .iter()
                .any(|b| matches!(b, Block::ToolResult { .. }))
        });
        let (content, stop_reason) = if answered {
            (
                vec![Block::Text {
                    text: "[reflex] done".into(),
                }],
                StopReason::EndTurn,
            )
        } else {
            (
                vec![Block::ToolUse {
                    id: format!("t{}", request.messages.len()),
                    name: "exec".into(),
                    input: serde_json::json!({"command": "true"}),
                }],
                StopReason::ToolUse,
            )
        };
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 10,
            ..Default::default()
        };
        let events = vec![Ok(StreamEvent::Completed(ModelResponse {
            content,
            stop_reason,
            usage,
        }))];
        Ok(Box::pin(futures_util::stream::iter(events)))
    }
}

async fn gateway(home: &BeigeHome, image: &str, shim: &PathBuf) -> anyhow::Result<LocalGateway> {
    let mut agents = serde_json::Map::new();
    for i in 0..AGENTS {
        agents.insert(
            format!("load{i}"),
            serde_json::json!({
                "model": {"provider": "reflex", "model": "reflex"},
                "tools": [],
                "sandbox": {"image": image, "memoryLimit": "64m", "link": "unix"}
            }),
        );
    }
    let config = serde_json::from_value(serde_json::json!({
        "llm": {"providers": {"reflex": {"api": "anthropic-messages"}}},
        "agents": agents,
    }))?;
    let (installation, _) = home.ensure_installation_id()?;
    let docker = DockerSandbox::connect(installation.as_str())
        .await?
        .with_legacy_home(home);
    Ok(GatewayBuilder::new(config, home.clone())
        .shim(shim)
        .sandbox(Arc::new(docker))
        .provider(Arc::new(Reflex))
        .build()
        .await?)
}

/// `(VmRSS, VmHWM)` of this process, in MiB.
fn rss_mib() -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no {name} in /proc/self/status"))?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

async fn prompt(gw: LocalGateway, agent: String, key: String) -> anyhow::Result<f64> {
    let t = Instant::now();
    let events = gw
        .prompt(PromptRequest::new(agent, key, "go"))
        .await?
        .collect_all()
        .await;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    match events.last() {
        Some(AgentEvent::Done { .. }) => Ok(ms),
        other => anyhow::bail!("prompt did not finish: {other:?}"),
    }
}

pub async fn figures(home: &BeigeHome, image: &str, shim: &PathBuf) -> anyhow::Result<Vec<Figure>> {
    let gw = gateway(home, image, shim).await?;
    // Every sandbox answers once before the clock starts.
    let mut warm = Vec::new();
    for i in 0..AGENTS {
        warm.push(tokio::spawn(prompt(
            gw.clone(),
            format!("load{i}"),
            format!("api:load{i}:warm"),
        )));
    }
    for w in warm {
        w.await??;
    }
    std::fs::write("/proc/self/clear_refs", "5")?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let agent = format!("load{}", s % AGENTS);
        let key = format!("api:{agent}:s{s}");
        tasks.push(tokio::spawn(prompt(gw.clone(), agent, key)));
    }
    let (mut samples, mut errors) = (Vec::new(), 0usize);
    for t in tasks {
        match t.await? {
            Ok(ms) => samples.push(ms),
            Err(e) => {
                errors += 1;
                eprintln!("concurrent_1000: {e:#}");
            }
        }
    }
    let total = started.elapsed().as_secs_f64() * 1000.0;
    let (_, peak) = rss_mib()?;
    gw.shutdown().await?;
    Ok(vec![
        Figure {
            name: "concurrent_1000_prompt",
            unit: "ms",
            samples,
        },
        Figure {
            name: "concurrent_1000_total",
            unit: "ms",
            samples: vec![total],
        },
        Figure {
            name: "concurrent_1000_rss",
            unit: "MiB",
            samples: vec![peak],
        },
        Figure {
            name: "concurrent_1000_errors",
            unit: "count",
            samples: vec![errors as f64],
        },
    ])
}
