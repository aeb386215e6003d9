//! `patch` through the binary.

use std::os::unix::fs::PermissionsExt;

use beige_protocol::op::{OpErrorKind, OpReply, OpRequest, PatchReply, PatchRequest};

use super::{run, run_err};

fn patch(path: &str, old: &str, new: &str) -> OpRequest {
    OpRequest::Patch(PatchRequest {
        path: path.into(),
        old_text: old.into(),
        new_text: new.into(),
    })
}

#[test]
fn zero_one_and_two_matches() {
    let ws = tempfile::tempdir().unwrap();
    let file = ws.path().join("script.sh");
    std::fs::write(&file, "echo one\necho two\necho two\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o750)).unwrap();

    let e = run_err(ws.path(), &patch("script.sh", "echo three", "x"));
    assert_eq!(e.kind, OpErrorKind::NoMatch);
    assert!(e
        .message
        .starts_with("The specified oldText was not found in script.sh."));

    let e = run_err(ws.path(), &patch("script.sh", "echo two", "x"));
    assert_eq!(e.kind, OpErrorKind::AmbiguousMatch);
    assert!(
        e.message.contains("occurs 2 times in script.sh"),
        "{}",
        e.message
    );

    let e = run_err(ws.path(), &patch("script.sh", "echo  one", "x"));
    assert_eq!(e.kind, OpErrorKind::NoMatch);
    assert!(e.message.ends_with("starts at line 1."), "{}", e.message);

    let reply = run(ws.path(), &patch("script.sh", "echo one", "echo 'uno' $1"));
    let expected = "echo 'uno' $1\necho two\necho two\n";
    assert_eq!(
        reply,
        OpReply::Patch(PatchReply {
            bytes: expected.len() as u64
        })
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), expected);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750);
}

#[test]
fn non_utf8_bytes_survive() {
    let ws = tempfile::tempdir().unwrap();
    let file = ws.path().join("latin1.txt");
    std::fs::write(&file, b"caf\xe9 = 1\n\xff\xfe\n").unwrap();
    run(ws.path(), &patch("latin1.txt", "= 1", "= 2"));
    assert_eq!(std::fs::read(&file).unwrap(), b"caf\xe9 = 2\n\xff\xfe\n");
}

#[test]
fn missing_file_is_not_found() {
    let ws = tempfile::tempdir().unwrap();
    let e = run_err(ws.path(), &patch("nope", "a", "b"));
    assert_eq!(e.kind, OpErrorKind::NotFound);
    assert_eq!(e.message, "File not found: nope");
}
