//! Schedules through the built binary and a real Docker sandbox: a schedule due every 2 s
//! fires once per due instant while the gateway daemon is SIGKILLed at random moments and
//! aborted at the engine's failpoints (before the claim commits, right after it, right
//! after `started`); two schedules due in the same second each keep their own history;
//! and `beige schedule` manages a schedule end to end.
//!
//! Each exec run appends one line to a file in the workspace, so the number of runs that
//! really happened can be compared with the history: a fire that ran twice would leave
//! more lines than runs that started.

use std::time::{Duration, Instant};

use beige_core::api::schedules::{RunStatus, ScheduleRun, ScheduleView};
use beige_testkit::llm::FakeLlmServer;

use super::daemon::{beige, DaemonGuard};
use super::{free_port, TestEnv};
use crate::docker_or_skip;

/// The cron of the crash test: every second second, in UTC.
const EVERY_2S: &str = "*/2 * * * * *";

fn write_config(env: &TestEnv, provider_url: &str, port: u16, image: &str, schedules: &str) {
    let config = format!(
        r#"// written by the schedules test
{{
  llm: {{ providers: {{ anthropic: {{ apiKey: "sk-test-schedules", baseUrl: "{provider_url}" }} }} }},
  agents: {{
    a1: {{
      model: {{ provider: "anthropic", model: "claude-sonnet-4-6" }},
      tools: [],
      sandbox: {{ image: "{image}", memoryLimit: "256m", pidsLimit: 128 }},
    }},
  }},
  schedules: {{ {schedules} }},
  gateway: {{ host: "127.0.0.1", port: {port} }},
}}
"#
    );
    std::fs::write(env.home().join("config.json5"), config).unwrap();
}

/// The daemon's pid from `gateway.pid`.
fn daemon_pid(env: &TestEnv) -> Option<i32> {
    std::fs::read_to_string(env.home().join("gateway.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // The state follows the command name in parentheses.
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
    }
}

/// SIGKILL the daemon and wait until it is gone.
fn kill_daemon(env: &TestEnv) {
    let pid = daemon_pid(env).expect("the daemon's pid file");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -KILL {pid}");
    wait_gone(pid, Duration::from_secs(10));
}

fn wait_gone(pid: i32, limit: Duration) {
    let start = Instant::now();
    while alive(pid) {
        assert!(start.elapsed() < limit, "PID {pid} is still alive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(env: &TestEnv) {
    let run = beige(env, &["gateway", "start", "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
}

/// Start the daemon with `BEIGE_FAILPOINT` set, and wait until it aborted there.
fn start_until_failpoint(env: &TestEnv, failpoint: &str) {
    let out = tokio::task::block_in_place(|| {
        env.command(&["gateway", "start", "--timeout", "120"])
            .env(beige_core::schedule::FAILPOINT_ENV, failpoint)
            .output()
            .unwrap()
    });
    // The daemon may abort before or after `start` saw it ready.
    let pid = daemon_pid(env);
    if let Some(pid) = pid {
        let start = Instant::now();
        while alive(pid) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the daemon did not stop at failpoint {failpoint}; its log:\n{}",
                gateway_log(env)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        // It stopped there while `start` still watched it (a catch-up fire at start).
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("SIGABRT") && stderr.contains(failpoint),
            "no daemon stopped at failpoint {failpoint}: {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout),
        );
    }
}

/// The daemon's log, for failure messages.
fn gateway_log(env: &TestEnv) -> String {
    let text = std::fs::read_to_string(env.home().join("logs/gateway.log")).unwrap_or_default();
    let start = text.len().saturating_sub(6000);
    text.get(start..).unwrap_or_default().to_string()
}

/// A pseudo-random duration in `lo..hi` ms (the test's moments need not be reproducible).
fn random_ms(lo: u64, hi: u64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let x = (u64::from(nanos) ^ 0x9e37_79b9).wrapping_mul(6_364_136_223_846_793_005) >> 33;
    Duration::from_millis(lo + x % (hi - lo))
}

fn history(env: &TestEnv, id: &str) -> Vec<ScheduleRun> {
    let run = beige(env, &["schedule", "history", id, "-n", "1000", "--json"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let value: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("history is not JSON ({e}): {}", run.stdout));
    let runs = value.get("runs").cloned().unwrap_or(value);
    serde_json::from_value(runs).unwrap()
}

/// Lines of a workspace file, read through the sandbox.
fn lines_in_workspace(env: &TestEnv, file: &str) -> usize {
    let run = beige(
        env,
        &[
            "exec",
            "a1",
            "--",
            &format!("cat /workspace/{file} || true"),
        ],
    );
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    run.stdout.lines().filter(|l| !l.is_empty()).count()
}

/// The checks of one schedule's history against the lines its runs wrote.
fn check_exactly_once(name: &str, runs: &[ScheduleRun], lines: usize) {
    assert!(
        runs.len() >= 5,
        "{name}: only {} runs: {runs:#?}",
        runs.len()
    );
    let mut instants: Vec<i64> = runs.iter().map(|r| r.fire_at).collect();
    instants.sort_unstable();
    let before = instants.len();
    instants.dedup();
    assert_eq!(instants.len(), before, "{name}: two runs for one instant");
    for r in runs {
        assert!(
            r.status.is_final(),
            "{name}: a run was left {:?}: {r:#?}",
            r.status
        );
        assert_eq!(
            r.fire_at % 2000,
            0,
            "{name}: {} is no due instant",
            r.fire_at
        );
        assert!(
            matches!(
                r.status,
                RunStatus::Ok | RunStatus::Interrupted | RunStatus::Skipped
            ),
            "{name}: unexpected status: {r:#?}"
        );
    }
    let summary: Vec<String> = runs
        .iter()
        .rev()
        .map(|r| {
            format!(
                "{}:{}/{}{}",
                r.fire_at / 1000 % 100,
                r.status,
                r.missed_count,
                r.error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    eprintln!(
        "{name}: {lines} lines; runs (s:status/missed): {}",
        summary.join(" ")
    );
    let ok = runs.iter().filter(|r| r.status == RunStatus::Ok).count();
    let interrupted = runs
        .iter()
        .filter(|r| r.status == RunStatus::Interrupted)
        .count();
    // Every ok run wrote its line; an interrupted one may or may not have; nothing
    // else ran, and nothing ran twice.
    assert!(
        lines >= ok && lines <= ok + interrupted,
        "{name}: {lines} lines written, {ok} ok and {interrupted} interrupted runs: {runs:#?}"
    );
    // Every due instant from the first to the last run is accounted for: by its own
    // run, or inside the missed count of the run that coalesced it.
    let first = instants[0];
    let last = instants[instants.len() - 1];
    let due = usize::try_from((last - first) / 2000 + 1).unwrap();
    let covered: usize = runs
        .iter()
        .map(|r| usize::try_from(r.missed_count.max(1)).unwrap())
        .sum();
    assert_eq!(
        covered, due,
        "{name}: {due} instants were due from the first run to the last, the history accounts for {covered}: {runs:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_two_second_schedule_fires_once_per_instant_across_sigkills() {
    let docker = docker_or_skip!();
    let fake = FakeLlmServer::start().await;
    let env = TestEnv::new();
    let _guard = DaemonGuard(&env);
    let run = beige(&env, &["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let port = free_port();
    // Two schedules on the same cron: two fires due in the same second, every time.
    let schedules = format!(
        r#"tick: {{ agent: "a1", cron: "{EVERY_2S}", tz: "UTC", exec: "echo tick >> /workspace/tick.log", missed: "run-once" }},
           tock: {{ agent: "a1", cron: "{EVERY_2S}", tz: "UTC", exec: "echo tock >> /workspace/tock.log", missed: "run-once" }},"#
    );
    write_config(&env, &fake.url(), port, &docker.image, &schedules);
    start(&env);

    let began = Instant::now();
    // Five SIGKILLs at random moments, a random time apart.
    for i in 0..5 {
        tokio::time::sleep(random_ms(1_500, 4_500)).await;
        tokio::task::block_in_place(|| kill_daemon(&env));
        // Once down across several due instants, which the next start coalesces.
        let down = if i == 2 {
            Duration::from_millis(5_500)
        } else {
            random_ms(0, 2_500)
        };
        tokio::time::sleep(down).await;
        start(&env);
    }
    // And at each exact moment of a fire: before the claim commits, right after it, and
    // right after the run was marked started (so during the exec).
    for failpoint in [
        "schedule.before_claim_commit",
        "schedule.after_claim",
        "schedule.after_start",
    ] {
        tokio::time::sleep(random_ms(1_000, 3_000)).await;
        tokio::task::block_in_place(|| kill_daemon(&env));
        start_until_failpoint(&env, failpoint);
        start(&env);
    }
    let left = Duration::from_secs(30).saturating_sub(began.elapsed());
    tokio::time::sleep(left.max(Duration::from_secs(4))).await;

    // Stop firing, let a run in flight end, then read the histories.
    for id in ["tick", "tock"] {
        let run = beige(&env, &["schedule", "pause", id]);
        assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    }
    let settle = Instant::now();
    loop {
        let open = ["tick", "tock"]
            .iter()
            .flat_map(|id| history(&env, id))
            .filter(|r| !r.status.is_final())
            .count();
        if open == 0 {
            break;
        }
        assert!(
            settle.elapsed() < Duration::from_secs(20),
            "{open} runs still open after the pause"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tick = history(&env, "tick");
    let tock = history(&env, "tock");
    check_exactly_once("tick", &tick, lines_in_workspace(&env, "tick.log"));
    check_exactly_once("tock", &tock, lines_in_workspace(&env, "tock.log"));
    // The crash after `started` left a run interrupted in at least one schedule, and the
    // two schedules fired in the same seconds.
    assert!(
        tick.iter()
            .chain(&tock)
            .any(|r| r.status == RunStatus::Interrupted),
        "no interrupted run: {tick:#?} {tock:#?}"
    );
    let common = tick
        .iter()
        .filter(|r| tock.iter().any(|o| o.fire_at == r.fire_at))
        .count();
    assert!(common >= 3, "tick and tock share only {common} instants");
    assert!(
        tick.iter().any(|r| r.missed_count >= 2),
        "the long stop left no coalesced run: {tick:#?}"
    );
    assert_eq!(fake.request_count(), 0, "an exec schedule calls no model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn beige_schedule_adds_lists_runs_pauses_and_cancels() {
    let docker = docker_or_skip!();
    let fake = FakeLlmServer::start().await;
    let env = TestEnv::new();
    let _guard = DaemonGuard(&env);
    let run = beige(&env, &["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let port = free_port();
    write_config(&env, &fake.url(), port, &docker.image, "");
    start(&env);

    // Refusals name what is wrong.
    let run = beige(
        &env,
        &[
            "schedule",
            "add",
            "nobody",
            "--cron",
            "0 8 * * *",
            "--exec",
            "true",
        ],
    );
    assert_ne!(run.code, Some(0));
    assert!(run.stderr.contains("nobody"), "{}", run.stderr);
    let run = beige(
        &env,
        &[
            "schedule",
            "add",
            "a1",
            "--cron",
            "61 8 * * *",
            "--exec",
            "true",
        ],
    );
    assert_ne!(run.code, Some(0));
    assert!(run.stderr.contains("61 8 * * *"), "{}", run.stderr);

    let run = beige(
        &env,
        &[
            "schedule",
            "add",
            "a1",
            "--cron",
            "0 3 * * *",
            "--tz",
            "Europe/Berlin",
            "--exec",
            "echo manual >> /workspace/manual.log",
            "--json",
        ],
    );
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let view: ScheduleView = serde_json::from_str(&run.stdout).unwrap();
    assert!(view.id.starts_with("sch_"), "{}", view.id);
    assert!(view.next_fire_at.is_some());

    let run = beige(&env, &["schedule", "list"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains(&view.id), "{}", run.stdout);
    assert!(run.stdout.contains("Europe/Berlin"), "{}", run.stdout);

    let run = beige(&env, &["schedule", "run", &view.id]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let started = Instant::now();
    let runs = loop {
        let runs = history(&env, &view.id);
        if runs.iter().any(|r| r.status.is_final()) {
            break runs;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{runs:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(runs[0].status, RunStatus::Ok, "{runs:#?}");
    assert_eq!(lines_in_workspace(&env, "manual.log"), 1);

    let run = beige(&env, &["schedule", "pause", &view.id]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let run = beige(&env, &["schedule", "get", &view.id, "--json"]);
    let shown: ScheduleView = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(shown.state.as_str(), "paused");
    let run = beige(&env, &["schedule", "cancel", &view.id]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let run = beige(&env, &["schedule", "get", &view.id, "--json"]);
    let shown: ScheduleView = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(shown.state.as_str(), "cancelled");
    // The history stays.
    assert_eq!(history(&env, &view.id).len(), 1);
    let run = beige(&env, &["schedule", "get", "sch_nothere00"]);
    assert_ne!(run.code, Some(0));
    assert!(run.stderr.contains("sch_nothere00"), "{}", run.stderr);
}
