//! `exec` through the binary: exit codes, output cap, timeout and process-group kill.

use std::time::{Duration, Instant};

use beige_protocol::op::{ExecReply, ExecRequest, OpReply, OpRequest};

use super::run;

fn exec(command: &str, timeout_secs: u64) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        timeout_secs,
        env: Vec::new(),
        cwd: None,
        max_output_bytes: beige_protocol::op::DEFAULT_EXEC_MAX_OUTPUT_BYTES,
        exec_id: None,
        raw_output: false,
    }
}

fn run_exec(ws: &std::path::Path, req: ExecRequest) -> ExecReply {
    match run(ws, &OpRequest::Exec(req)) {
        OpReply::Exec(r) => r,
        other => panic!("unexpected {other:?}"),
    }
}

/// Whether process `pid` has ended (gone, or a zombie awaiting its new parent).
fn ended(pid: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn exit_code_and_streams() {
    let ws = tempfile::tempdir().unwrap();
    let mut req = exec(
        "echo out; echo err >&2; echo \"$BEIGE_AGENT_NAME\"; pwd; exit 7",
        10,
    );
    req.env = vec![("BEIGE_AGENT_NAME".into(), "intern".into())];
    let r = run_exec(ws.path(), req);
    assert_eq!(r.exit_code, Some(7));
    assert_eq!(r.signal, None);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[..2], ["out", "intern"]);
    assert_eq!(
        std::fs::canonicalize(lines[2]).unwrap(),
        std::fs::canonicalize(ws.path()).unwrap()
    );
    assert_eq!(r.stderr, "err\n");
    assert!(!r.timed_out);
}

#[test]
fn flood_of_50_mb_stays_capped_and_small() {
    let ws = tempfile::tempdir().unwrap();
    // $PPID is the shim: report its peak memory after it has swallowed the flood.
    let cmd = "head -c 50000000 /dev/zero | tr '\\0' a; grep VmHWM /proc/$PPID/status >&2";
    let started = Instant::now();
    let r = run_exec(ws.path(), exec(cmd, 60));
    assert_eq!(r.exit_code, Some(0));
    let cap = beige_protocol::op::DEFAULT_EXEC_MAX_OUTPUT_BYTES as usize;
    let kept = r.stdout.bytes().filter(|&b| b == b'a').count();
    assert!(kept <= cap, "kept {kept}");
    assert!(kept >= cap - r.stderr.len() - 1, "kept {kept}");
    assert_eq!(r.stdout_omitted, 50_000_000 - kept as u64);
    assert!(r
        .stdout
        .contains(&format!("[... {} bytes omitted ...]", r.stdout_omitted)));
    let hwm_kb: u64 = r
        .stderr
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {:?}", r.stderr));
    assert!(hwm_kb < 20 * 1024, "the shim's peak memory was {hwm_kb} kB");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn timeout_kills_the_whole_group() {
    let ws = tempfile::tempdir().unwrap();
    let cmd = "sleep 100 & echo $! > bg.pid; sleep 100 & echo $! > fg.pid; sleep 100; wait";
    let started = Instant::now();
    let r = run_exec(ws.path(), exec(cmd, 2));
    let took = started.elapsed();
    assert!(r.timed_out);
    assert_eq!(r.exit_code, None);
    assert_eq!(r.signal, Some(libc::SIGTERM));
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(r.duration_ms >= 2000);
    for f in ["bg.pid", "fg.pid"] {
        let pid = std::fs::read_to_string(ws.path().join(f)).unwrap();
        assert!(ended(pid.trim()), "sleep from {f} survived");
    }
}

#[test]
fn sigterm_ignoring_command_is_killed_after_grace() {
    let ws = tempfile::tempdir().unwrap();
    let cmd = "trap '' TERM; echo $$ > sh.pid; while :; do sleep 1; done";
    let started = Instant::now();
    let r = run_exec(ws.path(), exec(cmd, 1));
    let took = started.elapsed();
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(libc::SIGKILL));
    let grace = beige_protocol::op::EXEC_KILL_GRACE_SECS;
    assert!(took >= Duration::from_secs(1 + grace), "{took:?}");
    assert!(took < Duration::from_secs(1 + grace + 3), "{took:?}");
    let pid = std::fs::read_to_string(ws.path().join("sh.pid")).unwrap();
    assert!(ended(pid.trim()));
}

#[test]
fn background_child_does_not_outlive_or_delay_the_reply() {
    let ws = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let r = run_exec(
        ws.path(),
        exec("sleep 100 & echo $! > bg.pid; echo done", 10),
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!((r.exit_code, r.stdout.as_str()), (Some(0), "done\n"));
    let pid = std::fs::read_to_string(ws.path().join("bg.pid")).unwrap();
    assert!(ended(pid.trim()));
}

#[test]
fn escaped_daemon_holding_the_pipe_cannot_hold_the_reply() {
    let ws = tempfile::tempdir().unwrap();
    if std::process::Command::new("setsid")
        .arg("--version")
        .output()
        .is_err()
    {
        return;
    }
    let started = Instant::now();
    let r = run_exec(
        ws.path(),
        exec(
            "setsid sh -c 'echo $$ > d.pid; exec sleep 30' & sleep 0.3; echo done",
            10,
        ),
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.exit_code, Some(0));
    assert!(r.stdout.starts_with("done"));
    if let Ok(pid) = std::fs::read_to_string(ws.path().join("d.pid")) {
        // The daemon leads its own session and group: end all of it.
        let group = format!("-{}", pid.trim());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
    }
}

/// Runs `command` (which starts `setsid sleep <secs>` detached) and returns the reply
/// with the pid of that survivor, which the caller must kill.
fn run_with_survivor(command: &str, timeout_secs: u64) -> (ExecReply, Option<u32>) {
    let ws = tempfile::tempdir().unwrap();
    let r = run_exec(ws.path(), exec(command, timeout_secs));
    let pid = r
        .survivors
        .iter()
        .find(|s| s.command.contains("sleep 31"))
        .map(|s| s.pid);
    (r, pid)
}

fn kill_survivor(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

#[test]
fn escaped_daemon_is_reported_as_survivor() {
    if std::process::Command::new("setsid")
        .arg("--version")
        .output()
        .is_err()
    {
        return;
    }
    let (r, pid) = run_with_survivor(
        "setsid sleep 31 >/dev/null 2>&1 < /dev/null & sleep 0.3; echo done",
        10,
    );
    kill_survivor(pid);
    assert_eq!(r.exit_code, Some(0));
    assert!(pid.is_some(), "no survivor in {:?}", r.survivors);
    // The shell and its group members are not survivors.
    assert!(r.survivors.iter().all(|s| !s.command.contains("sleep 0.3")));
}

#[test]
fn survivor_of_a_timed_out_command_is_reported() {
    if std::process::Command::new("setsid")
        .arg("--version")
        .output()
        .is_err()
    {
        return;
    }
    let (r, pid) = run_with_survivor("setsid sleep 31 >/dev/null 2>&1 < /dev/null & sleep 100", 1);
    kill_survivor(pid);
    assert!(r.timed_out);
    assert!(pid.is_some(), "no survivor in {:?}", r.survivors);
    assert!(r.survivors.iter().all(|s| !s.command.contains("sleep 100")));
}

#[test]
fn no_survivors_without_escape() {
    let ws = tempfile::tempdir().unwrap();
    let r = run_exec(ws.path(), exec("sleep 97 & echo started", 10));
    assert!(
        r.survivors.iter().all(|s| !s.command.contains("sleep 97")),
        "{:?}",
        r.survivors
    );
}

#[test]
fn signals_to_the_shim_reach_the_command() {
    use std::io::Write;
    let ws = tempfile::tempdir().unwrap();
    let request = OpRequest::Exec(exec(
        "trap 'echo got TERM; exit 5' TERM; echo ready > ready; sleep 30 & wait",
        20,
    ));
    let mut child = super::shim()
        .args(["op", "exec"])
        .env("BEIGE_WORKSPACE", ws.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&request).unwrap())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ws.path().join("ready").exists() {
        assert!(Instant::now() < deadline, "the command did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(0));
    match serde_json::from_slice(&out.stdout).unwrap() {
        OpReply::Exec(r) => {
            assert_eq!(r.exit_code, Some(5), "{r:?}");
            assert_eq!(r.stdout, "got TERM\n");
        }
        other => panic!("unexpected {other:?}"),
    }
}
