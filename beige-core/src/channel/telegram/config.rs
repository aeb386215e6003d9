//! `plugins.telegram.config`: parsed and checked, with errors that name the field.
//!
//! ```json5
//! plugins: {
//!   telegram: {
//!     config: {
//!       token: "${TELEGRAM_BOT_TOKEN}",
//!       allowedUsers: [123456789, "${MY_OTHER_ID}"],
//!       agentMapping: { default: "assistant", "-1001234567890": "intern" },
//!       defaults: { verbose: false, streaming: true },
//!       // optional:
//!       allowedChats: [-1001234567890],   // extra chats the `telegram` tool may reach
//!       apiBaseUrl: "https://api.telegram.org",
//!       pollTimeout: 30,                  // seconds Telegram holds a getUpdates call
//!       watchdogGrace: 10,                // seconds on top before polling is restarted
//!     },
//!   },
//! }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::TelegramError;
use crate::config::{Config, PluginEntry};

/// The default Bot API server.
pub const DEFAULT_API_BASE_URL: &str = "https://api.telegram.org";
/// Default long-poll wait of `getUpdates`.
pub const DEFAULT_POLL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default extra time before the watchdog restarts a `getUpdates` that did not answer.
pub const DEFAULT_WATCHDOG_GRACE: Duration = Duration::from_secs(10);

const KNOWN_KEYS: [&str; 9] = [
    "token",
    "allowedUsers",
    "allowedChats",
    "agentMapping",
    "defaults",
    "apiBaseUrl",
    "pollTimeout",
    "watchdogGrace",
    "_source",
];

/// Which agent answers in which chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentMapping {
    /// The agent for chats and users not listed.
    pub default: String,
    /// Agent by chat id (or, as in the original, by user id for private chats).
    pub by_id: BTreeMap<i64, String>,
}

/// Per-chat defaults, overridden per session with `/verbose` and `/streaming`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelDefaults {
    /// Show each tool call as a line (`🔧 exec: ls -la`). Default `false`.
    pub verbose: bool,
    /// Edit one message as the answer arrives. Default `true`.
    pub streaming: bool,
}

impl Default for ChannelDefaults {
    fn default() -> Self {
        Self {
            verbose: false,
            streaming: true,
        }
    }
}

/// The Telegram channel's configuration. `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct TelegramConfig {
    /// The bot token from BotFather. Secret.
    pub token: String,
    /// Telegram user ids allowed to talk to agents.
    pub allowed_users: Vec<i64>,
    /// Chats the `telegram` tool may send to besides the current one.
    pub allowed_chats: Vec<i64>,
    /// Which agent answers in which chat (`agentMapping`; its `default` is required).
    pub agent_mapping: AgentMapping,
    /// Whether chats start verbose and streaming (`defaults`).
    pub defaults: ChannelDefaults,
    /// Without a trailing slash.
    pub api_base_url: String,
    /// How long Telegram holds a `getUpdates` call open (1–50 s).
    pub poll_timeout: Duration,
    /// Extra time after `poll_timeout` before a silent `getUpdates` counts as hung.
    pub watchdog_grace: Duration,
}

impl std::fmt::Debug for TelegramConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramConfig")
            .field("token", &"<redacted>")
            .field("allowed_users", &self.allowed_users)
            .field("allowed_chats", &self.allowed_chats)
            .field("agent_mapping", &self.agent_mapping)
            .field("defaults", &self.defaults)
            .field("api_base_url", &self.api_base_url)
            .field("poll_timeout", &self.poll_timeout)
            .field("watchdog_grace", &self.watchdog_grace)
            .finish()
    }
}

fn bad(path: &str, message: impl Into<String>) -> TelegramError {
    TelegramError::Config {
        path: path.to_string(),
        message: message.into(),
    }
}

/// Telegram ids from a number, a numeric string, or a string of several ids separated
/// by commas or spaces (one `${VAR}` holding a list).
fn ids(value: &Value, path: &str) -> Result<Vec<i64>, TelegramError> {
    let one = |v: &Value, p: &str| -> Result<Vec<i64>, TelegramError> {
        match v {
            Value::Number(n) => n.as_i64().map(|i| vec![i]).ok_or_else(|| {
                bad(
                    p,
                    format!("{n} is not a whole number; Telegram ids are integers"),
                )
            }),
            Value::String(s) => {
                let parts: Vec<&str> = s
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|x| !x.is_empty())
                    .collect();
                if parts.is_empty() {
                    return Err(bad(p, "is empty; expected a numeric Telegram id"));
                }
                parts
                    .iter()
                    .map(|x| {
                        x.parse::<i64>().map_err(|_| {
                            bad(
                                p,
                                format!("{x:?} is not a numeric Telegram id (ask @userinfobot for yours)"),
                            )
                        })
                    })
                    .collect()
            }
            other => Err(bad(
                p,
                format!("expected a numeric Telegram id, got {}", kind(other)),
            )),
        }
    };
    match value {
        Value::Array(items) => {
            let mut out = Vec::new();
            for (i, v) in items.iter().enumerate() {
                out.extend(one(v, &format!("{path}[{i}]"))?);
            }
            Ok(out)
        }
        other => one(other, path),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn seconds(v: &Value, path: &str, min: f64, max: f64) -> Result<Duration, TelegramError> {
    let n = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .ok_or_else(|| {
        bad(
            path,
            format!("expected a number of seconds, got {}", kind(v)),
        )
    })?;
    if !(min..=max).contains(&n) {
        return Err(bad(
            path,
            format!("{n} is out of range ({min}–{max} seconds)"),
        ));
    }
    Ok(Duration::from_secs_f64(n))
}

fn boolean(v: &Value, path: &str) -> Result<bool, TelegramError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" || s == "false" => Ok(s == "true"),
        other => Err(bad(
            path,
            format!("expected true or false, got {}", kind(other)),
        )),
    }
}

/// Whether a `plugins.telegram` entry means the built-in channel and plugin: no `path`,
/// or the original's toolkit (`_source: "npm:@matthias-hausberger/beige-toolkit…"`),
/// whose TypeScript cannot run here.
pub fn is_builtin(entry: &PluginEntry) -> bool {
    entry.path.is_none()
        || entry
            .source
            .as_deref()
            .is_some_and(|s| s.starts_with("npm:@matthias-hausberger/beige-toolkit"))
}

impl TelegramConfig {
    /// Parse `plugins.telegram.config`. Unknown keys are logged, not refused.
    pub fn from_value(value: &Value) -> Result<Self, TelegramError> {
        let Value::Object(map) = value else {
            return Err(bad(
                "",
                format!(
                    "expected an object with token, allowedUsers and agentMapping, got {}",
                    kind(value)
                ),
            ));
        };
        for key in map.keys() {
            if !KNOWN_KEYS.contains(&key.as_str()) {
                tracing::warn!(
                    key = %key,
                    "unknown key plugins.telegram.config.{key} is ignored (known: {})",
                    KNOWN_KEYS[..8].join(", ")
                );
            }
        }
        let token = match map.get("token") {
            Some(Value::String(t)) if !t.trim().is_empty() => t.trim().to_string(),
            Some(Value::String(_)) => {
                return Err(bad(
                    ".token",
                    "is empty; put the token BotFather gave you here (or \"${TELEGRAM_BOT_TOKEN}\")",
                ))
            }
            Some(other) => {
                return Err(bad(
                    ".token",
                    format!("expected a string, got {}", kind(other)),
                ))
            }
            None => {
                return Err(bad(
                    ".token",
                    "is missing; create a bot with @BotFather and put its token here (or \"${TELEGRAM_BOT_TOKEN}\")",
                ))
            }
        };
        if token.contains(['/', '?', '#']) || token.chars().any(char::is_whitespace) {
            return Err(bad(
                ".token",
                "does not look like a bot token (expected <digits>:<letters>, as BotFather shows it)",
            ));
        }
        let allowed_users = match map.get("allowedUsers") {
            None => {
                return Err(bad(
                    ".allowedUsers",
                    "is missing; list the numeric Telegram user ids allowed to talk to agents",
                ))
            }
            Some(v) => ids(v, ".allowedUsers")?,
        };
        if allowed_users.is_empty() {
            return Err(bad(
                ".allowedUsers",
                "is empty; nobody could use the bot. List at least one numeric user id",
            ));
        }
        let allowed_chats = match map.get("allowedChats") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => ids(v, ".allowedChats")?,
        };
        let agent_mapping = match map.get("agentMapping") {
            Some(Value::Object(m)) => {
                let mut default = None;
                let mut by_id = BTreeMap::new();
                for (k, v) in m {
                    let path = format!(".agentMapping.{k}");
                    let agent = match v {
                        Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
                        other => {
                            return Err(bad(
                                &path,
                                format!("expected an agent name, got {}", kind(other)),
                            ))
                        }
                    };
                    if k == "default" {
                        default = Some(agent);
                    } else {
                        let id = k.trim().parse::<i64>().map_err(|_| {
                            bad(&path, "keys must be \"default\" or a numeric chat/user id")
                        })?;
                        by_id.insert(id, agent);
                    }
                }
                AgentMapping {
                    default: default.ok_or_else(|| {
                        bad(
                            ".agentMapping.default",
                            "is missing; name the agent that answers in chats not listed",
                        )
                    })?,
                    by_id,
                }
            }
            Some(other) => {
                return Err(bad(
                    ".agentMapping",
                    format!(
                        "expected an object like {{default: \"assistant\"}}, got {}",
                        kind(other)
                    ),
                ))
            }
            None => {
                return Err(bad(
                    ".agentMapping",
                    "is missing; add agentMapping: {default: \"<agent>\"}",
                ))
            }
        };
        let mut defaults = ChannelDefaults::default();
        match map.get("defaults") {
            None | Some(Value::Null) => {}
            Some(Value::Object(d)) => {
                if let Some(v) = d.get("verbose") {
                    defaults.verbose = boolean(v, ".defaults.verbose")?;
                }
                if let Some(v) = d.get("streaming") {
                    defaults.streaming = boolean(v, ".defaults.streaming")?;
                }
            }
            Some(other) => {
                return Err(bad(
                    ".defaults",
                    format!("expected {{verbose, streaming}}, got {}", kind(other)),
                ))
            }
        }
        let api_base_url = match map.get("apiBaseUrl") {
            None | Some(Value::Null) => DEFAULT_API_BASE_URL.to_string(),
            Some(Value::String(u)) => {
                let u = u.trim().trim_end_matches('/');
                if !(u.starts_with("https://") || u.starts_with("http://")) {
                    return Err(bad(
                        ".apiBaseUrl",
                        format!("{u:?} must start with https:// (or http:// for a local server)"),
                    ));
                }
                u.to_string()
            }
            Some(other) => {
                return Err(bad(
                    ".apiBaseUrl",
                    format!("expected a URL, got {}", kind(other)),
                ))
            }
        };
        let poll_timeout = match map.get("pollTimeout") {
            None | Some(Value::Null) => DEFAULT_POLL_TIMEOUT,
            Some(v) => {
                let d = seconds(v, ".pollTimeout", 1.0, 50.0)?;
                Duration::from_secs(d.as_secs().max(1))
            }
        };
        let watchdog_grace = match map.get("watchdogGrace") {
            None | Some(Value::Null) => DEFAULT_WATCHDOG_GRACE,
            Some(v) => seconds(v, ".watchdogGrace", 0.1, 600.0)?,
        };
        Ok(Self {
            token,
            allowed_users,
            allowed_chats,
            agent_mapping,
            defaults,
            api_base_url,
            poll_timeout,
            watchdog_grace,
        })
    }

    /// The channel's config from the gateway config: `Ok(None)` when `plugins.telegram`
    /// is not configured, or is an external plugin (see [`is_builtin`]).
    pub fn from_config(config: &Config) -> Result<Option<Self>, TelegramError> {
        let Some(entry) = config.plugins.get("telegram") else {
            return Ok(None);
        };
        if !is_builtin(entry) {
            return Ok(None);
        }
        let value = entry.config.clone().unwrap_or(Value::Null);
        Self::from_value(&value).map(Some)
    }

    /// The agent for a message in `chat_id` from `user_id`: the chat's mapping, else the
    /// user's, else `default`.
    pub fn agent_for(&self, chat_id: i64, user_id: i64) -> &str {
        self.agent_mapping
            .by_id
            .get(&chat_id)
            .or_else(|| self.agent_mapping.by_id.get(&user_id))
            .unwrap_or(&self.agent_mapping.default)
    }

    /// Whether `user_id` may talk to agents.
    pub fn is_allowed(&self, user_id: i64) -> bool {
        self.allowed_users.contains(&user_id)
    }

    /// Every agent named in `agentMapping`.
    pub fn agents(&self) -> Vec<&str> {
        let mut v: Vec<&str> = std::iter::once(self.agent_mapping.default.as_str())
            .chain(self.agent_mapping.by_id.values().map(String::as_str))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<TelegramConfig, String> {
        TelegramConfig::from_value(&v).map_err(|e| e.to_string())
    }

    #[test]
    fn full_config() {
        let c = parse(json!({
            "token": "123:ABC",
            "allowedUsers": [42, "43", "44, 45"],
            "allowedChats": "-100",
            "agentMapping": {"default": "a", "-100": "b", "42": "c"},
            "defaults": {"verbose": true, "streaming": false},
            "apiBaseUrl": "http://127.0.0.1:9/",
            "pollTimeout": 2,
            "watchdogGrace": 0.5,
        }))
        .unwrap();
        assert_eq!(c.allowed_users, [42, 43, 44, 45]);
        assert_eq!(c.allowed_chats, [-100]);
        assert_eq!(c.agent_for(-100, 42), "b");
        assert_eq!(c.agent_for(42, 42), "c");
        assert_eq!(c.agent_for(7, 7), "a");
        assert_eq!(c.api_base_url, "http://127.0.0.1:9");
        assert_eq!(c.poll_timeout, Duration::from_secs(2));
        assert_eq!(c.watchdog_grace, Duration::from_millis(500));
        assert!(c.defaults.verbose && !c.defaults.streaming);
        assert!(!format!("{c:?}").contains("ABC"));
        assert_eq!(c.agents(), ["a", "b", "c"]);
    }

    #[test]
    fn defaults_apply() {
        let c =
            parse(json!({"token": "1:x", "allowedUsers": [1], "agentMapping": {"default": "a"}}))
                .unwrap();
        assert_eq!(c.api_base_url, DEFAULT_API_BASE_URL);
        assert_eq!(c.poll_timeout, DEFAULT_POLL_TIMEOUT);
        assert!(c.defaults.streaming && !c.defaults.verbose);
    }

    #[test]
    fn the_original_toolkit_entry_gets_the_builtin() {
        let config = |plugin: Value| -> Config {
            serde_json::from_value(json!({
                "llm": {"providers": {"anthropic": {"apiKey": "k"}}},
                "agents": {"a": {"model": {"provider": "anthropic", "model": "m"}, "tools": []}},
                "plugins": {"telegram": plugin},
            }))
            .unwrap()
        };
        let cfg = json!({"token": "1:x", "allowedUsers": [1], "agentMapping": {"default": "a"}});
        let c = config(json!({"_source": "npm:@matthias-hausberger/beige-toolkit", "config": cfg}));
        assert!(TelegramConfig::from_config(&c).unwrap().is_some());
        let c = config(json!({"config": cfg}));
        assert!(TelegramConfig::from_config(&c).unwrap().is_some());
        let c = config(json!({"path": "/opt/my-telegram", "config": cfg}));
        assert!(TelegramConfig::from_config(&c).unwrap().is_none());
        let c = config(json!({"config": {"token": "1:x"}}));
        assert!(TelegramConfig::from_config(&c).is_err());
    }

    #[test]
    fn errors_name_the_field() {
        let base =
            || json!({"token": "1:x", "allowedUsers": [1], "agentMapping": {"default": "a"}});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            parse(b).unwrap_err()
        };
        let e = with("allowedUsers", json!([1, "abc"]));
        assert!(e.contains("plugins.telegram.config.allowedUsers[1]"), "{e}");
        assert!(e.contains("\"abc\" is not a numeric Telegram id"), "{e}");
        let e = with("allowedUsers", json!([]));
        assert!(e.contains("allowedUsers: is empty"), "{e}");
        let e = with("agentMapping", json!({"x": "a"}));
        assert!(e.contains("agentMapping.x"), "{e}");
        let e = with("agentMapping", json!({"1": "a"}));
        assert!(e.contains("agentMapping.default: is missing"), "{e}");
        let e = with("token", json!(""));
        assert!(e.contains("token: is empty"), "{e}");
        let e = with("apiBaseUrl", json!("ftp://x"));
        assert!(e.contains("apiBaseUrl"), "{e}");
        let e = with("pollTimeout", json!(90));
        assert!(e.contains("pollTimeout: 90 is out of range"), "{e}");
        let e = parse(json!({"allowedUsers": [1], "agentMapping": {"default": "a"}})).unwrap_err();
        assert!(
            e.contains("token: is missing") && e.contains("BotFather"),
            "{e}"
        );
    }
}
