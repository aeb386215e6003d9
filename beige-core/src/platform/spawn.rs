//! The built-in `spawn` tool: an agent hands a task to a sub-agent — another agent it
//! lists as a target, or a fresh session of itself (`SELF`) — and gets its final answer
//! (platform.md §2).
//!
//! Owns the command line (`spawn --target NAME|SELF [--session KEY] <message…>`, the
//! message on stdin when `--message-file` was given, `spawn --info`), the output format
//! the original's scripts parse (`SESSION: <key>`, `---`, the answer), the
//! `pluginConfigs.spawn` block and its validation at load, and [`RightSet`]: the rights a
//! child gets, the intersection of its parent's and its target's, which only ever
//! shrink. Running the child — finding the caller's session through the exec the kernel
//! attributed it to, storing the lineage, checking depth, budgets and rights on every
//! call, auditing — is the gateway's, behind [`Host::spawn`]. Identity never comes from
//! the arguments, the `sessionContext` or an environment variable of the sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::HostSlot;
use crate::config::{Config, ConfigError};
use crate::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};

/// The plugin and tool name.
pub(crate) const NAME: &str = "spawn";

/// The target that names the calling agent itself: a fresh child session of it.
pub(crate) const SELF_TARGET: &str = "SELF";

/// The gateway-wide cap on spawn depth (`spawn.maxDepth` of platform.md §2.2): no chain
/// of sub-agents goes deeper than this, whatever the targets say. A constant for now;
/// targets' `maxDepth` can only lower it.
pub(crate) const GATEWAY_MAX_DEPTH: u32 = 3;

/// Children one agent may have running at once unless `maxConcurrent` says otherwise.
pub(crate) const DEFAULT_MAX_CONCURRENT: u32 = 3;

/// How long the parent waits for a child unless `timeoutSeconds` says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest `timeoutSeconds` may be.
pub(crate) const MAX_TIMEOUT_SECONDS: u64 = 3600;

/// Exit code of a spawn whose child did not finish in time (and was cancelled).
pub(crate) const EXIT_TIMEOUT: i32 = 124;

const USAGE: &str = "Usage:
  spawn --target NAME|SELF [--session KEY] <message…>
      hand <message> to a sub-agent and print its final answer; --message-file PATH
      sends what PATH holds in the sandbox instead; --session KEY continues an
      earlier child of this session
  spawn --info
      the targets this agent may spawn, the depth left and the budget left";

/// `pluginConfigs.spawn.targets.<NAME>.budget`: what one child (and its own children)
/// may spend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SpawnBudget {
    /// US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Input + output + cache-write tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

impl SpawnBudget {
    /// The stricter of two budgets, key by key.
    pub(crate) fn min(self, other: SpawnBudget) -> SpawnBudget {
        fn least<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        SpawnBudget {
            cost_usd: least(self.cost_usd, other.cost_usd),
            tokens: least(self.tokens, other.tokens),
        }
    }

    /// Whether any limit is set.
    pub(crate) fn is_set(&self) -> bool {
        self.cost_usd.is_some() || self.tokens.is_some()
    }
}

/// `pluginConfigs.spawn.targets.<NAME>`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TargetConfig {
    /// How deep a chain through this target may go (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// What the child may spend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<SpawnBudget>,
}

/// `agents.<a>.pluginConfigs.spawn` (merged over `plugins.spawn.config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SpawnConfig {
    /// The agents this one may spawn, by name, or `SELF`; an agent not listed cannot
    /// be reached.
    #[serde(default)]
    pub targets: BTreeMap<String, TargetConfig>,
    /// Children of this agent running at once.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: u32,
    /// How long the parent waits before the child is cancelled.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
}

fn default_max_concurrent() -> u32 {
    DEFAULT_MAX_CONCURRENT
}

fn default_timeout_seconds() -> u64 {
    DEFAULT_TIMEOUT.as_secs()
}

impl Default for SpawnConfig {
    fn default() -> Self {
        Self {
            targets: BTreeMap::new(),
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            timeout_seconds: DEFAULT_TIMEOUT.as_secs(),
        }
    }
}

impl SpawnConfig {
    /// The config of one call (the plugin's config merged with the agent's
    /// `pluginConfigs.spawn`). `Err` is `(path below the block, message)`.
    pub(crate) fn from_value(value: &Value) -> Result<Self, (String, String)> {
        let value = match value {
            Value::Null => return Ok(Self::default()),
            v => v,
        };
        let parsed: SpawnConfig = serde_json::from_value(value.clone()).map_err(|e| {
            (
                String::new(),
                format!(
                    "{e}; expected {{ targets: {{ NAME|SELF: {{ maxDepth, budget: {{ costUsd, tokens }} }} }}, maxConcurrent, timeoutSeconds }}"
                ),
            )
        })?;
        for (name, t) in &parsed.targets {
            if let Some(d) = t.max_depth {
                if d == 0 || d > GATEWAY_MAX_DEPTH {
                    return Err((
                        format!("targets.{name}.maxDepth"),
                        format!(
                            "must be from 1 to {GATEWAY_MAX_DEPTH} (the gateway's spawn depth cap), not {d}"
                        ),
                    ));
                }
            }
            if let Some(c) = t.budget.and_then(|b| b.cost_usd) {
                if !(c.is_finite() && c >= 0.0) {
                    return Err((
                        format!("targets.{name}.budget.costUsd"),
                        format!("must be a number of US dollars ≥ 0, not {c}"),
                    ));
                }
            }
        }
        if parsed.max_concurrent == 0 {
            return Err((
                "maxConcurrent".into(),
                "must be at least 1 (remove `spawn` from the agent's tools to turn it off)".into(),
            ));
        }
        if parsed.timeout_seconds == 0 || parsed.timeout_seconds > MAX_TIMEOUT_SECONDS {
            return Err((
                "timeoutSeconds".into(),
                format!(
                    "must be from 1 to {MAX_TIMEOUT_SECONDS}, not {}",
                    parsed.timeout_seconds
                ),
            ));
        }
        Ok(parsed)
    }

    /// How long the parent waits for a child.
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds)
    }
}

/// `agents.<agent>.pluginConfigs.spawn` merged over `plugins.spawn.config`, as a call
/// of `agent` gets it.
fn merged_config(config: &Config, agent: &crate::config::AgentConfig) -> Value {
    let mut merged = match config.plugins.get(NAME).and_then(|e| e.config.clone()) {
        None | Some(Value::Null) => serde_json::json!({}),
        Some(v) => v,
    };
    if let Some(over) = agent.plugin_configs.get(NAME) {
        crate::plugin::merge_config(&mut merged, over);
    }
    merged
}

/// The agents that another agent lists as a spawn target (not `SELF`), each with the
/// first agent that lists it. A sub-agent on one of them runs in its sandbox with fewer
/// rights than the agent's own, so a process it leaves behind must not get the agent's
/// rights: unbound calls are refused for these agents (their `policy.unboundCalls` is
/// `deny`, and `session` is refused at load).
pub(crate) fn spawned_agents(config: &Config) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (agent, a) in &config.agents {
        let Ok(parsed) = SpawnConfig::from_value(&merged_config(config, a)) else {
            continue;
        };
        for target in parsed.targets.keys() {
            if target != SELF_TARGET && target != agent {
                out.entry(target.clone()).or_insert_with(|| agent.clone());
            }
        }
    }
    out
}

/// Check every agent's `pluginConfigs.spawn` (merged over `plugins.spawn.config`) at
/// load: the block parses, limits are in range, every target is `SELF` or an agent
/// of the config, and no target lets unbound callers use its rights
/// (`policy.unboundCalls: "session"`).
pub(crate) fn validate_config(config: &Config, file: &Path) -> Result<(), ConfigError> {
    for (agent, a) in &config.agents {
        let merged = merged_config(config, a);
        let at = |sub: &str| {
            let mut p = format!("agents.{agent}.pluginConfigs.spawn");
            if !sub.is_empty() {
                p.push('.');
                p.push_str(sub);
            }
            p
        };
        let parsed =
            SpawnConfig::from_value(&merged).map_err(|(path, message)| ConfigError::Invalid {
                file: file.to_path_buf(),
                path: at(&path),
                message,
            })?;
        for name in parsed.targets.keys() {
            if name != SELF_TARGET && !config.agents.contains_key(name) {
                let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
                return Err(ConfigError::Invalid {
                    file: file.to_path_buf(),
                    path: at(&format!("targets.{name}")),
                    message: format!(
                        "'{name}' is not an agent of this config; a target is SELF or one of: {}",
                        known.join(", ")
                    ),
                });
            }
        }
    }
    for (target, by) in spawned_agents(config) {
        let session = config
            .agents
            .get(&target)
            .and_then(|a| a.policy.as_ref())
            .is_some_and(|p| p.unbound_calls == crate::policy::UnboundCalls::Session);
        if session {
            return Err(ConfigError::Invalid {
                file: file.to_path_buf(),
                path: format!("agents.{target}.policy.unboundCalls"),
                message: format!(
                    "'session' would let a process a sub-agent leaves behind in {target}'s sandbox (a daemon outside any exec) call tools with {target}'s own rights, more than the parent's; an agent that other agents spawn (agents.{by}.pluginConfigs.spawn.targets.{target}) needs 'deny'"
                ),
            });
        }
    }
    Ok(())
}

/// One of the sessions a child descends from, nearest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Ancestor {
    /// The session id.
    pub session_id: String,
    /// Its agent.
    pub agent: String,
}

/// What a sub-agent may do: computed once at spawn as the intersection of its parent's
/// effective rights and its target's, stored with the child session, and checked on
/// every call from the child's model and scripts (together with the child agent's own
/// policy). Rights only shrink down a chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RightSet {
    /// The plugin tools the child may call: those both the parent and the target have.
    pub tools: BTreeSet<String>,
    /// Agents whose rule sets apply to the child's calls besides its own: its
    /// ancestors'. Strictest wins.
    pub rule_agents: Vec<String>,
    /// Agents whose egress rules must all allow a destination the child connects to:
    /// its ancestors'.
    pub egress_agents: Vec<String>,
    /// The strictest `maxDepth` along the chain (and the gateway's cap).
    pub max_depth: u32,
    /// The strictest spawn budget along the chain, over the child's own spending and its
    /// children's.
    pub budget: SpawnBudget,
    /// The sessions above the child, nearest first: their budgets count the child's
    /// spending too.
    pub ancestors: Vec<Ancestor>,
}

impl RightSet {
    /// The rights of a session nobody spawned: the agent's own tools, no one else's
    /// rules, the gateway's depth cap, no spawn budget.
    pub(crate) fn root(tools: impl IntoIterator<Item = String>) -> Self {
        Self {
            tools: tools.into_iter().collect(),
            rule_agents: Vec::new(),
            egress_agents: Vec::new(),
            max_depth: GATEWAY_MAX_DEPTH,
            budget: SpawnBudget::default(),
            ancestors: Vec::new(),
        }
    }

    /// The rights of a child of `parent` (whose session is `parent_session`, of agent
    /// `parent_agent`) on `child_agent`, whose own tools are `target_tools`, through a
    /// target configured as `target`. Never more than the parent has.
    pub(crate) fn child(
        &self,
        parent_agent: &str,
        parent_session: &str,
        child_agent: &str,
        target_tools: &BTreeSet<String>,
        target: &TargetConfig,
    ) -> Self {
        let mut rule_agents = self.rule_agents.clone();
        let mut egress_agents = self.egress_agents.clone();
        if parent_agent != child_agent {
            for list in [&mut rule_agents, &mut egress_agents] {
                if !list.iter().any(|a| a == parent_agent) {
                    list.push(parent_agent.to_string());
                }
            }
        }
        let mut ancestors = vec![Ancestor {
            session_id: parent_session.to_string(),
            agent: parent_agent.to_string(),
        }];
        ancestors.extend(self.ancestors.iter().cloned());
        Self {
            tools: self.tools.intersection(target_tools).cloned().collect(),
            rule_agents,
            egress_agents,
            max_depth: self
                .max_depth
                .min(target.max_depth.unwrap_or(GATEWAY_MAX_DEPTH))
                .min(GATEWAY_MAX_DEPTH),
            budget: self.budget.min(target.budget.unwrap_or_default()),
            ancestors,
        }
    }

    /// SHA-256 (hex) of the rights as compact JSON: one value to compare in the audit.
    pub(crate) fn digest(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(json.as_bytes()))
    }

    /// The rights as stored with the child session.
    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The rights stored with a child session; `None` when they do not parse (a store
    /// written by something else), which the gateway treats as no rights at all.
    pub(crate) fn from_json(value: &Value) -> Option<Self> {
        serde_json::from_value(value.clone()).ok()
    }

    /// The rights of a child whose stored rights cannot be read: nothing beyond the
    /// core tools, no further spawns.
    pub(crate) fn nothing() -> Self {
        Self {
            tools: BTreeSet::new(),
            rule_agents: Vec::new(),
            egress_agents: Vec::new(),
            max_depth: 0,
            budget: SpawnBudget {
                cost_usd: Some(0.0),
                tokens: Some(0),
            },
            ancestors: Vec::new(),
        }
    }
}

/// What the tool asks the gateway to do for one `spawn` call. Who asks is the call's:
/// the socket's agent and the exec the kernel attributed the caller to.
#[derive(Debug, Clone)]
pub(crate) struct SpawnRequest {
    /// The calling agent (the socket's).
    pub agent: String,
    /// The caller's exec, as the kernel attributed it.
    pub exec: Option<String>,
    /// `--target`: an agent name or `SELF`.
    pub target: String,
    /// `--session`: an earlier child of the caller's session to continue.
    pub session: Option<String>,
    /// The message for the child.
    pub message: String,
    /// The caller's `pluginConfigs.spawn`.
    pub config: SpawnConfig,
}

/// How a spawn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpawnOutcome {
    /// The child answered.
    Answered(String),
    /// The spawn or the child failed; the reason, and the exit code.
    Failed {
        /// `budget exhausted: …`, `depth limit 2 reached`, `child denied: …`.
        reason: String,
        /// Non-zero.
        exit_code: i32,
    },
}

/// What came of one spawn: the child's session key (when one was made) and the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpawnReport {
    /// The child's session key; `None` when the spawn was refused before it had one.
    pub session: Option<String>,
    /// The answer or the failure.
    pub outcome: SpawnOutcome,
}

impl SpawnReport {
    /// A refusal before any child session exists.
    pub(crate) fn refused(reason: impl Into<String>, exit_code: i32) -> Self {
        Self {
            session: None,
            outcome: SpawnOutcome::Failed {
                reason: reason.into(),
                exit_code,
            },
        }
    }

    /// The tool's output: `SESSION: <key>`, `---`, then the answer, or on failure
    /// `spawn failed: <reason>` (and a non-zero exit), so a partial answer never reads
    /// like a whole one.
    pub(crate) fn into_result(self) -> ToolResult {
        let key = self.session.as_deref().unwrap_or("none");
        match self.outcome {
            SpawnOutcome::Answered(answer) => {
                let mut out = format!("SESSION: {key}\n---\n{answer}");
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                ToolResult::ok(out)
            }
            SpawnOutcome::Failed { reason, exit_code } => {
                let mut out = format!("SESSION: {key}\n---\nspawn failed: {reason}");
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                ToolResult::fail(out, exit_code)
            }
        }
    }
}

/// One parsed `spawn` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Help,
    Info,
    Spawn {
        target: String,
        session: Option<String>,
        /// The message from the arguments; `None` when it comes on stdin.
        message: Option<String>,
    },
}

impl Command {
    /// Parse the arguments after `spawn`. `Err` is a usage message.
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut target = None;
        let mut session = None;
        let mut words: Vec<String> = Vec::new();
        let mut info = false;
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            if arg == "--" {
                words.extend(rest.by_ref().cloned());
                break;
            }
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = |flag: &str| -> Result<String, String> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => rest
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("spawn: {flag} needs a value. {USAGE}\n")),
                }
            };
            match name {
                "--help" | "-h" | "help" if args.len() == 1 => return Ok(Command::Help),
                "--info" => info = true,
                "--target" => target = Some(value("--target")?),
                "--session" => session = Some(value("--session")?),
                flag if flag.starts_with("--") && words.is_empty() => {
                    return Err(format!("spawn: unknown option '{flag}'. {USAGE}\n"))
                }
                _ => words.push(arg.clone()),
            }
        }
        if info {
            if target.is_some() || session.is_some() || !words.is_empty() {
                return Err(format!("spawn: --info takes nothing else. {USAGE}\n"));
            }
            return Ok(Command::Info);
        }
        let Some(target) = target else {
            if words.is_empty() && session.is_none() {
                return Ok(Command::Help);
            }
            return Err(format!(
                "spawn: give --target NAME (or SELF); `spawn --info` lists the targets. {USAGE}\n"
            ));
        };
        if target.is_empty() {
            return Err(format!("spawn: --target needs a name. {USAGE}\n"));
        }
        Ok(Command::Spawn {
            target,
            session,
            message: (!words.is_empty()).then(|| words.join(" ")),
        })
    }
}

/// The built-in `spawn` plugin. Enable it with `plugins: { spawn: {} }`, give agents
/// the tool with `tools: ["spawn"]`, and list their targets in
/// `pluginConfigs.spawn.targets`.
#[derive(Debug)]
pub(crate) struct SpawnPlugin {
    host: HostSlot,
}

impl SpawnPlugin {
    /// The plugin, reaching the gateway through `host`.
    pub(crate) fn new(host: HostSlot) -> Self {
        Self { host }
    }
}

#[async_trait]
impl Plugin for SpawnPlugin {
    fn name(&self) -> &str {
        NAME
    }

    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(SpawnTool {
            host: self.host.clone(),
        }))
    }
}

/// The `spawn` tool.
#[derive(Debug)]
struct SpawnTool {
    host: HostSlot,
}

#[async_trait]
impl Tool for SpawnTool {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "Hand a task to a sub-agent (another agent, or SELF) and get its final answer; \
         the sub-agent never has more rights than this agent."
    }

    fn commands(&self) -> Vec<String> {
        [
            "spawn --target NAME|SELF [--session KEY] <message…>",
            "spawn --target NAME|SELF --message-file PATH",
            "spawn --info",
        ]
        .map(String::from)
        .to_vec()
    }

    /// The tool waits for the child itself, up to `timeoutSeconds`, and cancels it
    /// then; the gateway's limit only backs that up.
    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(MAX_TIMEOUT_SECONDS + 60))
    }

    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        let command = match Command::parse(&call.args) {
            Ok(c) => c,
            Err(usage) => return Ok(ToolResult::fail(usage, 2)),
        };
        let config = match SpawnConfig::from_value(&call.config) {
            Ok(c) => c,
            Err((path, message)) => {
                return Err(ToolError::Failed(format!(
                    "agents.{}.pluginConfigs.spawn{}{path}: {message}",
                    call.session.agent,
                    if path.is_empty() { "" } else { "." }
                )))
            }
        };
        let host = self.host.get()?;
        match command {
            Command::Help => Ok(ToolResult::ok(format!(
                "spawn — {}\n\n{USAGE}\n",
                self.description()
            ))),
            Command::Info => {
                host.spawn_info(&call.session.agent, call.exec.as_deref(), &config)
                    .await
            }
            Command::Spawn {
                target,
                session,
                message,
            } => {
                let message = match (message, call.stdin) {
                    (Some(m), _) => m,
                    (None, Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                    (None, None) => {
                        return Ok(ToolResult::fail(
                            format!("spawn: give the message after the options, or --message-file PATH. {USAGE}\n"),
                            2,
                        ))
                    }
                };
                if message.trim().is_empty() {
                    return Ok(ToolResult::fail(
                        "spawn: the message is empty; nothing was sent\n",
                        2,
                    ));
                }
                let report = host
                    .spawn(SpawnRequest {
                        agent: call.session.agent.clone(),
                        exec: call.exec.clone(),
                        target,
                        session,
                        message,
                        config,
                    })
                    .await?;
                Ok(report.into_result())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_the_command_line() {
        assert_eq!(Command::parse(&[]).unwrap(), Command::Help);
        assert_eq!(Command::parse(&args(&["--info"])).unwrap(), Command::Info);
        assert_eq!(
            Command::parse(&args(&["--target", "researcher", "look", "it", "up"])).unwrap(),
            Command::Spawn {
                target: "researcher".into(),
                session: None,
                message: Some("look it up".into()),
            }
        );
        assert_eq!(
            Command::parse(&args(&[
                "--target=SELF",
                "--session",
                "spawn:k",
                "--",
                "--x"
            ]))
            .unwrap(),
            Command::Spawn {
                target: "SELF".into(),
                session: Some("spawn:k".into()),
                message: Some("--x".into()),
            }
        );
        // The message may come on stdin (--message-file, read by the shim).
        assert_eq!(
            Command::parse(&args(&["--target", "r"])).unwrap(),
            Command::Spawn {
                target: "r".into(),
                session: None,
                message: None,
            }
        );
        for bad in [
            &["--target"][..],
            &["hello"],
            &["--info", "--target", "r"],
            &["--agent", "b", "--target", "r", "x"],
            &["--target", "", "x"],
        ] {
            let err = Command::parse(&args(bad)).unwrap_err();
            assert!(err.starts_with("spawn: "), "{bad:?}: {err}");
        }
    }

    #[test]
    fn rights_only_shrink() {
        let root = RightSet::root(["gh".to_string(), "kv".to_string(), "spawn".to_string()]);
        let target = TargetConfig {
            max_depth: Some(2),
            budget: Some(SpawnBudget {
                cost_usd: Some(1.0),
                tokens: None,
            }),
        };
        // The target has `web` and `kv`; the parent `gh` and `kv`: only `kv` is left.
        let child = root.child(
            "assistant",
            "s_p",
            "researcher",
            &set(&["kv", "web", "spawn"]),
            &target,
        );
        assert_eq!(child.tools, set(&["kv", "spawn"]));
        assert_eq!(child.rule_agents, ["assistant"]);
        assert_eq!(child.egress_agents, ["assistant"]);
        assert_eq!(child.max_depth, 2);
        assert_eq!(child.budget.cost_usd, Some(1.0));
        assert_eq!(child.ancestors[0].session_id, "s_p");
        // A grandchild through a looser target gets no more than its parent.
        let loose = TargetConfig {
            max_depth: Some(3),
            budget: Some(SpawnBudget {
                cost_usd: Some(5.0),
                tokens: Some(100),
            }),
        };
        let grand = child.child(
            "researcher",
            "s_c",
            "researcher",
            &set(&["gh", "kv", "web", "spawn"]),
            &loose,
        );
        assert_eq!(grand.tools, set(&["kv", "spawn"]), "gh stays out");
        assert_eq!(grand.max_depth, 2, "the strictest maxDepth along the chain");
        assert_eq!(grand.budget.cost_usd, Some(1.0));
        assert_eq!(grand.budget.tokens, Some(100));
        // SELF adds no rule set of its own; the ancestors' stay.
        assert_eq!(grand.rule_agents, ["assistant"]);
        assert_eq!(
            grand
                .ancestors
                .iter()
                .map(|a| a.session_id.as_str())
                .collect::<Vec<_>>(),
            ["s_c", "s_p"]
        );
        // The gateway cap holds whatever the target says.
        let deep = RightSet::root(["kv".to_string()]).child(
            "a",
            "s",
            "a",
            &set(&["kv"]),
            &TargetConfig::default(),
        );
        assert_eq!(deep.max_depth, GATEWAY_MAX_DEPTH);
        // Stored and read back unchanged; the digest follows the content.
        assert_eq!(RightSet::from_json(&grand.to_json()), Some(grand.clone()));
        assert_ne!(grand.digest(), child.digest());
        assert_eq!(grand.digest(), grand.clone().digest());
        assert!(RightSet::from_json(&serde_json::json!({"tools": 3})).is_none());
    }

    #[test]
    fn config_is_checked_with_paths_that_name_the_problem() {
        let ok = SpawnConfig::from_value(&serde_json::json!({
            "targets": {"researcher": {"maxDepth": 1, "budget": {"costUsd": 1}}, "SELF": {"maxDepth": 2}},
            "maxConcurrent": 3, "timeoutSeconds": 600,
        }))
        .unwrap();
        assert_eq!(ok.targets["SELF"].max_depth, Some(2));
        assert_eq!(ok.timeout(), Duration::from_secs(600));
        assert_eq!(
            SpawnConfig::from_value(&Value::Null).unwrap(),
            SpawnConfig::default()
        );
        for (bad, path, says) in [
            (
                serde_json::json!({"targets": {"r": {"maxDepth": 0}}}),
                "targets.r.maxDepth",
                "from 1 to 3",
            ),
            (
                serde_json::json!({"targets": {"r": {"maxDepth": 9}}}),
                "targets.r.maxDepth",
                "depth cap",
            ),
            (
                serde_json::json!({"maxConcurrent": 0}),
                "maxConcurrent",
                "at least 1",
            ),
            (
                serde_json::json!({"timeoutSeconds": 99999}),
                "timeoutSeconds",
                "from 1 to 3600",
            ),
            (
                serde_json::json!({"targets": {"r": {"budget": {"costUsd": -1}}}}),
                "targets.r.budget.costUsd",
                "≥ 0",
            ),
            (serde_json::json!({"target": {}}), "", "unknown field"),
        ] {
            let (p, m) = SpawnConfig::from_value(&bad).unwrap_err();
            assert_eq!(p, path, "{bad}");
            assert!(m.contains(says), "{bad}: {m}");
        }
    }

    #[test]
    fn validation_at_load_names_an_unknown_target() {
        let config: Config = serde_json::from_value(serde_json::json!({
            "llm": {"providers": {}},
            "agents": {
                "a": {"model": {"provider": "p", "model": "m"}, "tools": [],
                      "pluginConfigs": {"spawn": {"targets": {"SELF": {}, "b": {}}}}},
                "b": {"model": {"provider": "p", "model": "m"}, "tools": []},
            }
        }))
        .unwrap();
        validate_config(&config, Path::new("/c.json5")).unwrap();
        let mut wrong = config.clone();
        if let Some(a) = wrong.agents.get_mut("a") {
            a.plugin_configs
                .insert(NAME.into(), serde_json::json!({"targets": {"ghost": {}}}));
        }
        let e = validate_config(&wrong, Path::new("/c.json5"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("agents.a.pluginConfigs.spawn.targets.ghost")
                && e.contains("SELF or one of: a, b"),
            "{e}"
        );
    }

    #[test]
    fn spawned_agents_are_the_targets_of_other_agents() {
        let config: Config = serde_json::from_value(serde_json::json!({
            "llm": {"providers": {}},
            "plugins": {"spawn": {"config": {"targets": {"helper": {}}}}},
            "agents": {
                "a": {"model": {"provider": "p", "model": "m"}, "tools": [],
                      "pluginConfigs": {"spawn": {"targets": {"SELF": {}, "b": {}, "a": {}}}}},
                "b": {"model": {"provider": "p", "model": "m"}, "tools": [],
                      "pluginConfigs": {"spawn": {"targets": {"SELF": {}}}}},
                "helper": {"model": {"provider": "p", "model": "m"}, "tools": []},
            }
        }))
        .unwrap();
        let spawned = spawned_agents(&config);
        // b by a; helper by a and b through the shared config (not by itself); a only by
        // itself, which is not another agent.
        assert_eq!(
            spawned.into_iter().collect::<Vec<_>>(),
            [
                ("b".to_string(), "a".to_string()),
                ("helper".to_string(), "a".to_string())
            ]
        );
    }

    #[test]
    fn output_keeps_the_original_format() {
        let ok = SpawnReport {
            session: Some("spawn:telegram:42:r:1".into()),
            outcome: SpawnOutcome::Answered("the answer".into()),
        }
        .into_result();
        assert_eq!(
            ok.output,
            "SESSION: spawn:telegram:42:r:1\n---\nthe answer\n"
        );
        assert_eq!(ok.exit_code, 0);
        let failed = SpawnReport::refused("depth limit 2 reached", 1).into_result();
        assert_eq!(
            failed.output,
            "SESSION: none\n---\nspawn failed: depth limit 2 reached\n"
        );
        assert_eq!(failed.exit_code, 1);
    }
}
