//! `kill` through the binary: a second `beige-shim op kill` ends a running
//! `beige-shim op exec` started with the same exec id.
//!
//! Every test uses its own id, suffixed with the test process's pid, so tests running
//! in parallel (or concurrent runs of the suite) never see each other's processes.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use beige_protocol::op::{
    ExecReply, ExecRequest, KillReply, KillRequest, OpErrorKind, OpReply, OpRequest,
    EXEC_KILL_GRACE_SECS,
};

use super::{run, run_err, run_raw};

/// An id unique to this test and this run.
fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

fn exec_with_id(command: &str, id: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        timeout_secs: 60,
        env: Vec::new(),
        cwd: None,
        max_output_bytes: beige_protocol::op::DEFAULT_EXEC_MAX_OUTPUT_BYTES,
        exec_id: Some(id.into()),
        raw_output: false,
    }
}

fn kill(ws: &Path, id: &str) -> KillReply {
    match run(ws, &OpRequest::Kill(KillRequest { exec_id: id.into() })) {
        OpReply::Kill(k) => k,
        other => panic!("unexpected {other:?}"),
    }
}

/// Starts `beige-shim op exec` in a thread; the thread returns the reply and when it
/// arrived.
fn spawn_exec(ws: &Path, req: ExecRequest) -> thread::JoinHandle<(ExecReply, Instant)> {
    let ws: PathBuf = ws.to_path_buf();
    thread::spawn(move || match run(&ws, &OpRequest::Exec(req)) {
        OpReply::Exec(r) => (r, Instant::now()),
        other => panic!("unexpected {other:?}"),
    })
}

/// Pids of the live (not zombie) processes whose environment holds
/// `BEIGE_EXEC_ID=<id>`.
fn carrying(id: &str) -> Vec<u32> {
    let entry = format!("BEIGE_EXEC_ID={id}");
    let mut pids = Vec::new();
    for dirent in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = dirent
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(dirent.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            continue;
        }
        let Ok(env) = std::fs::read(dirent.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|e| e == entry.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Waits until at least `n` processes carry the id.
fn wait_for(id: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while carrying(id).len() < n {
        assert!(
            Instant::now() < deadline,
            "only {:?} carry {id}",
            carrying(id)
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kill_ends_a_running_exec_promptly() {
    let ws = tempfile::tempdir().unwrap();
    let id = unique("t1");
    let runner = spawn_exec(ws.path(), exec_with_id("sleep 100 & sleep 100; wait", &id));
    // The shell and both sleeps.
    wait_for(&id, 3);

    let started = Instant::now();
    let reply = kill(ws.path(), &id);
    assert!(reply.found >= 1, "{reply:?}");
    let (exec, done) = runner.join().unwrap();
    let took = done.saturating_duration_since(started);
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(
        matches!(exec.signal, Some(libc::SIGTERM | libc::SIGKILL)),
        "{exec:?}"
    );
    assert_eq!(exec.exit_code, None);
    assert!(!exec.timed_out);
    assert_eq!(carrying(&id), Vec::<u32>::new());

    // A second kill finds nothing left.
    assert_eq!(kill(ws.path(), &id).found, 0);
}

#[test]
fn kill_reaches_escaped_and_term_ignoring_processes() {
    let ws = tempfile::tempdir().unwrap();
    let has_setsid = std::process::Command::new("setsid")
        .arg("--version")
        .output()
        .is_ok();
    let id = unique("t-stubborn");
    // Everything ignores SIGTERM; with setsid, one process also leaves the group (and
    // the session) but keeps the environment. The pid file is written after setsid.
    let command = if has_setsid {
        "trap '' TERM; setsid sh -c 'echo $$ > d.pid; exec sleep 100' & sleep 100 & sleep 100; wait"
    } else {
        "trap '' TERM; echo none > d.pid; sleep 100 & sleep 100; wait"
    };
    let runner = spawn_exec(ws.path(), exec_with_id(command, &id));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(ws.path().join("d.pid"))
        .map(|s| !s.ends_with('\n'))
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "the command did not start");
        thread::sleep(Duration::from_millis(20));
    }
    wait_for(&id, if has_setsid { 4 } else { 3 });

    let started = Instant::now();
    let reply = kill(ws.path(), &id);
    let took = started.elapsed();
    assert_eq!(reply.found, if has_setsid { 2 } else { 1 }, "{reply:?}");
    let grace = Duration::from_secs(EXEC_KILL_GRACE_SECS);
    assert!(took >= grace, "{took:?}");
    assert!(took < grace + Duration::from_secs(3), "{took:?}");
    let (exec, done) = runner.join().unwrap();
    assert!(
        done.saturating_duration_since(started) < grace + Duration::from_secs(3),
        "{exec:?}"
    );
    assert_eq!(exec.signal, Some(libc::SIGKILL), "{exec:?}");
    assert_eq!(carrying(&id), Vec::<u32>::new());
}

#[test]
fn kill_of_an_unused_id_finds_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let started = Instant::now();
    assert_eq!(kill(ws.path(), &unique("nobody-uses-this")).found, 0);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn finished_exec_leaves_nothing_to_kill() {
    let ws = tempfile::tempdir().unwrap();
    let id = unique("t-done");
    let (exec, _) = spawn_exec(
        ws.path(),
        exec_with_id("sleep 100 & echo \"$BEIGE_EXEC_ID\"", &id),
    )
    .join()
    .unwrap();
    assert_eq!(exec.exit_code, Some(0));
    assert_eq!(exec.stdout, format!("{id}\n"));
    assert_eq!(kill(ws.path(), &id).found, 0);
}

#[test]
fn invalid_exec_ids_are_bad_requests() {
    let ws = tempfile::tempdir().unwrap();
    for bad in ["", "a b", "x=y", "../x", &"a".repeat(65)] {
        let err = run_err(
            ws.path(),
            &OpRequest::Kill(KillRequest {
                exec_id: bad.to_string(),
            }),
        );
        assert_eq!(err.kind, OpErrorKind::BadRequest, "{bad:?}");
        let err = run_err(ws.path(), &OpRequest::Exec(exec_with_id("touch ran", bad)));
        assert_eq!(err.kind, OpErrorKind::BadRequest, "{bad:?}");
        assert!(!ws.path().join("ran").exists());
    }

    // A kill request without an id is not a request at all.
    let out = run_raw(ws.path(), "kill", br#"{"op":"kill"}"#);
    assert_eq!(out.status.code(), Some(2));
    match serde_json::from_slice::<OpReply>(&out.stdout).unwrap() {
        OpReply::Error(e) => assert_eq!(e.kind, OpErrorKind::BadRequest),
        other => panic!("unexpected {other:?}"),
    }
}
