//! Schedules as clients see them: [`ScheduleSpec`] (the shape of one entry of the
//! config's top-level `schedules`, and what a client sends to create one), the
//! [`ScheduleView`] a listing returns and the [`ScheduleRun`] of its history, with their
//! vocabulary ([`Deliver`], [`Missed`], [`Overlap`], [`OnInterrupted`], [`ScheduleBudget`],
//! [`ScheduleState`], [`RunStatus`]). The gateway (beige-core's `schedule` module) owns
//! firing them; this module only names the records, so the HTTP API, the CLI and the
//! agent's `schedule` tool share one wire format.

use serde::{Deserialize, Serialize};

/// The default of [`ScheduleSpec::max_late_seconds`]: six hours.
pub const DEFAULT_MAX_LATE_SECONDS: u64 = 21_600;

/// One schedule: what runs (a prompt to its agent, or an exec in its sandbox), when (a
/// cron expression in a time zone, or once `at` an instant), and where the result goes.
/// The config's `schedules.<name>` entries have exactly this shape; a client creating a
/// schedule sends it too.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    /// The agent that runs it, with its own rights at fire time.
    pub agent: String,
    /// A 5-field cron expression (`0 8 * * 1-5`) or a nickname (`@daily`, `@hourly`, …),
    /// evaluated in `tz`. Exclusive with `at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone of `cron` (`Europe/Berlin`); default the host's zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// Fire once at this RFC 3339 instant (`2026-12-24T18:00:00+01:00`). Exclusive with
    /// `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// The message sent to the agent. Exclusive with `exec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The shell command run in the agent's sandbox (no model). Exclusive with `prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// `"new"` (default): a fresh session per run; any other name: one session reused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Where the result goes; default the agent's owner is told only when a run is not
    /// `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver: Option<Deliver>,
    /// What happens to fires missed while the gateway was down (default `run-once`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<Missed>,
    /// The original's name for `missed`: `once` or `skip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
    /// A missed fire older than this is skipped, not run (default 21600, six hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_late_seconds: Option<u64>,
    /// What a fire does while the previous run is still going (default `skip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
    /// Limits of one run, on top of the agent's own budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<ScheduleBudget>,
    /// The tools a run may use: a subset of the agent's tools (default all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// What happens to a run cut off by a crash (default `report`; `rerun` only for
    /// exec schedules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_interrupted: Option<OnInterrupted>,
}

impl ScheduleSpec {
    /// The missed-fire policy, `catchUp` read as its alias.
    pub fn missed_policy(&self) -> Missed {
        match (self.missed, self.catch_up) {
            (Some(m), _) => m,
            (None, Some(CatchUp::Once)) => Missed::RunOnce,
            (None, Some(CatchUp::Skip)) => Missed::Skip,
            (None, None) => Missed::RunOnce,
        }
    }

    /// The overlap policy (default `skip`).
    pub fn overlap_policy(&self) -> Overlap {
        self.overlap.unwrap_or_default()
    }

    /// [`max_late_seconds`](Self::max_late_seconds) or its default.
    pub fn max_late(&self) -> u64 {
        self.max_late_seconds.unwrap_or(DEFAULT_MAX_LATE_SECONDS)
    }

    /// The named session, `None` for `"new"` (or unset).
    pub fn named_session(&self) -> Option<&str> {
        self.session.as_deref().filter(|s| *s != "new")
    }
}

/// Where a run's result goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum Deliver {
    /// `"events"`: a `schedule_run_finished` event on the gateway's event stream.
    Events(EventsTarget),
    /// A chat of a channel: `{ channel: "telegram", chatId: "123" }`.
    Chat(ChatTarget),
}

/// The word `events`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum EventsTarget {
    /// The gateway's event stream.
    Events,
}

/// A chat to deliver to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChatTarget {
    /// The channel (`telegram`).
    pub channel: String,
    /// The chat id on that channel.
    pub chat_id: String,
}

/// Fires missed while the gateway was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Missed {
    /// One run for the latest missed instant, with `missedCount`.
    #[default]
    RunOnce,
    /// One `skipped` run records them.
    Skip,
}

/// The original's `catchUp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum CatchUp {
    /// Same as `missed: "run-once"`.
    Once,
    /// Same as `missed: "skip"`.
    Skip,
}

/// A fire while the previous run still goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// Record the fire as `skipped` (`overlap`).
    #[default]
    Skip,
    /// Keep one waiting run, started when the previous one ends.
    Queue,
}

/// A run found `running` after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum OnInterrupted {
    /// Mark it `interrupted` and report it; never run it again.
    #[default]
    Report,
    /// Exec schedules only: run the instant again once.
    Rerun,
}

/// Limits of one run.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleBudget {
    /// US dollars of model calls one run may spend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Seconds one run may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<u64>,
}

/// The state of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleState {
    /// Fires when due.
    Active,
    /// Kept but does not fire until resumed.
    Paused,
    /// A one-off that fired.
    Done,
    /// Cancelled; kept for its history.
    Cancelled,
}

impl ScheduleState {
    /// The word stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Done => "done",
            Self::Cancelled => "cancelled",
        }
    }

    /// The state a word names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => Self::Active,
            "paused" => Self::Paused,
            "done" => Self::Done,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

/// The status of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Claimed by a gateway, not started yet (or waiting behind a running one).
    Claimed,
    /// Started: the session was created or the exec sent.
    Running,
    /// Finished well.
    Ok,
    /// A model error, an exit code other than 0, a hook block.
    Failed,
    /// Needed an approval (denied at once: runs are unattended) or was denied.
    Blocked,
    /// Stopped by a budget.
    BudgetExhausted,
    /// Cut off by a crash; reported, not run again.
    Interrupted,
    /// Not run (missed, too late, or overlapping a run still going).
    Skipped,
}

impl RunStatus {
    /// The word stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Running => "running",
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Blocked => "blocked",
            Self::BudgetExhausted => "budget_exhausted",
            Self::Interrupted => "interrupted",
            Self::Skipped => "skipped",
        }
    }

    /// The status a word names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "claimed" => Self::Claimed,
            "running" => Self::Running,
            "ok" => Self::Ok,
            "failed" => Self::Failed,
            "blocked" => Self::Blocked,
            "budget_exhausted" => Self::BudgetExhausted,
            "interrupted" => Self::Interrupted,
            "skipped" => Self::Skipped,
            _ => return None,
        })
    }

    /// Whether the run has ended (anything but `claimed` and `running`).
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Claimed | Self::Running)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A schedule as listed and shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleView {
    /// The config key, or `sch_` and 10 base32 characters.
    pub id: String,
    /// The agent it runs as.
    pub agent: String,
    /// `config`, a user, or `agent:<name>`.
    pub owner: String,
    /// Who created it (the principal, or the exec and session of an agent).
    pub created_by: String,
    /// Its state.
    pub state: ScheduleState,
    /// What it is.
    pub spec: ScheduleSpec,
    /// The next instant it fires, Unix ms (UTC); `None` when it will not fire.
    pub next_fire_at: Option<i64>,
    /// The policy version when it was made.
    pub policy_version: Option<String>,
    /// Its latest run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<ScheduleRun>,
}

/// One run of a schedule (one fire instant), as its history shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleRun {
    /// `run_` and 16 hex digits.
    pub id: String,
    /// The schedule.
    pub schedule_id: String,
    /// The instant it is for, Unix ms (UTC); unique per schedule.
    pub fire_at: i64,
    /// Earlier instants this run stands for (coalesced missed fires).
    pub missed_count: u32,
    /// Its status.
    pub status: RunStatus,
    /// The boot id of the gateway that claimed it.
    pub claimed_by: String,
    /// Unix ms when it started.
    pub started_at: Option<i64>,
    /// Unix ms when it ended.
    pub finished_at: Option<i64>,
    /// The session a prompt run used.
    pub session_id: Option<String>,
    /// The exec an exec run ran as.
    pub exec_id: Option<String>,
    /// Millionths of a US dollar its model calls cost.
    pub cost_micros: i64,
    /// The answer or output, shortened.
    pub summary: Option<String>,
    /// Why it was not `ok`.
    pub error: Option<String>,
}

/// Who makes a schedule: its `owner` and `created_by`, set by the surface that takes the
/// request from what it knows of the caller (never from the request's payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleAuthor {
    /// `config`, a user (`telegram:42`, `api`), or `agent:<name>`.
    pub owner: String,
    /// The principal, or `exec:<id> session:<key>` for an agent.
    pub created_by: String,
}

impl ScheduleAuthor {
    /// A schedule made by `principal` through a channel, the API or the embedder.
    pub fn principal(principal: &crate::principal::Principal) -> Self {
        use crate::principal::Principal;
        let who = match principal {
            Principal::Unverified => "unverified".to_string(),
            Principal::Sandbox => "sandbox".to_string(),
            Principal::User { channel, id } => format!("{channel}:{id}"),
            Principal::ApiToken => "api".to_string(),
            Principal::Embedder => "embedder".to_string(),
            Principal::Person { name, .. } => name.clone(),
        };
        Self {
            owner: who.clone(),
            created_by: who,
        }
    }

    /// A schedule an agent made for itself, from the exec and session of its call.
    pub fn agent(agent: &str, exec: Option<&str>, session: Option<&str>) -> Self {
        let mut by = Vec::new();
        if let Some(e) = exec {
            by.push(format!("exec:{e}"));
        }
        if let Some(s) = session {
            by.push(format!("session:{s}"));
        }
        if by.is_empty() {
            by.push(format!("agent:{agent}"));
        }
        Self {
            owner: format!("agent:{agent}"),
            created_by: by.join(" "),
        }
    }
}

/// What the schedule engine announces on the gateway's event stream (delivery
/// `"events"`): `{"type": "schedule_run_finished", "scheduleId": …, "agent": …, "run": …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ScheduleEvent {
    /// A run ended (any final status).
    ScheduleRunFinished {
        /// The schedule.
        #[serde(rename = "scheduleId")]
        schedule_id: String,
        /// Its agent.
        agent: String,
        /// The run as stored.
        run: ScheduleRun,
    },
}
