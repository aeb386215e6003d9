//! The schedule engine (platform.md §1, governance.md §3) in process, with real
//! components: the gateway served by `LocalGateway::serve` (the engine's tick runs only
//! while it serves), the SQLite store in a temp dir (a "restart" builds a new gateway on
//! the same file), the fake Anthropic server and the fake Telegram Bot API server of
//! beige-testkit on `127.0.0.1:0`, the audit log file of the home, and a
//! `beige_core::schedule::ManualClock` for the time the engine fires by.
//!
//! Prompt schedules use the labelled `MemorySandbox`: their calls are decided by policy
//! in the gateway before any sandbox is reached (an ask-ruled exec never gets there), so
//! no sandbox behaviour is under test. The exec schedule runs in a real Docker sandbox.
//! Waits poll the store through the gateway's schedule API; timeouts only bound a
//! failure.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use beige_core::api::schedules::{RunStatus, ScheduleAuthor, ScheduleRun, ScheduleSpec};
use beige_core::channel::telegram::{TelegramChannel, TelegramConfig};
use beige_core::config::Config;
use beige_core::schedule::ManualClock;
use beige_core::store::{Claim, ScheduleRecord, ScheduleState, ScheduleStore, SqliteStore, Store};
use beige_core::testing::MemorySandbox;
use beige_core::{Admin as _, BeigeHome, GatewayBuilder, GatewayError, LocalGateway};
use beige_core::{ServeError, Shutdown};
use beige_testkit::anthropic::{text_response, tool_use_response};
use beige_testkit::llm::{FakeLlmServer, Reply};
use beige_testkit::telegram::FakeTelegram;

use super::support::TestHome;
use crate::docker_or_skip;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// 2026-12-01T08:00:00Z: the hour the tests start in.
const T0: i64 = 1_796_112_000_000;
const HOUR: i64 = 3_600_000;
const TOKEN: &str = "123456:TEST-schedule-token";
/// The owner's Telegram chat (a private chat: the user's id).
const OWNER: i64 = 4242;

/// Bound a wait that should succeed; a hang fails the test instead of blocking it.
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

fn merge(base: &mut Value, extra: &Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e.clone(),
    }
}

/// A home, its SQLite file, the engine's clock, the fake model and the fake Telegram.
struct Rig {
    _dir: tempfile::TempDir,
    home: BeigeHome,
    clock: Arc<ManualClock>,
    llm: FakeLlmServer,
    tg: FakeTelegram,
}

/// A gateway being served.
struct Served {
    gw: LocalGateway,
    stop: CancellationToken,
    task: JoinHandle<Result<(), ServeError>>,
    sandbox: Arc<MemorySandbox>,
}

impl Served {
    /// Stop serving and wait until the gateway has stopped (the engine's tick with it).
    async fn stop(self) {
        self.stop.cancel();
        let ended = within("the gateway to stop", self.task).await;
        ended.unwrap().unwrap();
    }
}

impl Rig {
    async fn new(now: i64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        Self {
            _dir: dir,
            home,
            clock: Arc::new(ManualClock::at(now)),
            llm: FakeLlmServer::start().await,
            tg: FakeTelegram::start(TOKEN).await,
        }
    }

    /// Agent `a` on the fake model, with `patch` merged over the whole config.
    fn config(&self, patch: Value) -> Config {
        let mut cfg = json!({
            "llm": {"providers": {"anthropic": {
                "apiKey": "sk-ant-test-0123456789", "baseUrl": self.llm.url(),
            }}},
            "agents": {"a": {
                "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                "tools": [],
            }},
        });
        merge(&mut cfg, &patch);
        serde_json::from_value(cfg).unwrap()
    }

    fn store(&self) -> Arc<SqliteStore> {
        Arc::new(SqliteStore::open(self.home.db_path()).unwrap())
    }

    /// Build a gateway on the home's SQLite file and serve it; with `telegram`, the
    /// Telegram channel (on the fake server, sharing the store) is served too.
    async fn serve(&self, mut config: Config, telegram: bool) -> Served {
        let store = self.store();
        let sandbox = Arc::new(MemorySandbox::new());
        let tg = json!({
            "token": TOKEN,
            "allowedUsers": [OWNER],
            "agentMapping": {"default": "a"},
            "apiBaseUrl": self.tg.url(),
            "pollTimeout": 1,
            "watchdogGrace": 1,
        });
        if telegram {
            // The channel's plugin reads its config from `plugins.telegram.config`.
            config.plugins.insert(
                "telegram".into(),
                serde_json::from_value(json!({"config": tg})).unwrap(),
            );
        }
        let mut builder = GatewayBuilder::new(config, self.home.clone())
            .sandbox(sandbox.clone())
            .store(store.clone())
            .schedule_clock(self.clock.clone());
        if telegram {
            let tg_config = TelegramConfig::from_value(&tg).unwrap();
            let store: Arc<dyn Store> = store;
            builder = builder.channel(Arc::new(TelegramChannel::new(tg_config, store).unwrap()));
        }
        let gw = builder.build().await.unwrap();
        let stop = CancellationToken::new();
        let shutdown = Shutdown::on(stop.clone()).drain(Duration::from_secs(1));
        let task = tokio::spawn({
            let gw = gw.clone();
            async move { gw.serve(shutdown).await }
        });
        Served {
            gw,
            stop,
            task,
            sandbox,
        }
    }

    /// The audit log's records of `type: "schedule"` about `schedule`.
    fn schedule_audit(&self, schedule: &str) -> Vec<Value> {
        audit_lines(&self.home)
            .into_iter()
            .filter(|r| r["type"] == "schedule" && r["tool"] == schedule)
            .collect()
    }
}

fn audit_lines(home: &BeigeHome) -> Vec<Value> {
    std::fs::read_to_string(home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| !beige_core::audit::chain::is_chain_record(v))
        .collect()
}

/// An hourly cron schedule (in UTC) prompting agent `a`, with `extra` merged in.
fn hourly(prompt: &str, extra: Value) -> Value {
    let mut s = json!({"agent": "a", "cron": "0 * * * *", "tz": "UTC", "prompt": prompt});
    merge(&mut s, &extra);
    s
}

fn spec(v: Value) -> ScheduleSpec {
    serde_json::from_value(v).unwrap()
}

/// `deliver: {channel: "telegram", chatId: <the owner's chat>}`.
fn spec_deliver_owner() -> beige_core::api::schedules::Deliver {
    serde_json::from_value(json!({"channel": "telegram", "chatId": OWNER.to_string()})).unwrap()
}

fn api_author() -> ScheduleAuthor {
    ScheduleAuthor {
        owner: "api".into(),
        created_by: "api".into(),
    }
}

/// Poll the history of `id` until `done` holds; the history, newest first.
async fn runs_until(
    gw: &LocalGateway,
    id: &str,
    done: impl Fn(&[ScheduleRun]) -> bool,
) -> Vec<ScheduleRun> {
    within(&format!("the runs of schedule {id}"), async {
        loop {
            let runs = gw.schedule_history(id, 100).await.unwrap();
            if done(&runs) {
                return runs;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Poll until schedule `id` is stored with `next_fire_at == next` (the config synced,
/// or a fire claimed).
async fn next_fire_is(gw: &LocalGateway, id: &str, next: i64) {
    within(&format!("schedule {id} to fire next at {next}"), async {
        loop {
            if let Ok(v) = gw.schedule(id).await {
                if v.next_fire_at == Some(next) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

fn at(runs: &[ScheduleRun], fire_at: i64) -> Option<&ScheduleRun> {
    runs.iter().find(|r| r.fire_at == fire_at)
}

fn is_final_at(runs: &[ScheduleRun], fire_at: i64) -> bool {
    at(runs, fire_at).is_some_and(|r| r.status.is_final())
}

/// The gateway is down across three hourly fires (09:00, 10:00, 11:00) and comes back
/// at 11:30: `catchUp: "once"` (the original's name for `missed: "run-once"`) runs once
/// for 11:00 with `missedCount: 3`; `catchUp: "skip"` records one `skipped` run saying
/// why; `run-once` with `maxLateSeconds: 600` is 30 minutes late and skipped. The
/// timetable then goes on as usual.
#[tokio::test]
async fn missed_fires() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {
        "once": hourly("digest once", json!({"catchUp": "once"})),
        "skip": hourly("digest skip", json!({"catchUp": "skip"})),
        "late": hourly("digest late", json!({"missed": "run-once", "maxLateSeconds": 600})),
    }}));
    let first = rig.serve(config.clone(), false).await;
    for id in ["once", "skip", "late"] {
        next_fire_is(&first.gw, id, T0 + HOUR).await;
    }
    first.stop().await;

    // Down from 08:00:30 to 11:30.
    rig.clock.set(T0 + 3 * HOUR + 30 * 60_000);
    rig.llm.push(text_response("caught up"));
    let second = rig.serve(config.clone(), false).await;
    let gw = &second.gw;
    let once = runs_until(gw, "once", |r| is_final_at(r, T0 + 3 * HOUR)).await;
    assert_eq!(once.len(), 1, "one run for three missed fires: {once:?}");
    assert_eq!(once[0].fire_at, T0 + 3 * HOUR, "the latest missed instant");
    assert_eq!(once[0].missed_count, 3);
    assert_eq!(once[0].status, RunStatus::Ok, "{:?}", once[0]);
    assert_eq!(once[0].summary.as_deref(), Some("caught up"));

    let skip = runs_until(gw, "skip", |r| !r.is_empty()).await;
    assert_eq!(skip.len(), 1, "{skip:?}");
    assert_eq!(skip[0].status, RunStatus::Skipped);
    assert_eq!(skip[0].missed_count, 3);
    let why = skip[0].error.as_deref().unwrap_or_default();
    assert!(why.contains("missed") && why.contains("skip"), "{why}");

    let late = runs_until(gw, "late", |r| !r.is_empty()).await;
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0].status, RunStatus::Skipped);
    let why = late[0].error.as_deref().unwrap_or_default();
    assert!(why.contains("maxLateSeconds 600"), "{why}");

    // Only the run-once schedule reached the model, once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.llm.request_count(), 1);
    let prompt = rig.llm.requests()[0].raw_body.clone();
    assert!(prompt.contains("digest once"), "{prompt}");
    for id in ["once", "skip", "late"] {
        next_fire_is(gw, id, T0 + 4 * HOUR).await;
    }
    // The audit says which: one claimed run with missedCount=3, two skipped fires.
    let claimed: Vec<Value> = rig
        .schedule_audit("once")
        .into_iter()
        .filter(|r| r["phase"] == "claimed")
        .collect();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert!(
        claimed[0]["args"]
            .as_array()
            .unwrap()
            .contains(&json!("missedCount=3")),
        "{claimed:?}"
    );
    for id in ["skip", "late"] {
        let skipped: Vec<Value> = rig
            .schedule_audit(id)
            .into_iter()
            .filter(|r| r["phase"] == "skipped")
            .collect();
        assert_eq!(skipped.len(), 1, "{id}: {skipped:?}");
    }

    // On time again: 12:00 runs normally for all three, nothing missed.
    for _ in 0..3 {
        rig.llm.push(text_response("on time"));
    }
    rig.clock.set(T0 + 4 * HOUR);
    for id in ["once", "skip", "late"] {
        let runs = runs_until(gw, id, |r| is_final_at(r, T0 + 4 * HOUR)).await;
        let noon = at(&runs, T0 + 4 * HOUR).unwrap();
        assert_eq!(noon.status, RunStatus::Ok, "{id}: {noon:?}");
        assert_eq!(noon.missed_count, 0, "{id}: {noon:?}");
        assert_eq!(runs.len(), 2, "{id}: {runs:?}");
    }
    assert_eq!(rig.llm.request_count(), 4);
    second.stop().await;
}

/// A run longer than the interval: the model never answers the 09:00 run, so at 10:00
/// the run is still going and the 10:00 instant is recorded `skipped` (overlap) without
/// reaching the model.
#[tokio::test]
async fn overlap_skip() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {"slow": hourly("take your time", json!({}))}}));
    rig.llm.push(Reply::hang());
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    next_fire_is(gw, "slow", T0 + HOUR).await;
    rig.clock.set(T0 + HOUR);
    within(
        "the 09:00 run to reach the model",
        rig.llm.wait_for_requests(1),
    )
    .await;
    let runs = runs_until(gw, "slow", |r| {
        at(r, T0 + HOUR).is_some_and(|r| r.status == RunStatus::Running)
    })
    .await;
    assert_eq!(runs.len(), 1);

    rig.clock.set(T0 + 2 * HOUR + 1_000);
    let runs = runs_until(gw, "slow", |r| at(r, T0 + 2 * HOUR).is_some()).await;
    let ten = at(&runs, T0 + 2 * HOUR).unwrap();
    assert_eq!(ten.status, RunStatus::Skipped, "{ten:?}");
    assert_eq!(ten.missed_count, 0, "on time, not missed: {ten:?}");
    let why = ten.error.as_deref().unwrap_or_default();
    assert!(why.contains("overlap"), "{why}");
    let nine = at(&runs, T0 + HOUR).unwrap();
    assert_eq!(nine.status, RunStatus::Running, "{nine:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rig.llm.request_count(),
        1,
        "the skipped fire never prompted"
    );
    next_fire_is(gw, "slow", T0 + 3 * HOUR).await;
    let skipped = rig
        .schedule_audit("slow")
        .into_iter()
        .filter(|r| r["phase"] == "skipped")
        .count();
    assert_eq!(skipped, 1);
    served.stop().await;
}

/// governance.md §3: a scheduled prompt whose exec needs approval is denied at once
/// (no request waits, though `holdSeconds` is 30), the run is `blocked` — never `ok`,
/// though the model answered — and the owner (`approvals.notify`) gets the report in the
/// fake Telegram chat. Nothing reached the sandbox.
#[tokio::test]
async fn schedule_ask_is_deny() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({
        "agents": {"a": {"policy": {"rules": [
            {"id": "push", "tool": "exec", "pattern": ["git", "push"], "decision": "ask",
             "justification": "publishes work outside the sandbox"},
        ]}}},
        "approvals": {"holdSeconds": 30, "notify": [{"channel": "telegram", "chatId": OWNER.to_string()}]},
        "schedules": {"nightly-push": {
            "agent": "a", "at": "2026-12-01T08:01:00Z", "prompt": "push the branch",
        }},
    }));
    rig.llm.push(tool_use_response(&[(
        "tu_1",
        "exec",
        json!({"command": "git push origin main"}),
    )]));
    rig.llm.push(text_response("I pushed it."));
    let served = rig.serve(config, true).await;
    let gw = &served.gw;
    next_fire_is(gw, "nightly-push", T0 + 60_000).await;

    let started = std::time::Instant::now();
    rig.clock.set(T0 + 60_000);
    let runs = runs_until(gw, "nightly-push", |r| is_final_at(r, T0 + 60_000)).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "denied at once, not after waiting: {:?}",
        started.elapsed()
    );
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(run.status, RunStatus::Blocked, "never ok: {run:?}");
    let why = run.error.as_deref().unwrap_or_default();
    assert!(
        why.contains("git push origin main")
            && why.contains("this run is unattended (schedule nightly-push)"),
        "{why}"
    );
    // The model was told the call was denied; nothing ran; no request waits.
    assert_eq!(rig.llm.request_count(), 2);
    let told = rig.llm.requests()[1].raw_body.clone();
    assert!(told.contains("this run is unattended"), "{told}");
    assert!(
        !served
            .sandbox
            .executed("a")
            .iter()
            .any(|c| c.contains("git push")),
        "{:?}",
        served.sandbox.executed("a")
    );
    assert!(gw.approvals(Some("a")).await.unwrap().is_empty());
    assert_eq!(
        gw.schedule("nightly-push").await.unwrap().state,
        ScheduleState::Done,
        "a one-off is done after its fire"
    );
    // The owner gets the schedule's report through the outbox.
    let report = within(
        "the report in the owner's chat",
        rig.tg.wait_for_message(|m| {
            m.chat_id == OWNER
                && m.visible.contains("nightly-push")
                && m.visible.contains("blocked")
        }),
    )
    .await;
    assert!(
        report.visible.contains("git push origin main"),
        "{}",
        report.visible
    );
    let finished: Vec<Value> = rig
        .schedule_audit("nightly-push")
        .into_iter()
        .filter(|r| r["phase"] == "finished")
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert!(finished[0]["args"]
        .as_array()
        .unwrap()
        .contains(&json!("status=blocked")));
    served.stop().await;
}

/// Messages in `chat` whose visible text contains `needle`.
fn count_in(tg: &FakeTelegram, chat: i64, needle: &str) -> usize {
    tg.messages_in(chat)
        .iter()
        .filter(|m| m.visible.contains(needle))
        .count()
}

/// A run's answer reaches the fake chat exactly once: when the gateway stops between the
/// finish (answer queued in the outbox, in the finishing transaction) and the send, the
/// next gateway sends it, once; a later restart sends nothing again, and no fire runs
/// twice.
#[tokio::test]
async fn delivery_once() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {"digest": hourly(
        "summarise",
        json!({"deliver": {"channel": "telegram", "chatId": OWNER.to_string()}}),
    )}}));
    // First boot: no Telegram channel, so the answer stays queued.
    rig.llm.push(text_response("Digest one: 3 open issues"));
    let first = rig.serve(config.clone(), false).await;
    next_fire_is(&first.gw, "digest", T0 + HOUR).await;
    rig.clock.set(T0 + HOUR);
    let runs = runs_until(&first.gw, "digest", |r| is_final_at(r, T0 + HOUR)).await;
    assert_eq!(runs[0].status, RunStatus::Ok, "{runs:?}");
    first.stop().await;
    assert_eq!(count_in(&rig.tg, OWNER, "Digest one"), 0);

    // Second boot, with the channel: the queued answer goes out once.
    let second = rig.serve(config.clone(), true).await;
    within(
        "the queued answer",
        rig.tg.wait_until(|t| count_in(t, OWNER, "Digest one") > 0),
    )
    .await;
    // A fire while serving: its answer, once too.
    rig.llm.push(text_response("Digest two: all quiet"));
    rig.clock.set(T0 + 2 * HOUR);
    within(
        "the second answer",
        rig.tg.wait_until(|t| count_in(t, OWNER, "Digest two") > 0),
    )
    .await;
    second.stop().await;

    // Third boot: nothing is sent or run again.
    let polls = rig.tg.calls_to("getUpdates").len();
    let third = rig.serve(config, true).await;
    within(
        "the channel to poll",
        rig.tg
            .wait_until(|t| t.calls_to("getUpdates").len() > polls),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(count_in(&rig.tg, OWNER, "Digest one"), 1);
    assert_eq!(count_in(&rig.tg, OWNER, "Digest two"), 1);
    let runs = third.gw.schedule_history("digest", 100).await.unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|r| r.status == RunStatus::Ok), "{runs:?}");
    assert_eq!(rig.llm.request_count(), 2);
    third.stop().await;
}

/// An exec schedule runs in a real Docker sandbox through the gateway's core-tool path,
/// with no HTTP channel (no channel at all) and no model: the audit log has the
/// schedule's claimed, started and finished records and the exec's own record, in the
/// run's session.
#[tokio::test]
async fn schedule_exec_no_http() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    // Opaque commands (`$((…))`, `;`) are allowed: only the push rule asks.
    let policy = json!({"opaqueExec": "allow", "rules": [
        {"id": "push", "tool": "exec", "pattern": ["git", "push"], "decision": "ask"},
    ]});
    let mut config = t.config(&env, &[("a", json!({"policy": policy}))]);
    config.schedules = serde_json::from_value(json!({
        "nightly-clean": {"agent": "a", "at": "2026-12-01T08:01:00Z", "exec": "echo cleaned-$((6*7))"},
        "nightly-fail": {"agent": "a", "at": "2026-12-01T08:01:00Z", "exec": "echo broken; exit 3"},
        "nightly-push": {"agent": "a", "at": "2026-12-01T08:01:00Z", "exec": "git push origin main"},
        "nightly-slow": {"agent": "a", "at": "2026-12-01T08:01:00Z", "exec": "sleep 5; echo late",
                         "budget": {"wallSeconds": 1}},
    }))
    .unwrap();
    let clock = Arc::new(ManualClock::at(T0 + 30_000));
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .store(Arc::new(SqliteStore::open(t.home.db_path()).unwrap()))
        .schedule_clock(clock.clone())
        .build()
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(stop.clone()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    next_fire_is(&gw, "nightly-clean", T0 + 60_000).await;
    clock.set(T0 + 60_000);
    let runs = runs_until(&gw, "nightly-clean", |r| is_final_at(r, T0 + 60_000)).await;
    let run = &runs[0];
    assert_eq!(run.status, RunStatus::Ok, "{run:?}");
    let summary = run.summary.as_deref().unwrap_or_default();
    assert!(summary.contains("cleaned-42"), "{summary}");

    let audit = audit_lines(&t.home);
    let phases: Vec<&str> = audit
        .iter()
        .filter(|r| r["type"] == "schedule" && r["tool"] == "nightly-clean")
        .filter_map(|r| r["phase"].as_str())
        .collect();
    assert_eq!(phases, ["claimed", "started", "finished"], "{audit:#?}");
    let exec: Vec<&Value> = audit
        .iter()
        .filter(|r| r["type"] == "core_tool" && r["tool"] == "exec")
        .filter(|r| r["args"] == json!(["echo cleaned-$((6*7))"]))
        .collect();
    assert!(!exec.is_empty(), "{audit:#?}");
    for r in &exec {
        let session = r["session"].as_str().unwrap_or_default();
        assert!(
            session.starts_with("schedule:nightly-clean:20261201080100:"),
            "{r}"
        );
        assert_eq!(r["channel"], "schedule", "{r}");
    }
    let finished = exec
        .iter()
        .find(|r| r["phase"] == "finished" && r["args"] == json!(["echo cleaned-$((6*7))"]))
        .expect("the exec's finished record");
    assert_eq!(finished["decision"], "allowed", "{finished}");

    // A non-zero exit is `failed`, an exec needing approval `blocked` at once.
    let failed = runs_until(&gw, "nightly-fail", |r| is_final_at(r, T0 + 60_000)).await;
    assert_eq!(failed[0].status, RunStatus::Failed, "{failed:?}");
    let summary = failed[0].summary.as_deref().unwrap_or_default();
    assert!(
        summary.contains("broken") && summary.contains('3'),
        "{summary}"
    );
    let blocked = runs_until(&gw, "nightly-push", |r| is_final_at(r, T0 + 60_000)).await;
    assert_eq!(blocked[0].status, RunStatus::Blocked, "{blocked:?}");
    let why = blocked[0].error.as_deref().unwrap_or_default();
    assert!(
        why.contains("'exec git push origin main' needs approval")
            && why.contains("this run is unattended (schedule nightly-push)"),
        "{why}"
    );
    assert!(gw.approvals(Some("a")).await.unwrap().is_empty());
    // An exec over `wallSeconds` is stopped by that budget.
    let slow = runs_until(&gw, "nightly-slow", |r| is_final_at(r, T0 + 60_000)).await;
    assert_eq!(slow[0].status, RunStatus::BudgetExhausted, "{slow:?}");
    let why = slow[0].error.as_deref().unwrap_or_default();
    assert!(why.contains("wallSeconds 1"), "{why}");
    let summary = slow[0].summary.as_deref().unwrap_or_default();
    assert!(!summary.contains("late"), "{summary}");
    stop.cancel();
    within("the gateway to stop", task).await.unwrap().unwrap();
}

/// platform.md §1.2: a schedule never has more rights than its agent. A `tools` entry
/// the agent lacks is refused, naming it; the tools a run's model is told of are the
/// schedule's (narrower than the agent's); a tool the agent loses later is gone from
/// the next run.
#[tokio::test]
async fn schedule_no_wider_rights() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({
        "plugins": {"kv": {}, "sessions": {}},
        "agents": {"a": {"tools": ["kv", "sessions"]}},
    }));
    let served = rig.serve(config.clone(), false).await;
    let gw = &served.gw;
    let refused = gw
        .add_schedule(
            spec(hourly("merge it", json!({"tools": ["kv", "gh"]}))),
            api_author(),
        )
        .await;
    match refused {
        Err(GatewayError::InvalidSchedule { message }) => {
            assert!(
                message.contains("tools[1]") && message.contains("'gh'"),
                "{message}"
            );
        }
        other => panic!("expected a validation error, got {other:?}"),
    }
    assert!(gw.schedules(Some("a")).await.unwrap().is_empty());

    let made = gw
        .add_schedule(
            spec(hourly("use your tools", json!({"tools": ["kv"]}))),
            api_author(),
        )
        .await
        .unwrap();
    assert!(made.id.starts_with("sch_"), "{}", made.id);
    assert_eq!(made.next_fire_at, Some(T0 + HOUR));
    rig.llm.push(text_response("first"));
    rig.clock.set(T0 + HOUR);
    let runs = runs_until(gw, &made.id, |r| is_final_at(r, T0 + HOUR)).await;
    assert_eq!(runs[0].status, RunStatus::Ok, "{runs:?}");
    let told = rig.llm.requests()[0].raw_body.clone();
    assert!(told.contains("### kv"), "the schedule's tool: {told}");
    assert!(
        !told.contains("### sessions"),
        "the agent has it, the schedule does not: {told}"
    );

    // The agent loses kv: the schedule loses it too, though its spec still names it.
    let mut fewer = config.clone();
    if let Some(a) = fewer.agents.get_mut("a") {
        a.tools = vec!["sessions".into()];
    }
    let outcome = gw.reload(fewer).await;
    assert!(outcome.ok, "{outcome:?}");
    rig.llm.push(text_response("second"));
    rig.clock.set(T0 + 2 * HOUR);
    let runs = runs_until(gw, &made.id, |r| is_final_at(r, T0 + 2 * HOUR)).await;
    assert_eq!(runs[0].status, RunStatus::Ok, "{runs:?}");
    let told = rig.llm.requests()[1].raw_body.clone();
    assert!(!told.contains("### kv"), "kv is gone: {told}");
    assert!(!told.contains("### sessions"), "{told}");
    served.stop().await;
}

/// The store route to the states a crash leaves (the CLI test SIGKILLs a real process
/// instead): a run left `claimed` by an earlier boot starts once on the next start, one
/// claimed too long ago (over `maxLateSeconds`) is skipped, and one left `running` is
/// `interrupted` and reported, not run again — neither on this start nor the next.
#[tokio::test]
async fn recovery_after_a_crash() {
    let rig = Rig::new(T0 + 30_000).await;
    let store = rig.store();
    let record = |id: &str, prompt: &str| ScheduleRecord {
        id: id.to_string(),
        owner: "api".into(),
        created_by: "api".into(),
        policy_version: None,
        state: ScheduleState::Active,
        next_fire_at: Some(T0 + HOUR),
        spec: spec(hourly(prompt, json!({}))),
        created: T0 - 8 * HOUR,
        updated: T0 - 8 * HOUR,
    };
    let claim = |id: &str, fire_at: i64| Claim {
        run_id: format!("run_{id}"),
        schedule_id: id.to_string(),
        fire_at,
        missed_count: 0,
        claimed_by: "boot_dead".into(),
        next_fire_at: Some(T0 + HOUR),
        status: RunStatus::Claimed,
        error: None,
        now: fire_at,
    };
    for (id, fire_at) in [("claimed", T0), ("running", T0), ("stale", T0 - 7 * HOUR)] {
        let mut r = record(id, &format!("prompt of {id}"));
        if id == "running" {
            r.spec.deliver = Some(spec_deliver_owner());
        }
        store.put_schedule(r).await.unwrap();
        let run = store.claim_run(claim(id, fire_at)).await.unwrap();
        assert!(run.is_some(), "{id}");
    }
    assert!(store.start_run("run_running", T0 + 1_000).await.unwrap());
    drop(store);

    rig.llm.push(text_response("recovered"));
    let config = rig.config(json!({}));
    let served = rig.serve(config.clone(), true).await;
    let gw = &served.gw;
    let claimed = runs_until(gw, "claimed", |r| is_final_at(r, T0)).await;
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].id, "run_claimed");
    assert_eq!(claimed[0].status, RunStatus::Ok, "{claimed:?}");
    assert_eq!(claimed[0].summary.as_deref(), Some("recovered"));
    assert!(claimed[0].claimed_by == "boot_dead", "the claim is kept");

    let running = runs_until(gw, "running", |r| is_final_at(r, T0)).await;
    assert_eq!(running.len(), 1, "{running:?}");
    assert_eq!(running[0].status, RunStatus::Interrupted, "{running:?}");
    let why = running[0].error.as_deref().unwrap_or_default();
    assert!(why.contains("not run again"), "{why}");

    let stale = runs_until(gw, "stale", |r| is_final_at(r, T0 - 7 * HOUR)).await;
    assert_eq!(stale[0].status, RunStatus::Skipped, "{stale:?}");
    let why = stale[0].error.as_deref().unwrap_or_default();
    assert!(why.contains("maxLateSeconds"), "{why}");

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.llm.request_count(), 1, "only the claimed run prompted");
    let prompt = rig.llm.requests()[0].raw_body.clone();
    assert!(prompt.contains("prompt of claimed"), "{prompt}");
    let interrupted = rig
        .schedule_audit("running")
        .into_iter()
        .filter(|r| r["phase"] == "interrupted")
        .count();
    assert_eq!(interrupted, 1);
    // The interrupted run is reported to its delivery chat.
    let report = within(
        "the report of the interrupted run",
        rig.tg.wait_for_message(|m| {
            m.chat_id == OWNER && m.visible.contains("running") && m.visible.contains("interrupted")
        }),
    )
    .await;
    assert!(
        report.visible.contains("not run again"),
        "{}",
        report.visible
    );
    served.stop().await;

    // Another start finds nothing open: nothing runs again.
    let again = rig.serve(config, false).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    for id in ["claimed", "running", "stale"] {
        let runs = again.gw.schedule_history(id, 100).await.unwrap();
        assert_eq!(runs.len(), 1, "{id}: {runs:?}");
        assert!(runs[0].status.is_final(), "{id}: {runs:?}");
    }
    assert_eq!(rig.llm.request_count(), 1);
    again.stop().await;
}

/// `overlap: "queue"` keeps one waiting run: the 10:00 fire waits (`claimed`) while the
/// 09:00 run goes and starts when it ends; the 11:00 fire, with one already waiting, is
/// skipped.
#[tokio::test]
async fn overlap_queue_keeps_one_waiting_run() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {
        "queued": hourly("one at a time", json!({"overlap": "queue"})),
    }}));
    rig.llm
        .push(text_response("nine o'clock").pause_at(1, Duration::from_secs(8)));
    rig.llm.push(text_response("ten o'clock"));
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    next_fire_is(gw, "queued", T0 + HOUR).await;
    rig.clock.set(T0 + HOUR);
    within(
        "the 09:00 run to reach the model",
        rig.llm.wait_for_requests(1),
    )
    .await;
    runs_until(gw, "queued", |r| {
        at(r, T0 + HOUR).is_some_and(|r| r.status == RunStatus::Running)
    })
    .await;
    rig.clock.set(T0 + 2 * HOUR + 1_000);
    let runs = runs_until(gw, "queued", |r| at(r, T0 + 2 * HOUR).is_some()).await;
    assert_eq!(
        at(&runs, T0 + 2 * HOUR).unwrap().status,
        RunStatus::Claimed,
        "waits behind the running one: {runs:?}"
    );
    rig.clock.set(T0 + 3 * HOUR + 1_000);
    let runs = runs_until(gw, "queued", |r| at(r, T0 + 3 * HOUR).is_some()).await;
    let eleven = at(&runs, T0 + 3 * HOUR).unwrap();
    assert_eq!(eleven.status, RunStatus::Skipped, "{eleven:?}");
    assert!(
        eleven
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("overlap"),
        "{eleven:?}"
    );

    let runs = runs_until(gw, "queued", |r| is_final_at(r, T0 + 2 * HOUR)).await;
    let nine = at(&runs, T0 + HOUR).unwrap();
    let ten = at(&runs, T0 + 2 * HOUR).unwrap();
    assert_eq!(nine.status, RunStatus::Ok, "{nine:?}");
    assert_eq!(ten.status, RunStatus::Ok, "{ten:?}");
    assert_eq!(ten.summary.as_deref(), Some("ten o'clock"));
    assert!(
        ten.started_at >= nine.finished_at,
        "the queued run started after the first ended: {runs:?}"
    );
    assert_eq!(rig.llm.request_count(), 2);
    served.stop().await;
}

/// `budget.wallSeconds` ends a run that takes longer (`budget_exhausted`), and the run
/// really stops: the tool call the model sends after the limit is never carried out.
#[tokio::test]
async fn a_run_over_its_wall_budget_is_stopped() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {
        "bounded": hourly("be quick", json!({"budget": {"wallSeconds": 1}})),
    }}));
    rig.llm.push(
        tool_use_response(&[("tu_1", "exec", json!({"command": "echo after-the-budget"}))])
            .pause_at(1, Duration::from_secs(6)),
    );
    rig.llm.push(text_response("done late"));
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    next_fire_is(gw, "bounded", T0 + HOUR).await;
    let started = std::time::Instant::now();
    rig.clock.set(T0 + HOUR);
    let runs = runs_until(gw, "bounded", |r| is_final_at(r, T0 + HOUR)).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let run = &runs[0];
    assert_eq!(run.status, RunStatus::BudgetExhausted, "{run:?}");
    assert!(
        run.error
            .as_deref()
            .unwrap_or_default()
            .contains("wallSeconds 1"),
        "{run:?}"
    );
    // Past the model's slow answer: its tool call never ran, no further model call.
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(started.elapsed())).await;
    assert!(
        !served
            .sandbox
            .executed("a")
            .iter()
            .any(|c| c.contains("after-the-budget")),
        "{:?}",
        served.sandbox.executed("a")
    );
    assert_eq!(rig.llm.request_count(), 1);
    served.stop().await;
}

/// The management API: a paused schedule does not fire and, resumed, goes on from the
/// next instant after now (no catch-up); `run now` runs an extra fire at once; a config
/// schedule cannot be cancelled, one made through the API can, and a cancelled schedule
/// fires no more. Results to `deliver: "events"` are published once each.
#[tokio::test]
async fn pause_resume_run_now_and_cancel() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {
        "cfg": hourly("from the config", json!({"deliver": "events"})),
    }}));
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    let mut events = gw.schedule_events().unwrap();
    next_fire_is(gw, "cfg", T0 + HOUR).await;

    let paused = gw.pause_schedule("cfg").await.unwrap();
    assert_eq!(paused.state, ScheduleState::Paused);
    rig.clock.set(T0 + HOUR + 5_000);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(gw.schedule_history("cfg", 10).await.unwrap().is_empty());
    let resumed = gw.resume_schedule("cfg").await.unwrap();
    assert_eq!(resumed.state, ScheduleState::Active);
    assert_eq!(resumed.next_fire_at, Some(T0 + 2 * HOUR), "no catch-up");

    rig.llm.push(text_response("ran now"));
    let run = gw.run_schedule_now("cfg").await.unwrap();
    assert_eq!(run.fire_at, T0 + HOUR + 5_000);
    let runs = runs_until(gw, "cfg", |r| is_final_at(r, T0 + HOUR + 5_000)).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Ok, "{runs:?}");
    assert_eq!(
        gw.schedule("cfg").await.unwrap().next_fire_at,
        Some(T0 + 2 * HOUR)
    );
    let event = within("the schedule_run_finished event", events.recv())
        .await
        .unwrap();
    let event = serde_json::to_value(event).unwrap();
    assert_eq!(event["type"], "schedule_run_finished", "{event}");
    assert_eq!(event["scheduleId"], "cfg", "{event}");
    assert_eq!(event["run"]["summary"], "ran now", "{event}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(events.try_recv().is_err(), "published once");

    let refused = gw.cancel_schedule("cfg").await;
    assert!(
        matches!(&refused, Err(GatewayError::InvalidSchedule { message }) if message.contains("only be paused")),
        "{refused:?}"
    );
    let made = gw
        .add_schedule(spec(hourly("from the API", json!({}))), api_author())
        .await
        .unwrap();
    assert_eq!(made.owner, "api");
    let cancelled = gw.cancel_schedule(&made.id).await.unwrap();
    assert_eq!(cancelled.state, ScheduleState::Cancelled);
    assert!(gw.run_schedule_now(&made.id).await.is_err());
    rig.llm.push(text_response("ten"));
    rig.clock.set(T0 + 2 * HOUR);
    runs_until(gw, "cfg", |r| is_final_at(r, T0 + 2 * HOUR)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(gw.schedule_history(&made.id, 10).await.unwrap().is_empty());
    assert_eq!(rig.llm.request_count(), 2);
    assert!(matches!(
        gw.schedule("sch_nothere00").await,
        Err(GatewayError::UnknownSchedule { .. })
    ));
    served.stop().await;
}

/// Session modes: `session: "new"` (the default) gives each run a fresh session —
/// `schedule:<id>:<YYYYMMDDHHMMSS>:<rand4>` — while a named session is reused, so its
/// second run's model sees the first run's exchange.
#[tokio::test]
async fn new_and_named_sessions() {
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {
        "fresh": hourly("fresh prompt", json!({})),
        "kept": hourly("kept prompt", json!({"session": "journal"})),
    }}));
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    next_fire_is(gw, "kept", T0 + HOUR).await;
    for hour in 1..=2 {
        rig.llm.push(text_response(&format!("answer {hour}")));
        rig.llm.push(text_response(&format!("answer {hour}")));
        rig.clock.set(T0 + hour * HOUR);
        for id in ["fresh", "kept"] {
            runs_until(gw, id, |r| is_final_at(r, T0 + hour * HOUR)).await;
        }
    }
    let fresh = gw.schedule_history("fresh", 10).await.unwrap();
    let kept = gw.schedule_history("kept", 10).await.unwrap();
    for r in fresh.iter().chain(&kept) {
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    let sessions = |runs: &[ScheduleRun]| -> Vec<String> {
        runs.iter()
            .map(|r| {
                r.session_id
                    .clone()
                    .expect("a prompt run records its session")
            })
            .collect()
    };
    let (fresh_s, kept_s) = (sessions(&fresh), sessions(&kept));
    assert_ne!(fresh_s[0], fresh_s[1], "a new session per run");
    assert_eq!(kept_s[0], kept_s[1], "the named session is reused");

    let bodies: Vec<String> = rig.llm.requests().into_iter().map(|r| r.raw_body).collect();
    assert_eq!(bodies.len(), 4);
    let second_kept: Vec<&String> = bodies
        .iter()
        .filter(|b| b.contains("kept prompt"))
        .collect();
    assert_eq!(second_kept.len(), 2);
    assert_eq!(
        second_kept[1].matches("kept prompt").count(),
        2,
        "the second run carries the first: {}",
        second_kept[1]
    );
    let second_fresh: Vec<&String> = bodies
        .iter()
        .filter(|b| b.contains("fresh prompt"))
        .collect();
    assert_eq!(second_fresh.len(), 2);
    assert_eq!(
        second_fresh[1].matches("fresh prompt").count(),
        1,
        "a fresh session starts empty: {}",
        second_fresh[1]
    );
    served.stop().await;
}

/// `budget.costUsd` ends a run whose model calls cost more (`budget_exhausted`, the cost
/// recorded), with no further model call.
#[tokio::test]
async fn a_run_over_its_cost_budget_is_stopped() {
    use beige_testkit::anthropic::MessageStream;
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({"schedules": {
        "thrifty": hourly("spend little", json!({"budget": {"costUsd": 0.01}})),
    }}));
    // 100 000 input tokens of claude-sonnet-4-6: far over a cent.
    rig.llm.push(
        MessageStream::new()
            .tool_use("tu_1", "read", json!({"path": "notes.txt"}))
            .stop_reason("tool_use")
            .usage(100_000, 10)
            .reply(),
    );
    rig.llm.push(text_response("never asked for"));
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    next_fire_is(gw, "thrifty", T0 + HOUR).await;
    rig.clock.set(T0 + HOUR);
    let runs = runs_until(gw, "thrifty", |r| is_final_at(r, T0 + HOUR)).await;
    let run = &runs[0];
    assert_eq!(run.status, RunStatus::BudgetExhausted, "{run:?}");
    assert!(
        run.error
            .as_deref()
            .unwrap_or_default()
            .contains("costUsd 0.01"),
        "{run:?}"
    );
    assert!(run.cost_micros > 10_000, "the cost is recorded: {run:?}");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(rig.llm.request_count(), 1, "no model call after the budget");
    served.stop().await;
}

/// The schedule's `tools` bind the scripts of its run too: while a run goes, a plugin
/// call naming the run's session (the socket's guarded path) may use the schedule's
/// tools only, though the agent has more; other sessions of the agent are not narrowed.
#[tokio::test]
async fn a_runs_scripts_call_only_the_schedules_tools() {
    use beige_core::Sessions as _;
    use beige_protocol::socket::{SessionContext, ToolRequest, ToolResponse};
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({
        "plugins": {"kv": {}, "sessions": {}},
        "agents": {"a": {"tools": ["kv", "sessions"]}},
        "schedules": {"narrow": hourly("hold on", json!({"tools": ["kv"], "session": "work"}))},
    }));
    rig.llm.push(Reply::hang());
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    next_fire_is(gw, "narrow", T0 + HOUR).await;
    rig.clock.set(T0 + HOUR);
    within("the run to reach the model", rig.llm.wait_for_requests(1)).await;
    let key = "schedule:narrow:work";
    assert!(
        gw.sessions("a").await.unwrap().iter().any(|s| s.key == key),
        "the run's session exists"
    );
    let call = |tool: &str, args: &[&str], session: &str| {
        let mut request = ToolRequest::new(tool, args.iter().map(|s| s.to_string()).collect());
        request.session_context = Some(SessionContext {
            session_key: Some(session.to_string()),
            ..Default::default()
        });
        let gw = gw.clone();
        async move { gw.handle_tool_request("a", request).await }
    };
    let text = |r: &ToolResponse| serde_json::to_value(r).unwrap().to_string();
    let refused = call("sessions", &["list"], key).await;
    assert!(!refused.success, "{}", text(&refused));
    assert!(
        text(&refused).contains("not allowed for this schedule run"),
        "{}",
        text(&refused)
    );
    let allowed = call("kv", &["set", "k", "v"], key).await;
    assert!(allowed.success, "{}", text(&allowed));
    // The agent's own sessions keep all its tools.
    let other = call("sessions", &["list"], "api:a:default").await;
    assert!(
        !text(&other).contains("not allowed for this schedule run"),
        "{}",
        text(&other)
    );
    served.stop().await;
}

/// The config's schedules follow a reload: a changed cron takes effect at once, a paused
/// schedule stays paused though its entry changed, and a removed entry is cancelled
/// (its history kept) and fires no more.
#[tokio::test]
async fn config_schedules_follow_a_reload() {
    let rig = Rig::new(T0 + 30_000).await;
    let v1 = rig.config(json!({"schedules": {
        "moved": hourly("moved", json!({})),
        "held": hourly("held", json!({})),
        "gone": hourly("gone", json!({})),
    }}));
    let served = rig.serve(v1, false).await;
    let gw = &served.gw;
    for id in ["moved", "held", "gone"] {
        next_fire_is(gw, id, T0 + HOUR).await;
    }
    gw.pause_schedule("held").await.unwrap();

    let v2 = rig.config(json!({"schedules": {
        "moved": {"agent": "a", "cron": "30 * * * *", "tz": "UTC", "prompt": "moved"},
        "held": hourly("held, reworded", json!({})),
    }}));
    assert!(gw.reload(v2).await.ok);
    next_fire_is(gw, "moved", T0 + 30 * 60_000).await;
    // The engine stores the new entries one by one after the reload: wait for this one.
    let held = within("the paused schedule to be reworded", async {
        loop {
            let v = gw.schedule("held").await.unwrap();
            if v.spec.prompt.as_deref() == Some("held, reworded") {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(held.state, ScheduleState::Paused, "{held:?}");
    let gone = within("the removed schedule to be cancelled", async {
        loop {
            let v = gw.schedule("gone").await.unwrap();
            if v.state == ScheduleState::Cancelled {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(gone.next_fire_at, None);

    rig.llm.push(text_response("half past"));
    rig.clock.set(T0 + 30 * 60_000 + 1_000);
    let runs = runs_until(gw, "moved", |r| is_final_at(r, T0 + 30 * 60_000)).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].status, RunStatus::Ok, "{runs:?}");
    assert_eq!(runs[0].missed_count, 0, "on time: {runs:?}");
    // Past the old 09:00: neither the paused nor the removed one fires.
    rig.clock.set(T0 + HOUR + 1_000);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(gw.schedule_history("moved", 10).await.unwrap().len(), 1);
    assert!(gw.schedule_history("held", 10).await.unwrap().is_empty());
    assert!(gw.schedule_history("gone", 10).await.unwrap().is_empty());
    assert_eq!(rig.llm.request_count(), 1);
    served.stop().await;
}

/// The config's `schedules` entries are checked when the config is loaded, each problem
/// named by its path: a tool the agent lacks, `missed` with its alias `catchUp`, a
/// cron that does not parse, an unknown agent.
#[test]
fn config_schedule_entries_are_validated_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let load = |schedule: &str| {
        let text = format!(
            r#"{{
              llm: {{ providers: {{ anthropic: {{ apiKey: "k" }} }} }},
              plugins: {{ kv: {{}} }},
              agents: {{ a: {{ model: {{ provider: "anthropic", model: "claude-sonnet-4-6" }}, tools: ["kv"] }} }},
              schedules: {{ nightly: {schedule} }},
            }}"#
        );
        Config::from_str_with_env(&text, &dir.path().join("config.json5"), &home, |_| None)
            .map_err(|e| e.to_string())
    };
    let ok = r#"{ agent: "a", cron: "0 8 * * 1-5", tz: "Europe/Berlin", prompt: "p", catchUp: "skip", tools: ["kv"] }"#;
    let loaded = load(ok).unwrap();
    assert_eq!(
        loaded.config.schedules["nightly"].missed_policy(),
        beige_core::api::schedules::Missed::Skip
    );
    for (schedule, path, needle) in [
        (
            r#"{ agent: "a", cron: "0 8 * * *", prompt: "p", tools: ["kv", "gh"] }"#,
            "schedules.nightly.tools[1]",
            "'gh'",
        ),
        (
            r#"{ agent: "a", cron: "0 8 * * *", prompt: "p", missed: "skip", catchUp: "once" }"#,
            "schedules.nightly.catchUp",
            "missed",
        ),
        (
            r#"{ agent: "a", cron: "0 25 * * *", prompt: "p" }"#,
            "schedules.nightly.cron",
            "25",
        ),
        (
            r#"{ agent: "b", cron: "0 8 * * *", prompt: "p" }"#,
            "schedules.nightly.agent",
            "'b'",
        ),
    ] {
        let e = load(schedule).unwrap_err();
        assert!(e.contains(path) && e.contains(needle), "{schedule}: {e}");
    }
}

/// An exec schedule that opted in with `onInterrupted: "rerun"` runs an instant cut off
/// by a crash once more on the next start (the labelled `MemorySandbox` records the
/// command; no sandbox behaviour is under test), and not again on the start after —
/// nor after a crash during the rerun.
#[tokio::test]
async fn an_interrupted_exec_that_opted_in_is_rerun_once() {
    let rig = Rig::new(T0 + 30_000).await;
    let store = rig.store();
    let record = ScheduleRecord {
        id: "sweep".into(),
        owner: "api".into(),
        created_by: "api".into(),
        policy_version: None,
        state: ScheduleState::Active,
        next_fire_at: Some(T0 + HOUR),
        spec: spec(json!({"agent": "a", "cron": "0 * * * *", "tz": "UTC",
                          "exec": "sweep --all", "onInterrupted": "rerun"})),
        created: T0 - HOUR,
        updated: T0 - HOUR,
    };
    store.put_schedule(record).await.unwrap();
    let claim = Claim {
        run_id: "run_sweep".into(),
        schedule_id: "sweep".into(),
        fire_at: T0,
        missed_count: 0,
        claimed_by: "boot_dead".into(),
        next_fire_at: Some(T0 + HOUR),
        status: RunStatus::Claimed,
        error: None,
        now: T0,
    };
    assert!(store.claim_run(claim).await.unwrap().is_some());
    assert!(store.start_run("run_sweep", T0 + 1_000).await.unwrap());
    drop(store);

    let config = rig.config(json!({}));
    let served = rig.serve(config.clone(), false).await;
    let runs = runs_until(&served.gw, "sweep", |r| is_final_at(r, T0)).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].status, RunStatus::Ok, "{runs:?}");
    let ran = served.sandbox.executed("a");
    assert_eq!(ran, ["sweep --all"], "{ran:?}");
    served.stop().await;

    let again = rig.serve(config.clone(), false).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(again.sandbox.executed("a").is_empty());
    assert_eq!(
        again.gw.schedule_history("sweep", 10).await.unwrap().len(),
        1
    );
    again.stop().await;

    // A crash during the rerun (the run left `running`, marked rerun): the next start
    // reports it `interrupted` and does not run it a third time.
    let store = rig.store();
    let claim = Claim {
        run_id: "run_sweep_2".into(),
        schedule_id: "sweep".into(),
        fire_at: T0 + HOUR,
        missed_count: 0,
        claimed_by: "boot_dead_2".into(),
        next_fire_at: Some(T0 + 2 * HOUR),
        status: RunStatus::Claimed,
        error: None,
        now: T0 + HOUR,
    };
    assert!(store.claim_run(claim).await.unwrap().is_some());
    assert!(store.start_run("run_sweep_2", T0 + HOUR).await.unwrap());
    assert!(store
        .rerun_run("run_sweep_2", "boot_dead_3", T0 + HOUR + 5_000)
        .await
        .unwrap());
    drop(store);
    rig.clock.set(T0 + HOUR + 60_000);
    let third = rig.serve(config, false).await;
    let runs = runs_until(&third.gw, "sweep", |r| is_final_at(r, T0 + HOUR)).await;
    let cut = at(&runs, T0 + HOUR).unwrap();
    assert_eq!(cut.status, RunStatus::Interrupted, "{cut:?}");
    assert!(
        cut.error
            .as_deref()
            .unwrap_or_default()
            .contains("rerun once only"),
        "{cut:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(third.sandbox.executed("a").is_empty());
    third.stop().await;
}

/// Many runs delivering to `"events"` finish together: each `schedule_run_finished`
/// is published exactly once, though the tick and every finishing run drain the queue.
#[tokio::test]
async fn events_of_runs_finishing_together_are_published_once() {
    let rig = Rig::new(T0 + 30_000).await;
    let ids: Vec<String> = (0..8).map(|i| format!("ev{i}")).collect();
    let schedules: serde_json::Map<String, Value> = ids
        .iter()
        .map(|id| (id.clone(), hourly(id, json!({"deliver": "events"}))))
        .collect();
    let config = rig.config(json!({ "schedules": schedules }));
    for _ in &ids {
        rig.llm.push(text_response("done"));
    }
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    let mut events = gw.schedule_events().unwrap();
    for id in &ids {
        next_fire_is(gw, id, T0 + HOUR).await;
    }
    rig.clock.set(T0 + HOUR);
    for id in &ids {
        runs_until(gw, id, |r| is_final_at(r, T0 + HOUR)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        let e = serde_json::to_value(e).unwrap();
        seen.push(e["run"]["id"].as_str().unwrap_or_default().to_string());
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "every run's event: {seen:?}");
    assert_eq!(seen.len(), ids.len(), "each once: {seen:?}");
    served.stop().await;
}

/// A run counts against its agent's budgets too: over the agent's session token budget,
/// the run ends `budget_exhausted` with the budget's message, not `ok` or `failed`.
#[tokio::test]
async fn a_run_over_its_agents_budget_is_budget_exhausted() {
    use beige_testkit::anthropic::MessageStream;
    let rig = Rig::new(T0 + 30_000).await;
    let config = rig.config(json!({
        "budgets": {"session": {"tokens": 1000}},
        "schedules": {"hungry": hourly("read everything", json!({}))},
    }));
    rig.llm.push(
        MessageStream::new()
            .tool_use("tu_1", "read", json!({"path": "notes.txt"}))
            .stop_reason("tool_use")
            .usage(5_000, 10)
            .reply(),
    );
    rig.llm.push(text_response("never asked for"));
    let served = rig.serve(config, false).await;
    let gw = &served.gw;
    next_fire_is(gw, "hungry", T0 + HOUR).await;
    rig.clock.set(T0 + HOUR);
    let runs = runs_until(gw, "hungry", |r| is_final_at(r, T0 + HOUR)).await;
    let run = &runs[0];
    assert_eq!(run.status, RunStatus::BudgetExhausted, "{run:?}");
    assert!(
        run.error
            .as_deref()
            .unwrap_or_default()
            .contains("budgets.session.tokens"),
        "{run:?}"
    );
    assert_eq!(rig.llm.request_count(), 1);
    served.stop().await;
}

/// A crash right after the 08:00 claim and a start at 10:30: recovery starts the claimed
/// 08:00 run, and the missed 09:00 and 10:00 fires, due at the same start, do not run
/// beside it — they are one `skipped` (overlap) run, as `overlap: "skip"` says.
#[tokio::test]
async fn a_recovered_run_and_a_missed_fire_do_not_overlap() {
    let rig = Rig::new(T0 + 2 * HOUR + 30 * 60_000).await;
    let store = rig.store();
    store
        .put_schedule(ScheduleRecord {
            id: "busy".into(),
            owner: "api".into(),
            created_by: "api".into(),
            policy_version: None,
            state: ScheduleState::Active,
            next_fire_at: Some(T0 + HOUR),
            spec: spec(hourly("busy", json!({}))),
            created: T0 - HOUR,
            updated: T0 - HOUR,
        })
        .await
        .unwrap();
    let claim = Claim {
        run_id: "run_busy".into(),
        schedule_id: "busy".into(),
        fire_at: T0,
        missed_count: 0,
        claimed_by: "boot_dead".into(),
        next_fire_at: Some(T0 + HOUR),
        status: RunStatus::Claimed,
        error: None,
        now: T0,
    };
    assert!(store.claim_run(claim).await.unwrap().is_some());
    drop(store);
    rig.llm.push(Reply::hang());
    rig.llm.push(Reply::hang());

    let served = rig.serve(rig.config(json!({})), false).await;
    let gw = &served.gw;
    let runs = runs_until(gw, "busy", |r| at(r, T0 + 2 * HOUR).is_some()).await;
    let ten = at(&runs, T0 + 2 * HOUR).unwrap();
    assert_eq!(ten.status, RunStatus::Skipped, "{runs:?}");
    assert_eq!(ten.missed_count, 2, "{ten:?}");
    assert!(
        ten.error.as_deref().unwrap_or_default().contains("overlap"),
        "{ten:?}"
    );
    runs_until(gw, "busy", |r| {
        at(r, T0).is_some_and(|r| r.status == RunStatus::Running)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rig.llm.request_count(), 1, "one run at a time");
    served.stop().await;
}
