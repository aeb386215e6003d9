use super::*;

/// Feeds `chunks` through a capture of `cap` bytes and a spool, as `exec` does.
fn run(dir: &Path, cap: u64, chunks: &[(Stream, &[u8])], limit: Option<u64>) -> Option<OutputFile> {
    let mut capture = Capture::new(cap as usize);
    let mut spool = Spool::new(dir, "x1", cap);
    if let Some(limit) = limit {
        spool = spool.with_limit(limit);
    }
    for (stream, data) in chunks {
        spool.push(*stream, data, &capture);
        capture.push(*stream, data);
    }
    spool.finish(capture.dropped())
}

fn file(dir: &Path) -> PathBuf {
    dir.join(".beige/out/x1.log")
}

#[test]
fn output_within_the_cap_makes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        dir.path(),
        100,
        &[(Stream::Stdout, b"hello\n"), (Stream::Stderr, b"warn\n")],
        None,
    );
    assert_eq!(got, None);
    assert!(!dir.path().join(".beige").exists());
}

#[test]
fn output_over_the_cap_is_kept_whole_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let a = vec![b'a'; 30];
    let b = vec![b'b'; 30];
    let c = vec![b'c'; 50];
    let d = vec![b'd'; 200];
    let chunks: Vec<(Stream, &[u8])> = vec![
        (Stream::Stdout, &a),
        (Stream::Stderr, &b),
        (Stream::Stdout, &c),
        (Stream::Stderr, &d),
        (Stream::Stdout, b"end\n"),
    ];
    let got = run(dir.path(), 64, &chunks, None).expect("a file");
    let mut want = Vec::new();
    for (_, data) in &chunks {
        want.extend_from_slice(data);
    }
    assert_eq!(fs::read(file(dir.path())).unwrap(), want);
    assert_eq!(
        got,
        OutputFile {
            bytes: want.len() as u64,
            truncated: false,
            error: None
        }
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(file(dir.path())).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_long_journal_starts_the_file_early_and_an_unneeded_file_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut chunks = Vec::new();
    for i in 0..(MAX_JOURNAL + 10) {
        let s = if i % 2 == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        chunks.push((s, &b"x"[..]));
    }
    // The cap is never reached: the early file goes away.
    assert_eq!(run(dir.path(), 1 << 20, &chunks, None), None);
    assert!(!file(dir.path()).exists());
    // Reached after the early start: the file has everything, in order.
    let mut more = chunks.clone();
    let tail = vec![b'z'; 100];
    more.push((Stream::Stdout, &tail));
    let cap = (MAX_JOURNAL + 50) as u64;
    let got = run(dir.path(), cap, &more, None).expect("a file");
    assert_eq!(got.bytes, (MAX_JOURNAL + 110) as u64);
    let kept = fs::read(file(dir.path())).unwrap();
    assert_eq!(kept.len(), MAX_JOURNAL + 110);
    assert!(kept.ends_with(&tail));
}

#[test]
fn the_file_stops_at_its_limit_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![b'q'; 1000];
    let got = run(
        dir.path(),
        10,
        &[(Stream::Stdout, &big), (Stream::Stdout, &big)],
        Some(1500),
    )
    .expect("a file");
    assert_eq!(got.bytes, 1500);
    assert!(got.truncated);
    assert_eq!(fs::read(file(dir.path())).unwrap().len(), 1500);
}

#[test]
fn a_symlinked_directory_is_refused_and_nothing_is_written_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(".beige")).unwrap();
    let big = vec![b'q'; 100];
    let got = run(dir.path(), 10, &[(Stream::Stdout, &big)], None).expect("a report");
    assert_eq!(got.bytes, 0);
    let error = got.error.expect("an error");
    assert!(error.contains("not a directory"), "{error}");
    assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

#[test]
fn a_symlink_in_place_of_the_file_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join(".beige/out")).unwrap();
    let target = dir.path().join("victim");
    fs::write(&target, "keep").unwrap();
    std::os::unix::fs::symlink(&target, file(dir.path())).unwrap();
    let big = vec![b'q'; 100];
    let got = run(dir.path(), 10, &[(Stream::Stdout, &big)], None).expect("a report");
    assert!(got.error.is_some());
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
}

#[test]
fn old_output_files_beyond_the_number_kept_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(".beige/out");
    fs::create_dir_all(&out).unwrap();
    let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for i in 0..EXEC_OUTPUT_FILES_KEPT + 5 {
        let p = out.join(format!("old{i:02}.log"));
        fs::write(&p, "x").unwrap();
        let f = File::options().write(true).open(&p).unwrap();
        f.set_modified(t0 + std::time::Duration::from_secs(i as u64))
            .unwrap();
    }
    fs::write(out.join("notes.txt"), "mine").unwrap();
    let big = vec![b'q'; 100];
    run(dir.path(), 10, &[(Stream::Stdout, &big)], None).expect("a file");
    let mut logs: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log"))
        .collect();
    logs.sort();
    assert_eq!(logs.len(), EXEC_OUTPUT_FILES_KEPT);
    assert!(logs.contains(&"x1.log".to_string()));
    assert!(!logs.contains(&"old00.log".to_string()), "{logs:?}");
    assert!(out.join("notes.txt").exists(), "other files are left alone");
}
