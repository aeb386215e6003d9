//! Serving: the reloadable [`LocalGateway`], the channels it runs, signals, draining and
//! in-place reload.
//!
//! Owns what the daemon used to do itself, so an embedder gets the same: a
//! [`LocalGateway`] wraps the built engine behind a lock that a reload swaps (channels
//! and callers keep their handle and reach the new engine), [`LocalGateway::serve`] runs
//! the channels registered on the builder until [`Shutdown`] says stop, and
//! [`LocalGateway::reload`] rebuilds with the same injected parts and a new config in
//! today's order — load (keep serving on error), drain, stop keeping the containers,
//! build, roll back on failure. It knows no specific channel and no process concerns (PID
//! file, logs, exit codes): those stay in the binary.

use beige_client::schedules::{ScheduleAuthor, ScheduleRun, ScheduleSpec, ScheduleView};
use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
#[cfg(feature = "test-util")]
use beige_protocol::socket::{ToolRequest, ToolResponse};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    Admin, AgentEventStream, AgentInfo, AllowedModel, Engine, Gateway, GatewayBuilder,
    GatewayError, GatewayFull, PromptRequest, SandboxStatus, Sessions,
};
use crate::agent::router::ModelHealth;
use crate::channel::{Channel, ChannelContext, ChannelError, ReloadHandle};
use crate::config::{Config, LoadedConfig};
use crate::home::BeigeHome;
use crate::hooks::HookName;
use crate::llm::Message;
use crate::plugin::PluginRegistry;
use crate::sandbox::ReconcileReport;
#[cfg(feature = "test-util")]
use crate::sandbox::SandboxSpec;
use crate::skills::SkillSet;
use crate::store::{SessionRecord, SessionSettings, SettingsPatch};
use crate::tools::{CoreToolCall, ToolContext, ToolOutput};

/// How long [`LocalGateway::serve`] and [`LocalGateway::reload`] wait for running
/// prompts before they cancel them, unless [`Shutdown::drain`] says otherwise.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);

/// How long a stopping channel gets to end its `run` once its token fired.
const CHANNEL_STOP: Duration = Duration::from_secs(2);

pub(crate) use crate::api::BoxError;

/// A channel registered on the builder, run by [`LocalGateway::serve`].
#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) channel: Arc<dyn Channel>,
    /// A required channel's failure stops `serve`; an optional one's is logged.
    pub(crate) required: bool,
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("channel", &self.channel.name())
            .field("required", &self.required)
            .finish()
    }
}

/// Where [`LocalGateway::reload`] gets the next config from when a reload is requested
/// (SIGHUP, `POST /api/gateway/restart`).
#[async_trait]
pub trait ConfigSource: Send + Sync + fmt::Debug {
    /// Load the config to run next. An error keeps the running gateway as it is; its
    /// text is the reload's outcome.
    async fn load(&self) -> Result<LoadedConfig, BoxError>;
}

/// The default [`ConfigSource`]: read the config file again.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    home: BeigeHome,
}

impl ConfigFile {
    /// Re-read `path`, interpolating against `home`.
    pub fn new(path: impl Into<PathBuf>, home: BeigeHome) -> Self {
        Self {
            path: path.into(),
            home,
        }
    }
}

#[async_trait]
impl ConfigSource for ConfigFile {
    async fn load(&self) -> Result<LoadedConfig, BoxError> {
        Config::load(&self.path, &self.home).map_err(|e| format!("config error: {e}").into())
    }
}

/// What one reload did. `Display` is the text the daemon reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadOutcome {
    /// The new config is running.
    pub ok: bool,
    /// What happened, for people.
    pub message: String,
}

impl ReloadOutcome {
    fn ok(message: String) -> Self {
        Self { ok: true, message }
    }

    fn failed(message: String) -> Self {
        Self { ok: false, message }
    }
}

impl fmt::Display for ReloadOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why [`LocalGateway::serve`] ended with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A channel registered with [`GatewayBuilder::channel`] failed.
    #[error("channel '{channel}' failed")]
    Channel {
        /// The failed channel's name.
        channel: String,
        /// What it failed with.
        #[source]
        source: ChannelError,
    },
    /// The store is shared and another gateway took an agent's lease (or it could not be
    /// renewed in time): this one stopped rather than drive that agent too.
    #[error("lost an agent's lease to another gateway on the shared store (store.url), or could not renew it in time; stopped so that only one gateway drives each agent")]
    LeaseLost,
    /// `serve` was called a second time.
    #[error("the gateway is already serving (its channels run once)")]
    AlreadyServing,
    /// Waiting for a signal failed.
    #[error("could not wait for signals")]
    Signals(#[source] std::io::Error),
    /// Stopping the engine failed.
    #[error("shutdown failed")]
    Shutdown(#[source] GatewayError),
    /// Stopping the engine did not finish in time.
    #[error("shutdown did not finish within {} s", .0.as_secs())]
    ShutdownTimeout(Duration),
    /// `telemetry.metrics.listen` is not an address the metrics listener may use.
    #[error("{message}")]
    MetricsListen {
        /// What is wrong with it and what to write instead (names the key and value).
        message: String,
    },
    /// The metrics listener could not listen on its address.
    #[error("cannot listen for metrics on {addr} (telemetry.metrics.listen); is another gateway or exporter using that port?")]
    MetricsBind {
        /// The address it tried.
        addr: std::net::SocketAddr,
        /// Why the bind failed.
        #[source]
        source: std::io::Error,
    },
}

/// When [`LocalGateway::serve`] stops: a token, and with [`Shutdown::on_signals`] also
/// SIGTERM and SIGINT (SIGHUP reloads). A second stop request skips the drain.
pub struct Shutdown {
    token: CancellationToken,
    /// The token already said stop (it is not asked again for the second request).
    token_seen: bool,
    #[cfg(unix)]
    signals: Option<Signals>,
    drain: Duration,
}

impl fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Shutdown");
        d.field("cancelled", &self.token.is_cancelled());
        #[cfg(unix)]
        d.field("signals", &self.signals.is_some());
        d.field("drain", &self.drain).finish()
    }
}

#[cfg(unix)]
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// What [`Shutdown::next`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    Stop,
    Reload,
}

impl Shutdown {
    /// Stop when `token` is cancelled.
    pub fn on(token: CancellationToken) -> Self {
        Self {
            token,
            token_seen: false,
            #[cfg(unix)]
            signals: None,
            drain: DEFAULT_DRAIN,
        }
    }

    /// Stop on SIGTERM or SIGINT, reload on SIGHUP (and stop when [`Shutdown::token`] is
    /// cancelled). Must be called inside a Tokio runtime.
    #[cfg(unix)]
    pub fn on_signals() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut s = Self::on(CancellationToken::new());
        s.signals = Some(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        });
        Ok(s)
    }

    /// Wait at most `limit` for running prompts before stopping (default 10 s).
    pub fn drain(mut self, limit: Duration) -> Self {
        self.drain = limit;
        self
    }

    /// The token that stops serving when cancelled.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// The next stop or reload request.
    async fn next(&mut self) -> Request {
        let token = self.token.clone();
        let by_token = async {
            if self.token_seen {
                std::future::pending::<()>().await;
            }
            token.cancelled().await;
        };
        #[cfg(unix)]
        if let Some(s) = self.signals.as_mut() {
            let request = tokio::select! {
                _ = by_token => None,
                _ = s.term.recv() => { tracing::info!("SIGTERM: stopping"); Some(Request::Stop) }
                _ = s.int.recv() => { tracing::info!("SIGINT: stopping"); Some(Request::Stop) }
                _ = s.hup.recv() => { tracing::info!("SIGHUP: restarting in place"); Some(Request::Reload) }
            };
            return match request {
                Some(r) => r,
                None => {
                    self.token_seen = true;
                    Request::Stop
                }
            };
        }
        by_token.await;
        self.token_seen = true;
        Request::Stop
    }

    /// The next stop request (reload requests are ignored).
    async fn next_stop(&mut self) {
        while self.next().await != Request::Stop {}
    }
}

/// What [`LocalGateway`] shares between its clones.
struct Shared {
    home: BeigeHome,
    /// The store for the life of the gateway (a reload keeps it); channels get it too.
    stores: Option<crate::store::Stores>,
    /// The engine serving now. Read without waiting; replaced only under `gate`.
    current: std::sync::RwLock<Arc<Engine>>,
    /// Calls take it shared to pick the engine; a reload holds it exclusively while the
    /// old engine stops and the new one starts, so calls arriving meanwhile wait and
    /// then reach the new one.
    gate: tokio::sync::RwLock<()>,
    /// The parts to build with again, holding the config now in force.
    template: tokio::sync::Mutex<GatewayBuilder>,
    /// Where the metrics listener listens while `serve` runs it.
    metrics_addr: std::sync::Mutex<Option<std::net::SocketAddr>>,
    /// The channels `serve` runs (taken by the first `serve`).
    channels: std::sync::Mutex<Option<Vec<Registered>>>,
    /// Every registered channel, for [`LocalGateway::send`].
    senders: Vec<Arc<dyn Channel>>,
    source: Option<Arc<dyn ConfigSource>>,
    outcomes: watch::Sender<Option<ReloadOutcome>>,
    reloads: AtomicU64,
    /// The schedule engine (its tick task runs while `serve` does).
    scheduler: Option<Arc<crate::schedule::engine::Scheduler>>,
    /// The agents' leases, when the store is shared (`store.url`); renewed while
    /// `serve` runs, given back when the gateway stops.
    leases: Option<Arc<super::leases::AgentLeases>>,
}

/// Where a built-in tool made while the gateway is built (the `schedule` tool) finds
/// the finished [`LocalGateway`], weakly, so that it does not keep the gateway alive.
/// The builder holds it, so every engine a reload builds shares it.
#[derive(Clone, Default)]
pub(crate) struct GatewaySlot(Arc<std::sync::OnceLock<std::sync::Weak<Shared>>>);

impl fmt::Debug for GatewaySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewaySlot")
            .field("set", &self.0.get().is_some())
            .finish()
    }
}

impl GatewaySlot {
    /// Point the slot at the gateway (once; later calls are ignored).
    fn set(&self, shared: &Arc<Shared>) {
        let _ = self.0.set(Arc::downgrade(shared));
    }

    /// The gateway, while it is up.
    pub(crate) fn get(&self) -> Option<LocalGateway> {
        self.0
            .get()
            .and_then(std::sync::Weak::upgrade)
            .map(|shared| LocalGateway { shared })
    }
}

/// The in-process gateway: built by [`GatewayBuilder::build`], served by
/// [`LocalGateway::serve`], replaced in place by [`LocalGateway::reload`]. Cheap to
/// clone; every clone and every channel sees the engine of the latest reload.
#[derive(Clone)]
pub struct LocalGateway {
    shared: Arc<Shared>,
}

impl fmt::Debug for LocalGateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalGateway")
            .field("agents", &self.engine_now().inner.config.agents.len())
            .field("reloads", &self.shared.reloads.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

/// A part of the engine serving when it was taken; a later reload does not change it.
pub struct Snapshot<T: ?Sized + 'static> {
    engine: Arc<Engine>,
    get: fn(&Engine) -> &T,
}

impl<T: ?Sized> Deref for Snapshot<T> {
    type Target = T;
    fn deref(&self) -> &T {
        (self.get)(&self.engine)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Snapshot<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl GatewayBuilder {
    /// Run `channel` in [`LocalGateway::serve`]; a failure to start (or a later error)
    /// stops serving. Tools the channel brings ([`Channel::plugin`]) are registered.
    pub fn channel(mut self, channel: Arc<dyn Channel>) -> Self {
        self.channels.push(Registered {
            channel,
            required: true,
        });
        self
    }

    /// Like [`GatewayBuilder::channel`], but a failure is logged and the other channels
    /// keep serving (the daemon's Telegram channel).
    pub fn channel_optional(mut self, channel: Arc<dyn Channel>) -> Self {
        self.channels.push(Registered {
            channel,
            required: false,
        });
        self
    }

    /// Reload from `source` on SIGHUP and `POST /api/gateway/restart`. Without one,
    /// the file given to [`GatewayBuilder::config_file`] is read again; without that
    /// either, the restart route answers 501.
    pub fn config_source(mut self, source: Arc<dyn ConfigSource>) -> Self {
        self.config_source = Some(source);
        self
    }

    /// Start the gateway (see `build_engine` for what starting does) and wrap it so it
    /// can be served and reloaded.
    pub async fn build(mut self) -> Result<LocalGateway, GatewayError> {
        let channels = std::mem::take(&mut self.channels);
        for r in &channels {
            if let Some(plugin) = r.channel.plugin() {
                if !self.plugins.iter().any(|p| p.name() == plugin.name()) {
                    self.plugins.push(plugin);
                }
            }
        }
        let source = self.config_source.take().or_else(|| {
            self.config_file.as_ref().map(|p| {
                Arc::new(ConfigFile::new(p.clone(), self.home.clone())) as Arc<dyn ConfigSource>
            })
        });
        // One store for the life of the gateway: a reload keeps the same handle.
        if self.store.is_none() {
            self.store = Some(super::open_default_store(&self.home, &self.config).await?);
        }
        // A store shared with other gateways: this one's agents are leased to it before
        // any of their sandboxes is touched.
        let leases = match (&self.config.store, &self.store) {
            (Some(_), Some(stores)) => {
                let (installation, _) = self.home.ensure_installation_id()?;
                let names = self
                    .config
                    .agents
                    .keys()
                    .map(|a| format!("agent:{a}"))
                    .chain(
                        channels
                            .iter()
                            .map(|r| r.channel.name())
                            .filter(|n| super::leases::EXCLUSIVE_CHANNELS.contains(n))
                            .map(|n| format!("channel:{n}")),
                    )
                    .collect::<Vec<_>>();
                let cluster = self.config.cluster.clone().unwrap_or_default();
                let holder = super::leases::holder_name(installation.as_str());
                let ttl = cluster.lease_ttl();
                let leases = if cluster.standby {
                    super::leases::AgentLeases::acquire_waiting(
                        stores.coordination.clone(),
                        holder,
                        names,
                        ttl,
                    )
                    .await?
                } else {
                    super::leases::AgentLeases::acquire(
                        stores.coordination.clone(),
                        holder,
                        names,
                        ttl,
                    )
                    .await?
                };
                Some(Arc::new(leases))
            }
            _ => None,
        };
        self.agent_leases = leases.clone();
        let engine = match self.clone().build_engine().await {
            Ok(engine) => engine,
            Err(e) => {
                if let Some(leases) = &leases {
                    leases.release().await;
                }
                return Err(e);
            }
        };
        let (outcomes, _) = watch::channel(None);
        let clock = self
            .schedule_clock
            .clone()
            .unwrap_or_else(|| Arc::new(crate::schedule::SystemClock));
        let scheduler = self.store.as_ref().map(|stores| {
            Arc::new(crate::schedule::engine::Scheduler::new(
                stores.schedules.clone(),
                stores.channels.clone(),
                clock,
            ))
        });
        let slot = self.gateway_slot.clone();
        let gateway = LocalGateway {
            shared: Arc::new(Shared {
                home: self.home.clone(),
                stores: self.store.clone(),
                current: std::sync::RwLock::new(Arc::new(engine)),
                gate: tokio::sync::RwLock::new(()),
                template: tokio::sync::Mutex::new(self),
                senders: channels.iter().map(|r| r.channel.clone()).collect(),
                channels: std::sync::Mutex::new(Some(channels)),
                source,
                outcomes,
                reloads: AtomicU64::new(0),
                scheduler,
                metrics_addr: std::sync::Mutex::new(None),
                leases,
            }),
        };
        slot.set(&gateway.shared);
        Ok(gateway)
    }
}

impl LocalGateway {
    /// The engine serving now, without waiting for a reload in progress.
    fn engine_now(&self) -> Arc<Engine> {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The engine to run a call on: waits while a reload swaps it.
    async fn engine(&self) -> Arc<Engine> {
        let _gate = self.shared.gate.read().await;
        self.engine_now()
    }

    fn snapshot<T: ?Sized>(&self, get: fn(&Engine) -> &T) -> Snapshot<T> {
        Snapshot {
            engine: self.engine_now(),
            get,
        }
    }

    /// Send `text` unprompted to `chat_id` (and `thread_id`) through the registered
    /// channel named `channel` (a schedule's result, a notice): what [`Channel::send`]
    /// is for. A channel that cannot send on its own answers
    /// [`ChannelError::Unsupported`]; an unregistered name is [`ChannelError::Unknown`].
    pub async fn send(
        &self,
        channel: &str,
        chat_id: &str,
        thread_id: Option<&str>,
        text: &str,
    ) -> Result<(), ChannelError> {
        let Some(c) = self.shared.senders.iter().find(|c| c.name() == channel) else {
            let known: Vec<&str> = self.shared.senders.iter().map(|c| c.name()).collect();
            return Err(ChannelError::Unknown {
                channel: channel.to_string(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            });
        };
        c.send(chat_id, thread_id, text).await
    }

    /// The config in force.
    pub fn config(&self) -> Snapshot<Config> {
        self.snapshot(|e| e.config())
    }

    /// The gateway's `BEIGE_HOME` (a reload keeps it).
    pub fn home(&self) -> &BeigeHome {
        &self.shared.home
    }

    /// The sandbox specs the engine started with. A test seam (feature `test-util`).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn specs(&self) -> Snapshot<[SandboxSpec]> {
        self.snapshot(|e| e.specs())
    }

    /// What the engine's start did to the containers.
    pub fn reconcile_report(&self) -> Snapshot<ReconcileReport> {
        self.snapshot(|e| e.reconcile_report())
    }

    /// The registered plugins and their tools.
    pub fn registry(&self) -> Snapshot<PluginRegistry> {
        self.snapshot(|e| e.registry())
    }

    /// Standalone and plugin skills.
    pub fn skills(&self) -> Snapshot<SkillSet> {
        self.snapshot(|e| e.skills())
    }

    /// Record that `session_key` belongs to `agent` (sessions named by scripts in the
    /// sandbox are honoured only when known and owned by the calling agent). A test seam
    /// (feature `test-util`).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn register_session(&self, agent: &str, session_key: &str) {
        self.engine_now().register_session(agent, session_key);
    }

    /// Handle a tool request as if it arrived on `agent`'s socket. A test seam (feature
    /// `test-util`).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub async fn handle_tool_request(&self, agent: &str, request: ToolRequest) -> ToolResponse {
        self.engine()
            .await
            .handle_tool_request(agent, request)
            .await
    }

    /// Stop: fire `gatewayShutdown`, stop plugins (reverse order), close the sockets,
    /// and remove the sandboxes unless `gateway.keepSandboxes` is set.
    pub async fn shutdown(&self) -> Result<(), GatewayError> {
        let engine = self.engine().await;
        self.end_egress().await;
        let stopped = engine.shutdown().await;
        self.release_leases().await;
        stopped
    }

    /// Stop, removing the sandboxes unless `keep_sandboxes`.
    pub async fn stop(&self, keep_sandboxes: bool) -> Result<(), GatewayError> {
        let engine = self.engine().await;
        self.end_egress().await;
        let stopped = engine.stop(keep_sandboxes).await;
        self.release_leases().await;
        stopped
    }

    /// Give the agents' leases back (a shared store), so another gateway may take them.
    async fn release_leases(&self) {
        if let Some(leases) = &self.shared.leases {
            leases.release().await;
        }
    }

    /// The leases this gateway holds for its agents (a shared store, `store.url`);
    /// empty otherwise.
    pub fn agent_leases(&self) -> Vec<crate::store::Fence> {
        self.shared
            .leases
            .as_ref()
            .map(|l| l.fences())
            .unwrap_or_default()
    }

    /// Ends every open egress stream, of this engine and of those a reload replaced.
    async fn end_egress(&self) {
        #[cfg(feature = "egress")]
        self.shared.template.lock().await.egress_end.cancel();
    }

    /// Prompts running now.
    pub fn running_prompts(&self) -> usize {
        self.engine_now().running_prompts()
    }

    /// The OTLP exporter's last success and failure (`beige doctor`, `gateway status`);
    /// `None` when traces are off.
    #[cfg(feature = "otel")]
    pub fn telemetry_health(&self) -> Option<crate::telemetry::ExportHealth> {
        self.engine_now().inner.traces.health()
    }

    /// Where the metrics listener (`telemetry.metrics.listen`) listens while
    /// [`LocalGateway::serve`] runs, with the port it picked for port 0; `None` otherwise.
    pub fn metrics_listen_addr(&self) -> Option<std::net::SocketAddr> {
        *self
            .shared
            .metrics_addr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Bind the metrics listener the config asks for and run it until `stop`.
    async fn start_metrics_listener(
        &self,
        stop: CancellationToken,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, ServeError> {
        let Some(listen) = self
            .engine()
            .await
            .config()
            .metrics_listen()
            .map(str::to_string)
        else {
            return Ok(None);
        };
        #[cfg(not(feature = "http-api"))]
        {
            let _ = stop;
            Err(ServeError::MetricsListen {
                message: format!(
                    "telemetry.metrics.listen: \"{listen}\" cannot be served: this build has no `http-api` feature; remove the key or use a build with it"
                ),
            })
        }
        #[cfg(feature = "http-api")]
        {
            let listener = super::metrics_listener::bind(&listen).await?;
            let addr = listener
                .local_addr()
                .map_err(|source| ServeError::MetricsBind {
                    addr: crate::metrics::listen_address(&listen)
                        .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
                    source,
                })?;
            *self
                .shared
                .metrics_addr
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(addr);
            let gateway = self.clone();
            Ok(Some(tokio::spawn(super::metrics_listener::run(
                listener, addr, gateway, stop,
            ))))
        }
    }

    /// A handle that asks this gateway to reload from its [`ConfigSource`], or `None`
    /// when it has none.
    pub fn reload_handle(&self) -> Option<ReloadHandle> {
        self.shared.source.as_ref()?;
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        Some(ReloadHandle::new(move || {
            if let Some(shared) = shared.upgrade() {
                tokio::spawn(async move {
                    // The outcome is logged and published by `reload_from_source`.
                    let _ = LocalGateway { shared }.reload_from_source().await;
                });
            }
        }))
    }

    /// The outcome of every reload as it finishes (the daemon writes each to
    /// `gateway.restart.json`).
    pub fn reload_outcomes(&self) -> watch::Receiver<Option<ReloadOutcome>> {
        self.shared.outcomes.subscribe()
    }

    /// Wait until no prompt runs, for at most `limit`; then running prompts are left to
    /// be cancelled by the stop that follows.
    pub async fn drain(&self, limit: Duration) {
        drain_engine(&self.engine_now(), limit).await;
    }

    /// Load the next config from the [`ConfigSource`] and [`LocalGateway::reload`] it. A
    /// load error keeps the running engine and is the outcome.
    async fn reload_from_source(&self) -> ReloadOutcome {
        let Some(source) = self.shared.source.clone() else {
            return self.publish(ReloadOutcome::failed(
                "this gateway has no config source to reload from".into(),
            ));
        };
        tracing::info!(source = ?source, "restart requested: reloading the config");
        let loaded = match source.load().await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("restart refused, the gateway keeps its previous config: {e}");
                return self.publish(ReloadOutcome::failed(e.to_string()));
            }
        };
        for w in &loaded.warnings {
            tracing::warn!("{}: {w}", loaded.path.display());
        }
        self.reload(loaded.config).await
    }

    /// Replace the engine with one built from `config` and the parts given to the
    /// builder: wait for running prompts (up to [`DEFAULT_DRAIN`]), stop the old engine
    /// keeping its containers, build the new one (it reattaches them) and swap it in.
    /// When the new config cannot start, the previous one is started again. Calls that
    /// arrive meanwhile wait and then reach the engine that serves.
    pub async fn reload(&self, config: Config) -> ReloadOutcome {
        let mut template = self.shared.template.lock().await;
        let _gate = self.shared.gate.write().await;
        let old = self.engine_now();
        drain_engine(&old, DEFAULT_DRAIN).await;
        if let Err(e) = old.stop(true).await {
            tracing::warn!(error = %e, "stopping the previous gateway failed; starting the new one anyway");
        }
        let started = Instant::now();
        let mut next = template.clone();
        next.config = config;
        let outcome = match next.clone().build_engine().await {
            Ok(engine) => {
                let report = engine.reconcile_report().clone();
                self.swap(engine);
                *template = next;
                let msg = format!(
                    "restarted in {} ms ({} sandbox(es) reattached, {} created)",
                    started.elapsed().as_millis(),
                    report.reattached.len(),
                    report.created.len()
                );
                tracing::info!("{msg}");
                ReloadOutcome::ok(msg)
            }
            Err(e) => {
                tracing::error!(error = %e, "the new config could not be started; going back to the previous one");
                match template.clone().build_engine().await {
                    Ok(back) => {
                        self.swap(back);
                        ReloadOutcome::failed(format!(
                            "the new config could not be started ({e}); the gateway is running with the previous config again"
                        ))
                    }
                    Err(e2) => {
                        tracing::error!(error = %e2, "the previous config could not be started again either");
                        ReloadOutcome::failed(format!(
                            "the new config could not be started ({e}), and restarting the previous one failed too ({e2}); the gateway serves nothing until a restart succeeds"
                        ))
                    }
                }
            }
        };
        self.publish(outcome)
    }

    fn swap(&self, engine: Engine) {
        *self
            .shared
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(engine);
        self.shared.reloads.fetch_add(1, Ordering::SeqCst);
    }

    fn publish(&self, outcome: ReloadOutcome) -> ReloadOutcome {
        self.shared.outcomes.send_replace(Some(outcome.clone()));
        outcome
    }

    /// Run the registered channels until `shutdown` says stop (or a required channel
    /// fails), reloading on SIGHUP; then drain running prompts (a second stop request
    /// skips that), stop the channels in reverse order and stop the engine — removing
    /// the sandboxes unless `gateway.keepSandboxes`.
    pub async fn serve(&self, mut shutdown: Shutdown) -> Result<(), ServeError> {
        let channels = self
            .shared
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(ServeError::AlreadyServing)?;
        // The metrics listener, if configured: refused (and the gateway stopped) before
        // any channel starts when its address is not loopback or cannot be bound.
        let metrics_stop = CancellationToken::new();
        let metrics_task = match self.start_metrics_listener(metrics_stop.clone()).await {
            Ok(task) => task,
            Err(e) => {
                tracing::error!("{e}");
                match tokio::time::timeout(shutdown.drain, self.shutdown()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(stop)) => tracing::warn!(error = %stop, "stopping the gateway failed"),
                    Err(_) => tracing::warn!("stopping the gateway timed out"),
                }
                return Err(e);
            }
        };
        let gateway: Arc<dyn GatewayFull> = Arc::new(self.clone());
        let mut running = Vec::with_capacity(channels.len());
        let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
        for (i, r) in channels.iter().enumerate() {
            let token = CancellationToken::new();
            let mut ctx = ChannelContext::new(gateway.clone(), token.clone());
            if let Some(reload) = self.reload_handle() {
                ctx = ctx.with_reload(reload);
            }
            if let Some(stores) = self.shared.stores.clone() {
                ctx = ctx.with_stores(stores);
            }
            let channel = r.channel.clone();
            let tx = ended_tx.clone();
            let task = tokio::spawn(async move {
                let result = channel.run(ctx).await;
                let _ = tx.send((i, result));
            });
            running.push((token, task));
        }
        drop(ended_tx);
        // Schedules fire while the gateway serves.
        let schedules_stop = CancellationToken::new();
        let schedules_task = self
            .shared
            .scheduler
            .clone()
            .map(|s| tokio::spawn(s.run(self.clone(), schedules_stop.clone())));

        // The agents' leases (a shared store) are renewed while serving; losing one
        // stops serving, since another gateway may now drive those agents.
        let leases_stop = CancellationToken::new();
        let lease_lost = CancellationToken::new();
        let leases_task = self
            .shared
            .leases
            .clone()
            .map(|l| tokio::spawn(l.keep(leases_stop.clone(), lease_lost.clone())));

        let mut failed = None;
        loop {
            tokio::select! {
                _ = lease_lost.cancelled() => {
                    failed = Some(ServeError::LeaseLost);
                    break;
                }
                request = shutdown.next() => match request {
                    Request::Stop => break,
                    Request::Reload => {
                        // Logged and published by `reload_from_source`.
                        let _ = self.reload_from_source().await;
                    }
                },
                Some((i, result)) = ended.recv() => {
                    let r = &channels[i];
                    let name = r.channel.name().to_string();
                    match result {
                        Err(e) if r.required => {
                            tracing::error!("channel '{name}' failed: {e}");
                            failed = Some(ServeError::Channel { channel: name, source: e });
                            break;
                        }
                        Err(e) => tracing::error!("channel '{name}' stopped: {e}"),
                        Ok(()) if r.required => {
                            tracing::info!("channel '{name}' stopped; stopping the gateway");
                            break;
                        }
                        Ok(()) => tracing::info!("channel '{name}' stopped"),
                    }
                }
            }
        }

        schedules_stop.cancel();
        if let Some(task) = schedules_task {
            let _ = tokio::time::timeout(CHANNEL_STOP, task).await;
        }
        leases_stop.cancel();
        if let Some(task) = leases_task {
            let _ = tokio::time::timeout(CHANNEL_STOP, task).await;
        }
        // Drain while the channels still serve the running streams.
        tokio::select! {
            _ = self.drain(shutdown.drain) => {}
            _ = shutdown.next_stop() => tracing::warn!("second signal: not waiting for running prompts"),
        }
        for (token, task) in running.into_iter().rev() {
            token.cancel();
            if tokio::time::timeout(CHANNEL_STOP, task).await.is_err() {
                tracing::warn!("a channel did not stop within {} s", CHANNEL_STOP.as_secs());
            }
        }
        metrics_stop.cancel();
        if let Some(task) = metrics_task {
            let _ = tokio::time::timeout(CHANNEL_STOP, task).await;
        }
        *self
            .shared
            .metrics_addr
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        let stopped = tokio::time::timeout(shutdown.drain, self.shutdown()).await;
        match (failed, stopped) {
            (Some(e), _) => Err(e),
            (None, Ok(Ok(()))) => {
                tracing::info!("beige gateway stopped");
                Ok(())
            }
            (None, Ok(Err(e))) => Err(ServeError::Shutdown(e)),
            (None, Err(_)) => Err(ServeError::ShutdownTimeout(shutdown.drain)),
        }
    }
}

/// Wait until `engine` runs no prompt, for at most `limit` (a reload drains the engine
/// it replaces; [`LocalGateway::drain`] the one serving).
async fn drain_engine(engine: &Engine, limit: Duration) {
    let started = Instant::now();
    if engine.running_prompts() > 0 {
        tracing::info!(
            running = engine.running_prompts(),
            "waiting up to {} s for running prompts",
            limit.as_secs()
        );
    }
    while engine.running_prompts() > 0 && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if engine.running_prompts() > 0 {
        tracing::warn!(
            running = engine.running_prompts(),
            "prompts still running after {} s; cancelling them",
            limit.as_secs()
        );
    }
}

// The one forwarder: every call picks the engine serving now (waiting while a reload
// swaps it) and runs on it without holding any lock.
#[async_trait]
impl Gateway for LocalGateway {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        self.engine().await.agents().await
    }
    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        self.engine().await.call_tool(agent, call, ctx).await
    }
    async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
        self.engine().await.prompt(request).await
    }
    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
        self.engine().await.cancel(agent, session_key).await
    }
    async fn agent(&self, name: &str) -> Result<AgentInfo, GatewayError> {
        self.engine().await.agent(name).await
    }
    async fn exec(&self, agent: &str, command: &str) -> Result<ToolOutput, GatewayError> {
        self.engine().await.exec(agent, command).await
    }
}

#[async_trait]
impl Sessions for LocalGateway {
    async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
        self.engine().await.sessions(agent).await
    }
    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.engine().await.new_session(agent, session_key).await
    }
    async fn resume_session(
        &self,
        agent: &str,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.engine()
            .await
            .resume_session(agent, session_key, session_id)
            .await
    }
    async fn session_messages(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, GatewayError> {
        self.engine()
            .await
            .session_messages(agent, session_id)
            .await
    }
    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
        self.engine().await.settings(session_key).await
    }
    async fn update_settings(
        &self,
        agent: &str,
        session_key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError> {
        self.engine()
            .await
            .update_settings(agent, session_key, patch)
            .await
    }
}

#[async_trait]
impl Admin for LocalGateway {
    async fn authenticate(
        &self,
        token: &str,
    ) -> Result<Option<beige_client::auth::Caller>, GatewayError> {
        self.engine().await.authenticate(token).await
    }
    async fn create_token(
        &self,
        new: beige_client::auth::NewToken,
    ) -> Result<beige_client::auth::MintedToken, GatewayError> {
        self.engine().await.create_token(new).await
    }
    async fn audit_auth(&self, event: beige_client::auth::AuthEvent) {
        self.engine().await.audit_auth(event).await
    }
    async fn tokens(
        &self,
        user: Option<&str>,
    ) -> Result<Vec<beige_client::auth::TokenInfo>, GatewayError> {
        self.engine().await.tokens(user).await
    }
    async fn revoke_token(&self, id: &str) -> Result<beige_client::auth::TokenInfo, GatewayError> {
        self.engine().await.revoke_token(id).await
    }
    async fn agent_tools(&self, agent: &str) -> Result<Vec<beige_client::AgentTool>, GatewayError> {
        self.engine().await.agent_tools(agent).await
    }
    async fn mcp_servers(
        &self,
        agent: &str,
    ) -> Result<Vec<beige_client::McpServerView>, GatewayError> {
        self.engine().await.mcp_servers(agent).await
    }
    async fn call_agent_tool(
        &self,
        agent: &str,
        call: beige_client::AgentToolCall,
        ctx: ToolContext,
        via: &str,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<ToolOutput, GatewayError> {
        self.engine()
            .await
            .call_agent_tool(agent, call, ctx, via, cancel)
            .await
    }
    async fn health(&self) -> Result<HashMap<String, ModelHealth>, GatewayError> {
        self.engine().await.health().await
    }
    async fn models(&self, agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
        self.engine().await.models(agent).await
    }
    async fn config_summary(&self) -> Result<serde_json::Value, GatewayError> {
        self.engine().await.config_summary().await
    }
    async fn run_hook(
        &self,
        agent: &str,
        hook: HookName,
        event: serde_json::Value,
    ) -> Result<serde_json::Value, GatewayError> {
        self.engine().await.run_hook(agent, hook, event).await
    }
    async fn sandbox_status(&self, agent: &str) -> Result<SandboxStatus, GatewayError> {
        self.engine().await.sandbox_status(agent).await
    }
    async fn disk_status(&self) -> Result<Option<crate::disk::DiskStatus>, GatewayError> {
        self.engine().await.disk_status().await
    }
    async fn approvals(
        &self,
        agent: Option<&str>,
    ) -> Result<Vec<beige_client::approvals::Approval>, GatewayError> {
        self.engine().await.approvals(agent).await
    }
    async fn decide_approval(
        &self,
        id: &str,
        decision: beige_client::approvals::ApprovalDecision,
        approver: crate::policy::Principal,
    ) -> Result<beige_client::approvals::Approval, GatewayError> {
        self.engine()
            .await
            .decide_approval(id, decision, approver)
            .await
    }
    async fn approval_events(&self) -> Result<beige_client::ApprovalEventStream, GatewayError> {
        let rx = self.approval_receiver().await;
        Ok(Box::pin(futures_util::stream::unfold(
            rx,
            |mut rx| async move {
                loop {
                    match rx.recv().await {
                        Ok(e) => return Some((e, rx)),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "an approvals listener fell behind");
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        )))
    }
    async fn usage(
        &self,
        query: crate::store::UsageQuery,
    ) -> Result<crate::store::UsageReport, GatewayError> {
        self.engine().await.usage(query).await
    }
    async fn add_schedule(
        &self,
        spec: ScheduleSpec,
        author: ScheduleAuthor,
    ) -> Result<ScheduleView, GatewayError> {
        let s = self.scheduler()?;
        let config = self.config();
        let r = s
            .add(&config, spec, author.owner, author.created_by)
            .await
            .map_err(manage_error)?;
        s.view(r).await.map_err(manage_error)
    }
    async fn schedules(&self, agent: Option<&str>) -> Result<Vec<ScheduleView>, GatewayError> {
        let s = self.scheduler()?;
        let records = self
            .shared
            .stores
            .as_ref()
            .ok_or(GatewayError::Unsupported { what: "schedules" })?
            .schedules
            .list_schedules(agent)
            .await?;
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            out.push(s.view(r).await.map_err(manage_error)?);
        }
        Ok(out)
    }
    async fn schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        let s = self.scheduler()?;
        let r = s.get(id).await.map_err(manage_error)?;
        s.view(r).await.map_err(manage_error)
    }
    async fn pause_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        let s = self.scheduler()?;
        let r = s.pause(id).await.map_err(manage_error)?;
        s.view(r).await.map_err(manage_error)
    }
    async fn resume_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        let s = self.scheduler()?;
        let r = s.resume(id).await.map_err(manage_error)?;
        s.view(r).await.map_err(manage_error)
    }
    async fn cancel_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        let s = self.scheduler()?;
        let r = s.cancel(id).await.map_err(manage_error)?;
        s.view(r).await.map_err(manage_error)
    }
    async fn schedule_history(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Vec<ScheduleRun>, GatewayError> {
        self.scheduler()?
            .history(id, limit)
            .await
            .map_err(manage_error)
    }
    async fn run_schedule_now(&self, id: &str) -> Result<ScheduleRun, GatewayError> {
        self.scheduler()?
            .run_now(self, id)
            .await
            .map_err(manage_error)
    }
    async fn metrics(&self) -> Result<String, GatewayError> {
        if !self.engine().await.config().metrics_enabled() {
            return Err(GatewayError::Unsupported {
                what: "metrics (set telemetry.metrics.enabled: true)",
            });
        }
        self.render_metrics().await
    }
}

impl LocalGateway {
    /// The metrics text, whether or not the API serves it (the metrics listener's
    /// answer); `Unsupported` without the `metrics` feature.
    pub(crate) async fn render_metrics(&self) -> Result<String, GatewayError> {
        let engine = self.engine().await;
        let mut pending: std::collections::BTreeMap<String, usize> = engine
            .config()
            .agents
            .keys()
            .map(|a| (a.clone(), 0))
            .collect();
        for a in engine.approvals_broker().list(None) {
            if a.status == beige_client::approvals::ApprovalStatus::Pending {
                *pending.entry(a.agent).or_default() += 1;
            }
        }
        let pending: Vec<(String, usize)> = pending.into_iter().collect();
        engine
            .inner
            .metrics
            .render(&pending)
            .ok_or(GatewayError::Unsupported {
                what: "metrics (this build has no `metrics` feature)",
            })
    }
}

fn manage_error(e: crate::schedule::engine::ManageError) -> GatewayError {
    use crate::schedule::engine::ManageError;
    match e {
        ManageError::Unknown(id) => GatewayError::UnknownSchedule { id },
        ManageError::Invalid(message) => GatewayError::InvalidSchedule { message },
        ManageError::Store(e) => e.into(),
    }
}

impl LocalGateway {
    /// The audit sink of the engine serving now.
    pub(crate) fn audit_sink(&self) -> Arc<dyn crate::audit::AuditSink> {
        self.engine_now().inner.audit.clone()
    }

    fn scheduler(&self) -> Result<&Arc<crate::schedule::engine::Scheduler>, GatewayError> {
        self.shared
            .scheduler
            .as_ref()
            .ok_or(GatewayError::Unsupported { what: "schedules" })
    }

    /// Every `schedule_run_finished` event from now on (runs delivering to `"events"`);
    /// what `GET /api/events` streams.
    pub fn schedule_events(
        &self,
    ) -> Option<tokio::sync::broadcast::Receiver<beige_client::schedules::ScheduleEvent>> {
        self.shared.scheduler.as_ref().map(|s| s.subscribe())
    }

    /// Every approval step from now on (requests, decisions, unattended denials).
    pub async fn approval_receiver(
        &self,
    ) -> tokio::sync::broadcast::Receiver<beige_client::approvals::ApprovalEvent> {
        self.engine().await.approvals_broker().subscribe()
    }
}
