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
//! waits for them to expire or be released. Forwarding requests to the holder and taking
//! over a dead holder's agents automatically belong to the replicas of spec/scale.md and
//! are not built yet.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{Coordination, Fence, StoreError};

/// Channels of which one gateway per database may run: their state in the store is
/// kept under the channel's name alone.
pub(crate) const EXCLUSIVE_CHANNELS: &[&str] = &["telegram"];

/// How long a lease lasts without renewal (spec/scale.md: 15 s by default).
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(15);

/// The leases a gateway holds for its agents.
#[derive(Debug)]
pub(crate) struct AgentLeases {
    coordination: Arc<dyn Coordination>,
    holder: String,
    ttl: Duration,
    fences: std::sync::Mutex<Vec<Fence>>,
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
        let leases = Self {
            coordination,
            holder,
            ttl,
            fences: std::sync::Mutex::new(Vec::new()),
        };
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fence>> {
        self.fences.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Renew every third of the time to live until `stop`; cancels `lost` (and returns)
    /// when a lease is no longer held, or renewals have failed for longer than the time to
    /// live allows (the lease may be gone: act as if it were).
    pub(crate) async fn keep(self: Arc<Self>, stop: CancellationToken, lost: CancellationToken) {
        let every = self.ttl / 3;
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
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
                        tracing::error!(
                            leases = ?missing,
                            "lost the lease of an agent to another gateway; stopping"
                        );
                        lost.cancel();
                        return;
                    }
                    last_ok = sent;
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
