//! The Docker backend of [`Sandbox`], on the Engine API through bollard.
//!
//! Owns translating a [`ContainerSpec`] into Engine API calls: listing this home's
//! containers by label, reattaching or recreating them, building the default image when
//! it is missing, running `beige-shim op <name>` through `docker exec`, and recreating a
//! container that died under a running gateway. No `docker` CLI is ever invoked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use beige_protocol::op::{OpReply, OpRequest, EXEC_KILL_GRACE_SECS};
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    BuildImageOptions, CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, RwLock};

use super::spec::{LABEL_AGENT, LABEL_HOME, LABEL_SPEC, SHIM_PATH, WORKSPACE};
use super::{ContainerSpec, OpOutcome, ReconcileReport, RestartNotice, Sandbox, SandboxError};
use crate::config::DEFAULT_IMAGE;

/// The Dockerfile of the default image `beige-sandbox:latest`.
pub const DEFAULT_DOCKERFILE: &str = include_str!("../../assets/sandbox.Dockerfile");

/// Largest op reply accepted from the shim (exec output is capped inside the container,
/// images are at most 5 MiB before base64).
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// Sandboxes as Docker containers on the local (or `DOCKER_HOST`) engine.
#[derive(Debug, Clone)]
pub struct DockerSandbox {
    docker: Docker,
    home_hash: String,
    /// Base image for building `beige-sandbox:*` (build argument `BASE`).
    build_base: Option<String>,
    specs: Arc<RwLock<HashMap<String, ContainerSpec>>>,
    /// Serialises recreation per agent so two calls never both recreate.
    recreate: Arc<Mutex<()>>,
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
    pub async fn connect(home_hash: impl Into<String>) -> Result<Self, SandboxError> {
        let unavailable = |e: bollard::errors::Error| SandboxError::DockerUnavailable {
            message: e.to_string(),
        };
        let docker = Docker::connect_with_local_defaults().map_err(unavailable)?;
        let docker = docker.negotiate_version().await.map_err(unavailable)?;
        docker.ping().await.map_err(unavailable)?;
        Ok(Self {
            docker,
            home_hash: home_hash.into(),
            build_base: None,
            specs: Arc::default(),
            recreate: Arc::default(),
        })
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
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_HOME}={}", self.home_hash)],
        )]);
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
        // A container of the same name may exist (stopped, or from a crash): replace it.
        self.remove(&spec.name).await?;
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
            .map_err(docker_err(format!("create container {}", spec.name)))?;
        self.docker
            .start_container(&spec.name, None::<StartContainerOptions>)
            .await
            .map_err(docker_err(format!("start container {}", spec.name)))?;
        tracing::info!(agent = %spec.agent, container = %spec.name, "sandbox created");
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
        self.create_and_start(spec).await?;
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
                    cmd: Some(vec![
                        SHIM_PATH.to_string(),
                        "op".to_string(),
                        request.name().to_string(),
                    ]),
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
        Ok(serde_json::from_slice::<OpReply>(&stdout).map_err(|e| {
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
    async fn reconcile(&self, specs: Vec<ContainerSpec>) -> Result<ReconcileReport, SandboxError> {
        self.ensure_images(&specs).await?;
        let mut report = ReconcileReport::default();
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
                    let named = c
                        .names
                        .as_ref()
                        .map(|n| n.iter().any(|n| n.trim_start_matches('/') == spec.name))
                        .unwrap_or(false);
                    if running && same && named && !keep.contains(&agent) {
                        keep.push(agent);
                    } else {
                        self.remove(&id).await?;
                    }
                }
            }
        }
        for spec in &specs {
            if keep.contains(&spec.agent) {
                tracing::info!(agent = %spec.agent, container = %spec.name, "sandbox reattached");
                report.reattached.push(spec.agent.clone());
            } else {
                self.create_and_start(spec).await?;
                report.created.push(spec.agent.clone());
            }
        }
        *self.specs.write().await = specs.into_iter().map(|s| (s.agent.clone(), s)).collect();
        Ok(report)
    }

    async fn run_op(&self, agent: &str, request: &OpRequest) -> Result<OpOutcome, SandboxError> {
        let spec = self.spec_of(agent).await?;
        let limit = match request {
            OpRequest::Exec(e) => e.timeout_secs.saturating_add(EXEC_KILL_GRACE_SECS + 30),
            _ => 120,
        };
        let timeout = |_| SandboxError::Timeout {
            agent: agent.to_string(),
            op: request.name().to_string(),
            secs: limit,
        };
        let first = tokio::time::timeout(Duration::from_secs(limit), self.exec_op(&spec, request))
            .await
            .map_err(timeout)?;
        match first {
            Ok(reply) => Ok(OpOutcome {
                reply: reply?,
                restarted: None,
            }),
            Err(e) if matches!(status_of(&e), Some(404) | Some(409)) => {
                // The container is gone or stopped: bring it back, then retry once.
                let restarted = self.revive(&spec).await?;
                if restarted.is_none() {
                    return Err(docker_err(format!(
                        "run `{}` in {}",
                        request.name(),
                        spec.name
                    ))(e));
                }
                let reply =
                    tokio::time::timeout(Duration::from_secs(limit), self.exec_op(&spec, request))
                        .await
                        .map_err(timeout)?
                        .map_err(docker_err(format!(
                            "run `{}` in {}",
                            request.name(),
                            spec.name
                        )))??;
                Ok(OpOutcome { reply, restarted })
            }
            Err(e) => Err(docker_err(format!(
                "run `{}` in {}",
                request.name(),
                spec.name
            ))(e)),
        }
    }

    async fn remove_all(&self) -> Result<(), SandboxError> {
        for c in self.list_own().await? {
            if let Some(id) = c.id {
                self.remove(&id).await?;
            }
        }
        self.specs.write().await.clear();
        Ok(())
    }
}

/// `beige-sandbox` and `beige-sandbox:<tag>` are built by the gateway when missing.
pub fn is_default_image(image: &str) -> bool {
    image == "beige-sandbox" || image.starts_with("beige-sandbox:")
}

/// The Engine API body for a spec.
pub fn engine_body(spec: &ContainerSpec) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        hostname: Some(spec.hostname.clone()),
        user: Some(spec.user.clone()),
        working_dir: Some(spec.working_dir.clone()),
        entrypoint: Some(spec.entrypoint.clone()),
        cmd: Some(Vec::new()),
        env: Some(spec.env.clone()),
        labels: Some(spec.labels.clone().into_iter().collect()),
        network_disabled: None,
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        tty: Some(false),
        host_config: Some(HostConfig {
            binds: Some(spec.mounts.iter().map(|m| m.bind()).collect()),
            network_mode: Some(spec.network.clone()),
            cap_drop: Some(spec.cap_drop.clone()),
            cap_add: if spec.cap_add.is_empty() {
                None
            } else {
                Some(spec.cap_add.clone())
            },
            security_opt: Some(spec.security_opt.clone()),
            memory: Some(spec.memory_bytes),
            memory_swap: Some(spec.memory_swap_bytes),
            pids_limit: Some(spec.pids_limit),
            nano_cpus: spec.nano_cpus,
            readonly_rootfs: Some(spec.read_only_root),
            tmpfs: if spec.tmpfs.is_empty() {
                None
            } else {
                Some(spec.tmpfs.clone().into_iter().collect())
            },
            init: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
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
