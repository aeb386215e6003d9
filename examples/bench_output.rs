//! Big-output figures for the benchmark harness: 10 MiB of `exec` output moved from the
//! agent's pipe to the gateway, beside its floor measured in the same run.
//!
//! The agent's sandbox has `execOutputLimit` raised to 16 MiB, so nothing is capped. A
//! 10 MiB file is written once in the workspace; then, alternately,
//!
//! - `exec_output_10mb`: `cat big.txt` through `Gateway::call_tool`, end to end (the
//!   command, the capture in the sandbox, the link, the gateway's result);
//! - `exec_output_10mb_floor`: `cat big.txt | cat > /dev/null` through the same path —
//!   the same 10 MiB through a pipe inside the container, but no output to carry;
//! - `exec_output_10mb_rss_growth`: how far the harness process's resident memory (the
//!   gateway runs in it) rose during the call above where it was before the first big
//!   output, from the kernel's peak counter (`VmHWM`, reset through
//!   `/proc/self/clear_refs` before each call) — so memory kept from an earlier call
//!   counts too.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use beige_core::api::tools::{ContentBlock, CoreToolCall, ToolContext};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::{BeigeHome, Gateway as _, GatewayBuilder, LocalGateway};

use super::{config_with, Figure, NoopPlugin};

/// Size of the output: 10 MiB.
pub const BIG: usize = 10 * 1024 * 1024;
/// Samples per figure.
const SAMPLES: usize = 20;

async fn gateway(home: &BeigeHome, image: &str, shim: &PathBuf) -> anyhow::Result<LocalGateway> {
    let (installation, _) = home.ensure_installation_id()?;
    let docker = DockerSandbox::connect(installation.as_str())
        .await?
        .with_legacy_home(home);
    let config = config_with(
        image,
        "unix",
        serde_json::json!({"execOutputLimit": 16 * 1024 * 1024}),
    )?;
    Ok(GatewayBuilder::new(config, home.clone())
        .shim(shim)
        .sandbox(Arc::new(docker))
        .plugin(Arc::new(NoopPlugin))
        .build()
        .await?)
}

async fn exec(gw: &LocalGateway, command: &str) -> anyhow::Result<(f64, usize)> {
    let call = CoreToolCall::parse("exec", serde_json::json!({ "command": command }))?;
    let t = Instant::now();
    let out = gw.call_tool("bench", call, ToolContext::default()).await?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(!out.is_error, "`{command}` failed: {}", out.joined_text());
    // Measured without copying the text (`joined_text` would add a copy of its own).
    let len = out
        .content
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } => text.len(),
            _ => 0,
        })
        .sum();
    Ok((ms, len))
}

/// `(VmRSS, VmHWM)` of this process, in KiB.
fn rss_kib() -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .with_context(|| format!("no {name} in /proc/self/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Resets the peak-RSS counter (`VmHWM`) to the current RSS.
fn reset_peak() -> anyhow::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting VmHWM (clear_refs)")
}

pub async fn figures(home: &BeigeHome, image: &str, shim: &PathBuf) -> anyhow::Result<Vec<Figure>> {
    let gw = gateway(home, image, shim).await?;
    let line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    exec(&gw, &format!("yes {line} | head -c {BIG} > big.txt")).await?;
    exec(&gw, "cat big.txt | cat > /dev/null").await?;
    let (before, _) = rss_kib()?;
    let (mut full, mut floor, mut growth) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SAMPLES + 3 {
        let (floor_ms, _) = exec(&gw, "cat big.txt | cat > /dev/null").await?;
        reset_peak()?;
        let (ms, len) = exec(&gw, "cat big.txt").await?;
        let (_, peak) = rss_kib()?;
        anyhow::ensure!(len >= BIG, "only {len} of {BIG} bytes came back");
        if i >= 3 {
            floor.push(floor_ms);
            full.push(ms);
            growth.push(peak.saturating_sub(before) as f64 / 1024.0);
        }
    }
    gw.shutdown().await?;
    Ok(vec![
        Figure {
            name: "exec_output_10mb",
            unit: "ms",
            samples: full,
        },
        Figure {
            name: "exec_output_10mb_floor",
            unit: "ms",
            samples: floor,
        },
        Figure {
            name: "exec_output_10mb_rss_growth",
            unit: "MiB",
            samples: growth,
        },
    ])
}
