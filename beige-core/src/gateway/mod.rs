//! The [`Gateway`] trait — the single entry point every channel and embedder uses — and
//! [`LocalGateway`], the in-process engine.
//!
//! Owns wiring config, home, shim, plugins, policy, audit and sandbox together at
//! start-up (register plugins, write launchers, compute container specs, reconcile
//! containers, open each agent's tool socket) and the one guarded path every tool call
//! takes, core or plugin, whichever channel it came from:
//! policy → `preToolExec` hooks → audit `started` → run → `postToolExec` hooks → audit
//! `finished`. A denied call is audited once; a call whose audit record cannot be
//! written does not run.

#[cfg(feature = "egress")]
pub(crate) mod egress;
mod error;
mod history;
mod leases;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "http-api")]
mod metrics_listener;
mod outside;
mod people;
mod platform_host;
mod prompt;
mod sandbox_host;
mod serve;
mod spawn;

pub(crate) use beige_client::gateway::{
    Admin, AgentEventStream, AgentInfo, AllowedModel, Gateway, GatewayFull, Sessions,
};
pub(crate) use beige_client::{GatewayError, SandboxStatus};
pub(crate) use prompt::PromptRequest;
pub(crate) use serve::GatewaySlot;
pub use serve::{
    ConfigFile, ConfigSource, LocalGateway, ReloadOutcome, ServeError, Shutdown, Snapshot,
    DEFAULT_DRAIN,
};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use beige_protocol::socket::{SessionContext, ToolRequest, ToolResponse, MAX_RESPONSE_OUTPUT};
use opentelemetry::trace::FutureExt as _;
use opentelemetry::KeyValue;

use crate::agent::router::{model_key, HealthTracker, ModelHealth, Router};
use crate::audit::{
    now_ts, secrets_of, AuditBudget, AuditDecision, AuditError, AuditRecord, AuditSink, AuditType,
    BoundedAudit, JsonlAudit, Phase, Target,
};
use crate::config::{AgentConfig, Config};
use crate::fsutil::validate_cwd;
use crate::home::BeigeHome;
use crate::hooks::{HookRunner, PostToolExecEvent, PreToolExecEvent};
use crate::ident::{
    Attribution, AttributionMethod, ExecId, ExecRecord, ExecRegistry, ExecSession, UnboundCalls,
};
use crate::llm::{LlmProvider, Message};
use crate::plugin::{kv::KvPlugin, Plugin, PluginRegistry, SessionInfo, ToolCall, ToolResult};
use crate::policy::{Approver, ConfigPolicy, Decision, Policy, PolicyRequest, Principal, ToolKind};
use crate::sandbox::{
    host, ReconcileReport, Sandbox, SandboxError, SandboxSpec, SandboxUser, SpecInput,
};
use crate::skills::SkillSet;
use crate::store::{
    HealthRecord, HealthStore, SessionRecord, SessionSettings, SessionStore, SettingsPatch, Stores,
};
use crate::tools::{run_core_tool, CoreToolCall, ToolContext, ToolOutcome, ToolOutput};
use tokio_util::sync::CancellationToken;

/// Default time limit of a plugin tool handler.
pub(crate) const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(120);

static NEXT_PROMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Builds a [`LocalGateway`]. Cloned by [`LocalGateway::reload`], which builds again with
/// the same injected parts and a new config.
#[derive(Debug, Clone)]
pub struct GatewayBuilder {
    config: Config,
    config_file: Option<PathBuf>,
    home: BeigeHome,
    sandbox: Option<Arc<dyn Sandbox>>,
    /// Options of the Docker backend (the default one, or a `DockerSandbox` given).
    #[cfg(feature = "docker")]
    docker: crate::sandbox::docker::DockerOptions,
    plugins: Vec<Arc<dyn Plugin>>,
    policy: Option<Arc<dyn Policy>>,
    approver: Option<Arc<dyn Approver>>,
    audit: Option<Arc<dyn AuditSink>>,
    store: Option<Stores>,
    providers: Vec<Arc<dyn LlmProvider>>,
    watchdog: Duration,
    disk_probe: Option<crate::disk::Probe>,
    /// Channels [`LocalGateway::serve`] runs; taken out by `build`.
    channels: Vec<serve::Registered>,
    config_source: Option<Arc<dyn ConfigSource>>,
    /// Where egress names are resolved (default: the host's DNS, through hickory).
    #[cfg(feature = "egress")]
    egress_resolver: Option<Arc<dyn crate::egress::upstream::Resolver>>,
    /// How egress upstreams are dialled (default: TCP).
    #[cfg(feature = "egress")]
    egress_dialer: Option<Arc<dyn crate::egress::upstream::Dialer>>,
    /// Ends every open egress stream of every engine built from this builder (a reload
    /// clones it, so streams the previous engine still carries end too): cancelled by
    /// the gateway's final stop, never by a reload.
    #[cfg(feature = "egress")]
    egress_end: CancellationToken,
    /// The approvals broker, made by the first build and kept by every reload so
    /// pending requests survive it.
    approvals: Arc<std::sync::Mutex<Option<Arc<crate::approvals::Approvals>>>>,
    /// The clock the schedule engine reads (default: the system's).
    schedule_clock: Option<Arc<dyn crate::schedule::Clock>>,
    /// Where the built-in `schedule` tool finds the finished gateway.
    gateway_slot: GatewaySlot,
    /// The agents' leases when the store is shared (`store.url`), taken by
    /// [`GatewayBuilder::build`] and kept by every reload: turns are written under them.
    agent_leases: Option<Arc<leases::AgentLeases>>,
    /// The gateway's metrics, kept by every reload.
    metrics: Arc<crate::metrics::Metrics>,
    /// The tracer, made by the first build from `telemetry.otlp` and kept by every
    /// reload (a change of `telemetry.otlp` takes a restart).
    traces: Arc<std::sync::Mutex<Option<Arc<crate::telemetry::Traces>>>>,
}

impl GatewayBuilder {
    /// The clock the schedule engine fires by (tests set a [`crate::schedule::ManualClock`]);
    /// default the system clock.
    pub fn schedule_clock(mut self, clock: Arc<dyn crate::schedule::Clock>) -> Self {
        self.schedule_clock = Some(clock);
        self
    }

    /// A builder for a gateway that runs `config` with its state under `home`. What is
    /// not injected takes its default: the providers of the config, the Docker sandbox,
    /// the store `<home>/beige.db`, the audit log in `<home>/logs`.
    pub fn new(config: Config, home: BeigeHome) -> Self {
        Self {
            config,
            config_file: None,
            home,
            sandbox: None,
            #[cfg(feature = "docker")]
            docker: Default::default(),
            plugins: Vec::new(),
            policy: None,
            approver: None,
            audit: None,
            store: None,
            providers: Vec::new(),
            watchdog: crate::agent::router::DEFAULT_WATCHDOG,
            disk_probe: None,
            channels: Vec::new(),
            config_source: None,
            #[cfg(feature = "egress")]
            egress_resolver: None,
            #[cfg(feature = "egress")]
            egress_dialer: None,
            #[cfg(feature = "egress")]
            egress_end: CancellationToken::new(),
            approvals: Arc::default(),
            schedule_clock: None,
            gateway_slot: GatewaySlot::default(),
            agent_leases: None,
            metrics: Arc::new(crate::metrics::Metrics::new()),
            traces: Arc::default(),
        }
    }

    /// Resolve egress names with `resolver` instead of the host's DNS. Whatever it
    /// answers is still checked by the address classifier before anything is dialled.
    #[cfg(feature = "egress")]
    pub fn egress_resolver(mut self, resolver: Arc<dyn crate::egress::upstream::Resolver>) -> Self {
        self.egress_resolver = Some(resolver);
        self
    }

    /// Dial egress upstreams with `dialer` instead of TCP. It is only ever given an
    /// address that the rules and the classifier let through.
    #[cfg(feature = "egress")]
    pub fn egress_dialer(mut self, dialer: Arc<dyn crate::egress::upstream::Dialer>) -> Self {
        self.egress_dialer = Some(dialer);
        self
    }

    /// Read free space with `probe` instead of `statvfs` (tests that cannot make a small
    /// filesystem).
    pub fn free_space_probe(mut self, probe: crate::disk::Probe) -> Self {
        self.disk_probe = Some(probe);
        self
    }

    /// Abort a model call that sends nothing for this long (default 10 minutes); it
    /// counts as a timeout for fallback. Running tools never trip it.
    pub fn watchdog(mut self, watchdog: Duration) -> Self {
        self.watchdog = watchdog;
        self
    }

    /// Use this store instead of `<BEIGE_HOME>/beige.db`: one value that is the whole
    /// store (`Arc<dyn Store>`, `Arc<SqliteStore>`, …), or [`Stores`] with each part
    /// where it should be.
    pub fn store(mut self, store: impl Into<Stores>) -> Self {
        self.store = Some(store.into());
        self
    }

    /// Use these parts of the store: sessions, health, channel state and plugin data,
    /// each its own (the same as [`GatewayBuilder::store`] with a [`Stores`]).
    pub fn stores(self, stores: Stores) -> Self {
        self.store(stores)
    }

    /// Use this client for the provider of the same name instead of the one built from
    /// config (for example the labelled `ScriptedProvider`).
    pub fn provider(mut self, provider: Arc<dyn LlmProvider>) -> Self {
        self.providers.push(provider);
        self
    }

    /// The file the config came from (named in error messages).
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_file = Some(path.into());
        self
    }

    /// Use this sandbox backend instead of connecting to Docker. A backend other than
    /// [`crate::sandbox::docker::DockerSandbox`] gets no shim: none is located or
    /// checked. A `DockerSandbox` given here takes the builder's shim, socket limits and
    /// the agents' link modes (it keeps its own legacy home and build base).
    pub fn sandbox(mut self, sandbox: Arc<dyn Sandbox>) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// Options of the Docker backend: the shim, the tool sockets' limits, the legacy
    /// home and the build base (see [`crate::sandbox::docker::DockerOptions`]).
    #[cfg(feature = "docker")]
    pub fn docker(mut self, options: crate::sandbox::docker::DockerOptions) -> Self {
        self.docker = options;
        self
    }

    /// Use this shim binary for the Docker backend (still checked to be static).
    #[cfg(feature = "docker")]
    pub fn shim(mut self, path: impl Into<PathBuf>) -> Self {
        self.docker.shim = Some(path.into());
        self
    }

    /// Add an in-process plugin. It is registered in config order if the config lists
    /// it under `plugins`, else after those.
    pub fn plugin(mut self, plugin: Arc<dyn Plugin>) -> Self {
        self.plugins.push(plugin);
        self
    }

    /// Replace the config-based policy.
    pub fn policy(mut self, policy: Arc<dyn Policy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Settle the policy's `Ask` decisions with `approver` instead of the built-in
    /// approvals broker (which asks a person on the run's channel).
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// Replace the JSONL audit log.
    pub fn audit(mut self, audit: Arc<dyn AuditSink>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Bounds of the agents' tool sockets (Docker backend).
    #[cfg(feature = "docker")]
    pub fn socket_limits(mut self, limits: crate::sandbox::docker::SocketLimits) -> Self {
        self.docker.socket_limits = limits;
        self
    }

    /// Build the engine: register plugins, prepare every agent's workspace, bring its
    /// sandbox up (reattaching a running one with the same spec; the backend serves its
    /// tool calls), start plugins and fire `gatewayStarted`. [`GatewayBuilder::build`]
    /// wraps it in the reloadable [`LocalGateway`].
    async fn build_engine(self) -> Result<Engine, GatewayError> {
        let config = self.config;
        let home = self.home;
        let config_file = self.config_file.unwrap_or_else(|| home.config_path());
        // The Docker backend's shim is located and checked first, so that an unusable
        // one stops the gateway before anything starts; other backends need none.
        #[cfg(feature = "docker")]
        let docker_setup = match &self.sandbox {
            Some(s) if !s.as_any().is::<crate::sandbox::docker::DockerSandbox>() => None,
            _ => Some(self.docker.resolve(&config, &home)?),
        };

        // Plugins: config order first (built-ins by name), then the rest.
        // External and command-tool plugins from their folders; one given to
        // `GatewayBuilder::plugin` with the same name wins.
        let mut extra = self.plugins;
        // The built-in spawn tool (not one given in process under its name) checks its
        // agents' `pluginConfigs.spawn` at load.
        let spawn_built_in = !extra
            .iter()
            .any(|p| p.name() == crate::platform::spawn::NAME)
            && config
                .plugins
                .get(crate::platform::spawn::NAME)
                .is_some_and(|e| crate::platform::serves(crate::platform::spawn::NAME, e));
        let loaded = {
            // Entries provided in process (`GatewayBuilder::plugin`) need no folder.
            let mut folders = config.clone();
            folders
                .plugins
                .retain(|name, _| !extra.iter().any(|p| p.name() == name));
            crate::plugin::load::load_plugins(&folders, &home)?
        };
        for p in loaded.plugins {
            if !extra.iter().any(|e| e.name() == p.name()) {
                extra.push(p);
            }
        }
        let mut ordered: Vec<Arc<dyn Plugin>> = Vec::new();
        // The platform tools reach the gateway through this once it is built.
        let platform = crate::platform::HostSlot::default();
        let mut package_dirs = loaded.package_dirs;
        for (name, entry) in &config.plugins {
            if let Some(i) = extra.iter().position(|p| p.name() == name) {
                ordered.push(extra.remove(i));
            } else if name == "kv" && entry.path.is_none() {
                let dir = home.root().join("builtin").join("kv");
                crate::plugin::kv::write_package_dir(&dir)
                    .map_err(|e| SandboxError::host(&dir, e))?;
                package_dirs.insert(name.clone(), dir);
                ordered.push(Arc::new(KvPlugin::new()));
            } else if let Some(plugin) = crate::platform::serves(name, entry)
                .then(|| crate::platform::builtin_plugin(name, &platform, &self.gateway_slot))
                .flatten()
            {
                ordered.push(plugin);
            } else if let Some(plugin) = crate::channel::builtin_plugin(name, entry) {
                ordered.push(plugin);
            }
        }
        ordered.extend(extra);
        let stores: Stores = match self.store {
            Some(s) => s,
            None => open_default_store(&home, &config).await?,
        };
        let registry = PluginRegistry::build(
            ordered,
            &config,
            &home.root().join("data"),
            &package_dirs,
            stores.clone(),
        )
        .await?;
        let names: Vec<&str> = registry.tool_names().iter().map(String::as_str).collect();
        crate::config::validate_tools(&config, &config_file, &names)?;
        if spawn_built_in {
            crate::platform::spawn::validate_config(&config, &config_file)?;
        }
        let skills = SkillSet::load(&config.skills, registry.skills().cloned())?;

        let policy: Arc<dyn Policy> = self
            .policy
            .unwrap_or_else(|| Arc::new(ConfigPolicy::from_config(&config)));
        // Containers are named and labelled by installation, never by the home's path.
        let (installation, created) = home.ensure_installation_id()?;
        if created {
            tracing::info!(
                path = %home.installation_id_path().display(),
                "created the installation id of this BEIGE_HOME (it had none: made before installation ids, or by an embedder)"
            );
        }
        let sink: Arc<dyn AuditSink> = match self.audit {
            Some(a) => a,
            None => {
                let logs = home.logs_dir();
                std::fs::create_dir_all(&logs).map_err(|e| SandboxError::host(&logs, e))?;
                let days = u64::from(config.gateway.audit.retention_days);
                let hours = u64::from(config.gateway.audit.rotate_after_hours);
                // The log is a hash chain with signed checkpoints (`beige audit verify`).
                let key =
                    crate::audit::chain::SigningKey::load_or_create(&home.root().join("keys"))?;
                Arc::new(
                    JsonlAudit::new(
                        home.audit_log_path(),
                        config.gateway.log.max_size_bytes,
                        config.gateway.log.max_files,
                        secrets_of(&config),
                    )
                    .retention(Duration::from_secs(days * 86_400))
                    .max_age(Duration::from_secs(hours * 3_600))
                    .chained(
                        key,
                        installation.as_str(),
                        logs.join(crate::audit::chain::HEAD_FILE),
                    ),
                )
            }
        };
        // Whatever the sink, records are bounded and each agent kept within its budget,
        // so that a sandbox cannot push earlier records out of the log.
        let audit: Arc<dyn AuditSink> = Arc::new(BoundedAudit::new(
            sink,
            secrets_of(&config),
            AuditBudget {
                bytes_per_minute: config.gateway.audit.budget_bytes_per_minute,
            },
        ));
        // What was written is counted (tool calls by decision, records by type).
        let audit: Arc<dyn AuditSink> = Arc::new(crate::metrics::ObservedAudit::new(
            audit,
            self.metrics.clone(),
            config.plugins.keys().cloned(),
        ));
        // Spans: the first build makes the tracer, every reload keeps it.
        let traces = {
            let mut slot = self.traces.lock().unwrap_or_else(|e| e.into_inner());
            match &*slot {
                Some(t) => t.clone(),
                None => {
                    let t =
                        Arc::new(crate::telemetry::Traces::from_config(&config).map_err(|e| {
                            GatewayError::Config {
                                source: Box::new(e),
                            }
                        })?);
                    *slot = Some(t.clone());
                    t
                }
            }
        };
        // Records written under a span carry its trace and span ids (before the chain
        // hashes them).
        let audit: Arc<dyn AuditSink> = if traces.is_on() {
            Arc::new(crate::telemetry::TracedAudit::new(audit))
        } else {
            audit
        };

        let router = build_router(&config, stores.health.clone(), self.providers)
            .await?
            .with_watchdog(self.watchdog)
            .with_metrics(self.metrics.clone());

        let writable = crate::config::WritableTrees::of_config(&config, &home);
        let mut specs = Vec::with_capacity(config.agents.len());
        for (name, agent) in &config.agents {
            let workspace = config.agent_workspace(&home, name);
            let configured = agent.sandbox.user.as_deref().and_then(SandboxUser::parse);
            let user = host::prepare_workspace(&workspace, configured)?;
            seed_agents_md(&workspace, user)?;
            #[allow(unused_mut)]
            let mut tools = launchable_tools(policy.as_ref(), &registry, name, agent).await;
            // An MCP server the agent has is one launcher, `/tools/bin/<server>`.
            #[cfg(feature = "mcp")]
            tools.extend(config.agent_mcp_servers(name));
            let tool_packages = tools
                .iter()
                .filter_map(|t| {
                    registry
                        .tool(t)
                        .and_then(|r| r.package_dir.clone())
                        .map(|d| (t.clone(), d))
                })
                .collect();
            let agent_skills = skills
                .for_agent(name, agent)?
                .into_iter()
                .map(|s| (s.name, s.path))
                .collect();
            specs.push(
                SandboxSpec::for_agent(&SpecInput {
                    home: &home,
                    installation: &installation,
                    writable: &writable,
                    agent: name,
                    config: agent,
                    workspace,
                    user,
                    tools,
                    tool_packages,
                    skills: agent_skills,
                })
                .map_err(SandboxError::from)?,
            );
        }

        // Egress: each agent's rules, checked now; its proxy port goes into its spec.
        // The policy version is the build's time in milliseconds: every reload's rules
        // are a newer version than the ones open streams keep.
        #[cfg(feature = "egress")]
        let egress = {
            let version = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_millis() as u64);
            let egress = egress::GatewayEgress::from_config(
                &config,
                &config_file,
                &crate::egress::ca::keys_dir(&home),
                self.egress_resolver.clone(),
                self.egress_dialer.clone(),
                version,
                self.egress_end.clone(),
            )?;
            for spec in &mut specs {
                if let (Some(e), Some(a)) = (spec.egress.as_mut(), config.agents.get(&spec.agent)) {
                    if let Some(agent_egress) = &a.egress {
                        if let Ok(s) = crate::egress::config::settings(
                            config.egress.as_ref(),
                            &spec.agent,
                            agent_egress,
                        ) {
                            e.proxy_port = s.proxy_port;
                        }
                        e.ca_der = egress.as_ref().map(|g| g.ca_der());
                    }
                }
            }
            egress
        };
        #[cfg(not(feature = "egress"))]
        if let Some(name) = config
            .agents
            .iter()
            .find(|(_, a)| a.egress.is_some())
            .map(|(n, _)| n)
        {
            return Err(GatewayError::NotCompiledIn {
                what: format!("agents.{name}.egress: egress through the gateway"),
                feature: "egress",
            });
        }

        let sandbox: Arc<dyn Sandbox> = match self.sandbox {
            Some(s) => s,
            #[cfg(feature = "docker")]
            None => connect_default(&home, &installation, &config, &self.docker).await?,
            #[cfg(not(feature = "docker"))]
            None => return Err(GatewayError::NoSandbox),
        };
        #[cfg(feature = "docker")]
        if let (Some(docker), Some(setup)) = (
            sandbox
                .as_any()
                .downcast_ref::<crate::sandbox::docker::DockerSandbox>(),
            docker_setup,
        ) {
            docker.configure(setup);
        }
        // With a shared store, no operation reaches a leased agent's sandbox unless this
        // gateway's lease of it is confirmed: a stale gateway cannot act.
        let sandbox: Arc<dyn Sandbox> = match &self.agent_leases {
            Some(leases) => Arc::new(leases::FencedSandbox::new(sandbox, leases.clone())),
            None => sandbox,
        };

        let disk = Arc::new(disk_guard(
            &config,
            &home,
            self.disk_probe.unwrap_or_else(crate::disk::Probe::statvfs),
            audit.clone(),
        ));
        let approvals = {
            let settings = config.approvals.clone().unwrap_or_default();
            let mut slot = self.approvals.lock().unwrap_or_else(|e| e.into_inner());
            match &*slot {
                Some(a) => {
                    a.set_config(settings);
                    a.clone()
                }
                None => {
                    let a = Arc::new(crate::approvals::Approvals::new(settings, audit.clone()));
                    *slot = Some(a.clone());
                    a
                }
            }
        };
        let exec_budgets = crate::budget::ExecBudgets::from_config(&config);
        // MCP clients: stdio servers in the sandboxes, remote ones through egress.
        #[cfg(feature = "mcp")]
        let mcp_clients = {
            let clients = crate::mcp::client::McpClients::new(sandbox.clone());
            #[cfg(feature = "egress")]
            let clients = clients.with_egress(
                egress
                    .as_ref()
                    .map(|e| e.mcp_routes(&config, audit.clone())),
            );
            Arc::new(clients)
        };
        let inner = Arc::new(Inner {
            leases: self.agent_leases.clone(),
            disk,
            approvals,
            attended: std::sync::Mutex::new(HashMap::new()),
            config,
            home,
            #[cfg(feature = "mcp")]
            mcp: mcp_clients,
            sandbox,
            specs,
            registry,
            skills,
            policy,
            approver: self.approver,
            audit,
            sessions: RwLock::new(HashMap::new()),
            store: stores.sessions,
            history: history::HistoryCache::default(),
            ledger: stores.usage,
            credentials: stores.credentials,
            warned: crate::budget::WarnedOnce::default(),
            exec_budgets,
            router,
            session_locks: std::sync::Mutex::new(HashMap::new()),
            running: std::sync::Mutex::new(HashMap::new()),
            #[cfg(feature = "egress")]
            egress,
            execs: Arc::new(ExecRegistry::new()),
            spawn: spawn::SpawnState::default(),
            me: std::sync::OnceLock::new(),
            metrics: self.metrics.clone(),
            traces,
        });
        let _ = inner.me.set(Arc::downgrade(&inner));
        platform.set(Arc::downgrade(&inner) as Weak<dyn crate::platform::Host>);
        // The backend serves the sandboxes' tool calls through the gateway, which it
        // holds without keeping alive.
        let report = inner
            .sandbox
            .reconcile(
                inner.specs.clone(),
                Arc::new(sandbox_host::GatewayHost::new(&inner)),
            )
            .await?;
        inner.disk.watch(crate::disk::WATCH_EVERY);
        inner.registry.start_all().await?;
        inner.registry.hooks().gateway_started().await;
        tracing::info!(
            agents = inner.config.agents.len(),
            "beige gateway started ✓"
        );
        Ok(Engine {
            inner,
            report: Arc::new(report),
        })
    }
}

#[cfg(feature = "docker")]
async fn connect_default(
    home: &BeigeHome,
    installation: &crate::home::InstallationId,
    config: &Config,
    options: &crate::sandbox::docker::DockerOptions,
) -> Result<Arc<dyn Sandbox>, GatewayError> {
    let docker = crate::sandbox::docker::DockerSandbox::connect(installation.as_str())
        .await?
        .with_legacy_home(options.legacy_home.as_ref().unwrap_or(home))
        .with_build_base(
            options
                .build_base
                .clone()
                .or_else(|| config.sandbox.base_image.clone()),
        );
    Ok(Arc::new(docker))
}

/// The store when none was given: the PostgreSQL database of `store.url`, else
/// `<BEIGE_HOME>/beige.db`.
pub(crate) async fn open_default_store(
    home: &BeigeHome,
    config: &Config,
) -> Result<Stores, GatewayError> {
    match &config.store {
        Some(store) => open_postgres(store).await,
        None => open_sqlite(home),
    }
}

#[cfg(feature = "postgres")]
async fn open_postgres(store: &crate::config::store::StoreConfig) -> Result<Stores, GatewayError> {
    use crate::store::{PostgresOptions, PostgresStore};
    let options = PostgresOptions::from_config(store)?;
    let pg = PostgresStore::connect(&options).await?;
    tracing::info!(database = %pg.name().display(), "store: PostgreSQL");
    Ok(Stores::from(Arc::new(pg)))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &crate::config::store::StoreConfig) -> Result<Stores, GatewayError> {
    Err(GatewayError::NotCompiledIn {
        what: "store.url: the PostgreSQL store".into(),
        feature: "postgres",
    })
}

#[cfg(feature = "sqlite")]
fn open_sqlite(home: &BeigeHome) -> Result<Stores, GatewayError> {
    std::fs::create_dir_all(home.root()).map_err(|e| SandboxError::host(home.root(), e))?;
    Ok(Stores::from(Arc::new(crate::store::SqliteStore::open(
        home.db_path(),
    )?)))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(_: &BeigeHome) -> Result<Stores, GatewayError> {
    Err(GatewayError::NoStore)
}

/// The agent's tools that get a launcher: registered and exposed by policy.
async fn launchable_tools(
    policy: &dyn Policy,
    registry: &PluginRegistry,
    agent: &str,
    config: &AgentConfig,
) -> Vec<String> {
    let mut tools = Vec::new();
    for t in config.tools.iter().filter(|t| registry.tool(t).is_some()) {
        if policy.exposes(agent, t).await {
            tools.push(t.clone());
        }
    }
    tools
}

/// One built gateway: what a [`LocalGateway`] serves until a reload replaces it. Cheap
/// to clone.
#[derive(Debug, Clone)]
pub(crate) struct Engine {
    inner: Arc<Inner>,
    /// What start-up did to the sandboxes.
    report: Arc<ReconcileReport>,
}

#[derive(Debug)]
struct Inner {
    /// The agents' leases (a shared store): each turn is written under its agent's.
    leases: Option<Arc<leases::AgentLeases>>,
    /// Pauses agents while a filesystem they need is nearly full.
    disk: Arc<crate::disk::DiskGuard>,
    config: Config,
    home: BeigeHome,
    sandbox: Arc<dyn Sandbox>,
    /// The MCP clients of the agents' servers.
    #[cfg(feature = "mcp")]
    mcp: Arc<crate::mcp::client::McpClients>,
    specs: Vec<SandboxSpec>,
    registry: PluginRegistry,
    skills: SkillSet,
    policy: Arc<dyn Policy>,
    /// Settles the policy's `Ask` decisions in place of the built-in broker, when an
    /// embedder sets one.
    approver: Option<Arc<dyn Approver>>,
    /// The built-in approvals broker: asks wait here for a human on a channel.
    approvals: Arc<crate::approvals::Approvals>,
    /// Sessions with an attended prompt running now (how many), whose scripts' asks
    /// can reach a human.
    attended: std::sync::Mutex<HashMap<String, usize>>,
    audit: Arc<dyn AuditSink>,
    /// Known sessions: the agent each belongs to and where its messages come from, as
    /// the gateway itself saw it (never from a socket payload).
    sessions: RwLock<HashMap<String, SessionOrigin>>,
    /// Sessions and messages, for the agent loop and [`Sessions`].
    store: Arc<dyn SessionStore>,
    /// Recent sessions' contexts, checked against `store` before each prompt.
    history: history::HistoryCache,
    /// The cost ledger: one row per model call, read by the budget checks.
    ledger: Arc<dyn crate::store::UsageLedger>,
    /// The users' personal API tokens.
    credentials: Arc<dyn crate::store::CredentialStore>,
    /// The budget warnings already sent (once per scope and period).
    warned: crate::budget::WarnedOnce,
    /// Plugin tool calls per running exec (`budgets.exec.toolCalls`).
    exec_budgets: crate::budget::ExecBudgets,
    router: Router,
    /// One prompt at a time per session key.
    session_locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Cancellation of the running prompt per session key.
    running: std::sync::Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    /// The agents' egress rules and the engine that carries their streams; `None`
    /// when no agent has egress.
    #[cfg(feature = "egress")]
    egress: Option<egress::GatewayEgress>,
    /// Every exec started, its session and root process: who a socket caller is.
    execs: Arc<ExecRegistry>,
    /// Sub-agents: the children running and their rights.
    spawn: spawn::SpawnState,
    /// The gateway itself, for work a tool call starts (a sub-agent's prompt).
    me: std::sync::OnceLock<Weak<Inner>>,
    /// The gateway's metrics (shared with every reload).
    metrics: Arc<crate::metrics::Metrics>,
    /// The gateway's tracer (shared with every reload).
    traces: Arc<crate::telemetry::Traces>,
}

/// Where a session's prompts come from — recorded from the trusted [`PromptRequest`]
/// (or a core tool call's [`ToolContext`]) and the only source of the channel, chat and
/// thread of a script's plugin call in that session.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SessionOrigin {
    agent: String,
    channel: String,
    chat_id: Option<String>,
    thread_id: Option<String>,
}

impl SessionOrigin {
    /// A session known only by its key: the channel is the key's first segment.
    fn of_key(agent: &str, key: &str) -> Self {
        Self {
            agent: agent.to_string(),
            channel: key.split(':').next().unwrap_or("unknown").to_string(),
            chat_id: None,
            thread_id: None,
        }
    }
}

/// Keeps a session marked attended ([`Inner::attend`]).
pub(crate) struct AttendedGuard<'a> {
    map: &'a std::sync::Mutex<HashMap<String, usize>>,
    key: String,
}

impl Drop for AttendedGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// Everything the guarded path needs to know about one call.
struct CallMeta<'a> {
    agent: &'a str,
    tool: &'a str,
    kind: ToolKind,
    args: Vec<String>,
    session: Option<String>,
    channel: Option<String>,
    /// The connection of an outside client's call (`mcp:<token id>`); with it, the
    /// audit records name the principal too.
    via: Option<String>,
    model: Option<String>,
    /// Who the call comes from: `Sandbox` on the socket, the prompt's for a model.
    principal: Principal,
    target: Target,
    /// Whether a human can answer an approval for this call: `None` when one can,
    /// else why not (for the denial and the owner's report).
    unattended: Option<String>,
    /// The working directory, relative to `/workspace`.
    cwd: Option<String>,
    /// SHA-256 (hex) of the data piped in.
    stdin_sha256: Option<String>,
    /// The exec the call belongs to (a socket caller's, or a core `exec`'s own id).
    exec: Option<ExecId>,
    /// How a socket caller was bound to `exec`; `None` for calls not from the sandbox.
    attribution: Option<AttributionMethod>,
}

/// Why a call did not run, and the exit code a script's tool CLI exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    message: String,
    /// 1 denied; 76 approval pending (the shim's reserved codes).
    exit_code: i32,
}

impl Refusal {
    fn denied(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            exit_code: 1,
        }
    }
}

/// Exit code of a script's tool call that waits for approval.
pub(crate) const EXIT_APPROVAL_PENDING: i32 = 76;

/// The outcome of the guarded path.
enum Guarded<T> {
    /// The call ran and returned this.
    Ran(T),
    /// Refused before it ran (disk guard, policy, a `preToolExec` hook), with the reason.
    Denied(Refusal),
    /// Allowed, but running it failed (the run future's `Err`), with the message.
    Failed(String),
}

impl Engine {
    /// What `config_summary` says of telemetry: whether traces and metrics are on, the
    /// collector (never its headers) and the exporter's last success and failure.
    fn telemetry_summary(&self) -> serde_json::Value {
        let c = &self.inner.config;
        let otlp = c.telemetry.as_ref().and_then(|t| t.otlp.as_ref());
        #[allow(unused_mut)]
        let mut traces = serde_json::json!({
            "enabled": self.inner.traces.is_on(),
            "endpoint": otlp.filter(|o| o.traces).map(|o| o.endpoint.clone()),
        });
        #[cfg(feature = "otel")]
        if let Some(h) = self.inner.traces.health() {
            let at = |t: std::time::SystemTime| {
                chrono::DateTime::<chrono::Utc>::from(t)
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            };
            traces["lastSuccess"] = serde_json::json!(h.last_success.map(at));
            traces["lastError"] = match h.last_error {
                Some((t, message)) => serde_json::json!({"at": at(t), "message": message}),
                None => serde_json::Value::Null,
            };
        }
        serde_json::json!({
            "traces": traces,
            "metrics": {"enabled": c.metrics_enabled()},
        })
    }
}

impl Engine {
    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The sandbox specs the gateway started with.
    #[cfg(feature = "test-util")]
    pub(crate) fn specs(&self) -> &[SandboxSpec] {
        &self.inner.specs
    }

    /// What start-up did to the sandboxes.
    pub(crate) fn reconcile_report(&self) -> &ReconcileReport {
        &self.report
    }

    pub(crate) fn registry(&self) -> &PluginRegistry {
        &self.inner.registry
    }

    /// Standalone and plugin skills.
    pub(crate) fn skills(&self) -> &SkillSet {
        &self.inner.skills
    }

    /// Record that `session_key` belongs to `agent` (sessions named by scripts in the
    /// sandbox are honoured only when known and owned by the calling agent). Its channel
    /// is the key's first segment; it has no chat or thread until a prompt runs on it.
    #[cfg(feature = "test-util")]
    pub(crate) fn register_session(&self, agent: &str, session_key: &str) {
        self.inner.record_session(
            session_key,
            SessionOrigin::of_key(agent, session_key),
            false,
        );
    }

    /// Handle a tool request as if it arrived on `agent`'s socket.
    #[cfg(feature = "test-util")]
    pub(crate) async fn handle_tool_request(
        &self,
        agent: &str,
        request: ToolRequest,
    ) -> ToolResponse {
        self.inner
            .handle_tool_request(agent, &Attribution::unbound(), request)
            .await
    }

    /// Stop: fire `gatewayShutdown`, stop plugins (reverse order), close the sockets,
    /// and remove the sandboxes unless `gateway.keepSandboxes` is set.
    pub(crate) async fn shutdown(&self) -> Result<(), GatewayError> {
        self.stop(self.inner.config.gateway.keep_sandboxes).await
    }

    /// Stop: cancel running prompts, fire `gatewayShutdown`, stop plugins (reverse
    /// order), close the sockets; remove the sandboxes unless `keep_sandboxes` (an
    /// in-place restart keeps them so the next gateway reattaches).
    pub(crate) async fn stop(&self, keep_sandboxes: bool) -> Result<(), GatewayError> {
        for list in self
            .inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            list.iter().for_each(|(_, t)| t.cancel());
        }
        self.inner.disk.stop();
        self.inner.registry.hooks().gateway_shutdown().await;
        self.inner.registry.stop_all().await;
        // The backend stops serving tool calls either way.
        if keep_sandboxes {
            // The containers stay; their links end so PID 1 dials the next gateway.
            self.inner.sandbox.detach().await;
        } else {
            self.inner.sandbox.remove_all().await?;
        }
        // Spans still queued leave now (bounded: 5 s).
        let traces = self.inner.traces.clone();
        let _ = tokio::task::spawn_blocking(move || traces.flush()).await;
        Ok(())
    }

    /// Prompts running now.
    pub(crate) fn running_prompts(&self) -> usize {
        self.inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .flatten()
            .filter(|(_, t)| !t.is_cancelled())
            .count()
    }
}

impl Inner {
    fn agent(&self, name: &str) -> Result<&AgentConfig, GatewayError> {
        self.config
            .agents
            .get(name)
            .ok_or_else(|| GatewayError::UnknownAgent {
                agent: name.to_string(),
                known: self
                    .config
                    .agents
                    .keys()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn hooks(&self) -> &HookRunner {
        self.registry.hooks()
    }

    fn session_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.session_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    /// Whether an attended prompt runs in session `key` now.
    fn is_attended(&self, key: &str) -> bool {
        self.attended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(|n| *n > 0)
    }

    /// Mark session `key` attended while the guard lives.
    pub(crate) fn attend(&self, key: &str) -> AttendedGuard<'_> {
        *self
            .attended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_string())
            .or_default() += 1;
        AttendedGuard {
            map: &self.attended,
            key: key.to_string(),
        }
    }

    /// The approvals broker.
    pub(crate) fn approvals(&self) -> &Arc<crate::approvals::Approvals> {
        &self.approvals
    }

    /// A prompt starts on `key`: it belongs to the agent (the first agent that used the
    /// key keeps it), and its origin is the prompt's.
    pub(crate) fn register_prompt_session(&self, request: &PromptRequest) {
        let origin = SessionOrigin {
            agent: request.agent.clone(),
            channel: request.channel(),
            chat_id: request.chat_id.clone(),
            thread_id: request.thread_id.clone(),
        };
        self.record_session(&request.session_key, origin, true);
    }

    /// Record `origin` for `key` unless another agent owns the key; an existing record
    /// of the same agent is replaced only when `replace`.
    fn record_session(&self, key: &str, origin: SessionOrigin, replace: bool) {
        let mut s = self.sessions.write().unwrap_or_else(|e| e.into_inner());
        match s.get_mut(key) {
            Some(known) if known.agent == origin.agent && replace => *known = origin,
            Some(_) => {}
            None => {
                s.insert(key.to_string(), origin);
            }
        }
    }

    fn session_origin(&self, key: &str) -> Option<SessionOrigin> {
        self.sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    fn record(&self, meta: &CallMeta<'_>, phase: Phase, decision: AuditDecision) -> AuditRecord {
        AuditRecord {
            trace_id: None,
            span_id: None,
            ts: now_ts(),
            agent: meta.agent.to_string(),
            session: meta.session.clone(),
            model: meta.model.clone(),
            channel: meta.channel.clone(),
            principal: meta
                .via
                .as_ref()
                .map(|_| outside::principal_name(&meta.principal)),
            via: meta.via.clone(),
            phase,
            kind: AuditType::from(meta.kind),
            tool: meta.tool.to_string(),
            args: meta.args.clone(),
            decision,
            target: Some(meta.target),
            duration_ms: None,
            exit_code: None,
            output_bytes: None,
            error: None,
            args_bytes: None,
            args_sha256: None,
            args_truncated: None,
            egress: None,
            approval: None,
            spawn: None,
            // A sub-agent's calls name the session that spawned it.
            parent_session: meta
                .session
                .as_deref()
                .and_then(|k| self.child(k))
                .map(|c| c.parent_key.clone()),
            exec: meta.exec.clone(),
            attribution: meta.attribution,
        }
    }

    /// Audit a call that never ran (denied, or rejected before it could run).
    /// The first refusal of an exec's calls by `budgets.exec.toolCalls`: one
    /// `type: budget`, `phase: exhausted` record (later refusals have their denied call
    /// records only).
    async fn audit_exec_budget(
        &self,
        meta: &CallMeta<'_>,
        exhausted: &crate::budget::BudgetExhausted,
        exec_id: Option<&str>,
        message: &str,
    ) {
        if exhausted.used > exhausted.limit {
            return;
        }
        let mut record = AuditRecord::budget(
            Phase::Exhausted,
            meta.agent,
            meta.session.as_deref(),
            &crate::audit::BudgetFacts {
                scope: exhausted.scope.as_str(),
                key: exhausted.key.as_str(),
                limit: exhausted.limit,
                used: exhausted.used,
                session_id: None,
                turn: None,
            },
            Some(message.to_string()),
        );
        if let Some(id) = exec_id {
            record.args.push(format!("exec={id}"));
        }
        if let Err(e) = self.audit.record(&record).await {
            tracing::warn!(error = %e, agent = meta.agent, "could not audit a budget event");
        }
    }

    async fn audit_denied(&self, meta: &CallMeta<'_>, reason: &str) {
        // While the agent is paused for low disk space its refusals are counted, not
        // written one by one: a flood of them must not eat the room the guard keeps.
        if self.disk.is_paused(meta.agent) {
            self.disk.note_refused(meta.agent);
            return;
        }
        let mut r = self.record(meta, Phase::Finished, AuditDecision::Denied);
        r.error = Some(reason.to_string());
        r.duration_ms = Some(0);
        match self.audit.record(&r).await {
            Ok(()) => {}
            // One `security.audit_throttled` record stands for these.
            Err(AuditError::Throttled { .. }) => {}
            Err(e) => tracing::error!(error = %e, "could not audit a denied call"),
        }
    }

    /// The policy's final decision on a call: `Allow` runs it, `Deny` refuses it, `Ask`
    /// goes to the embedder's approver when there is one, else to the approvals broker
    /// (denied at once in an unattended run). `Err` holds the refusal.
    async fn decide(&self, meta: &CallMeta<'_>) -> Result<(), Refusal> {
        // A sub-agent's call: its rights first (a tool its parent lacks is out), then
        // its ancestors' rule sets with its own, strictest winning.
        let child = match meta.session.as_deref() {
            Some(key) => self.child_for_key(key).await,
            None => None,
        };
        if let Some(child) = &child {
            if meta.kind == ToolKind::Plugin && !child.rights.tools.contains(meta.tool) {
                return Err(Refusal::denied(format!(
                    "{}: not allowed for this sub-agent (parent lacks it)",
                    meta.tool
                )));
            }
            if meta.kind == ToolKind::Plugin {
                if let Some(reason) = spawn::beyond_child(meta.tool, &meta.args) {
                    return Err(Refusal::denied(reason));
                }
            }
        }
        let request_of = |agent| {
            PolicyRequest::new(agent, meta.tool, meta.kind, &meta.args)
                .with_session(meta.session.as_deref())
                .with_channel(meta.channel.as_deref())
                .with_model(meta.model.as_deref())
                .with_principal(&meta.principal)
                .with_exec(meta.exec.as_ref().map(|e| e.as_str()))
                .with_cwd(meta.cwd.as_deref())
        };
        let request = request_of(meta.agent);
        let mut decision = self.policy.check(&request).await;
        if let Some(child) = &child {
            for ancestor in &child.rights.rule_agents {
                if decision.is_deny() {
                    break;
                }
                let theirs = self.policy.check(&request_of(ancestor)).await;
                if theirs.is_deny() || (decision.is_allow() && !theirs.is_allow()) {
                    decision = theirs;
                }
            }
        }
        let reason = match decision {
            d if d.is_allow() => return Ok(()),
            d if d.is_deny() => return Err(Refusal::denied(d.into_reason())),
            ask => ask,
        };
        // A sub-agent is unattended: nobody, its parent agent least, approves its asks.
        if let Some(child) = &child {
            let origin = format!(
                "a sub-agent spawned by session '{}'; its parent agent cannot approve it",
                child.parent_key
            );
            let result = self.ask_human(meta, reason, Some(&origin)).await;
            if let Err(refusal) = &result {
                child.note_denial(&refusal.message);
            }
            return result;
        }
        if let Some(approver) = &self.approver {
            let d = approver.approve(&request, reason.reason()).await;
            return if d.is_allow() {
                Ok(())
            } else {
                Err(Refusal::denied(d.into_reason()))
            };
        }
        self.ask_human(meta, reason, meta.unattended.as_deref())
            .await
    }

    /// An `Ask` with no embedder approver: the broker, or an at-once denial when no
    /// human is there to answer.
    async fn ask_human(
        &self,
        meta: &CallMeta<'_>,
        ask: Decision,
        unattended: Option<&str>,
    ) -> Result<(), Refusal> {
        let reason = ask.reason().to_string();
        let call = crate::approvals::CallFacts {
            agent: meta.agent.to_string(),
            session: meta
                .session
                .clone()
                .unwrap_or_else(|| format!("socket:{}", meta.agent)),
            exec: meta.exec.as_ref().map(|e| e.to_string()),
            tool: meta.tool.to_string(),
            args: meta.args.clone(),
            cwd: meta.cwd.clone(),
            stdin_sha256: meta.stdin_sha256.clone(),
            rule: ask.rule().map(str::to_string),
            justification: ask.justification().map(str::to_string),
            reason: reason.clone(),
        };
        let line = call_line(meta.tool, &meta.args);
        let rule = call
            .rule
            .as_deref()
            .map(|r| format!(", rule '{r}'"))
            .unwrap_or_default();
        if let Some(origin) = unattended {
            self.approvals.report_unattended(&call, origin).await;
            return Err(Refusal::denied(format!(
                "Permission denied: '{line}' needs approval, but this run is unattended ({origin}), so it was denied without waiting; the agent's owner was told. {reason}"
            )));
        }
        let script = meta.principal == Principal::Sandbox;
        let settings = self.approvals.config();
        let hold = if script {
            settings.script_hold()
        } else {
            settings.hold()
        };
        use crate::approvals::AskOutcome;
        let wait_cx = self.traces.child(
            &opentelemetry::Context::current(),
            crate::telemetry::names::SPAN_APPROVAL_WAIT.to_string(),
            Vec::new(),
        );
        let outcome = self.approvals.ask(call, hold).await;
        let word = match &outcome {
            AskOutcome::Approved { .. } => "approved",
            AskOutcome::Denied { .. } => "denied",
            AskOutcome::Expired { .. } => "expired",
            AskOutcome::TooMany { .. } => "too_many",
            AskOutcome::Pending { .. } => "pending",
        };
        crate::telemetry::end(
            &wait_cx,
            vec![KeyValue::new(crate::telemetry::names::DECISION, word)],
        );
        match outcome {
            AskOutcome::Approved { .. } => Ok(()),
            AskOutcome::Denied { approval, by, reason } => Err(Refusal::denied(format!(
                "Permission denied: '{line}' was denied by {by} (approval {approval}){}",
                reason.map(|r| format!(": \"{r}\"")).unwrap_or_default()
            ))),
            AskOutcome::Expired { approval } => Err(Refusal::denied(format!(
                "Not run: approval {approval} for '{line}' expired before anyone answered; the call can be asked again."
            ))),
            AskOutcome::TooMany { limit } => Err(Refusal::denied(format!(
                "Permission denied: '{line}' needs approval, and this session already has {limit} requests waiting (approvals.maxPendingPerSession); wait for them to be answered."
            ))),
            AskOutcome::Pending { approval } if script => Err(Refusal {
                message: format!(
                    "{}: pending approval {}: {line}{}; re-run after approval",
                    meta.tool,
                    approval.id,
                    approval
                        .rule
                        .as_deref()
                        .map(|r| format!(" (rule '{r}')"))
                        .unwrap_or_default()
                ),
                exit_code: EXIT_APPROVAL_PENDING,
            }),
            AskOutcome::Pending { approval } => Err(Refusal::denied(format!(
                "Not run: waiting for approval {} ({line}{rule}), asked on the session's channel. Retry once approved.",
                approval.id
            ))),
        }
    }

    /// policy → preToolExec → audit started → `run` → postToolExec → audit finished.
    /// `as_result` views the output as `{output, exitCode}` for `postToolExec` hooks
    /// (a copy: only made when such a hook is registered); `measure` gives the exit code
    /// and output size for the audit without copying; `rewrite` applies a
    /// `postToolExec` replacement.
    async fn guarded<T, F>(
        &self,
        meta: CallMeta<'_>,
        run: F,
        as_result: impl Fn(&T) -> ToolResult,
        measure: impl Fn(&T) -> (i32, u64),
        rewrite: impl FnOnce(T, ToolResult) -> T,
    ) -> Result<Guarded<T>, GatewayError>
    where
        F: std::future::Future<Output = Result<T, String>>,
    {
        // Low disk space pauses the agent before anything else; the guard records the
        // pause (`security.disk_low`) and counts the refusals.
        if let Err(low) = self.disk.check(meta.agent).await {
            return Ok(Guarded::Denied(Refusal::denied(low.to_string())));
        }
        let span = opentelemetry::Context::current();
        let decided = |word: &'static str| {
            crate::telemetry::annotate(
                &span,
                vec![KeyValue::new(crate::telemetry::names::DECISION, word)],
            );
        };
        if let Err(refusal) = self.decide(&meta).await {
            decided("denied");
            self.audit_denied(&meta, &refusal.message).await;
            return Ok(Guarded::Denied(refusal));
        }
        let pre = PreToolExecEvent {
            tool_name: meta.tool.to_string(),
            args: meta.args.clone(),
            session_key: meta.session.clone().unwrap_or_default(),
            agent_name: meta.agent.to_string(),
        };
        if let Err(reason) = self.hooks().pre_tool_exec(&pre).await {
            decided("denied");
            self.audit_denied(&meta, &reason).await;
            return Ok(Guarded::Denied(Refusal::denied(reason)));
        }
        self.audit
            .record(&self.record(&meta, Phase::Started, AuditDecision::Allowed))
            .await?;
        let started = Instant::now();
        let outcome = run.await;
        decided(if outcome.is_ok() { "ran" } else { "failed" });
        let mut finished = self.record(&meta, Phase::Finished, AuditDecision::Allowed);
        finished.duration_ms = Some(started.elapsed().as_millis() as u64);
        let out = match outcome {
            Ok(value) if !self.hooks().has(crate::hooks::HookName::PostToolExec) => {
                let (exit_code, bytes) = measure(&value);
                finished.exit_code = Some(exit_code);
                finished.output_bytes = Some(bytes);
                Ok(Guarded::Ran(value))
            }
            Ok(value) => {
                let result = as_result(&value);
                let post = PostToolExecEvent {
                    tool_name: meta.tool.to_string(),
                    args: meta.args.clone(),
                    result: result.clone(),
                    session_key: meta.session.clone().unwrap_or_default(),
                    agent_name: meta.agent.to_string(),
                };
                let after = self.hooks().post_tool_exec(post).await;
                finished.exit_code = Some(after.exit_code);
                finished.output_bytes = Some(after.output.len() as u64);
                let value = if after != result {
                    rewrite(value, after)
                } else {
                    value
                };
                Ok(Guarded::Ran(value))
            }
            Err(message) => {
                finished.exit_code = Some(1);
                finished.error = Some(message.clone());
                Err(message)
            }
        };
        if let Err(e) = self.audit.record(&finished).await {
            tracing::error!(error = %e, tool = meta.tool, agent = meta.agent, "could not audit a finished call");
        }
        match out {
            Ok(g) => Ok(g),
            Err(message) => Ok(Guarded::Failed(message)),
        }
    }

    async fn call_core_cancellable(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
        cancel: Option<&CancellationToken>,
        output: Option<crate::sandbox::OutputSink>,
    ) -> Result<ToolOutput, GatewayError> {
        self.call_core_via(agent, call, ctx, cancel, output, None)
            .await
    }

    /// [`Inner::call_core_cancellable`] for an outside client's connection `via`.
    async fn call_core_via(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
        cancel: Option<&CancellationToken>,
        output: Option<crate::sandbox::OutputSink>,
        via: Option<String>,
    ) -> Result<ToolOutput, GatewayError> {
        let config = self.agent(agent)?;
        if let Some(key) = &ctx.session_key {
            // The context comes from the prompt loop or the API, never from a sandbox.
            let origin = SessionOrigin {
                agent: agent.to_string(),
                channel: ctx
                    .channel
                    .clone()
                    .unwrap_or_else(|| SessionOrigin::of_key(agent, key).channel),
                chat_id: ctx.chat_id.clone(),
                thread_id: ctx.thread_id.clone(),
            };
            self.record_session(key, origin, false);
        }
        let exec = match &call {
            CoreToolCall::Exec(p) => Some((ExecId::mint(), p.command.clone())),
            _ => None,
        };
        let exec_id = exec.as_ref().map(|(id, _)| id.clone());
        let meta = CallMeta {
            agent,
            tool: call.name(),
            kind: ToolKind::Core,
            args: audit_args(&call),
            session: ctx.session_key.clone(),
            channel: ctx.channel.clone(),
            via,
            model: ctx.model.clone(),
            principal: ctx.principal.clone(),
            target: Target::Sandbox,
            unattended: (!ctx.attended)
                .then(|| unattended_origin(ctx.channel.as_deref(), ctx.session_key.as_deref())),
            cwd: None,
            stdin_sha256: None,
            exec: exec_id.clone(),
            attribution: None,
        };
        // An attended call's scripts can reach a human too.
        let _attending = ctx
            .session_key
            .as_deref()
            .filter(|_| ctx.attended)
            .map(|key| self.attend(key));
        let sandbox = self.sandbox.clone();
        let run = async {
            #[cfg(feature = "egress")]
            let since = Instant::now();
            let asked_from = Instant::now();
            // The exec's tool calls are counted while it runs (`budgets.exec.toolCalls`).
            let exec_guard = std::sync::Mutex::new(None);
            let begin_exec = |id: &str| {
                *exec_guard.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(self.exec_budgets.begin(agent, id));
            };
            #[cfg(feature = "egress")]
            let exec_env = |id: &str| {
                begin_exec(id);
                match &self.egress {
                    Some(egress) => egress.exec_env(agent, id),
                    None => Vec::new(),
                }
            };
            #[cfg(not(feature = "egress"))]
            let exec_env = |id: &str| {
                begin_exec(id);
                Vec::new()
            };
            // Known before PID 1 reports its root; ended however the call ends.
            let _running = exec
                .as_ref()
                .map(|(id, command)| RunningExec::register(&self.execs, agent, id, &ctx, command));
            // The op's span; a script's calls attributed to the exec join it.
            let op_cx = {
                let mut attributes = Vec::new();
                if let Some(id) = &exec_id {
                    attributes.push(KeyValue::new(
                        crate::telemetry::names::EXEC_ID,
                        id.as_str().to_string(),
                    ));
                }
                self.traces.child(
                    &opentelemetry::Context::current(),
                    format!(
                        "{} {}",
                        crate::telemetry::names::SPAN_SANDBOX_OP,
                        call.name()
                    ),
                    attributes,
                )
            };
            let _bound = exec_id
                .as_ref()
                .and_then(|id| self.traces.bind_exec(id.as_str(), &op_cx));
            let op_started = Instant::now();
            let out = run_core_tool(
                sandbox.as_ref(),
                agent,
                &config.sandbox,
                &call,
                &ctx,
                cancel,
                output,
                &exec_env,
                exec_id.clone(),
            )
            .with_context(op_cx.clone())
            .await
            .map_err(|e| e.to_string());
            let transport = match &out {
                Ok(o) => o.transport.as_ref().map_or("none", |t| t.as_str()),
                Err(_) => "none",
            };
            self.metrics
                .sandbox_op(call.name(), transport, op_started.elapsed());
            crate::telemetry::end(&op_cx, op_attributes(&out));
            // The exec has ended: its count goes with it.
            drop(exec_guard);
            let out = out?;
            // Egress refused while an exec ran: the model reads why its command failed.
            #[cfg(feature = "egress")]
            let out = match (&call, &self.egress) {
                (CoreToolCall::Exec(_), Some(egress)) => match egress.footer(agent, since) {
                    Some(footer) => with_footer(out, &footer),
                    None => out,
                },
                _ => out,
            };
            // Scripts' calls that wait for (or were refused) approval: the model reads
            // which, and the id to retry with.
            let out = match (&call, ctx.session_key.as_deref()) {
                (CoreToolCall::Exec(_), Some(session)) => {
                    match approvals_footer(&self.approvals.asked_since(session, asked_from)) {
                        Some(footer) => with_footer(out, &footer),
                        None => out,
                    }
                }
                _ => out,
            };
            Ok(out)
        };
        let guarded = self
            .guarded(
                meta,
                run,
                |out: &ToolOutput| ToolResult {
                    output: out.joined_text(),
                    exit_code: i32::from(out.is_error),
                },
                |out: &ToolOutput| (i32::from(out.is_error), joined_len(out)),
                |before, r| {
                    let mut out = ToolOutput::new(
                        vec![crate::tools::ContentBlock::Text { text: r.output }],
                        r.exit_code != 0,
                    );
                    out.transport = before.transport;
                    out
                },
            )
            .await?;
        Ok(match guarded {
            Guarded::Ran(out) => out.with_outcome(ToolOutcome::Ran),
            Guarded::Denied(r) => ToolOutput::error(r.message).with_outcome(ToolOutcome::Denied),
            Guarded::Failed(message) => {
                ToolOutput::error(message).with_outcome(ToolOutcome::Failed)
            }
        })
    }

    /// The session a socket request runs in: the one it names if that exists and
    /// belongs to the agent, else `socket:<agent>`. The payload only *names* the session:
    /// channel, chat and thread come from the gateway's own record of it.
    fn socket_session(&self, agent: &str, ctx: Option<&SessionContext>) -> SessionInfo {
        let named = ctx.and_then(|c| c.session_key.as_deref());
        let origin = named
            .and_then(|key| Some((key, self.session_origin(key)?)))
            .filter(|(_, o)| o.agent == agent);
        match origin {
            Some((key, o)) => SessionInfo {
                agent: agent.to_string(),
                key: key.to_string(),
                channel: o.channel,
                chat_id: o.chat_id,
                thread_id: o.thread_id,
            },
            None => SessionInfo {
                agent: agent.to_string(),
                key: format!("socket:{agent}"),
                channel: "socket".to_string(),
                chat_id: None,
                thread_id: None,
            },
        }
    }

    /// The session of an exec's socket callers: the exec's own, as the gateway recorded
    /// it when the exec started (never anything a request says), else `socket:<agent>`.
    fn exec_session(&self, agent: &str, exec: Option<&ExecRecord>) -> SessionInfo {
        let key = exec.and_then(|e| e.session.key.as_deref());
        let origin = key
            .and_then(|k| Some((k, self.session_origin(k)?)))
            .filter(|(_, o)| o.agent == agent);
        match (origin, key) {
            (Some((key, o)), _) => SessionInfo {
                agent: agent.to_string(),
                key: key.to_string(),
                channel: o.channel,
                chat_id: o.chat_id,
                thread_id: o.thread_id,
            },
            (None, Some(key)) => SessionInfo {
                agent: agent.to_string(),
                key: key.to_string(),
                channel: SessionOrigin::of_key(agent, key).channel,
                chat_id: None,
                thread_id: None,
            },
            (None, None) => self.socket_session(agent, None),
        }
    }

    /// What tool calls of unbound callers get, for `agent`:
    /// `agents.<agent>.policy.unboundCalls` (default `deny` once the agent has a
    /// `policy`); an agent without a `policy` keeps the behaviour from before per-exec
    /// identity ([`UnboundCalls::Session`]) unless other agents spawn it: a sub-agent's
    /// leftover daemon must not get the agent's own rights.
    fn unbound_policy(&self, agent: &str) -> UnboundCalls {
        match self
            .config
            .agents
            .get(agent)
            .and_then(|a| a.policy.as_ref())
            .map(|p| p.unbound_calls)
        {
            Some(crate::policy::UnboundCalls::Deny) => UnboundCalls::Deny,
            None if self.is_spawned_agent(agent) => UnboundCalls::Deny,
            Some(crate::policy::UnboundCalls::Session) | None => UnboundCalls::Session,
        }
    }

    /// A caller whose `BEIGE_EXEC_ID` names another exec than its own: one
    /// `security.exec_id_mismatch` record, in the session of the exec it belongs to.
    async fn audit_exec_mismatch(&self, meta: &CallMeta<'_>, claimed: &str, message: &str) {
        let claimed: String = claimed
            .chars()
            .take(2 * beige_protocol::op::MAX_EXEC_ID_LEN)
            .collect();
        let mut r = AuditRecord::security(
            meta.agent,
            "security.exec_id_mismatch",
            vec![format!("tool={}", meta.tool), format!("claimed={claimed}")],
            AuditDecision::Denied,
        );
        r.session = meta.session.clone();
        r.channel = meta.channel.clone();
        r.exec = meta.exec.clone();
        r.attribution = meta.attribution;
        r.error = Some(message.to_string());
        if let Err(e) = self.audit.record(&r).await {
            tracing::error!(agent = meta.agent, error = %e, "could not audit an exec id mismatch");
        }
    }

    /// A script's plugin call, in an `execute_tool` span under its exec's
    /// `beige.sandbox.op` span (found from the kernel's attribution, never from the
    /// request), or a root of its own when the caller is bound to no running exec.
    async fn handle_tool_request(
        &self,
        agent: &str,
        caller: &Attribution,
        request: ToolRequest,
    ) -> ToolResponse {
        use crate::telemetry::names;
        if !self.traces.is_on() {
            return self.handle_tool_request_in(agent, caller, request).await;
        }
        let parent = self
            .traces
            .exec_context(caller.exec.as_ref().map(|e| e.as_str()));
        // A name the sandbox made up is not put into a span.
        let tool = if self.registry.tool(&request.tool).is_some() {
            request.tool.clone()
        } else {
            "other".to_string()
        };
        let mut attributes = vec![
            KeyValue::new(names::OPERATION, names::SPAN_TOOL),
            KeyValue::new(names::TOOL_NAME, tool.clone()),
            KeyValue::new(names::TOOL_KIND, "plugin"),
            KeyValue::new(names::AGENT_NAME, agent.to_string()),
        ];
        if let Some(exec) = &caller.exec {
            attributes.push(KeyValue::new(names::EXEC_ID, exec.as_str().to_string()));
        }
        attributes.extend(self.traces.args_attribute(&request.args));
        let cx = self
            .traces
            .child(&parent, format!("{} {tool}", names::SPAN_TOOL), attributes);
        let response = self
            .handle_tool_request_in(agent, caller, request)
            .with_context(cx.clone())
            .await;
        crate::telemetry::end(&cx, Vec::new());
        response
    }

    async fn handle_tool_request_in(
        &self,
        agent: &str,
        caller: &Attribution,
        request: ToolRequest,
    ) -> ToolResponse {
        if self.agent(agent).is_err() {
            return ToolResponse::error(format!("unknown agent '{agent}'"), 1);
        }
        let named = request.session_context.as_ref();
        let exec = caller
            .exec
            .as_ref()
            .map(|id| (id, self.execs.get(agent, id)));
        let session = match &exec {
            Some((id, record)) => {
                let session = self.exec_session(agent, record.as_ref());
                if let Some(key) = named.and_then(|c| c.session_key.as_deref()) {
                    if key != session.key {
                        tracing::debug!(agent, exec = %id, named = key, session = %session.key, "a socket call named another session than its exec's; the exec's is used");
                    }
                }
                session
            }
            None => self.socket_session(agent, named),
        };
        let unattended = (!self.is_attended(&session.key)).then(|| {
            format!(
                "a script in session '{}' with no attended prompt running",
                session.key
            )
        });
        let mut meta = CallMeta {
            agent,
            tool: &request.tool,
            kind: ToolKind::Plugin,
            args: request.args.clone(),
            session: Some(session.key.clone()),
            channel: Some(session.channel.clone()),
            via: None,
            model: None,
            principal: Principal::Sandbox,
            target: Target::Gateway,
            unattended,
            cwd: None,
            stdin_sha256: None,
            exec: caller.exec.clone(),
            attribution: Some(caller.method),
        };
        // A schedule run's session may use only the schedule's tools.
        if !crate::schedule::narrow::allows(&session.key, &request.tool) {
            let msg = format!(
                "{}: not allowed for this schedule run (the schedule's tools do not include it)",
                request.tool
            );
            self.audit_denied(&meta, &msg).await;
            return ToolResponse::error(msg, 1);
        }
        // Claims lose: the exec found is the caller's, whatever the request says.
        let claimed = named.and_then(|c| c.exec_id.as_deref());
        match (&exec, claimed) {
            (Some((id, _)), Some(claimed)) if claimed != id.as_str() => {
                let msg = format!(
                    "exec_id_mismatch: this process belongs to exec {id}, but its BEIGE_EXEC_ID says {claimed}; the call was refused. BEIGE_EXEC_ID is a label the gateway checks against the kernel's view of the caller, not a way to choose an exec."
                );
                self.audit_exec_mismatch(&meta, claimed, &msg).await;
                return ToolResponse::error(msg, 1);
            }
            _ => {}
        }
        match &exec {
            Some((id, record)) if record.as_ref().is_none_or(|r| r.ended) => {
                let what = record
                    .as_ref()
                    .map(|r| format!(" (`{}`)", r.command))
                    .unwrap_or_default();
                let msg = format!(
                    "exec_finished: this process belongs to exec {id}{what}, which has ended, so the processes it left running may no longer call tools. Run the work in an exec that waits for it to finish."
                );
                self.audit_denied(&meta, &msg).await;
                return ToolResponse::error(msg, 1);
            }
            None if self.unbound_policy(agent) == UnboundCalls::Deny => {
                let msg = format!(
                    "unbound_call: this process belongs to no exec of agent '{agent}' (an operator's docker exec, or a daemon that left the exec that started it), and unbound calls are refused for this agent."
                );
                self.audit_denied(&meta, &msg).await;
                return ToolResponse::error(msg, 1);
            }
            _ => {}
        }
        // Counted against the exec the kernel says the caller belongs to, never a claim.
        let counted = caller.exec.as_ref().map(|e| e.as_str());
        if let Err(exhausted) = self.exec_budgets.note_call(agent, counted) {
            let message = format!("{}: budget exhausted: {exhausted}", request.tool);
            self.audit_denied(&meta, &message).await;
            self.audit_exec_budget(&meta, &exhausted, counted, &message)
                .await;
            return ToolResponse::error(message, beige_protocol::socket::EXIT_BUDGET_EXHAUSTED);
        }
        let cwd = match validate_cwd(request.cwd.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                self.audit_denied(&meta, &e.0).await;
                return ToolResponse::error(e.0, 1);
            }
        };
        meta.cwd = cwd.clone();
        let stdin = match request
            .stdin
            .as_deref()
            .map(|s| base64::engine::general_purpose::STANDARD.decode(s))
        {
            None => None,
            Some(Ok(bytes)) => Some(bytes),
            Some(Err(e)) => {
                let msg = format!("Invalid request: stdin is not valid base64 ({e})");
                self.audit_denied(&meta, &msg).await;
                return ToolResponse::error(msg, 1);
            }
        };
        meta.stdin_sha256 = stdin
            .as_deref()
            .map(|b| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b)));
        #[cfg(feature = "mcp")]
        if self.is_mcp_server(&request.tool) {
            return self
                .handle_mcp_call(meta, &request.tool, &request.args, stdin)
                .await;
        }
        let registered = self.registry.tool(&request.tool).cloned();
        let tool_config = self
            .registry
            .call_config(&self.config, agent, &request.tool);
        let workspace = self.config.agent_workspace(&self.home, agent);
        let tool_name = request.tool.clone();
        let exec_id = caller.exec.as_ref().map(|e| e.as_str().to_string());
        let run = async move {
            let Some(registered) = registered else {
                return Ok(ToolResult::fail(format!("Unknown tool: {tool_name}"), 1));
            };
            let limit = registered.tool.timeout().unwrap_or(DEFAULT_TOOL_TIMEOUT);
            let call = ToolCall {
                tool: tool_name.clone(),
                args: request.args.clone(),
                stdin,
                cwd,
                workspace,
                session,
                config: tool_config,
                exec: exec_id,
            };
            match tokio::time::timeout(limit, registered.tool.call(call)).await {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(e)) => Err(format!("tool '{tool_name}' failed: {e}")),
                Err(_) => Ok(ToolResult::fail(
                    format!(
                        "tool '{tool_name}' did not finish within {} s and was stopped",
                        limit.as_secs()
                    ),
                    124,
                )),
            }
        };
        match self
            .guarded(
                meta,
                run,
                ToolResult::clone,
                |r: &ToolResult| (r.exit_code, r.output.len() as u64),
                |_, r| r,
            )
            .await
        {
            Ok(Guarded::Ran(mut result)) => {
                truncate_output(&mut result.output);
                ToolResponse::from_result(result.output, result.exit_code)
            }
            // A refusal and a failure read the same on the socket; the audit record
            // tells them apart (`denied`, or `allowed` with an `error`).
            Ok(Guarded::Denied(r)) => ToolResponse::error(r.message, r.exit_code),
            Ok(Guarded::Failed(reason)) => ToolResponse::error(reason, 1),
            Err(e) => ToolResponse::error(e.to_string(), 1),
        }
    }
}

/// The length of `out.joined_text()`, without making it.
fn joined_len(out: &ToolOutput) -> u64 {
    let text = |b: &crate::tools::ContentBlock| match b {
        crate::tools::ContentBlock::Text { text } => Some(text.len()),
        _ => None,
    };
    let lens: Vec<usize> = out.content.iter().filter_map(text).collect();
    (lens.iter().sum::<usize>() + lens.len().saturating_sub(1)) as u64
}

/// An exec registered in the [`ExecRegistry`] while its call runs; marked ended when
/// dropped (its result came, it failed, or the call was abandoned).
struct RunningExec {
    execs: Arc<ExecRegistry>,
    agent: String,
    id: ExecId,
}

impl RunningExec {
    fn register(
        execs: &Arc<ExecRegistry>,
        agent: &str,
        id: &ExecId,
        ctx: &ToolContext,
        command: &str,
    ) -> Self {
        let session = ExecSession {
            key: ctx.session_key.clone(),
            channel: ctx.channel.clone(),
            chat_id: ctx.chat_id.clone(),
            thread_id: ctx.thread_id.clone(),
        };
        execs.register(agent, id, session, command);
        Self {
            execs: execs.clone(),
            agent: agent.to_string(),
            id: id.clone(),
        }
    }
}

impl Drop for RunningExec {
    fn drop(&mut self) {
        self.execs.ended(&self.agent, &self.id);
    }
}

/// `beige.transport` and `beige.exit_code` of a finished sandbox op.
fn op_attributes(out: &Result<ToolOutput, String>) -> Vec<KeyValue> {
    use crate::telemetry::names;
    match out {
        Ok(o) => o
            .transport
            .iter()
            .map(|t| KeyValue::new(names::TRANSPORT, t.as_str().to_string()))
            .collect(),
        Err(_) => vec![KeyValue::new(names::DECISION, "failed")],
    }
}

/// Cut output over [`MAX_RESPONSE_OUTPUT`] at a character boundary, with a note.
fn truncate_output(output: &mut String) {
    if output.len() <= MAX_RESPONSE_OUTPUT {
        return;
    }
    let total = output.len();
    let mut cut = MAX_RESPONSE_OUTPUT;
    while !output.is_char_boundary(cut) {
        cut -= 1;
    }
    output.truncate(cut);
    output.push_str(&format!(
        "\n[output truncated: {total} bytes, the first {cut} shown]\n"
    ));
}

/// The audit `args` of a core tool, as in the original.
/// `out` with `footer` after its text (in its last text block, or a new one).
pub(crate) fn with_footer(mut out: ToolOutput, footer: &str) -> ToolOutput {
    match out.content.iter_mut().rev().find_map(|b| match b {
        crate::tools::ContentBlock::Text { text } => Some(text),
        crate::tools::ContentBlock::Image { .. } => None,
    }) {
        Some(text) => {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(footer);
        }
        None => out.content.push(crate::tools::ContentBlock::Text {
            text: footer.to_string(),
        }),
    }
    out
}

/// `[beige] 1 call waiting for approval: <id> gh pr merge 41` and the like, for the
/// requests an exec's scripts raised; `None` when they raised none.
fn approvals_footer(asked: &[beige_client::approvals::Approval]) -> Option<String> {
    use beige_client::approvals::ApprovalStatus as S;
    let line = |a: &beige_client::approvals::Approval| format!("{} {}", a.id, a.call_line());
    let waiting: Vec<String> = asked
        .iter()
        .filter(|a| a.status == S::Pending)
        .map(line)
        .collect();
    let mut out = Vec::new();
    match waiting.len() {
        0 => {}
        1 => out.push(format!(
            "[beige] 1 call waiting for approval: {}",
            waiting[0]
        )),
        n => out.push(format!(
            "[beige] {n} calls waiting for approval: {}",
            waiting.join("; ")
        )),
    }
    for a in asked.iter().filter(|a| a.status == S::Denied) {
        let by = a.decided_by.as_deref().unwrap_or("?");
        let why = a
            .decision_reason
            .as_deref()
            .map(|r| format!(": \"{r}\""))
            .unwrap_or_default();
        out.push(format!("[beige] {} denied by {by}{why}", line(a)));
    }
    (!out.is_empty()).then(|| out.join("\n"))
}

/// A call as one line for messages: `exec git push`, `kv set k v`.
fn call_line(tool: &str, args: &[String]) -> String {
    std::iter::once(tool)
        .chain(args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a call from a channel's run cannot reach a human; a schedule's run names the
/// schedule (governance.md §3).
fn unattended_origin(channel: Option<&str>, session: Option<&str>) -> String {
    if channel == Some("schedule") {
        if let Some(id) = session.and_then(crate::schedule::engine::schedule_of_key) {
            return format!("schedule {id}");
        }
    }
    match channel {
        Some("api") | None => "a prompt sent without an approvals stream".to_string(),
        Some(c) => format!("a {c} run with no approver attached"),
    }
}

fn audit_args(call: &CoreToolCall) -> Vec<String> {
    match call {
        CoreToolCall::Read(p) => vec![p.path.clone()],
        CoreToolCall::Write(p) => vec![p.path.clone(), format!("({} bytes)", p.content.len())],
        CoreToolCall::Patch(p) => vec![p.path.clone()],
        CoreToolCall::Exec(p) => vec![p.command.clone()],
    }
}

/// The `tool` of the audit record of a socket request whose tool could not be read.
pub(crate) const UNPARSED_TOOL: &str = "(unparsed)";

#[async_trait]
impl Gateway for Engine {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        let model = |m: &crate::config::ModelRef| format!("{}/{}", m.provider, m.model);
        let c = &self.inner.config;
        let mut agents = Vec::with_capacity(c.agents.len());
        for (name, a) in &c.agents {
            agents.push(AgentInfo {
                tool_context: self.inner.tool_context(name).await,
                skill_context: self.inner.skill_context(name),
                name: name.clone(),
                model: model(&a.model),
                fallback_models: a.fallback_models.iter().map(model).collect(),
                tools: a.tools.clone(),
                skills: a.skills.clone(),
                workspace_dir: c.agent_workspace(&self.inner.home, name),
            });
        }
        Ok(agents)
    }

    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        self.inner
            .call_core_cancellable(agent, call, ctx, None, None)
            .await
    }

    async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
        self.inner.agent(&request.agent)?;
        if matches!(
            request.principal,
            Principal::Person { .. } | Principal::User { .. }
        ) {
            self.inner
                .require_prompt(&request.principal, &request.agent, &request.session_key)
                .await?;
        }
        self.inner.audit_prompt(&request).await;
        self.inner.disk.check(&request.agent).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let key = request.session_key.clone();
        let inner = self.inner.clone();
        let token = cancel.clone();
        let id = NEXT_PROMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .push((id, token.clone()));
        tokio::spawn(async move {
            inner.run_prompt(request, tx, token).await;
            let mut running = inner.running.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(list) = running.get_mut(&key) {
                list.retain(|(i, _)| *i != id);
                if list.is_empty() {
                    running.remove(&key);
                }
            }
        });
        Ok(AgentEventStream::new(rx, cancel))
    }

    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
        self.inner.agent(agent)?;
        let tokens: Vec<CancellationToken> = self
            .inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session_key)
            .map(|l| l.iter().map(|(_, t)| t.clone()).collect())
            .unwrap_or_default();
        let mut any = false;
        for t in tokens.into_iter().filter(|t| !t.is_cancelled()) {
            t.cancel();
            any = true;
        }
        Ok(any)
    }
}

#[async_trait]
impl Sessions for Engine {
    async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
        self.inner.agent(agent)?;
        Ok(self.inner.store.list_sessions(agent).await?)
    }

    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.inner.agent(agent)?;
        let old = self.inner.store.current_session(session_key).await?;
        let model = self
            .inner
            .config
            .agents
            .get(agent)
            .map(|a| model_key(&a.model));
        let s = self
            .inner
            .store
            .create_session(crate::store::NewSession {
                agent: agent.to_string(),
                key: session_key.to_string(),
                parent_id: None,
                model,
            })
            .await?;
        let channel = session_key.split(':').next().unwrap_or("").to_string();
        if old.is_some() {
            self.inner
                .hooks()
                .session_disposed(&crate::hooks::SessionEvent {
                    session_key: session_key.to_string(),
                    agent_name: agent.to_string(),
                    channel: channel.clone(),
                })
                .await;
        }
        self.inner
            .hooks()
            .session_created(&crate::hooks::SessionEvent {
                session_key: session_key.to_string(),
                agent_name: agent.to_string(),
                channel,
            })
            .await;
        Ok(s)
    }

    async fn resume_session(
        &self,
        agent: &str,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.inner.agent(agent)?;
        let unknown = || GatewayError::UnknownSession {
            agent: agent.to_string(),
            session: session_id.to_string(),
        };
        let s = self
            .inner
            .store
            .get_session(session_id)
            .await?
            .ok_or_else(unknown)?;
        if s.agent != agent {
            return Err(unknown());
        }
        self.inner
            .store
            .set_current_session(session_key, session_id)
            .await?;
        Ok(s)
    }

    async fn session_messages(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, GatewayError> {
        self.inner.agent(agent)?;
        let unknown = || GatewayError::UnknownSession {
            agent: agent.to_string(),
            session: session_id.to_string(),
        };
        let s = self
            .inner
            .store
            .get_session(session_id)
            .await?
            .ok_or_else(unknown)?;
        if s.agent != agent {
            return Err(unknown());
        }
        Ok(self
            .inner
            .store
            .messages(session_id, false)
            .await?
            .into_iter()
            .map(|m| m.message)
            .collect())
    }

    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
        Ok(self.inner.store.get_settings(session_key).await?)
    }

    async fn update_settings(
        &self,
        agent: &str,
        session_key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError> {
        let a = self.inner.agent(agent)?;
        if let Some(Some(model)) = &patch.model_override {
            let allowed: Vec<String> = std::iter::once(&a.model)
                .chain(a.fallback_models.iter())
                .map(model_key)
                .collect();
            if !allowed.contains(model) {
                return Err(GatewayError::ModelNotAllowed {
                    agent: agent.to_string(),
                    requested: model.clone(),
                    allowed: allowed.join(", "),
                });
            }
        }
        Ok(self.inner.store.update_settings(session_key, patch).await?)
    }
}

impl Engine {
    /// The approvals broker (for channels in process: Telegram's buttons, the HTTP
    /// event stream).
    pub(crate) fn approvals_broker(&self) -> Arc<crate::approvals::Approvals> {
        self.inner.approvals.clone()
    }
}

/// Who `principal` is as an approver: the API token's holder is the owner; a channel
/// user a member of their own chat's sessions.
pub(crate) fn approver_for(principal: Principal, via: &str) -> crate::approvals::Approver {
    use crate::approvals::{Approver, ApproverRole};
    let role = match &principal {
        Principal::User { channel, id } => ApproverRole::Member {
            sessions: format!("{channel}:{id}"),
        },
        _ => ApproverRole::Owner,
    };
    Approver {
        principal,
        role,
        via: via.to_string(),
    }
}

/// The gateway error of a decision that was not taken.
pub(crate) fn decide_error(e: crate::approvals::DecideError) -> GatewayError {
    use crate::approvals::DecideError as D;
    let status = match &e {
        D::NotFound(_) => 404,
        D::Settled { .. } | D::DigestMismatch { .. } => 409,
        D::Forbidden(_) => 403,
        D::Invalid(_) => 400,
    };
    GatewayError::Approval {
        status,
        message: e.to_string(),
    }
}

#[async_trait]
impl Admin for Engine {
    async fn authenticate(
        &self,
        token: &str,
    ) -> Result<Option<beige_client::auth::Caller>, GatewayError> {
        self.inner.authenticate(token).await
    }

    async fn create_token(
        &self,
        new: beige_client::auth::NewToken,
    ) -> Result<beige_client::auth::MintedToken, GatewayError> {
        self.inner.create_token(new).await
    }

    async fn audit_auth(&self, event: beige_client::auth::AuthEvent) {
        self.inner.audit_auth_event(event).await
    }

    async fn tokens(
        &self,
        user: Option<&str>,
    ) -> Result<Vec<beige_client::auth::TokenInfo>, GatewayError> {
        Ok(self.inner.credentials.list_tokens(user).await?)
    }

    async fn revoke_token(&self, id: &str) -> Result<beige_client::auth::TokenInfo, GatewayError> {
        self.inner.revoke_token(id).await
    }

    async fn agent_tools(&self, agent: &str) -> Result<Vec<beige_client::AgentTool>, GatewayError> {
        self.inner.outside_tools(agent).await
    }

    async fn mcp_servers(
        &self,
        agent: &str,
    ) -> Result<Vec<beige_client::McpServerView>, GatewayError> {
        self.inner.agent(agent)?;
        #[cfg(feature = "mcp")]
        return Ok(self.inner.mcp_servers(agent).await);
        #[cfg(not(feature = "mcp"))]
        Ok(Vec::new())
    }

    async fn call_agent_tool(
        &self,
        agent: &str,
        call: beige_client::AgentToolCall,
        ctx: ToolContext,
        via: &str,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, GatewayError> {
        self.inner
            .call_agent_tool(agent, call, ctx, via, cancel)
            .await
    }

    async fn approvals(
        &self,
        agent: Option<&str>,
    ) -> Result<Vec<beige_client::approvals::Approval>, GatewayError> {
        Ok(self.inner.approvals.list(agent))
    }

    async fn decide_approval(
        &self,
        id: &str,
        decision: beige_client::approvals::ApprovalDecision,
        approver: Principal,
    ) -> Result<beige_client::approvals::Approval, GatewayError> {
        // People's roles first (spec/people.md §1.2), whichever channel the decision
        // came through; the broker then applies its own rules (binding, scope).
        let approver = match self.inner.approvals.get(id) {
            Some(approval) => {
                self.inner
                    .require_decide(&approver, &approval, &decision)
                    .await?;
                self.inner.person_of(approver)
            }
            None => approver,
        };
        let via = match &approver {
            Principal::User { channel, .. } => channel.clone(),
            Principal::ApiToken => "api".to_string(),
            Principal::Person { via, .. } => via.clone(),
            _ => "gateway".to_string(),
        };
        self.inner
            .approvals
            .decide(id, &decision, &approver_for(approver, &via))
            .await
            .map_err(decide_error)
    }

    async fn health(&self) -> Result<HashMap<String, ModelHealth>, GatewayError> {
        Ok(self.inner.router.health.all())
    }

    async fn models(&self, agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
        let a = self.inner.agent(agent)?;
        let health = self.inner.router.health.all();
        Ok(std::iter::once((&a.model, "primary"))
            .chain(a.fallback_models.iter().map(|m| (m, "fallback")))
            .map(|(m, role)| AllowedModel {
                provider: m.provider.clone(),
                model: m.model.clone(),
                role: role.to_string(),
                thinking_level: m.thinking_level,
                info: crate::llm::catalog::lookup(&m.model, self.inner.model_overrides(m)),
                health: health.get(&model_key(m)).cloned(),
            })
            .collect())
    }

    async fn config_summary(&self) -> Result<serde_json::Value, GatewayError> {
        let c = &self.inner.config;
        let providers: serde_json::Map<String, serde_json::Value> = c
            .llm
            .providers
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    serde_json::json!({
                        "api": p.api.or_else(|| crate::llm::default_api(name)),
                        "baseUrl": p.base_url.clone().or_else(|| crate::llm::default_base_url(name).map(str::to_string)),
                        "hasApiKey": p.api_key.as_deref().is_some_and(|k| !k.is_empty()),
                        "concurrency": p.concurrency,
                    }),
                )
            })
            .collect();
        let agents: serde_json::Map<String, serde_json::Value> = c
            .agents
            .iter()
            .map(|(name, a)| {
                (
                    name.clone(),
                    serde_json::json!({
                        "model": a.model,
                        "fallbackModels": a.fallback_models,
                        "tools": a.tools,
                        "skills": a.skills,
                        "workspaceDir": c.agent_workspace(&self.inner.home, name),
                        "sandbox": {
                            "image": a.sandbox.image,
                            "memoryLimit": a.sandbox.memory_limit,
                            "network": a.sandbox.network,
                        },
                    }),
                )
            })
            .collect();
        Ok(serde_json::json!({
            "agents": agents,
            "providers": providers,
            "telemetry": self.telemetry_summary(),
        }))
    }

    async fn run_hook(
        &self,
        agent: &str,
        hook: crate::hooks::HookName,
        event: serde_json::Value,
    ) -> Result<serde_json::Value, GatewayError> {
        use crate::hooks::*;
        self.inner.agent(agent)?;
        let bad = |source: serde_json::Error| GatewayError::InvalidHookEvent { hook, source };
        let mut event = event;
        if let serde_json::Value::Object(o) = &mut event {
            // Identity comes from the route, never from the body.
            o.insert(
                "agentName".into(),
                serde_json::Value::String(agent.to_string()),
            );
            o.entry("channel")
                .or_insert_with(|| serde_json::Value::String("api".into()));
        }
        let hooks = self.inner.hooks();
        Ok(match hook {
            HookName::PrePrompt => {
                let e: PrePromptEvent = serde_json::from_value(event).map_err(bad)?;
                match hooks.pre_prompt(e).await {
                    PromptDecision::Continue(message) => serde_json::json!({"message": message}),
                    PromptDecision::Blocked(reason) => {
                        serde_json::json!({"block": true, "reason": reason})
                    }
                }
            }
            HookName::PostResponse => {
                let e: PostResponseEvent = serde_json::from_value(event).map_err(bad)?;
                match hooks.post_response(e).await {
                    ResponseDecision::Continue(response) => {
                        serde_json::json!({"response": response})
                    }
                    ResponseDecision::Blocked => serde_json::json!({"block": true}),
                }
            }
            HookName::SessionCreated => {
                let e: SessionEvent = serde_json::from_value(event).map_err(bad)?;
                hooks.session_created(&e).await;
                serde_json::json!({})
            }
            HookName::SessionDisposed => {
                let e: SessionEvent = serde_json::from_value(event).map_err(bad)?;
                hooks.session_disposed(&e).await;
                serde_json::json!({})
            }
            other => return Err(GatewayError::HookNotTriggerable { hook: other }),
        })
    }

    async fn disk_status(&self) -> Result<Option<crate::disk::DiskStatus>, GatewayError> {
        Ok(Some(self.inner.disk.status().await))
    }

    async fn usage(
        &self,
        query: crate::store::UsageQuery,
    ) -> Result<crate::store::UsageReport, GatewayError> {
        if let Some(agent) = &query.agent {
            self.inner.agent(agent)?;
        }
        Ok(self.inner.ledger.usage_report(query).await?)
    }

    async fn sandbox_status(&self, agent: &str) -> Result<SandboxStatus, GatewayError> {
        self.inner.agent(agent)?;
        Ok(self.inner.sandbox.status(agent).await)
    }
}

/// Write the default `AGENTS.md` into a new workspace, owned by the sandbox user.
fn seed_agents_md(workspace: &Path, user: SandboxUser) -> Result<(), SandboxError> {
    let owner = match user {
        SandboxUser::Id { uid, gid } => Some((uid, gid)),
        _ => None,
    };
    crate::agent::prompt::seed_agents_md(workspace, owner)
        .map_err(|e| SandboxError::host(workspace.join("AGENTS.md"), std::io::Error::other(e)))?;
    Ok(())
}

/// The free-space guard over the filesystems of `BEIGE_HOME` (store, audit log, sockets),
/// the gateway log and every agent's workspace.
fn disk_guard(
    config: &Config,
    home: &BeigeHome,
    probe: crate::disk::Probe,
    audit: Arc<dyn AuditSink>,
) -> crate::disk::DiskGuard {
    use crate::disk::WatchPath;
    let mut paths = vec![
        WatchPath::shared(home.root(), "BEIGE_HOME with the store"),
        WatchPath::shared(home.logs_dir(), "the audit log"),
    ];
    let gateway_log = config
        .gateway
        .log_file
        .clone()
        .unwrap_or_else(|| home.gateway_log_path());
    if let Some(dir) = gateway_log.parent() {
        paths.push(WatchPath::shared(dir, "the gateway log"));
    }
    for name in config.agents.keys() {
        paths.push(WatchPath::workspace(
            config.agent_workspace(home, name),
            name,
        ));
    }
    // A folder not made yet (the logs of an embedder's own audit sink) is watched where
    // it would be made.
    for p in &mut paths {
        if let Some(existing) = p.path.ancestors().find(|a| a.exists()) {
            p.path = existing.to_path_buf();
        }
    }
    crate::disk::DiskGuard::new(config.gateway.min_free_space, paths, probe, Some(audit))
}

/// Provider clients from config (or given by the embedder), health from the store.
async fn build_router(
    config: &Config,
    store: Arc<dyn HealthStore>,
    given: Vec<Arc<dyn LlmProvider>>,
) -> Result<Router, GatewayError> {
    let initial: HashMap<String, ModelHealth> = store
        .load_health()
        .await?
        .into_iter()
        .map(|r| {
            (
                r.model_key,
                ModelHealth {
                    cooldown_until: r.cooldown_until.and_then(|v| u64::try_from(v).ok()),
                    consecutive_failures: r.consecutive_failures,
                    last_error: r.last_error,
                },
            )
        })
        .collect();
    let handle = tokio::runtime::Handle::current();
    let sink: crate::agent::router::HealthSink = Arc::new(move |key: &str, h: &ModelHealth| {
        let record = HealthRecord {
            model_key: key.to_string(),
            cooldown_until: h.cooldown_until.and_then(|v| i64::try_from(v).ok()),
            consecutive_failures: h.consecutive_failures,
            last_error: h.last_error.clone(),
        };
        let store = store.clone();
        handle.spawn(async move {
            if let Err(e) = store.save_health(record).await {
                tracing::warn!(error = %e, "could not persist provider health");
            }
        });
    });
    let mut router = Router::new(HealthTracker::new(initial, Some(sink)));
    for (name, p) in &config.llm.providers {
        if let Some(client) = given.iter().find(|g| g.name() == name) {
            router.add(client.clone(), p.concurrency);
            continue;
        }
        match crate::llm::client_for(name, p) {
            Ok(client) => router.add(client, p.concurrency),
            // A provider whose client is left out of the build: refuse to start.
            Err(crate::llm::LlmError::NotCompiledIn {
                provider,
                client,
                feature,
            }) => {
                return Err(GatewayError::NotCompiledIn {
                    what: format!("llm.providers.{provider}: the {client} provider"),
                    feature,
                })
            }
            Err(e) => tracing::warn!(provider = %name, error = %e, "provider unavailable"),
        }
    }
    for g in given {
        if !router.has(g.name()) {
            router.add(g, -1);
        }
    }
    Ok(router)
}
