//! The [`Gateway`] trait — the single entry point every channel and embedder uses — and
//! [`LocalGateway`], the in-process engine.
//!
//! Owns wiring config, home, shim and sandbox together at start-up (prepare each agent's
//! folders, compute container specs, reconcile containers) and routing calls to the
//! right agent. Later layers (policy, audit, hooks, the agent loop, sessions) plug in
//! here so that every channel gets them identically.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use crate::config::{AgentConfig, Config};
use crate::home::BeigeHome;
use crate::sandbox::{host, shim, ContainerSpec, ReconcileReport, Sandbox, SandboxError, SandboxUser, SpecInput};
use crate::tools::{run_core_tool, CoreToolCall, ToolContext, ToolOutput};

/// Errors at the gateway boundary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    #[error("unknown agent '{agent}'; configured agents: {known}")]
    UnknownAgent { agent: String, known: String },
    #[error(transparent)]
    InvalidCall(#[from] crate::tools::InvalidCall),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// What a channel may know about an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    pub name: String,
    /// `provider/model`.
    pub model: String,
    pub fallback_models: Vec<String>,
    pub tools: Vec<String>,
    pub skills: Vec<String>,
    pub workspace_dir: PathBuf,
}

/// What channels and embedders talk to. Implemented in process by [`LocalGateway`].
#[async_trait]
pub trait Gateway: Send + Sync {
    /// The configured agents, in config order.
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError>;

    /// Run one core tool (`read`, `write`, `patch`, `exec`) in an agent's sandbox, through
    /// the same path the model's calls take.
    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError>;
}

/// Builds a [`LocalGateway`].
#[derive(Debug)]
pub struct GatewayBuilder {
    config: Config,
    home: BeigeHome,
    sandbox: Option<Arc<dyn Sandbox>>,
    shim: Option<PathBuf>,
}

impl GatewayBuilder {
    pub fn new(config: Config, home: BeigeHome) -> Self {
        Self {
            config,
            home,
            sandbox: None,
            shim: None,
        }
    }

    /// Use this sandbox backend instead of connecting to Docker.
    pub fn sandbox(mut self, sandbox: Arc<dyn Sandbox>) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// Use this shim binary (still checked to be static).
    pub fn shim(mut self, path: impl Into<PathBuf>) -> Self {
        self.shim = Some(path.into());
        self
    }

    /// Prepare every agent's folders and bring its sandbox up (reattaching a running one
    /// with the same spec).
    pub async fn build(self) -> Result<LocalGateway, GatewayError> {
        let shim = match self.shim {
            Some(p) => {
                shim::check_static(&p)?;
                p
            }
            None => shim::locate(self.config.sandbox.shim.as_deref())?,
        };
        let sandbox: Arc<dyn Sandbox> = match self.sandbox {
            Some(s) => s,
            None => connect_default(&self.home, &self.config).await?,
        };
        let specs = compute_specs(&self.config, &self.home, &shim)?;
        let report = sandbox.reconcile(specs.clone()).await?;
        Ok(LocalGateway {
            inner: Arc::new(Inner {
                config: self.config,
                home: self.home,
                sandbox,
                specs,
                report,
            }),
        })
    }
}

#[cfg(feature = "docker")]
async fn connect_default(home: &BeigeHome, config: &Config) -> Result<Arc<dyn Sandbox>, SandboxError> {
    let docker = crate::sandbox::docker::DockerSandbox::connect(home.hash())
        .await?
        .with_build_base(config.sandbox.base_image.clone());
    Ok(Arc::new(docker))
}

#[cfg(not(feature = "docker"))]
async fn connect_default(_: &BeigeHome, _: &Config) -> Result<Arc<dyn Sandbox>, SandboxError> {
    Err(SandboxError::DockerUnavailable {
        message: "beige-core was built without the `docker` feature; pass a sandbox to GatewayBuilder::sandbox".into(),
    })
}

/// The workspace folder of an agent: `workspaceDir` or `<home>/agents/<name>/workspace`.
pub fn agent_workspace(home: &BeigeHome, name: &str, agent: &AgentConfig) -> PathBuf {
    agent
        .workspace_dir
        .clone()
        .unwrap_or_else(|| home.default_workspace(name))
}

/// Prepare each agent's folders on the host and compute its container spec.
pub fn compute_specs(
    config: &Config,
    home: &BeigeHome,
    shim: &std::path::Path,
) -> Result<Vec<ContainerSpec>, SandboxError> {
    let mut specs = Vec::with_capacity(config.agents.len());
    for (name, agent) in &config.agents {
        let workspace = agent_workspace(home, name, agent);
        let configured = agent.sandbox.user.as_deref().and_then(SandboxUser::parse);
        let user = host::prepare_agent(home, name, &workspace, configured)?;
        specs.push(ContainerSpec::for_agent(&SpecInput {
            home,
            agent: name,
            config: agent,
            workspace,
            shim: shim.to_path_buf(),
            user,
            tool_packages: Vec::new(),
            skills: Vec::new(),
        })?);
    }
    Ok(specs)
}

/// The in-process gateway. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LocalGateway {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    home: BeigeHome,
    sandbox: Arc<dyn Sandbox>,
    specs: Vec<ContainerSpec>,
    report: ReconcileReport,
}

impl LocalGateway {
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn home(&self) -> &BeigeHome {
        &self.inner.home
    }

    /// The container specs the gateway started with.
    pub fn specs(&self) -> &[ContainerSpec] {
        &self.inner.specs
    }

    /// What start-up did to the containers.
    pub fn reconcile_report(&self) -> &ReconcileReport {
        &self.inner.report
    }

    /// Stop: remove the sandboxes unless `gateway.keepSandboxes` is set.
    pub async fn shutdown(&self) -> Result<(), GatewayError> {
        if !self.inner.config.gateway.keep_sandboxes {
            self.inner.sandbox.remove_all().await?;
        }
        Ok(())
    }

    fn agent(&self, name: &str) -> Result<&AgentConfig, GatewayError> {
        self.inner
            .config
            .agents
            .get(name)
            .ok_or_else(|| GatewayError::UnknownAgent {
                agent: name.to_string(),
                known: self
                    .inner
                    .config
                    .agents
                    .keys()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

#[async_trait]
impl Gateway for LocalGateway {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        let model = |m: &crate::config::ModelRef| format!("{}/{}", m.provider, m.model);
        Ok(self
            .inner
            .config
            .agents
            .iter()
            .map(|(name, a)| AgentInfo {
                name: name.clone(),
                model: model(&a.model),
                fallback_models: a.fallback_models.iter().map(model).collect(),
                tools: a.tools.clone(),
                skills: a.skills.clone(),
                workspace_dir: agent_workspace(&self.inner.home, name, a),
            })
            .collect())
    }

    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        let config = self.agent(agent)?;
        // Policy, hooks and audit wrap this call (tools-as-CLIs issue).
        let out = run_core_tool(
            self.inner.sandbox.as_ref(),
            agent,
            &config.sandbox,
            &call,
            &ctx,
        )
        .await?;
        Ok(out)
    }
}
