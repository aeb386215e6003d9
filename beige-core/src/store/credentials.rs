//! [`CredentialStore`]: the personal API tokens of the gateway's users (`spec/people.md`
//! §1.1). A token is `bgt_<id>_<secret>`; the store keeps its public id, its user, name,
//! scope, times, whether it is revoked, and SHA-256 of the secret — never the secret
//! (a fast hash suffices for 32 random bytes). Lookups are by id; the caller compares the
//! hash in constant time.

use async_trait::async_trait;
use std::fmt::Debug;

pub use beige_client::auth::{TokenInfo, TokenScope};

use super::StoreError;

/// A token as stored: what is listed, and the hash of its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// What `beige users token list` shows.
    pub info: TokenInfo,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_sha256: String,
}

/// The personal API tokens.
#[async_trait]
pub trait CredentialStore: Send + Sync + Debug {
    /// Store a new token (its id is new: an existing id is an error).
    async fn insert_token(&self, record: TokenRecord) -> Result<(), StoreError>;
    /// The token with this id, revoked or not.
    async fn token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError>;
    /// The tokens, of one user or all, newest first.
    async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenInfo>, StoreError>;
    /// Mark a token revoked; `None` when there is no such token.
    async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError>;
    /// Note that the token authenticated a request at `at_ms`.
    async fn touch_token(&self, id: &str, at_ms: i64) -> Result<(), StoreError>;
}

/// `Arc<S>` and `Box<S>` are credential stores when `S` is.
macro_rules! forward_credentials {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<S: CredentialStore + ?Sized> CredentialStore for $ptr {
            async fn insert_token(&self, record: TokenRecord) -> Result<(), StoreError> {
                (**self).insert_token(record).await
            }
            async fn token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
                (**self).token(id).await
            }
            async fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenInfo>, StoreError> {
                (**self).list_tokens(user).await
            }
            async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError> {
                (**self).revoke_token(id).await
            }
            async fn touch_token(&self, id: &str, at_ms: i64) -> Result<(), StoreError> {
                (**self).touch_token(id, at_ms).await
            }
        }
    )*};
}

forward_credentials!(std::sync::Arc<S>, Box<S>);
