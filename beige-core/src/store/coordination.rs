//! [`Coordination`]: leases, the store's part in running several gateways on one
//! database (`spec/scale.md` §3). A lease (`agent:<name>`, `channel:telegram`,
//! `scheduler`, …) has at most one holder at a time, for a time to live; taking it when it
//! is free or expired raises its **epoch**, so every holder ever is told apart by its
//! [`Fence`] — `(lease, holder, epoch)` — and a holder that lost the lease (it paused past
//! its expiry, another took over) is found out when its fence no longer checks.
//!
//! Only the database's clock judges expiry (PostgreSQL's `clock_timestamp()`; SQLite's
//! and the memory store's is this machine's, where there is only one). With one gateway
//! the lease is simply always its own, so the same code runs on a laptop.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use super::StoreError;

/// Proof of holding a lease: what a holder presents with each action it takes under it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The lease (`agent:research`, `channel:telegram`, …).
    pub lease: String,
    /// Who holds it (a replica id).
    pub holder: String,
    /// Raised by one every time the lease changes hands; never reused.
    pub epoch: i64,
}

/// A lease as it stands now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The lease.
    pub name: String,
    /// Its holder, `None` when released (an expired holder is still named: see
    /// `expires_ms`).
    pub holder: Option<String>,
    /// The epoch of the latest holder.
    pub epoch: i64,
    /// Unix ms (the database's clock) after which the lease is free.
    pub expires_ms: i64,
}

/// Leases with epochs and expiry.
#[async_trait]
pub trait Coordination: Send + Sync + Debug {
    /// Take `name` for `holder` for `ttl` when it is free, expired or already this
    /// holder's: the new fence, its epoch one above the last. Taking back one's own lease
    /// (a restarted gateway with the same holder name) fences the earlier incarnation;
    /// to keep a lease, [`renew_leases`](Self::renew_leases). `None` while another
    /// holder's lease is valid.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Fence>, StoreError>;

    /// Extend every unexpired lease `holder` holds to `ttl` from now, in one step; the
    /// fences still held. A lease missing from the answer is lost.
    async fn renew_leases(&self, holder: &str, ttl: Duration) -> Result<Vec<Fence>, StoreError>;

    /// Give a lease up, so another may take it at once; `false` when `fence` no longer
    /// holds it.
    async fn release_lease(&self, fence: &Fence) -> Result<bool, StoreError>;

    /// Whether `fence` still holds its lease: same holder, same epoch, not expired.
    async fn check_fence(&self, fence: &Fence) -> Result<bool, StoreError>;

    /// The lease as it stands, `None` when it was never taken.
    async fn lease(&self, name: &str) -> Result<Option<LeaseInfo>, StoreError>;
}

/// Milliseconds of a lease's time to live (at least 1).
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "test-util", test)),
    allow(dead_code)
)]
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// `Arc<S>` and `Box<S>` coordinate when `S` does.
macro_rules! forward_coordination {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<S: Coordination + ?Sized> Coordination for $ptr {
            async fn acquire_lease(
                &self,
                name: &str,
                holder: &str,
                ttl: Duration,
            ) -> Result<Option<Fence>, StoreError> {
                (**self).acquire_lease(name, holder, ttl).await
            }
            async fn renew_leases(&self, holder: &str, ttl: Duration) -> Result<Vec<Fence>, StoreError> {
                (**self).renew_leases(holder, ttl).await
            }
            async fn release_lease(&self, fence: &Fence) -> Result<bool, StoreError> {
                (**self).release_lease(fence).await
            }
            async fn check_fence(&self, fence: &Fence) -> Result<bool, StoreError> {
                (**self).check_fence(fence).await
            }
            async fn lease(&self, name: &str) -> Result<Option<LeaseInfo>, StoreError> {
                (**self).lease(name).await
            }
        }
    )*};
}

forward_coordination!(std::sync::Arc<S>, Box<S>);
