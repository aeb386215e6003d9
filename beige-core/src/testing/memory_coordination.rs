//! [`Coordination`] in memory, with the semantics of the SQLite table: this process's
//! clock judges expiry.

use std::time::Duration;

use async_trait::async_trait;

use super::MemoryStore;
use crate::store::{now_ms, ttl_ms, Coordination, Fence, LeaseInfo, StoreError};

#[async_trait]
impl Coordination for MemoryStore {
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Fence>, StoreError> {
        let now = now_ms();
        let mut state = self.lock();
        let lease = state.leases.entry(name.to_string()).or_insert((None, 0, 0));
        if lease.0.as_deref().is_some_and(|h| h != holder) && lease.2 > now {
            return Ok(None);
        }
        *lease = (
            Some(holder.to_string()),
            lease.1 + 1,
            now.saturating_add(ttl_ms(ttl)),
        );
        Ok(Some(Fence {
            lease: name.to_string(),
            holder: holder.to_string(),
            epoch: lease.1,
        }))
    }

    async fn renew_leases(&self, holder: &str, ttl: Duration) -> Result<Vec<Fence>, StoreError> {
        let now = now_ms();
        let mut state = self.lock();
        let mut fences = Vec::new();
        for (name, lease) in state.leases.iter_mut() {
            if lease.0.as_deref() == Some(holder) && lease.2 > now {
                lease.2 = now.saturating_add(ttl_ms(ttl));
                fences.push(Fence {
                    lease: name.clone(),
                    holder: holder.to_string(),
                    epoch: lease.1,
                });
            }
        }
        fences.sort_by(|a, b| a.lease.cmp(&b.lease));
        Ok(fences)
    }

    async fn release_lease(&self, fence: &Fence) -> Result<bool, StoreError> {
        let mut state = self.lock();
        match state.leases.get_mut(&fence.lease) {
            Some(lease) if lease.0.as_deref() == Some(&fence.holder) && lease.1 == fence.epoch => {
                *lease = (None, lease.1, 0);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn check_fence(&self, fence: &Fence) -> Result<bool, StoreError> {
        let now = now_ms();
        Ok(self.lock().leases.get(&fence.lease).is_some_and(|l| {
            l.0.as_deref() == Some(&fence.holder) && l.1 == fence.epoch && l.2 > now
        }))
    }

    async fn lease(&self, name: &str) -> Result<Option<LeaseInfo>, StoreError> {
        Ok(self.lock().leases.get(name).map(|l| LeaseInfo {
            name: name.to_string(),
            holder: l.0.clone(),
            epoch: l.1,
            expires_ms: l.2,
        }))
    }
}
