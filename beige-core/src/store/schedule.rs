//! [`ScheduleStore`]: what the schedule engine keeps across restarts — the schedules
//! themselves and one [`ScheduleRun`] row per fire instant, unique per
//! `(schedule, fire_at)`.
//!
//! Owns the transitions that make a fire happen exactly once: [`claim`](ScheduleStore::claim_run)
//! inserts the run and moves `next_fire_at` in one transaction (so a restarted gateway
//! cannot claim the same instant again), [`start`](ScheduleStore::start_run) moves
//! `claimed` to `running` and is committed before anything runs, and
//! [`finish`](ScheduleStore::finish_run) writes the outcome and enqueues its delivery in
//! one transaction (so a result is sent once, after a crash too). When to fire, what to
//! run and what to do after a crash is the engine's (`crate::schedule`).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use super::StoreError;
pub use beige_client::schedules::{
    RunStatus, ScheduleRun, ScheduleSpec, ScheduleState, ScheduleView,
};

/// One stored schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRecord {
    /// The config key, or `sch_` and 10 base32 characters.
    pub id: String,
    /// `config`, a user, or `agent:<name>`.
    pub owner: String,
    /// Who created it.
    pub created_by: String,
    /// The policy version when it was made.
    pub policy_version: Option<String>,
    /// Its state.
    pub state: ScheduleState,
    /// The next instant it fires (Unix ms, UTC); `None` when it will not.
    pub next_fire_at: Option<i64>,
    /// What it is (agent, when, what, where to).
    pub spec: ScheduleSpec,
    /// Unix ms.
    pub created: i64,
    /// Unix ms.
    pub updated: i64,
}

/// A claim of one fire instant ([`ScheduleStore::claim_run`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The run's id (`run_` and 16 hex digits).
    pub run_id: String,
    /// The schedule.
    pub schedule_id: String,
    /// The instant (Unix ms, UTC).
    pub fire_at: i64,
    /// Earlier instants it stands for.
    pub missed_count: u32,
    /// The boot id of the claiming gateway.
    pub claimed_by: String,
    /// `next_fire_at` after the claim; `None` makes the schedule `done` (a one-off).
    pub next_fire_at: Option<i64>,
    /// [`RunStatus::Claimed`] to run it, or [`RunStatus::Skipped`] to record a fire that
    /// does not run (missed, too late, overlapping).
    pub status: RunStatus,
    /// Why a skipped fire was skipped.
    pub error: Option<String>,
    /// Unix ms now (the `finished_at` of a skipped run).
    pub now: i64,
}

/// The end of a run ([`ScheduleStore::finish_run`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunFinish {
    /// A final status.
    pub status: RunStatus,
    /// Unix ms.
    pub finished_at: i64,
    /// The session a prompt run used.
    pub session_id: Option<String>,
    /// The exec an exec run ran as.
    pub exec_id: Option<String>,
    /// Millionths of a US dollar.
    pub cost_micros: i64,
    /// The answer or output, shortened.
    pub summary: Option<String>,
    /// Why it was not `ok`.
    pub error: Option<String>,
    /// Outbox items `(channel, payload)` enqueued in the same transaction.
    pub deliveries: Vec<(String, serde_json::Value)>,
}

/// How `claimed_by` of a run rerun after an interruption begins (`rerun:<boot id>`, see
/// [`ScheduleStore::rerun_run`]): such a run is never rerun again.
pub const RERUN_PREFIX: &str = "rerun:";

/// Schedules and their runs (11 methods). Every method is one atomic operation.
#[async_trait]
pub trait ScheduleStore: Send + Sync + Debug {
    /// Insert the schedule, or replace the one with its id.
    async fn put_schedule(&self, record: ScheduleRecord) -> Result<(), StoreError>;

    /// The schedule with this id.
    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>, StoreError>;

    /// Every schedule (of `agent` only, when given), by id.
    async fn list_schedules(&self, agent: Option<&str>) -> Result<Vec<ScheduleRecord>, StoreError>;

    /// Set the state and next fire of a schedule; [`StoreError::NotFound`] when there is
    /// none.
    async fn set_schedule_state(
        &self,
        id: &str,
        state: ScheduleState,
        next_fire_at: Option<i64>,
    ) -> Result<(), StoreError>;

    /// In one (`BEGIN IMMEDIATE`) transaction: insert the run of `claim.fire_at` and move
    /// the schedule's `next_fire_at` to `claim.next_fire_at` (`None`: the schedule is
    /// `done`). `Ok(None)` when that instant already has a run (claimed before, by this
    /// or another gateway) — then only a `next_fire_at` not past the instant is moved —
    /// or when the schedule is missing or not active.
    async fn claim_run(&self, claim: Claim) -> Result<Option<ScheduleRun>, StoreError>;

    /// `claimed` → `running` at `started_at`; `false` when the run is not `claimed`.
    async fn start_run(&self, run_id: &str, started_at: i64) -> Result<bool, StoreError>;

    /// Take over a `running` run cut off by a crash to run it again (`onInterrupted:
    /// "rerun"`): it stays `running`, `claimed_by` becomes [`RERUN_PREFIX`] +
    /// `boot_id` and `started_at` is set. `false` when the run is not `running` or was
    /// rerun before (its `claimed_by` begins with [`RERUN_PREFIX`]): an instant is rerun
    /// once, however often the gateway crashes.
    async fn rerun_run(
        &self,
        run_id: &str,
        boot_id: &str,
        started_at: i64,
    ) -> Result<bool, StoreError>;

    /// In one transaction: a `claimed` or `running` run gets its final status and
    /// summary, and `finish.deliveries` are enqueued. `false` (and nothing enqueued)
    /// when the run has ended already.
    async fn finish_run(&self, run_id: &str, finish: RunFinish) -> Result<bool, StoreError>;

    /// The run with this id.
    async fn get_run(&self, run_id: &str) -> Result<Option<ScheduleRun>, StoreError>;

    /// The latest `limit` runs of a schedule, newest instant first.
    async fn schedule_runs(
        &self,
        schedule_id: &str,
        limit: usize,
    ) -> Result<Vec<ScheduleRun>, StoreError>;

    /// Every run still `claimed` or `running`, oldest instant first: what recovery reads.
    async fn open_runs(&self) -> Result<Vec<ScheduleRun>, StoreError>;
}

macro_rules! forward_schedules {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<S: ScheduleStore + ?Sized> ScheduleStore for $ptr {
            async fn put_schedule(&self, record: ScheduleRecord) -> Result<(), StoreError> {
                (**self).put_schedule(record).await
            }
            async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>, StoreError> {
                (**self).get_schedule(id).await
            }
            async fn list_schedules(
                &self,
                agent: Option<&str>,
            ) -> Result<Vec<ScheduleRecord>, StoreError> {
                (**self).list_schedules(agent).await
            }
            async fn set_schedule_state(
                &self,
                id: &str,
                state: ScheduleState,
                next_fire_at: Option<i64>,
            ) -> Result<(), StoreError> {
                (**self).set_schedule_state(id, state, next_fire_at).await
            }
            async fn claim_run(&self, claim: Claim) -> Result<Option<ScheduleRun>, StoreError> {
                (**self).claim_run(claim).await
            }
            async fn start_run(&self, run_id: &str, started_at: i64) -> Result<bool, StoreError> {
                (**self).start_run(run_id, started_at).await
            }
            async fn rerun_run(
                &self,
                run_id: &str,
                boot_id: &str,
                started_at: i64,
            ) -> Result<bool, StoreError> {
                (**self).rerun_run(run_id, boot_id, started_at).await
            }
            async fn finish_run(&self, run_id: &str, finish: RunFinish) -> Result<bool, StoreError> {
                (**self).finish_run(run_id, finish).await
            }
            async fn get_run(&self, run_id: &str) -> Result<Option<ScheduleRun>, StoreError> {
                (**self).get_run(run_id).await
            }
            async fn schedule_runs(
                &self,
                schedule_id: &str,
                limit: usize,
            ) -> Result<Vec<ScheduleRun>, StoreError> {
                (**self).schedule_runs(schedule_id, limit).await
            }
            async fn open_runs(&self) -> Result<Vec<ScheduleRun>, StoreError> {
                (**self).open_runs().await
            }
        }
    )*};
}

forward_schedules!(Arc<S>, Box<S>);

/// A value as JSON text, or `NULL` (`None`).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(super) fn json_or_null<T: serde::Serialize>(value: &Option<T>) -> Option<String> {
    value.as_ref().and_then(|v| serde_json::to_string(v).ok())
}

/// A word of a serialised enum (`"run-once"` → `run-once`).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(super) fn word<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
