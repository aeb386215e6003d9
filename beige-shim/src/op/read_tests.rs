use super::*;
use beige_protocol::op::{DEFAULT_IMAGE_MAX_BYTES, DEFAULT_READ_MAX_BYTES};

fn req(path: &str) -> ReadRequest {
    ReadRequest {
        path: path.into(),
        offset: None,
        limit: None,
        max_bytes: DEFAULT_READ_MAX_BYTES,
        images: false,
        max_image_bytes: DEFAULT_IMAGE_MAX_BYTES,
    }
}

fn text(reply: ReadReply) -> (String, u64, u64, u64, bool) {
    match reply {
        ReadReply::Text {
            content,
            total_lines,
            first_line,
            last_line,
            truncated,
        } => (content, total_lines, first_line, last_line, truncated),
        other => panic!("expected text, got {other:?}"),
    }
}

fn scan(
    data: &[u8],
    offset: Option<u64>,
    limit: Option<u64>,
    max: usize,
) -> (String, u64, u64, u64, bool) {
    let sel = Selection::new(offset, limit);
    let t = scan_text(data, sel, max).unwrap().expect("text");
    text(t.into_reply(sel))
}

#[test]
fn whole_file_and_line_counts() {
    assert_eq!(scan(b"", None, None, 100), (String::new(), 0, 1, 0, false));
    assert_eq!(
        scan(b"a\nb\n", None, None, 100),
        ("a\nb\n".into(), 2, 1, 2, false)
    );
    assert_eq!(
        scan(b"a\nb", None, None, 100),
        ("a\nb".into(), 2, 1, 2, false)
    );
    assert_eq!(
        scan(b"\n\n", None, None, 100),
        ("\n\n".into(), 2, 1, 2, false)
    );
}

#[test]
fn offset_and_limit() {
    let data = b"1\n2\n3\n4\n5\n";
    assert_eq!(
        scan(data, Some(2), Some(2), 100),
        ("2\n3\n".into(), 5, 2, 3, false)
    );
    assert_eq!(
        scan(data, Some(0), Some(1), 100),
        ("1\n".into(), 5, 1, 1, false)
    );
    assert_eq!(
        scan(data, Some(4), None, 100),
        ("4\n5\n".into(), 5, 4, 5, false)
    );
    assert_eq!(
        scan(data, Some(4), Some(0), 100),
        ("4\n5\n".into(), 5, 4, 5, false)
    );
    assert_eq!(
        scan(data, Some(9), Some(3), 100),
        (String::new(), 5, 9, 0, false)
    );
    assert_eq!(
        scan(b"a\nb", Some(2), Some(5), 100),
        ("b".into(), 2, 2, 2, false)
    );
}

#[test]
fn cap_cuts_at_line_boundary() {
    let data = b"aaaa\nbbbb\ncccc\n";
    assert_eq!(
        scan(data, None, None, 12),
        ("aaaa\nbbbb\n".into(), 3, 1, 2, true)
    );
    assert_eq!(
        scan(data, None, None, 10),
        ("aaaa\nbbbb\n".into(), 3, 1, 2, true)
    );
    // The last selected line fits exactly: not truncated.
    assert_eq!(
        scan(data, None, Some(2), 10),
        ("aaaa\nbbbb\n".into(), 3, 1, 2, false)
    );
}

#[test]
fn over_long_first_line_is_cut_at_char_boundary() {
    let data = "ééééé\nx\n".as_bytes(); // 2 bytes per é
    let (content, total, first, last, truncated) = scan(data, None, None, 5);
    assert_eq!(content, "éé");
    assert_eq!((total, first, last, truncated), (2, 1, 1, true));
    assert_eq!(scan(data, None, None, 0), (String::new(), 2, 1, 0, true));
}

#[test]
fn chunk_boundaries_inside_chars_and_lines() {
    // Long multi-byte content crossing many chunk boundaries.
    let line = "ü".repeat(CHUNK / 3) + "\n";
    let data = line.repeat(5);
    let (content, total, _, last, truncated) = scan(data.as_bytes(), Some(2), Some(2), usize::MAX);
    assert_eq!(content, line.repeat(2));
    assert_eq!((total, last, truncated), (5, 3, false));
}

#[test]
fn nul_is_text_and_invalid_utf8_is_binary() {
    let all: String = (0u32..=0xff).filter_map(char::from_u32).collect();
    let (content, ..) = scan(all.as_bytes(), None, None, 1 << 20);
    assert_eq!(content, all);
    let sel = Selection::new(None, None);
    assert!(scan_text(&b"ab\xffcd"[..], sel, 100).unwrap().is_none());
    assert!(scan_text(&b"ab\xc3"[..], sel, 100).unwrap().is_none());
}

#[test]
fn image_extensions() {
    assert_eq!(image_mime("a/b.PNG"), Some("image/png"));
    assert_eq!(image_mime("x.jpeg"), Some("image/jpeg"));
    assert_eq!(image_mime("x.Jpg"), Some("image/jpeg"));
    assert_eq!(image_mime("x.webp"), Some("image/webp"));
    assert_eq!(image_mime("x.gif"), Some("image/gif"));
    assert_eq!(image_mime("x.svg"), None);
    assert_eq!(image_mime("png"), None);
    assert_eq!(image_mime("dir.png/file"), None);
}

#[test]
fn files_images_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new(dir.path());
    fs::write(dir.path().join("t.txt"), "hello\nworld\n").unwrap();
    fs::write(dir.path().join("b.bin"), b"\x00\xff\xfe").unwrap();
    fs::write(dir.path().join("p.png"), b"\x89PNG....").unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();

    let (content, total, ..) = text(read(&ctx, &req("t.txt")).unwrap());
    assert_eq!((content.as_str(), total), ("hello\nworld\n", 2));
    let abs = dir.path().join("t.txt");
    assert!(read(&ctx, &req(abs.to_str().unwrap())).is_ok());

    assert_eq!(
        read(&ctx, &req("b.bin")).unwrap(),
        ReadReply::Binary { bytes: 3 }
    );

    let img = read(&ctx, &req("p.png")).unwrap();
    assert_eq!(
        img,
        ReadReply::Image {
            mime_type: "image/png".into(),
            bytes: 8,
            data: None
        }
    );
    let mut with_data = req("p.png");
    with_data.images = true;
    match read(&ctx, &with_data).unwrap() {
        ReadReply::Image { data: Some(d), .. } => {
            let raw = base64::engine::general_purpose::STANDARD.decode(d).unwrap();
            assert_eq!(raw, b"\x89PNG....");
        }
        other => panic!("unexpected {other:?}"),
    }
    with_data.max_image_bytes = 4;
    let err = read(&ctx, &with_data).unwrap_err();
    assert_eq!(err.kind, OpErrorKind::TooLarge);
    assert!(err.message.contains("p.png") && err.message.contains("8 bytes"));

    let err = read(&ctx, &req("missing.txt")).unwrap_err();
    assert_eq!(err.kind, OpErrorKind::NotFound);
    assert_eq!(err.message, "File not found: missing.txt");

    let err = read(&ctx, &req("sub")).unwrap_err();
    assert_eq!(err.kind, OpErrorKind::IsDirectory);
    assert_eq!(
        err.message,
        "sub is a directory, not a file. Use exec with ls to list it."
    );

    let err = read(&ctx, &req("/dev/null")).unwrap_err();
    assert_eq!(err.kind, OpErrorKind::Io);
    assert!(err.message.contains("character device"), "{}", err.message);
}

#[test]
fn permission_denied_names_the_path() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("secret.txt");
    fs::write(&p, "x").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o000)).unwrap();
    if File::open(&p).is_ok() {
        return; // running as root: permissions are not enforced
    }
    let err = read(&Context::new(dir.path()), &req("secret.txt")).unwrap_err();
    assert_eq!(err.kind, OpErrorKind::PermissionDenied);
    assert_eq!(err.message, "Permission denied: secret.txt");
}
