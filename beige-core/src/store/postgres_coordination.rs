//! [`Coordination`] on PostgreSQL: the `leases` table (migration 8), with the server's
//! clock (`clock_timestamp()`) the only judge of expiry. Taking a lease is one
//! conditional `UPDATE`: of two gateways racing for a free lease, the row lock lets one
//! through and the other's condition no longer holds.

use std::time::Duration;

use async_trait::async_trait;

use super::{PostgresStore, DB_NOW};
use crate::store::{ttl_ms, Coordination, Fence, LeaseInfo, StoreError};

#[async_trait]
impl Coordination for PostgresStore {
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Fence>, StoreError> {
        sqlx::query(
            "INSERT INTO leases (name, holder, epoch, expires_at) VALUES ($1, NULL, 0, 0)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        let epoch: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "UPDATE leases SET holder = $2, epoch = epoch + 1, expires_at = {DB_NOW} + $3
             WHERE name = $1 AND (holder IS NULL OR holder = $2 OR expires_at <= {DB_NOW})
             RETURNING epoch"
        )))
        .bind(name)
        .bind(holder)
        .bind(ttl_ms(ttl))
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(epoch.map(|epoch| Fence {
            lease: name.to_string(),
            holder: holder.to_string(),
            epoch,
        }))
    }

    async fn renew_leases(&self, holder: &str, ttl: Duration) -> Result<Vec<Fence>, StoreError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE leases SET expires_at = {DB_NOW} + $2
             WHERE holder = $1 AND expires_at > {DB_NOW}
             RETURNING name, epoch"
        )))
        .bind(holder)
        .bind(ttl_ms(ttl))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        let mut fences: Vec<Fence> = rows
            .into_iter()
            .map(|(lease, epoch)| Fence {
                lease,
                holder: holder.to_string(),
                epoch,
            })
            .collect();
        fences.sort_by(|a, b| a.lease.cmp(&b.lease));
        Ok(fences)
    }

    async fn release_lease(&self, fence: &Fence) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE leases SET holder = NULL, expires_at = 0
             WHERE name = $1 AND holder = $2 AND epoch = $3",
        )
        .bind(&fence.lease)
        .bind(&fence.holder)
        .bind(fence.epoch)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?
        .rows_affected();
        Ok(n == 1)
    }

    async fn check_fence(&self, fence: &Fence) -> Result<bool, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM leases
             WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > {DB_NOW}"
        )))
        .bind(&fence.lease)
        .bind(&fence.holder)
        .bind(fence.epoch)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(row.is_some())
    }

    async fn lease(&self, name: &str) -> Result<Option<LeaseInfo>, StoreError> {
        let row: Option<(Option<String>, i64, i64)> =
            sqlx::query_as("SELECT holder, epoch, expires_at FROM leases WHERE name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.fail(e))?;
        Ok(row.map(|(holder, epoch, expires_ms)| LeaseInfo {
            name: name.to_string(),
            holder,
            epoch,
            expires_ms,
        }))
    }
}
