//! The leases of a gateway whose store is shared (`store.url`, spec/scale.md §3): before
//! it creates any sandbox, the gateway takes lease `agent:<name>` for each of its agents,
//! and `channel:<name>` for each channel that only one gateway may run
//! ([`EXCLUSIVE_CHANNELS`]: Telegram, whose offsets, dedup window and outbox are kept in
//! the store under the channel's name); it renews them every third of their time to live
//! while it serves, stops serving when one is lost, and gives them back when it stops. A
//! second gateway on the same database therefore cannot drive an agent, or poll a
//! channel, the first one does: it refuses to start, naming the holder and when its
//! lease runs out.
//!
//! The holder is `<host name>/<installation id>`: the same home restarted on the same
//! machine takes its leases back at once (with a higher epoch), while any other gateway
//! waits for them to expire or be released. With `cluster.standby` it waits rather than
//! refusing: it tries again every [`STANDBY_SCAN`] and starts once it has them all (a
//! hot standby taking over a gateway that stopped renewing). Forwarding requests to the
//! holder and sharing one set of agents between serving gateways belong to the replicas
//! of spec/scale.md and are not built yet.
//!
//! A stale gateway cannot act: besides the fence of every store write, [`FencedSandbox`]
//! refuses every operation on a leased agent's sandbox unless a renewal confirmed the
//! lease recently enough — sent less than the time to live minus [`SAFETY_MARGIN`] ago
//! (the database's expiry is later than that) — so a gateway that was frozen (SIGSTOP, a
//! paused VM) and wakes after another took over is refused before its next renewal
//! even tells it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::sandbox::{
    OpOutcome, OutputSink, ReconcileReport, Sandbox, SandboxError, SandboxHost, SandboxSpec,
    SandboxStatus, SpawnedProcess,
};
use crate::store::{Coordination, Fence, StoreError};

/// Channels of which one gateway per database may run: their state in the store is
/// kept under the channel's name alone.
pub(crate) const EXCLUSIVE_CHANNELS: &[&str] = &["telegram"];

/// How often a standby tries to take the leases it waits for.
pub(crate) const STANDBY_SCAN: Duration = Duration::from_secs(1);

/// How long before its lease could run out a gateway stops acting on the agent.
pub(crate) const SAFETY_MARGIN: Duration = Duration::from_secs(2);

/// The leases a gateway holds for its agents.
#[derive(Debug)]
pub(crate) struct AgentLeases {
    coordination: Arc<dyn Coordination>,
    holder: String,
    ttl: Duration,
    fences: std::sync::Mutex<Vec<Fence>>,
    /// Until when the leases are confirmed: the last successful renewal's (or the
    /// acquisition's) send time + ttl − [`SAFETY_MARGIN`]; `None` once one was lost.
    confirmed_until: std::sync::Mutex<Option<Instant>>,
}

/// This gateway's name as a lease holder.
pub(crate) fn holder_name(installation: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}/{installation}")
}

impl AgentLeases {
    /// Take every lease named (`agent:<name>`, `channel:telegram`), or none: when one is
    /// held by another gateway, give back those taken and fail with
    /// [`StoreError::Leased`].
    pub(crate) async fn acquire(
        coordination: Arc<dyn Coordination>,
        holder: String,
        names: impl IntoIterator<Item = String>,
        ttl: Duration,
    ) -> Result<Self, StoreError> {
        let sent = Instant::now();
        let leases = Self {
            coordination,
            holder,
            ttl,
            fences: std::sync::Mutex::new(Vec::new()),
            confirmed_until: std::sync::Mutex::new(None),
        };
        leases.confirm(sent);
        for name in names {
            match leases
                .coordination
                .acquire_lease(&name, &leases.holder, ttl)
                .await
            {
                Ok(Some(fence)) => leases.lock().push(fence),
                Ok(None) => {
                    let info = leases.coordination.lease(&name).await.ok().flatten();
                    leases.release().await;
                    return Err(StoreError::Leased {
                        lease: name,
                        holder: info
                            .as_ref()
                            .and_then(|i| i.holder.clone())
                            .unwrap_or_else(|| "another gateway".into()),
                        until: info
                            .and_then(|i| chrono::DateTime::from_timestamp_millis(i.expires_ms))
                            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                            .unwrap_or_else(|| "it expires".into()),
                    });
                }
                Err(e) => {
                    leases.release().await;
                    return Err(e);
                }
            }
        }
        Ok(leases)
    }

    /// [`acquire`](Self::acquire), waiting while another gateway holds one of the
    /// leases (`cluster.standby`): tries again every [`STANDBY_SCAN`] until it has them
    /// all. Only the process ending stops the wait (a standby holds nothing yet); other
    /// errors end it.
    pub(crate) async fn acquire_waiting(
        coordination: Arc<dyn Coordination>,
        holder: String,
        names: Vec<String>,
        ttl: Duration,
    ) -> Result<Self, StoreError> {
        let mut announced = false;
        loop {
            match Self::acquire(coordination.clone(), holder.clone(), names.clone(), ttl).await {
                Err(e @ StoreError::Leased { .. }) => {
                    if !announced {
                        tracing::info!(reason = %e, "standing by: waiting for the leases");
                        announced = true;
                    }
                    tokio::time::sleep(STANDBY_SCAN).await;
                }
                Ok(leases) => {
                    if announced {
                        tracing::info!("took the leases over; starting");
                    }
                    return Ok(leases);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fence>> {
        self.fences.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn confirmed(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.confirmed_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The leases were all held when a request sent at `sent` reached the database.
    fn confirm(&self, sent: Instant) {
        *self.confirmed() = Some(sent + self.ttl.saturating_sub(SAFETY_MARGIN));
    }

    /// May this gateway act on `agent`'s sandbox now? Agents it holds no lease for (one
    /// added by a reload) are not fenced; a leased one only while the lease is confirmed.
    pub(crate) fn check(&self, agent: &str) -> Result<(), SandboxError> {
        // The common case, on every op: the leases are confirmed (no allocation).
        if self.confirmed().is_some_and(|until| Instant::now() < until) {
            return Ok(());
        }
        match self.fence_of(agent) {
            None => Ok(()),
            Some(fence) => Err(SandboxError::Fenced {
                agent: agent.to_string(),
                lease: fence.lease,
                epoch: fence.epoch,
            }),
        }
    }

    /// The fence of `agent`'s lease, when this gateway holds it.
    pub(crate) fn fence_of(&self, agent: &str) -> Option<Fence> {
        let name = format!("agent:{agent}");
        self.lock().iter().find(|f| f.lease == name).cloned()
    }

    /// The fences held now.
    pub(crate) fn fences(&self) -> Vec<Fence> {
        self.lock().clone()
    }

    /// Renew at once (starting the engine may have taken a while since the leases were
    /// taken) and then every third of the time to live until `stop`; cancels `lost`
    /// (and returns) when a lease is no longer held, or renewals have failed for longer
    /// than the time to live allows (the lease may be gone: act as if it were).
    pub(crate) async fn keep(self: Arc<Self>, stop: CancellationToken, lost: CancellationToken) {
        let every = self.ttl / 3;
        let mut last_ok = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let sent = tokio::time::Instant::now();
            match self.coordination.renew_leases(&self.holder, self.ttl).await {
                Ok(held) => {
                    let missing: Vec<String> = self
                        .fences()
                        .into_iter()
                        .filter(|f| !held.contains(f))
                        .map(|f| f.lease)
                        .collect();
                    if !missing.is_empty() {
                        *self.confirmed() = None;
                        tracing::error!(
                            leases = ?missing,
                            "lost the lease of an agent to another gateway; stopping"
                        );
                        lost.cancel();
                        return;
                    }
                    last_ok = sent;
                    self.confirm(sent.into_std());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the agents' leases failed");
                    // The database may already consider them expired: stop acting
                    // before another gateway can take over (spec/scale.md §3).
                    if sent.duration_since(last_ok) + every
                        >= self.ttl.saturating_sub(Duration::from_secs(2))
                    {
                        tracing::error!("could not renew the agents' leases in time; stopping");
                        lost.cancel();
                        return;
                    }
                }
            }
        }
    }

    /// Give every lease back, so another gateway may take the agents at once.
    pub(crate) async fn release(&self) {
        let fences = std::mem::take(&mut *self.lock());
        for fence in fences {
            if let Err(e) = self.coordination.release_lease(&fence).await {
                tracing::warn!(lease = %fence.lease, error = %e, "releasing a lease failed");
            }
        }
    }
}

/// A sandbox backend behind this gateway's agent leases: every operation on a leased
/// agent's sandbox ([`AgentLeases::check`]) is refused once the lease is not confirmed,
/// with [`SandboxError::Fenced`]; the rest is the backend's.
#[derive(Debug)]
pub(crate) struct FencedSandbox {
    inner: Arc<dyn Sandbox>,
    leases: Arc<AgentLeases>,
}

impl FencedSandbox {
    pub(crate) fn new(inner: Arc<dyn Sandbox>, leases: Arc<AgentLeases>) -> Self {
        Self { inner, leases }
    }
}

#[async_trait]
impl Sandbox for FencedSandbox {
    async fn reconcile(
        &self,
        specs: Vec<SandboxSpec>,
        host: Arc<dyn SandboxHost>,
    ) -> Result<ReconcileReport, SandboxError> {
        for spec in &specs {
            self.leases.check(&spec.agent)?;
        }
        self.inner.reconcile(specs, host).await
    }

    async fn run_op(
        &self,
        agent: &str,
        request: &beige_protocol::op::OpRequest,
    ) -> Result<OpOutcome, SandboxError> {
        self.leases.check(agent)?;
        self.inner.run_op(agent, request).await
    }

    async fn remove_all(&self) -> Result<(), SandboxError> {
        self.inner.remove_all().await
    }

    async fn run_op_streaming(
        &self,
        agent: &str,
        request: &beige_protocol::op::OpRequest,
        output: OutputSink,
    ) -> Result<OpOutcome, SandboxError> {
        self.leases.check(agent)?;
        self.inner.run_op_streaming(agent, request, output).await
    }

    async fn detach(&self) {
        self.inner.detach().await;
    }

    async fn spawn(
        &self,
        agent: &str,
        request: beige_protocol::spawn::SpawnRequest,
    ) -> Result<SpawnedProcess, SandboxError> {
        self.leases.check(agent)?;
        self.inner.spawn(agent, request).await
    }

    async fn status(&self, agent: &str) -> SandboxStatus {
        self.inner.status(agent).await
    }
}
