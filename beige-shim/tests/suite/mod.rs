//! Shared helpers for running the shim binary.

mod cli;
mod drop;
mod exec;
mod kill;
mod link;
mod patch;
mod read;
mod tool_client;
mod write;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use beige_protocol::op::{OpError, OpReply, OpRequest};

/// The binary under test.
pub fn shim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_beige-shim"))
}

/// Runs `beige-shim op <name>` with `stdin` in workspace `ws`.
pub fn run_raw(ws: &Path, name: &str, stdin: &[u8]) -> Output {
    let mut child = shim()
        .args(["op", name])
        .env("BEIGE_WORKSPACE", ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The shim may refuse the invocation before reading stdin (EPIPE): not our concern.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

/// Runs one request and decodes the reply; the exit code must be 0.
pub fn run(ws: &Path, request: &OpRequest) -> OpReply {
    let out = run_raw(ws, request.name(), &serde_json::to_vec(request).unwrap());
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.ends_with('\n') && text.trim_end().lines().count() == 1,
        "{text:?}"
    );
    serde_json::from_str(&text).unwrap()
}

/// Runs a request that must fail; returns the error.
pub fn run_err(ws: &Path, request: &OpRequest) -> OpError {
    match run(ws, request) {
        OpReply::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}
