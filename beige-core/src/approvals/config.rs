//! `approvals`: how long a question waits for a human, how long callers hold for the
//! answer, and who else hears about it (top level, new in beige).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The longest a script's tool CLI holds for an answer (`scriptHoldSeconds` is capped
/// here).
pub const MAX_SCRIPT_HOLD_SECONDS: u64 = 120;

/// `approvals`: defaults for every agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// How long a request stays pending before it expires (default 900 s).
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    /// How long the model's own call waits for the answer before it is told the call
    /// is waiting (default 120 s).
    #[serde(default = "default_hold")]
    pub hold_seconds: u64,
    /// How long a script's tool CLI waits before it exits 76 `pending approval <id>`
    /// (default 30 s, at most 120; 0 answers at once).
    #[serde(default = "default_script_hold")]
    pub script_hold_seconds: u64,
    /// Pending requests one session may have; further asks are plain denials
    /// (default 5).
    #[serde(default = "default_max_pending")]
    pub max_pending_per_session: usize,
    /// How long an unused `once` approval stays usable (default 600 s).
    #[serde(default = "default_retry_window")]
    pub retry_window_seconds: u64,
    /// Who else hears about requests and about calls denied in unattended runs,
    /// besides the session's own channel.
    #[serde(default)]
    pub notify: Vec<NotifyTarget>,
}

pub use beige_client::approvals::NotifyTarget;

fn default_timeout() -> u64 {
    900
}
fn default_hold() -> u64 {
    120
}
fn default_script_hold() -> u64 {
    30
}
fn default_max_pending() -> usize {
    5
}
fn default_retry_window() -> u64 {
    600
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        Self {
            timeout_seconds: default_timeout(),
            hold_seconds: default_hold(),
            script_hold_seconds: default_script_hold(),
            max_pending_per_session: default_max_pending(),
            retry_window_seconds: default_retry_window(),
            notify: Vec::new(),
        }
    }
}

impl ApprovalsConfig {
    /// `timeoutSeconds`.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds.max(1))
    }

    /// `holdSeconds`.
    pub fn hold(&self) -> Duration {
        Duration::from_secs(self.hold_seconds)
    }

    /// `scriptHoldSeconds`, capped at [`MAX_SCRIPT_HOLD_SECONDS`].
    pub fn script_hold(&self) -> Duration {
        Duration::from_secs(self.script_hold_seconds.min(MAX_SCRIPT_HOLD_SECONDS))
    }

    /// `retryWindowSeconds`.
    pub fn retry_window(&self) -> Duration {
        Duration::from_secs(self.retry_window_seconds)
    }

    /// Problems with the settings, as `(key, message)`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.script_hold_seconds > MAX_SCRIPT_HOLD_SECONDS {
            out.push((
                "approvals.scriptHoldSeconds".into(),
                format!("is {} s; it can be at most {MAX_SCRIPT_HOLD_SECONDS} s (a script's tool call should not hang longer). Lower it.", self.script_hold_seconds),
            ));
        }
        if self.timeout_seconds == 0 {
            out.push((
                "approvals.timeoutSeconds".into(),
                "is 0; a request needs at least a second to be answered. Set it to 1 or more (default 900).".into(),
            ));
        }
        if self.max_pending_per_session == 0 {
            out.push((
                "approvals.maxPendingPerSession".into(),
                "is 0, which would turn every ask into a denial. Set it to 1 or more (default 5), or use deny rules instead.".into(),
            ));
        }
        for (i, t) in self.notify.iter().enumerate() {
            if t.channel != "telegram" {
                out.push((
                    format!("approvals.notify[{i}].channel"),
                    format!(
                        "is '{}'; the channels that can be notified are: telegram",
                        t.channel
                    ),
                ));
            }
            if t.chat_id.trim().is_empty() {
                out.push((
                    format!("approvals.notify[{i}].chatId"),
                    "is empty; set the chat id to write to".into(),
                ));
            }
        }
        out
    }
}
