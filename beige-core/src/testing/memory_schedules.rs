//! [`ScheduleStore`] in memory, with the semantics of the SQLite tables: one run per
//! `(schedule, fire_at)`, a claim that inserts the run and moves `next_fire_at` in one
//! step, a finish that writes the outcome and its outbox items in one step.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::MemoryStore;
use crate::store::{
    Claim, RunFinish, RunStatus, ScheduleRecord, ScheduleRun, ScheduleState, ScheduleStore,
    StoreError,
};

/// The schedules part of the state.
#[derive(Default)]
pub(super) struct Schedules {
    by_id: BTreeMap<String, ScheduleRecord>,
    /// Runs by id, with their insertion order (SQLite's rowid).
    runs: BTreeMap<String, (u64, ScheduleRun)>,
    rows: u64,
}

impl Schedules {
    fn sorted(&self, mut keep: impl FnMut(&ScheduleRun) -> bool) -> Vec<ScheduleRun> {
        let mut runs: Vec<&(u64, ScheduleRun)> =
            self.runs.values().filter(|(_, r)| keep(r)).collect();
        runs.sort_by_key(|(row, r)| (r.fire_at, *row));
        runs.into_iter().map(|(_, r)| r.clone()).collect()
    }
}

#[async_trait]
impl ScheduleStore for MemoryStore {
    async fn put_schedule(&self, record: ScheduleRecord) -> Result<(), StoreError> {
        let mut state = self.lock();
        let s = &mut state.schedules.by_id;
        let created = s.get(&record.id).map(|r| r.created);
        let mut record = record;
        if let Some(created) = created {
            record.created = created;
        }
        s.insert(record.id.clone(), record);
        Ok(())
    }

    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        Ok(self.lock().schedules.by_id.get(id).cloned())
    }

    async fn list_schedules(&self, agent: Option<&str>) -> Result<Vec<ScheduleRecord>, StoreError> {
        Ok(self
            .lock()
            .schedules
            .by_id
            .values()
            .filter(|r| agent.is_none_or(|a| r.spec.agent == a))
            .cloned()
            .collect())
    }

    async fn set_schedule_state(
        &self,
        id: &str,
        state: ScheduleState,
        next_fire_at: Option<i64>,
    ) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let Some(r) = guard.schedules.by_id.get_mut(id) else {
            return Err(StoreError::NotFound {
                what: "schedule",
                id: id.to_string(),
            });
        };
        r.state = state;
        r.next_fire_at = next_fire_at;
        r.updated = crate::store::now_ms();
        Ok(())
    }

    async fn claim_run(&self, claim: Claim) -> Result<Option<ScheduleRun>, StoreError> {
        let mut guard = self.lock();
        let s = &mut guard.schedules;
        match s.by_id.get(&claim.schedule_id) {
            Some(r) if r.state == ScheduleState::Active => {}
            _ => return Ok(None),
        }
        let taken = s
            .runs
            .values()
            .any(|(_, r)| r.schedule_id == claim.schedule_id && r.fire_at == claim.fire_at);
        if taken || s.runs.contains_key(&claim.run_id) {
            if let Some(r) = s.by_id.get_mut(&claim.schedule_id) {
                if r.next_fire_at.is_some_and(|n| n <= claim.fire_at) {
                    r.next_fire_at = claim.next_fire_at;
                    r.updated = claim.now;
                }
            }
            return Ok(None);
        }
        let run = ScheduleRun {
            id: claim.run_id.clone(),
            schedule_id: claim.schedule_id.clone(),
            fire_at: claim.fire_at,
            missed_count: claim.missed_count,
            status: claim.status,
            claimed_by: claim.claimed_by.clone(),
            started_at: None,
            finished_at: (claim.status == RunStatus::Skipped).then_some(claim.now),
            session_id: None,
            exec_id: None,
            cost_micros: 0,
            summary: None,
            error: claim.error.clone(),
        };
        s.rows += 1;
        let row = s.rows;
        s.runs.insert(claim.run_id.clone(), (row, run.clone()));
        if let Some(r) = s.by_id.get_mut(&claim.schedule_id) {
            r.next_fire_at = claim.next_fire_at;
            r.state = match claim.next_fire_at {
                Some(_) => ScheduleState::Active,
                None => ScheduleState::Done,
            };
            r.updated = claim.now;
        }
        Ok(Some(run))
    }

    async fn start_run(&self, run_id: &str, started_at: i64) -> Result<bool, StoreError> {
        let mut guard = self.lock();
        match guard.schedules.runs.get_mut(run_id) {
            Some((_, r)) if r.status == RunStatus::Claimed => {
                r.status = RunStatus::Running;
                r.started_at = Some(started_at);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn rerun_run(
        &self,
        run_id: &str,
        boot_id: &str,
        started_at: i64,
    ) -> Result<bool, StoreError> {
        let mut guard = self.lock();
        match guard.schedules.runs.get_mut(run_id) {
            Some((_, r))
                if r.status == RunStatus::Running
                    && !r.claimed_by.starts_with(crate::store::RERUN_PREFIX) =>
            {
                r.claimed_by = format!("{}{boot_id}", crate::store::RERUN_PREFIX);
                r.started_at = Some(started_at);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn finish_run(&self, run_id: &str, finish: RunFinish) -> Result<bool, StoreError> {
        let mut guard = self.lock();
        match guard.schedules.runs.get_mut(run_id) {
            Some((_, r)) if !r.status.is_final() => {
                r.status = finish.status;
                r.finished_at = Some(finish.finished_at);
                r.session_id = finish.session_id;
                r.exec_id = finish.exec_id;
                r.cost_micros = finish.cost_micros;
                r.summary = finish.summary;
                r.error = finish.error;
            }
            _ => return Ok(false),
        }
        for (channel, payload) in finish.deliveries {
            guard.enqueue(&channel, payload);
        }
        Ok(true)
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<ScheduleRun>, StoreError> {
        Ok(self
            .lock()
            .schedules
            .runs
            .get(run_id)
            .map(|(_, r)| r.clone()))
    }

    async fn schedule_runs(
        &self,
        schedule_id: &str,
        limit: usize,
    ) -> Result<Vec<ScheduleRun>, StoreError> {
        let mut runs = self
            .lock()
            .schedules
            .sorted(|r| r.schedule_id == schedule_id);
        runs.reverse();
        runs.truncate(limit);
        Ok(runs)
    }

    async fn open_runs(&self) -> Result<Vec<ScheduleRun>, StoreError> {
        Ok(self.lock().schedules.sorted(|r| !r.status.is_final()))
    }
}
