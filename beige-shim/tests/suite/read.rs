//! `read` through the binary.

use beige_protocol::op::{OpErrorKind, OpReply, OpRequest, ReadReply, ReadRequest};

use super::{run, run_err};

fn read(path: &str) -> ReadRequest {
    serde_json::from_value(serde_json::json!({ "path": path })).unwrap()
}

#[test]
fn offset_limit_and_cap_fields() {
    let ws = tempfile::tempdir().unwrap();
    let body: String = (1..=100).map(|i| format!("line {i}\n")).collect();
    std::fs::write(ws.path().join("f.txt"), &body).unwrap();

    let mut req = read("f.txt");
    req.offset = Some(10);
    req.limit = Some(3);
    let reply = run(ws.path(), &OpRequest::Read(req));
    assert_eq!(
        reply,
        OpReply::Read(ReadReply::Text {
            content: "line 10\nline 11\nline 12\n".into(),
            total_lines: 100,
            first_line: 10,
            last_line: 12,
            truncated: false,
        })
    );

    let mut req = read("f.txt");
    req.max_bytes = 20; // "line 1\n" .. "line 9\n" are 7 bytes each
    match run(ws.path(), &OpRequest::Read(req)) {
        OpReply::Read(ReadReply::Text {
            content,
            total_lines,
            first_line,
            last_line,
            truncated,
        }) => {
            assert_eq!(content, "line 1\nline 2\n");
            assert_eq!(
                (total_lines, first_line, last_line, truncated),
                (100, 1, 2, true)
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn errors_name_the_path() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("dir")).unwrap();
    let e = run_err(ws.path(), &OpRequest::Read(read("nope.txt")));
    assert_eq!(e.kind, OpErrorKind::NotFound);
    assert_eq!(e.message, "File not found: nope.txt");
    let e = run_err(ws.path(), &OpRequest::Read(read("dir")));
    assert_eq!(e.kind, OpErrorKind::IsDirectory);
    assert_eq!(
        e.message,
        "dir is a directory, not a file. Use exec with ls to list it."
    );
}

#[test]
fn binary_and_image() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("blob"), [0u8, 0x80, 0xff, 1, 2]).unwrap();
    std::fs::write(ws.path().join("pic.JPG"), [0xffu8, 0xd8, 0xff]).unwrap();
    assert_eq!(
        run(ws.path(), &OpRequest::Read(read("blob"))),
        OpReply::Read(ReadReply::Binary { bytes: 5 })
    );
    let mut req = read("pic.JPG");
    req.images = true;
    assert_eq!(
        run(ws.path(), &OpRequest::Read(req)),
        OpReply::Read(ReadReply::Image {
            mime_type: "image/jpeg".into(),
            bytes: 3,
            data: Some("/9j/".into()),
        })
    );
}
