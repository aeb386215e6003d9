//! The people behind requests (`spec/people.md` §1): personal API tokens (made,
//! listed, revoked, and checked on every request: a revoked token stops at once), the
//! resolution of a [`Principal`] to a [`Caller`] with roles from `users`, and the checks
//! the gateway itself makes whichever channel a request came through — who may prompt
//! which agent in which session, and who may decide which approval. Every refusal and
//! every token change is an `auth` audit record.

use base64::Engine as _;
use beige_client::auth::{Action, Caller, MintedToken, NewToken, Refusal, TokenInfo};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::{GatewayError, Inner};
use crate::audit::{AuditDecision, AuditRecord, AuditType};
use crate::policy::Principal;
use crate::store::{now_ms, TokenRecord};

/// The prefix of a personal token: `bgt_<id>_<secret>`.
pub(crate) const TOKEN_PREFIX: &str = "bgt_";

/// How often a token's `lastUsed` is written at most (a busy token would otherwise write
/// on every request).
const TOUCH_EVERY_MS: i64 = 60_000;

/// Split `bgt_<id>_<secret>` into id and secret.
pub(crate) fn split_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let id_ok = !id.is_empty() && id.len() <= 32 && id.bytes().all(|b| b.is_ascii_alphanumeric());
    (id_ok && !secret.is_empty()).then_some((id, secret))
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Compare two equal-purpose digests without leaking where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn invalid(status: u16, message: impl Into<String>) -> GatewayError {
    GatewayError::InvalidAuth {
        status,
        message: message.into(),
    }
}

impl Inner {
    /// The caller a principal stands for, with roles from `users`:
    /// - the gateway's token: the owner;
    /// - a person: their user (`None` when `users` no longer has them);
    /// - a channel user: the user their id is mapped to, else — with a `users` section
    ///   or without — an implicit member of the agents their chat reaches (today's
    ///   behaviour: `allowedUsers` decided they are heard);
    /// - the embedder and the gateway itself: the owner;
    /// - the sandbox and the unverified: nobody.
    pub(crate) fn caller_of(&self, principal: &Principal) -> Option<Caller> {
        let users = &self.config.users;
        match principal {
            Principal::ApiToken | Principal::Embedder => Some(Caller::owner()),
            Principal::Person { name, via } => {
                crate::config::users::caller(users, name, via, Default::default())
            }
            Principal::User { channel, id } => {
                let via = format!("{channel}:{id}");
                if channel == "telegram" {
                    if let Some(name) = id
                        .parse::<i64>()
                        .ok()
                        .and_then(|n| crate::config::users::telegram_user(users, n))
                    {
                        return crate::config::users::caller(users, name, &via, Default::default());
                    }
                }
                Some(Caller::new(
                    via.clone(),
                    via,
                    vec![("*".to_string(), beige_client::auth::Role::Member)],
                    Default::default(),
                ))
            }
            _ => None,
        }
    }

    /// Check `action` on `agent` for `principal`; a refusal is audited (`auth.refused`)
    /// and returned as [`GatewayError::Refused`].
    pub(crate) async fn require(
        &self,
        principal: &Principal,
        action: Action,
        agent: &str,
    ) -> Result<Caller, GatewayError> {
        let caller = match self.caller_of(principal) {
            Some(c) => c,
            None => {
                let refusal = Refusal::UnknownAgent {
                    agent: agent.to_string(),
                };
                self.audit_refused(principal, agent, action, &refusal).await;
                return Err(refusal.into());
            }
        };
        match caller.may(action, agent) {
            Ok(()) => Ok(caller),
            Err(refusal) => {
                self.audit_refused(principal, agent, action, &refusal).await;
                Err(refusal.into())
            }
        }
    }

    /// A prompt: the principal may prompt the agent, in this session key. Channel users
    /// (Telegram) prompt in their chat's session; the key rule applies to API keys.
    pub(crate) async fn require_prompt(
        &self,
        principal: &Principal,
        agent: &str,
        session_key: &str,
    ) -> Result<(), GatewayError> {
        let caller = self.require(principal, Action::Prompt, agent).await?;
        if matches!(principal, Principal::Person { via, .. } if !via.starts_with("telegram:"))
            && session_key.starts_with("api:")
        {
            if let Err(refusal) = caller.may_use_session(agent, session_key) {
                self.audit_refused(principal, agent, Action::Prompt, &refusal)
                    .await;
                return Err(refusal.into());
            }
        }
        Ok(())
    }

    /// An approval decision: operators and owners decide anything for the agent;
    /// members only requests raised in their own sessions, and only once (or deny);
    /// viewers nothing. A chat user's own sessions are their private chat's.
    pub(crate) async fn require_decide(
        &self,
        principal: &Principal,
        approval: &beige_client::approvals::Approval,
        decision: &beige_client::approvals::ApprovalDecision,
    ) -> Result<(), GatewayError> {
        use beige_client::approvals::{Scope, Verdict};
        let agent = approval.agent.as_str();
        let Some(caller) = self.caller_of(principal) else {
            let refusal = Refusal::UnknownAgent {
                agent: agent.to_string(),
            };
            self.audit_refused(principal, agent, Action::ApproveOwn, &refusal)
                .await;
            return Err(refusal.into());
        };
        if caller.may(Action::ApproveAny, agent).is_ok() {
            return Ok(());
        }
        let once = decision.decision == Verdict::Deny || decision.scope == Scope::Once;
        let key = self.session_key_of(&approval.session).await;
        let own = key.is_some_and(|key| match principal {
            // A chat user's own sessions are their private chat's (`telegram:<id>`).
            Principal::User { channel, id } => {
                let mine = format!("{channel}:{id}");
                key == mine || key.starts_with(&format!("{mine}:"))
            }
            _ => caller.owns_session(agent, &key),
        });
        let result = match caller.may(Action::ApproveOwn, agent) {
            Err(refusal) => Err(refusal),
            Ok(()) if own && once => Ok(()),
            Ok(()) => Err(Refusal::Forbidden {
                user: caller.user.clone(),
                role: caller.role_on(agent),
                action: Action::ApproveAny,
                agent: Some(agent.to_string()),
                required: beige_client::auth::Role::Operator,
            }),
        };
        if let Err(refusal) = &result {
            self.audit_refused(principal, agent, Action::ApproveAny, refusal)
                .await;
        }
        Ok(result?)
    }

    /// A channel user mapped to a user of `users` becomes that person (so the audit and
    /// the approvals broker name the user, and their role, not the chat, decides);
    /// every other principal stays as it is.
    pub(crate) fn person_of(&self, principal: Principal) -> Principal {
        if let Principal::User { channel, id } = &principal {
            if channel == "telegram" {
                if let Some(name) = id
                    .parse::<i64>()
                    .ok()
                    .and_then(|n| crate::config::users::telegram_user(&self.config.users, n))
                {
                    return Principal::Person {
                        name: name.to_string(),
                        via: format!("telegram:{id}"),
                    };
                }
            }
        }
        principal
    }

    /// The key of a session id (or the key itself when `session` is one).
    async fn session_key_of(&self, session: &str) -> Option<String> {
        if session.contains(':') {
            return Some(session.to_string());
        }
        self.store
            .get_session(session)
            .await
            .ok()
            .flatten()
            .map(|s| s.key)
    }

    async fn audit_refused(
        &self,
        principal: &Principal,
        agent: &str,
        action: Action,
        refusal: &Refusal,
    ) {
        let mut r = AuditRecord::security(
            agent,
            "auth.refused",
            vec![format!(
                "action={}",
                serde_json::to_value(action)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            )],
            AuditDecision::Denied,
        );
        r.kind = AuditType::Auth;
        r.error = Some(refusal.to_string());
        self.stamp(&mut r, principal);
        self.write_auth(r).await;
    }

    fn stamp(&self, r: &mut AuditRecord, principal: &Principal) {
        let (name, via) = match principal {
            Principal::Person { name, via } => (name.clone(), via.clone()),
            Principal::ApiToken => ("owner".to_string(), "api".to_string()),
            Principal::User { channel, id } => {
                let via = format!("{channel}:{id}");
                let name = self
                    .caller_of(principal)
                    .map(|c| c.user)
                    .unwrap_or_else(|| via.clone());
                (name, via)
            }
            other => (crate::principal::audit_name(other), "system".to_string()),
        };
        r.principal = Some(name);
        r.via = Some(via);
    }

    async fn write_auth(&self, r: AuditRecord) {
        if let Err(e) = self.audit.record(&r).await {
            tracing::warn!(tool = %r.tool, error = %e, "could not audit an auth event");
        }
    }

    /// The `prompt` record of an accepted prompt: who sent it, how, into which session.
    pub(crate) async fn audit_prompt(&self, req: &crate::api::PromptRequest) {
        let mut r = AuditRecord::security(
            &req.agent,
            "prompt",
            vec![format!("bytes={}", req.message.len())],
            AuditDecision::Allowed,
        );
        r.kind = AuditType::Prompt;
        r.session = Some(req.session_key.clone());
        r.channel = Some(req.channel());
        let principal = self.person_of(req.principal.clone());
        self.stamp(&mut r, &principal);
        self.write_auth(r).await;
    }

    /// An `auth` record a channel reports.
    pub(crate) async fn audit_auth_event(&self, event: beige_client::auth::AuthEvent) {
        let decision = if event.allowed {
            AuditDecision::Allowed
        } else {
            AuditDecision::Denied
        };
        let mut r = AuditRecord::security(
            event.agent.as_deref().unwrap_or("*"),
            &event.what,
            Vec::new(),
            decision,
        );
        r.kind = AuditType::Auth;
        r.principal = event.user;
        r.via = event.via;
        r.error = event.detail;
        self.write_auth(r).await;
    }

    /// Who presents a personal token: `None` when it is malformed, unknown, revoked,
    /// expired, or its user is no longer in `users` (each audited as `auth.failed`).
    pub(crate) async fn authenticate(&self, token: &str) -> Result<Option<Caller>, GatewayError> {
        let Some((id, secret)) = split_token(token) else {
            return Ok(None);
        };
        let record = self
            .credentials
            .token(id)
            .await
            .map_err(GatewayError::from)?;
        let why = match &record {
            None => Some("unknown token"),
            Some(r) if !same(&r.secret_sha256, &sha256_hex(secret)) => Some("wrong secret"),
            Some(r) if r.info.revoked => Some("revoked token"),
            Some(r) if r.info.expires_ms.is_some_and(|e| e <= now_ms()) => Some("expired token"),
            Some(r) if !self.config.users.contains_key(&r.info.user) => Some("user removed"),
            Some(_) => None,
        };
        if let Some(why) = why {
            let mut r = AuditRecord::security(
                "*",
                "auth.failed",
                vec![format!("token={id}")],
                AuditDecision::Denied,
            );
            r.kind = AuditType::Auth;
            r.error = Some(why.to_string());
            self.write_auth(r).await;
            return Ok(None);
        }
        let Some(record) = record else {
            return Ok(None);
        };
        let now = now_ms();
        if record
            .info
            .last_used_ms
            .is_none_or(|t| now - t >= TOUCH_EVERY_MS)
        {
            if let Err(e) = self.credentials.touch_token(id, now).await {
                tracing::debug!(error = %e, "could not note a token's use");
            }
        }
        let via = format!("token:{id}");
        Ok(crate::config::users::caller(
            &self.config.users,
            &record.info.user,
            &via,
            record.info.scope.clone(),
        )
        .map(|c| c.with_token_id(id)))
    }

    /// Make a personal token for a user of `users`.
    pub(crate) async fn create_token(&self, new: NewToken) -> Result<MintedToken, GatewayError> {
        if !self.config.users.contains_key(&new.user) {
            let known: Vec<&str> = self.config.users.keys().map(String::as_str).collect();
            return Err(invalid(
                400,
                format!(
                    "no user '{}' in the config's users (known: {}); add one with `beige users add NAME --role AGENT=ROLE`",
                    new.user,
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            ));
        }
        let name = new.name.trim();
        if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            return Err(invalid(
                400,
                "a token's name must be 1 to 64 printable characters (e.g. --name laptop)",
            ));
        }
        let mut id_bytes = [0u8; 10];
        let mut secret_bytes = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut id_bytes);
        rand::thread_rng().fill_bytes(&mut secret_bytes);
        let id = base32_lower(&id_bytes);
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret_bytes);
        let now = now_ms();
        let info = TokenInfo {
            id: id.clone(),
            user: new.user.clone(),
            name: name.to_string(),
            scope: new.scope.clone(),
            created_ms: now,
            expires_ms: new.expires_in_secs.map(|s| {
                now.saturating_add(i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX))
            }),
            last_used_ms: None,
            revoked: false,
        };
        self.credentials
            .insert_token(TokenRecord {
                info: info.clone(),
                secret_sha256: sha256_hex(&secret),
            })
            .await?;
        let mut r = AuditRecord::security(
            "*",
            "auth.token_created",
            vec![
                format!("token={id}"),
                format!("user={}", new.user),
                format!("name={name}"),
            ],
            AuditDecision::Allowed,
        );
        r.kind = AuditType::Auth;
        self.write_auth(r).await;
        Ok(MintedToken {
            token: format!("{TOKEN_PREFIX}{id}_{secret}"),
            info,
        })
    }

    /// Revoke a token: it stops working at once.
    pub(crate) async fn revoke_token(&self, id: &str) -> Result<TokenInfo, GatewayError> {
        let id = id
            .strip_prefix(TOKEN_PREFIX)
            .map_or(id, |rest| rest.split('_').next().unwrap_or(rest));
        let info = self.credentials.revoke_token(id).await?.ok_or_else(|| {
            invalid(
                404,
                format!("no token '{id}'; list them with `beige users token list`"),
            )
        })?;
        let mut r = AuditRecord::security(
            "*",
            "auth.token_revoked",
            vec![format!("token={id}"), format!("user={}", info.user)],
            AuditDecision::Allowed,
        );
        r.kind = AuditType::Auth;
        self.write_auth(r).await;
        Ok(info)
    }
}

/// RFC 4648 base32, lowercase, no padding: a token id that survives any transport.
fn base32_lower(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_into_id_and_secret() {
        assert_eq!(split_token("bgt_abc2_s3cr_et-"), Some(("abc2", "s3cr_et-")));
        assert_eq!(split_token("bgt__x"), None);
        assert_eq!(split_token("bgt_abc"), None);
        assert_eq!(split_token("other"), None);
        assert_eq!(split_token("bgt_a.b_x"), None);
    }

    #[test]
    fn base32_ids() {
        assert_eq!(base32_lower(&[0xff; 5]), "77777777");
        assert_eq!(base32_lower(&[0; 10]).len(), 16);
    }
}
