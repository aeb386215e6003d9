//! The schedule engine: the tick task that fires due schedules, recovery after a crash,
//! missed and overlapping fires, running a fire (a prompt through the gateway's own
//! prompt path, an exec through its core-tool path, both unattended and in process),
//! and delivering the result through the outbox.
//!
//! Every fire goes claim → start → run → finish against the [`ScheduleStore`], so an
//! instant is claimed once (the store's unique key), started at most once (`claimed` →
//! `running` is committed before anything runs), and its result is queued for sending in
//! the transaction that finishes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use beige_client::schedules::{
    Deliver, Missed, OnInterrupted, Overlap, RunStatus, ScheduleEvent, ScheduleRun, ScheduleSpec,
    ScheduleState, ScheduleView,
};
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use super::cron::{parse_at, CronSpec};
use super::{failpoint, Clock};
use crate::audit::{AuditDecision, AuditRecord, AuditSink, AuditType, Phase};
use crate::config::Config;
use crate::gateway::{Gateway, LocalGateway};
use crate::store::{
    ChannelState, Claim, RunFinish, ScheduleRecord, ScheduleStore, StoreError, RERUN_PREFIX,
};
use crate::tools::{CoreToolCall, ToolContext, ToolOutcome};

/// Outbox channel of `deliver: "events"` items, drained onto the event stream.
pub(crate) const EVENTS_OUTBOX: &str = "schedule-events";
/// A fire more than this late counts as missed.
const LATE_MS: i64 = 60_000;
/// The tick sleeps at most this long.
const TICK: Duration = Duration::from_secs(1);
/// Characters of an answer or output kept in the run's summary and sent.
const SUMMARY_CHARS: usize = 3_000;
/// How the exec tool's answer begins when the command ran out of its timeout.
const EXEC_TIMED_OUT: &str = "Error: timed out after ";

/// The schedule engine of one gateway process (one boot id).
#[derive(Debug)]
pub(crate) struct Scheduler {
    store: Arc<dyn ScheduleStore>,
    outbox: Arc<dyn ChannelState>,
    clock: Arc<dyn Clock>,
    boot_id: String,
    wake: Notify,
    /// Per schedule: its runs going and waiting to start (for `overlap`).
    in_flight: Mutex<HashMap<String, Flight>>,
    events: broadcast::Sender<ScheduleEvent>,
    /// The `schedules` of the config last synced into the store (JSON).
    synced: Mutex<Option<String>>,
    /// Held while `events` deliveries are published: the tick and a finishing run both
    /// drain, and each item must go out once.
    draining: tokio::sync::Mutex<()>,
}

/// A management call that failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ManageError {
    #[error("no schedule '{0}'; list the schedules with `beige schedule list`")]
    Unknown(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Scheduler {
    pub(crate) fn new(
        store: Arc<dyn ScheduleStore>,
        outbox: Arc<dyn ChannelState>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            store,
            outbox,
            clock,
            boot_id: format!("boot_{:016x}", rand::random::<u64>()),
            wake: Notify::new(),
            in_flight: Mutex::new(HashMap::new()),
            events: broadcast::channel(256).0,
            synced: Mutex::new(None),
            draining: tokio::sync::Mutex::new(()),
        }
    }

    /// Every `schedule_run_finished` from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<ScheduleEvent> {
        self.events.subscribe()
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    // ---- management ----

    /// The view of a stored schedule, with its latest run.
    pub(crate) async fn view(&self, record: ScheduleRecord) -> Result<ScheduleView, ManageError> {
        let last_run = self
            .store
            .schedule_runs(&record.id, 1)
            .await?
            .into_iter()
            .next();
        Ok(ScheduleView {
            id: record.id,
            agent: record.spec.agent.clone(),
            owner: record.owner,
            created_by: record.created_by,
            state: record.state,
            spec: record.spec,
            next_fire_at: record.next_fire_at,
            policy_version: record.policy_version,
            last_run,
        })
    }

    pub(crate) async fn get(&self, id: &str) -> Result<ScheduleRecord, ManageError> {
        self.store
            .get_schedule(id)
            .await?
            .ok_or_else(|| ManageError::Unknown(id.to_string()))
    }

    /// Validate and store a new schedule made outside the config.
    pub(crate) async fn add(
        &self,
        config: &Config,
        spec: ScheduleSpec,
        owner: String,
        created_by: String,
    ) -> Result<ScheduleRecord, ManageError> {
        super::check_spec(config, &spec).map_err(|p| {
            ManageError::Invalid(if p.field.is_empty() {
                p.message
            } else {
                format!("{}: {}", p.field, p.message)
            })
        })?;
        let now = self.now();
        let record = ScheduleRecord {
            id: new_schedule_id(),
            owner,
            created_by,
            policy_version: policy_version(config, &spec.agent),
            state: ScheduleState::Active,
            next_fire_at: first_fire(&spec, now),
            spec,
            created: now,
            updated: now,
        };
        self.store.put_schedule(record.clone()).await?;
        self.wake.notify_one();
        Ok(record)
    }

    pub(crate) async fn pause(&self, id: &str) -> Result<ScheduleRecord, ManageError> {
        let r = self.get(id).await?;
        if matches!(r.state, ScheduleState::Active | ScheduleState::Paused) {
            self.store
                .set_schedule_state(id, ScheduleState::Paused, r.next_fire_at)
                .await?;
        } else {
            return Err(ManageError::Invalid(format!(
                "schedule '{id}' is {} and cannot be paused",
                r.state.as_str()
            )));
        }
        self.get(id).await
    }

    pub(crate) async fn resume(&self, id: &str) -> Result<ScheduleRecord, ManageError> {
        let r = self.get(id).await?;
        if r.state != ScheduleState::Paused && r.state != ScheduleState::Active {
            return Err(ManageError::Invalid(format!(
                "schedule '{id}' is {} and cannot be resumed; create it again",
                r.state.as_str()
            )));
        }
        // Fires missed while paused are not caught up: the next one is after now.
        let next = first_fire(&r.spec, self.now());
        let state = if next.is_some() {
            ScheduleState::Active
        } else {
            ScheduleState::Done
        };
        self.store.set_schedule_state(id, state, next).await?;
        self.wake.notify_one();
        self.get(id).await
    }

    pub(crate) async fn cancel(&self, id: &str) -> Result<ScheduleRecord, ManageError> {
        let r = self.get(id).await?;
        if r.owner == "config" {
            return Err(ManageError::Invalid(format!(
                "schedule '{id}' comes from the config and can only be paused; remove schedules.{id} from the config to delete it"
            )));
        }
        self.store
            .set_schedule_state(id, ScheduleState::Cancelled, None)
            .await?;
        self.get(id).await
    }

    pub(crate) async fn history(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Vec<ScheduleRun>, ManageError> {
        self.get(id).await?;
        Ok(self.store.schedule_runs(id, limit).await?)
    }

    /// Claim an extra run of `id` for now, outside its timetable, and run it.
    pub(crate) async fn run_now(
        self: &Arc<Self>,
        gateway: &LocalGateway,
        id: &str,
    ) -> Result<ScheduleRun, ManageError> {
        let r = self.get(id).await?;
        if r.state != ScheduleState::Active {
            return Err(ManageError::Invalid(format!(
                "schedule '{id}' is {}; resume it first",
                r.state.as_str()
            )));
        }
        let now = self.now();
        let claim = Claim {
            run_id: new_run_id(),
            schedule_id: id.to_string(),
            fire_at: now,
            missed_count: 0,
            claimed_by: self.boot_id.clone(),
            next_fire_at: r.next_fire_at.or(Some(now)),
            status: RunStatus::Claimed,
            error: None,
            now,
        };
        let Some(run) = self.store.claim_run(claim).await? else {
            return Err(ManageError::Invalid(format!(
                "schedule '{id}' has a run for this very instant already; try again"
            )));
        };
        self.audit(gateway, &r, &run, Phase::Claimed, None).await;
        self.spawn_run(gateway.clone(), r, run.clone());
        Ok(run)
    }

    // ---- the tick task ----

    /// Recover, then fire due schedules until `stop`.
    pub(crate) async fn run(self: Arc<Self>, gateway: LocalGateway, stop: CancellationToken) {
        self.sync_config(&gateway).await;
        self.recover(&gateway).await;
        loop {
            self.sync_config(&gateway).await;
            let sleep = match self.tick(&gateway).await {
                Ok(next) => next
                    .map(|n| Duration::from_millis(u64::try_from(n - self.now()).unwrap_or(0)))
                    .unwrap_or(TICK)
                    .min(TICK),
                Err(e) => {
                    tracing::warn!(error = %e, "schedule tick failed; retrying");
                    TICK
                }
            };
            self.drain_events().await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(sleep.max(Duration::from_millis(20))) => {}
            }
        }
    }

    /// Bring the config's schedules into the store: new ones are added, changed ones
    /// replaced (a paused one stays paused), removed ones cancelled.
    async fn sync_config(&self, gateway: &LocalGateway) {
        let config = gateway.config();
        let text = serde_json::to_string(&config.schedules).unwrap_or_default();
        if self
            .synced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            == Some(text.as_str())
        {
            return;
        }
        if let Err(e) = self.sync_config_now(&config).await {
            tracing::warn!(error = %e, "could not store the config's schedules");
            return;
        }
        *self.synced.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }

    async fn sync_config_now(&self, config: &Config) -> Result<(), StoreError> {
        let now = self.now();
        let stored = self.store.list_schedules(None).await?;
        for (id, spec) in &config.schedules {
            let old = stored.iter().find(|r| &r.id == id);
            match old {
                Some(r) if r.spec == *spec && r.state != ScheduleState::Cancelled => continue,
                _ => {}
            }
            let paused = old.is_some_and(|r| r.state == ScheduleState::Paused);
            let next = first_fire(spec, now);
            // A one-off that already ran stays done.
            let done_before =
                old.is_some_and(|r| r.state == ScheduleState::Done && r.spec == *spec);
            let state = if done_before || next.is_none() {
                ScheduleState::Done
            } else if paused {
                ScheduleState::Paused
            } else {
                ScheduleState::Active
            };
            self.store
                .put_schedule(ScheduleRecord {
                    id: id.clone(),
                    owner: "config".into(),
                    created_by: "config".into(),
                    policy_version: policy_version(config, &spec.agent),
                    state,
                    next_fire_at: next,
                    spec: spec.clone(),
                    created: old.map(|r| r.created).unwrap_or(now),
                    updated: now,
                })
                .await?;
        }
        for r in stored.iter().filter(|r| {
            r.owner == "config"
                && !config.schedules.contains_key(&r.id)
                && r.state != ScheduleState::Cancelled
                && is_mine(config, &r.spec.agent)
        }) {
            self.store
                .set_schedule_state(&r.id, ScheduleState::Cancelled, None)
                .await?;
        }
        Ok(())
    }

    /// Runs left open by an earlier boot: `claimed` ones start now (or are skipped when
    /// too late), `running` ones are `interrupted` and reported, not run again.
    async fn recover(self: &Arc<Self>, gateway: &LocalGateway) {
        let open = match self.store.open_runs().await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "cannot read open schedule runs; recovery skipped");
                return;
            }
        };
        let now = self.now();
        let config = gateway.config();
        for run in open.into_iter().filter(|r| r.claimed_by != self.boot_id) {
            let Ok(Some(record)) = self.store.get_schedule(&run.schedule_id).await else {
                continue;
            };
            if !is_mine(&config, &record.spec.agent) {
                continue;
            }
            match run.status {
                RunStatus::Running => {
                    let rerun_before = run.claimed_by.starts_with(RERUN_PREFIX);
                    let rerun = record.spec.on_interrupted == Some(OnInterrupted::Rerun)
                        && record.spec.exec.is_some()
                        && !rerun_before;
                    if rerun {
                        // Once: the run is marked rerun before it runs again, so a crash
                        // during the rerun leaves it `interrupted` on the next start.
                        match self.store.rerun_run(&run.id, &self.boot_id, now).await {
                            Ok(true) => {
                                let mut again = run.clone();
                                again.claimed_by = format!("{RERUN_PREFIX}{}", self.boot_id);
                                again.started_at = Some(now);
                                self.audit(gateway, &record, &again, Phase::Started, None)
                                    .await;
                                self.spawn_body(gateway.clone(), record, again);
                            }
                            Ok(false) => {}
                            Err(e) => {
                                tracing::error!(run = %run.id, error = %e, "could not take over an interrupted run to rerun it");
                            }
                        }
                        continue;
                    }
                    let error = if rerun_before {
                        format!(
                            "the gateway stopped while this run was going again after an interruption ({}); an instant is rerun once only",
                            run.claimed_by
                        )
                    } else {
                        format!(
                            "the gateway stopped while this run was going (boot {}); it was not run again because it may have had effects",
                            run.claimed_by
                        )
                    };
                    self.audit(gateway, &record, &run, Phase::Interrupted, Some(&error))
                        .await;
                    self.finish(
                        gateway,
                        &record,
                        &run,
                        Outcome::failed(RunStatus::Interrupted, error),
                    )
                    .await;
                }
                RunStatus::Claimed => {
                    let late = now - run.fire_at;
                    if late > to_ms(record.spec.max_late()) {
                        let error = format!(
                            "claimed but never started, and now {} s late (over maxLateSeconds {})",
                            late / 1000,
                            record.spec.max_late()
                        );
                        self.audit(gateway, &record, &run, Phase::Skipped, Some(&error))
                            .await;
                        self.finish(
                            gateway,
                            &record,
                            &run,
                            Outcome::failed(RunStatus::Skipped, error),
                        )
                        .await;
                    } else {
                        self.spawn_run(gateway.clone(), record, run);
                    }
                }
                _ => {}
            }
        }
    }

    /// Fire what is due; the earliest next fire.
    async fn tick(self: &Arc<Self>, gateway: &LocalGateway) -> Result<Option<i64>, StoreError> {
        let now = self.now();
        let mut earliest: Option<i64> = None;
        let config = gateway.config();
        for record in self.store.list_schedules(None).await? {
            if record.state != ScheduleState::Active || !is_mine(&config, &record.spec.agent) {
                continue;
            }
            let Some(due) = record.next_fire_at else {
                continue;
            };
            if due > now {
                earliest = Some(earliest.map_or(due, |e| e.min(due)));
                continue;
            }
            self.fire(gateway, record, due, now).await?;
        }
        Ok(earliest)
    }

    /// Claim (or skip) what is due of one schedule.
    async fn fire(
        self: &Arc<Self>,
        gateway: &LocalGateway,
        record: ScheduleRecord,
        due: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        let spec = &record.spec;
        let (latest, count, next) = match &spec.cron {
            Some(expr) => match CronSpec::parse(expr, spec.tz.as_deref()) {
                Ok(cron) => {
                    let (latest, count) = cron.due_between(due - 1, now, 100_000);
                    (latest.unwrap_or(due), count.max(1), cron.next_after(now))
                }
                Err(e) => {
                    tracing::warn!(schedule = %record.id, error = %e, "schedule no longer parses; paused");
                    self.store
                        .set_schedule_state(&record.id, ScheduleState::Paused, None)
                        .await?;
                    return Ok(());
                }
            },
            None => (due, 1, None),
        };
        let late = now - latest;
        let missed = count > 1 || late > LATE_MS;
        let missed_count = if missed { count } else { 0 };
        let mut skip: Option<String> = None;
        if missed && spec.missed_policy() == Missed::Skip {
            skip = Some(format!(
                "missed: {count} fire(s) passed while the gateway was down (missed: skip)"
            ));
        } else if late > to_ms(spec.max_late()) {
            skip = Some(format!(
                "missed: {} s late, over maxLateSeconds {}",
                late / 1000,
                spec.max_late()
            ));
        }
        let flight = self.flight(&record.id);
        let mut queue = false;
        if skip.is_none() && flight.going() > 0 {
            match spec.overlap_policy() {
                Overlap::Queue if !flight.queued => queue = true,
                _ => {
                    skip = Some(
                        "overlap: the previous run was still going (overlap: skip)".to_string(),
                    )
                }
            }
        }
        let claim = Claim {
            run_id: new_run_id(),
            schedule_id: record.id.clone(),
            fire_at: latest,
            missed_count,
            claimed_by: self.boot_id.clone(),
            next_fire_at: next,
            status: if skip.is_some() {
                RunStatus::Skipped
            } else {
                RunStatus::Claimed
            },
            error: skip.clone(),
            now,
        };
        let Some(run) = self.store.claim_run(claim).await? else {
            return Ok(());
        };
        if let Some(reason) = &skip {
            self.audit(gateway, &record, &run, Phase::Skipped, Some(reason))
                .await;
            // The report of a skipped fire.
            self.report_only(gateway, &record, &run).await;
            return Ok(());
        }
        self.audit(gateway, &record, &run, Phase::Claimed, None)
            .await;
        failpoint("schedule.after_claim");
        if queue {
            self.set_queued(&record.id, true);
        }
        self.spawn_run(gateway.clone(), record, run);
        Ok(())
    }

    fn flight(&self, id: &str) -> Flight {
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
            .unwrap_or_default()
    }

    /// Change the flight of schedule `id` under the lock.
    fn update<T>(&self, id: &str, change: impl FnOnce(&mut Flight) -> T) -> T {
        let mut all = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        change(all.entry(id.to_string()).or_default())
    }

    fn set_queued(&self, id: &str, queued: bool) {
        self.update(id, |f| f.queued = queued);
    }

    /// A run of schedule `id` ended (or never started).
    fn release(&self, id: &str) {
        self.update(id, |f| f.running = f.running.saturating_sub(1));
    }

    /// Start and run a claimed run in its own task (waiting for the previous run of the
    /// schedule when one is going: `overlap: queue`).
    fn spawn_run(
        self: &Arc<Self>,
        gateway: LocalGateway,
        record: ScheduleRecord,
        run: ScheduleRun,
    ) {
        self.update(&record.id, |f| f.starting += 1);
        let this = self.clone();
        tokio::spawn(async move {
            // Take the schedule's one slot once the run going (if any) has ended.
            loop {
                let taken = this.update(&record.id, |f| {
                    let free = f.running == 0;
                    if free {
                        f.starting = f.starting.saturating_sub(1);
                        f.running += 1;
                        f.queued = false;
                    }
                    free
                });
                if taken {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            match this.store.start_run(&run.id, this.now()).await {
                Ok(true) => {}
                Ok(false) => {
                    this.release(&record.id);
                    return;
                }
                Err(e) => {
                    this.release(&record.id);
                    tracing::error!(run = %run.id, error = %e, "could not start a schedule run");
                    return;
                }
            }
            this.audit(&gateway, &record, &run, Phase::Started, None)
                .await;
            failpoint("schedule.after_start");
            this.body(&gateway, &record, &run).await;
        });
    }

    /// Run a run that is already `running` (an interrupted exec with `rerun`).
    fn spawn_body(
        self: &Arc<Self>,
        gateway: LocalGateway,
        record: ScheduleRecord,
        run: ScheduleRun,
    ) {
        self.update(&record.id, |f| f.running += 1);
        let this = self.clone();
        tokio::spawn(async move { this.body(&gateway, &record, &run).await });
    }

    /// Run a started run and finish it; the caller counted it `running`.
    async fn body(&self, gateway: &LocalGateway, record: &ScheduleRecord, run: &ScheduleRun) {
        let outcome = execute(gateway, record, run).await;
        self.release(&record.id);
        self.finish(gateway, record, run, outcome).await;
        self.wake.notify_one();
    }

    /// Write the outcome and queue its delivery in one transaction; then send.
    async fn finish(
        &self,
        gateway: &LocalGateway,
        record: &ScheduleRecord,
        run: &ScheduleRun,
        outcome: Outcome,
    ) {
        let mut ended = run.clone();
        ended.status = outcome.status;
        ended.finished_at = Some(self.now());
        ended.session_id = outcome.session_id.clone();
        ended.exec_id = outcome.exec_id.clone();
        ended.cost_micros = outcome.cost_micros;
        ended.summary = outcome.summary.clone();
        ended.error = outcome.error.clone();
        let deliveries = deliveries(&gateway.config(), record, &ended);
        let finish = RunFinish {
            status: outcome.status,
            finished_at: ended.finished_at.unwrap_or_default(),
            session_id: outcome.session_id,
            exec_id: outcome.exec_id,
            cost_micros: outcome.cost_micros,
            summary: outcome.summary,
            error: outcome.error,
            deliveries,
        };
        match self.store.finish_run(&run.id, finish).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(run = %run.id, error = %e, "could not finish a schedule run");
                return;
            }
        }
        if outcome.status != RunStatus::Interrupted && outcome.status != RunStatus::Skipped {
            self.audit(
                gateway,
                record,
                &ended,
                Phase::Finished,
                ended.error.as_deref(),
            )
            .await;
        }
        failpoint("schedule.after_finish_before_send");
        #[cfg(feature = "telegram")]
        crate::channel::telegram::wake_outbox();
        self.drain_events().await;
    }

    /// A skipped fire: its report goes out (to the owner without `deliver`).
    async fn report_only(
        &self,
        gateway: &LocalGateway,
        record: &ScheduleRecord,
        run: &ScheduleRun,
    ) {
        for (channel, payload) in deliveries(&gateway.config(), record, run) {
            if let Err(e) = self.outbox.enqueue_outbox(&channel, payload).await {
                tracing::warn!(error = %e, "could not queue a schedule report");
            }
        }
        #[cfg(feature = "telegram")]
        crate::channel::telegram::wake_outbox();
        self.drain_events().await;
    }

    /// Publish queued `events` deliveries, each once.
    async fn drain_events(&self) {
        let _one_at_a_time = self.draining.lock().await;
        let Ok(items) = self.outbox.due_outbox(EVENTS_OUTBOX, i64::MAX, 100).await else {
            return;
        };
        for item in items {
            if let Ok(event) = serde_json::from_value::<ScheduleEvent>(item.payload.clone()) {
                let _ = self.events.send(event);
            }
            if let Err(e) = self.outbox.outbox_done(item.id).await {
                tracing::warn!(error = %e, "could not settle a schedule event");
            }
        }
    }

    async fn audit(
        &self,
        gateway: &LocalGateway,
        record: &ScheduleRecord,
        run: &ScheduleRun,
        phase: Phase,
        error: Option<&str>,
    ) {
        let mut args = vec![
            format!("run={}", run.id),
            format!("fireAt={}", iso(run.fire_at)),
            format!("status={}", run.status),
        ];
        if run.missed_count > 0 {
            args.push(format!("missedCount={}", run.missed_count));
        }
        if let Some(s) = &run.session_id {
            args.push(format!("session={s}"));
        }
        if let Some(e) = &run.exec_id {
            args.push(format!("exec={e}"));
        }
        let decision = if matches!(phase, Phase::Skipped) {
            AuditDecision::Denied
        } else {
            AuditDecision::Allowed
        };
        let mut r = AuditRecord::security(&record.spec.agent, &record.id, args, decision);
        r.kind = AuditType::Schedule;
        r.phase = phase;
        r.channel = Some("schedule".into());
        r.error = error.map(str::to_string);
        let sink: Arc<dyn AuditSink> = gateway.audit_sink();
        if let Err(e) = sink.record(&r).await {
            tracing::warn!(error = %e, schedule = %record.id, "could not audit a schedule step");
        }
    }
}

/// The runs of one schedule in this process: a run counts from the moment it is handed
/// to [`Scheduler::spawn_run`] (`starting`), so a fire in between sees it; one run of a
/// schedule goes at a time (`running` is 0 or 1).
#[derive(Debug, Default, Clone, Copy)]
struct Flight {
    /// Runs going (started, or rerun).
    running: usize,
    /// Runs handed over to start, not started yet (waiting for the one going).
    starting: usize,
    /// A fire is waiting for the run going (`overlap: "queue"` keeps one).
    queued: bool,
}

impl Flight {
    fn going(&self) -> usize {
        self.running + self.starting
    }
}

/// What a run came to.
#[derive(Debug, Clone)]
struct Outcome {
    status: RunStatus,
    session_id: Option<String>,
    exec_id: Option<String>,
    cost_micros: i64,
    summary: Option<String>,
    error: Option<String>,
}

impl Default for Outcome {
    fn default() -> Self {
        Self {
            status: RunStatus::Failed,
            session_id: None,
            exec_id: None,
            cost_micros: 0,
            summary: None,
            error: None,
        }
    }
}

impl Outcome {
    fn failed(status: RunStatus, error: String) -> Self {
        Self {
            status,
            error: Some(error),
            ..Default::default()
        }
    }
}

/// The session key of a run: `schedule:<id>:<name>` or, for a new session each run,
/// `schedule:<id>:<YYYYMMDDHHMMSS>:<rand4>` (the fire instant, UTC).
pub(crate) fn session_key(record: &ScheduleRecord, run: &ScheduleRun) -> String {
    match record.spec.named_session() {
        Some(name) => format!("schedule:{}:{name}", record.id),
        None => {
            let stamp = chrono::DateTime::from_timestamp_millis(run.fire_at)
                .map(|t| t.format("%Y%m%d%H%M%S").to_string())
                .unwrap_or_default();
            format!(
                "schedule:{}:{stamp}:{:04x}",
                record.id,
                rand::random::<u16>()
            )
        }
    }
}

/// The schedule id of a run's session key (`schedule:<id>:…`); ids hold no `:`.
pub(crate) fn schedule_of_key(key: &str) -> Option<&str> {
    key.strip_prefix("schedule:")?
        .split(':')
        .next()
        .filter(|id| !id.is_empty())
}

/// Run one fire: the prompt or the exec, unattended, within the schedule's budget.
async fn execute(gateway: &LocalGateway, record: &ScheduleRecord, run: &ScheduleRun) -> Outcome {
    let spec = &record.spec;
    let key = session_key(record, run);
    let _narrowed = spec
        .tools
        .clone()
        .map(|tools| super::narrow::narrow(&key, tools));
    let wall = spec
        .budget
        .and_then(|b| b.wall_seconds)
        .map(Duration::from_secs);
    if let Some(command) = &spec.exec {
        return run_exec(gateway, &spec.agent, &key, command, wall).await;
    }
    let prompt = spec.prompt.clone().unwrap_or_default();
    run_prompt(gateway, spec, &key, &prompt, wall).await
}

async fn run_exec(
    gateway: &LocalGateway,
    agent: &str,
    key: &str,
    command: &str,
    wall: Option<Duration>,
) -> Outcome {
    let call = CoreToolCall::Exec(beige_client::tools::ExecParams {
        command: command.to_string(),
        timeout: wall.map(|w| w.as_secs()),
    });
    let ctx = ToolContext {
        session_key: Some(key.to_string()),
        channel: Some("schedule".into()),
        attended: false,
        ..Default::default()
    };
    match gateway.call_tool(agent, call, ctx).await {
        Err(e) => Outcome::failed(RunStatus::Failed, e.to_string()),
        Ok(out) => {
            let text = out.joined_text();
            let summary = Some(tail(&text, SUMMARY_CHARS));
            // The exec's timeout is the schedule's wallSeconds: running out of it is
            // that budget, not a failure of the command.
            let over_wall = wall.is_some() && text.starts_with(EXEC_TIMED_OUT);
            let status = match out.outcome() {
                ToolOutcome::Denied => RunStatus::Blocked,
                ToolOutcome::Failed => RunStatus::Failed,
                _ if over_wall => RunStatus::BudgetExhausted,
                _ if out.is_error => RunStatus::Failed,
                _ => RunStatus::Ok,
            };
            let error = match status {
                RunStatus::Ok => None,
                RunStatus::BudgetExhausted => Some(format!(
                    "budget exhausted: the exec took longer than wallSeconds {} and was killed",
                    wall.map(|w| w.as_secs()).unwrap_or_default()
                )),
                _ => Some(first_line(&text)),
            };
            Outcome {
                status,
                summary,
                error,
                ..Default::default()
            }
        }
    }
}

async fn run_prompt(
    gateway: &LocalGateway,
    spec: &ScheduleSpec,
    key: &str,
    prompt: &str,
    wall: Option<Duration>,
) -> Outcome {
    use crate::agent::events::AgentEvent;
    use futures_util::StreamExt as _;
    let mut request = crate::gateway::PromptRequest::new(spec.agent.clone(), key, prompt);
    request.channel = Some("schedule".into());
    let mut stream = match gateway.prompt(request).await {
        Ok(s) => s,
        Err(e) => return Outcome::failed(RunStatus::Failed, e.to_string()),
    };
    let cost_limit = spec.budget.and_then(|b| b.cost_usd);
    let mut cost = 0.0f64;
    let mut blocked: Option<String> = None;
    let deadline = wall.map(|w| tokio::time::Instant::now() + w);
    let mut outcome = Outcome::failed(
        RunStatus::Failed,
        "the prompt ended without an answer".into(),
    );
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, stream.next()).await {
                Ok(e) => e,
                Err(_) => {
                    outcome = Outcome::failed(
                        RunStatus::BudgetExhausted,
                        format!(
                            "budget exhausted: the run took longer than wallSeconds {}",
                            wall.map(|w| w.as_secs()).unwrap_or_default()
                        ),
                    );
                    break;
                }
            },
            None => stream.next().await,
        };
        let Some(event) = next else { break };
        match event {
            AgentEvent::Usage { cost: c, .. } => {
                cost += c;
                if cost_limit.is_some_and(|l| cost > l) {
                    outcome = Outcome::failed(
                        RunStatus::BudgetExhausted,
                        format!(
                            "budget exhausted: the run spent ${cost:.4}, over costUsd {}",
                            cost_limit.unwrap_or_default()
                        ),
                    );
                    break;
                }
            }
            AgentEvent::ToolCallFinished {
                is_error: true,
                output,
                ..
            } if blocked.is_none()
                && (output.contains("this run is unattended")
                    || output.starts_with("Permission denied")) =>
            {
                blocked = Some(first_line(&output));
            }
            AgentEvent::Done {
                response,
                session_id,
                ..
            } => {
                outcome = Outcome {
                    status: RunStatus::Ok,
                    session_id: Some(session_id),
                    summary: Some(tail(&response, SUMMARY_CHARS)),
                    ..Default::default()
                };
                break;
            }
            AgentEvent::Blocked { reason } => {
                outcome =
                    Outcome::failed(RunStatus::Failed, format!("blocked by a hook: {reason}"));
                break;
            }
            AgentEvent::Error { message, kind, .. } => {
                let status = if kind == Some(crate::llm::ErrorKind::BudgetExhausted) {
                    RunStatus::BudgetExhausted
                } else {
                    RunStatus::Failed
                };
                outcome = Outcome::failed(status, message);
                break;
            }
            _ => {}
        }
    }
    outcome.cost_micros = (cost * 1_000_000.0).round() as i64;
    if let Some(reason) = blocked {
        // A denied call makes the run blocked, whatever the model answered after it.
        outcome.status = RunStatus::Blocked;
        outcome.error = Some(reason);
    }
    outcome
}

/// The outbox items of a finished (or skipped) run: the result to `deliver`, and a
/// report of a run that is not `ok` — to the owner's chats (`approvals.notify`) when
/// there is no `deliver`.
fn deliveries(
    config: &Config,
    record: &ScheduleRecord,
    run: &ScheduleRun,
) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    let ok = run.status == RunStatus::Ok;
    let text = if ok {
        run.summary.clone().unwrap_or_default()
    } else {
        report(record, run)
    };
    match &record.spec.deliver {
        Some(Deliver::Events(_)) => {
            let event = ScheduleEvent::ScheduleRunFinished {
                schedule_id: record.id.clone(),
                agent: record.spec.agent.clone(),
                run: run.clone(),
            };
            if let Ok(v) = serde_json::to_value(event) {
                out.push((EVENTS_OUTBOX.to_string(), v));
            }
        }
        Some(Deliver::Chat(chat)) => {
            if let Some(item) = chat_item(&chat.channel, &chat.chat_id, &text) {
                out.push(item);
            }
        }
        None if !ok => {
            let notify = config
                .approvals
                .as_ref()
                .map(|a| a.notify.clone())
                .unwrap_or_default();
            for t in notify {
                if let Some(item) = chat_item(&t.channel, &t.chat_id, &text) {
                    out.push(item);
                }
            }
        }
        None => {}
    }
    out
}

#[cfg(feature = "telegram")]
fn chat_item(channel: &str, chat_id: &str, text: &str) -> Option<(String, serde_json::Value)> {
    if channel != crate::channel::telegram::CHANNEL {
        return None;
    }
    let chat = chat_id.trim().parse::<i64>().ok()?;
    Some((
        channel.to_string(),
        crate::channel::telegram::outbox_text(chat, text),
    ))
}

#[cfg(not(feature = "telegram"))]
fn chat_item(_: &str, _: &str, _: &str) -> Option<(String, serde_json::Value)> {
    None
}

/// `⚠ daily-digest blocked: 'gh pr merge 41' needs approval.`
fn report(record: &ScheduleRecord, run: &ScheduleRun) -> String {
    let why = run.error.as_deref().unwrap_or("no reason recorded");
    format!(
        "⚠ schedule {} {} (fire {}): {}",
        record.id,
        run.status,
        iso(run.fire_at),
        why
    )
}

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn tail(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_string();
    }
    text.chars().skip(n - max).collect()
}

fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(300)
        .collect()
}

fn to_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// The first fire of `spec` after `now`: its cron's next instant, or its `at`.
pub(crate) fn first_fire(spec: &ScheduleSpec, now: i64) -> Option<i64> {
    if let Some(expr) = &spec.cron {
        return CronSpec::parse(expr, spec.tz.as_deref())
            .ok()?
            .next_after(now);
    }
    spec.at.as_deref().and_then(|a| parse_at(a).ok())
}

/// `sch_` and 10 base32 characters (RFC 4648 alphabet, lower case).
/// Whether this gateway runs `agent`'s schedules. With a store of its own, all of them
/// (a schedule of an agent no longer configured fails when it fires, and says so). With
/// a shared store (`store.url`), only its own agents': the others' belong to the gateway
/// that holds them, and must not be fired, cancelled or recovered from here.
fn is_mine(config: &Config, agent: &str) -> bool {
    config.store.is_none() || config.agents.contains_key(agent)
}

pub(crate) fn new_schedule_id() -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let bits = rand::random::<u64>();
    let id: String = (0..10)
        .map(|i| ALPHABET[((bits >> (i * 5)) & 31) as usize] as char)
        .collect();
    format!("sch_{id}")
}

fn new_run_id() -> String {
    format!("run_{:016x}", rand::random::<u64>())
}

/// A digest of the agent's policy and tools when a schedule is made.
fn policy_version(config: &Config, agent: &str) -> Option<String> {
    use sha2::Digest as _;
    let a = config.agents.get(agent)?;
    let text = serde_json::to_string(&(&a.tools, &a.policy)).ok()?;
    Some(hex::encode(&sha2::Sha256::digest(text.as_bytes())[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_session_keys_have_their_formats() {
        let id = new_schedule_id();
        assert!(id.starts_with("sch_") && id.len() == 14, "{id}");
        assert!(id[4..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c)));
        let record = ScheduleRecord {
            id: "daily".into(),
            owner: "config".into(),
            created_by: "config".into(),
            policy_version: None,
            state: ScheduleState::Active,
            next_fire_at: None,
            spec: ScheduleSpec::default(),
            created: 0,
            updated: 0,
        };
        let run = ScheduleRun {
            id: "run_1".into(),
            schedule_id: "daily".into(),
            fire_at: 1_796_112_000_000, // 2026-12-01T08:00:00Z
            missed_count: 0,
            status: RunStatus::Claimed,
            claimed_by: "b".into(),
            started_at: None,
            finished_at: None,
            session_id: None,
            exec_id: None,
            cost_micros: 0,
            summary: None,
            error: None,
        };
        let key = session_key(&record, &run);
        let parts: Vec<&str> = key.split(':').collect();
        assert_eq!(parts[..3], ["schedule", "daily", "20261201080000"], "{key}");
        assert_eq!(parts[3].len(), 4);
        let mut named = record.clone();
        named.spec.session = Some("digest".into());
        assert_eq!(session_key(&named, &run), "schedule:daily:digest");
        assert_eq!(schedule_of_key(&key), Some("daily"));
        assert_eq!(schedule_of_key("schedule:daily:digest"), Some("daily"));
        assert_eq!(schedule_of_key("api:a:default"), None);
        assert_eq!(schedule_of_key("schedule::x"), None);
        assert_eq!(tail("abcdef", 3), "def");
    }
}
