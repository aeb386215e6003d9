//! Run with `scripts/bench` (or `cargo run --release -p beige-examples --example bench`
//! with `BEIGE_SHIM` and `BEIGE_TEST_IMAGE` set and a Docker engine running).
//!
//! The benchmark harness. Prints one line per figure,
//! `BENCH <name> median=<x> p95=<y> p99=<z> unit=<ms|MiB|calls/s> n=<samples>`, and writes the
//! same data to `target/bench/results.json`. Pass figure names to run only those.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use beige_core::api::tools::{CoreToolCall, ToolContext};
use beige_core::config::Config;
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::Block;
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::sandbox::{Sandbox as _, Transport};
use beige_core::AgentEvent;
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway, PromptRequest};

#[path = "bench_cold.rs"]
mod bench_cold;
#[path = "bench_egress.rs"]
mod bench_egress;
#[path = "bench_load.rs"]
mod bench_load;
#[path = "bench_mcp.rs"]
mod bench_mcp;
#[path = "bench_output.rs"]
mod bench_output;
#[path = "bench_session.rs"]
mod bench_session;
#[path = "bench_store.rs"]
mod bench_store;

struct Figure {
    name: &'static str,
    unit: &'static str,
    samples: Vec<f64>,
}

impl Figure {
    fn quantile(&self, q: f64) -> f64 {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        let idx = ((s.len() as f64 - 1.0) * q).round() as usize;
        s.get(idx).copied().unwrap_or(f64::NAN)
    }
}

/// `link`: how core tools reach the sandbox (`unix`, `attach` or `off` = `docker exec`).
fn config(image: &str, link: &str) -> anyhow::Result<Config> {
    config_with(image, link, serde_json::json!({}))
}

/// [`config`] with `sandbox` merged into the agent's sandbox block.
fn config_with(image: &str, link: &str, sandbox: serde_json::Value) -> anyhow::Result<Config> {
    let mut block = serde_json::json!({"image": image, "memoryLimit": "256m", "link": link});
    if let (Some(block), Some(extra)) = (block.as_object_mut(), sandbox.as_object()) {
        block.extend(extra.clone());
    }
    Ok(serde_json::from_value(serde_json::json!({
        "llm": {"providers": {"anthropic": {}}},
        "agents": {"bench": {
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": ["noop"],
            "sandbox": block
        }}
    }))?)
}

/// The transport a link mode must show in results.
fn transport_of(link: &str) -> Transport {
    match link {
        "unix" => Transport::LINK_UNIX,
        "attach" => Transport::LINK_ATTACH,
        _ => Transport::DOCKER_EXEC,
    }
}

/// A tool that does nothing, to measure the path around a plugin tool call.
#[derive(Debug)]
struct Noop;

#[async_trait::async_trait]
impl Tool for Noop {
    fn name(&self) -> &str {
        "noop"
    }
    fn description(&self) -> &str {
        "does nothing"
    }
    async fn call(&self, _call: ToolCall) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok(""))
    }
}

#[derive(Debug)]
struct NoopPlugin;

#[async_trait::async_trait]
impl Plugin for NoopPlugin {
    fn name(&self) -> &str {
        "noop"
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(Noop))
    }
}

/// The gateway and (a handle on) its sandbox backend.
async fn gateway_and_sandbox(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
    link: &str,
) -> anyhow::Result<(LocalGateway, DockerSandbox)> {
    gateway_with_audit(home, image, shim, link, None).await
}

/// The gateway, with `audit` in place of the default audit log (the hash-chained JSONL
/// file) when given.
async fn gateway_with_audit(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
    link: &str,
    audit: Option<Arc<dyn beige_core::audit::AuditSink>>,
) -> anyhow::Result<(LocalGateway, DockerSandbox)> {
    let (installation, _) = home.ensure_installation_id()?;
    let docker = DockerSandbox::connect(installation.as_str())
        .await?
        .with_legacy_home(home);
    let mut builder = GatewayBuilder::new(config(image, link)?, home.clone())
        .shim(shim)
        .sandbox(Arc::new(docker.clone()))
        .plugin(Arc::new(NoopPlugin));
    if let Some(audit) = audit {
        builder = builder.audit(audit);
    }
    Ok((builder.build().await?, docker))
}

fn exec_true() -> anyhow::Result<CoreToolCall> {
    Ok(CoreToolCall::parse(
        "exec",
        serde_json::json!({"command": "true"}),
    )?)
}

/// 200 sequential calls of `call` through `Gateway::call_tool`, checking each took the
/// transport of `link`.
async fn core_roundtrips(
    gw: &LocalGateway,
    call: &CoreToolCall,
    link: &str,
) -> anyhow::Result<Vec<f64>> {
    for _ in 0..10 {
        gw.call_tool("bench", call.clone(), ToolContext::default())
            .await?;
    }
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let out = gw
            .call_tool("bench", call.clone(), ToolContext::default())
            .await?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            !out.is_error,
            "{} failed: {}",
            call.name(),
            out.joined_text()
        );
        anyhow::ensure!(
            out.transport == Some(transport_of(link)),
            "{} took {:?}, not the {link} link",
            call.name(),
            out.transport
        );
    }
    Ok(samples)
}

/// `exec true` over the link (Unix carrier), over the attach carrier and through
/// `docker exec`; plus a 4 KiB `read` over the link.
async fn exec_roundtrip(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let mut figures = Vec::new();
    for (link, name) in [
        ("unix", "exec_roundtrip"),
        ("attach", "exec_roundtrip_attach"),
        ("off", "exec_roundtrip_docker_exec"),
    ] {
        let (gw, docker) = gateway_and_sandbox(home, image, shim, link).await?;
        let samples = core_roundtrips(&gw, &exec_true()?, link).await?;
        figures.push(Figure {
            name,
            unit: "ms",
            samples,
        });
        if link == "unix" {
            let content = "x".repeat(4095) + "\n";
            let write = CoreToolCall::parse(
                "write",
                serde_json::json!({"path": "four-k.txt", "content": content}),
            )?;
            gw.call_tool("bench", write, ToolContext::default()).await?;
            let read = CoreToolCall::parse("read", serde_json::json!({"path": "four-k.txt"}))?;
            figures.push(Figure {
                name: "read_4k_roundtrip",
                unit: "ms",
                samples: core_roundtrips(&gw, &read, link).await?,
            });
            // The same op straight on the sandbox, without the gateway's guarded path
            // (policy, hooks, two audit lines): where the time goes.
            let op = beige_core::sandbox::to_request(
                "bench",
                &gw.config().agents["bench"].sandbox,
                &read,
                &ToolContext::default(),
            );
            let mut samples = Vec::new();
            for i in 0..210 {
                let t = Instant::now();
                let out = docker.run_op("bench", &op).await?;
                if i >= 10 {
                    samples.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                anyhow::ensure!(out.transport == Transport::LINK_UNIX, "{:?}", out.transport);
            }
            let mut pings = Vec::new();
            for _ in 0..200 {
                let rtt = docker
                    .link_hub()
                    .ping("bench", std::time::Duration::from_secs(2))
                    .await
                    .context("the link did not answer a ping")?;
                pings.push(rtt.as_secs_f64() * 1000.0);
            }
            figures.push(Figure {
                name: "link_ping",
                unit: "ms",
                samples: pings,
            });
            figures.push(Figure {
                name: "read_4k_op_only",
                unit: "ms",
                samples,
            });
            figures.push(sh_c_true_floor(&gw).await?);
        }
        gw.shutdown().await?;
    }
    Ok(figures)
}

/// The floor of `exec true`: what `sh -c true` itself costs inside the container (a
/// fork and exec of the shell), as the difference of a shell loop running it 200 times
/// and the same loop running the builtin `true`, divided by 200.
async fn sh_c_true_floor(gw: &LocalGateway) -> anyhow::Result<Figure> {
    let run = |command: &'static str| async move {
        let call = CoreToolCall::parse("exec", serde_json::json!({ "command": command }))?;
        let t = Instant::now();
        let out = gw.call_tool("bench", call, ToolContext::default()).await?;
        anyhow::ensure!(!out.is_error, "loop failed: {}", out.joined_text());
        Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
    };
    let with = "i=0; while [ $i -lt 200 ]; do sh -c true; i=$((i+1)); done";
    let without = "i=0; while [ $i -lt 200 ]; do true; i=$((i+1)); done";
    run(with).await?;
    let mut samples = Vec::new();
    for _ in 0..10 {
        let base = run(without).await?;
        let total = run(with).await?;
        samples.push((total - base) / 200.0);
    }
    Ok(Figure {
        name: "exec_floor_sh_c_true",
        unit: "ms",
        samples,
    })
}

/// `tool_call_roundtrip` with the default audit log (a hash chain with signed
/// checkpoints) beside its floor, `tool_call_roundtrip_unchained`: the same calls written
/// to a plain JSONL log. The two gateways take turns, three rounds each, so that a change
/// in the machine's load falls on both.
async fn tool_call_roundtrip_and_floor(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let mut chained = Vec::new();
    let mut plain = Vec::new();
    for _ in 0..3 {
        chained.extend(tool_call_roundtrip(home, image, shim, None, 4).await?);
        let log = home.root().join("logs").join("audit-unchained.jsonl");
        let sink: Arc<dyn beige_core::audit::AuditSink> = Arc::new(
            beige_core::audit::JsonlAudit::new(log, 64 * 1024 * 1024, 3, Vec::new()),
        );
        plain.extend(tool_call_roundtrip(home, image, shim, Some(sink), 4).await?);
    }
    Ok(vec![
        Figure {
            name: "tool_call_roundtrip",
            unit: "ms",
            samples: chained,
        },
        Figure {
            name: "tool_call_roundtrip_unchained",
            unit: "ms",
            samples: plain,
        },
    ])
}

/// 200 calls of a no-op plugin tool from a shell loop in the sandbox, `rounds` times.
/// Each sample is one loop's time minus an empty loop's, divided by 200.
async fn tool_call_roundtrip(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
    audit: Option<Arc<dyn beige_core::audit::AuditSink>>,
    rounds: usize,
) -> anyhow::Result<Vec<f64>> {
    let gw = gateway_with_audit(home, image, shim, "unix", audit)
        .await?
        .0;
    let run = |cmd: &'static str| {
        let gw = gw.clone();
        async move {
            let call = CoreToolCall::parse("exec", serde_json::json!({"command": cmd}))?;
            let t = Instant::now();
            let out = gw.call_tool("bench", call, ToolContext::default()).await?;
            anyhow::ensure!(!out.is_error, "loop failed: {}", out.joined_text());
            Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
        }
    };
    let with = "i=0; while [ $i -lt 200 ]; do noop; i=$((i+1)); done";
    let without = "i=0; while [ $i -lt 200 ]; do true; i=$((i+1)); done";
    run(with).await?;
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let base = run(without).await?;
        let total = run(with).await?;
        samples.push((total - base) / 200.0);
    }
    gw.shutdown().await?;
    Ok(samples)
}

/// A scripted model for the loop benchmarks: when the last message holds a tool result
/// it answers with text, otherwise it asks for `exec true` (or answers at once when
/// `with_tool` is false). Labelled as what it is: not a real model.
fn scripted(steps: usize, with_tool: bool) -> ScriptedProvider {
    let mut p = ScriptedProvider::new("scripted");
    for i in 0..steps {
        p = p.then(move |req| {
            let answered = req.messages.last().is_some_and(|m| {
                m.content
                    .iter()
                    .any(|b| matches!(b, Block::ToolResult { .. }))
            });
            Ok(if with_tool && !answered {
                vec![Block::ToolUse {
                    id: format!("t{i}"),
                    name: "exec".into(),
                    input: serde_json::json!({"command": "true"}),
                }]
            } else {
                vec![Block::Text {
                    text: "[scripted] done".into(),
                }]
            })
        });
    }
    p
}

async fn loop_gateway(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
    model: ScriptedProvider,
) -> anyhow::Result<LocalGateway> {
    let mut cfg = config(image, "unix")?;
    cfg.llm.providers =
        serde_json::from_value(serde_json::json!({"scripted": {"api": "anthropic-messages"}}))?;
    if let Some(a) = cfg.agents.get_mut("bench") {
        a.model = serde_json::from_value(
            serde_json::json!({"provider": "scripted", "model": "scripted"}),
        )?;
    }
    let (installation, _) = home.ensure_installation_id()?;
    let docker = DockerSandbox::connect(installation.as_str())
        .await?
        .with_legacy_home(home);
    Ok(GatewayBuilder::new(cfg, home.clone())
        .shim(shim)
        .sandbox(Arc::new(docker))
        .plugin(Arc::new(NoopPlugin))
        .provider(Arc::new(model))
        .build()
        .await?)
}

async fn prompt_once(gw: &LocalGateway, key: String) -> anyhow::Result<f64> {
    let t = Instant::now();
    let events = gw
        .prompt(PromptRequest::new("bench", key, "go"))
        .await?
        .collect_all()
        .await;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    match events.last() {
        Some(AgentEvent::Done { .. }) => Ok(ms),
        other => anyhow::bail!("prompt did not finish: {other:?}"),
    }
}

/// Gateway time of one prompt with one model turn against a zero-latency scripted
/// model: session lock, history load, prompt assembly, routing, persistence.
async fn turn_overhead(home: &BeigeHome, image: &str, shim: &PathBuf) -> anyhow::Result<Figure> {
    let gw = loop_gateway(home, image, shim, scripted(250, false)).await?;
    for i in 0..20 {
        prompt_once(&gw, format!("api:bench:warm{i}")).await?;
    }
    let mut samples = Vec::new();
    for i in 0..200 {
        samples.push(prompt_once(&gw, format!("api:bench:s{i}")).await?);
    }
    gw.shutdown().await?;
    Ok(Figure {
        name: "turn_overhead",
        unit: "ms",
        samples,
    })
}

/// 200 sessions prompting at once, each prompt one `exec true` and an answer.
async fn concurrent_sessions(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let gw = loop_gateway(home, image, shim, scripted(400, true)).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            prompt_once(&gw, format!("api:bench:c{i}")).await
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.push(t.await??);
    }
    let total = started.elapsed().as_secs_f64() * 1000.0;
    gw.shutdown().await?;
    Ok(vec![
        Figure {
            name: "concurrent_sessions_prompt",
            unit: "ms",
            samples,
        },
        Figure {
            name: "concurrent_sessions_total",
            unit: "ms",
            samples: vec![total],
        },
    ])
}

/// A real daemon (`beige gateway start --foreground`) with one idle agent: its resident
/// memory, then `POST /api/agents/bench/exec` with `exec true` through HTTP.
async fn daemon_figures(image: &str, shim: &PathBuf, link: &str) -> anyhow::Result<Vec<Figure>> {
    let bin = std::env::var("BEIGE_BIN")
        .context("set BEIGE_BIN to target/release/beige (scripts/bench does)")?;
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let status = std::process::Command::new(&bin)
        .arg("setup")
        .env("BEIGE_HOME", &home)
        .output()?;
    anyhow::ensure!(status.status.success(), "beige setup failed");
    std::fs::write(
        home.join("config.json5"),
        serde_json::json!({
            "llm": {"providers": {"anthropic": {}}},
            "plugins": {"kv": {}},
            "agents": {"bench": {
                "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                "tools": ["kv"],
                "sandbox": {"image": image, "memoryLimit": "256m", "link": link}
            }},
            "gateway": {"host": "127.0.0.1", "port": port}
        })
        .to_string(),
    )?;
    let mut child = tokio::process::Command::new(&bin)
        .args(["gateway", "start", "--foreground"])
        .env("BEIGE_HOME", &home)
        .env("BEIGE_SHIM", shim)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("daemon has no pid")?;
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        if http
            .get(format!("{url}/api/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the daemon did not answer /api/health"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let mut rss = Vec::new();
    for _ in 0..10 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS")?;
        rss.push(kib / 1024.0);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let token = std::fs::read_to_string(home.join("gateway.token"))?
        .trim()
        .to_string();
    let exec = |http: reqwest::Client| {
        let (url, token) = (url.clone(), token.clone());
        async move {
            let t = Instant::now();
            let r = http
                .post(format!("{url}/api/agents/bench/exec"))
                .bearer_auth(token)
                .json(&serde_json::json!({"tool": "exec", "params": {"command": "true"}}))
                .send()
                .await?;
            anyhow::ensure!(r.status().is_success(), "exec answered {}", r.status());
            let body: serde_json::Value = r.json().await?;
            anyhow::ensure!(body["isError"] == false, "exec failed: {body}");
            anyhow::ensure!(
                body["transport"] == transport_of(link).as_str(),
                "exec took {}, not the {link} link",
                body["transport"]
            );
            Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
        }
    };
    for _ in 0..10 {
        exec(http.clone()).await?;
    }
    let mut samples = Vec::new();
    for _ in 0..200 {
        samples.push(exec(http.clone()).await?);
    }
    // Stop it the way an operator would (SIGTERM by pid), then wait.
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait()).await;
    if link != "unix" {
        return Ok(vec![Figure {
            name: "exec_http_roundtrip_docker_exec",
            unit: "ms",
            samples,
        }]);
    }
    Ok(vec![
        Figure {
            name: "gateway_idle_rss",
            unit: "MiB",
            samples: rss,
        },
        Figure {
            name: "exec_http_roundtrip",
            unit: "ms",
            samples,
        },
    ])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // As the `beige` binary does: large buffers go back to the kernel when freed.
    beige_core::return_large_allocations();
    let only: Vec<String> = std::env::args().skip(1).collect();
    let want = |n: &str| only.is_empty() || only.iter().any(|o| o == n);
    let image =
        std::env::var("BEIGE_TEST_IMAGE").unwrap_or_else(|_| "beige-test-busybox:latest".into());
    let shim = PathBuf::from(
        std::env::var("BEIGE_SHIM")
            .context("set BEIGE_SHIM to the static shim (scripts/build-shim)")?,
    );
    let tmp = std::env::temp_dir().join(format!("beige-bench-{}", std::process::id()));
    let home = BeigeHome::new(&tmp);

    let mut figures = Vec::new();
    if want("exec_roundtrip") {
        figures.extend(exec_roundtrip(&home, &image, &shim).await?);
    }
    if want("tool_call_roundtrip") {
        figures.extend(tool_call_roundtrip_and_floor(&home, &image, &shim).await?);
    }
    if want("turn_overhead") {
        figures.push(turn_overhead(&home, &image, &shim).await?);
    }
    if want("prompt_history") {
        figures.extend(bench_session::figures(&home, &image, &shim).await?);
    }
    if want("concurrent_sessions") {
        figures.extend(concurrent_sessions(&home, &image, &shim).await?);
    }
    if want("gateway_idle_rss") || want("exec_http_roundtrip") {
        figures.extend(daemon_figures(&image, &shim, "unix").await?);
        figures.extend(daemon_figures(&image, &shim, "off").await?);
    }
    if want("concurrent_1000") {
        figures.extend(bench_load::figures(&home, &image, &shim).await?);
    }
    if want("exec_output_10mb") {
        figures.extend(bench_output::figures(&home, &image, &shim).await?);
    }
    if want("egress") {
        figures.extend(bench_egress::figures().await?);
    }
    if want("mcp_call_loop") {
        figures.extend(bench_mcp::figures(&home, &image, &shim).await?);
    }
    if want("store") {
        figures.extend(bench_store::figures(&home).await?);
    }
    if want("sandbox_cold_start") {
        figures.extend(bench_cold::figures(&home, &image, &shim).await?);
    }
    let _ = std::fs::remove_dir_all(&tmp);

    let mut json = Vec::new();
    for f in &figures {
        let (median, p95, p99) = (f.quantile(0.5), f.quantile(0.95), f.quantile(0.99));
        println!(
            "BENCH {} median={median:.3} p95={p95:.3} p99={p99:.3} unit={} n={}",
            f.name,
            f.unit,
            f.samples.len()
        );
        json.push(serde_json::json!({"name": f.name, "median": median, "p95": p95, "p99": p99, "unit": f.unit, "n": f.samples.len()}));
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    Ok(())
}
