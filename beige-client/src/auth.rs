//! People and what they may do (`spec/people.md` §1): [`Role`], [`Action`], [`Caller`]
//! (a person as one authenticated request presents them: their roles, narrowed by the
//! token they used) and [`Refusal`] (the 403 naming what is missing). The rules are one
//! pure function, [`Role::allows`], which every channel and the gateway consult, so the
//! HTTP API, the console and Telegram cannot disagree about them.
//!
//! Token records ([`TokenInfo`], [`NewToken`], [`MintedToken`]) cross the [`Admin`]
//! trait (`beige users token …` and `/api/tokens`).
//!
//! [`Admin`]: crate::Admin

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::principal::Principal;

/// A user's role on an agent, lowest first: each role may do everything the ones below
/// it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees the agent, reads its transcripts and audit; changes nothing.
    Viewer,
    /// Prompts the agent in sessions of their own and approves requests raised there.
    Member,
    /// Approves anything for the agent, runs core tools directly, cancels others' turns.
    Operator,
    /// Everything, including users, tokens, the config and restarts (only on `"*"`).
    Owner,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Member, Role::Operator, Role::Owner];

    /// The role's name as the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Operator => "operator",
            Role::Owner => "owner",
        }
    }

    /// The lowest role that may do `action` (the table of `spec/people.md` §1.2).
    pub fn required_for(action: Action) -> Role {
        match action {
            Action::See | Action::ReadAllTranscripts | Action::ReadAudit => Role::Viewer,
            Action::Prompt | Action::ApproveOwn => Role::Member,
            Action::ApproveAny | Action::Operate => Role::Operator,
            Action::Administer => Role::Owner,
        }
    }

    /// Whether this role may do `action` on an agent. Members read transcripts and audit
    /// of their own sessions only: [`Action::ReadAllTranscripts`] and
    /// [`Action::ReadAudit`] are the agent-wide reads, which viewers have and members do
    /// not.
    pub fn allows(self, action: Action) -> bool {
        match action {
            Action::ReadAllTranscripts | Action::ReadAudit => self != Role::Member,
            _ => self >= Role::required_for(action),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role '{s}': use viewer, member, operator or owner"))
    }
}

/// What a request wants to do with an agent (or, for [`Action::Administer`], with the
/// gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// See the agent, its model, sandbox and link health, usage.
    See,
    /// Prompt; create, resume and cancel own sessions; own session settings.
    Prompt,
    /// Read every transcript of the agent (members read their own only).
    ReadAllTranscripts,
    /// Read every audit record of the agent (members: their own sessions only).
    ReadAudit,
    /// Approve, once, a request raised in an own session.
    ApproveOwn,
    /// Approve any request for the agent, with any scope.
    ApproveAny,
    /// Cancel others' turns; core tools directly (`…/exec`, MCP); hook routes; recreate
    /// the sandbox.
    Operate,
    /// Users, everyone's tokens, `/api/config`, restart, metrics.
    Administer,
}

impl Action {
    /// Every action, in the table's order.
    pub const ALL: [Action; 8] = [
        Action::See,
        Action::Prompt,
        Action::ReadAllTranscripts,
        Action::ReadAudit,
        Action::ApproveOwn,
        Action::ApproveAny,
        Action::Operate,
        Action::Administer,
    ];

    /// The action in a refusal's words.
    pub fn describe(self) -> &'static str {
        match self {
            Action::See => "see",
            Action::Prompt => "prompt",
            Action::ReadAllTranscripts => "read every transcript of",
            Action::ReadAudit => "read the audit of",
            Action::ApproveOwn | Action::ApproveAny => "approve for",
            Action::Operate => "operate",
            Action::Administer => "administer",
        }
    }
}

/// How far a token narrows its user's roles (a scope never widens them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenScope {
    /// Only these agents (names or `*` globs); `None`: every agent the user has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// At most this role on any agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_role: Option<Role>,
}

/// A person as one request presents them: the user, how they authenticated, their roles
/// (pattern → role, from the config) and the scope of the token used. Built only by the
/// gateway from a verified credential; nothing a request says can change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user's name (`owner` for `gateway.token`).
    pub user: String,
    /// How they authenticated: `token:<id>`, `console:<token id>`, `telegram:<id>`,
    /// `api` (the gateway's own token).
    pub via: String,
    /// The token's id, when a personal token was used.
    pub token_id: Option<String>,
    roles: Vec<(String, Role)>,
    scope: TokenScope,
}

impl Caller {
    /// The holder of `gateway.token`: owner of every agent.
    pub fn owner() -> Self {
        Self {
            user: "owner".to_string(),
            via: "api".to_string(),
            token_id: None,
            roles: vec![("*".to_string(), Role::Owner)],
            scope: TokenScope::default(),
        }
    }

    /// A user with these role entries (`pattern → role`), narrowed by `scope`.
    pub fn new(
        user: impl Into<String>,
        via: impl Into<String>,
        roles: Vec<(String, Role)>,
        scope: TokenScope,
    ) -> Self {
        Self {
            user: user.into(),
            via: via.into(),
            token_id: None,
            roles,
            scope,
        }
    }

    /// The same caller, naming the token that authenticated them.
    pub fn with_token_id(mut self, id: impl Into<String>) -> Self {
        self.token_id = Some(id.into());
        self
    }

    /// The same caller arriving another way (`console:<token id>`, `mcp:<token id>`).
    pub fn with_via(mut self, via: impl Into<String>) -> Self {
        self.via = via.into();
        self
    }

    /// Whether this is the gateway token's owner (the only principal before `users`).
    pub fn is_gateway_owner(&self) -> bool {
        self.user == "owner" && self.via == "api" && self.token_id.is_none()
    }

    /// The principal the gateway's calls carry for this caller.
    pub fn principal(&self) -> Principal {
        if self.is_gateway_owner() {
            Principal::ApiToken
        } else {
            Principal::Person {
                name: self.user.clone(),
                via: self.via.clone(),
            }
        }
    }

    /// The caller's role on `agent`: the highest of the entries whose pattern matches,
    /// capped by the token's scope; `None` when nothing matches (the agent is then 404
    /// for them: names do not leak).
    pub fn role_on(&self, agent: &str) -> Option<Role> {
        if let Some(agents) = &self.scope.agents {
            if !agents.iter().any(|p| glob_match(p, agent)) {
                return None;
            }
        }
        let role = self
            .roles
            .iter()
            .filter(|(pattern, _)| glob_match(pattern, agent))
            .map(|(_, role)| *role)
            .max()?;
        Some(match self.scope.max_role {
            Some(cap) => role.min(cap),
            None => role,
        })
    }

    /// The caller's role on the gateway as a whole: the role of their `"*"` entry.
    pub fn gateway_role(&self) -> Option<Role> {
        let role = self
            .roles
            .iter()
            .filter(|(pattern, _)| pattern == "*")
            .map(|(_, r)| *r)
            .max()?;
        if self.scope.agents.is_some() {
            // A token limited to some agents is never a gateway-wide credential.
            return Some(role.min(Role::Viewer));
        }
        Some(match self.scope.max_role {
            Some(cap) => role.min(cap),
            None => role,
        })
    }

    /// Whether the caller may see `agent` at all.
    pub fn sees(&self, agent: &str) -> bool {
        self.role_on(agent).is_some()
    }

    /// May the caller do `action` on `agent`? The refusal names what is missing.
    pub fn may(&self, action: Action, agent: &str) -> Result<(), Refusal> {
        if action == Action::Administer {
            return self.may_administer();
        }
        match self.role_on(agent) {
            None => Err(Refusal::UnknownAgent {
                agent: agent.to_string(),
            }),
            Some(role) if role.allows(action) => Ok(()),
            Some(role) => Err(Refusal::Forbidden {
                user: self.user.clone(),
                role: Some(role),
                action,
                agent: Some(agent.to_string()),
                required: required_role(action),
            }),
        }
    }

    /// May the caller administer the gateway (users, tokens, config, restart, metrics)?
    pub fn may_administer(&self) -> Result<(), Refusal> {
        match self.gateway_role() {
            Some(Role::Owner) => Ok(()),
            role => Err(Refusal::Forbidden {
                user: self.user.clone(),
                role,
                action: Action::Administer,
                agent: None,
                required: Role::Owner,
            }),
        }
    }

    /// The session-key prefix of the caller's own API sessions on `agent`: the owner of
    /// the gateway keeps `api:<agent>:`, everyone else `api:<agent>:u:<user>`.
    pub fn own_session_prefix(&self, agent: &str) -> String {
        if self.is_gateway_owner() {
            format!("api:{agent}:")
        } else {
            format!("api:{agent}:u:{}", self.user)
        }
    }

    /// The key of the caller's default API session on `agent`.
    pub fn default_session_key(&self, agent: &str) -> String {
        if self.is_gateway_owner() {
            format!("api:{agent}:default")
        } else {
            format!("api:{agent}:u:{}", self.user)
        }
    }

    /// Whether `key` names one of the caller's own sessions on `agent`.
    pub fn owns_session(&self, agent: &str, key: &str) -> bool {
        let prefix = self.own_session_prefix(agent);
        key == prefix.trim_end_matches(':')
            || key
                .strip_prefix(&prefix)
                .is_some_and(|rest| self.is_gateway_owner() || rest.starts_with(':'))
    }

    /// May the caller use the session `key` of `agent`: their own with
    /// [`Action::Prompt`], anybody's as an operator.
    pub fn may_use_session(&self, agent: &str, key: &str) -> Result<(), Refusal> {
        self.may(Action::Prompt, agent)?;
        if self.owns_session(agent, key) || self.may(Action::Operate, agent).is_ok() {
            return Ok(());
        }
        Err(Refusal::NotOwnSession {
            user: self.user.clone(),
            agent: agent.to_string(),
            key: key.to_string(),
            prefix: self.own_session_prefix(agent),
        })
    }
}

fn required_role(action: Action) -> Role {
    match action {
        // A member reads their own; the agent-wide read needs an operator (or a viewer,
        // whose reads are all read-only).
        Action::ReadAllTranscripts | Action::ReadAudit => Role::Operator,
        other => Role::required_for(other),
    }
}

/// Why a caller may not do something. `UnknownAgent` is shown as 404 (an agent the
/// caller has no role on does not exist for them); the others as 403.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No role on the agent.
    #[error("Unknown agent: {agent}")]
    UnknownAgent {
        /// The agent asked for.
        agent: String,
    },
    /// A role too low for the action.
    #[error("{}", forbidden_message(user, *role, *action, agent.as_deref(), *required))]
    Forbidden {
        /// The user.
        user: String,
        /// Their role where it was checked.
        role: Option<Role>,
        /// What they wanted.
        action: Action,
        /// The agent, unless gateway-wide.
        agent: Option<String>,
        /// The lowest role that would do.
        required: Role,
    },
    /// A member using a session key that is not theirs.
    #[error("{user} may use only their own sessions of {agent} (keys starting '{prefix}'), not '{key}': operator required for others'")]
    NotOwnSession {
        /// The user.
        user: String,
        /// The agent.
        agent: String,
        /// The key asked for.
        key: String,
        /// The prefix their own keys have.
        prefix: String,
    },
}

impl Refusal {
    /// The HTTP status a refusal answers with.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::UnknownAgent { .. } => 404,
            _ => 403,
        }
    }
}

fn forbidden_message(
    user: &str,
    role: Option<Role>,
    action: Action,
    agent: Option<&str>,
    required: Role,
) -> String {
    match (agent, role) {
        (Some(agent), Some(role)) => format!(
            "{user} ({role} on {agent}) may not {} {agent}: {required} required",
            action.describe()
        ),
        (Some(agent), None) => format!(
            "{user} may not {} {agent}: {required} required",
            action.describe()
        ),
        (None, Some(role)) => format!(
            "{user} ({role} on the gateway) may not {}: {required} required",
            action.describe()
        ),
        (None, None) => format!(
            "{user} may not {} the gateway: {required} on \"*\" required",
            action.describe()
        ),
    }
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// A step of a person's authentication, or a refusal, for the audit (`type: "auth"`):
/// what channels report through [`Admin::audit_auth`](crate::Admin::audit_auth).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthEvent {
    /// `auth.refused`, `auth.login`, `auth.logout`, `auth.failed`.
    pub what: String,
    /// The agent concerned; `None` for the gateway as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The user, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// How they came (`token:<id>`, `console:<id>`, the client's address for a failed
    /// login).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Whether it went through (a login) or was refused.
    pub allowed: bool,
    /// What was refused and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl AuthEvent {
    /// A request of `caller` refused.
    pub fn refused(caller: &Caller, agent: Option<&str>, refusal: &Refusal) -> Self {
        Self {
            what: "auth.refused".to_string(),
            agent: agent.map(str::to_string),
            user: Some(caller.user.clone()),
            via: Some(caller.via.clone()),
            allowed: false,
            detail: Some(refusal.to_string()),
        }
    }

    /// An event about `caller` that went through (`auth.login`, `auth.logout`).
    pub fn of(what: &str, caller: &Caller) -> Self {
        Self {
            what: what.to_string(),
            agent: None,
            user: Some(caller.user.clone()),
            via: Some(caller.via.clone()),
            allowed: true,
            detail: None,
        }
    }

    /// A failed attempt (`auth.failed`) from `via`, and why.
    pub fn failed(via: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            what: "auth.failed".to_string(),
            agent: None,
            user: None,
            via: Some(via.into()),
            allowed: false,
            detail: Some(why.into()),
        }
    }
}

/// A personal API token as listed (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    /// The token's public id (the part after `bgt_`).
    pub id: String,
    /// The user it acts as.
    pub user: String,
    /// Its name (`laptop`).
    pub name: String,
    /// How far it narrows the user's roles.
    #[serde(default)]
    pub scope: TokenScope,
    /// When it was made (ms since the epoch).
    pub created_ms: i64,
    /// When it stops working (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
    /// When it last authenticated a request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_ms: Option<i64>,
    /// Revoked tokens stop working at once and stay listed.
    #[serde(default)]
    pub revoked: bool,
}

/// What `beige users token create` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewToken {
    /// The user the token acts as (must be in `users`).
    pub user: String,
    /// Its name.
    pub name: String,
    /// Lifetime in seconds; `None`: no expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
    /// How far it narrows the user's roles.
    #[serde(default)]
    pub scope: TokenScope,
}

/// A token just made: the only time its secret is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MintedToken {
    /// `bgt_<id>_<secret>`: what the holder sends as `Authorization: Bearer …`.
    pub token: String,
    /// The record as listed.
    pub info: TokenInfo,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(roles: &[(&str, Role)]) -> Caller {
        Caller::new(
            "u",
            "token:x",
            roles.iter().map(|(p, r)| (p.to_string(), *r)).collect(),
            TokenScope::default(),
        )
    }

    /// The whole table of `spec/people.md` §1.2: every role × action, on an agent the
    /// role is on and on one it is not.
    #[test]
    fn every_role_action_and_agent() {
        let expected = |role: Role, action: Action| -> bool {
            use Action::*;
            use Role::*;
            match (role, action) {
                (_, See) => true,
                (Viewer, ReadAllTranscripts | ReadAudit) => true,
                (Viewer, _) => false,
                (Member, Prompt | ApproveOwn) => true,
                (Member, _) => false,
                (Operator, Administer) => false,
                (Operator, _) => true,
                (Owner, _) => true,
            }
        };
        for role in Role::ALL {
            // Owner only exists on "*"; the others on one agent, "a".
            let pattern = if role == Role::Owner { "*" } else { "a" };
            let caller = user(&[(pattern, role)]);
            for action in Action::ALL {
                let on_a = caller.may(action, "a");
                let want = if action == Action::Administer {
                    role == Role::Owner
                } else {
                    expected(role, action)
                };
                assert_eq!(on_a.is_ok(), want, "{role} {action:?} on a: {on_a:?}");
                if let Err(refusal) = on_a {
                    assert_eq!(refusal.status(), 403, "{refusal}");
                    assert!(refusal.to_string().contains("required"), "{refusal}");
                }
                let on_b = caller.may(action, "b");
                if role == Role::Owner {
                    assert_eq!(on_b.is_ok(), want, "owner {action:?} on b");
                } else if action == Action::Administer {
                    assert_eq!(on_b.map_err(|r| r.status()), Err(403));
                } else {
                    // No role on b: it does not exist for them.
                    assert_eq!(
                        on_b,
                        Err(Refusal::UnknownAgent { agent: "b".into() }),
                        "{role} {action:?} on b"
                    );
                }
            }
        }
    }

    #[test]
    fn the_highest_matching_role_wins_and_a_scope_only_narrows() {
        let roles = vec![
            ("intern".to_string(), Role::Operator),
            ("*".to_string(), Role::Viewer),
        ];
        let c = Caller::new("ops1", "token:t", roles.clone(), TokenScope::default());
        assert_eq!(c.role_on("intern"), Some(Role::Operator));
        assert_eq!(c.role_on("other"), Some(Role::Viewer));
        let capped = Caller::new(
            "ops1",
            "token:t",
            roles.clone(),
            TokenScope {
                agents: None,
                max_role: Some(Role::Member),
            },
        );
        assert_eq!(capped.role_on("intern"), Some(Role::Member));
        assert_eq!(capped.role_on("other"), Some(Role::Viewer));
        let only = Caller::new(
            "ops1",
            "token:t",
            roles,
            TokenScope {
                agents: Some(vec!["intern".into()]),
                max_role: Some(Role::Owner),
            },
        );
        assert_eq!(
            only.role_on("intern"),
            Some(Role::Operator),
            "max_role never widens"
        );
        assert_eq!(only.role_on("other"), None);
    }

    #[test]
    fn refusals_name_the_user_role_agent_and_what_is_required() {
        let c = Caller::new(
            "ops1",
            "token:t",
            vec![("intern".into(), Role::Member)],
            TokenScope::default(),
        );
        let e = c.may(Action::ApproveAny, "intern").unwrap_err();
        assert_eq!(
            e.to_string(),
            "ops1 (member on intern) may not approve for intern: operator required"
        );
        let e = c.may_administer().unwrap_err();
        assert!(e.to_string().contains("owner"), "{e}");
    }

    #[test]
    fn members_use_only_their_own_session_keys() {
        let m = user(&[("a", Role::Member)]);
        assert!(m.may_use_session("a", "api:a:u:u").is_ok());
        assert!(m.may_use_session("a", "api:a:u:u:work").is_ok());
        assert!(
            m.may_use_session("a", "api:a:u:uv").is_err(),
            "a prefix of another user"
        );
        assert!(m.may_use_session("a", "api:a:default").is_err());
        let op = user(&[("a", Role::Operator)]);
        assert!(op.may_use_session("a", "api:a:default").is_ok());
        let owner = Caller::owner();
        assert!(owner.may_use_session("a", "api:a:default").is_ok());
        assert_eq!(owner.principal(), Principal::ApiToken);
        assert_eq!(
            m.principal(),
            Principal::Person {
                name: "u".into(),
                via: "token:x".into()
            }
        );
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "x"));
        assert!(glob_match("build-*", "build-1"));
        assert!(!glob_match("build-*", "xbuild-1"));
        assert!(glob_match("a", "a"));
        assert!(!glob_match("a", "ab"));
    }
}
