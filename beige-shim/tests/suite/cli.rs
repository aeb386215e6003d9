//! Role dispatch and the invocation contract.

use beige_protocol::op::{OpErrorKind, OpReply};

use super::{run_raw, shim};

fn reply_of(stdout: &[u8]) -> OpReply {
    serde_json::from_slice(stdout).unwrap()
}

#[test]
fn version_and_usage() {
    let out = shim().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim(),
        format!("beige-shim {}", env!("CARGO_PKG_VERSION"))
    );

    let out = shim().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));

    let out = shim().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn invalid_json_is_a_bad_request_with_exit_2() {
    let ws = tempfile::tempdir().unwrap();
    let out = run_raw(ws.path(), "read", b"{not json");
    assert_eq!(out.status.code(), Some(2));
    assert!(!out.stderr.is_empty());
    match reply_of(&out.stdout) {
        OpReply::Error(e) => assert_eq!(e.kind, OpErrorKind::BadRequest),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn op_name_must_match_the_request() {
    let ws = tempfile::tempdir().unwrap();
    let out = run_raw(ws.path(), "write", br#"{"op":"read","path":"x"}"#);
    assert_eq!(out.status.code(), Some(2));
    match reply_of(&out.stdout) {
        OpReply::Error(e) => {
            assert_eq!(e.kind, OpErrorKind::BadRequest);
            assert!(e.message.contains("read"), "{}", e.message);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!ws.path().join("x").exists());

    let out = run_raw(ws.path(), "delete", b"{}");
    assert_eq!(out.status.code(), Some(2));
    assert!(matches!(reply_of(&out.stdout), OpReply::Error(_)));
}

#[test]
fn invoked_as_init_runs_init() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("init");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_beige-shim"), &link).unwrap();
    let mut child = std::process::Command::new(&link).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Still running: it is init, not a tool client that would have failed at once.
    assert!(child.try_wait().unwrap().is_none());
    let started = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn tool_without_a_name_is_a_usage_error() {
    let out = shim().arg("tool").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing the tool name"));
}

#[test]
fn init_exits_on_sigterm() {
    use std::time::{Duration, Instant};
    let mut child = shim().arg("init").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(started.elapsed() < Duration::from_secs(3));
}
