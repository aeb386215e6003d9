//! The [`ScheduleStore`] contract, on both stores: one run per instant, claim moves the
//! next fire (a one-off becomes done), start only from `claimed`, finish once with its
//! deliveries enqueued in the same step, recovery sees the open runs after a restart,
//! an interrupted run is taken over for a rerun once.

use super::*;

contract!(
    schedules_round_trip_and_list_by_agent,
    a_claim_is_once_per_instant_and_moves_the_next_fire,
    start_and_finish_move_forward_only_and_enqueue_once,
    open_runs_survive_a_restart,
    a_running_run_is_rerun_once,
);

pub(super) fn record(id: &str, agent: &str, next: Option<i64>) -> ScheduleRecord {
    ScheduleRecord {
        id: id.into(),
        owner: "config".into(),
        created_by: "config".into(),
        policy_version: Some("p1".into()),
        state: ScheduleState::Active,
        next_fire_at: next,
        spec: ScheduleSpec {
            agent: agent.into(),
            cron: Some("*/5 * * * *".into()),
            tz: Some("Europe/Berlin".into()),
            prompt: Some("hello".into()),
            tools: Some(vec!["kv".into()]),
            max_late_seconds: Some(60),
            ..Default::default()
        },
        created: 1,
        updated: 1,
    }
}

pub(super) fn claim(schedule: &str, run: &str, fire_at: i64, next: Option<i64>) -> Claim {
    Claim {
        run_id: run.into(),
        schedule_id: schedule.into(),
        fire_at,
        missed_count: 0,
        claimed_by: "boot-1".into(),
        next_fire_at: next,
        status: RunStatus::Claimed,
        error: None,
        now: fire_at + 5,
    }
}

fn finish(status: RunStatus, deliveries: Vec<(String, serde_json::Value)>) -> RunFinish {
    RunFinish {
        status,
        finished_at: 9_000,
        session_id: Some("s_1".into()),
        exec_id: None,
        cost_micros: 1234,
        summary: Some("done".into()),
        error: None,
        deliveries,
    }
}

async fn schedules_round_trip_and_list_by_agent<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    store
        .put_schedule(record("b", "bob", Some(10)))
        .await
        .unwrap();
    store
        .put_schedule(record("a", "alice", Some(20)))
        .await
        .unwrap();
    let mut changed = record("a", "alice", Some(30));
    changed.spec.prompt = Some("changed".into());
    store.put_schedule(changed.clone()).await.unwrap();

    let got = store.get_schedule("a").await.unwrap().unwrap();
    assert_eq!(got, changed);
    assert_eq!(store.get_schedule("missing").await.unwrap(), None);
    let all: Vec<String> = store
        .list_schedules(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(all, ["a", "b"]);
    let bobs = store.list_schedules(Some("bob")).await.unwrap();
    assert_eq!(bobs.len(), 1);
    assert_eq!(bobs[0].id, "b");

    store
        .set_schedule_state("a", ScheduleState::Paused, None)
        .await
        .unwrap();
    let paused = store.get_schedule("a").await.unwrap().unwrap();
    assert_eq!(
        (paused.state, paused.next_fire_at),
        (ScheduleState::Paused, None)
    );
    let err = store
        .set_schedule_state("nope", ScheduleState::Paused, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotFound {
                what: "schedule",
                ..
            }
        ),
        "{err:?}"
    );

    if let Some(raw) = db.raw() {
        let (kind, payload, missed, overlap, session): (String, String, String, String, String) =
            raw.query_row(
                "SELECT kind, payload, missed, overlap, session_mode FROM schedules WHERE id = 'a'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .unwrap();
        assert_eq!(
            (
                kind.as_str(),
                payload.as_str(),
                missed.as_str(),
                overlap.as_str(),
                session.as_str()
            ),
            ("prompt", "changed", "run-once", "skip", "new")
        );
    }
}

async fn a_claim_is_once_per_instant_and_moves_the_next_fire<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    store
        .put_schedule(record("c", "a", Some(1_000)))
        .await
        .unwrap();

    let run = store
        .claim_run(claim("c", "run_1", 1_000, Some(2_000)))
        .await
        .unwrap()
        .expect("first claim");
    assert_eq!(run.status, RunStatus::Claimed);
    assert_eq!((run.fire_at, run.claimed_by.as_str()), (1_000, "boot-1"));
    assert_eq!(
        store.get_schedule("c").await.unwrap().unwrap().next_fire_at,
        Some(2_000)
    );

    // The same instant again (a restarted gateway, a second one): refused, nothing moves.
    assert_eq!(
        store
            .claim_run(claim("c", "run_2", 1_000, Some(3_000)))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.get_schedule("c").await.unwrap().unwrap().next_fire_at,
        Some(2_000),
        "a refused claim does not move a next fire that is past the instant"
    );
    assert_eq!(store.schedule_runs("c", 10).await.unwrap().len(), 1);

    // A skipped fire is a finished row.
    let skipped = Claim {
        status: RunStatus::Skipped,
        error: Some("overlap".into()),
        ..claim("c", "run_3", 2_000, Some(3_000))
    };
    let row = store.claim_run(skipped).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Skipped);
    assert_eq!(row.finished_at, Some(2_005));
    assert_eq!(row.error.as_deref(), Some("overlap"));

    // A one-off is done after its claim, and a done schedule cannot be claimed.
    store
        .put_schedule(record("once", "a", Some(5_000)))
        .await
        .unwrap();
    store
        .claim_run(claim("once", "run_4", 5_000, None))
        .await
        .unwrap()
        .unwrap();
    let once = store.get_schedule("once").await.unwrap().unwrap();
    assert_eq!((once.state, once.next_fire_at), (ScheduleState::Done, None));
    assert_eq!(
        store
            .claim_run(claim("once", "run_5", 6_000, None))
            .await
            .unwrap(),
        None
    );
    // Paused and missing schedules are not claimed either.
    store
        .set_schedule_state("c", ScheduleState::Paused, Some(3_000))
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_run(claim("c", "run_6", 3_000, Some(4_000)))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .claim_run(claim("missing", "run_7", 3_000, None))
            .await
            .unwrap(),
        None
    );

    let history: Vec<i64> = store
        .schedule_runs("c", 10)
        .await
        .unwrap()
        .iter()
        .map(|r| r.fire_at)
        .collect();
    assert_eq!(history, [2_000, 1_000], "newest first");
    assert_eq!(store.schedule_runs("c", 1).await.unwrap().len(), 1);

    if let Some(raw) = db.raw() {
        // The unique key itself refuses a second row for an instant.
        let dup = raw.execute(
            "INSERT INTO schedule_runs (id, schedule_id, fire_at, status, claimed_by)
             VALUES ('x', 'c', 1000, 'claimed', 'b')",
            [],
        );
        assert!(dup.is_err(), "UNIQUE(schedule_id, fire_at)");
    }
}

async fn start_and_finish_move_forward_only_and_enqueue_once<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    store
        .put_schedule(record("s", "a", Some(1_000)))
        .await
        .unwrap();
    store
        .claim_run(claim("s", "run_1", 1_000, Some(2_000)))
        .await
        .unwrap()
        .unwrap();

    assert!(store.start_run("run_1", 1_100).await.unwrap());
    assert!(
        !store.start_run("run_1", 1_200).await.unwrap(),
        "only from claimed"
    );
    let running = store.get_run("run_1").await.unwrap().unwrap();
    assert_eq!(
        (running.status, running.started_at),
        (RunStatus::Running, Some(1_100))
    );

    let delivery = vec![(
        "telegram".to_string(),
        json!({"chatId": "42", "text": "the answer"}),
    )];
    assert!(store
        .finish_run("run_1", finish(RunStatus::Ok, delivery.clone()))
        .await
        .unwrap());
    assert!(
        !store
            .finish_run("run_1", finish(RunStatus::Failed, delivery))
            .await
            .unwrap(),
        "a finished run is not finished again"
    );
    let done = store.get_run("run_1").await.unwrap().unwrap();
    assert_eq!(done.status, RunStatus::Ok);
    assert_eq!(done.summary.as_deref(), Some("done"));
    assert_eq!((done.cost_micros, done.finished_at), (1234, Some(9_000)));
    assert_eq!(done.session_id.as_deref(), Some("s_1"));
    let out = store.due_outbox("telegram", i64::MAX, 10).await.unwrap();
    assert_eq!(out.len(), 1, "the delivery is enqueued exactly once");
    assert_eq!(out[0].payload["text"], "the answer");
    assert!(!store.start_run("run_1", 1).await.unwrap());
    assert!(!store.start_run("missing", 1).await.unwrap());
    assert!(!store
        .finish_run("missing", finish(RunStatus::Ok, vec![]))
        .await
        .unwrap());
}

async fn open_runs_survive_a_restart<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    store
        .put_schedule(record("r", "a", Some(1_000)))
        .await
        .unwrap();
    for (i, at) in [1_000, 2_000, 3_000].into_iter().enumerate() {
        store
            .claim_run(claim("r", &format!("run_{i}"), at, Some(at + 1_000)))
            .await
            .unwrap()
            .unwrap();
    }
    store.start_run("run_1", 2_100).await.unwrap();
    store
        .finish_run("run_2", finish(RunStatus::Ok, vec![]))
        .await
        .unwrap();
    drop(store);

    let store = db.open().await;
    let open = store.open_runs().await.unwrap();
    let open: Vec<(&str, RunStatus)> = open.iter().map(|r| (r.id.as_str(), r.status)).collect();
    assert_eq!(
        open,
        [("run_0", RunStatus::Claimed), ("run_1", RunStatus::Running)]
    );
    assert_eq!(
        store.get_schedule("r").await.unwrap().unwrap().next_fire_at,
        Some(4_000)
    );
}

async fn a_running_run_is_rerun_once<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    store
        .put_schedule(record("r", "a", Some(1_000)))
        .await
        .unwrap();
    store
        .claim_run(claim("r", "run_1", 1_000, Some(2_000)))
        .await
        .unwrap()
        .unwrap();
    // Only a running run can be rerun.
    assert!(!store.rerun_run("run_1", "boot-2", 1_500).await.unwrap());
    assert!(store.start_run("run_1", 1_100).await.unwrap());
    drop(store);

    let store = db.open().await;
    assert!(store.rerun_run("run_1", "boot-2", 1_500).await.unwrap());
    let run = store.get_run("run_1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.claimed_by, format!("{RERUN_PREFIX}boot-2"));
    assert_eq!(run.started_at, Some(1_500));
    // Never twice, by this boot or the next.
    assert!(!store.rerun_run("run_1", "boot-2", 1_600).await.unwrap());
    assert!(!store.rerun_run("run_1", "boot-3", 1_700).await.unwrap());
    store
        .finish_run("run_1", finish(RunStatus::Ok, vec![]))
        .await
        .unwrap();
    assert!(!store.rerun_run("run_1", "boot-4", 1_800).await.unwrap());
    assert!(!store.rerun_run("missing", "boot-4", 1_800).await.unwrap());
}
