use super::*;

fn req(command: &str, timeout_secs: u64) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        timeout_secs,
        env: Vec::new(),
        cwd: None,
        max_output_bytes: beige_protocol::op::DEFAULT_EXEC_MAX_OUTPUT_BYTES,
        exec_id: None,
        raw_output: false,
    }
}

fn run(dir: &Path, r: &ExecRequest) -> ExecReply {
    exec(&Context::new(dir), r, false, None).unwrap()
}

#[test]
fn exit_code_output_cwd_and_env() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let mut r = req("pwd; echo \"$GREETING\" >&2; exit 3", 10);
    r.env = vec![("GREETING".into(), "hi there".into())];
    r.cwd = Some("sub".into());
    let reply = run(dir.path(), &r);
    assert_eq!(reply.exit_code, Some(3));
    assert_eq!(reply.signal, None);
    let expected = dir.path().join("sub").canonicalize().unwrap();
    assert_eq!(
        Path::new(reply.stdout.trim_end()).canonicalize().unwrap(),
        expected
    );
    assert_eq!(reply.stderr, "hi there\n");
    assert!(!reply.timed_out);
}

#[test]
fn exec_id_reaches_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = req("echo \"$BEIGE_EXEC_ID\"; (echo \"$BEIGE_EXEC_ID\")", 10);
    r.exec_id = Some("call-7".into());
    r.env = vec![("BEIGE_EXEC_ID".into(), "spoofed".into())];
    assert_eq!(run(dir.path(), &r).stdout, "call-7\ncall-7\n");
}

#[test]
fn stdin_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let reply = run(dir.path(), &req("cat; echo done", 10));
    assert_eq!(reply.stdout, "done\n");
}

#[test]
fn signalled_command_reports_signal() {
    let dir = tempfile::tempdir().unwrap();
    let reply = run(dir.path(), &req("kill -9 $$", 10));
    assert_eq!(reply.exit_code, None);
    assert_eq!(reply.signal, Some(libc::SIGKILL));
}

#[test]
fn output_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = req(
        "i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done",
        10,
    );
    r.max_output_bytes = 100;
    let reply = run(dir.path(), &r);
    assert_eq!(reply.exit_code, Some(0));
    assert!(reply.stdout.starts_with("line0\nline1\n"));
    assert!(reply.stdout.ends_with("line1999\n"));
    let marker = format!("\n[... {} bytes omitted ...]\n", reply.stdout_omitted);
    assert!(reply.stdout.contains(&marker), "{}", reply.stdout);
    assert!(reply.stdout.len() <= 100 + marker.len(), "{}", reply.stdout);
}

#[test]
fn huge_timeout_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run(dir.path(), &req("exit 0", u64::MAX)).exit_code, Some(0));
}

#[test]
fn bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new(dir.path());
    let mut r = req("true", 10);
    r.env = vec![("A=B".into(), "x".into())];
    assert_eq!(
        exec(&ctx, &r, false, None).unwrap_err().kind,
        OpErrorKind::BadRequest
    );
    let mut r = req("true", 10);
    r.exec_id = Some("bad id".into());
    assert_eq!(
        exec(&ctx, &r, false, None).unwrap_err().kind,
        OpErrorKind::BadRequest
    );
    let mut r = req("true", 10);
    r.cwd = Some("nope".into());
    assert_eq!(
        exec(&ctx, &r, false, None).unwrap_err().kind,
        OpErrorKind::NotFound
    );
}

#[test]
fn background_children_do_not_survive_nor_hold_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    // The background sleep keeps stdout open; the reply must not wait for it.
    let reply = run(
        dir.path(),
        &req("sleep 30 & echo $! > bg.pid; echo started", 10),
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reply.stdout, "started\n");
    let pid = std::fs::read_to_string(dir.path().join("bg.pid")).unwrap();
    assert!(
        crate::op::exec::tests::gone(pid.trim()),
        "background sleep survived"
    );
}

/// Kernels without pidfds: the exit is noticed by asking every tick.
#[test]
fn exit_is_noticed_without_a_pidfd() {
    let mut child = Command::new(SHELL)
        .args(["-c", "echo out; echo err >&2; exit 3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut pipes = Pipes {
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        capture: Capture::new(1024),
        spool: None,
        progress: None,
    };
    pipes.set_nonblocking();
    let started = Instant::now();
    let outcome = supervise(child.id(), &mut pipes, None, None, Duration::from_secs(10));
    assert!(outcome.exited && !outcome.timed_out);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(reap(&mut child).and_then(|s| s.code()), Some(3));
    pipes.drain(Instant::now() + DRAIN_GRACE);
    assert_eq!(pipes.capture.finish(Stream::Stdout).text, "out\n");
    assert_eq!(pipes.capture.finish(Stream::Stderr).text, "err\n");
}

/// Reads progress records until end-of-file: `(stdout, stderr, records, bytes of
/// an incomplete record at the end)`.
fn read_records(mut pipe: File) -> (Vec<u8>, Vec<u8>, usize, usize) {
    use crate::link::PROGRESS_HEADER_LEN;
    let mut all = Vec::new();
    pipe.read_to_end(&mut all).unwrap();
    let (mut out, mut err, mut count) = (Vec::new(), Vec::new(), 0);
    let mut rest = all.as_slice();
    while rest.len() >= PROGRESS_HEADER_LEN {
        let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
        assert!(len > 0 && len <= MAX_PROGRESS_RECORD, "{len}");
        if rest.len() < PROGRESS_HEADER_LEN + len {
            break;
        }
        let data = &rest[PROGRESS_HEADER_LEN..PROGRESS_HEADER_LEN + len];
        match rest[0] {
            PROGRESS_STDOUT => out.extend_from_slice(data),
            PROGRESS_STDERR => err.extend_from_slice(data),
            other => panic!("stream {other}"),
        }
        count += 1;
        rest = &rest[PROGRESS_HEADER_LEN + len..];
    }
    (out, err, count, rest.len())
}

#[test]
fn output_is_streamed_as_records() {
    let dir = tempfile::tempdir().unwrap();
    let (read, write) = sys::pipe().unwrap();
    let r = req("printf a; printf bb >&2; sleep 0.1; printf ccc", 10);
    let reply = exec(&Context::new(dir.path()), &r, false, Some(write)).unwrap();
    assert_eq!(
        (reply.stdout.as_str(), reply.stderr.as_str()),
        ("accc", "bb")
    );
    // The exec closed its end once done: the pipe ends.
    let (out, err, count, partial) = read_records(File::from(read));
    assert_eq!((out.as_slice(), err.as_slice()), (&b"accc"[..], &b"bb"[..]));
    assert!(count >= 3, "{count}");
    assert_eq!(partial, 0);
}

#[test]
fn streaming_stops_at_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let (read, write) = sys::pipe().unwrap();
    let reader = std::thread::spawn(move || read_records(File::from(read)));
    let r = req("head -c 2000000 /dev/zero; echo done >&2", 10);
    let reply = exec(&Context::new(dir.path()), &r, false, Some(write)).unwrap();
    assert_eq!(reply.exit_code, Some(0));
    assert!(reply.stdout_omitted > 0);
    assert_eq!(reply.stderr, "done\n");
    let (out, _, _, partial) = reader.join().unwrap();
    assert!(
        !out.is_empty() && out.len() <= MAX_STREAMED_BYTES,
        "{}",
        out.len()
    );
    assert!(out.iter().all(|&b| b == 0));
    assert_eq!(partial, 0);
}

/// Nobody reads the progress pipe (it fills up), or nobody can (it is closed): the
/// command and its reply are not affected.
#[test]
fn a_stuck_or_closed_progress_pipe_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (read, write) = sys::pipe().unwrap();
    let mut r = req("head -c 2000000 /dev/zero; echo done", 10);
    r.max_output_bytes = 100;
    let started = Instant::now();
    let reply = exec(&Context::new(dir.path()), &r, false, Some(write)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(reply.exit_code, Some(0));
    assert!(reply.stdout.ends_with("done\n"), "{:?}", reply.stdout);
    assert_eq!(reply.stdout_omitted + 100, 2_000_005);
    // Only what fitted: whole records, then possibly the start of one more.
    let (out, _, _, _) = read_records(File::from(read));
    assert!(out.len() <= MAX_STREAMED_BYTES);

    let (read, write) = sys::pipe().unwrap();
    drop(read);
    let reply = exec(
        &Context::new(dir.path()),
        &req("echo hi; echo there >&2", 10),
        false,
        Some(write),
    )
    .unwrap();
    assert_eq!(
        (reply.stdout.as_str(), reply.stderr.as_str()),
        ("hi\n", "there\n")
    );
}

#[test]
fn progress_splits_skips_and_caps() {
    let (read, write) = sys::pipe().unwrap();
    let mut progress = Progress::new(write);
    // Larger than a record: split.
    progress.push(Stream::Stdout, &vec![1u8; MAX_PROGRESS_RECORD + 10]);
    progress.push(Stream::Stderr, b"e");
    // The pipe (64 KiB) took the first record only partly: the rest waits, and new
    // chunks are skipped while it does.
    assert!(!progress.pending.is_empty());
    let streamed = progress.streamed;
    progress.push(Stream::Stderr, b"skipped");
    assert_eq!(progress.streamed, streamed);
    let reader = std::thread::spawn(move || read_records(File::from(read)));
    // Once the reader makes room, streaming resumes, up to the cap.
    let deadline = Instant::now() + Duration::from_secs(10);
    while progress.streamed < MAX_STREAMED_BYTES && Instant::now() < deadline {
        progress.push(Stream::Stderr, &[2u8; 1000]);
    }
    assert_eq!(progress.streamed, MAX_STREAMED_BYTES);
    progress.push(Stream::Stdout, b"over the cap");
    progress.finish();
    drop(progress);
    let (out, err, _, partial) = reader.join().unwrap();
    assert_eq!(partial, 0);
    assert_eq!(out.len() + err.len(), MAX_STREAMED_BYTES);
    assert!(out.len() <= MAX_PROGRESS_RECORD + 10);
    assert!(!err.contains(&b's'));
}

/// Whether the process is gone (or a zombie waiting for its new parent).
fn gone(pid: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next());
        if matches!(state, None | Some("Z") | Some("X")) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
