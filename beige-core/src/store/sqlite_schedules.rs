//! [`ScheduleStore`] on SQLite: the `schedules` and `schedule_runs` tables. A claim is one
//! `BEGIN IMMEDIATE` transaction (insert the run, move `next_fire_at`); a finish writes
//! the outcome and its outbox items in one transaction.

use std::path::Path;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{corrupt, now_ms, Fail, SqliteStore};
use crate::store::schedule::{
    json_or_null, word, Claim, RunFinish, RunStatus, ScheduleRecord, ScheduleRun, ScheduleSpec,
    ScheduleState, ScheduleStore, RERUN_PREFIX,
};
use crate::store::StoreError;

const SCHEDULE_SELECT: &str =
    "SELECT id, owner, created_by, policy_version, state, next_fire_at, spec, created, updated
     FROM schedules";

const RUN_SELECT: &str = "SELECT id, schedule_id, fire_at, missed_count, status, claimed_by,
            started_at, finished_at, session_id, exec_id, cost_micros, summary, error
     FROM schedule_runs";

fn schedule_from_row(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<(ScheduleRecordRaw, String, String)> {
    Ok((
        ScheduleRecordRaw {
            id: row.get(0)?,
            owner: row.get(1)?,
            created_by: row.get(2)?,
            policy_version: row.get(3)?,
            next_fire_at: row.get(5)?,
            created: row.get(7)?,
            updated: row.get(8)?,
        },
        row.get(4)?,
        row.get(6)?,
    ))
}

struct ScheduleRecordRaw {
    id: String,
    owner: String,
    created_by: String,
    policy_version: Option<String>,
    next_fire_at: Option<i64>,
    created: i64,
    updated: i64,
}

fn finish_schedule(
    path: &Path,
    (raw, state, spec): (ScheduleRecordRaw, String, String),
) -> Result<ScheduleRecord, Fail> {
    let state = ScheduleState::parse(&state).ok_or_else(|| {
        Fail::Store(corrupt(
            path,
            format!("schedule {} has an unknown state '{state}'", raw.id),
        ))
    })?;
    let spec: ScheduleSpec = serde_json::from_str(&spec).map_err(|e| {
        Fail::Store(corrupt(
            path,
            format!("the definition of schedule {} is not valid: {e}", raw.id),
        ))
    })?;
    Ok(ScheduleRecord {
        id: raw.id,
        owner: raw.owner,
        created_by: raw.created_by,
        policy_version: raw.policy_version,
        state,
        next_fire_at: raw.next_fire_at,
        spec,
        created: raw.created,
        updated: raw.updated,
    })
}

fn run_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(ScheduleRun, String)> {
    let missed: i64 = row.get(3)?;
    Ok((
        ScheduleRun {
            id: row.get(0)?,
            schedule_id: row.get(1)?,
            fire_at: row.get(2)?,
            missed_count: u32::try_from(missed).unwrap_or(u32::MAX),
            status: RunStatus::Claimed,
            claimed_by: row.get(5)?,
            started_at: row.get(6)?,
            finished_at: row.get(7)?,
            session_id: row.get(8)?,
            exec_id: row.get(9)?,
            cost_micros: row.get(10)?,
            summary: row.get(11)?,
            error: row.get(12)?,
        },
        row.get(4)?,
    ))
}

fn finish_run_row(
    path: &Path,
    (mut run, status): (ScheduleRun, String),
) -> Result<ScheduleRun, Fail> {
    run.status = RunStatus::parse(&status).ok_or_else(|| {
        Fail::Store(corrupt(
            path,
            format!("schedule run {} has an unknown status '{status}'", run.id),
        ))
    })?;
    Ok(run)
}

fn load_run(conn: &Connection, path: &Path, id: &str) -> Result<Option<ScheduleRun>, Fail> {
    let sql = format!("{RUN_SELECT} WHERE id = ?1");
    let raw = conn
        .prepare_cached(&sql)?
        .query_row([id], run_from_row)
        .optional()?;
    raw.map(|r| finish_run_row(path, r)).transpose()
}

fn load_runs(
    conn: &Connection,
    path: &Path,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<ScheduleRun>, Fail> {
    let raw = conn
        .prepare_cached(sql)?
        .query_map(params, run_from_row)?
        .collect::<Result<Vec<_>, _>>()?;
    raw.into_iter().map(|r| finish_run_row(path, r)).collect()
}

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn put_schedule(&self, record: ScheduleRecord) -> Result<(), StoreError> {
        self.run(move |conn, _| {
            let spec = &record.spec;
            let (kind, payload) = match (&spec.prompt, &spec.exec) {
                (_, Some(cmd)) => ("exec", cmd.clone()),
                (Some(p), None) => ("prompt", p.clone()),
                (None, None) => ("prompt", String::new()),
            };
            let spec_json = serde_json::to_string(spec).map_err(|e| {
                Fail::Store(StoreError::Invalid {
                    message: e.to_string(),
                })
            })?;
            conn.prepare_cached(
                "INSERT INTO schedules (id, agent, owner, spec, tz, kind, payload, session_mode,
                     deliver, missed, overlap, budget, tools, state, next_fire_at,
                     policy_version, created_by, created, updated)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                     ?17, ?18, ?19)
                 ON CONFLICT(id) DO UPDATE SET agent = excluded.agent, owner = excluded.owner,
                     spec = excluded.spec, tz = excluded.tz, kind = excluded.kind,
                     payload = excluded.payload, session_mode = excluded.session_mode,
                     deliver = excluded.deliver, missed = excluded.missed,
                     overlap = excluded.overlap, budget = excluded.budget,
                     tools = excluded.tools, state = excluded.state,
                     next_fire_at = excluded.next_fire_at,
                     policy_version = excluded.policy_version,
                     created_by = excluded.created_by, updated = excluded.updated",
            )?
            .execute(params![
                record.id,
                spec.agent,
                record.owner,
                spec_json,
                spec.tz,
                kind,
                payload,
                spec.session.clone().unwrap_or_else(|| "new".into()),
                json_or_null(&spec.deliver),
                word(&spec.missed_policy()),
                word(&spec.overlap_policy()),
                json_or_null(&spec.budget),
                json_or_null(&spec.tools),
                record.state.as_str(),
                record.next_fire_at,
                record.policy_version,
                record.created_by,
                record.created,
                record.updated,
            ])?;
            Ok(())
        })
        .await
    }

    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        let id = id.to_string();
        self.run(move |conn, path| {
            let sql = format!("{SCHEDULE_SELECT} WHERE id = ?1");
            let raw = conn
                .prepare_cached(&sql)?
                .query_row([&id], schedule_from_row)
                .optional()?;
            raw.map(|r| finish_schedule(path, r)).transpose()
        })
        .await
    }

    async fn list_schedules(&self, agent: Option<&str>) -> Result<Vec<ScheduleRecord>, StoreError> {
        let agent = agent.map(str::to_string);
        self.run(move |conn, path| {
            let raw = match &agent {
                Some(a) => {
                    let sql = format!("{SCHEDULE_SELECT} WHERE agent = ?1 ORDER BY id");
                    conn.prepare_cached(&sql)?
                        .query_map([a], schedule_from_row)?
                        .collect::<Result<Vec<_>, _>>()?
                }
                None => {
                    let sql = format!("{SCHEDULE_SELECT} ORDER BY id");
                    conn.prepare_cached(&sql)?
                        .query_map([], schedule_from_row)?
                        .collect::<Result<Vec<_>, _>>()?
                }
            };
            raw.into_iter().map(|r| finish_schedule(path, r)).collect()
        })
        .await
    }

    async fn set_schedule_state(
        &self,
        id: &str,
        state: ScheduleState,
        next_fire_at: Option<i64>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "UPDATE schedules SET state = ?2, next_fire_at = ?3, updated = ?4 WHERE id = ?1",
                )?
                .execute(params![id, state.as_str(), next_fire_at, now_ms()])?;
            if n == 0 {
                return Err(Fail::Store(StoreError::NotFound {
                    what: "schedule",
                    id,
                }));
            }
            Ok(())
        })
        .await
    }

    async fn claim_run(&self, claim: Claim) -> Result<Option<ScheduleRun>, StoreError> {
        self.run(move |conn, path| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let state: Option<String> = tx
                .prepare_cached("SELECT state FROM schedules WHERE id = ?1")?
                .query_row([&claim.schedule_id], |r| r.get(0))
                .optional()?;
            if state.as_deref() != Some(ScheduleState::Active.as_str()) {
                return Ok(None);
            }
            let skipped = claim.status == RunStatus::Skipped;
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO schedule_runs (id, schedule_id, fire_at, missed_count, status,
                         claimed_by, finished_at, error)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT(schedule_id, fire_at) DO NOTHING",
                )?
                .execute(params![
                    claim.run_id,
                    claim.schedule_id,
                    claim.fire_at,
                    i64::from(claim.missed_count),
                    claim.status.as_str(),
                    claim.claimed_by,
                    skipped.then_some(claim.now),
                    claim.error,
                ])?;
            if inserted == 0 {
                // Claimed before: only a next fire stuck at or before it moves on.
                tx.prepare_cached(
                    "UPDATE schedules SET next_fire_at = ?2, updated = ?3
                     WHERE id = ?1 AND next_fire_at IS NOT NULL AND next_fire_at <= ?4",
                )?
                .execute(params![
                    claim.schedule_id,
                    claim.next_fire_at,
                    claim.now,
                    claim.fire_at
                ])?;
                tx.commit()?;
                return Ok(None);
            }
            let state = match claim.next_fire_at {
                Some(_) => ScheduleState::Active,
                None => ScheduleState::Done,
            };
            tx.prepare_cached(
                "UPDATE schedules SET next_fire_at = ?2, state = ?3, updated = ?4 WHERE id = ?1",
            )?
            .execute(params![
                claim.schedule_id,
                claim.next_fire_at,
                state.as_str(),
                claim.now
            ])?;
            crate::schedule::failpoint("schedule.before_claim_commit");
            let run = load_run(&tx, path, &claim.run_id)?;
            tx.commit()?;
            Ok(run)
        })
        .await
    }

    async fn start_run(&self, run_id: &str, started_at: i64) -> Result<bool, StoreError> {
        let run_id = run_id.to_string();
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "UPDATE schedule_runs SET status = 'running', started_at = ?2
                     WHERE id = ?1 AND status = 'claimed'",
                )?
                .execute(params![run_id, started_at])?;
            Ok(n == 1)
        })
        .await
    }

    async fn rerun_run(
        &self,
        run_id: &str,
        boot_id: &str,
        started_at: i64,
    ) -> Result<bool, StoreError> {
        let run_id = run_id.to_string();
        let claimed_by = format!("{RERUN_PREFIX}{boot_id}");
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "UPDATE schedule_runs SET claimed_by = ?2, started_at = ?3
                     WHERE id = ?1 AND status = 'running' AND substr(claimed_by, 1, ?4) <> ?5",
                )?
                .execute(params![
                    run_id,
                    claimed_by,
                    started_at,
                    i64::try_from(RERUN_PREFIX.len()).unwrap_or(i64::MAX),
                    RERUN_PREFIX
                ])?;
            Ok(n == 1)
        })
        .await
    }

    async fn finish_run(&self, run_id: &str, finish: RunFinish) -> Result<bool, StoreError> {
        let run_id = run_id.to_string();
        self.run(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let n = tx
                .prepare_cached(
                    "UPDATE schedule_runs SET status = ?2, finished_at = ?3, session_id = ?4,
                         exec_id = ?5, cost_micros = ?6, summary = ?7, error = ?8
                     WHERE id = ?1 AND status IN ('claimed', 'running')",
                )?
                .execute(params![
                    run_id,
                    finish.status.as_str(),
                    finish.finished_at,
                    finish.session_id,
                    finish.exec_id,
                    finish.cost_micros,
                    finish.summary,
                    finish.error,
                ])?;
            if n == 0 {
                return Ok(false);
            }
            let now = now_ms();
            for (channel, payload) in &finish.deliveries {
                tx.prepare_cached(
                    "INSERT INTO outbox (channel, payload, attempts, next_attempt_at, created)
                     VALUES (?1, ?2, 0, ?3, ?3)",
                )?
                .execute(params![channel, payload.to_string(), now])?;
            }
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<ScheduleRun>, StoreError> {
        let run_id = run_id.to_string();
        self.run(move |conn, path| load_run(conn, path, &run_id))
            .await
    }

    async fn schedule_runs(
        &self,
        schedule_id: &str,
        limit: usize,
    ) -> Result<Vec<ScheduleRun>, StoreError> {
        let schedule_id = schedule_id.to_string();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, path| {
            let sql = format!(
                "{RUN_SELECT} WHERE schedule_id = ?1 ORDER BY fire_at DESC, rowid DESC LIMIT ?2"
            );
            load_runs(conn, path, &sql, params![schedule_id, limit])
        })
        .await
    }

    async fn open_runs(&self) -> Result<Vec<ScheduleRun>, StoreError> {
        self.run(move |conn, path| {
            let sql = format!(
                "{RUN_SELECT} WHERE status IN ('claimed', 'running') ORDER BY fire_at, rowid"
            );
            load_runs(conn, path, &sql, [])
        })
        .await
    }
}
