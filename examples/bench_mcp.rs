//! MCP figures for the benchmark harness: the time of one MCP tool call through its CLI
//! from a shell loop inside the sandbox, beside its floor measured in the same run.
//!
//! The agent has the test MCP server (`beige-mcp-testserver`, built by
//! `scripts/build-shim`, mounted read-only) as `testsrv`, started in its sandbox under a
//! uid of its own, and the no-op plugin tool. Each sample is one loop of 200 calls minus
//! an empty loop, divided by 200:
//!
//! - `mcp_call_loop`: `testsrv echo --text x` — the launcher, the socket, the guarded
//!   path (policy, audit), the grammar and schema check, the MCP call over the server's
//!   link stream and back;
//! - `mcp_call_loop_floor_plugin`: `noop`, a plugin tool that does nothing in the
//!   gateway — the same path without the MCP server, so the difference is what MCP
//!   adds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use beige_core::api::tools::{CoreToolCall, ToolContext};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::{BeigeHome, Gateway as _, GatewayBuilder};

use super::{config_with, Figure, NoopPlugin};

/// Calls per loop.
const CALLS: usize = 200;
/// Loops per figure.
const ROUNDS: usize = 5;

pub async fn figures(home: &BeigeHome, image: &str, shim: &PathBuf) -> anyhow::Result<Vec<Figure>> {
    let server =
        PathBuf::from(std::env::var("BEIGE_MCP_TESTSERVER").context(
            "set BEIGE_MCP_TESTSERVER to the static MCP test server (scripts/build-shim)",
        )?);
    let dir = server
        .parent()
        .context("BEIGE_MCP_TESTSERVER has no folder")?
        .canonicalize()?;
    let name = server
        .file_name()
        .and_then(|n| n.to_str())
        .context("BEIGE_MCP_TESTSERVER has no file name")?;
    let mounts = serde_json::json!({ dir.to_string_lossy(): "/opt/mcp:ro" });
    let mut config = config_with(image, "unix", serde_json::json!({ "extraMounts": mounts }))?;
    config.mcp = Some(serde_json::from_value(serde_json::json!({
        "servers": { "testsrv": { "command": format!("/opt/mcp/{name}") } }
    }))?);
    // Thousands of calls a minute: more audit than the default per-agent budget allows.
    config.gateway.audit.budget_bytes_per_minute = 256 * 1024 * 1024;
    if let Some(agent) = config.agents.get_mut("bench") {
        agent.tools.push("testsrv".into());
    }
    let (installation, _) = home.ensure_installation_id()?;
    let docker = DockerSandbox::connect(installation.as_str())
        .await?
        .with_legacy_home(home);
    let gw = GatewayBuilder::new(config, home.clone())
        .shim(shim)
        .sandbox(Arc::new(docker))
        .plugin(Arc::new(NoopPlugin))
        .build()
        .await?;
    let run = |cmd: String| {
        let gw = gw.clone();
        async move {
            let call =
                CoreToolCall::parse("exec", serde_json::json!({"command": cmd, "timeout": 300}))?;
            let t = Instant::now();
            let out = gw.call_tool("bench", call, ToolContext::default()).await?;
            anyhow::ensure!(!out.is_error, "loop failed: {}", out.joined_text());
            Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
        }
    };
    let looped = |body: &str| {
        format!("i=0; while [ $i -lt {CALLS} ]; do {body} >/dev/null || exit 1; i=$((i+1)); done")
    };
    let (mcp, plugin, empty) = (
        looped("testsrv echo --text x"),
        looped("noop"),
        looped("true"),
    );
    // The server starts on the first call; warm both paths up.
    run(mcp.clone()).await?;
    run(plugin.clone()).await?;
    let (mut mcp_samples, mut floor) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let base = run(empty.clone()).await?;
        mcp_samples.push((run(mcp.clone()).await? - base) / CALLS as f64);
        let base = run(empty.clone()).await?;
        floor.push((run(plugin.clone()).await? - base) / CALLS as f64);
    }
    gw.shutdown().await?;
    Ok(vec![
        Figure {
            name: "mcp_call_loop",
            unit: "ms",
            samples: mcp_samples,
        },
        Figure {
            name: "mcp_call_loop_floor_plugin",
            unit: "ms",
            samples: floor,
        },
    ])
}
