//! `mcp` and `agents.<a>.mcpConfigs`: the MCP servers whose tools become CLIs in an
//! agent's sandbox (`spec/mcp.md` §1.1), and which agent has which of their tools.
//!
//! An agent has a server when one of its `tools` patterns names it: `files` (every
//! tool of the server), `files.*`, `github.list_*`, and `!github.delete_*` (a denial that
//! wins). The policy name of an MCP tool is `<server>.<tool>`.

use std::time::Duration;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `mcp`: MCP servers, by name.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpConfig {
    /// Servers by name (`[a-z][a-z0-9-]*`, not a plugin's or a core tool's name).
    #[serde(default)]
    pub servers: IndexMap<String, McpServerConfig>,
}

/// `mcp.servers.<name>`: one MCP server. Exactly one of `command` (a stdio server run
/// inside the agent's sandbox, never on the host) and `url` (a remote server reached
/// through the agent's egress).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program to run in the sandbox (looked up on the sandbox's `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables for the program (no secrets: the sandbox can read them).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<String, String>,
    /// A remote server's streamable-HTTP endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Names of `egress.credentials` entries the server's traffic gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// Per-call time limit: seconds, or a number with `s`, `m` or `h` (default `60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<TimeLimit>,
    /// Per-tool time limits, overriding `timeout`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub tool_timeouts: IndexMap<String, TimeLimit>,
    /// Who a stdio server runs as: a uid of its own in the agent's group (default
    /// 61000), or `"agent"` (the agent's own user, which gives up the protection of a
    /// separate uid; refused with `credentials`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<McpUser>,
}

/// A time limit: whole seconds, or a string like `"90s"`, `"2m"`, `"1h"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum TimeLimit {
    /// Seconds.
    Seconds(u64),
    /// A number and a unit (`s`, `m`, `h`).
    Text(String),
}

impl TimeLimit {
    /// The limit, or `None` when the text cannot be read.
    pub fn duration(&self) -> Option<Duration> {
        match self {
            TimeLimit::Seconds(s) => Some(Duration::from_secs(*s)),
            TimeLimit::Text(t) => {
                let t = t.trim();
                let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit())?);
                let n: u64 = number.parse().ok()?;
                let secs = match unit.trim() {
                    "s" | "sec" | "secs" => n,
                    "m" | "min" => n.checked_mul(60)?,
                    "h" => n.checked_mul(3600)?,
                    _ => return None,
                };
                Some(Duration::from_secs(secs))
            }
        }
    }
}

/// Who a stdio MCP server runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum McpUser {
    /// A uid (not 0), with the agent's group.
    Uid(u32),
    /// `"agent"`: the agent's own user.
    Named(McpUserName),
}

/// The one named [`McpUser`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum McpUserName {
    /// The agent's own user.
    Agent,
}

impl super::Config {
    /// The MCP server `server` as `agent` sees it: `mcp.servers.<server>` with
    /// `agents.<agent>.mcpConfigs.<server>` deep-merged over it. `Err` says why the
    /// merged definition is not valid.
    pub fn mcp_server(&self, agent: &str, server: &str) -> Result<McpServerConfig, String> {
        let base = self
            .mcp
            .as_ref()
            .and_then(|m| m.servers.get(server))
            .ok_or_else(|| format!("no MCP server named '{server}' is configured"))?;
        let Some(over) = self
            .agents
            .get(agent)
            .and_then(|a| a.mcp_configs.get(server))
        else {
            return Ok(base.clone());
        };
        let mut merged = serde_json::to_value(base).map_err(|e| e.to_string())?;
        super::deep_merge(&mut merged, over);
        serde_json::from_value(merged).map_err(|e| {
            format!("agents.{agent}.mcpConfigs.{server} does not make a valid server: {e}")
        })
    }

    /// The MCP servers `agent` has (a positive pattern of its `tools` names them), in
    /// config order.
    pub fn agent_mcp_servers(&self, agent: &str) -> Vec<String> {
        let (Some(mcp), Some(a)) = (&self.mcp, self.agents.get(agent)) else {
            return Vec::new();
        };
        mcp.servers
            .keys()
            .filter(|s| patterns_name_server(&a.tools, s))
            .cloned()
            .collect()
    }
}

/// The default per-call time limit of an MCP tool.
pub const DEFAULT_MCP_TIMEOUT: Duration = Duration::from_secs(60);

impl McpServerConfig {
    /// The time limit of a call of `tool`.
    pub fn timeout_of(&self, tool: &str) -> Duration {
        self.tool_timeouts
            .get(tool)
            .or(self.timeout.as_ref())
            .and_then(TimeLimit::duration)
            .unwrap_or(DEFAULT_MCP_TIMEOUT)
    }
}

/// Whether `name` is a valid MCP server name: `[a-z][a-z0-9-]*`.
pub fn is_valid_server_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The server a `tools` entry names, when it names one of `servers`: `files`,
/// `files.*`, `github.list_*` or `!github.delete_*` name `files` / `github`.
pub fn pattern_server<'a>(
    pattern: &'a str,
    servers: &IndexMap<String, McpServerConfig>,
) -> Option<&'a str> {
    let body = pattern.strip_prefix('!').unwrap_or(pattern);
    let server = body.split_once('.').map_or(body, |(s, _)| s);
    servers.contains_key(server).then_some(server)
}

/// Whether `glob` (`*` matches any run of characters) matches `name`.
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let mut parts = glob.split('*');
    let Some(first) = parts.next() else {
        return false;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether the `patterns` of an agent's `tools` allow the MCP tool `server.tool`: a
/// positive pattern (`server`, or `server.<glob>`) matches and no `!` pattern does.
pub fn patterns_allow(patterns: &[String], server: &str, tool: &str) -> bool {
    let full = format!("{server}.{tool}");
    let matches = |p: &str| p == server || glob_matches(p, &full);
    let mut allowed = false;
    for p in patterns {
        match p.strip_prefix('!') {
            Some(denied) if matches(denied) => return false,
            Some(_) => {}
            None if matches(p) => allowed = true,
            None => {}
        }
    }
    allowed
}

/// Whether any positive pattern of `patterns` names `server` (the agent has it).
pub fn patterns_name_server(patterns: &[String], server: &str) -> bool {
    patterns.iter().any(|p| {
        !p.starts_with('!') && (p == server || p.split_once('.').is_some_and(|(s, _)| s == server))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_patterns() {
        assert!(glob_matches("github.list_*", "github.list_issues"));
        assert!(!glob_matches("github.list_*", "github.get_issue"));
        assert!(glob_matches("a*b*c", "axxbyyc"));
        assert!(!glob_matches("a*b*c", "axxbyy"));
        assert!(glob_matches("exact", "exact"));
        assert!(!glob_matches("exact", "exactly"));
        let p: Vec<String> = [
            "files",
            "github.list_*",
            "github.get_*",
            "!github.delete_*",
            "t.*",
            "!t.fail",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert!(patterns_allow(&p, "files", "read"));
        assert!(patterns_allow(&p, "github", "list_issues"));
        assert!(!patterns_allow(&p, "github", "create_issue"));
        assert!(patterns_allow(&p, "t", "add"));
        assert!(!patterns_allow(&p, "t", "fail"));
        assert!(patterns_name_server(&p, "github"));
        assert!(!patterns_name_server(&p, "other"));
    }

    #[test]
    fn time_limits_and_names() {
        assert_eq!(
            TimeLimit::Text("90s".into()).duration(),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            TimeLimit::Text("2m".into()).duration(),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            TimeLimit::Seconds(5).duration(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(TimeLimit::Text("soon".into()).duration(), None);
        assert!(is_valid_server_name("testsrv"));
        assert!(is_valid_server_name("my-srv2"));
        assert!(!is_valid_server_name("Srv"));
        assert!(!is_valid_server_name("2srv"));
        assert!(!is_valid_server_name(""));
    }
}
