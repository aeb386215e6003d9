//! The `egress` config blocks and their validation (spec `egress.md` §2).
//!
//! Owns the serde shape of the top-level `egress` block ([`EgressConfig`]) and of an
//! agent's `agents.<a>.egress` ([`AgentEgressConfig`]), their rules ([`RuleConfig`]), and
//! the step that turns them into checked [`Rule`]s: [`rule_set`] merges the shared rules
//! with the agent's own (an agent gets both; their order never matters) and refuses, with
//! the path and the fix ([`RuleError`]), every rule the matcher could misread;
//! [`settings`] merges and checks the scalar settings. The blocks are plain values here;
//! wiring them into the main config is the config layer's job.

use std::collections::HashMap;
use std::net::IpAddr;

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
    /// Ask a human in attended runs (spec §6). Accepted already, but until approvals
    /// exist it behaves exactly as `deny`.
    Ask,
}

/// The top-level `egress` block: settings and rules shared by every agent. It enables
/// nothing by itself; an agent has egress only with its own `egress` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressConfig {
    /// What a miss does: `deny` (default) or `ask` (behaves as `deny` until approvals
    /// exist).
    #[serde(default)]
    pub on_unknown: OnUnknown,
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

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            on_unknown: OnUnknown::default(),
            rules: Vec::new(),
            max_streams: default_max_streams(),
            idle_seconds: default_idle_seconds(),
            proxy_port: default_proxy_port(),
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
    /// What a miss does (`ask` behaves as `deny` until approvals exist).
    pub on_unknown: OnUnknown,
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
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(EgressSettings {
        on_unknown: agent.on_unknown.unwrap_or(top.on_unknown),
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
/// rule; an empty, odd or duplicate rule id (shared rules included).
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
    if errors.is_empty() {
        Ok(RuleSet::new(rules, version))
    } else {
        Err(errors)
    }
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
