//! Cold-start figures for the benchmark harness, each beside its floor measured in the
//! same run.
//!
//! - `docker_create_start` (floor): Docker's own create + start of the same image with
//!   no beige options (`sleep`, network none), through bollard; its parts
//!   `docker_create` and `docker_start`.
//! - `sandbox_cold_start`: a fresh Docker sandbox for one agent, from
//!   [`Sandbox::reconcile`] (nothing of the agent exists) to its first `exec true`
//!   answered, straight on the backend (no gateway build around it). Its parts, from
//!   the engine's own event times: `…_create` (reconcile called → the engine's
//!   `create` event: the calls before the create and the create itself), `…_start`
//!   (`create` → `start` event), `…_hello` (`start` event → the link is up: PID 1 dialled,
//!   was verified and answered the hello) and `…_first_exec` (link up → `exec true`
//!   answered).
//! - `warm_pool_first_exec` (beside `warm_pool_exec_floor`, an `exec` over a link that
//!   is up): see [`warm_pool`].
//! - `sandbox_cold_start_gateway`: the old figure, a whole gateway built from config to
//!   its first `exec` through `Gateway::call_tool` (gateway build included).
//!
//! Floor and sandbox samples alternate, so a change in the machine's load falls on both.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use beige_core::api::tools::ToolContext;
use beige_core::sandbox::docker::{DockerOptions, DockerSandbox};
use beige_core::sandbox::{NoHost, Sandbox as _, SandboxSpec, Transport};
use beige_core::{BeigeHome, Gateway};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, EventsOptions, RemoveContainerOptions, StartContainerOptions,
};
use futures_util::StreamExt;

use super::Figure;

/// Rounds of (floor, sandbox); the first [`WARMUP`] are not counted.
const ROUNDS: usize = 14;
const WARMUP: usize = 2;
/// Label of the floor's containers (with the installation label, so only this run's
/// containers are ever removed).
const FLOOR_LABEL: &str = "io.beige.bench";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn figure(name: &'static str, samples: Vec<f64>) -> Figure {
    Figure {
        name,
        unit: "ms",
        samples,
    }
}

/// Wall-clock nanoseconds since the epoch (the engine's events carry the same clock).
fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The times (ns since the epoch) of the `create` and `start` events of the container
/// named `name` at or after `after`, read from `events` until both came or 5 s passed.
async fn create_and_start_events(
    events: &mut (impl futures_util::Stream<
        Item = Result<bollard::models::EventMessage, bollard::errors::Error>,
    > + Unpin),
    name: &str,
    after: i64,
) -> anyhow::Result<(i64, i64)> {
    let (mut create, mut start) = (None, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while create.is_none() || start.is_none() {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .context("no create/start event within 5 s")?
            .context("the event stream ended")??;
        let named = event
            .actor
            .as_ref()
            .and_then(|a| a.attributes.as_ref())
            .and_then(|a| a.get("name"))
            .is_some_and(|n| n == name);
        // Events of the previous sample's container (same name) come first.
        if !named || event.time_nano.unwrap_or(0) < after {
            continue;
        }
        match event.action.as_deref() {
            Some("create") => create = event.time_nano,
            Some("start") => start = event.time_nano,
            _ => {}
        }
    }
    Ok((create.unwrap_or(0), start.unwrap_or(0)))
}

/// One floor sample: create and start a plain container, then remove it (not timed).
async fn floor_once(
    docker: &bollard::Docker,
    image: &str,
    installation: &str,
    round: usize,
) -> anyhow::Result<(f64, f64)> {
    let name = format!("beige-bench-floor-{}-{round}", std::process::id());
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(vec!["sleep".into(), "3600".into()]),
        labels: Some(HashMap::from([
            (FLOOR_LABEL.to_string(), "floor".to_string()),
            (
                "io.beige.installation".to_string(),
                installation.to_string(),
            ),
        ])),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let t = Instant::now();
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            body,
        )
        .await?;
    let created = t.elapsed();
    docker
        .start_container(&name, None::<StartContainerOptions>)
        .await?;
    let started = t.elapsed();
    docker
        .remove_container(
            &name,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await?;
    Ok((ms(created), ms(started - created)))
}

/// The parts of one sandbox sample, in ms.
struct ColdSample {
    total: f64,
    create: f64,
    start: f64,
    hello: f64,
    first_exec: f64,
}

/// One sandbox sample: reconcile `specs` on a sandbox with no container, then the
/// first `exec true`; the container is removed afterwards (not timed).
async fn sandbox_once(
    sandbox: &DockerSandbox,
    specs: &[SandboxSpec],
    name: &str,
    exec: &beige_core::sandbox::op::OpRequest,
) -> anyhow::Result<ColdSample> {
    let hub = sandbox.link_hub().clone();
    let name = name.to_string();
    let mut events = sandbox.client().events(Some(EventsOptions {
        since: Some(format!("{}", now_nanos() / 1_000_000_000 - 1)),
        filters: Some(HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            ("container".to_string(), vec![name.clone()]),
        ])),
        ..Default::default()
    }));
    let up = tokio::spawn(async move {
        hub.wait_connected("bench", Duration::from_secs(10))
            .await
            .then(Instant::now)
    });
    // Let the waiter subscribe before anything starts.
    tokio::task::yield_now().await;
    let wall0 = now_nanos();
    let t0 = Instant::now();
    sandbox
        .reconcile(specs.to_vec(), Arc::new(NoHost))
        .await
        .context("reconcile")?;
    let out = sandbox.run_op("bench", exec).await?;
    let total = t0.elapsed();
    anyhow::ensure!(
        out.transport == Transport::LINK_UNIX,
        "the first exec went over {:?}",
        out.transport
    );
    let up = up.await?.context("the link did not come up")?;
    let (create, start) = create_and_start_events(&mut events, &name, wall0).await?;
    let nanos_ms = |a: i64, b: i64| (b - a) as f64 / 1e6;
    let hello = ms(up - t0) - nanos_ms(wall0, start);
    Ok(ColdSample {
        total: ms(total),
        create: nanos_ms(wall0, create),
        start: nanos_ms(create, start),
        hello,
        first_exec: ms(total) - ms(up - t0),
    })
}

/// Removes the sandbox's container and waits until its link is down.
async fn clear(sandbox: &DockerSandbox) -> anyhow::Result<()> {
    sandbox.remove_all().await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sandbox.link_hub().is_connected("bench") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

pub async fn figures(home: &BeigeHome, image: &str, shim: &Path) -> anyhow::Result<Vec<Figure>> {
    let shim = shim.to_path_buf();
    // A gateway computes the agent's spec from config (and measures the old figure).
    let mut gateway_samples = Vec::new();
    let mut specs = Vec::new();
    let mut config = None;
    let mut name = String::new();
    for _ in 0..6 {
        let t = Instant::now();
        let (gw, backend) = super::gateway_and_sandbox(home, image, &shim, "unix").await?;
        let out = gw
            .call_tool("bench", super::exec_true()?, ToolContext::default())
            .await?;
        gateway_samples.push(ms(t.elapsed()));
        anyhow::ensure!(!out.is_error, "exec true failed: {}", out.joined_text());
        specs = gw.specs().to_vec();
        config = Some(gw.config().clone());
        name = backend
            .container_spec("bench")
            .await
            .context("no container spec")?
            .name;
        gw.shutdown().await?;
    }
    let config = config.context("no gateway was built")?;
    let exec = beige_core::sandbox::to_request(
        "bench",
        &config.agents["bench"].sandbox,
        &super::exec_true()?,
        &ToolContext::default(),
    );

    let (installation, _) = home.ensure_installation_id()?;
    let sandbox = DockerSandbox::connect(installation.as_str()).await?;
    sandbox.configure(
        DockerOptions::default()
            .shim(&shim)
            .resolve(&config, home)?,
    );
    let docker = sandbox.client().clone();

    let mut floor_create = Vec::new();
    let mut floor_start = Vec::new();
    let mut floor = Vec::new();
    let mut cold = Vec::new();
    let (mut create, mut start, mut hello, mut first_exec) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let one_floor = || floor_once(&docker, image, installation.as_str(), round);
        let (f, s) = if round % 2 == 0 {
            let f = one_floor().await?;
            let s = sandbox_once(&sandbox, &specs, &name, &exec).await?;
            (f, s)
        } else {
            let s = sandbox_once(&sandbox, &specs, &name, &exec).await?;
            let f = one_floor().await?;
            (f, s)
        };
        clear(&sandbox).await?;
        if round < WARMUP {
            continue;
        }
        floor_create.push(f.0);
        floor_start.push(f.1);
        floor.push(f.0 + f.1);
        cold.push(s.total);
        create.push(s.create);
        start.push(s.start);
        hello.push(s.hello);
        first_exec.push(s.first_exec);
    }
    clear(&sandbox).await?;
    let pooled = warm_pool(home, &shim, &config, &specs, &exec).await?;
    Ok(vec![
        figure("docker_create_start", floor),
        figure("docker_create", floor_create),
        figure("docker_start", floor_start),
        figure("sandbox_cold_start", cold),
        figure("sandbox_cold_start_create", create),
        figure("sandbox_cold_start_start", start),
        figure("sandbox_cold_start_hello", hello),
        figure("sandbox_cold_start_first_exec", first_exec),
        figure("sandbox_cold_start_gateway", gateway_samples),
    ]
    .into_iter()
    .chain(pooled)
    .collect())
}

/// `warm_pool_first_exec`: the agent's container is gone (removed behind the gateway's
/// back, as if it died) and the next `exec true` recreates it from a ready spare
/// (`sandbox.warmPool: 1`): time of that call. Beside it, `warm_pool_exec_floor`: the
/// next `exec true` on the same container, over the link that is up.
pub async fn warm_pool(
    home: &BeigeHome,
    shim: &Path,
    config: &beige_core::config::Config,
    specs: &[SandboxSpec],
    exec: &beige_core::sandbox::op::OpRequest,
) -> anyhow::Result<Vec<Figure>> {
    let mut config = config.clone();
    if let Some(agent) = config.agents.get_mut("bench") {
        agent.sandbox.warm_pool = 1;
    }
    let (installation, _) = home.ensure_installation_id()?;
    let sandbox = DockerSandbox::connect(installation.as_str()).await?;
    sandbox.configure(DockerOptions::default().shim(shim).resolve(&config, home)?);
    sandbox.reconcile(specs.to_vec(), Arc::new(NoHost)).await?;
    let name = sandbox
        .container_spec("bench")
        .await
        .context("no container spec")?
        .name;
    let (mut first, mut floor) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let deadline = Instant::now() + Duration::from_secs(20);
        while sandbox.warm_spares("bench").await < 1 {
            anyhow::ensure!(Instant::now() < deadline, "no spare became ready in 20 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sandbox
            .client()
            .remove_container(
                &name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await?;
        while sandbox.link_hub().is_connected("bench") {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = Instant::now();
        let out = sandbox.run_op("bench", exec).await?;
        let took = ms(t.elapsed());
        anyhow::ensure!(out.restarted.is_some(), "the container was not recreated");
        anyhow::ensure!(
            out.transport == Transport::LINK_UNIX,
            "the first exec went over {:?}",
            out.transport
        );
        let t = Instant::now();
        sandbox.run_op("bench", exec).await?;
        let next = ms(t.elapsed());
        if round >= WARMUP {
            first.push(took);
            floor.push(next);
        }
    }
    sandbox.remove_all().await?;
    Ok(vec![
        figure("warm_pool_first_exec", first),
        figure("warm_pool_exec_floor", floor),
    ])
}
