//! `users`: the people of a shared gateway (`spec/people.md` §1), each with roles per
//! agent (`{ "<agent or glob>": "viewer" | "member" | "operator" | "owner" }`, the
//! highest matching entry wins, `owner` only on `"*"`) and the channel identities that
//! are them (Telegram user ids). Without a `users` section nothing changes: the
//! gateway's token is the owner and channel users are members of their chats' agents.
//!
//! [`caller`] turns a user into a [`Caller`]; the gateway calls it after it
//! has verified a credential, never on a name a request gives.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use beige_client::auth::{Caller, Role, TokenScope};

/// `users.<name>`: one person (or service).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserConfig {
    /// Role per agent name or `*` glob; the highest matching entry applies. An agent no
    /// entry matches does not exist for the user.
    #[serde(default)]
    pub roles: IndexMap<String, Role>,
    /// Telegram user ids that are this user (`allowedUsers` still decides who is heard).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub telegram: Vec<i64>,
    /// A service account: API tokens only, no console.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub service: bool,
}

/// The `users` section, by name.
pub type UsersConfig = IndexMap<String, UserConfig>;

/// Whether `name` may name a user: a lowercase letter, then lowercase letters, digits,
/// `-` or `_`; at most 64 characters; not `owner`, `system` or `sandbox` (which the
/// audit uses for principals that are not users).
pub fn is_valid_user_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !matches!(
            name,
            "owner" | "system" | "sandbox" | "unverified" | "embedder"
        )
}

/// The caller a verified credential of user `name` presents, or `None` when `users`
/// has no such user (a token of a removed user stops working).
pub fn caller(users: &UsersConfig, name: &str, via: &str, scope: TokenScope) -> Option<Caller> {
    let user = users.get(name)?;
    Some(Caller::new(
        name,
        via,
        user.roles
            .iter()
            .map(|(pattern, role)| (pattern.clone(), *role))
            .collect(),
        scope,
    ))
}

/// The user a Telegram id is mapped to.
pub fn telegram_user(users: &UsersConfig, id: i64) -> Option<&str> {
    users
        .iter()
        .find(|(_, u)| u.telegram.contains(&id))
        .map(|(name, _)| name.as_str())
}
