//! The registry and attribution against a procfs built in a folder: the host sees the
//! gateway at depth 1 and the sandbox's processes at depth 2.

use super::*;

/// A fake `/proc`.
struct FakeProc(tempfile::TempDir);

impl FakeProc {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        std::fs::write(
            dir.path().join("self/status"),
            "Name:\tbeige\nNSpid:\t900\n",
        )
        .unwrap();
        Self(dir)
    }

    /// A process: host pid, pids outermost first, host ppid, session ids outermost
    /// first, start time and command name.
    fn add(&self, nspid: &[u32], ppid: u32, nssid: &[u32], starttime: u64, comm: &str) {
        let dir = self.0.path().join(nspid[0].to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join("\t");
        std::fs::write(
            dir.join("stat"),
            format!(
                "{} ({comm}) S {ppid} {} {} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {starttime} 1000 10 0\n",
                nspid[0], nssid[0], nssid[0]
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("status"),
            format!(
                "Name:\t{}\nNStgid:\t{}\nNSpid:\t{}\nNSpgid:\t{}\nNSsid:\t{}\n",
                comm.replace('\n', "\\n"),
                join(nspid),
                join(nspid),
                join(nssid),
                join(nssid)
            ),
        )
        .unwrap();
    }

    fn remove(&self, host_pid: u32) {
        std::fs::remove_dir_all(self.0.path().join(host_pid.to_string())).unwrap();
    }

    fn registry(&self) -> ExecRegistry {
        ExecRegistry::with_proc_root(self.0.path())
    }
}

fn session(key: &str) -> ExecSession {
    ExecSession {
        key: Some(key.to_string()),
        channel: Some("api".to_string()),
        ..Default::default()
    }
}

/// PID 1 of the container (host 1001), exec A's root (container 5, host 1005).
fn sandbox() -> (FakeProc, ExecRegistry, ExecId) {
    let proc = FakeProc::new();
    proc.add(&[1001, 1], 800, &[1001, 1], 100, "beige-shim");
    proc.add(&[1005, 5], 1001, &[1005, 5], 500, "beige-shim");
    let reg = proc.registry();
    let a = ExecId::new("xa");
    reg.register("agent", &a, session("api:a"), "python loop.py");
    assert!(reg.started("agent", "xa", 5, 500));
    (proc, reg, a)
}

#[test]
fn a_member_of_the_roots_session_is_bound_by_session_id_whatever_its_name() {
    let (proc, reg, a) = sandbox();
    for (i, comm) in ["kv", "a b) R 1 1", "((", ")"].iter().enumerate() {
        let host = 1010 + i as u32;
        proc.add(&[host, 10 + i as u32], 1005, &[1005, 5], 600, comm);
        assert_eq!(
            reg.attribute_now("agent", host),
            Attribution::bound(a.clone(), AttributionMethod::SessionId),
            "{comm:?}"
        );
    }
    // Another agent's registry knows nothing of it.
    assert_eq!(reg.attribute_now("other", 1010), Attribution::unbound());
}

#[test]
fn when_the_leader_has_exited_the_callers_nssid_still_names_the_exec() {
    let (proc, reg, a) = sandbox();
    proc.add(&[1010, 10], 1001, &[1005, 5], 600, "daemon");
    proc.remove(1005);
    assert_eq!(
        reg.attribute_now("agent", 1010),
        Attribution::bound(a, AttributionMethod::SessionId)
    );
    // A process older than the root cannot be in its session.
    proc.add(&[1011, 11], 1001, &[1005, 5], 400, "old");
    assert_eq!(reg.attribute_now("agent", 1011), Attribution::unbound());
}

#[test]
fn a_process_that_left_the_session_is_bound_by_ancestry_and_then_cached() {
    let (proc, reg, a) = sandbox();
    proc.add(&[1020, 20], 1005, &[1020, 20], 600, "setsid child");
    proc.add(&[1021, 21], 1020, &[1020, 20], 700, "grandchild");
    let want = Attribution::bound(a, AttributionMethod::Ancestry);
    assert_eq!(reg.attribute_now("agent", 1021), want);
    // Cached by (host pid, starttime): found even when the chain is gone.
    proc.remove(1020);
    proc.remove(1005);
    assert_eq!(reg.attribute_now("agent", 1021), want);
    // A new process with the same host pid is looked at afresh.
    proc.add(&[1021, 21], 1001, &[1021, 21], 800, "reused");
    assert_eq!(reg.attribute_now("agent", 1021), Attribution::unbound());
}

#[test]
fn re_parented_daemons_host_processes_and_reused_pids_are_unbound() {
    let (proc, reg, _a) = sandbox();
    // Double fork: its own session, parent PID 1.
    proc.add(&[1030, 30], 1001, &[1030, 30], 600, "daemon");
    assert_eq!(reg.attribute_now("agent", 1030), Attribution::unbound());
    // A host process whose pid numbers happen to match the root's container pid.
    proc.add(&[5], 1, &[5], 500, "host");
    assert_eq!(reg.attribute_now("agent", 5), Attribution::unbound());
    // The leader's pid was reused by a process that started later: not the root.
    let proc2 = FakeProc::new();
    proc2.add(&[1005, 5], 1001, &[1005, 5], 999, "reused");
    proc2.add(&[1010, 10], 1005, &[1005, 5], 1000, "kv");
    let reg2 = proc2.registry();
    reg2.register("agent", &ExecId::new("xa"), ExecSession::default(), "true");
    reg2.started("agent", "xa", 5, 500);
    assert_eq!(reg2.attribute_now("agent", 1010), Attribution::unbound());
    // Unknown peers are unbound.
    assert_eq!(reg.attribute_now("agent", 4242), Attribution::unbound());
}

#[test]
fn reports_for_unknown_or_reported_execs_are_ignored_and_ended_execs_are_bounded() {
    let (_proc, reg, a) = sandbox();
    assert!(!reg.started("agent", "xa", 6, 501), "already reported");
    assert!(!reg.started("agent", "nope", 6, 501));
    assert!(!reg.started("nobody", "xa", 6, 501));
    assert_eq!(
        reg.get("agent", &a).unwrap().root,
        Some(ProcKey {
            pid: 5,
            starttime: 500
        })
    );
    reg.ended("agent", &a);
    let rec = reg.get("agent", &a).unwrap();
    assert!(rec.ended);
    assert_eq!(rec.session, session("api:a"));
    assert_eq!(rec.command, "python loop.py");
    for i in 0..MAX_ENDED {
        let id = ExecId::new(format!("x{i}"));
        reg.register("agent", &id, ExecSession::default(), &"c".repeat(300));
        assert_eq!(reg.get("agent", &id).unwrap().command.len(), MAX_COMMAND);
        reg.ended("agent", &id);
    }
    assert_eq!(
        reg.get("agent", &a),
        None,
        "the oldest ended exec is forgotten"
    );
    assert!(reg.get("agent", &ExecId::new("x0")).is_some());
}

#[tokio::test]
async fn a_caller_racing_the_report_waits_for_it() {
    let proc = FakeProc::new();
    proc.add(&[1005, 5], 1001, &[1005, 5], 500, "beige-shim");
    proc.add(&[1010, 10], 1005, &[1005, 5], 600, "kv");
    let reg = std::sync::Arc::new(proc.registry());
    let a = ExecId::new("xa");
    reg.register("agent", &a, ExecSession::default(), "kv get");
    let late = reg.clone();
    let report = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        late.started("agent", "xa", 5, 500)
    });
    let started = Instant::now();
    let got = reg.attribute("agent", Some(1010)).await;
    assert_eq!(
        got,
        Attribution::bound(a.clone(), AttributionMethod::SessionId)
    );
    assert!(started.elapsed() < START_WAIT);
    assert!(report.await.unwrap());
    // With nothing awaited, a miss is immediate.
    proc.add(&[1030, 30], 1001, &[1030, 30], 600, "daemon");
    let started = Instant::now();
    assert_eq!(
        reg.attribute("agent", Some(1030)).await,
        Attribution::unbound()
    );
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(reg.attribute("agent", None).await, Attribution::unbound());
}

#[test]
fn minted_ids_are_valid_exec_ids_and_differ() {
    let a = ExecId::mint();
    assert!(beige_protocol::op::is_valid_exec_id(a.as_str()), "{a}");
    assert_ne!(a, ExecId::mint());
    assert_eq!(
        serde_json::to_string(&AttributionMethod::SessionId).unwrap(),
        r#""session-id""#
    );
    assert_eq!(AttributionMethod::Unbound.as_str(), "unbound");
}
