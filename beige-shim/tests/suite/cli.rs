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
fn unknown_invocation_name_is_the_future_tool_client() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("kv");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_beige-shim"), &link).unwrap();
    let out = std::process::Command::new(&link)
        .arg("get")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"kv\""));
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
