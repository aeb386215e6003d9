//! [`CredentialStore`] in memory, with the semantics of the SQLite table.

use async_trait::async_trait;

use super::MemoryStore;
use crate::store::{CredentialStore, StoreError, TokenInfo, TokenRecord};

#[async_trait]
impl CredentialStore for MemoryStore {
    async fn insert_token(&self, record: TokenRecord) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.tokens.contains_key(&record.info.id) {
            return Err(StoreError::Invalid {
                message: format!("a token with id {} exists", record.info.id),
            });
        }
        state.tokens.insert(record.info.id.clone(), record);
        Ok(())
    }

    async fn token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        Ok(self.lock().tokens.get(id).cloned())
    }

    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenInfo>, StoreError> {
        let mut out: Vec<TokenInfo> = self
            .lock()
            .tokens
            .values()
            .filter(|r| user.is_none_or(|u| r.info.user == u))
            .map(|r| r.info.clone())
            .collect();
        out.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError> {
        Ok(self.lock().tokens.get_mut(id).map(|r| {
            r.info.revoked = true;
            r.info.clone()
        }))
    }

    async fn touch_token(&self, id: &str, at_ms: i64) -> Result<(), StoreError> {
        if let Some(r) = self.lock().tokens.get_mut(id) {
            r.info.last_used_ms = Some(at_ms);
        }
        Ok(())
    }
}
