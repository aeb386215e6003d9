//! `write` through the binary, including a round trip with `read`.

use beige_protocol::op::{OpReply, OpRequest, ReadReply, WriteReply, WriteRequest};

use super::run;

fn write(path: &str, content: &str) -> OpRequest {
    OpRequest::Write(WriteRequest {
        path: path.into(),
        content: content.into(),
    })
}

#[test]
fn all_chars_up_to_u00ff_round_trip() {
    let ws = tempfile::tempdir().unwrap();
    let all: String = (0u32..=0xff).filter_map(char::from_u32).collect();
    assert_eq!(all.chars().count(), 256);
    let reply = run(ws.path(), &write("chars.txt", &all));
    assert_eq!(
        reply,
        OpReply::Write(WriteReply {
            bytes: all.len() as u64
        })
    );
    assert_eq!(
        std::fs::read(ws.path().join("chars.txt")).unwrap(),
        all.as_bytes()
    );

    let read =
        serde_json::from_value(serde_json::json!({"op": "read", "path": "chars.txt"})).unwrap();
    match run(ws.path(), &read) {
        OpReply::Read(ReadReply::Text { content, .. }) => assert_eq!(content, all),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn weird_paths_create_exactly_that_file_and_run_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let marker = ws.path().join("pwned-marker");
    let m = marker.display();
    let names = [
        "quote'single.txt".to_owned(),
        "quote\"double.txt".to_owned(),
        format!("$(touch {m})"),
        format!("`touch {m}`"),
        format!("'; touch {m}; echo '"),
        "a name with spaces.txt".to_owned(),
        "new\nline.txt".to_owned(),
        "deep/$HOME/*/x.txt".to_owned(),
    ];
    for name in &names {
        run(ws.path(), &write(name, name));
    }
    assert!(!marker.exists(), "a shell ran");
    for name in &names {
        let content = std::fs::read_to_string(ws.path().join(name)).unwrap();
        assert_eq!(&content, name);
    }
    // Nothing else appeared at the top level: no temporary files left behind.
    let mut top: Vec<String> = std::fs::read_dir(ws.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top.len(), names.len(), "{top:?}");
}
