//! The `egress` config blocks and their validation (spec `egress.md` §2).
//!
//! Owns the serde shape of the top-level `egress` block ([`EgressConfig`]) and of an
//! agent's `agents.<a>.egress` ([`AgentEgressConfig`]), their rules ([`RuleConfig`]), and
//! the step that turns them into checked [`Rule`]s: [`rule_set`] merges the shared rules
//! with the agent's own (an agent gets both; their order never matters) and refuses, with
//! the path and the fix ([`RuleError`]), every rule the matcher could misread;
//! [`settings`] merges and checks the scalar settings. Credentials (`egress.credentials`,
//! [`CredentialConfig`]) are checked against the rules of the agents that are granted
//! them and bound to the agent's [`RuleSet`] as [`Credential`]s; their [`Secret`]s never
//! show in `Debug`. The blocks are plain values here; wiring them into the main config is
//! the config layer's job.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use indexmap::IndexMap;
use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::classify::allow_private_refusal;
use super::rules::{check_path_glob, Action, HostPattern, Rule, RuleSet, RuleSource};

/// What happens to a connection no rule allows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnUnknown {
    /// Refuse it (`no_rule`). The default.
    #[default]
    Deny,
    /// Ask a human in attended runs (spec §6): the miss becomes an approval request
    /// of kind `egress`, and the connection is refused `approval_pending` (after
    /// `holdSeconds`); a decision adds an exact host-and-port rule. Unattended runs are
    /// refused `unattended`.
    Ask,
}

/// The top-level `egress` block: settings and rules shared by every agent. It enables
/// nothing by itself; an agent has egress only with its own `egress` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressConfig {
    /// What a miss does: `deny` (default) or `ask` (an approval request in attended
    /// runs).
    #[serde(default)]
    pub on_unknown: OnUnknown,
    /// With `onUnknown: "ask"`, how long a connection to an unknown host waits for a
    /// human's answer before it is refused `approval_pending` (0 to 30 s; default 0:
    /// at once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_seconds: u64,
    /// Rules every agent with egress gets, besides its own.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// Open egress streams per agent at most; default 256.
    #[serde(default = "default_max_streams")]
    pub max_streams: usize,
    /// Seconds a stream may carry no bytes before it is closed; default 600.
    #[serde(default = "default_idle_seconds")]
    pub idle_seconds: u64,
    /// The port of the explicit proxy inside the sandbox (`127.0.0.1:<port>`); default
    /// 3128.
    #[serde(default = "default_proxy_port")]
    pub proxy_port: u16,
    /// Credentials the gateway brokers, by name; an agent gets those its
    /// `egress.credentials` grants.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub credentials: IndexMap<String, CredentialConfig>,
    /// TLS settings of inspect mode.
    #[serde(default, skip_serializing_if = "EgressTlsConfig::is_empty")]
    pub tls: EgressTlsConfig,
}

/// `egress.tls`: how inspect mode talks TLS to upstreams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressTlsConfig {
    /// PEM files of extra CA certificates inspected upstreams may be signed by, besides
    /// the public roots (`~/` is the user's home; a relative path is relative to the
    /// config file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_roots: Vec<String>,
}

impl EgressTlsConfig {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.extra_roots.is_empty()
    }
}

/// A secret from config (after `${VAR}` interpolation): its `Debug` shows
/// `Secret(<redacted>)`, never the value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret with this value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it upstream.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One credential of `egress.credentials` (spec §2): a secret, the exact hosts it is
/// for, and how it is delivered: `inject` (the gateway sets a header) or `placeholder`
/// (the sandbox gets a stand-in the gateway swaps for the secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialConfig {
    /// The secret, usually `"${TOKEN_VARIABLE}"`; redacted everywhere.
    pub secret: Secret,
    /// The exact hosts it is sent to (no wildcards, no addresses); a granted agent's
    /// rules must allow each of them.
    pub hosts: Vec<String>,
    /// The header the gateway sets on requests to those hosts, replacing the client's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject: Option<InjectConfig>,
    /// A placeholder in an environment variable of every exec, swapped for the secret
    /// in headers, Basic credentials and the query of requests to those hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<PlaceholderConfig>,
    /// Whether a request to those hosts must use the credential (default true): with a
    /// placeholder, one without it gets `credential_required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require: Option<bool>,
    /// What a placeholder sent to another host does: `block` (default) refuses the
    /// request; `block_and_kill` also kills the exec it was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub violation: Option<Violation>,
    /// Whether the secret is masked in responses (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<bool>,
}

/// How an injected credential is written into a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InjectConfig {
    /// The header, e.g. `Authorization`.
    pub header: String,
    /// The value with `{}` where the secret goes, e.g. `"Bearer {}"`; default `"{}"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

/// Where a placeholder is handed to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlaceholderConfig {
    /// The environment variable every exec gets it in, e.g. `OPENAI_API_KEY`.
    pub env: String,
    /// Put in front, for SDKs that check a key's shape, e.g. `"sk-"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// What a placeholder sent to a host it is not for does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Violation {
    /// Refuse the request (`placeholder_misuse`). The default.
    #[default]
    Block,
    /// Refuse it and kill the exec the placeholder was made for.
    BlockAndKill,
}

/// How a checked [`Credential`] reaches the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The gateway sets `header` to `before <secret> after`.
    Inject {
        /// The header, lower case.
        header: String,
        /// What comes before the secret.
        before: String,
        /// What comes after it.
        after: String,
    },
    /// Every exec gets a placeholder in `env`, with `prefix` in front.
    Placeholder {
        /// The environment variable.
        env: String,
        /// The prefix.
        prefix: String,
    },
}

/// A checked credential, bound to an agent's [`RuleSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Its name in `egress.credentials`.
    pub name: String,
    /// The secret.
    pub secret: Secret,
    /// The exact, normalised names it is for.
    pub hosts: Vec<String>,
    /// How it is delivered.
    pub delivery: Delivery,
    /// Whether a request to its hosts must use it.
    pub require: bool,
    /// What a misused placeholder does.
    pub violation: Violation,
    /// Whether the secret is masked in responses.
    pub scrub: bool,
}

impl Credential {
    /// A credential set in `header` as `format` with its one `{}` replaced by the
    /// secret; `None` when `format` has not exactly one `{}`.
    pub fn new(
        name: impl Into<String>,
        secret: Secret,
        hosts: Vec<String>,
        header: &str,
        format: &str,
    ) -> Option<Self> {
        if format.matches("{}").count() != 1 {
            return None;
        }
        let (before, after) = format.split_once("{}")?;
        Some(Self::with_delivery(
            name,
            secret,
            hosts,
            Delivery::Inject {
                header: header.to_ascii_lowercase(),
                before: before.to_string(),
                after: after.to_string(),
            },
        ))
    }

    /// A placeholder credential handed out in `env` with `prefix` in front.
    pub fn placeholder(
        name: impl Into<String>,
        secret: Secret,
        hosts: Vec<String>,
        env: &str,
        prefix: &str,
    ) -> Self {
        Self::with_delivery(
            name,
            secret,
            hosts,
            Delivery::Placeholder {
                env: env.to_string(),
                prefix: prefix.to_string(),
            },
        )
    }

    fn with_delivery(
        name: impl Into<String>,
        secret: Secret,
        hosts: Vec<String>,
        delivery: Delivery,
    ) -> Self {
        Self {
            name: name.into(),
            secret,
            hosts,
            delivery,
            require: true,
            violation: Violation::Block,
            scrub: true,
        }
    }

    /// Whether it is for `host` (an exact name).
    pub fn is_for(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h == host)
    }

    /// The header and its value, secret included, for an injected credential.
    pub fn header_value(&self) -> Option<(&str, String)> {
        match &self.delivery {
            Delivery::Inject {
                header,
                before,
                after,
            } => Some((header, format!("{before}{}{after}", self.secret.expose()))),
            Delivery::Placeholder { .. } => None,
        }
    }
}

fn default_max_streams() -> usize {
    256
}

fn default_idle_seconds() -> u64 {
    600
}

fn default_proxy_port() -> u16 {
    3128
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The longest `egress.holdSeconds`: a client waits no longer for a human.
pub const MAX_HOLD_SECONDS: u64 = 30;

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            on_unknown: OnUnknown::default(),
            hold_seconds: 0,
            rules: Vec::new(),
            max_streams: default_max_streams(),
            idle_seconds: default_idle_seconds(),
            proxy_port: default_proxy_port(),
            credentials: IndexMap::new(),
            tls: EgressTlsConfig::default(),
        }
    }
}

/// An agent's `egress` block: its presence turns egress on for the agent. Its settings
/// override the top-level ones; its rules are added to them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentEgressConfig {
    /// The agent's own rules, added to `egress.rules`.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// Overrides `egress.onUnknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_unknown: Option<OnUnknown>,
    /// Overrides `egress.maxStreams`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<usize>,
    /// Overrides `egress.idleSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_seconds: Option<u64>,
    /// The names of the `egress.credentials` this agent may use (grants).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
}

/// One rule as config writes it (spec §2, the rule table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleConfig {
    /// Unique among the agent's rules, shared ones included: letters, digits, `-`, `_`
    /// and `.`, at most 64.
    pub id: String,
    /// `api.x.com`; `*.x.com` (any depth below, not the apex); `ip:ADDR[/len]`.
    pub hosts: Vec<String>,
    /// The ports an allow rule admits; default `[443]` (80 and every other port must be
    /// listed). A deny rule refuses every port and takes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
    /// `allow` (default) or `deny`; a deny beats every allow and approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Upper-case HTTP methods; default any. Requests are then inspected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Globs on the decoded path (`*` within one segment, `**` any segments); default
    /// any. Requests are then inspected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// CIDRs the rule's exact hosts may resolve into although private; never loopback,
    /// link-local, unspecified or multicast, and not on a rule with a wildcard host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_private: Vec<String>,
}

/// A refused part of an egress block: where, and what is wrong with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct RuleError {
    /// The config path, e.g. `agents.intern.egress.rules[2].hosts[0]`.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl RuleError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// The settings an agent's egress runs with, top-level values overridden by the agent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressSettings {
    /// What a miss does.
    pub on_unknown: OnUnknown,
    /// How long an asked-about connection waits for the answer (`egress.holdSeconds`).
    pub hold_seconds: u64,
    /// Open streams at most.
    pub max_streams: usize,
    /// Seconds without bytes before a stream is closed.
    pub idle_seconds: u64,
    /// The explicit proxy's port inside the sandbox.
    pub proxy_port: u16,
}

/// `agents.<name>.egress`, quoting a name that would be ambiguous after a dot.
fn agent_prefix(agent_name: &str) -> String {
    if agent_name.is_empty() || agent_name.contains(['.', '[', ']', '"', '/']) {
        let quoted = serde_json::to_string(agent_name).unwrap_or_default();
        format!("agents[{quoted}].egress")
    } else {
        format!("agents.{agent_name}.egress")
    }
}

/// The settings for agent `agent_name`: the agent's overrides over the top-level block
/// (or its defaults when there is none). Refuses `maxStreams` and `idleSeconds` of 0,
/// and a `proxyPort` of 0 or 53 (the DNS stub's).
pub fn settings(
    top: Option<&EgressConfig>,
    agent_name: &str,
    agent: &AgentEgressConfig,
) -> Result<EgressSettings, Vec<RuleError>> {
    let defaults = EgressConfig::default();
    let top = top.unwrap_or(&defaults);
    let prefix = agent_prefix(agent_name);
    let mut errors = Vec::new();
    let (max_streams, max_path) = match agent.max_streams {
        Some(n) => (n, format!("{prefix}.maxStreams")),
        None => (top.max_streams, "egress.maxStreams".to_string()),
    };
    if max_streams == 0 {
        errors.push(RuleError::new(
            max_path,
            "0 streams would refuse every connection; write at least 1 (default 256)",
        ));
    }
    let (idle_seconds, idle_path) = match agent.idle_seconds {
        Some(n) => (n, format!("{prefix}.idleSeconds")),
        None => (top.idle_seconds, "egress.idleSeconds".to_string()),
    };
    if idle_seconds == 0 {
        errors.push(RuleError::new(
            idle_path,
            "0 seconds would close every stream at once; write at least 1 (default 600)",
        ));
    }
    if top.proxy_port == 0 || top.proxy_port == 53 {
        errors.push(RuleError::new(
            "egress.proxyPort",
            format!(
                "port {} is not free for the proxy (53 is the DNS stub's); write another, \
                 such as 3128 (the default)",
                top.proxy_port
            ),
        ));
    }
    if top.hold_seconds > MAX_HOLD_SECONDS {
        errors.push(RuleError::new(
            "egress.holdSeconds",
            format!(
                "{} s is too long for a client to wait; write at most {MAX_HOLD_SECONDS} (0, the \
                 default, refuses `approval_pending` at once)",
                top.hold_seconds
            ),
        ));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(EgressSettings {
        on_unknown: agent.on_unknown.unwrap_or(top.on_unknown),
        hold_seconds: top.hold_seconds,
        max_streams,
        idle_seconds,
        proxy_port: top.proxy_port,
    })
}

/// The checked rule set of agent `agent_name` at policy `version`: the top-level rules
/// (paths `egress.rules[i]…`) followed by the agent's (`agents.<name>.egress.rules[i]…`).
///
/// Every problem is reported, not only the first: an empty `hosts` or one that does not
/// parse ([`HostPattern::parse`]); an empty `ports`, port 0, or `ports` on a deny rule
/// (which refuses every port); an empty `methods` or `paths`, a method that is not an
/// upper-case token, a path glob [`check_path_glob`] refuses; an `allowPrivate` entry
/// that is not a CIDR, has bits after its prefix, overlaps loopback, link-local,
/// unspecified or multicast space, sits on a rule with a wildcard host or on a deny
/// rule; an empty, odd or duplicate rule id (shared rules included). Then the agent's
/// credential grants, as [`credentials`] checks them, are bound to the set.
pub fn rule_set(
    top: Option<&EgressConfig>,
    agent_name: &str,
    agent: &AgentEgressConfig,
    version: u64,
) -> Result<RuleSet, Vec<RuleError>> {
    let sources = top
        .map(|top| ("egress.rules".to_string(), top.rules.as_slice()))
        .into_iter()
        .chain([(
            format!("{}.rules", agent_prefix(agent_name)),
            agent.rules.as_slice(),
        )]);
    let mut errors = Vec::new();
    let mut rules = Vec::new();
    let mut seen: HashMap<&str, String> = HashMap::new();
    for (prefix, list) in sources {
        for (i, config) in list.iter().enumerate() {
            let path = format!("{prefix}[{i}]");
            if let Some(first) = seen.get(config.id.as_str()) {
                errors.push(RuleError::new(
                    format!("{path}.id"),
                    format!(
                        "rule id '{}' is already used at {first}; give each rule its own id",
                        config.id.escape_debug()
                    ),
                ));
            } else {
                seen.insert(&config.id, path.clone());
            }
            match compile_rule(&path, config) {
                Ok(rule) => rules.push(rule),
                Err(mut problems) => errors.append(&mut problems),
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let set = RuleSet::new(rules, version);
    let bound = credentials(top, agent_name, agent, &set)?;
    Ok(set.with_credentials(bound))
}

/// Headers a credential may not be injected into: the gateway owns them.
const RESERVED_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
];

/// The credentials agent `agent_name` is granted, checked against its `rules`.
///
/// Refused, each with its path and fix: a grant of a credential `egress.credentials` does
/// not define, or of the same one twice; a credential with an empty secret; no hosts, a
/// wildcard, an address or a `host:port`, or a host the agent's rules do not allow on a
/// port other than 80 (plain HTTP never gets credentials); a header that is not a token
/// or is one the gateway owns (`Host`, `Content-Length`, …); a `format` without exactly
/// one `{}`; two granted credentials for the same host.
pub fn credentials(
    top: Option<&EgressConfig>,
    agent_name: &str,
    agent: &AgentEgressConfig,
    rules: &RuleSet,
) -> Result<Vec<Credential>, Vec<RuleError>> {
    let prefix = agent_prefix(agent_name);
    let defined = top.map(|t| &t.credentials);
    let mut errors = Vec::new();
    let mut bound: Vec<Credential> = Vec::new();
    let mut by_host: HashMap<String, String> = HashMap::new();
    for (i, grant) in agent.credentials.iter().enumerate() {
        let grant_path = format!("{prefix}.credentials[{i}]");
        let Some(config) = defined.and_then(|d| d.get(grant)) else {
            let known: Vec<&str> = defined
                .map(|d| d.keys().map(String::as_str).collect())
                .unwrap_or_default();
            errors.push(RuleError::new(
                grant_path,
                format!(
                    "no credential '{}' in egress.credentials ({}); define it there or remove \
                     the grant",
                    grant.escape_debug(),
                    if known.is_empty() {
                        "it defines none".to_string()
                    } else {
                        format!("it defines {}", known.join(", "))
                    }
                ),
            ));
            continue;
        };
        if bound.iter().any(|c| &c.name == grant) {
            errors.push(RuleError::new(
                grant_path,
                format!("'{}' is granted twice; remove one", grant.escape_debug()),
            ));
            continue;
        }
        let path = format!("egress.credentials.{grant}");
        match check_credential(&path, agent_name, grant, config, rules) {
            Ok(credential) => {
                for host in &credential.hosts {
                    if let Some(other) = by_host.get(host) {
                        errors.push(RuleError::new(
                            grant_path.clone(),
                            format!(
                                "'{grant}' and '{other}' are both for {host}, and a request can \
                                 carry only one; grant one of them"
                            ),
                        ));
                    } else {
                        by_host.insert(host.clone(), grant.clone());
                    }
                }
                bound.push(credential);
            }
            Err(mut problems) => errors.append(&mut problems),
        }
    }
    if errors.is_empty() {
        Ok(bound)
    } else {
        Err(errors)
    }
}

/// Checks one credential at `path` (`egress.credentials.<name>`) for `agent_name`.
/// (Also how a remote MCP server's `credentials` are checked: against the agent's
/// rules, as if granted.)
pub fn check_credential(
    path: &str,
    agent_name: &str,
    name: &str,
    config: &CredentialConfig,
    rules: &RuleSet,
) -> Result<Credential, Vec<RuleError>> {
    let mut errors = Vec::new();
    if config.secret.expose().is_empty() {
        errors.push(RuleError::new(
            format!("{path}.secret"),
            "the secret is empty; write \"${TOKEN_VARIABLE}\" and set the variable",
        ));
    }
    if config.hosts.is_empty() {
        errors.push(RuleError::new(
            format!("{path}.hosts"),
            "a credential needs at least one host; write e.g. [\"api.example.com\"]",
        ));
    }
    let mut hosts = Vec::new();
    for (j, raw) in config.hosts.iter().enumerate() {
        let at = format!("{path}.hosts[{j}]");
        let shown = raw.escape_debug();
        if let Some((host, "80")) = raw.rsplit_once(':') {
            errors.push(RuleError::new(
                at,
                format!(
                    "`{shown}`: plain HTTP never gets credentials; write the host alone \
                     (`{}`), reached over HTTPS",
                    host.escape_debug()
                ),
            ));
            continue;
        }
        let name = match HostPattern::parse(raw) {
            Ok(HostPattern::Exact(name)) => name,
            Ok(HostPattern::Suffix(_)) => {
                errors.push(RuleError::new(
                    at,
                    format!(
                        "`{shown}`: a credential goes only to exact hosts, never to a wildcard; \
                         list each host, e.g. `api.example.com`"
                    ),
                ));
                continue;
            }
            Ok(HostPattern::Ip(_)) => {
                errors.push(RuleError::new(
                    at,
                    format!(
                        "`{shown}`: a credential goes only to named hosts, whose certificate \
                         names them; write the host's name"
                    ),
                ));
                continue;
            }
            Err(e) => {
                errors.push(RuleError::new(at, e.to_string()));
                continue;
            }
        };
        let host = super::target::Host::Name(name.clone());
        let ports: Vec<u16> = rules
            .rules()
            .iter()
            .filter(|r| r.action == Action::Allow && r.matches_host(&host))
            .flat_map(|r| r.ports.iter().copied())
            .collect();
        let allowed: Vec<u16> = ports
            .iter()
            .copied()
            .filter(|&port| {
                port != 80
                    && rules
                        .decide(
                            &super::target::Target {
                                host: host.clone(),
                                port,
                            },
                            None,
                        )
                        .is_allow()
            })
            .collect();
        if allowed.is_empty() {
            let why = if ports.iter().all(|&p| p == 80) && !ports.is_empty() {
                "only on port 80, and plain HTTP never gets credentials"
            } else {
                "on no port"
            };
            errors.push(RuleError::new(
                at,
                format!(
                    "agent '{}' is granted '{name}', but its rules allow {name} {why}; add a \
                     rule such as {{ id: \"{}\", hosts: [\"{name}\"] }} or remove the host",
                    agent_name.escape_debug(),
                    name.split('.').next().unwrap_or("api")
                ),
            ));
        }
        hosts.push(name);
    }
    let delivery = match (&config.inject, &config.placeholder) {
        (Some(inject), None) => check_inject(path, inject, &mut errors),
        (None, Some(placeholder)) => check_placeholder(path, placeholder, &mut errors),
        (Some(_), Some(_)) => {
            errors.push(RuleError::new(
                path.to_string(),
                "a credential has one delivery; keep `inject` (the gateway sets a header) or \
                 `placeholder` (the sandbox gets a stand-in), not both",
            ));
            None
        }
        (None, None) => {
            errors.push(RuleError::new(
                path.to_string(),
                "the credential says not how it is delivered; add `inject: { header: \
                 \"Authorization\", format: \"Bearer {}\" }` or `placeholder: { env: \
                 \"API_KEY\" }`",
            ));
            None
        }
    };
    if config.secret.expose().bytes().any(|b| b.is_ascii_control()) {
        errors.push(RuleError::new(
            format!("{path}.secret"),
            "the secret has a control character (a newline?), which no header may carry; \
             remove it",
        ));
    }
    let Some(delivery) = delivery.filter(|_| errors.is_empty()) else {
        return Err(errors);
    };
    let mut credential = Credential::with_delivery(name, config.secret.clone(), hosts, delivery);
    credential.require = config.require.unwrap_or(true);
    credential.violation = config.violation.unwrap_or_default();
    credential.scrub = config.scrub.unwrap_or(true);
    Ok(credential)
}

/// Checks an `inject` block: a header the gateway does not own, a format with one `{}`.
fn check_inject(
    path: &str,
    inject: &InjectConfig,
    errors: &mut Vec<RuleError>,
) -> Option<Delivery> {
    let before = errors.len();
    let header = &inject.header;
    let header_at = format!("{path}.inject.header");
    if header.is_empty() || !header.bytes().all(is_token_byte) {
        errors.push(RuleError::new(
            header_at,
            format!(
                "`{}` is not a header name; write e.g. `Authorization` or `X-Api-Key`",
                header.escape_debug()
            ),
        ));
    } else if RESERVED_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(header))
    {
        errors.push(RuleError::new(
            header_at,
            format!(
                "the gateway sets `{header}` itself; inject the credential into another \
                 header, e.g. `Authorization`"
            ),
        ));
    }
    let format = inject.format.as_deref().unwrap_or("{}");
    if format.matches("{}").count() != 1 {
        errors.push(RuleError::new(
            format!("{path}.inject.format"),
            format!(
                "`{}` must have exactly one `{{}}` where the secret goes; write e.g. \
                 \"Bearer {{}}\"",
                format.escape_debug()
            ),
        ));
    } else if format.bytes().any(|b| b.is_ascii_control()) {
        errors.push(RuleError::new(
            format!("{path}.inject.format"),
            "the format has a control character, which no header may carry; remove it",
        ));
    }
    if errors.len() > before {
        return None;
    }
    let (b, a) = format.split_once("{}")?;
    Some(Delivery::Inject {
        header: header.to_ascii_lowercase(),
        before: b.to_string(),
        after: a.to_string(),
    })
}

/// Whether `name` is one the gateway owns in a sandbox with egress (proxy, CA and beige
/// variables, and the basics every process needs).
pub fn is_reserved_env(name: &str) -> bool {
    const OWNED: [&str; 5] = ["PATH", "HOME", "USER", "SHELL", "NO_PROXY"];
    let upper = name.to_ascii_uppercase();
    OWNED.contains(&upper.as_str())
        || upper.starts_with("BEIGE_")
        || upper.ends_with("_PROXY")
        || beige_protocol::link::EGRESS_CA_ENV
            .iter()
            .any(|(k, _)| *k == upper)
}

/// Checks a `placeholder` block: a plain environment variable name the gateway does not
/// own, and a short printable prefix.
fn check_placeholder(
    path: &str,
    placeholder: &PlaceholderConfig,
    errors: &mut Vec<RuleError>,
) -> Option<Delivery> {
    let before = errors.len();
    let env = &placeholder.env;
    let valid = env
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        errors.push(RuleError::new(
            format!("{path}.placeholder.env"),
            format!(
                "`{}` is not an environment variable name; write e.g. `OPENAI_API_KEY`",
                env.escape_debug()
            ),
        ));
    } else if is_reserved_env(env) {
        errors.push(RuleError::new(
            format!("{path}.placeholder.env"),
            format!(
                "the gateway sets `{env}` itself; hand the placeholder out in another variable"
            ),
        ));
    }
    let prefix = placeholder.prefix.clone().unwrap_or_default();
    if prefix.len() > 32
        || !prefix.bytes().all(|b| b.is_ascii_graphic())
        || prefix.contains("bgph_")
    {
        errors.push(RuleError::new(
            format!("{path}.placeholder.prefix"),
            format!(
                "`{}` must be at most 32 printable characters without spaces; write e.g. \"sk-\"",
                prefix.escape_debug()
            ),
        ));
    }
    (errors.len() == before).then(|| Delivery::Placeholder {
        env: env.clone(),
        prefix,
    })
}

/// Whether `b` may be in an HTTP header name (RFC 9110 `tchar`).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Checks one rule at `path` (`…rules[i]`) and builds it.
fn compile_rule(path: &str, config: &RuleConfig) -> Result<Rule, Vec<RuleError>> {
    let mut errors = Vec::new();
    let action = config.action.unwrap_or_default();
    if let Some(message) = id_problem(&config.id) {
        errors.push(RuleError::new(format!("{path}.id"), message));
    }

    if config.hosts.is_empty() {
        errors.push(RuleError::new(
            format!("{path}.hosts"),
            "a rule needs at least one host; write e.g. [\"api.example.com\"]",
        ));
    }
    let mut hosts = Vec::new();
    for (j, raw) in config.hosts.iter().enumerate() {
        match HostPattern::parse(raw) {
            Ok(pattern) => hosts.push(pattern),
            Err(e) => errors.push(RuleError::new(format!("{path}.hosts[{j}]"), e.to_string())),
        }
    }

    let ports = match (&config.ports, action) {
        (None, _) => vec![443],
        (Some(_), Action::Deny) => {
            errors.push(RuleError::new(
                format!("{path}.ports"),
                "a deny rule refuses its hosts on every port; remove `ports`",
            ));
            Vec::new()
        }
        (Some(ports), Action::Allow) => {
            if ports.is_empty() {
                errors.push(RuleError::new(
                    format!("{path}.ports"),
                    "an empty `ports` admits nothing; list the ports, or leave `ports` out for [443]",
                ));
            }
            for (k, port) in ports.iter().enumerate() {
                if *port == 0 {
                    errors.push(RuleError::new(
                        format!("{path}.ports[{k}]"),
                        "0 is not a port; write one from 1 to 65535",
                    ));
                }
            }
            ports.clone()
        }
    };

    if let Some(methods) = &config.methods {
        if methods.is_empty() {
            errors.push(RuleError::new(
                format!("{path}.methods"),
                "an empty `methods` matches nothing; list methods such as \"GET\", or leave \
                 `methods` out for any",
            ));
        }
        for (k, method) in methods.iter().enumerate() {
            if let Some(message) = method_problem(method) {
                errors.push(RuleError::new(format!("{path}.methods[{k}]"), message));
            }
        }
    }

    if let Some(paths) = &config.paths {
        if paths.is_empty() {
            errors.push(RuleError::new(
                format!("{path}.paths"),
                "an empty `paths` matches nothing; list globs such as \"/repos/acme/**\", or \
                 leave `paths` out for any",
            ));
        }
        for (k, glob) in paths.iter().enumerate() {
            if let Err(message) = check_path_glob(glob) {
                errors.push(RuleError::new(format!("{path}.paths[{k}]"), message));
            }
        }
    }

    let allow_private = check_allow_private(path, config, action, &hosts, &mut errors);

    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Rule {
        id: config.id.clone(),
        hosts,
        ports,
        action,
        methods: config.methods.clone(),
        paths: config.paths.clone(),
        allow_private,
        source: RuleSource::Config,
    })
}

/// The parsed `allowPrivate` of a rule, pushing every problem onto `errors`.
fn check_allow_private(
    path: &str,
    config: &RuleConfig,
    action: Action,
    hosts: &[HostPattern],
    errors: &mut Vec<RuleError>,
) -> Vec<IpNet> {
    if config.allow_private.is_empty() {
        return Vec::new();
    }
    if action == Action::Deny {
        errors.push(RuleError::new(
            format!("{path}.allowPrivate"),
            "a deny rule has no use for `allowPrivate`; remove it",
        ));
    }
    if let Some(wild) = hosts.iter().find(|h| h.is_wildcard()) {
        errors.push(RuleError::new(
            format!("{path}.allowPrivate"),
            format!(
                "a rule with a wildcard host (`{wild}`) may not have `allowPrivate`, since any \
                 name below it could then reach private addresses; put the exact hosts in a \
                 rule of their own"
            ),
        ));
    }
    let mut nets = Vec::new();
    for (k, raw) in config.allow_private.iter().enumerate() {
        let at = format!("{path}.allowPrivate[{k}]");
        let shown = raw.escape_debug();
        let net = match raw.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => {
                match raw.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => {
                        errors.push(RuleError::new(
                        at,
                        format!("`{shown}` is not a CIDR; write e.g. `10.1.2.3/32` or `10.1.0.0/16`"),
                    ));
                        continue;
                    }
                }
            }
        };
        if net.trunc() != net {
            errors.push(RuleError::new(
                at,
                format!(
                    "`{shown}` has bits set after the prefix length; write `{}`",
                    net.trunc()
                ),
            ));
            continue;
        }
        if let Some(reason) = allow_private_refusal(&net) {
            errors.push(RuleError::new(
                at,
                format!(
                    "`{shown}`: {reason}; allow only the private range the host really uses, \
                     e.g. `10.1.2.3/32`"
                ),
            ));
            continue;
        }
        nets.push(net);
    }
    nets
}

/// What is wrong with a rule id, if anything.
fn id_problem(id: &str) -> Option<String> {
    let fix = "write e.g. `pypi` or `gh-api`";
    if id.is_empty() {
        return Some(format!("the rule id is empty; {fix}"));
    }
    if id.len() > 64 {
        return Some(format!(
            "the rule id is {} bytes long, at most 64; {fix}",
            id.len()
        ));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Some(format!(
            "rule id '{}' may have only letters, digits, '-', '_' and '.'; {fix}",
            id.escape_debug()
        ));
    }
    None
}

/// Whether `method` is an upper-case ASCII token: a letter first, then letters, digits,
/// `-` and `_`.
fn is_method_token(method: &str) -> bool {
    let mut bytes = method.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_uppercase())
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_'))
}

/// What is wrong with a method, if anything.
fn method_problem(method: &str) -> Option<String> {
    if is_method_token(method) {
        return None;
    }
    let upper = method.to_ascii_uppercase();
    let fix = if is_method_token(&upper) {
        format!("write `{upper}`")
    } else {
        "write e.g. `GET` or `POST`".to_string()
    };
    Some(format!(
        "method '{}' is not an upper-case HTTP method; {fix}",
        method.escape_debug()
    ))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
