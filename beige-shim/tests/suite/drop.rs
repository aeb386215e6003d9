//! `beige-shim op <name> --drop UID:GID`: the `docker exec` fallback applies the same
//! privilege drop as PID 1's op children. Needs root (skipped otherwise).

use std::io::Write;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;
use std::process::{Output, Stdio};

use beige_protocol::op::{ExecRequest, OpErrorKind, OpReply, OpRequest, ReadReply, ReadRequest};

use super::shim;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

fn run_dropped(ws: &Path, args: &[&str], request: &OpRequest) -> Output {
    let mut child = shim()
        .arg("op")
        .args(args)
        .env("BEIGE_WORKSPACE", ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(request).unwrap());
    child.wait_with_output().unwrap()
}

fn reply(out: &Output) -> OpReply {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

fn read(path: &str) -> OpRequest {
    OpRequest::Read(ReadRequest {
        path: path.into(),
        offset: None,
        limit: None,
        max_bytes: 1024,
        images: false,
        max_image_bytes: 1024,
    })
}

#[test]
fn read_as_the_agent_user() {
    if !is_root() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    chown(ws.path(), Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(ws.path().join("mine.txt"), "agent data\n").unwrap();
    chown(ws.path().join("mine.txt"), Some(1000), Some(1000)).unwrap();
    std::fs::write(ws.path().join("root.txt"), "secret\n").unwrap();
    std::fs::set_permissions(
        ws.path().join("root.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();

    let out = run_dropped(
        ws.path(),
        &["read", "--drop", "1000:1000"],
        &read("mine.txt"),
    );
    assert_eq!(out.status.code(), Some(0));
    match reply(&out) {
        OpReply::Read(ReadReply::Text { content, .. }) => assert_eq!(content, "agent data\n"),
        other => panic!("{other:?}"),
    }
    // As the agent, a root-only file is out of reach; without --drop it is not.
    let out = run_dropped(
        ws.path(),
        &["read", "--drop", "1000:1000"],
        &read("root.txt"),
    );
    match reply(&out) {
        OpReply::Error(e) => assert_eq!(e.kind, OpErrorKind::PermissionDenied),
        other => panic!("{other:?}"),
    }
    let out = run_dropped(ws.path(), &["read"], &read("root.txt"));
    assert!(matches!(reply(&out), OpReply::Read(_)));
}

#[test]
fn exec_children_hold_no_capabilities() {
    if !is_root() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let request = OpRequest::Exec(ExecRequest {
        command: "grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; id -u; id -G".into(),
        timeout_secs: 10,
        env: Vec::new(),
        cwd: None,
        max_output_bytes: 64 * 1024,
        exec_id: None,
        raw_output: false,
    });
    let out = run_dropped(ws.path(), &["exec", "--drop", "1000:1000"], &request);
    assert_eq!(out.status.code(), Some(0));
    let text = match reply(&out) {
        OpReply::Exec(e) => e.stdout,
        other => panic!("{other:?}"),
    };
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            text.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {text}"
        );
    }
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.contains("Seccomp:\t2"), "{text}");
    assert!(text.ends_with("1000\n1000\n"), "{text}");
}

#[test]
fn bad_drop_arguments_run_nothing() {
    let ws = tempfile::tempdir().unwrap();
    for args in [
        &["read", "--drop"][..],
        &["read", "--drop", "agent"],
        &["read", "--frobnicate"],
    ] {
        let out = run_dropped(ws.path(), args, &read("x"));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        match reply(&out) {
            OpReply::Error(e) => assert_eq!(e.kind, OpErrorKind::BadRequest),
            other => panic!("{other:?}"),
        }
    }
}
