//! The Docker backend of [`Sandbox`], on the Engine API through bollard.
//!
//! Owns what only Docker needs: the static shim (located and checked, bind-mounted at
//! `/beige/shim`), the launcher folders (`/tools/bin/<tool>` → the shim), the
//! `run/<agent>` folders, the translation of a [`SandboxSpec`] into a container
//! ([`body`]), the shim link, and each agent's tool endpoint `run/<agent>/gateway.sock`
//! (the crate's private `socket` module), whose calls go to the [`SandboxHost`]. And the Engine API calls:
//! listing this
//! installation's containers by label (`io.beige.installation`; containers of other
//! installations are never touched, even when their `BEIGE_HOME` has the same path),
//! migrating containers made before installation ids (see
//! [`DockerSandbox::with_legacy_home`]), reattaching or recreating them (checking the
//! `extraMounts` sources again before every creation), building the default image when
//! it is missing, running core-tool operations — over the shim link when it is up
//! ([`LinkHub`]; this module starts its Unix listener or its attach streams and
//! tells it PID 1's host pid), else through `docker exec` of `beige-shim op <name>` —
//! and recreating a container that died under a running gateway (from a spare of its
//! warm pool when it has one, in the private module `pool`). No `docker` CLI is ever invoked.

pub mod body;
mod endpoint;
mod pool;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use beige_protocol::op::{OpReply, OpRequest, EXEC_KILL_GRACE_SECS};
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{
    BuildImageOptions, CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, RwLock};

/// Bounds of each agent's tool socket ([`DockerOptions::socket_limits`]).
pub use crate::socket::SocketLimits;
pub use body::{engine_body, BodyInput, ContainerSpec, LINK_CAPS, ROOT_CAP_DROP};

use super::link::{LinkError, LinkHub, PeerVerifier, UnixListenerHandle};
use super::spec::{LABEL_AGENT, LABEL_HOME, LABEL_INSTALLATION, LABEL_SPEC, SHIM_PATH, WORKSPACE};
use super::{
    OpOutcome, ReconcileReport, RestartNotice, Sandbox, SandboxError, SandboxHost, SandboxSpec,
    SandboxStatus, Transport,
};
use crate::config::{Config, LinkMode, DEFAULT_IMAGE};
use crate::home::BeigeHome;

/// The Dockerfile of the default image `beige-sandbox:latest`.
pub const DEFAULT_DOCKERFILE: &str = include_str!("../../../assets/sandbox.Dockerfile");

/// Largest op reply accepted from the shim (exec output is capped inside the container,
/// images are at most 5 MiB before base64).
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// Sandboxes as Docker containers on the local (or `DOCKER_HOST`) engine.
#[derive(Debug, Clone)]
pub struct DockerSandbox {
    docker: Docker,
    /// The installation id: the `io.beige.installation` label of every container this
    /// sandbox creates, lists, reattaches or removes.
    installation: String,
    /// Set by [`DockerSandbox::with_legacy_home`]: containers of this home made before
    /// installation ids may be migrated.
    legacy: Option<LegacyHome>,
    /// Base image for building `beige-sandbox:*` (build argument `BASE`).
    build_base: Option<String>,
    specs: Arc<RwLock<HashMap<String, ContainerSpec>>>,
    /// Serialises recreation per agent so two calls never both recreate.
    recreate: Arc<Mutex<()>>,
    links: Arc<Links>,
    /// What [`DockerSandbox::configure`] set: the shim, `BEIGE_HOME`, link modes.
    setup: Arc<std::sync::RwLock<Option<Setup>>>,
    /// Each agent's tool endpoint.
    endpoints: Arc<endpoint::Endpoints>,
    /// Spare containers of agents with a warm pool ([`pool`]).
    pool: Arc<pool::Pool>,
}

/// The Docker backend's options, for [`crate::GatewayBuilder::docker`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DockerOptions {
    /// The static shim (checked to be static). `None`: located — `BEIGE_SHIM`, the
    /// config's `sandbox.shim`, then `beige-shim` next to the executable or in
    /// `target/shim/` above it ([`super::shim::locate`]).
    pub shim: Option<PathBuf>,
    /// Bounds of the agents' tool sockets.
    pub socket_limits: SocketLimits,
    /// Migrate the containers this home had before installation ids
    /// ([`DockerSandbox::with_legacy_home`]). `None`: the gateway's home (for the
    /// backend the builder connects; one given to it keeps its own).
    pub legacy_home: Option<BeigeHome>,
    /// Base image for building `beige-sandbox:*`. `None`: the config's
    /// `sandbox.baseImage` (for the backend the builder connects).
    pub build_base: Option<String>,
}

impl DockerOptions {
    /// Use this shim binary (still checked to be static).
    pub fn shim(mut self, path: impl Into<PathBuf>) -> Self {
        self.shim = Some(path.into());
        self
    }

    /// Bounds of the agents' tool sockets.
    pub fn socket_limits(mut self, limits: SocketLimits) -> Self {
        self.socket_limits = limits;
        self
    }

    /// Migrate the containers `home` had before installation ids.
    pub fn legacy_home(mut self, home: BeigeHome) -> Self {
        self.legacy_home = Some(home);
        self
    }

    /// Build `beige-sandbox:*` images from this base image.
    pub fn build_base(mut self, base: impl Into<String>) -> Self {
        self.build_base = Some(base.into());
        self
    }

    /// Locate and check the shim and read the agents' link modes from `config`: what
    /// [`DockerSandbox::configure`] needs, resolved before anything is started so that
    /// an unusable shim stops the gateway first.
    pub fn resolve(&self, config: &Config, home: &BeigeHome) -> Result<Setup, SandboxError> {
        let shim = match &self.shim {
            Some(p) => {
                super::shim::check_static(p)?;
                p.clone()
            }
            None => super::shim::locate(config.sandbox.shim.as_deref())?,
        };
        Ok(Setup {
            home: home.clone(),
            shim,
            socket_limits: self.socket_limits,
            links: config
                .agents
                .iter()
                .map(|(name, agent)| (name.clone(), agent.sandbox.link))
                .collect(),
            warm_pools: config
                .agents
                .iter()
                .map(|(name, agent)| (name.clone(), usize::from(agent.sandbox.warm_pool)))
                .collect(),
        })
    }
}

/// What a [`DockerSandbox`] needs from the gateway before it can reconcile
/// ([`DockerOptions::resolve`]).
#[derive(Debug, Clone)]
pub struct Setup {
    home: BeigeHome,
    shim: PathBuf,
    socket_limits: SocketLimits,
    /// `sandbox.link` per agent (absent: the default).
    links: HashMap<String, LinkMode>,
    /// `sandbox.warmPool` per agent (absent: none).
    warm_pools: HashMap<String, usize>,
}

impl Setup {
    /// The static shim this setup mounts.
    pub fn shim(&self) -> &Path {
        &self.shim
    }

    /// The container of `spec` under this setup.
    pub fn container(&self, spec: &SandboxSpec) -> ContainerSpec {
        let agent = spec.agent.as_str();
        ContainerSpec::from_spec(
            spec,
            &BodyInput {
                shim: &self.shim,
                launchers: self.home.launchers_dir(agent),
                run_dir: self.home.run_dir(agent),
                link: self.links.get(agent).copied().unwrap_or_default(),
            },
        )
    }
}

/// How containers of a home were recognised before installation ids.
#[derive(Debug, Clone)]
struct LegacyHome {
    /// [`crate::home::BeigeHome::hash`]: their `io.beige.home` label.
    hash: String,
    /// `<BEIGE_HOME>/agents`, where the default workspaces are.
    agents_dir: PathBuf,
}

/// The shim links of this gateway's sandboxes and the tasks that carry them.
#[derive(Debug, Default)]
struct Links {
    hub: LinkHub,
    /// Unix carrier: one listener per agent.
    listeners: std::sync::Mutex<HashMap<String, UnixListenerHandle>>,
    /// Attach carrier: one task per agent re-attaching while the container lives.
    attachers: std::sync::Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Until when a link is expected to come up (after a start or a reattach), so the
    /// first op waits for it instead of falling back to `docker exec`; with the
    /// number of connections the agent's link had made then.
    expected: std::sync::Mutex<HashMap<String, (Instant, u64)>>,
}

/// How long after a container start (or a gateway start) ops wait for PID 1 to dial in:
/// its reconnect backoff tops out at 2 s.
const LINK_EXPECTED_WITHIN: Duration = Duration::from_secs(3);

/// Answers "which host pid is this agent's PID 1" for the Unix listener.
#[derive(Debug)]
struct InitPids {
    docker: Docker,
    specs: Arc<RwLock<HashMap<String, ContainerSpec>>>,
    pool: Arc<pool::Pool>,
}

#[async_trait]
impl PeerVerifier for InitPids {
    async fn init_pid(&self, agent: &str) -> Option<u32> {
        let name = self.specs.read().await.get(agent)?.name.clone();
        let info = self
            .docker
            .inspect_container(
                &name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .ok()?;
        let state = info.state?;
        if state.running != Some(true) {
            return None;
        }
        state
            .pid
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0)
    }

    async fn spare(&self, agent: &str, pid: u32) -> Option<String> {
        pool::spare_with_pid(&self.docker, &self.pool, agent, pid).await
    }
}

fn docker_err(action: impl Into<String>) -> impl FnOnce(bollard::errors::Error) -> SandboxError {
    let action = action.into();
    move |e| SandboxError::Docker {
        action,
        message: e.to_string(),
    }
}

fn status_of(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

impl DockerSandbox {
    /// Connect to the engine (`DOCKER_HOST` or the local socket) and check it answers.
    /// `installation` is the [`crate::home::InstallationId`] whose containers this
    /// sandbox manages (specs of another installation are refused by `reconcile`).
    pub async fn connect(installation: impl Into<String>) -> Result<Self, SandboxError> {
        let unavailable = |e: bollard::errors::Error| SandboxError::DockerUnavailable {
            message: e.to_string(),
        };
        let docker = Docker::connect_with_local_defaults().map_err(unavailable)?;
        let docker = docker.negotiate_version().await.map_err(unavailable)?;
        docker.ping().await.map_err(unavailable)?;
        Ok(Self {
            docker,
            installation: installation.into(),
            legacy: None,
            build_base: None,
            specs: Arc::default(),
            recreate: Arc::default(),
            links: Arc::default(),
            setup: Arc::default(),
            endpoints: Arc::default(),
            pool: Arc::default(),
        })
    }

    /// Give the sandbox what it needs from the gateway (its home, the shim, the agents'
    /// link modes, the socket limits). [`crate::GatewayBuilder::build`] does this, also
    /// for a `DockerSandbox` given to [`crate::GatewayBuilder::sandbox`]; call it
    /// yourself before [`Sandbox::reconcile`] otherwise.
    pub fn configure(&self, setup: Setup) {
        *self.setup.write().unwrap_or_else(PoisonError::into_inner) = Some(setup);
    }

    fn setup(&self) -> Result<Setup, SandboxError> {
        self.setup
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(SandboxError::NotConfigured {
                backend: "Docker",
                hint: "call DockerSandbox::configure (GatewayBuilder::build does) before reconcile",
            })
    }

    /// The container the sandbox keeps for `agent` (after [`Sandbox::reconcile`]).
    pub async fn container_spec(&self, agent: &str) -> Option<ContainerSpec> {
        self.specs.read().await.get(agent).cloned()
    }

    /// Migrate the containers `home` had before installation ids (labelled with its
    /// path hash `io.beige.home`, without `io.beige.installation`): at `reconcile`, such
    /// a container is removed — to be recreated under the installation id, its
    /// workspace (a bind mount) kept — only when its `/workspace` bind source is this
    /// home's workspace of its agent (the spec's, or the default one for an agent no
    /// longer configured). Any other container with that label belongs to another
    /// installation whose home has the same path, and is left alone.
    pub fn with_legacy_home(mut self, home: &crate::home::BeigeHome) -> Self {
        self.legacy = Some(LegacyHome {
            hash: home.hash(),
            agents_dir: home.agents_dir(),
        });
        self
    }

    /// The installation id this sandbox manages.
    pub fn installation(&self) -> &str {
        &self.installation
    }

    /// Build `beige-sandbox:*` images from this base image instead of the Dockerfile's
    /// default (used offline, with a locally imported Debian base).
    pub fn with_build_base(mut self, base: Option<String>) -> Self {
        self.build_base = base;
        self
    }

    /// The bollard client, for callers that need more (tests, `beige doctor`).
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// The shim links (tests and benchmarks look at recovered results and health).
    pub fn link_hub(&self) -> &LinkHub {
        &self.links.hub
    }

    /// Starts what carries each agent's link: the Unix listener at
    /// `run/<agent>/ctl.sock` or the attach task; stops those of agents not in `specs`.
    fn start_links(&self, specs: &[ContainerSpec]) -> Result<(), SandboxError> {
        let verifier: Arc<dyn PeerVerifier> = Arc::new(InitPids {
            docker: self.docker.clone(),
            specs: self.specs.clone(),
            pool: self.pool.clone(),
        });
        let mut listeners = self
            .links
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        listeners.retain(|agent, _| {
            specs
                .iter()
                .any(|s| &s.agent == agent && s.link == LinkMode::Unix)
        });
        self.links
            .attachers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|agent, task| {
                let keep = specs
                    .iter()
                    .any(|s| &s.agent == agent && s.link == LinkMode::Attach);
                if !keep {
                    task.abort();
                }
                keep
            });
        for spec in specs {
            match spec.link {
                LinkMode::Off => continue,
                LinkMode::Unix => {
                    let Some(run_dir) = spec
                        .mounts
                        .iter()
                        .find(|m| m.container == "/beige/run")
                        .map(|m| m.host.clone())
                    else {
                        continue;
                    };
                    let current = listeners
                        .get(&spec.agent)
                        .map(|l| l.path().starts_with(&run_dir))
                        .unwrap_or(false);
                    if !current {
                        let handle = self
                            .links
                            .hub
                            .listen_unix(&spec.agent, &run_dir, verifier.clone())
                            .map_err(|e| SandboxError::host(run_dir.join("ctl.sock"), e))?;
                        listeners.insert(spec.agent.clone(), handle);
                    }
                }
                LinkMode::Attach => self.start_attach(spec),
            }
            self.expect_link(&spec.agent);
        }
        Ok(())
    }

    fn expect_link(&self, agent: &str) {
        let connects = self.links.hub.status_of(agent).connects;
        self.links
            .expected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                agent.to_string(),
                (Instant::now() + LINK_EXPECTED_WITHIN, connects),
            );
    }

    /// How long an op should wait for the agent's link to come up, and whether the
    /// link that was expected (or, with none expected, any link) came up and has
    /// dropped since — its container most likely died.
    fn link_wait(&self, agent: &str) -> (Duration, bool) {
        let connects = self.links.hub.status_of(agent).connects;
        match self
            .links
            .expected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
        {
            Some((until, before)) if connects == *before => {
                (until.saturating_duration_since(Instant::now()), false)
            }
            Some(_) => (Duration::ZERO, true),
            None => (Duration::ZERO, connects > 0),
        }
    }

    /// (Re)starts the task that attaches to the agent's container and serves the link
    /// over its stdin/stdout, re-attaching after a drop while the container runs.
    fn start_attach(&self, spec: &ContainerSpec) {
        let docker = self.docker.clone();
        let hub = self.links.hub.clone();
        let agent = spec.agent.clone();
        let name = spec.name.clone();
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                let attached = docker
                    .attach_container(
                        &name,
                        Some(bollard::query_parameters::AttachContainerOptions {
                            stdin: true,
                            stdout: true,
                            stderr: false,
                            stream: true,
                            logs: false,
                            ..Default::default()
                        }),
                    )
                    .await;
                match attached {
                    Ok(bollard::container::AttachContainerResults { output, input }) => {
                        backoff = Duration::from_millis(50);
                        let stdout = output.filter_map(|chunk| async move {
                            match chunk {
                                Ok(bollard::container::LogOutput::StdOut { message }) => {
                                    Some(Ok(message))
                                }
                                Ok(_) => None,
                                Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
                            }
                        });
                        let reader = tokio_util::io::StreamReader::new(Box::pin(stdout));
                        hub.serve(&agent, beige_protocol::link::Carrier::Attach, reader, input)
                            .await;
                    }
                    Err(e) => {
                        tracing::debug!(agent, error = %e, "attaching to the sandbox failed");
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        });
        if let Some(old) = self
            .links
            .attachers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(spec.agent.clone(), task)
        {
            old.abort();
        }
    }

    fn stop_links(&self) {
        self.links
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        for (_, task) in self
            .links
            .attachers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
        {
            task.abort();
        }
        self.links.hub.close_all();
    }

    /// Make sure every image the specs use exists, building `beige-sandbox:*` images
    /// from the bundled Dockerfile when missing. Other images are never pulled.
    pub async fn ensure_images(&self, specs: &[ContainerSpec]) -> Result<(), SandboxError> {
        let mut seen = Vec::new();
        for spec in specs {
            if seen.contains(&spec.image) {
                continue;
            }
            seen.push(spec.image.clone());
            match self.docker.inspect_image(&spec.image).await {
                Ok(_) => continue,
                Err(e) if status_of(&e) == Some(404) => {}
                Err(e) => return Err(docker_err(format!("inspect image {}", spec.image))(e)),
            }
            if is_default_image(&spec.image) {
                self.build_default_image(&spec.image).await?;
            } else {
                return Err(SandboxError::ImageMissing {
                    image: spec.image.clone(),
                    hint: format!(
                        "beige never pulls images during a turn. Pull or build it first (`docker pull {0}` or `docker build -t {0} …`), or use the default image {DEFAULT_IMAGE}, which the gateway builds itself.",
                        spec.image
                    ),
                });
            }
        }
        Ok(())
    }

    /// Build the default image from [`DEFAULT_DOCKERFILE`], logging its progress.
    pub async fn build_default_image(&self, tag: &str) -> Result<(), SandboxError> {
        tracing::info!(image = tag, base = ?self.build_base, "building the default sandbox image");
        let context =
            dockerfile_context(DEFAULT_DOCKERFILE).map_err(|e| SandboxError::ImageBuild {
                image: tag.to_string(),
                message: e.to_string(),
            })?;
        let mut buildargs = HashMap::new();
        if let Some(base) = &self.build_base {
            buildargs.insert("BASE".to_string(), base.clone());
        }
        let options = BuildImageOptions {
            dockerfile: "Dockerfile".to_string(),
            t: Some(tag.to_string()),
            rm: true,
            forcerm: true,
            buildargs: Some(buildargs),
            ..Default::default()
        };
        let mut stream = self.docker.build_image(
            options,
            None,
            Some(bollard::body_full(bytes::Bytes::from(context))),
        );
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| SandboxError::ImageBuild {
                image: tag.to_string(),
                message: e.to_string(),
            })?;
            if let Some(err) = info.error {
                return Err(SandboxError::ImageBuild {
                    image: tag.to_string(),
                    message: err,
                });
            }
            if let Some(line) = info
                .stream
                .as_deref()
                .map(str::trim_end)
                .filter(|l| !l.is_empty())
            {
                tracing::info!(target: "beige::sandbox::build", "[sandbox build] {line}");
            }
        }
        tracing::info!(image = tag, "default sandbox image built");
        Ok(())
    }

    async fn list_own(&self) -> Result<Vec<bollard::models::ContainerSummary>, SandboxError> {
        self.list_labelled(&format!("{LABEL_INSTALLATION}={}", self.installation))
            .await
    }

    async fn list_labelled(
        &self,
        label: &str,
    ) -> Result<Vec<bollard::models::ContainerSummary>, SandboxError> {
        let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(docker_err("list containers"))
    }

    async fn remove(&self, name_or_id: &str) -> Result<(), SandboxError> {
        match self
            .docker
            .remove_container(
                name_or_id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(docker_err(format!("remove container {name_or_id}"))(e)),
        }
    }

    async fn create_and_start(&self, spec: &ContainerSpec) -> Result<(), SandboxError> {
        self.create_and_start_as(spec, false).await
    }

    /// [`Self::create_and_start`]; `name_free`: the caller has just seen that no
    /// container has the name (no need to ask again).
    async fn create_and_start_as(
        &self,
        spec: &ContainerSpec,
        name_free: bool,
    ) -> Result<(), SandboxError> {
        // The mount sources as they are now, not as they were when the spec was made.
        spec.recheck_mounts()?;
        // A container of the same name may exist (stopped, or from a crash): replace it,
        // if it is this installation's.
        let existing = if name_free {
            None
        } else {
            Some(
                self.docker
                    .inspect_container(
                        &spec.name,
                        None::<bollard::query_parameters::InspectContainerOptions>,
                    )
                    .await,
            )
        };
        match existing {
            None => {}
            Some(found) => match found {
                Ok(info) => {
                    let owner = info
                        .config
                        .and_then(|c| c.labels)
                        .and_then(|l| l.get(LABEL_INSTALLATION).cloned());
                    if owner.as_deref() != Some(self.installation.as_str()) {
                        return Err(SandboxError::NameTaken {
                            name: spec.name.clone(),
                            owner,
                        });
                    }
                    self.remove(&spec.name).await?;
                }
                Err(e) if status_of(&e) == Some(404) => {}
                Err(e) => return Err(docker_err(format!("inspect container {}", spec.name))(e)),
            },
        }
        if self.claim_spare(spec).await? {
            return Ok(());
        }
        let body = engine_body(spec);
        self.docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(spec.name.clone()),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(|e| match spec.disk_limit_bytes {
                // The engine refuses a root size limit its storage driver cannot keep.
                Some(limit) if mentions_storage_opt(&e) => SandboxError::DiskLimit {
                    agent: spec.agent.clone(),
                    limit: crate::disk::fmt_bytes(limit),
                    message: e.to_string(),
                },
                _ => docker_err(format!("create container {}", spec.name))(e),
            })?;
        self.docker
            .start_container(&spec.name, None::<StartContainerOptions>)
            .await
            .map_err(docker_err(format!("start container {}", spec.name)))?;
        tracing::info!(agent = %spec.agent, container = %spec.name, "sandbox created");
        match spec.link {
            LinkMode::Off => {}
            LinkMode::Unix => self.expect_link(&spec.agent),
            LinkMode::Attach => {
                self.start_attach(spec);
                self.expect_link(&spec.agent);
            }
        }
        Ok(())
    }

    async fn spec_of(&self, agent: &str) -> Result<ContainerSpec, SandboxError> {
        self.specs
            .read()
            .await
            .get(agent)
            .cloned()
            .ok_or_else(|| SandboxError::UnknownAgent {
                agent: agent.to_string(),
            })
    }

    /// If the agent's container is not running, recreate it and say why.
    async fn revive(&self, spec: &ContainerSpec) -> Result<Option<RestartNotice>, SandboxError> {
        let _guard = self.recreate.lock().await;
        let notice = match self
            .docker
            .inspect_container(
                &spec.name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                if state.running == Some(true) {
                    return Ok(None);
                }
                RestartNotice {
                    exit_code: state.exit_code,
                    oom_killed: state.oom_killed.unwrap_or(false),
                    missing: false,
                }
            }
            Err(e) if status_of(&e) == Some(404) => RestartNotice {
                exit_code: None,
                oom_killed: false,
                missing: true,
            },
            Err(e) => return Err(docker_err(format!("inspect container {}", spec.name))(e)),
        };
        tracing::warn!(agent = %spec.agent, ?notice, "sandbox had died; recreating it");
        self.create_and_start_as(spec, notice.missing).await?;
        Ok(Some(notice))
    }

    async fn exec_op(
        &self,
        spec: &ContainerSpec,
        request: &OpRequest,
    ) -> Result<Result<OpReply, SandboxError>, bollard::errors::Error> {
        let exec = self
            .docker
            .create_exec(
                &spec.name,
                CreateExecOptions {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    working_dir: Some(WORKSPACE.to_string()),
                    cmd: Some(op_command(spec, request)),
                    ..Default::default()
                },
            )
            .await?;
        let started = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    ..Default::default()
                }),
            )
            .await?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Ok(Err(self.protocol(
                spec,
                request,
                "the exec started detached",
            )));
        };
        let payload = match serde_json::to_vec(request) {
            Ok(p) => p,
            Err(e) => return Ok(Err(self.protocol(spec, request, &e.to_string()))),
        };
        let write = async move {
            input.write_all(&payload).await?;
            input.write_all(b"\n").await?;
            input.shutdown().await
        };
        let read = async {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            while let Some(chunk) = output.next().await {
                match chunk? {
                    bollard::container::LogOutput::StdOut { message }
                        if stdout.len() + message.len() <= MAX_REPLY_BYTES =>
                    {
                        stdout.extend_from_slice(&message);
                    }
                    bollard::container::LogOutput::StdErr { message }
                        if stderr.len() < 64 * 1024 =>
                    {
                        stderr.extend_from_slice(&message);
                    }
                    _ => {}
                }
            }
            Ok::<_, bollard::errors::Error>((stdout, stderr))
        };
        let (written, read) = tokio::join!(write, read);
        let (stdout, stderr) = read?;
        if stdout.is_empty() {
            let mut why = String::from_utf8_lossy(&stderr).trim().to_string();
            if let Err(e) = written {
                why.push_str(&format!(" (writing the request failed: {e})"));
            }
            if why.is_empty() {
                why = "the shim exited without a reply".into();
            }
            return Ok(Err(self.protocol(spec, request, &why)));
        }
        Ok(beige_protocol::op::decode_reply(stdout).map_err(|e| {
            self.protocol(
                spec,
                request,
                &format!(
                    "unreadable reply ({e}); stderr: {}",
                    String::from_utf8_lossy(&stderr).trim()
                ),
            )
        }))
    }

    fn protocol(&self, spec: &ContainerSpec, request: &OpRequest, message: &str) -> SandboxError {
        SandboxError::Protocol {
            agent: spec.agent.clone(),
            op: request.name().to_string(),
            message: message.to_string(),
        }
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    async fn reconcile(
        &self,
        specs: Vec<SandboxSpec>,
        host: Arc<dyn SandboxHost>,
    ) -> Result<ReconcileReport, SandboxError> {
        let setup = self.setup()?;
        for spec in &specs {
            let label = spec.installation();
            if label != Some(self.installation.as_str()) {
                return Err(SandboxError::Installation {
                    agent: spec.agent.clone(),
                    spec: label.unwrap_or("none").to_string(),
                    sandbox: self.installation.clone(),
                });
            }
        }
        // What the containers mount besides the workspace: the launchers (one symlink
        // to the shim per tool the agent may launch) and `run/<agent>`.
        for spec in &specs {
            super::host::prepare_run_dirs(&setup.home, &spec.agent)?;
            write_launchers(&setup.home.launchers_dir(&spec.agent), &spec.tools)?;
        }
        self.links.hub.set_host(host.clone());
        let containers: Vec<ContainerSpec> = specs.iter().map(|s| setup.container(s)).collect();
        let report = self.reconcile_containers(containers).await?;
        self.endpoints
            .start(&setup.home, &specs, setup.socket_limits, host)?;
        Ok(report)
    }

    async fn run_op(&self, agent: &str, request: &OpRequest) -> Result<OpOutcome, SandboxError> {
        self.run(agent, request, None).await
    }

    async fn run_op_streaming(
        &self,
        agent: &str,
        request: &OpRequest,
        output: super::OutputSink,
    ) -> Result<OpOutcome, SandboxError> {
        self.run(agent, request, Some(output)).await
    }

    async fn spawn(
        &self,
        agent: &str,
        request: beige_protocol::spawn::SpawnRequest,
    ) -> Result<super::SpawnedProcess, SandboxError> {
        let program = request.argv.first().cloned().unwrap_or_default();
        let failed = |message: String| SandboxError::Spawn {
            agent: agent.to_string(),
            program: program.clone(),
            message,
        };
        let spec = self.spec_of(agent).await?;
        if spec.link == LinkMode::Off {
            return Err(failed(
                "processes of their own need the shim link, and this agent has sandbox.linkMode \"off\""
                    .to_string(),
            ));
        }
        let hub = &self.links.hub;
        let wait = self.link_wait(agent).0.max(LINK_EXPECTED_WITHIN);
        if !hub.is_connected(agent) && !hub.wait_connected(agent, wait).await {
            return Err(failed(
                "the sandbox's shim link is not up (see `beige doctor`)".to_string(),
            ));
        }
        hub.spawn(agent, request)
            .await
            .map_err(|e| failed(e.to_string()))
    }

    async fn remove_all(&self) -> Result<(), SandboxError> {
        self.pool.reset(HashMap::new()).await;
        self.endpoints.stop();
        self.stop_links();
        for c in self.list_own().await? {
            if let Some(id) = c.id {
                self.remove(&id).await?;
            }
        }
        self.specs.write().await.clear();
        Ok(())
    }

    async fn detach(&self) {
        self.pool.reset(HashMap::new()).await;
        self.endpoints.stop();
        self.stop_links();
    }

    async fn status(&self, agent: &str) -> SandboxStatus {
        let Some(spec) = self.container_spec(agent).await else {
            return SandboxStatus::unlinked(agent);
        };
        if spec.link == LinkMode::Off {
            return SandboxStatus {
                agent: agent.to_string(),
                container: spec.name,
                link_mode: LinkMode::Off,
                link: None,
                ping_us: None,
            };
        }
        // Ping first, so the status read afterwards carries this round trip.
        let hub = &self.links.hub;
        let ping_us = hub
            .ping(agent, Duration::from_secs(2))
            .await
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let link = hub
            .status()
            .into_iter()
            .find(|l| l.agent == agent)
            .unwrap_or_else(|| super::LinkStatus {
                agent: agent.to_string(),
                ..Default::default()
            });
        SandboxStatus {
            agent: agent.to_string(),
            container: spec.name,
            link_mode: spec.link,
            ping_us: ping_us.filter(|_| link.connected),
            link: Some(link),
        }
    }
}

impl DockerSandbox {
    /// Reattach, recreate or remove containers so that they match `specs`, then start
    /// their links.
    async fn reconcile_containers(
        &self,
        specs: Vec<ContainerSpec>,
    ) -> Result<ReconcileReport, SandboxError> {
        self.ensure_images(&specs).await?;
        let mut report = ReconcileReport::default();
        self.migrate_legacy(&specs, &mut report).await?;
        let sizes = self.setup().map(|s| s.warm_pools).unwrap_or_default();
        self.pool
            .reset(
                specs
                    .iter()
                    .map(|s| (s.agent.clone(), sizes.get(&s.agent).copied().unwrap_or(0)))
                    .collect(),
            )
            .await;
        let existing = self.list_own().await?;
        let wanted: HashMap<&str, &ContainerSpec> =
            specs.iter().map(|s| (s.agent.as_str(), s)).collect();
        let mut keep = Vec::new();
        for c in &existing {
            let labels = c.labels.clone().unwrap_or_default();
            let agent = labels.get(LABEL_AGENT).cloned().unwrap_or_default();
            let id = c.id.clone().unwrap_or_default();
            match wanted.get(agent.as_str()) {
                None => {
                    self.remove(&id).await?;
                    tracing::info!(agent = %agent, "removed the sandbox of an agent no longer configured");
                    report.removed_orphans.push(agent);
                }
                Some(spec) => {
                    let running = c.state.as_ref().map(|s| s.to_string()) == Some("running".into());
                    let same =
                        labels.get(LABEL_SPEC).map(String::as_str) == Some(spec.spec_label());
                    let names: Vec<&str> = c
                        .names
                        .iter()
                        .flatten()
                        .map(|n| n.trim_start_matches('/'))
                        .collect();
                    let named = names.contains(&spec.name.as_str());
                    let spare = names.iter().find(|n| pool::is_spare_of(n, &spec.name));
                    if running && same && named && !keep.contains(&agent) {
                        keep.push(agent);
                    } else if let Some(spare) = spare.filter(|_| {
                        running && same && self.pool.names(&agent).len() < self.pool.size(&agent)
                    }) {
                        // A spare of the current spec (left by a gateway that kept its
                        // sandboxes): still in the pool.
                        self.pool.add(&agent, spare);
                    } else {
                        if let Some(spare) = spare {
                            self.links.hub.drop_parked(spare);
                        }
                        self.remove(&id).await?;
                    }
                }
            }
        }
        // The links' listeners are up before any container starts: a PID 1 that dials
        // before its listener exists waits out its reconnect backoff (50 ms, then 100 ms)
        // before its first op can run. The peer check reads `specs` at accept time.
        *self.specs.write().await = specs.iter().map(|s| (s.agent.clone(), s.clone())).collect();
        self.start_links(&specs)?;
        for spec in &specs {
            if keep.contains(&spec.agent) {
                tracing::info!(agent = %spec.agent, container = %spec.name, "sandbox reattached");
                report.reattached.push(spec.agent.clone());
            } else {
                self.create_and_start(spec).await?;
                report.created.push(spec.agent.clone());
            }
        }
        for spec in &specs {
            self.fill_pool(spec);
        }
        for agent in &report.removed_orphans {
            self.links.hub.drop_agent(agent);
        }
        Ok(report)
    }

    /// Containers of this home from before installation ids: those whose `/workspace`
    /// is this home's are removed (their agents' containers are then created under the
    /// installation id; a removed one of an agent no longer configured is reported as
    /// an orphan), every other one is left alone.
    async fn migrate_legacy(
        &self,
        specs: &[ContainerSpec],
        report: &mut ReconcileReport,
    ) -> Result<(), SandboxError> {
        let Some(legacy) = &self.legacy else {
            return Ok(());
        };
        for c in self
            .list_labelled(&format!("{LABEL_HOME}={}", legacy.hash))
            .await?
        {
            let labels = c.labels.clone().unwrap_or_default();
            if labels.contains_key(LABEL_INSTALLATION) {
                continue;
            }
            let agent = labels.get(LABEL_AGENT).cloned().unwrap_or_default();
            let id = c.id.clone().unwrap_or_default();
            let source = c
                .mounts
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|m| m.destination.as_deref() == Some(WORKSPACE))
                .and_then(|m| m.source.clone())
                .map(PathBuf::from);
            let wanted = specs.iter().find(|s| s.agent == agent);
            let ours = match wanted {
                Some(spec) => spec
                    .mounts
                    .iter()
                    .find(|m| m.container == WORKSPACE)
                    .map(|m| m.host.clone()),
                None if !agent.is_empty() => Some(legacy.agents_dir.join(&agent).join("workspace")),
                None => None,
            };
            let matches = match (&source, &ours) {
                (Some(s), Some(o)) => same_path(s, o),
                _ => false,
            };
            if !matches {
                tracing::info!(
                    agent = %agent,
                    container = %id,
                    workspace = ?source,
                    "left alone a container labelled with this BEIGE_HOME's old path hash: its workspace is not this installation's, so it belongs to another installation whose BEIGE_HOME has the same path"
                );
                continue;
            }
            self.remove(&id).await?;
            if wanted.is_some() {
                tracing::info!(agent = %agent, container = %id, "migrated the sandbox from the path-hash label to this installation's id: removed it to recreate it (the workspace is kept; installed packages and files elsewhere are not)");
            } else {
                tracing::info!(agent = %agent, container = %id, "removed the sandbox (made before installation ids) of an agent no longer configured");
                report.removed_orphans.push(agent);
            }
        }
        Ok(())
    }

    /// Runs an op over the link when it is up, else through `docker exec` (which has no
    /// live output).
    async fn run(
        &self,
        agent: &str,
        request: &OpRequest,
        output: Option<super::OutputSink>,
    ) -> Result<OpOutcome, SandboxError> {
        let spec = self.spec_of(agent).await?;
        let limit = match request {
            OpRequest::Exec(e) => e.timeout_secs.saturating_add(EXEC_KILL_GRACE_SECS + 30),
            _ => 120,
        };
        if spec.link != LinkMode::Off {
            if let Some(outcome) = self.run_over_link(&spec, request, limit, output).await? {
                return Ok(outcome);
            }
        }
        self.links.hub.count_fallback(agent);
        self.run_over_exec(&spec, request, limit).await
    }

    /// Runs the op over the shim link. `Ok(None)`: no link (now or within the window
    /// after a start), take the `docker exec` path.
    async fn run_over_link(
        &self,
        spec: &ContainerSpec,
        request: &OpRequest,
        limit: u64,
        output: Option<super::OutputSink>,
    ) -> Result<Option<OpOutcome>, SandboxError> {
        let agent = spec.agent.as_str();
        let hub = &self.links.hub;
        if hub.is_connected(agent) {
            // The link expected after the last start came: a later loss of it (the
            // container died) must not be waited for.
            self.links
                .expected
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(agent);
        } else {
            let (wait, dropped) = self.link_wait(agent);
            if dropped {
                // The link was up and dropped, with no start since: the container most
                // likely died. Ask the engine once and recreate it (from a spare when
                // the pool has one) instead of first trying a `docker exec` into a
                // container that is gone.
                let Some(notice) = self.revive(spec).await? else {
                    return Ok(None);
                };
                let payload = serde_json::to_vec(request)
                    .map_err(|e| self.protocol(spec, request, &e.to_string()))?;
                return self
                    .run_on_new_container(spec, request, &payload, limit, output, notice)
                    .await
                    .map(Some);
            }
            if wait.is_zero() || !hub.wait_connected(agent, wait).await {
                return Ok(None);
            }
        }
        let Some(carrier) = hub.carrier(agent) else {
            return Ok(None);
        };
        let payload = serde_json::to_vec(request)
            .map_err(|e| self.protocol(spec, request, &e.to_string()))?;
        let timeout = || SandboxError::Timeout {
            agent: agent.to_string(),
            op: request.name().to_string(),
            secs: limit,
        };
        match self
            .link_call(spec, request, &payload, limit, output.clone())
            .await
        {
            Ok(reply) => Ok(Some(OpOutcome {
                reply: reply?,
                restarted: None,
                transport: carrier.into(),
            })),
            Err(LinkError::NotConnected) => Ok(None),
            Err(LinkError::Timeout) => Err(timeout()),
            Err(LinkError::Lost { rebooted }) => {
                // PID 1 went away under the op: did the container die with it?
                let restarted = self.revive(spec).await?;
                let notice = match restarted {
                    Some(notice) => notice,
                    None if rebooted => RestartNotice {
                        exit_code: None,
                        oom_killed: false,
                        missing: false,
                    },
                    None => {
                        return Err(self.protocol(
                            spec,
                            request,
                            "the link to the sandbox dropped while the operation ran and did not come back with its result, so it may or may not have completed: check its effects (with read or exec) before running it again, and see `beige doctor` for the link",
                        ))
                    }
                };
                self.run_on_new_container(spec, request, &payload, limit, output, notice)
                    .await
                    .map(Some)
            }
        }
    }

    /// Runs the op once more on a container just recreated: over its link when it
    /// comes up (a spare's is up at once), else with `docker exec`.
    async fn run_on_new_container(
        &self,
        spec: &ContainerSpec,
        request: &OpRequest,
        payload: &[u8],
        limit: u64,
        output: Option<super::OutputSink>,
        notice: RestartNotice,
    ) -> Result<OpOutcome, SandboxError> {
        let agent = spec.agent.as_str();
        let hub = &self.links.hub;
        let outcome = if hub.wait_connected(agent, LINK_EXPECTED_WITHIN).await {
            let reply = self
                .link_call(spec, request, payload, limit, output)
                .await
                .map_err(|e| self.protocol(spec, request, &e.to_string()))??;
            OpOutcome {
                reply,
                restarted: None,
                transport: hub
                    .carrier(agent)
                    .map(Into::into)
                    .unwrap_or(Transport::DOCKER_EXEC),
            }
        } else {
            self.run_over_exec(spec, request, limit).await?
        };
        Ok(OpOutcome {
            restarted: Some(notice),
            ..outcome
        })
    }

    /// One op over the link under a new id, its reply decoded (an unreadable reply is
    /// the inner error).
    async fn link_call(
        &self,
        spec: &ContainerSpec,
        request: &OpRequest,
        payload: &[u8],
        limit: u64,
        output: Option<super::OutputSink>,
    ) -> Result<Result<OpReply, SandboxError>, LinkError> {
        let hub = &self.links.hub;
        let id = hub.new_id();
        let bytes = hub
            .call(
                &spec.agent,
                &id,
                request.name(),
                payload,
                Duration::from_secs(limit),
                output,
            )
            .await?;
        Ok(beige_protocol::op::decode_reply(bytes).map_err(|e| {
            self.protocol(
                spec,
                request,
                &format!("unreadable reply over the link ({e})"),
            )
        }))
    }

    /// Runs the op with `docker exec`, recreating a dead container once.
    async fn run_over_exec(
        &self,
        spec: &ContainerSpec,
        request: &OpRequest,
        limit: u64,
    ) -> Result<OpOutcome, SandboxError> {
        let agent = spec.agent.as_str();
        let timeout = |_| SandboxError::Timeout {
            agent: agent.to_string(),
            op: request.name().to_string(),
            secs: limit,
        };
        let first = tokio::time::timeout(Duration::from_secs(limit), self.exec_op(spec, request))
            .await
            .map_err(timeout)?;
        let failed = |e| docker_err(format!("run `{}` in {}", request.name(), spec.name))(e);
        match first {
            Ok(reply) => Ok(OpOutcome {
                reply: reply?,
                restarted: None,
                transport: Transport::DOCKER_EXEC,
            }),
            Err(e) if matches!(status_of(&e), Some(404) | Some(409)) => {
                // The container is gone or stopped: bring it back, then retry once.
                let restarted = self.revive(spec).await?;
                if restarted.is_none() {
                    return Err(failed(e));
                }
                // Over the new container's link when it comes up (a spare's at once).
                if spec.link != LinkMode::Off
                    && self
                        .links
                        .hub
                        .wait_connected(agent, LINK_EXPECTED_WITHIN)
                        .await
                {
                    let payload = serde_json::to_vec(request)
                        .map_err(|e| self.protocol(spec, request, &e.to_string()))?;
                    if let Ok(reply) = self.link_call(spec, request, &payload, limit, None).await {
                        return Ok(OpOutcome {
                            reply: reply?,
                            restarted,
                            transport: self
                                .links
                                .hub
                                .carrier(agent)
                                .map(Into::into)
                                .unwrap_or(Transport::DOCKER_EXEC),
                        });
                    }
                }
                let reply =
                    tokio::time::timeout(Duration::from_secs(limit), self.exec_op(spec, request))
                        .await
                        .map_err(timeout)?
                        .map_err(failed)??;
                Ok(OpOutcome {
                    reply,
                    restarted,
                    transport: Transport::DOCKER_EXEC,
                })
            }
            Err(e) => Err(failed(e)),
        }
    }
}

/// The `docker exec` command of an op: `beige-shim op <name>`, which first drops to the
/// agent's uid (with the same empty capability sets and seccomp filter as PID 1's
/// children) when the container runs as root for a non-root agent.
fn op_command(spec: &ContainerSpec, request: &OpRequest) -> Vec<String> {
    let mut cmd = vec![
        SHIM_PATH.to_string(),
        "op".to_string(),
        request.name().to_string(),
    ];
    if let Some(user) = &spec.agent_user {
        cmd.extend(["--drop".to_string(), user.clone()]);
    }
    cmd
}
/// Whether two host paths name the same place: equal once normalised, or once resolved.
fn same_path(a: &Path, b: &Path) -> bool {
    let (a, b) = (crate::home::normalize(a), crate::home::normalize(b));
    if a == b {
        return true;
    }
    match (std::fs::canonicalize(&a), std::fs::canonicalize(&b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// `beige-sandbox` and `beige-sandbox:<tag>` are built by the gateway when missing.
pub fn is_default_image(image: &str) -> bool {
    image == "beige-sandbox" || image.starts_with("beige-sandbox:")
}

/// Whether the engine's answer is about `--storage-opt` (a driver without size limits).
fn mentions_storage_opt(e: &bollard::errors::Error) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("storage-opt") || text.contains("storage opt") || text.contains("quota")
}

/// A tar archive holding just `Dockerfile`.
fn dockerfile_context(dockerfile: &str) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(dockerfile.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, "Dockerfile", dockerfile.as_bytes())?;
    builder.into_inner()
}

/// Make `dir` hold exactly one symlink `<tool> → /beige/shim` per tool.
fn write_launchers(dir: &Path, tools: &[String]) -> Result<(), SandboxError> {
    let err = |p: &Path, e: std::io::Error| SandboxError::host(p, e);
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    for entry in std::fs::read_dir(dir).map_err(|e| err(dir, e))? {
        let entry = entry.map_err(|e| err(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let keep = tools.contains(&name)
            && std::fs::read_link(entry.path())
                .map(|t| t == Path::new(SHIM_PATH))
                .unwrap_or(false);
        if !keep {
            let p = entry.path();
            let removed = if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            removed.map_err(|e| err(&p, e))?;
        }
    }
    for tool in tools {
        let link = dir.join(tool);
        if !link.is_symlink() {
            std::os::unix::fs::symlink(SHIM_PATH, &link).map_err(|e| err(&link, e))?;
        }
    }
    Ok(())
}
