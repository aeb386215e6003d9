//! [`Coordination`] on SQLite: the `leases` table (migration 8). One file has one
//! gateway, so the clock is this machine's and the lease is normally always its own; the
//! same semantics as PostgreSQL's, so lease code runs on laptops too.

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};

use super::SqliteStore;
use crate::store::{now_ms, ttl_ms, Coordination, Fence, LeaseInfo, StoreError};

#[async_trait]
impl Coordination for SqliteStore {
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Fence>, StoreError> {
        let (name, holder, ttl) = (name.to_string(), holder.to_string(), ttl_ms(ttl));
        self.run(move |conn, _| {
            let now = now_ms();
            conn.prepare_cached(
                "INSERT INTO leases (name, holder, epoch, expires_at) VALUES (?1, NULL, 0, 0)
                 ON CONFLICT(name) DO NOTHING",
            )?
            .execute([&name])?;
            let epoch: Option<i64> = conn
                .prepare_cached(
                    "UPDATE leases SET holder = ?2, epoch = epoch + 1, expires_at = ?3 + ?4
                     WHERE name = ?1 AND (holder IS NULL OR holder = ?2 OR expires_at <= ?3)
                     RETURNING epoch",
                )?
                .query_row(params![name, holder, now, ttl], |r| r.get(0))
                .optional()?;
            Ok(epoch.map(|epoch| Fence {
                lease: name,
                holder,
                epoch,
            }))
        })
        .await
    }

    async fn renew_leases(&self, holder: &str, ttl: Duration) -> Result<Vec<Fence>, StoreError> {
        let (holder, ttl) = (holder.to_string(), ttl_ms(ttl));
        self.run(move |conn, _| {
            let now = now_ms();
            let mut stmt = conn.prepare_cached(
                "UPDATE leases SET expires_at = ?2 + ?3 WHERE holder = ?1 AND expires_at > ?2
                 RETURNING name, epoch",
            )?;
            let rows = stmt.query_map(params![holder, now, ttl], |r| {
                Ok(Fence {
                    lease: r.get(0)?,
                    holder: holder.clone(),
                    epoch: r.get(1)?,
                })
            })?;
            let mut fences = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            fences.sort_by(|a, b| a.lease.cmp(&b.lease));
            Ok(fences)
        })
        .await
    }

    async fn release_lease(&self, fence: &Fence) -> Result<bool, StoreError> {
        let fence = fence.clone();
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "UPDATE leases SET holder = NULL, expires_at = 0
                     WHERE name = ?1 AND holder = ?2 AND epoch = ?3",
                )?
                .execute(params![fence.lease, fence.holder, fence.epoch])?;
            Ok(n == 1)
        })
        .await
    }

    async fn check_fence(&self, fence: &Fence) -> Result<bool, StoreError> {
        let fence = fence.clone();
        self.run(move |conn, _| {
            Ok(conn
                .prepare_cached(
                    "SELECT 1 FROM leases
                     WHERE name = ?1 AND holder = ?2 AND epoch = ?3 AND expires_at > ?4",
                )?
                .exists(params![fence.lease, fence.holder, fence.epoch, now_ms()])?)
        })
        .await
    }

    async fn lease(&self, name: &str) -> Result<Option<LeaseInfo>, StoreError> {
        let name = name.to_string();
        self.run(move |conn, _| {
            Ok(conn
                .prepare_cached("SELECT holder, epoch, expires_at FROM leases WHERE name = ?1")?
                .query_row([&name], |r| {
                    Ok(LeaseInfo {
                        name: name.clone(),
                        holder: r.get(0)?,
                        epoch: r.get(1)?,
                        expires_ms: r.get(2)?,
                    })
                })
                .optional()?)
        })
        .await
    }
}
