//! Policy: whether a tool call may run, with the reason.
//!
//! Owns the [`Policy`] trait and [`ConfigPolicy`], the default built from config: plugin
//! tools are denied unless listed in the agent's `tools`; core tools are allowed unless
//! listed in the agent's `denyTools`. A decision is a plain value carrying its reason, so
//! it can be logged, audited, returned to the caller and tested without anything else.
//! The same policy gates core tools and plugin tools on every path.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::config::Config;
use crate::tools::CORE_TOOLS;

/// Core tool or plugin tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// `read`, `write`, `patch`, `exec` (audit `type: "core_tool"`).
    Core,
    /// A plugin tool (audit `type: "tool"`).
    Plugin,
}

/// The question a policy answers.
#[derive(Debug, Clone, Copy)]
pub struct PolicyRequest<'a> {
    pub agent: &'a str,
    pub tool: &'a str,
    pub kind: ToolKind,
    pub args: &'a [String],
}

/// The answer, with its reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

impl Decision {
    pub fn allow(reason: impl Into<String>) -> Self {
        Self {
            allowed: true,
            reason: reason.into(),
        }
    }

    pub fn deny(reason: impl Into<String>) -> Self {
        Self {
            allowed: false,
            reason: reason.into(),
        }
    }
}

/// Decides whether a tool call may run.
pub trait Policy: Send + Sync + std::fmt::Debug {
    fn check(&self, request: &PolicyRequest<'_>) -> Decision;
}

/// The message the original returned for a tool the agent may not use.
pub fn not_allowed_message(tool: &str, agent: &str) -> String {
    format!("Permission denied: tool '{tool}' is not allowed for agent '{agent}'")
}

/// Allow-lists from config: `agents.<a>.tools` for plugin tools (deny by default),
/// `agents.<a>.denyTools` to take tools (core ones included) away.
#[derive(Debug, Clone, Default)]
pub struct ConfigPolicy {
    allowed: HashMap<String, HashSet<String>>,
    denied: HashMap<String, HashSet<String>>,
}

impl ConfigPolicy {
    pub fn from_config(config: &Config) -> Self {
        let mut p = ConfigPolicy::default();
        for (name, agent) in &config.agents {
            p.allowed
                .insert(name.clone(), agent.tools.iter().cloned().collect());
            p.denied
                .insert(name.clone(), agent.deny_tools.iter().cloned().collect());
        }
        p
    }
}

impl Policy for ConfigPolicy {
    fn check(&self, r: &PolicyRequest<'_>) -> Decision {
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
            ToolKind::Plugin => Decision::deny(not_allowed_message(r.tool, r.agent)),
        }
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

    fn check(p: &ConfigPolicy, agent: &str, tool: &str, kind: ToolKind) -> Decision {
        p.check(&PolicyRequest {
            agent,
            tool,
            kind,
            args: &[],
        })
    }

    #[test]
    fn plugin_tools_denied_by_default() {
        let p = policy();
        assert!(check(&p, "a", "kv", ToolKind::Plugin).allowed);
        let d = check(&p, "a", "git", ToolKind::Plugin);
        assert!(!d.allowed);
        assert_eq!(
            d.reason,
            "Permission denied: tool 'git' is not allowed for agent 'a'"
        );
        assert!(!check(&p, "nobody", "kv", ToolKind::Plugin).allowed);
    }

    #[test]
    fn core_tools_allowed_unless_denied() {
        let p = policy();
        for t in CORE_TOOLS {
            assert!(check(&p, "a", t, ToolKind::Core).allowed, "{t}");
        }
        let d = check(&p, "b", "exec", ToolKind::Core);
        assert!(!d.allowed);
        assert!(d.reason.contains("denyTools"));
        assert!(check(&p, "b", "read", ToolKind::Core).allowed);
        // denyTools wins over tools.
        assert!(!check(&p, "b", "git", ToolKind::Plugin).allowed);
        assert!(!check(&p, "a", "kv", ToolKind::Core).allowed);
    }
}
