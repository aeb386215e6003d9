use super::*;
use beige_protocol::link::encode;

#[test]
fn inbox_decodes_and_resyncs() {
    let ping = encode(&LinkMessage::Ping { seq: 3 }, b"");
    let hello = encode(
        &LinkMessage::GatewayHello {
            version: "1".into(),
        },
        b"",
    );
    let mut inbox = Inbox::default();
    inbox.push(b"junk BG");
    inbox.push(&hello);
    inbox.push(&ping[..5]);
    assert_eq!(inbox.next_frame(), Err(FrameError::BadMagic));
    inbox.resync();
    let frame = inbox.next_frame().unwrap().unwrap();
    assert!(matches!(frame.message, LinkMessage::GatewayHello { .. }));
    assert_eq!(inbox.next_frame(), Ok(None));
    inbox.push(&ping[5..]);
    assert_eq!(
        inbox.next_frame().unwrap().unwrap().message,
        LinkMessage::Ping { seq: 3 }
    );
    assert_eq!(inbox.next_frame(), Ok(None));

    // Garbage without any frame start: dropped, except a possible start at the end.
    let mut inbox = Inbox::default();
    inbox.push(b"xxxxxxxxBGL");
    assert!(inbox.next_frame().is_err());
    inbox.resync();
    assert_eq!(inbox.buf, b"BGL");
    assert_eq!(inbox.next_frame(), Ok(None));
    // An unreadable header after a good prefix: skipped as a whole frame start.
    let mut bad = MAGIC.to_vec();
    bad.extend_from_slice(&2u32.to_be_bytes());
    bad.extend_from_slice(&0u32.to_be_bytes());
    bad.extend_from_slice(b"{{");
    let mut inbox = Inbox::default();
    inbox.push(&bad);
    inbox.push(&ping);
    assert!(matches!(inbox.next_frame(), Err(FrameError::BadHeader(_))));
    inbox.resync();
    assert_eq!(
        inbox.next_frame().unwrap().unwrap().message,
        LinkMessage::Ping { seq: 3 }
    );
}

#[test]
fn resync_always_makes_progress() {
    for junk in [&b"x"[..], b"BG", b"BGL1", b"zzzzzz"] {
        let mut inbox = Inbox::default();
        inbox.push(junk);
        let mut rounds = 0;
        while inbox.next_frame().is_err() {
            inbox.resync();
            rounds += 1;
            assert!(rounds <= junk.len(), "{junk:?}");
        }
    }
}

#[test]
fn result_store_is_bounded_and_ordered() {
    let mut store = ResultStore::new(10);
    store.insert("a".into(), vec![0; 4]);
    store.insert("b".into(), vec![0; 4]);
    assert_eq!(store.ids().collect::<Vec<_>>(), ["a", "b"]);
    store.insert("c".into(), vec![0; 4]);
    assert_eq!(store.ids().collect::<Vec<_>>(), ["b", "c"]);
    assert_eq!(store.bytes, 8);
    store.remove("b");
    assert_eq!(store.get("c").map(<[u8]>::len), Some(4));
    assert_eq!(store.get("b"), None);
    // A single result larger than the limit is still kept (it is the newest).
    store.insert("d".into(), vec![0; 20]);
    assert_eq!(store.ids().collect::<Vec<_>>(), ["d"]);
    store.remove("d");
    assert_eq!(store.bytes, 0);
}

#[test]
fn error_replies_are_op_replies() {
    let line = error_reply(OpErrorKind::Io, "boom".into());
    assert!(line.ends_with(b"\n"));
    match serde_json::from_slice::<OpReply>(&line).unwrap() {
        OpReply::Error(e) => {
            assert_eq!((e.kind, e.message.as_str()), (OpErrorKind::Io, "boom"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn progress_records_are_checked() {
    let mut rec = progress_header(PROGRESS_STDERR, 3).to_vec();
    assert_eq!(rec, [2, 0, 0, 0, 3]);
    for n in 0..rec.len() + 2 {
        assert_eq!(
            progress_record(&[rec.as_slice(), b"ab"].concat()[..n]),
            Ok(None)
        );
    }
    rec.extend_from_slice(b"abc");
    assert_eq!(progress_record(&rec), Ok(Some((PROGRESS_STDERR, 3))));
    rec.extend_from_slice(b"next");
    assert_eq!(progress_record(&rec), Ok(Some((PROGRESS_STDERR, 3))));
    let full = progress_header(PROGRESS_STDOUT, MAX_PROGRESS_RECORD);
    assert_eq!(progress_record(&full), Ok(None));
    let huge = progress_header(PROGRESS_STDOUT, MAX_PROGRESS_RECORD + 1);
    assert!(progress_record(&huge).is_err());
    assert!(progress_record(&[0xff; 5]).is_err());
    assert!(progress_record(&[0, 0, 0, 0, 1, b'x']).is_err());
    assert!(progress_record(&[3, 0, 0, 0, 1, b'x']).is_err());
}

/// A greeted connection over a socket pair, and its far end.
fn greeted_wire() -> (Wire, std::os::unix::net::UnixStream) {
    let (near, far) = std::os::unix::net::UnixStream::pair().unwrap();
    let input = OwnedFd::from(near);
    let output = input.try_clone().unwrap();
    let mut conn = Conn::new(input, output).unwrap();
    conn.greeted = true;
    let wire = Wire {
        carrier: Carrier::Unix,
        dial: None,
        conn: Some(conn),
        retry_at: Instant::now(),
        backoff: BACKOFF_MIN,
        gone: false,
    };
    (wire, far)
}

/// The frames the far end received so far.
fn received(far: &mut std::os::unix::net::UnixStream) -> Vec<Frame> {
    far.set_nonblocking(true).unwrap();
    let mut decoder = beige_protocol::link::FrameDecoder::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match far.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => decoder.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    let mut frames = Vec::new();
    while let Some(frame) = decoder.next_frame().unwrap() {
        frames.push(frame);
    }
    assert_eq!(decoder.buffered(), 0);
    frames
}

fn record(stream: u8, data: &[u8]) -> Vec<u8> {
    [&progress_header(stream, data.len())[..], data].concat()
}

#[test]
fn progress_becomes_output_frames() {
    let (mut wire, mut far) = greeted_wire();
    let (read, mut write) = {
        let (r, w) = sys::pipe().unwrap();
        sys::set_nonblocking(r.as_fd()).unwrap();
        (r, File::from(w))
    };
    let mut progress = ProgressIn::new(read);
    write.write_all(&record(1, b"one\n")).unwrap();
    write.write_all(&record(2, b"two\n")).unwrap();
    // Half a record: kept until the rest comes.
    write.write_all(&record(1, b"three\n")[..7]).unwrap();
    assert!(progress.pump("x1", &mut wire));
    let frames = received(&mut far);
    let got: Vec<_> = frames
        .iter()
        .map(|f| (f.message.clone(), f.payload.as_slice()))
        .collect();
    let output = |stream, seq| LinkMessage::Output {
        id: "x1".into(),
        stream,
        seq,
    };
    assert_eq!(
        got,
        [(output(1, 0), &b"one\n"[..]), (output(2, 1), &b"two\n"[..])]
    );
    write.write_all(&record(1, b"three\n")[7..]).unwrap();
    assert!(progress.pump("x1", &mut wire));
    let frames = received(&mut far);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].message, output(1, 2));
    assert_eq!(frames[0].payload, b"three\n");
    // An incomplete record at the end is dropped.
    write.write_all(&record(2, b"lost")[..6]).unwrap();
    drop(write);
    assert!(!progress.pump("x1", &mut wire));
    assert!(received(&mut far).is_empty());

    // Not greeted: pieces are dropped, not queued.
    wire.conn.as_mut().unwrap().greeted = false;
    let (read, write) = sys::pipe().unwrap();
    sys::set_nonblocking(read.as_fd()).unwrap();
    let mut progress = ProgressIn::new(read);
    File::from(write).write_all(&record(1, b"dropped")).unwrap();
    assert!(!progress.pump("x2", &mut wire));
    wire.conn.as_mut().unwrap().greeted = true;
    assert!(received(&mut far).is_empty());
    assert_eq!(progress.seq, 1);
}

#[test]
fn untrusted_or_excess_progress_ends_it() {
    let (mut wire, mut far) = greeted_wire();
    for bad in [
        progress_header(1, MAX_PROGRESS_RECORD + 1).to_vec(),
        record(9, b"x"),
    ] {
        let (read, write) = sys::pipe().unwrap();
        sys::set_nonblocking(read.as_fd()).unwrap();
        let mut progress = ProgressIn::new(read);
        let mut write = File::from(write);
        write.write_all(&record(1, b"fine")).unwrap();
        write.write_all(&bad).unwrap();
        write.write_all(&record(1, b"after")).unwrap();
        // Still open for writing, yet done with.
        assert!(!progress.pump("b", &mut wire));
        let frames = received(&mut far);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].payload, b"fine");
    }

    // At most MAX_STREAMED_BYTES per op, the last piece cut to fit. One record at a
    // time (half a pipe's worth), pumped and then read on the gateway's side, so the
    // socket never fills and no piece is skipped (skipping is for a gateway that
    // reads too slowly, not what this checks).
    let (read, write) = sys::pipe().unwrap();
    sys::set_nonblocking(read.as_fd()).unwrap();
    let mut progress = ProgressIn::new(read);
    let mut write = File::from(write);
    let piece = vec![7u8; MAX_PROGRESS_RECORD / 2];
    far.set_nonblocking(true).unwrap();
    let mut decoder = beige_protocol::link::FrameDecoder::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0;
    let mut seqs = Vec::new();
    let mut records = 0;
    loop {
        write.write_all(&record(1, &piece)).unwrap();
        records += 1;
        let more = progress.pump("c", &mut wire);
        loop {
            match far.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        while let Some(frame) = decoder.next_frame().unwrap() {
            let LinkMessage::Output { seq, .. } = frame.message else {
                panic!("{:?}", frame.message);
            };
            seqs.push(seq);
            total += frame.payload.len();
        }
        if !more {
            break;
        }
        assert!(records < 100, "the cap never stopped the stream");
    }
    assert_eq!(records, MAX_STREAMED_BYTES.div_ceil(piece.len()));
    assert_eq!(progress.streamed, MAX_STREAMED_BYTES);
    assert_eq!(total, MAX_STREAMED_BYTES);
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
}

#[test]
fn boot_ids_are_random_hex() {
    let (a, b) = (new_boot_id(), new_boot_id());
    assert_eq!(a.len(), 32);
    assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
}

#[test]
fn a_pending_sigkill_or_an_exited_state_is_dying() {
    let status = |state: &str, sigpnd: &str, shdpnd: &str| {
        format!("Name:\tbeige-shim\nState:\t{state}\nSigPnd:\t{sigpnd}\nShdPnd:\t{shdpnd}\n")
    };
    assert!(!status_says_dying(&status(
        "S (sleeping)",
        "0000000000000000",
        "0000000000000000"
    )));
    assert!(status_says_dying(&status(
        "S (sleeping)",
        "0000000000000000",
        "0000000000000100"
    )));
    assert!(status_says_dying(&status(
        "R (running)",
        "0000000000000100",
        "0000000000000000"
    )));
    assert!(status_says_dying(&status(
        "Z (zombie)",
        "0000000000000000",
        "0000000000000000"
    )));
    // SIGTERM (bit 14) pending is not SIGKILL.
    assert!(!status_says_dying(&status(
        "S (sleeping)",
        "0000000000004000",
        "0000000000000000"
    )));
    assert!(!status_says_dying(""));
}
