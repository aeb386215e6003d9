//! Rules as data (governance.md §1): `agents.<a>.policy` and how it decides a call.
//!
//! Owns the config shape ([`AgentPolicy`], [`Rule`], [`PatternElem`], [`Grant`]), its
//! load-time checks ([`validate`], examples included), the [`GrantSet`] that lifts an
//! `ask`, and the evaluation ([`AgentRules::evaluate`]): every rule of the called tool
//! that matches is collected — for `exec`, over each simple command of the line, as
//! [`super::shell::split`] reads it — and the strictest wins, deny > ask > allow; an
//! `ask` becomes `allow` only through a matching grant, a `deny` never does; a simple
//! command no rule matches gets `execDefault`, an opaque one at least `opaqueExec` (for
//! agents with an `exec` rule). Rules never grant a tool: the allow-lists
//! ([`super::ConfigPolicy`]) decide that first. Pure: no I/O, the clock is a parameter.
//! `exec` rules are a guardrail for what the model types, not a boundary; calls that
//! leave the sandbox pass the gateway, where they are enforcement.

use std::collections::HashSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shell::{self, display_argv};
use super::{Decision, PolicyRequest, ToolKind};
use crate::vocab::CORE_TOOLS;

/// Where the sandbox sees the agent's workspace; `path` globs are relative to it.
pub const WORKSPACE: &str = "/workspace";

/// Whether `tool` is one of the four core tools (`read`, `write`, `patch`, `exec`).
pub fn is_core_tool(tool: &str) -> bool {
    CORE_TOOLS.contains(&tool)
}

/// A rule's decision, ordered by strictness: `Allow < Ask < Deny`.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum RuleDecision {
    /// The call may run.
    #[default]
    Allow,
    /// The call needs a human's approval (or a grant).
    Ask,
    /// The call is refused; no grant lifts it.
    Deny,
}

impl RuleDecision {
    /// `allow`, `ask` or `deny`, as config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleDecision::Allow => "allow",
            RuleDecision::Ask => "ask",
            RuleDecision::Deny => "deny",
        }
    }
}

impl std::fmt::Display for RuleDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_opaque_exec() -> RuleDecision {
    RuleDecision::Ask
}

/// What a tool call from a process outside any live exec gets (governance.md §5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnboundCalls {
    /// Refused.
    #[default]
    Deny,
    /// Run in the agent's `socket:<agent>` session, unattended.
    Session,
}

/// One element of a rule's `pattern`: a literal word, or a list of alternatives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PatternElem {
    /// The word itself.
    Literal(String),
    /// Any one of these words.
    AnyOf(Vec<String>),
}

impl PatternElem {
    /// Whether `word` is this literal or one of these alternatives.
    pub fn matches(&self, word: &str) -> bool {
        match self {
            PatternElem::Literal(l) => l == word,
            PatternElem::AnyOf(alts) => alts.iter().any(|a| a == word),
        }
    }
}

/// `agents.<a>.policy`: rules, grants and the defaults they fall back to (new in beige).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentPolicy {
    /// What an `exec` command no rule matches gets: `allow` (default), `ask` or `deny`.
    #[serde(default)]
    pub exec_default: RuleDecision,
    /// The least an `exec` command the parser cannot see through gets (`$(…)`, backticks,
    /// `eval`, `source`, heredocs, a command word with `$`, `*` or `?`); default `ask`.
    /// Applies only to agents with at least one `exec` rule.
    #[serde(default = "default_opaque_exec")]
    pub opaque_exec: RuleDecision,
    /// Tool calls from processes outside any live exec: `deny` (default) or `session`.
    #[serde(default)]
    pub unbound_calls: UnboundCalls,
    /// The rules, each `{id?, tool, pattern?, path?, decision, justification?, exact?,
    /// match?, notMatch?}`; the strictest matching rule wins (deny > ask > allow).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// Standing approvals: each lifts a matching `ask`, never a `deny`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
}

impl Default for AgentPolicy {
    fn default() -> Self {
        Self {
            exec_default: RuleDecision::Allow,
            opaque_exec: default_opaque_exec(),
            unbound_calls: UnboundCalls::Deny,
            rules: Vec::new(),
            grants: Vec::new(),
        }
    }
}

impl AgentPolicy {
    /// Whether some rule is about `exec` (only then does `opaqueExec` apply).
    pub fn has_exec_rules(&self) -> bool {
        self.rules.iter().any(|r| r.tool == "exec")
    }

    /// The id of `rules[index]`: its own, else `r<index>`.
    pub fn rule_id(&self, index: usize) -> String {
        match self.rules.get(index).and_then(|r| r.id.as_deref()) {
            Some(id) => id.to_string(),
            None => format!("r{index}"),
        }
    }
}

/// One rule: which calls of `tool` it covers and what they get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Named in denials, questions and the audit; default `r<index>` (from 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A core tool (`exec`, `read`, `write`, `patch`) or a plugin tool.
    pub tool: String,
    /// The argv of one simple command (`exec`) or the tool's arguments, as a prefix
    /// (`exact`: the whole of it); each element a word or a list of alternatives.
    /// `argv[0]` of an `exec` command also matches by its last path segment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pattern: Vec<PatternElem>,
    /// A glob under `/workspace` (`*` within a segment, `**` any segments): the file of
    /// `read`, `write` and `patch`, the working folder of other tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `allow`, `ask` or `deny`.
    pub decision: RuleDecision,
    /// Shown to the model on a denial and to the approver on an ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub justification: Option<String>,
    /// Match the whole argv, not a prefix of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact: bool,
    /// Calls it must match, checked at load: shell lines (`exec`), paths (`read`,
    /// `write`, `patch`) or arguments (plugin tools, optionally after the tool's name).
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub match_examples: Vec<String>,
    /// Calls it must not match, checked at load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_match: Vec<String>,
}

/// A standing approval: lifts an `ask` for the calls it matches, never a `deny`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// Named when it lifts an ask; default `g<index>` (from 0) in config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tool it covers.
    pub tool: String,
    /// Like a rule's: a prefix of the argv (`exact`: all of it). For `exec`, an exact
    /// one-element pattern may also be the whole command line.
    pub pattern: Vec<PatternElem>,
    /// Match the whole argv, not a prefix of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact: bool,
    /// Only calls in this working folder (under `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Who granted it.
    pub granted_by: String,
    /// When, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_at: Option<String>,
    /// The approval it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    /// Only in this session (live session grants; config grants have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Ends at this time, milliseconds since the Unix epoch (live time-boxed grants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl Grant {
    /// Whether this grant lifts an ask on `argv` (one simple command of an `exec`, or a
    /// tool's arguments) of `request` at `now_ms`. An opaque command is covered only by
    /// an exact grant of the whole command line.
    pub fn covers(
        &self,
        request: &PolicyRequest<'_>,
        argv: &[String],
        opaque: bool,
        now_ms: u64,
    ) -> bool {
        if self.tool != request.tool
            || self.expires_at_ms.is_some_and(|end| now_ms >= end)
            || self
                .session
                .as_deref()
                .is_some_and(|s| request.session != Some(s))
        {
            return false;
        }
        if let Some(cwd) = &self.cwd {
            let theirs = workspace_relative(cwd);
            if theirs.is_none() || theirs != workspace_relative(request.cwd.unwrap_or(WORKSPACE)) {
                return false;
            }
        }
        let exec = request.kind == ToolKind::Core && request.tool == "exec";
        let whole_line = match (exec, self.exact, self.pattern.as_slice(), request.args) {
            (true, true, [PatternElem::Literal(line)], [command]) => line == command,
            _ => false,
        };
        whole_line || (!opaque && pattern_matches(&self.pattern, self.exact, argv, exec))
    }
}

/// The grants a call is checked against: one agent's, config and live ones alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantSet {
    /// In order; the first that covers a call is the one named.
    pub grants: Vec<Grant>,
}

impl GrantSet {
    /// A set of these grants.
    pub fn new(grants: Vec<Grant>) -> Self {
        Self { grants }
    }

    /// The first grant that lifts an ask on `argv` of `request` at `now_ms` (see
    /// [`Grant::covers`]).
    pub fn lifting(
        &self,
        request: &PolicyRequest<'_>,
        argv: &[String],
        opaque: bool,
        now_ms: u64,
    ) -> Option<&Grant> {
        self.grants
            .iter()
            .find(|g| g.covers(request, argv, opaque, now_ms))
    }

    /// Whether the set has no grants.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }
}

/// `pattern` against `argv`: as a prefix, or (`exact`) all of it. For `exec`, the first
/// word also matches by its last path segment (`/usr/bin/git` is `git`).
fn pattern_matches(pattern: &[PatternElem], exact: bool, argv: &[String], exec: bool) -> bool {
    if argv.len() < pattern.len() || (exact && argv.len() != pattern.len()) {
        return false;
    }
    pattern.iter().zip(argv).enumerate().all(|(i, (p, word))| {
        p.matches(word) || (exec && i == 0 && p.matches(shell::basename(word)))
    })
}

/// `path` relative to `/workspace`, lexically normalised (`.`, `..` and empty segments
/// resolved); `None` when it lies outside. A relative path is taken from `/workspace`.
pub fn workspace_relative(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = if path.starts_with('/') {
        Vec::new()
    } else {
        vec!["workspace"]
    };
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    match parts.split_first() {
        Some((&"workspace", rest)) => Some(rest.join("/")),
        _ => None,
    }
}

/// A rule's `path` as matched: relative to `/workspace`.
fn glob_relative(glob: &str) -> &str {
    glob.strip_prefix("/workspace/").unwrap_or(glob)
}

/// What one rule check looks at: one simple command of an `exec`, or one call.
#[derive(Debug, Clone)]
struct Subject {
    /// The words the pattern is matched against.
    argv: Vec<String>,
    /// The file (read, write, patch) or working folder, relative to `/workspace`;
    /// `None` outside it.
    path: Option<String>,
    /// The parser could not see through it.
    opaque: bool,
    /// How messages show it.
    shown: String,
}

/// The subjects of `request`: each simple command of an `exec`, the file of a `read`,
/// `write` or `patch`, the arguments of a plugin tool.
fn subjects(request: &PolicyRequest<'_>) -> Vec<Subject> {
    let cwd = workspace_relative(request.cwd.unwrap_or(WORKSPACE));
    match (request.kind, request.tool) {
        (ToolKind::Core, "exec") => {
            let line = request.args.join(" ");
            shell::split(&line)
                .into_iter()
                .map(|c| Subject {
                    shown: c.display(),
                    argv: c.argv,
                    path: cwd.clone(),
                    opaque: c.opaque,
                })
                .collect()
        }
        (ToolKind::Core, "read" | "write" | "patch") => {
            let raw = request.args.first().map(String::as_str).unwrap_or_default();
            let rel = workspace_relative(raw);
            vec![Subject {
                argv: vec![rel.clone().unwrap_or_else(|| raw.to_string())],
                path: rel,
                opaque: false,
                shown: raw.to_string(),
            }]
        }
        _ => vec![Subject {
            argv: request.args.to_vec(),
            path: cwd,
            opaque: false,
            shown: display_argv(request.args),
        }],
    }
}

impl Rule {
    /// Whether this rule covers `subject` (its tool is checked by the caller).
    fn matches(&self, subject: &Subject, exec: bool) -> bool {
        let path_ok = match (&self.path, &subject.path) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(glob), Some(p)) => crate::egress::rules::glob_matches(glob_relative(glob), p),
        };
        path_ok && pattern_matches(&self.pattern, self.exact, &subject.argv, exec)
    }
}

/// A rule that matched a call, for `beige policy check` and the audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleMatch {
    /// Its id (`r<index>` by default).
    pub rule: String,
    /// What it says.
    pub decision: RuleDecision,
    /// Why, when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub justification: Option<String>,
    /// The simple command (or call) it matched, as shown.
    pub command: String,
}

/// A decision with everything that went into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evaluation {
    /// The answer (its `rule` and `justification` name the deciding rule, if one did).
    pub decision: Decision,
    /// Every rule that matched, in rule order per simple command.
    pub matches: Vec<RuleMatch>,
    /// The grant that lifted an ask, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
}

/// Why one subject got its verdict.
#[derive(Debug, Clone)]
enum Source {
    /// A rule (index into the rules).
    Rule(usize),
    /// No rule matched: `execDefault`, or plain allow for other tools.
    Default,
    /// Opaque: `opaqueExec`.
    Opaque,
}

#[derive(Debug, Clone)]
struct Outcome {
    verdict: RuleDecision,
    source: Source,
    shown: String,
    grant: Option<Grant>,
}

/// One agent's policy, ready to decide calls.
#[derive(Debug, Clone, Default)]
pub struct AgentRules {
    agent: String,
    policy: AgentPolicy,
    config_grants: GrantSet,
    exec_rules: bool,
}

impl AgentRules {
    /// `agent`'s `policy` (validated at config load; an unvalidated one still decides,
    /// a bad glob matching nothing).
    pub fn new(agent: impl Into<String>, policy: AgentPolicy) -> Self {
        let config_grants = GrantSet::new(
            policy
                .grants
                .iter()
                .enumerate()
                .map(|(i, g)| Grant {
                    id: Some(g.id.clone().unwrap_or_else(|| format!("g{i}"))),
                    ..g.clone()
                })
                .collect(),
        );
        Self {
            agent: agent.into(),
            exec_rules: policy.has_exec_rules(),
            policy,
            config_grants,
        }
    }

    /// The policy as configured.
    pub fn policy(&self) -> &AgentPolicy {
        &self.policy
    }

    /// The config grants, with their ids filled in.
    pub fn config_grants(&self) -> &GrantSet {
        &self.config_grants
    }

    /// The rules' decision on `request` (whose tool the allow-lists already granted),
    /// with the matching rules and the grant that lifted an ask; `now_ms` is for
    /// time-boxed grants. Config grants are tried before `request.grants`.
    pub fn evaluate(&self, request: &PolicyRequest<'_>, now_ms: u64) -> Evaluation {
        let exec = request.kind == ToolKind::Core && request.tool == "exec";
        let mut matches = Vec::new();
        let mut worst: Option<Outcome> = None;
        for subject in subjects(request) {
            let mut outcome: Option<Outcome> = None;
            for (i, rule) in self.policy.rules.iter().enumerate() {
                if rule.tool != request.tool || !rule.matches(&subject, exec) {
                    continue;
                }
                matches.push(RuleMatch {
                    rule: self.policy.rule_id(i),
                    decision: rule.decision,
                    justification: rule.justification.clone(),
                    command: subject.shown.clone(),
                });
                if outcome.as_ref().is_none_or(|o| rule.decision > o.verdict) {
                    outcome = Some(Outcome {
                        verdict: rule.decision,
                        source: Source::Rule(i),
                        shown: subject.shown.clone(),
                        grant: None,
                    });
                }
            }
            let mut outcome = outcome.unwrap_or_else(|| Outcome {
                verdict: if exec {
                    self.policy.exec_default
                } else {
                    RuleDecision::Allow
                },
                source: Source::Default,
                shown: subject.shown.clone(),
                grant: None,
            });
            if exec
                && subject.opaque
                && self.exec_rules
                && self.policy.opaque_exec > outcome.verdict
            {
                outcome.verdict = self.policy.opaque_exec;
                outcome.source = Source::Opaque;
            }
            if outcome.verdict == RuleDecision::Ask {
                let live = request.grants.into_iter().flat_map(|g| g.grants.iter());
                let lifted = self
                    .config_grants
                    .grants
                    .iter()
                    .chain(live)
                    .find(|g| g.covers(request, &subject.argv, subject.opaque, now_ms));
                if let Some(g) = lifted {
                    outcome.verdict = RuleDecision::Allow;
                    outcome.grant = Some(g.clone());
                }
            }
            let stricter = match &worst {
                None => true,
                Some(w) => {
                    outcome.verdict > w.verdict
                        // Among allows, one that needed a grant is the one to show.
                        || (outcome.verdict == w.verdict
                            && w.grant.is_none()
                            && outcome.grant.is_some())
                }
            };
            if stricter {
                worst = Some(outcome);
            }
        }
        let Some(worst) = worst else {
            return Evaluation {
                decision: Decision::allow("no rule matches"),
                matches,
                grant: None,
            };
        };
        let decision = self.decision_of(request.tool, &worst);
        Evaluation {
            decision,
            matches,
            grant: worst.grant,
        }
    }

    fn decision_of(&self, tool: &str, o: &Outcome) -> Decision {
        let agent = &self.agent;
        let subject = format!("{tool} '{}'", o.shown);
        let (text, rule) = match &o.source {
            Source::Rule(i) => {
                let id = self.policy.rule_id(*i);
                let justification = self
                    .policy
                    .rules
                    .get(*i)
                    .and_then(|r| r.justification.clone());
                let mut text = format!("{subject} matches rule '{id}'");
                if let Some(j) = &justification {
                    text.push_str(": ");
                    text.push_str(j);
                }
                (text, Some((id, justification)))
            }
            Source::Default if tool == "exec" => (
                format!(
                    "{subject} matches no rule (agents.{agent}.policy.execDefault is {})",
                    self.policy.exec_default
                ),
                None,
            ),
            Source::Default => ("no rule matches".to_string(), None),
            Source::Opaque => (
                format!(
                    "{subject} cannot be checked: the shell would expand or read something first \
                     (agents.{agent}.policy.opaqueExec is {})",
                    self.policy.opaque_exec
                ),
                None,
            ),
        };
        let decision = match (o.verdict, &o.grant) {
            (RuleDecision::Deny, _) => Decision::deny(format!("Permission denied: {text}")),
            (RuleDecision::Ask, _) => Decision::ask(text),
            (RuleDecision::Allow, Some(g)) => Decision::allow(format!(
                "{text}; lifted by grant '{}' (granted by {})",
                g.id.as_deref().unwrap_or("-"),
                g.granted_by
            )),
            (RuleDecision::Allow, None) => Decision::allow(text),
        };
        match rule {
            Some((id, justification)) => decision.with_rule(id, justification),
            None => decision,
        }
    }
}

/// One step of the place in `agents.<a>.policy` a [`PolicyError`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyStep {
    /// An object key.
    Key(&'static str),
    /// An array index.
    Index(usize),
}

/// A policy that does not pass [`validate`]: where (below `agents.<a>.policy`) and why,
/// with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct PolicyError {
    /// The place, e.g. `rules`, `[2]`, `match`, `[0]`.
    pub at: Vec<KeyStep>,
    /// What is wrong and how to fix it.
    pub message: String,
}

fn err(at: Vec<KeyStep>, message: impl Into<String>) -> PolicyError {
    PolicyError {
        at,
        message: message.into(),
    }
}

/// Checks one `path` glob: relative to `/workspace` (or under it), `*` and `**` only,
/// no empty, `.` or `..` segments.
pub fn check_glob(glob: &str) -> Result<(), String> {
    let rel = glob_relative(glob);
    if rel.is_empty() || rel == "/workspace" {
        return Err("the glob is empty; write e.g. \".github/workflows/**\"".to_string());
    }
    if rel.starts_with('/') {
        return Err(format!(
            "'{glob}' is outside /workspace; write a glob relative to /workspace, e.g. \
             \"src/**\""
        ));
    }
    if let Some(c) = rel
        .chars()
        .find(|c| c.is_control() || "?[]{}\\".contains(*c))
    {
        return Err(format!(
            "'{}' contains {c:?}; only `*` (within a segment) and `**` (any segments) are \
             supported",
            glob.escape_debug()
        ));
    }
    for seg in rel.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(format!(
                "'{glob}' has an empty, `.` or `..` segment; write the path plainly"
            ));
        }
        if seg.contains("**") && seg != "**" {
            return Err(format!(
                "'{glob}': `**` must be a whole segment (`a/**/b`), not part of one"
            ));
        }
    }
    Ok(())
}

/// The subjects an example of a rule for `tool` stands for.
fn example_subjects(tool: &str, example: &str) -> Vec<Subject> {
    let args: Vec<String>;
    let (kind, args) = if is_core_tool(tool) {
        args = vec![example.to_string()];
        (ToolKind::Core, &args[..])
    } else {
        let mut words: Vec<String> = shell::split(example)
            .into_iter()
            .next()
            .map(|c| c.argv)
            .unwrap_or_default();
        if words.first().is_some_and(|w| w == tool) {
            words.remove(0);
        }
        args = words;
        (ToolKind::Plugin, &args[..])
    };
    subjects(&PolicyRequest::new("", tool, kind, args))
}

/// Checks `policy` of an agent whose allow-lists are `tools` and `deny_tools`: every
/// rule has a tool and a pattern or path; an `allow` rule only for a granted tool;
/// alternatives not empty; globs valid; ids unique; every `match` example matches its
/// rule and no `notMatch` example does; grants have a tool, a pattern and `grantedBy`.
pub fn validate(
    policy: &AgentPolicy,
    tools: &[String],
    deny_tools: &[String],
) -> Result<(), PolicyError> {
    use KeyStep::{Index, Key};
    let granted = |tool: &str| {
        !deny_tools.iter().any(|d| d == tool)
            && (is_core_tool(tool) || tools.iter().any(|t| t == tool))
    };
    let mut ids = HashSet::new();
    for (i, rule) in policy.rules.iter().enumerate() {
        let at = |k: &'static str| vec![Key("rules"), Index(i), Key(k)];
        let id = policy.rule_id(i);
        if rule.id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            return Err(err(
                at("id"),
                "the id is empty; name the rule or leave id out",
            ));
        }
        if !ids.insert(id.clone()) {
            return Err(err(
                at("id"),
                format!("rule id '{id}' is used twice; give each rule its own id"),
            ));
        }
        if rule.tool.trim().is_empty() {
            return Err(err(at("tool"), format!("rule '{id}' names no tool")));
        }
        if rule.pattern.is_empty() && rule.path.is_none() {
            return Err(err(
                at("pattern"),
                format!(
                    "rule '{id}' has neither a pattern nor a path, so it would cover every call \
                     of '{}'; give it a pattern or a path (to take a tool away, use denyTools)",
                    rule.tool
                ),
            ));
        }
        for (j, elem) in rule.pattern.iter().enumerate() {
            if matches!(elem, PatternElem::AnyOf(alts) if alts.is_empty()) {
                return Err(err(
                    vec![Key("rules"), Index(i), Key("pattern"), Index(j)],
                    format!("rule '{id}': an empty list of alternatives matches nothing"),
                ));
            }
        }
        if rule.decision == RuleDecision::Allow && !granted(&rule.tool) {
            return Err(err(
                at("decision"),
                format!(
                    "rule '{id}' allows '{}', which this agent is not granted: rules never grant \
                     a tool; add it to tools (and out of denyTools), or make the rule ask or deny",
                    rule.tool
                ),
            ));
        }
        if let Some(glob) = &rule.path {
            check_glob(glob).map_err(|e| err(at("path"), format!("rule '{id}': {e}")))?;
        }
        let exec = rule.tool == "exec";
        let examples = [
            ("match", &rule.match_examples, true),
            ("notMatch", &rule.not_match, false),
        ];
        for (key, list, should) in examples {
            for (j, example) in list.iter().enumerate() {
                let subjects = example_subjects(&rule.tool, example);
                let hit = subjects.iter().any(|s| rule.matches(s, exec));
                if hit != should {
                    let read = subjects
                        .iter()
                        .map(|s| s.shown.clone())
                        .collect::<Vec<_>>()
                        .join(" ; ");
                    let got = if hit {
                        "matches it"
                    } else {
                        "does not match it"
                    };
                    return Err(err(
                        vec![Key("rules"), Index(i), Key(key), Index(j)],
                        format!(
                            "rule '{id}': the {key} example {example:?} {got} (read as: {}); \
                             fix the rule or the example",
                            if read.is_empty() { "nothing" } else { &read }
                        ),
                    ));
                }
            }
        }
    }
    let mut grant_ids = HashSet::new();
    for (i, grant) in policy.grants.iter().enumerate() {
        let at = |k: &'static str| vec![Key("grants"), Index(i), Key(k)];
        let id = grant.id.clone().unwrap_or_else(|| format!("g{i}"));
        if !grant_ids.insert(id.clone()) {
            return Err(err(
                at("id"),
                format!("grant id '{id}' is used twice; give each grant its own id"),
            ));
        }
        if grant.tool.trim().is_empty() {
            return Err(err(at("tool"), format!("grant '{id}' names no tool")));
        }
        if grant.pattern.is_empty() {
            return Err(err(
                at("pattern"),
                format!(
                    "grant '{id}' has no pattern, so it would lift every ask of '{}'; give it \
                     the call's words (exact: true for that call only)",
                    grant.tool
                ),
            ));
        }
        if grant.granted_by.trim().is_empty() {
            return Err(err(
                at("grantedBy"),
                format!("grant '{id}' names nobody in grantedBy; say who granted it"),
            ));
        }
        if let Some(cwd) = &grant.cwd {
            if workspace_relative(cwd).is_none() {
                return Err(err(
                    at("cwd"),
                    format!("grant '{id}': cwd '{cwd}' is outside /workspace"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
