//! [`CredentialStore`] on SQLite: the `api_tokens` table (migration 7).

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row};

use super::{Fail, SqliteStore};
use crate::store::credentials::{CredentialStore, TokenInfo, TokenRecord, TokenScope};
use crate::store::StoreError;

const SELECT: &str =
    "SELECT id, user, name, scope, created, expires, last_used, revoked, secret_sha256
     FROM api_tokens";

fn record(row: &Row<'_>) -> rusqlite::Result<TokenRecord> {
    let scope: String = row.get(3)?;
    Ok(TokenRecord {
        info: TokenInfo {
            id: row.get(0)?,
            user: row.get(1)?,
            name: row.get(2)?,
            // A scope that does not parse narrows to nothing rather than widening.
            scope: serde_json::from_str(&scope).unwrap_or(TokenScope {
                agents: Some(Vec::new()),
                max_role: None,
            }),
            created_ms: row.get(4)?,
            expires_ms: row.get(5)?,
            last_used_ms: row.get(6)?,
            revoked: row.get::<_, i64>(7)? != 0,
        },
        secret_sha256: row.get(8)?,
    })
}

#[async_trait]
impl CredentialStore for SqliteStore {
    async fn insert_token(&self, record: TokenRecord) -> Result<(), StoreError> {
        self.run(move |conn, _| {
            let scope = serde_json::to_string(&record.info.scope).map_err(|e| {
                Fail::Store(StoreError::Invalid {
                    message: e.to_string(),
                })
            })?;
            let i = &record.info;
            conn.execute(
                "INSERT INTO api_tokens (id, user, name, scope, created, expires, last_used, revoked, secret_sha256)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, 0, ?7)",
                params![i.id, i.user, i.name, scope, i.created_ms, i.expires_ms, record.secret_sha256],
            )?;
            Ok(())
        })
        .await
    }

    async fn token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        let id = id.to_string();
        self.run(move |conn, _| {
            Ok(conn
                .prepare_cached(&format!("{SELECT} WHERE id = ?1"))?
                .query_row(params![id], record)
                .optional()?)
        })
        .await
    }

    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenInfo>, StoreError> {
        let user = user.map(str::to_string);
        self.run(move |conn, _| {
            let mut stmt = conn.prepare_cached(&format!(
                "{SELECT} WHERE ?1 IS NULL OR user = ?1 ORDER BY created DESC, id"
            ))?;
            let rows = stmt.query_map(params![user], record)?;
            let mut out = Vec::new();
            for r in rows {
                out.push(r?.info);
            }
            Ok(out)
        })
        .await
    }

    async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError> {
        let id = id.to_string();
        self.run(move |conn, _| {
            conn.execute(
                "UPDATE api_tokens SET revoked = 1 WHERE id = ?1",
                params![id],
            )?;
            Ok(conn
                .prepare_cached(&format!("{SELECT} WHERE id = ?1"))?
                .query_row(params![id], record)
                .optional()?
                .map(|r| r.info))
        })
        .await
    }

    async fn touch_token(&self, id: &str, at_ms: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.run(move |conn, _| {
            conn.execute(
                "UPDATE api_tokens SET last_used = ?2 WHERE id = ?1",
                params![id, at_ms],
            )?;
            Ok(())
        })
        .await
    }
}
