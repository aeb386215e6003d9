//! Policy: whether a tool call may run, with the reason, and which tools an agent sees.
//!
//! Owns the [`Policy`] trait, its question ([`PolicyRequest`]) and answer ([`Decision`]),
//! who is asking ([`Principal`]), the [`Approver`] that settles an [`Decision::Ask`], and
//! two implementations: [`ConfigPolicy`], the default built from config (plugin tools are
//! denied unless listed in the agent's `tools`; core tools are allowed unless listed in
//! the agent's `denyTools`; then the agent's rules as data, [`rules`], may deny or ask),
//! and [`PolicyStack`], a list of policies resolved deny > ask > allow. [`shell`] splits
//! an `exec` line into the simple commands `exec` rules are checked against.
//!
//! A decision is a plain value carrying its reason, so it can be logged, audited,
//! returned to the caller and tested without anything else. The same policy gates core
//! tools and plugin tools on every path (the gateway's guarded path):
//!
//! - `Allow` runs the call;
//! - `Deny` refuses it with the reason (audited `denied`);
//! - `Ask` goes to the embedder's [`Approver`] (`GatewayBuilder::approver`) when one is
//!   set, whose answer is final; otherwise to the gateway's approvals broker
//!   (`crate::approvals`): a person on the run's channel decides, and a run nobody
//!   attends is denied at once.
//!
//! [`Policy::exposes`] answers a separate question: which tools an agent *sees* — the
//! launchers in its sandbox and the tools its system prompt lists. By default a tool is
//! exposed unless `check` with no arguments denies it.
//!
//! The [`Principal`] comes from the connection, never from a payload: calls over the
//! agent's tool socket are [`Principal::Sandbox`]; a model's calls inherit the principal
//! of the prompt they run in (the HTTP API sets [`Principal::ApiToken`], Telegram
//! [`Principal::User`]).
//!
//! ```
//! use beige_core::policy::{Decision, Policy, PolicyRequest, PolicyStack, Principal, ToolKind};
//! use std::sync::Arc;
//!
//! /// Anything the sandbox runs needs a human's yes; the rest is for the config to say.
//! #[derive(Debug)]
//! struct AskSandbox;
//!
//! #[async_trait::async_trait]
//! impl Policy for AskSandbox {
//!     async fn check(&self, r: &PolicyRequest<'_>) -> Decision {
//!         match r.principal {
//!             Principal::Sandbox => Decision::ask(format!("a script calls '{}'", r.tool)),
//!             _ => Decision::allow("not from the sandbox"),
//!         }
//!     }
//! }
//!
//! # tokio_test_block_on(async {
//! let stack = PolicyStack::new().with(Arc::new(AskSandbox));
//! let request = PolicyRequest::new("a", "kv", ToolKind::Plugin, &[])
//!     .with_principal(&Principal::Sandbox);
//! assert_eq!(stack.check(&request).await, Decision::ask("a script calls 'kv'"));
//! # });
//! # fn tokio_test_block_on(f: impl std::future::Future<Output = ()>) {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use crate::config::Config;
pub use crate::principal::Principal;
use crate::vocab::CORE_TOOLS;

pub mod rules;
pub mod shell;

pub use rules::{
    AgentPolicy, AgentRules, Evaluation, Grant, GrantSet, PatternElem, Rule, RuleDecision,
    RuleMatch, UnboundCalls,
};

pub use crate::vocab::ToolKind;

/// The principal of a [`PolicyRequest`] that names none.
static UNVERIFIED: Principal = Principal::Unverified;

/// The question a policy answers: one call, or (with empty `args`) whether a tool is
/// usable at all. Build it with [`PolicyRequest::new`] and the `with_*` setters.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct PolicyRequest<'a> {
    /// The calling agent.
    pub agent: &'a str,
    /// The tool called.
    pub tool: &'a str,
    /// Core tool or plugin tool.
    pub kind: ToolKind,
    /// Its arguments (the audit's `args`).
    pub args: &'a [String],
    /// The session the call runs in, when known.
    pub session: Option<&'a str>,
    /// The channel of that session (`api`, `telegram`, `socket`, …).
    pub channel: Option<&'a str>,
    /// The model making the call, as `provider/model`, when a model makes it.
    pub model: Option<&'a str>,
    /// Who the call comes from.
    pub principal: &'a Principal,
    /// The exec the call comes from (its id), when known.
    pub exec: Option<&'a str>,
    /// The working folder of the call, as the sandbox sees it (`/workspace/…`); `None`
    /// is `/workspace`.
    pub cwd: Option<&'a str>,
    /// The live grants of the agent (session and time-boxed ones), besides the config's.
    pub grants: Option<&'a GrantSet>,
}

impl<'a> PolicyRequest<'a> {
    /// A request with no session, channel or model, from [`Principal::Unverified`].
    pub fn new(agent: &'a str, tool: &'a str, kind: ToolKind, args: &'a [String]) -> Self {
        Self {
            agent,
            tool,
            kind,
            args,
            session: None,
            channel: None,
            model: None,
            principal: &UNVERIFIED,
            exec: None,
            cwd: None,
            grants: None,
        }
    }

    /// The exec the call comes from.
    pub fn with_exec(mut self, exec: Option<&'a str>) -> Self {
        self.exec = exec;
        self
    }

    /// The working folder of the call.
    pub fn with_cwd(mut self, cwd: Option<&'a str>) -> Self {
        self.cwd = cwd;
        self
    }

    /// The live grants to check an `ask` against.
    pub fn with_grants(mut self, grants: Option<&'a GrantSet>) -> Self {
        self.grants = grants;
        self
    }

    /// The session the call runs in.
    pub fn with_session(mut self, session: Option<&'a str>) -> Self {
        self.session = session;
        self
    }

    /// The channel of the session.
    pub fn with_channel(mut self, channel: Option<&'a str>) -> Self {
        self.channel = channel;
        self
    }

    /// The model making the call.
    pub fn with_model(mut self, model: Option<&'a str>) -> Self {
        self.model = model;
        self
    }

    /// Who the call comes from.
    pub fn with_principal(mut self, principal: &'a Principal) -> Self {
        self.principal = principal;
        self
    }
}

/// The answer, with its reason and, when a rule decided, that rule. Serialized as
/// `{"decision": "allow"|"deny"|"ask", "reason": …, "rule"?: …, "justification"?: …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    /// The call may run.
    Allow {
        /// Why (for logs and tests).
        reason: String,
        /// The id of the rule that decided, if one did.
        #[serde(skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        /// That rule's justification.
        #[serde(skip_serializing_if = "Option::is_none")]
        justification: Option<String>,
    },
    /// The call is refused; the reason is what the caller sees.
    Deny {
        /// Why, as told to the caller and recorded in the audit.
        reason: String,
        /// The id of the rule that decided, if one did.
        #[serde(skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        /// That rule's justification.
        #[serde(skip_serializing_if = "Option::is_none")]
        justification: Option<String>,
    },
    /// The call needs an [`Approver`]'s answer; without one it is refused.
    Ask {
        /// What to ask about.
        reason: String,
        /// The id of the rule that asks, if one does.
        #[serde(skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        /// That rule's justification (for the approver).
        #[serde(skip_serializing_if = "Option::is_none")]
        justification: Option<String>,
    },
}

impl Decision {
    /// The call may run.
    pub fn allow(reason: impl Into<String>) -> Self {
        Decision::Allow {
            reason: reason.into(),
            rule: None,
            justification: None,
        }
    }

    /// The call is refused.
    pub fn deny(reason: impl Into<String>) -> Self {
        Decision::Deny {
            reason: reason.into(),
            rule: None,
            justification: None,
        }
    }

    /// The call needs approval.
    pub fn ask(reason: impl Into<String>) -> Self {
        Decision::Ask {
            reason: reason.into(),
            rule: None,
            justification: None,
        }
    }

    /// The same answer, naming the rule `id` that decided and its justification.
    pub fn with_rule(mut self, id: impl Into<String>, justification: Option<String>) -> Self {
        match &mut self {
            Decision::Allow {
                rule,
                justification: j,
                ..
            }
            | Decision::Deny {
                rule,
                justification: j,
                ..
            }
            | Decision::Ask {
                rule,
                justification: j,
                ..
            } => {
                *rule = Some(id.into());
                *j = justification;
            }
        }
        self
    }

    /// The reason, whatever the answer.
    pub fn reason(&self) -> &str {
        match self {
            Decision::Allow { reason, .. }
            | Decision::Deny { reason, .. }
            | Decision::Ask { reason, .. } => reason,
        }
    }

    /// The reason, owned.
    pub fn into_reason(self) -> String {
        match self {
            Decision::Allow { reason, .. }
            | Decision::Deny { reason, .. }
            | Decision::Ask { reason, .. } => reason,
        }
    }

    /// The id of the rule that decided, if one did.
    pub fn rule(&self) -> Option<&str> {
        match self {
            Decision::Allow { rule, .. }
            | Decision::Deny { rule, .. }
            | Decision::Ask { rule, .. } => rule.as_deref(),
        }
    }

    /// The justification of the rule that decided, if it has one.
    pub fn justification(&self) -> Option<&str> {
        match self {
            Decision::Allow { justification, .. }
            | Decision::Deny { justification, .. }
            | Decision::Ask { justification, .. } => justification.as_deref(),
        }
    }

    /// Whether the call may run.
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }

    /// Whether the call is refused.
    pub fn is_deny(&self) -> bool {
        matches!(self, Decision::Deny { .. })
    }

    /// Whether the call needs approval.
    pub fn is_ask(&self) -> bool {
        matches!(self, Decision::Ask { .. })
    }
}

/// Decides whether a tool call may run, and which tools an agent sees.
#[async_trait]
pub trait Policy: Send + Sync + Debug {
    /// The decision on one call.
    async fn check(&self, request: &PolicyRequest<'_>) -> Decision;

    /// Whether `agent` sees the plugin tool `tool`: a launcher in its sandbox and an
    /// entry in its system prompt. Default: `check` with no arguments is not `Deny`.
    async fn exposes(&self, agent: &str, tool: &str) -> bool {
        !self
            .check(&PolicyRequest::new(agent, tool, ToolKind::Plugin, &[]))
            .await
            .is_deny()
    }
}

#[async_trait]
impl<P: Policy + ?Sized> Policy for Arc<P> {
    async fn check(&self, request: &PolicyRequest<'_>) -> Decision {
        (**self).check(request).await
    }

    async fn exposes(&self, agent: &str, tool: &str) -> bool {
        (**self).exposes(agent, tool).await
    }
}

/// Settles a [`Decision::Ask`]: its answer is final (anything but `Allow` refuses the
/// call, with the answer's reason). Without one, the gateway's approvals broker asks a person.
#[async_trait]
pub trait Approver: Send + Sync + Debug {
    /// The final decision on `request`, which the policy asked about for `reason`.
    async fn approve(&self, request: &PolicyRequest<'_>, reason: &str) -> Decision;
}

/// The refusal of an `Ask` on a gateway that has no [`Approver`].
pub fn no_approver_message(tool: &str, agent: &str, reason: &str) -> String {
    format!(
        "Permission denied: tool '{tool}' for agent '{agent}' needs approval, and this gateway has no approver: {reason}"
    )
}

/// The message the original returned for a tool the agent may not use.
pub fn not_allowed_message(tool: &str, agent: &str) -> String {
    format!("Permission denied: tool '{tool}' is not allowed for agent '{agent}'")
}

/// The policy config writes: first the allow-lists — `agents.<a>.tools` for plugin tools
/// (deny by default), `agents.<a>.denyTools` to take tools (core ones included) away —
/// then, for a granted tool, the agent's rules (`agents.<a>.policy`, [`rules`]), which
/// may deny or ask but never grant a tool.
#[derive(Debug, Clone, Default)]
pub struct ConfigPolicy {
    allowed: HashMap<String, HashSet<String>>,
    denied: HashMap<String, HashSet<String>>,
    rules: HashMap<String, AgentRules>,
    /// Each agent's `tools` entries, in order, for MCP tools (`<server>.<tool>`), which
    /// patterns allow ([`crate::config::mcp::patterns_allow`]).
    patterns: HashMap<String, Vec<String>>,
    /// The configured MCP servers' names.
    mcp_servers: HashSet<String>,
}

/// Milliseconds since the Unix epoch, for time-boxed grants.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl ConfigPolicy {
    /// The policy of `config`'s agents.
    pub fn from_config(config: &Config) -> Self {
        let mut p = ConfigPolicy::default();
        if let Some(mcp) = &config.mcp {
            p.mcp_servers = mcp.servers.keys().cloned().collect();
        }
        for (name, agent) in &config.agents {
            if !p.mcp_servers.is_empty() {
                p.patterns.insert(name.clone(), agent.tools.clone());
            }
            p.allowed
                .insert(name.clone(), agent.tools.iter().cloned().collect());
            p.denied
                .insert(name.clone(), agent.deny_tools.iter().cloned().collect());
            if let Some(policy) = &agent.policy {
                p.rules
                    .insert(name.clone(), AgentRules::new(name.clone(), policy.clone()));
            }
        }
        p
    }

    /// Whether `tool` is an MCP server (`files`) or one of its tools (`files.read`).
    fn is_mcp(&self, tool: &str) -> bool {
        let server = tool.split_once('.').map_or(tool, |(s, _)| s);
        self.mcp_servers.contains(server)
    }

    /// `agent`'s rules, when its config has a `policy`.
    pub fn agent_rules(&self, agent: &str) -> Option<&AgentRules> {
        self.rules.get(agent)
    }

    /// The decision on `r` with every rule that matched and the grant that lifted an ask
    /// (what `beige policy check` prints); `check` is its `decision`.
    pub fn explain(&self, r: &PolicyRequest<'_>) -> Evaluation {
        self.explain_at(r, now_ms())
    }

    /// [`explain`](Self::explain) at `now_ms` (milliseconds since the Unix epoch).
    pub fn explain_at(&self, r: &PolicyRequest<'_>, now_ms: u64) -> Evaluation {
        let granted = self.allow_lists(r);
        let Some(rules) = self.rules.get(r.agent).filter(|_| granted.is_allow()) else {
            return Evaluation {
                decision: granted,
                matches: Vec::new(),
                grant: None,
            };
        };
        let mut evaluation = rules.evaluate(r, now_ms);
        if evaluation.decision.is_allow() && evaluation.matches.is_empty() {
            evaluation.decision = Decision::allow(format!(
                "{}; {}",
                granted.reason(),
                evaluation.decision.reason()
            ));
        }
        evaluation
    }

    fn allow_lists(&self, r: &PolicyRequest<'_>) -> Decision {
        let Some(allowed) = self.allowed.get(r.agent) else {
            return Decision::deny(format!("Permission denied: unknown agent '{}'", r.agent));
        };
        let denied = self.denied.get(r.agent);
        if denied.is_some_and(|d| d.contains(r.tool)) {
            return Decision::deny(format!(
                "{} (agents.{}.denyTools lists it)",
                not_allowed_message(r.tool, r.agent),
                r.agent
            ));
        }
        match r.kind {
            ToolKind::Core if CORE_TOOLS.contains(&r.tool) => {
                Decision::allow("core tool, not denied by config")
            }
            ToolKind::Core => Decision::deny(format!("'{}' is not a core tool", r.tool)),
            ToolKind::Plugin if allowed.contains(r.tool) => {
                Decision::allow(format!("listed in agents.{}.tools", r.agent))
            }
            ToolKind::Plugin if self.is_mcp(r.tool) => {
                let patterns = self.patterns.get(r.agent).map_or(&[][..], Vec::as_slice);
                let allowed = match r.tool.split_once('.') {
                    Some((server, tool)) => {
                        crate::config::mcp::patterns_allow(patterns, server, tool)
                    }
                    None => crate::config::mcp::patterns_name_server(patterns, r.tool),
                };
                if allowed {
                    Decision::allow(format!("a pattern in agents.{}.tools allows it", r.agent))
                } else {
                    Decision::deny(format!(
                        "{} (no pattern in agents.{}.tools allows it, or a `!` pattern denies it)",
                        not_allowed_message(r.tool, r.agent),
                        r.agent
                    ))
                }
            }
            ToolKind::Plugin => Decision::deny(not_allowed_message(r.tool, r.agent)),
        }
    }
}

#[async_trait]
impl Policy for ConfigPolicy {
    async fn check(&self, r: &PolicyRequest<'_>) -> Decision {
        self.explain(r).decision
    }

    /// The allow-lists alone: rules decide calls, not whether a tool is seen.
    async fn exposes(&self, agent: &str, tool: &str) -> bool {
        !self
            .allow_lists(&PolicyRequest::new(agent, tool, ToolKind::Plugin, &[]))
            .is_deny()
    }
}

/// Several policies as one, resolved deny > ask > allow: the first `Deny` wins, else the
/// first `Ask`, else `Allow` (with the members' reasons). A stack with no policies
/// denies, and a tool is exposed only when every member exposes it.
///
/// E.g. `PolicyStack::new().with(Arc::new(ConfigPolicy::from_config(&c))).with(mine)`
/// keeps the config's allow-lists and adds `mine`'s refusals and questions.
#[derive(Debug, Clone, Default)]
pub struct PolicyStack {
    policies: Vec<Arc<dyn Policy>>,
}

impl PolicyStack {
    /// An empty stack (it denies everything until a policy is added).
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a policy.
    pub fn with(mut self, policy: Arc<dyn Policy>) -> Self {
        self.policies.push(policy);
        self
    }

    /// Add a policy in place.
    pub fn push(&mut self, policy: Arc<dyn Policy>) {
        self.policies.push(policy);
    }

    /// How many policies the stack holds.
    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// Whether the stack holds no policy.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
}

/// The refusal of a [`PolicyStack`] with no policies.
pub const EMPTY_STACK_MESSAGE: &str = "Permission denied: the policy stack has no policies";

#[async_trait]
impl Policy for PolicyStack {
    async fn check(&self, request: &PolicyRequest<'_>) -> Decision {
        if self.policies.is_empty() {
            return Decision::deny(EMPTY_STACK_MESSAGE);
        }
        let mut ask: Option<Decision> = None;
        let mut allowed: Vec<String> = Vec::new();
        for p in &self.policies {
            match p.check(request).await {
                d @ Decision::Deny { .. } => return d,
                d @ Decision::Ask { .. } => {
                    ask.get_or_insert(d);
                }
                Decision::Allow { reason, .. } => allowed.push(reason),
            }
        }
        ask.unwrap_or_else(|| Decision::allow(allowed.join("; ")))
    }

    async fn exposes(&self, agent: &str, tool: &str) -> bool {
        if self.policies.is_empty() {
            return false;
        }
        for p in &self.policies {
            if !p.exposes(agent, tool).await {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ConfigPolicy {
        let config: Config = serde_json::from_value(serde_json::json!({
            "llm": {"providers": {"anthropic": {}}},
            "agents": {
                "a": {"model": {"provider": "anthropic", "model": "m"}, "tools": ["kv"]},
                "b": {"model": {"provider": "anthropic", "model": "m"}, "tools": ["kv", "git"], "denyTools": ["exec", "git"]}
            }
        }))
        .unwrap();
        ConfigPolicy::from_config(&config)
    }

    fn check(p: &dyn Policy, agent: &str, tool: &str, kind: ToolKind) -> Decision {
        futures_util::FutureExt::now_or_never(p.check(&PolicyRequest::new(agent, tool, kind, &[])))
            .unwrap()
    }

    fn exposes(p: &dyn Policy, agent: &str, tool: &str) -> bool {
        futures_util::FutureExt::now_or_never(p.exposes(agent, tool)).unwrap()
    }

    #[test]
    fn plugin_tools_denied_by_default() {
        let p = policy();
        assert!(check(&p, "a", "kv", ToolKind::Plugin).is_allow());
        let d = check(&p, "a", "git", ToolKind::Plugin);
        assert!(d.is_deny());
        assert_eq!(
            d.reason(),
            "Permission denied: tool 'git' is not allowed for agent 'a'"
        );
        assert!(check(&p, "nobody", "kv", ToolKind::Plugin).is_deny());
    }

    #[test]
    fn core_tools_allowed_unless_denied() {
        let p = policy();
        for t in CORE_TOOLS {
            assert!(check(&p, "a", t, ToolKind::Core).is_allow(), "{t}");
        }
        let d = check(&p, "b", "exec", ToolKind::Core);
        assert!(d.is_deny());
        assert!(d.reason().contains("denyTools"));
        assert!(check(&p, "b", "read", ToolKind::Core).is_allow());
        // denyTools wins over tools.
        assert!(check(&p, "b", "git", ToolKind::Plugin).is_deny());
        assert!(check(&p, "a", "kv", ToolKind::Core).is_deny());
    }

    /// Answers the same for every call; hides `hidden` when set.
    #[derive(Debug)]
    struct Fixed(Decision, Option<&'static str>);

    #[async_trait]
    impl Policy for Fixed {
        async fn check(&self, _: &PolicyRequest<'_>) -> Decision {
            self.0.clone()
        }
        async fn exposes(&self, _agent: &str, tool: &str) -> bool {
            self.1 != Some(tool)
        }
    }

    /// Only `check`: `exposes` is the default.
    #[derive(Debug)]
    struct CheckOnly(Decision);

    #[async_trait]
    impl Policy for CheckOnly {
        async fn check(&self, _: &PolicyRequest<'_>) -> Decision {
            self.0.clone()
        }
    }

    fn stack(decisions: &[Decision]) -> PolicyStack {
        decisions.iter().fold(PolicyStack::new(), |s, d| {
            s.with(Arc::new(Fixed(d.clone(), None)))
        })
    }

    #[test]
    fn a_stack_resolves_deny_over_ask_over_allow() {
        let (allow, ask, deny) = (
            Decision::allow("ok"),
            Decision::ask("sure?"),
            Decision::deny("no"),
        );
        let t = |s: &PolicyStack| check(s, "a", "kv", ToolKind::Plugin);
        assert_eq!(t(&stack(&[allow.clone(), ask.clone(), deny.clone()])), deny);
        assert_eq!(t(&stack(&[deny.clone(), allow.clone()])), deny);
        assert_eq!(t(&stack(&[allow.clone(), ask.clone()])), ask);
        assert_eq!(
            t(&stack(&[Decision::ask("first"), Decision::ask("second")])),
            Decision::ask("first")
        );
        assert_eq!(
            t(&stack(&[allow.clone(), Decision::allow("also")])),
            Decision::allow("ok; also")
        );
        // Nothing in the stack: nothing runs and nothing is exposed.
        let empty = PolicyStack::new();
        assert!(empty.is_empty());
        assert_eq!(t(&empty), Decision::deny(EMPTY_STACK_MESSAGE));
        assert!(!exposes(&empty, "a", "kv"));
        // The config policy inside a stack keeps its answers.
        let s = PolicyStack::new().with(Arc::new(policy()));
        assert_eq!(s.len(), 1);
        assert_eq!(
            check(&s, "a", "git", ToolKind::Plugin).reason(),
            "Permission denied: tool 'git' is not allowed for agent 'a'"
        );
        assert!(check(&s, "a", "kv", ToolKind::Plugin).is_allow());
    }

    #[test]
    fn a_stack_exposes_a_tool_only_when_no_member_hides_it() {
        let s = PolicyStack::new()
            .with(Arc::new(Fixed(Decision::allow("ok"), None)))
            .with(Arc::new(Fixed(Decision::allow("ok"), Some("git"))));
        assert!(exposes(&s, "a", "kv"));
        assert!(!exposes(&s, "a", "git"));
        let s = s.with(Arc::new(CheckOnly(Decision::deny("no"))));
        assert!(!exposes(&s, "a", "kv"));
    }

    #[test]
    fn exposes_by_default_unless_check_denies() {
        assert!(exposes(&CheckOnly(Decision::allow("ok")), "a", "kv"));
        // A tool that needs approval is still shown: the approver decides each call.
        assert!(exposes(&CheckOnly(Decision::ask("sure?")), "a", "kv"));
        assert!(!exposes(&CheckOnly(Decision::deny("no")), "a", "kv"));
        let p = policy();
        assert!(exposes(&p, "a", "kv"));
        assert!(!exposes(&p, "a", "git"));
        assert!(!exposes(&p, "b", "git"));
        assert!(!exposes(&Arc::new(p), "nobody", "kv"));
    }

    #[test]
    fn requests_default_to_unverified_and_carry_what_they_are_given() {
        let args = vec!["get".to_string()];
        let r = PolicyRequest::new("a", "kv", ToolKind::Plugin, &args);
        assert_eq!(r.principal, &Principal::Unverified);
        assert_eq!((r.session, r.channel, r.model), (None, None, None));
        let user = Principal::user("telegram", "42");
        let r = r
            .with_session(Some("telegram:42"))
            .with_channel(Some("telegram"))
            .with_model(Some("anthropic/m"))
            .with_principal(&user);
        assert_eq!(r.session, Some("telegram:42"));
        assert_eq!(r.channel, Some("telegram"));
        assert_eq!(r.model, Some("anthropic/m"));
        assert_eq!(
            r.principal,
            &Principal::User {
                channel: "telegram".into(),
                id: "42".into()
            }
        );
        assert_eq!(r.args, &args[..]);
        assert_eq!(Principal::default(), Principal::Unverified);
    }

    #[test]
    fn decisions_carry_their_reason_and_serialize_tagged() {
        let d = Decision::ask("sure?");
        assert!(d.is_ask() && !d.is_allow() && !d.is_deny());
        assert_eq!(d.reason(), "sure?");
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({"decision": "ask", "reason": "sure?"})
        );
        assert_eq!(
            serde_json::to_value(Decision::deny("no")).unwrap(),
            serde_json::json!({"decision": "deny", "reason": "no"})
        );
        assert_eq!(Decision::allow("ok").into_reason(), "ok");
    }
}
