//! [`ScheduleStore`] on PostgreSQL: the `schedules` and `schedule_runs` tables. A claim
//! locks the schedule row and inserts the run under `UNIQUE(schedule_id, fire_at)`, so
//! of two gateways claiming one instant exactly one gets it; a finish writes the outcome
//! and its outbox items in one transaction.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row as _;

use super::{corrupt, enqueue, now_ms, Fail, PostgresStore};
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

impl PostgresStore {
    fn schedule_from_row(&self, row: &PgRow) -> Result<ScheduleRecord, Fail> {
        let id: String = row.try_get(0)?;
        let state: String = row.try_get(4)?;
        let spec: String = row.try_get(6)?;
        let state = ScheduleState::parse(&state).ok_or_else(|| {
            Fail::Store(corrupt(
                &self.name,
                format!("schedule {id} has an unknown state '{state}'"),
            ))
        })?;
        let spec: ScheduleSpec = serde_json::from_str(&spec).map_err(|e| {
            Fail::Store(corrupt(
                &self.name,
                format!("the definition of schedule {id} is not valid: {e}"),
            ))
        })?;
        Ok(ScheduleRecord {
            id,
            owner: row.try_get(1)?,
            created_by: row.try_get(2)?,
            policy_version: row.try_get(3)?,
            state,
            next_fire_at: row.try_get(5)?,
            spec,
            created: row.try_get(7)?,
            updated: row.try_get(8)?,
        })
    }

    fn run_from_row(&self, row: &PgRow) -> Result<ScheduleRun, Fail> {
        let id: String = row.try_get(0)?;
        let status: String = row.try_get(4)?;
        let missed: i64 = row.try_get(3)?;
        let status = RunStatus::parse(&status).ok_or_else(|| {
            Fail::Store(corrupt(
                &self.name,
                format!("schedule run {id} has an unknown status '{status}'"),
            ))
        })?;
        Ok(ScheduleRun {
            id,
            schedule_id: row.try_get(1)?,
            fire_at: row.try_get(2)?,
            missed_count: u32::try_from(missed).unwrap_or(u32::MAX),
            status,
            claimed_by: row.try_get(5)?,
            started_at: row.try_get(6)?,
            finished_at: row.try_get(7)?,
            session_id: row.try_get(8)?,
            exec_id: row.try_get(9)?,
            cost_micros: row.try_get(10)?,
            summary: row.try_get(11)?,
            error: row.try_get(12)?,
        })
    }

    async fn load_runs(
        &self,
        sql: String,
        bind: Option<(&str, i64)>,
    ) -> Result<Vec<ScheduleRun>, StoreError> {
        let r = async {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            if let Some((id, limit)) = bind {
                q = q.bind(id.to_string()).bind(limit);
            }
            let rows = q.fetch_all(&self.pool).await?;
            rows.iter().map(|r| self.run_from_row(r)).collect()
        }
        .await;
        self.finish(r)
    }
}

#[async_trait]
impl ScheduleStore for PostgresStore {
    async fn put_schedule(&self, record: ScheduleRecord) -> Result<(), StoreError> {
        let spec = &record.spec;
        let (kind, payload) = match (&spec.prompt, &spec.exec) {
            (_, Some(cmd)) => ("exec", cmd.clone()),
            (Some(p), None) => ("prompt", p.clone()),
            (None, None) => ("prompt", String::new()),
        };
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Invalid {
            message: e.to_string(),
        })?;
        sqlx::query(
            "INSERT INTO schedules (id, agent, owner, spec, tz, kind, payload, session_mode,
                 deliver, missed, overlap, budget, tools, state, next_fire_at,
                 policy_version, created_by, created, updated)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 $17, $18, $19)
             ON CONFLICT (id) DO UPDATE SET agent = EXCLUDED.agent, owner = EXCLUDED.owner,
                 spec = EXCLUDED.spec, tz = EXCLUDED.tz, kind = EXCLUDED.kind,
                 payload = EXCLUDED.payload, session_mode = EXCLUDED.session_mode,
                 deliver = EXCLUDED.deliver, missed = EXCLUDED.missed,
                 overlap = EXCLUDED.overlap, budget = EXCLUDED.budget,
                 tools = EXCLUDED.tools, state = EXCLUDED.state,
                 next_fire_at = EXCLUDED.next_fire_at,
                 policy_version = EXCLUDED.policy_version,
                 created_by = EXCLUDED.created_by, updated = EXCLUDED.updated",
        )
        .bind(&record.id)
        .bind(&spec.agent)
        .bind(&record.owner)
        .bind(spec_json)
        .bind(&spec.tz)
        .bind(kind)
        .bind(payload)
        .bind(spec.session.clone().unwrap_or_else(|| "new".into()))
        .bind(json_or_null(&spec.deliver))
        .bind(word(&spec.missed_policy()))
        .bind(word(&spec.overlap_policy()))
        .bind(json_or_null(&spec.budget))
        .bind(json_or_null(&spec.tools))
        .bind(record.state.as_str())
        .bind(record.next_fire_at)
        .bind(&record.policy_version)
        .bind(&record.created_by)
        .bind(record.created)
        .bind(record.updated)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn get_schedule(&self, id: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        let r = async {
            let sql = format!("{SCHEDULE_SELECT} WHERE id = $1");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
            row.map(|r| self.schedule_from_row(&r)).transpose()
        }
        .await;
        self.finish(r)
    }

    async fn list_schedules(&self, agent: Option<&str>) -> Result<Vec<ScheduleRecord>, StoreError> {
        let r = async {
            let sql = format!("{SCHEDULE_SELECT} WHERE $1::text IS NULL OR agent = $1 ORDER BY id");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(agent)
                .fetch_all(&self.pool)
                .await?;
            rows.iter().map(|r| self.schedule_from_row(r)).collect()
        }
        .await;
        self.finish(r)
    }

    async fn set_schedule_state(
        &self,
        id: &str,
        state: ScheduleState,
        next_fire_at: Option<i64>,
    ) -> Result<(), StoreError> {
        let n = sqlx::query(
            "UPDATE schedules SET state = $2, next_fire_at = $3, updated = $4 WHERE id = $1",
        )
        .bind(id)
        .bind(state.as_str())
        .bind(next_fire_at)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?
        .rows_affected();
        if n == 0 {
            return Err(StoreError::NotFound {
                what: "schedule",
                id: id.to_string(),
            });
        }
        Ok(())
    }

    async fn claim_run(&self, claim: Claim) -> Result<Option<ScheduleRun>, StoreError> {
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM schedules WHERE id = $1 FOR UPDATE")
                    .bind(&claim.schedule_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if state.as_deref() != Some(ScheduleState::Active.as_str()) {
                return Ok(None);
            }
            let skipped = claim.status == RunStatus::Skipped;
            let inserted = sqlx::query(
                "INSERT INTO schedule_runs (id, schedule_id, fire_at, missed_count, status,
                     claimed_by, finished_at, error)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (schedule_id, fire_at) DO NOTHING",
            )
            .bind(&claim.run_id)
            .bind(&claim.schedule_id)
            .bind(claim.fire_at)
            .bind(i64::from(claim.missed_count))
            .bind(claim.status.as_str())
            .bind(&claim.claimed_by)
            .bind(skipped.then_some(claim.now))
            .bind(&claim.error)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 0 {
                // Claimed before: only a next fire stuck at or before it moves on.
                sqlx::query(
                    "UPDATE schedules SET next_fire_at = $2, updated = $3
                     WHERE id = $1 AND next_fire_at IS NOT NULL AND next_fire_at <= $4",
                )
                .bind(&claim.schedule_id)
                .bind(claim.next_fire_at)
                .bind(claim.now)
                .bind(claim.fire_at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                return Ok(None);
            }
            let state = match claim.next_fire_at {
                Some(_) => ScheduleState::Active,
                None => ScheduleState::Done,
            };
            sqlx::query(
                "UPDATE schedules SET next_fire_at = $2, state = $3, updated = $4 WHERE id = $1",
            )
            .bind(&claim.schedule_id)
            .bind(claim.next_fire_at)
            .bind(state.as_str())
            .bind(claim.now)
            .execute(&mut *tx)
            .await?;
            crate::schedule::failpoint("schedule.before_claim_commit");
            let sql = format!("{RUN_SELECT} WHERE id = $1");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(&claim.run_id)
                .fetch_optional(&mut *tx)
                .await?;
            let run = row.map(|r| self.run_from_row(&r)).transpose()?;
            tx.commit().await?;
            Ok(run)
        })
    }

    async fn start_run(&self, run_id: &str, started_at: i64) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE schedule_runs SET status = 'running', started_at = $2
             WHERE id = $1 AND status = 'claimed'",
        )
        .bind(run_id)
        .bind(started_at)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?
        .rows_affected();
        Ok(n == 1)
    }

    async fn rerun_run(
        &self,
        run_id: &str,
        boot_id: &str,
        started_at: i64,
    ) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE schedule_runs SET claimed_by = $2, started_at = $3
             WHERE id = $1 AND status = 'running' AND NOT starts_with(claimed_by, $4)",
        )
        .bind(run_id)
        .bind(format!("{RERUN_PREFIX}{boot_id}"))
        .bind(started_at)
        .bind(RERUN_PREFIX)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?
        .rows_affected();
        Ok(n == 1)
    }

    async fn finish_run(&self, run_id: &str, finish: RunFinish) -> Result<bool, StoreError> {
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            let n = sqlx::query(
                "UPDATE schedule_runs SET status = $2, finished_at = $3, session_id = $4,
                     exec_id = $5, cost_micros = $6, summary = $7, error = $8
                 WHERE id = $1 AND status IN ('claimed', 'running')",
            )
            .bind(run_id)
            .bind(finish.status.as_str())
            .bind(finish.finished_at)
            .bind(&finish.session_id)
            .bind(&finish.exec_id)
            .bind(finish.cost_micros)
            .bind(&finish.summary)
            .bind(&finish.error)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Ok(false);
            }
            let now = now_ms();
            for (channel, payload) in &finish.deliveries {
                enqueue(&mut *tx, channel, &payload.to_string(), now).await?;
            }
            tx.commit().await?;
            Ok(true)
        })
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<ScheduleRun>, StoreError> {
        let r = async {
            let sql = format!("{RUN_SELECT} WHERE id = $1");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await?;
            row.map(|r| self.run_from_row(&r)).transpose()
        }
        .await;
        self.finish(r)
    }

    async fn schedule_runs(
        &self,
        schedule_id: &str,
        limit: usize,
    ) -> Result<Vec<ScheduleRun>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = format!(
            "{RUN_SELECT} WHERE schedule_id = $1 ORDER BY fire_at DESC, rowid DESC LIMIT $2"
        );
        self.load_runs(sql, Some((schedule_id, limit))).await
    }

    async fn open_runs(&self) -> Result<Vec<ScheduleRun>, StoreError> {
        let sql =
            format!("{RUN_SELECT} WHERE status IN ('claimed', 'running') ORDER BY fire_at, rowid");
        self.load_runs(sql, None).await
    }
}
