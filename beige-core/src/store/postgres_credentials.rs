//! [`CredentialStore`] on PostgreSQL: the `api_tokens` table (migration 7).

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row as _;

use super::PostgresStore;
use crate::store::credentials::{CredentialStore, TokenInfo, TokenRecord, TokenScope};
use crate::store::StoreError;

const SELECT: &str =
    "SELECT id, \"user\", name, scope, created, expires, last_used, revoked, secret_sha256
     FROM api_tokens";

fn record(row: &PgRow) -> Result<TokenRecord, sqlx::Error> {
    let scope: String = row.try_get(3)?;
    Ok(TokenRecord {
        info: TokenInfo {
            id: row.try_get(0)?,
            user: row.try_get(1)?,
            name: row.try_get(2)?,
            // A scope that does not parse narrows to nothing rather than widening.
            scope: serde_json::from_str(&scope).unwrap_or(TokenScope {
                agents: Some(Vec::new()),
                max_role: None,
            }),
            created_ms: row.try_get(4)?,
            expires_ms: row.try_get(5)?,
            last_used_ms: row.try_get(6)?,
            revoked: row.try_get(7)?,
        },
        secret_sha256: row.try_get(8)?,
    })
}

impl PostgresStore {
    async fn one_token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!("{SELECT} WHERE id = $1")))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        row.map(|r| record(&r))
            .transpose()
            .map_err(|e| self.fail(e))
    }
}

#[async_trait]
impl CredentialStore for PostgresStore {
    async fn insert_token(&self, record: TokenRecord) -> Result<(), StoreError> {
        let scope = serde_json::to_string(&record.info.scope).map_err(|e| StoreError::Invalid {
            message: e.to_string(),
        })?;
        let i = &record.info;
        sqlx::query(
            "INSERT INTO api_tokens (id, \"user\", name, scope, created, expires, last_used,
                                     revoked, secret_sha256)
             VALUES ($1, $2, $3, $4, $5, $6, NULL, false, $7)",
        )
        .bind(&i.id)
        .bind(&i.user)
        .bind(&i.name)
        .bind(scope)
        .bind(i.created_ms)
        .bind(i.expires_ms)
        .bind(&record.secret_sha256)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        self.one_token(id).await
    }

    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenInfo>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT} WHERE $1::text IS NULL OR \"user\" = $1 ORDER BY created DESC, id"
        )))
        .bind(user)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        rows.iter()
            .map(|r| record(r).map(|r| r.info))
            .collect::<Result<_, _>>()
            .map_err(|e| self.fail(e))
    }

    async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError> {
        sqlx::query("UPDATE api_tokens SET revoked = true WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(self.one_token(id).await?.map(|r| r.info))
    }

    async fn touch_token(&self, id: &str, at_ms: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE api_tokens SET last_used = $2 WHERE id = $1")
            .bind(id)
            .bind(at_ms)
            .execute(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(())
    }
}
