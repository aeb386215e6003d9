//! Budgets: the limits of `budgets` (and `agents.<a>.budgets`) resolved per agent, the
//! check the agent loop makes before each model call, the 80 % warnings, and the
//! per-exec tool-call counter the socket consults.
//!
//! Owns what a budget *is* and when it is reached, as plain values ([`Limits`],
//! [`BudgetExhausted`], [`Warning`]) that can be printed and tested without a gateway.
//! It does not read the ledger or send events: the agent loop sums the ledger
//! ([`crate::store::UsageLedger`]) into a [`Used`], asks [`Limits`], and ends the turn;
//! the socket handler asks [`ExecBudgets`]. Not yet here: `onLimit: "ask"`, rates and
//! bursts, runaway detection, monthly periods, per-tool limits and reservations.

pub mod config;
mod exec;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

pub use config::{BudgetsConfig, UnknownModelPrice};
pub use exec::{ExecBudgets, ExecGuard};

use crate::config::Config;
use beige_client::usage::UsageTotals;

/// The share of a limit at which [`Warning`]s start, in percent.
pub const WARN_PCT: u32 = 80;

/// Where a budget applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One session, across its turns and restarts.
    Session,
    /// One turn: a prompt from the user's message to the answer.
    Turn,
    /// One agent over one UTC day.
    AgentDay,
    /// One `exec` and what it starts.
    Exec,
    /// A sub-agent's spawn budget (`pluginConfigs.spawn.targets.<NAME>.budget`), over
    /// its own spending and its children's.
    Spawn,
}

impl Scope {
    /// `session`, `turn`, `agent.day`, `exec`: the scope's path under `budgets`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Session => "session",
            Scope::Turn => "turn",
            Scope::AgentDay => "agent.day",
            Scope::Exec => "exec",
            Scope::Spawn => "spawn",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Scope::Session => "Session",
            Scope::Turn => "Turn",
            Scope::AgentDay => "Daily agent",
            Scope::Exec => "Exec",
            Scope::Spawn => "Sub-agent",
        }
    }
}

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetKey {
    /// Input + output + cache-write tokens.
    Tokens,
    /// US dollars.
    CostUsd,
    /// Model calls.
    ModelCalls,
    /// Seconds of wall time.
    WallSeconds,
    /// Plugin tool calls.
    ToolCalls,
}

impl BudgetKey {
    /// The key's name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetKey::Tokens => "tokens",
            BudgetKey::CostUsd => "costUsd",
            BudgetKey::ModelCalls => "modelCalls",
            BudgetKey::WallSeconds => "wallSeconds",
            BudgetKey::ToolCalls => "toolCalls",
        }
    }

    /// `20000 tokens`, `$5.00`, `50 model calls`, `1800 s`, `100 tool calls`.
    pub fn amount(self, value: f64) -> String {
        match self {
            BudgetKey::CostUsd => format!("${value:.2}"),
            BudgetKey::Tokens => format!("{value:.0} tokens"),
            BudgetKey::ModelCalls => format!("{value:.0} model calls"),
            BudgetKey::WallSeconds => format!("{value:.0} s"),
            BudgetKey::ToolCalls => format!("{value:.0} tool calls"),
        }
    }

    /// The used part of a message: `20417`, `$5.03`, `1803 s`.
    fn used(self, value: f64) -> String {
        match self {
            BudgetKey::CostUsd => format!("${value:.2}"),
            BudgetKey::WallSeconds => format!("{value:.0} s"),
            _ => format!("{value:.0}"),
        }
    }
}

/// A budget is reached: the turn (or the tool call) ends, with [`Self::message`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.message())]
pub struct BudgetExhausted {
    /// The agent whose budget it is.
    pub agent: String,
    /// Where it applies.
    pub scope: Scope,
    /// What it counts.
    pub key: BudgetKey,
    /// The limit.
    pub limit: f64,
    /// How much is used (at least `limit`).
    pub used: f64,
}

impl BudgetExhausted {
    /// `budgets.session.tokens`.
    pub fn config_path(&self) -> String {
        format!("budgets.{}.{}", self.scope.as_str(), self.key.as_str())
    }

    /// `agents.<a>.budgets.session.tokens`.
    pub fn agent_path(&self) -> String {
        format!("agents.{}.{}", self.agent, self.config_path())
    }

    /// `Session budget of 20000 tokens reached (20417 used). Raise budgets.session.tokens
    /// (or agents.a.budgets.session.tokens) to continue.`; for an exec
    /// `exec tool-call budget of 100 reached; raise budgets.exec.toolCalls`.
    pub fn message(&self) -> String {
        if self.scope == Scope::Exec {
            return format!(
                "exec tool-call budget of {:.0} reached; raise {}",
                self.limit,
                self.config_path()
            );
        }
        if self.scope == Scope::Spawn {
            return format!(
                "Sub-agent budget of {} reached ({} used). Raise the target's budget in the parent agent's pluginConfigs.spawn.targets to continue.",
                self.key.amount(self.limit),
                self.key.used(self.used)
            );
        }
        format!(
            "{} budget of {} reached ({} used). Raise {} (or {}) to continue.",
            self.scope.label(),
            self.key.amount(self.limit),
            self.key.used(self.used),
            self.config_path(),
            self.agent_path()
        )
    }

    /// What the user can do, for the `error` event's `hint`.
    pub fn hint(&self) -> String {
        let wait = match self.scope {
            Scope::Session => " or start a new session (/new)",
            Scope::AgentDay => " or wait for the next day (UTC)",
            Scope::Turn | Scope::Exec | Scope::Spawn => " or ask for a smaller step",
        };
        format!(
            "Raise {} in the gateway's config{wait}.",
            self.config_path()
        )
    }
}

/// A budget is [`WARN_PCT`] % used or more.
#[derive(Debug, Clone, PartialEq)]
pub struct Warning {
    /// Where it applies.
    pub scope: Scope,
    /// What it counts.
    pub key: BudgetKey,
    /// How much is used.
    pub used: f64,
    /// The limit.
    pub limit: f64,
    /// `used / limit` in percent, rounded down.
    pub pct: u32,
}

/// What is used in each scope the agent loop checks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Used {
    /// The session's ledger totals.
    pub session: UsageTotals,
    /// This turn's model calls.
    pub turn: UsageTotals,
    /// Time since the turn started.
    pub turn_wall: Duration,
    /// The agent's ledger totals since the start of the UTC day.
    pub day: UsageTotals,
}

/// One agent's limits: its `agents.<a>.budgets` key where set, else the top-level one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// `budgets.session`.
    pub session: config::ScopeLimits,
    /// `budgets.turn`.
    pub turn: config::TurnLimits,
    /// `budgets.agent.day`.
    pub day: config::ScopeLimits,
    /// `budgets.exec.toolCalls`.
    pub exec_tool_calls: Option<u64>,
    /// `budgets.unknownModelPrice`.
    pub unknown_model_price: UnknownModelPrice,
}

fn scope_of(
    agent: Option<config::ScopeLimits>,
    global: Option<config::ScopeLimits>,
) -> config::ScopeLimits {
    let (a, g) = (agent.unwrap_or_default(), global.unwrap_or_default());
    config::ScopeLimits {
        cost_usd: a.cost_usd.or(g.cost_usd),
        tokens: a.tokens.or(g.tokens),
    }
}

impl Limits {
    /// The limits of `agent` (an unknown agent gets the top-level ones).
    pub fn for_agent(config: &Config, agent: &str) -> Self {
        let global = config.budgets.clone().unwrap_or_default();
        let own = config
            .agents
            .get(agent)
            .and_then(|a| a.budgets.clone())
            .unwrap_or_default();
        let (at, gt) = (
            own.turn.unwrap_or_default(),
            global.turn.unwrap_or_default(),
        );
        Self {
            session: scope_of(own.session, global.session),
            turn: config::TurnLimits {
                cost_usd: at.cost_usd.or(gt.cost_usd),
                tokens: at.tokens.or(gt.tokens),
                model_calls: at.model_calls.or(gt.model_calls),
                wall_seconds: at.wall_seconds.or(gt.wall_seconds),
            },
            day: scope_of(
                own.agent.and_then(|a| a.day),
                global.agent.and_then(|a| a.day),
            ),
            exec_tool_calls: own
                .exec
                .and_then(|e| e.tool_calls)
                .or(global.exec.and_then(|e| e.tool_calls)),
            unknown_model_price: own
                .unknown_model_price
                .or(global.unknown_model_price)
                .unwrap_or_default(),
        }
    }

    /// Whether any `costUsd` limit applies.
    pub fn has_cost_limit(&self) -> bool {
        self.session.cost_usd.is_some()
            || self.turn.cost_usd.is_some()
            || self.day.cost_usd.is_some()
    }

    /// Whether the agent loop has anything to check.
    pub fn any_model_limit(&self) -> bool {
        self.has_cost_limit()
            || self.session.tokens.is_some()
            || self.turn.tokens.is_some()
            || self.turn.model_calls.is_some()
            || self.turn.wall_seconds.is_some()
            || self.day.tokens.is_some()
    }

    /// Whether any limit needs the session's or the day's ledger totals.
    pub fn needs_ledger(&self) -> (bool, bool) {
        (
            self.session.cost_usd.is_some() || self.session.tokens.is_some(),
            self.day.cost_usd.is_some() || self.day.tokens.is_some(),
        )
    }

    /// Every set limit with its use, in the order they are checked: turn, session, day.
    fn measured(&self, used: &Used) -> Vec<(Scope, BudgetKey, f64, f64)> {
        let mut out = Vec::new();
        let mut scope = |scope, limits: config::ScopeLimits, totals: &UsageTotals| {
            if let Some(t) = limits.tokens {
                out.push((scope, BudgetKey::Tokens, totals.tokens() as f64, t as f64));
            }
            if let Some(c) = limits.cost_usd {
                out.push((scope, BudgetKey::CostUsd, totals.cost_usd(), c));
            }
        };
        scope(
            Scope::Turn,
            config::ScopeLimits {
                cost_usd: self.turn.cost_usd,
                tokens: self.turn.tokens,
            },
            &used.turn,
        );
        scope(Scope::Session, self.session, &used.session);
        scope(Scope::AgentDay, self.day, &used.day);
        if let Some(n) = self.turn.model_calls {
            out.push((
                Scope::Turn,
                BudgetKey::ModelCalls,
                used.turn.calls as f64,
                n as f64,
            ));
        }
        if let Some(s) = self.turn.wall_seconds {
            out.push((
                Scope::Turn,
                BudgetKey::WallSeconds,
                used.turn_wall.as_secs_f64().floor(),
                s as f64,
            ));
        }
        out
    }

    /// The first budget `used` has reached, if any: the next model call must not start.
    pub fn exhausted(&self, agent: &str, used: &Used) -> Option<BudgetExhausted> {
        self.measured(used)
            .into_iter()
            .find(|(_, _, u, l)| u >= l)
            .map(|(scope, key, used, limit)| BudgetExhausted {
                agent: agent.to_string(),
                scope,
                key,
                limit,
                used,
            })
    }

    /// Every budget at [`WARN_PCT`] % or more (wall time is left out: it is no news).
    pub fn warnings(&self, used: &Used) -> Vec<Warning> {
        self.measured(used)
            .into_iter()
            .filter(|(_, key, _, _)| *key != BudgetKey::WallSeconds)
            .filter_map(|(scope, key, used, limit)| {
                let pct = if limit > 0.0 {
                    ((used / limit) * 100.0).floor().min(u32::MAX as f64) as u32
                } else {
                    100
                };
                (pct >= WARN_PCT).then_some(Warning {
                    scope,
                    key,
                    used,
                    limit,
                    pct,
                })
            })
            .collect()
    }
}

/// The warnings already sent, once per scope, period and key.
#[derive(Debug, Default)]
pub struct WarnedOnce(Mutex<HashSet<String>>);

impl WarnedOnce {
    /// Whether `period` (`session:<id>`, `day:<agent>:<date>`, …) and `key` are new;
    /// records them.
    pub fn first(&self, period: &str, key: BudgetKey) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(format!("{period}/{}", key.as_str()))
    }
}

/// The start of the UTC day of `ms` (Unix ms).
pub fn day_start_ms(ms: i64) -> i64 {
    ms - ms.rem_euclid(86_400_000)
}

/// `YYYY-MM-DD` of the UTC day of `ms`.
pub fn day_of(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(input: u64, output: u64, cache_write: u64, cost_micros: i64) -> UsageTotals {
        UsageTotals {
            calls: 1,
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: 999_999,
            cache_write_tokens: cache_write,
            cost_micros,
            unpriced_calls: 0,
        }
    }

    #[test]
    fn the_message_names_the_budget_and_both_config_paths() {
        let e = BudgetExhausted {
            agent: "a".into(),
            scope: Scope::Session,
            key: BudgetKey::Tokens,
            limit: 20000.0,
            used: 20417.0,
        };
        assert_eq!(
            e.message(),
            "Session budget of 20000 tokens reached (20417 used). Raise budgets.session.tokens (or agents.a.budgets.session.tokens) to continue."
        );
        let cost = BudgetExhausted {
            key: BudgetKey::CostUsd,
            limit: 5.0,
            used: 5.031,
            ..e.clone()
        };
        assert!(cost
            .message()
            .starts_with("Session budget of $5.00 reached ($5.03 used)."));
        let exec = BudgetExhausted {
            scope: Scope::Exec,
            key: BudgetKey::ToolCalls,
            limit: 100.0,
            used: 100.0,
            ..e
        };
        assert_eq!(
            exec.message(),
            "exec tool-call budget of 100 reached; raise budgets.exec.toolCalls"
        );
    }

    #[test]
    fn the_agent_overrides_per_key_and_cache_reads_do_not_count() {
        let config: Config = serde_json::from_value(serde_json::json!({
            "llm": {"providers": {}},
            "budgets": {"session": {"tokens": 1000, "costUsd": 5}, "turn": {"modelCalls": 3}},
            "agents": {"a": {"model": {"provider": "p", "model": "m"}, "tools": [],
                              "budgets": {"session": {"tokens": 100}}}}
        }))
        .unwrap();
        let l = Limits::for_agent(&config, "a");
        assert_eq!(l.session.tokens, Some(100));
        assert_eq!(l.session.cost_usd, Some(5.0), "kept from the top level");
        assert_eq!(l.turn.model_calls, Some(3));
        let used = Used {
            session: totals(50, 20, 10, 0),
            ..Used::default()
        };
        assert_eq!(l.exhausted("a", &used), None, "80 of 100 tokens");
        let w = l.warnings(&used);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            (w[0].scope, w[0].key, w[0].pct),
            (Scope::Session, BudgetKey::Tokens, 80)
        );
        let over = Used {
            session: totals(50, 40, 10, 0),
            ..Used::default()
        };
        let e = l.exhausted("a", &over).unwrap();
        assert_eq!(
            (e.scope, e.key, e.used),
            (Scope::Session, BudgetKey::Tokens, 100.0)
        );
        let calls = Used {
            turn: UsageTotals {
                calls: 3,
                ..UsageTotals::default()
            },
            ..Used::default()
        };
        assert_eq!(l.exhausted("a", &calls).unwrap().key, BudgetKey::ModelCalls);
    }

    #[test]
    fn warnings_are_sent_once_per_period() {
        let w = WarnedOnce::default();
        assert!(w.first("session:s1", BudgetKey::Tokens));
        assert!(!w.first("session:s1", BudgetKey::Tokens));
        assert!(w.first("session:s1", BudgetKey::CostUsd));
        assert!(w.first("session:s2", BudgetKey::Tokens));
    }

    #[test]
    fn days_are_utc() {
        let ms = 1_700_000_000_000; // 2023-11-14T22:13:20Z
        assert_eq!(day_of(ms), "2023-11-14");
        assert_eq!(day_of(day_start_ms(ms)), "2023-11-14");
        assert_eq!(ms - day_start_ms(ms), (22 * 3600 + 13 * 60 + 20) * 1000);
    }
}
