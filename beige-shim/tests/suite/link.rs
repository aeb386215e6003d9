//! `beige-shim init --agent-user … --link unix|attach` (not as PID 1) against a fake
//! gateway speaking frames: the hello exchange, ops run as the agent user, results kept
//! until acknowledged and replayed after a reconnect, keepalive, bad frames, an exec's
//! output streamed while it runs.
//! These tests need root (they switch to uid 1000); they are skipped otherwise.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use beige_protocol::link::{
    encode, Carrier, Frame, FrameDecoder, LinkMessage, Role, MAX_STREAMED_BYTES,
};
use beige_protocol::op::{ExecReply, ExecRequest, OpErrorKind, OpReply, OpRequest, ReadRequest};

use super::shim;

const AGENT: &str = "1000:1000";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

/// A workspace the agent user may use.
fn workspace() -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    ws
}

/// The init process, killed when dropped.
struct Init(Child);

impl Drop for Init {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_unix(ws: &Path, socket: &Path) -> Init {
    Init(
        shim()
            .args([
                "init",
                "--agent-user",
                AGENT,
                "--link",
                "unix",
                "--link-socket",
            ])
            .arg(socket)
            .env("BEIGE_WORKSPACE", ws)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// One side of a fake gateway connection.
struct Peer<R, W> {
    reader: R,
    writer: W,
    decoder: FrameDecoder,
}

type UnixPeer = Peer<UnixStream, UnixStream>;

fn accept(listener: &UnixListener, within: Duration) -> UnixPeer {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + within;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                return Peer {
                    reader: stream.try_clone().unwrap(),
                    writer: stream,
                    decoder: FrameDecoder::new(),
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the shim did not dial");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

impl<R, W: Write> Peer<R, W> {
    fn send(&mut self, message: LinkMessage, payload: &[u8]) {
        self.writer.write_all(&encode(&message, payload)).unwrap();
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }
}

impl UnixPeer {
    /// The next frame other than an exec's streamed `Output` within `within`; `None` on
    /// timeout; panics on EOF.
    fn recv(&mut self, within: Duration) -> Option<Frame> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = self.recv_any(left)?;
            if !matches!(frame.message, LinkMessage::Output { .. }) {
                return Some(frame);
            }
        }
    }

    /// The next frame within `within`, `Output`s included.
    fn recv_any(&mut self, within: Duration) -> Option<Frame> {
        let deadline = Instant::now() + within;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(frame) = self.decoder.next_frame().unwrap() {
                return Some(frame);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.reader.set_read_timeout(Some(left)).unwrap();
            match self.reader.read(&mut buf) {
                Ok(0) => panic!("the shim closed the connection"),
                Ok(n) => self.decoder.push(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The next frame other than an `Output`.
    fn expect(&mut self) -> Frame {
        self.recv(Duration::from_secs(20))
            .expect("no frame from the shim in time")
    }

    /// The next frame, `Output`s included.
    fn expect_any(&mut self) -> Frame {
        self.recv_any(Duration::from_secs(20))
            .expect("no frame from the shim in time")
    }

    /// Whether the shim closes the connection within `within`.
    fn closed_within(&mut self, within: Duration) -> bool {
        self.reader.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}

fn gateway_hello() -> LinkMessage {
    LinkMessage::GatewayHello {
        version: "test".into(),
    }
}

/// Checks a shim hello and returns `(boot_id, pending)`.
fn shim_hello(frame: Frame, carrier: Carrier) -> (String, Vec<String>) {
    match frame.message {
        LinkMessage::ShimHello {
            role,
            boot_id,
            version,
            carrier: c,
            pending,
        } => {
            assert_eq!(role, Role::Control);
            assert_eq!(version, env!("CARGO_PKG_VERSION"));
            assert_eq!(c, carrier);
            assert_eq!(boot_id.len(), 32);
            (boot_id, pending)
        }
        other => panic!("expected a shim hello, got {other:?}"),
    }
}

fn exec_op(command: &str, timeout_secs: u64) -> Vec<u8> {
    serde_json::to_vec(&OpRequest::Exec(ExecRequest {
        command: command.into(),
        timeout_secs,
        env: Vec::new(),
        cwd: None,
        max_output_bytes: 64 * 1024,
        exec_id: None,
        raw_output: false,
    }))
    .unwrap()
}

fn op(id: &str) -> LinkMessage {
    LinkMessage::Op {
        id: id.into(),
        name: "exec".into(),
    }
}

/// The id and the decoded reply of a `Result` frame.
fn result(frame: Frame) -> (String, OpReply) {
    match frame.message {
        LinkMessage::Result { id } => (id, serde_json::from_slice(&frame.payload).unwrap()),
        other => panic!("expected a result, got {other:?}"),
    }
}

fn stdout_of(reply: OpReply) -> String {
    match reply {
        OpReply::Exec(e) => e.stdout,
        other => panic!("expected an exec reply, got {other:?}"),
    }
}

fn setup() -> Option<(tempfile::TempDir, PathBuf, UnixListener)> {
    if !is_root() {
        eprintln!("skipped: needs root");
        return None;
    }
    let ws = workspace();
    let socket = ws.path().join("ctl.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    Some((ws, socket, listener))
}

/// An init on a Unix socket, connected and past the hello exchange (`None` when not
/// root). Keep the directory and the init for the test's duration.
fn greeted() -> Option<(tempfile::TempDir, Init, UnixPeer, UnixListener)> {
    let (ws, socket, listener) = setup()?;
    let init = start_unix(ws.path(), &socket);
    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(gateway_hello(), b"");
    shim_hello(gw.expect(), Carrier::Unix);
    Some((ws, init, gw, listener))
}

#[test]
fn hello_exec_ping_and_unprivileged_ops() {
    let Some((ws, socket, listener)) = setup() else {
        return;
    };
    let _init = start_unix(ws.path(), &socket);
    let mut gw = accept(&listener, Duration::from_secs(10));
    // PID 1 never speaks first.
    assert!(gw.recv(Duration::from_millis(300)).is_none());
    gw.send(gateway_hello(), b"");
    let (_, pending) = shim_hello(gw.expect(), Carrier::Unix);
    assert!(pending.is_empty());

    gw.send(op("t1"), &exec_op("echo hi; id -u; id -G", 10));
    let (id, reply) = result(gw.expect());
    assert_eq!(id, "t1");
    assert_eq!(stdout_of(reply), "hi\n1000\n1000\n");
    gw.send(LinkMessage::Ack { id: "t1".into() }, b"");

    gw.send(LinkMessage::Ping { seq: 42 }, b"");
    assert_eq!(gw.expect().message, LinkMessage::Pong { seq: 42 });

    gw.send(
        op("t2"),
        &exec_op(
            "grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; pwd",
            10,
        ),
    );
    let (_, reply) = result(gw.expect());
    let text = stdout_of(reply);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            text.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {text}"
        );
    }
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.contains("Seccomp:\t2"), "{text}");
    let pwd = text.lines().last().unwrap();
    assert_eq!(
        std::fs::canonicalize(pwd).unwrap(),
        std::fs::canonicalize(ws.path()).unwrap()
    );

    // The agent user may not read PID 1's memory map, environment or descriptors.
    let pid = _init.0.id();
    gw.send(
        op("t3"),
        &exec_op(
            &format!("cat /proc/{pid}/environ >/dev/null 2>&1 && echo environ; ls /proc/{pid}/fd >/dev/null 2>&1 && echo fd; echo done"),
            10,
        ),
    );
    assert_eq!(stdout_of(result(gw.expect()).1), "done\n");

    // An unknown operation and a bad request are answered, not dropped.
    gw.send(
        LinkMessage::Op {
            id: "t4".into(),
            name: "delete".into(),
        },
        b"{}",
    );
    match result(gw.expect()) {
        (id, OpReply::Error(e)) => {
            assert_eq!(id, "t4");
            assert_eq!(e.kind, OpErrorKind::BadRequest);
        }
        other => panic!("{other:?}"),
    }
    gw.send(
        LinkMessage::Op {
            id: "t5".into(),
            name: "read".into(),
        },
        b"not json",
    );
    match result(gw.expect()) {
        (_, OpReply::Error(e)) => assert_eq!(e.kind, OpErrorKind::BadRequest),
        other => panic!("{other:?}"),
    }
    // An invalid id is ignored.
    gw.send(
        LinkMessage::Op {
            id: "bad id".into(),
            name: "exec".into(),
        },
        &exec_op("true", 5),
    );
    gw.send(LinkMessage::Ping { seq: 1 }, b"");
    assert_eq!(gw.expect().message, LinkMessage::Pong { seq: 1 });
}

#[test]
fn unacked_results_are_replayed_after_a_reconnect() {
    let Some((ws, socket, listener)) = setup() else {
        return;
    };
    let _init = start_unix(ws.path(), &socket);
    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(gateway_hello(), b"");
    let (boot, _) = shim_hello(gw.expect(), Carrier::Unix);
    gw.send(op("slow"), &exec_op("sleep 0.5; echo late", 10));
    drop(gw);

    // The shim dials again; the result finishes meanwhile but is not sent before the
    // gateway's hello.
    let mut gw = accept(&listener, Duration::from_secs(10));
    assert!(gw.recv(Duration::from_millis(1500)).is_none());
    gw.send(gateway_hello(), b"");
    let (boot2, pending) = shim_hello(gw.expect(), Carrier::Unix);
    assert_eq!(boot2, boot);
    assert_eq!(pending, ["slow"]);
    let (id, reply) = result(gw.expect());
    assert_eq!((id.as_str(), stdout_of(reply).as_str()), ("slow", "late\n"));
    drop(gw);

    // Not acknowledged: replayed again.
    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(gateway_hello(), b"");
    let (_, pending) = shim_hello(gw.expect(), Carrier::Unix);
    assert_eq!(pending, ["slow"]);
    assert_eq!(result(gw.expect()).0, "slow");
    gw.send(LinkMessage::Ack { id: "slow".into() }, b"");
    gw.send(LinkMessage::Ping { seq: 9 }, b"");
    assert_eq!(gw.expect().message, LinkMessage::Pong { seq: 9 });
    drop(gw);

    // Acknowledged: gone.
    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(gateway_hello(), b"");
    let (_, pending) = shim_hello(gw.expect(), Carrier::Unix);
    assert!(pending.is_empty());
    assert!(gw.recv(Duration::from_millis(300)).is_none());
}

#[test]
fn duplicate_op_ids_run_once() {
    let Some((ws, _init, mut gw, _listener)) = greeted() else {
        return;
    };
    let request = exec_op("echo x >> count; sleep 0.3; echo ran", 10);
    gw.send(op("dup"), &request);
    gw.send(op("dup"), &request);
    assert_eq!(result(gw.expect()).0, "dup");
    assert!(gw.recv(Duration::from_millis(500)).is_none());
    // Still unacknowledged: re-sent, not run again.
    gw.send(op("dup"), &request);
    let (id, reply) = result(gw.expect());
    assert_eq!((id.as_str(), stdout_of(reply).as_str()), ("dup", "ran\n"));
    assert_eq!(
        std::fs::read_to_string(ws.path().join("count")).unwrap(),
        "x\n"
    );
}

#[test]
fn bad_frames_and_refusals_drop_the_connection() {
    let Some((ws, socket, listener)) = setup() else {
        return;
    };
    let _init = start_unix(ws.path(), &socket);
    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(gateway_hello(), b"");
    shim_hello(gw.expect(), Carrier::Unix);
    gw.send_raw(b"GET / HTTP/1.1\r\n\r\n");
    assert!(gw.closed_within(Duration::from_secs(5)));

    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(
        LinkMessage::Refused {
            reason: "test".into(),
        },
        b"",
    );
    assert!(gw.closed_within(Duration::from_secs(5)));

    // And it comes back.
    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(gateway_hello(), b"");
    shim_hello(gw.expect(), Carrier::Unix);
}

/// The attach carrier: frames over the init process's own stdin and stdout.
#[test]
fn attach_carrier() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let ws = workspace();
    let mut child = shim()
        .args(["init", "--agent-user", AGENT, "--link", "attach"])
        .env("BEIGE_WORKSPACE", ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin: ChildStdin = child.stdin.take().unwrap();
    let stdout: ChildStdout = child.stdout.take().unwrap();
    let init = Init(child);
    let (frames_tx, frames) = std::sync::mpsc::channel::<Frame>();
    std::thread::spawn(move || {
        let mut stdout = stdout;
        let mut decoder = FrameDecoder::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => decoder.push(&buf[..n]),
            }
            while let Ok(Some(frame)) = decoder.next_frame() {
                if frames_tx.send(frame).is_err() {
                    return;
                }
            }
        }
    });
    let next_any = |within: Duration| frames.recv_timeout(within).ok();
    // Streamed output aside.
    let next = |within: Duration| loop {
        let frame = next_any(within)?;
        if !matches!(frame.message, LinkMessage::Output { .. }) {
            return Some(frame);
        }
    };
    let mut gw = Peer {
        reader: (),
        writer: stdin,
        decoder: FrameDecoder::new(),
    };

    assert!(next(Duration::from_millis(300)).is_none());
    gw.send(gateway_hello(), b"");
    let (boot, _) = shim_hello(next(Duration::from_secs(10)).unwrap(), Carrier::Attach);
    gw.send(op("a1"), &exec_op("echo over attach; id -u", 10));
    // The output is streamed over attach too, before the result.
    let mut streamed = Vec::new();
    let (id, reply) = loop {
        let frame = next_any(Duration::from_secs(20)).unwrap();
        match frame.message {
            LinkMessage::Output { id, stream: 1, .. } if id == "a1" => {
                streamed.extend_from_slice(&frame.payload)
            }
            _ => break result(frame),
        }
    };
    assert_eq!(
        (id.as_str(), stdout_of(reply).as_str()),
        ("a1", "over attach\n1000\n")
    );
    assert_eq!(streamed, b"over attach\n1000\n");

    // A new gateway session mid-stream, after a torn frame: answered again, and the
    // unacknowledged result replayed.
    gw.send_raw(&encode(&op("torn"), b"0123456789")[..20]);
    gw.send(gateway_hello(), b"");
    let (boot2, pending) = shim_hello(next(Duration::from_secs(10)).unwrap(), Carrier::Attach);
    assert_eq!(boot2, boot);
    assert_eq!(pending, ["a1"]);
    assert_eq!(result(next(Duration::from_secs(10)).unwrap()).0, "a1");
    gw.send(LinkMessage::Ack { id: "a1".into() }, b"");
    gw.send(LinkMessage::Ping { seq: 5 }, b"");
    assert_eq!(
        next(Duration::from_secs(10)).unwrap().message,
        LinkMessage::Pong { seq: 5 }
    );

    // A gateway that died halfway through a frame whose header was complete: the
    // payload never comes, so the frame would swallow the next hello. Once it has
    // stalled for STALL it is dropped and the next hello is answered.
    let big = encode(&op("half"), &vec![b'x'; 5000]);
    gw.send_raw(&big[..big.len() - 4000]);
    std::thread::sleep(Duration::from_millis(2500));
    gw.send(gateway_hello(), b"");
    let (boot3, pending) = shim_hello(next(Duration::from_secs(10)).unwrap(), Carrier::Attach);
    assert_eq!(boot3, boot);
    assert!(pending.is_empty(), "{pending:?}");

    // Children cannot reach the link: PID 1's stdio is /dev/null, the link's
    // descriptors are 100 and up (close-on-exec).
    let fd_dir = PathBuf::from(format!("/proc/{}/fd", init.0.id()));
    for fd in 0..=2 {
        let target = std::fs::read_link(fd_dir.join(fd.to_string())).unwrap();
        assert_eq!(target, Path::new("/dev/null"), "fd {fd}");
    }
    for fd in [100, 101] {
        let target = std::fs::read_link(fd_dir.join(fd.to_string())).unwrap();
        assert!(
            target.to_string_lossy().starts_with("pipe:"),
            "fd {fd}: {target:?}"
        );
    }

    // The stream ends: init goes on as a plain init.
    drop(gw);
    std::thread::sleep(Duration::from_millis(300));
    let mut init = init;
    assert!(init.0.try_wait().unwrap().is_none());
    let status = std::process::Command::new("kill")
        .args(["-TERM", &init.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = init.0.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(Instant::now() < deadline, "init did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn exec_reply(reply: OpReply) -> ExecReply {
    match reply {
        OpReply::Exec(e) => e,
        other => panic!("expected an exec reply, got {other:?}"),
    }
}

/// What came for one op up to its result.
struct Streamed {
    /// `(arrival, stream, seq, bytes)` of every `Output`, in order.
    outputs: Vec<(Instant, u8, u64, Vec<u8>)>,
    result: OpReply,
    result_at: Instant,
}

impl Streamed {
    fn stream(&self, which: u8) -> Vec<u8> {
        self.outputs
            .iter()
            .filter(|o| o.1 == which)
            .flat_map(|o| o.3.iter().copied())
            .collect()
    }

    fn seqs(&self) -> Vec<u64> {
        self.outputs.iter().map(|o| o.2).collect()
    }
}

/// Reads frames until the result of `id`; every frame before it must be an `Output` of
/// `id`.
fn until_result(gw: &mut UnixPeer, id: &str) -> Streamed {
    let mut outputs = Vec::new();
    loop {
        let frame = gw.expect_any();
        let at = Instant::now();
        match frame.message {
            LinkMessage::Output {
                id: of,
                stream,
                seq,
            } => {
                assert_eq!(of, id);
                outputs.push((at, stream, seq, frame.payload));
            }
            LinkMessage::Result { id: of } => {
                assert_eq!(of, id);
                return Streamed {
                    outputs,
                    result: serde_json::from_slice(&frame.payload).unwrap(),
                    result_at: at,
                };
            }
            other => panic!("expected output or the result of {id}, got {other:?}"),
        }
    }
}

#[test]
fn exec_output_is_streamed_while_it_runs() {
    let Some((ws, _init, mut gw, _listener)) = greeted() else {
        return;
    };

    gw.send(
        op("s1"),
        &exec_op(
            "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three",
            10,
        ),
    );
    let got = until_result(&mut gw, "s1");
    assert_eq!(String::from_utf8(got.stream(1)).unwrap(), "one\nthree\n");
    assert_eq!(String::from_utf8(got.stream(2)).unwrap(), "two\n");
    assert_eq!(
        got.seqs(),
        (0..got.outputs.len() as u64).collect::<Vec<_>>()
    );
    let first = got.outputs[0].0;
    assert!(
        got.result_at.duration_since(first) >= Duration::from_millis(200),
        "the first output came only {:?} before the result",
        got.result_at.duration_since(first)
    );
    // The result is what it always was.
    let reply = exec_reply(got.result);
    assert_eq!(
        (reply.stdout.as_str(), reply.stderr.as_str()),
        ("one\nthree\n", "two\n")
    );
    gw.send(LinkMessage::Ack { id: "s1".into() }, b"");

    // The progress pipe is the op's own: the command does not inherit it (nor anything
    // else of PID 1).
    gw.send(op("s2"), &exec_op("ls /proc/$$/fd | tr '\\n' ' '", 10));
    let got = until_result(&mut gw, "s2");
    assert_eq!(exec_reply(got.result).stdout, "0 1 2 ");
    gw.send(LinkMessage::Ack { id: "s2".into() }, b"");

    // Other operations stream nothing.
    std::fs::write(ws.path().join("f.txt"), "content\n").unwrap();
    let read: ReadRequest = serde_json::from_value(serde_json::json!({ "path": "f.txt" })).unwrap();
    let read = serde_json::to_vec(&OpRequest::Read(read)).unwrap();
    gw.send(
        LinkMessage::Op {
            id: "r1".into(),
            name: "read".into(),
        },
        &read,
    );
    let got = until_result(&mut gw, "r1");
    assert!(got.outputs.is_empty());
    assert!(matches!(got.result, OpReply::Read(_)), "{:?}", got.result);
}

#[test]
fn a_flood_streams_at_most_the_cap() {
    let Some((_ws, _init, mut gw, _listener)) = greeted() else {
        return;
    };

    gw.send(
        op("f1"),
        &exec_op("head -c 2000000 /dev/zero; echo done >&2", 30),
    );
    let got = until_result(&mut gw, "f1");
    let streamed = got.stream(1);
    assert!(
        !streamed.is_empty() && streamed.len() <= MAX_STREAMED_BYTES,
        "{} bytes streamed",
        streamed.len()
    );
    assert!(streamed.iter().all(|&b| b == 0));
    assert!(got.outputs.iter().map(|o| o.3.len()).sum::<usize>() <= MAX_STREAMED_BYTES);
    // Under a flood the shim skips a piece when the socket is full (progress is best
    // effort, see `LinkMessage::Output`), so `seq` may jump, but it never repeats or
    // goes back: a gap tells the gateway a piece was skipped.
    let seqs = got.seqs();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs not increasing: {seqs:?}"
    );
    let reply = exec_reply(got.result);
    assert_eq!(reply.exit_code, Some(0));
    assert_eq!(reply.stderr, "done\n");
    assert!(reply.stdout_omitted > 0);
    assert!(reply.stdout.contains("bytes omitted"));
    assert!(reply.stdout.len() < 70 * 1024, "{}", reply.stdout.len());
}

#[test]
fn output_is_never_replayed() {
    let Some((_ws, _init, mut gw, listener)) = greeted() else {
        return;
    };
    gw.send(op("o1"), &exec_op("echo early; sleep 0.4; echo late", 10));
    let frame = gw.expect_any();
    assert_eq!(
        frame.message,
        LinkMessage::Output {
            id: "o1".into(),
            stream: 1,
            seq: 0
        }
    );
    assert_eq!(frame.payload, b"early\n");
    drop(gw);

    // The op ends while no gateway listens: its late output is dropped, its result kept.
    std::thread::sleep(Duration::from_millis(1000));
    let mut gw = accept(&listener, Duration::from_secs(10));
    gw.send(gateway_hello(), b"");
    let (_, pending) = shim_hello(gw.expect(), Carrier::Unix);
    assert_eq!(pending, ["o1"]);
    let got = until_result(&mut gw, "o1");
    assert!(
        got.outputs.is_empty(),
        "{} outputs replayed",
        got.outputs.len()
    );
    assert_eq!(stdout_of(got.result), "early\nlate\n");
    assert!(gw.recv_any(Duration::from_millis(300)).is_none());

    // A new hello on the same connection: the result again, still no output.
    gw.send(gateway_hello(), b"");
    shim_hello(gw.expect(), Carrier::Unix);
    let got = until_result(&mut gw, "o1");
    assert!(got.outputs.is_empty());
    gw.send(LinkMessage::Ack { id: "o1".into() }, b"");
    assert!(gw.recv_any(Duration::from_millis(300)).is_none());
}
