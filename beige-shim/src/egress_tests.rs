use super::*;

use std::net::TcpStream;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};

use beige_protocol::link::{encode, Frame};

use crate::privdrop::{AgentUser, PrivDrop};

/// The longest a test waits for anything.
const PATIENCE: Duration = Duration::from_secs(5);
/// The longest the proxy thread sleeps, so it notices when to stop.
const TICK: Duration = Duration::from_millis(20);
const BOOT_ID: &str = "0123456789abcdef0123456789abcdef";
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

fn limits() -> Limits {
    Limits::DEFAULT
}

/// An [`Egress`] run by a poll loop in a thread, like init's.
struct Proxy {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Egress>>,
}

impl Proxy {
    fn start(upstream: Upstream, limits: Limits) -> Self {
        Self::start_with(upstream, limits, |egress| egress)
    }

    /// Like [`Proxy::start`], with `setup` adding to the proxy before its loop starts.
    fn start_with(
        upstream: Upstream,
        limits: Limits,
        setup: impl FnOnce(Egress) -> Egress,
    ) -> Self {
        let listener = ProxyListener::bind(0).unwrap();
        let port = listener.port().unwrap();
        let mut egress = setup(Egress::with_limits(listener, upstream, limits));
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let mut fds = Vec::new();
            while !stopping.load(Ordering::Relaxed) {
                fds.clear();
                let timeout = egress
                    .prepare(Instant::now(), &mut fds)
                    .map_or(TICK, |t| t.min(TICK));
                sys::poll(&mut fds, Some(timeout)).unwrap();
                egress.dispatch(&fds);
            }
            egress
        });
        Self {
            port,
            stop,
            thread: Some(thread),
        }
    }

    fn client(&self) -> TcpStream {
        let client = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        client.set_read_timeout(Some(PATIENCE)).unwrap();
        client.set_write_timeout(Some(PATIENCE)).unwrap();
        client
    }

    /// Stops the loop and hands the proxy back.
    fn finish(mut self) -> Egress {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A fake gateway: a control socket in a temporary directory whose first connection
/// is handed to `serve` in a thread.
struct Gateway {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    thread: Option<JoinHandle<()>>,
}

impl Gateway {
    fn start(serve: impl FnOnce(UnixStream) + Send + 'static) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ctl.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let thread = thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(PATIENCE)).unwrap();
            conn.set_write_timeout(Some(PATIENCE)).unwrap();
            serve(conn);
        });
        Self {
            _dir: dir,
            socket,
            thread: Some(thread),
        }
    }

    fn upstream(&self) -> Upstream {
        Upstream::Unix {
            socket: self.socket.clone(),
            boot_id: BOOT_ID.to_string(),
        }
    }

    /// Waits for the gateway thread, re-raising its panics (failed assertions).
    fn join(mut self) {
        if let Some(thread) = self.thread.take() {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

/// What the gateway received on an egress stream.
#[derive(Debug)]
struct Opened {
    hello: LinkMessage,
    open: LinkMessage,
    payload: Vec<u8>,
}

fn say_hello(conn: &mut UnixStream) {
    let hello = LinkMessage::GatewayHello {
        version: "test".into(),
    };
    conn.write_all(&encode(&hello, b"")).unwrap();
}

/// Reads `count` frames; returns them and the raw bytes that followed.
fn read_frames(conn: &mut UnixStream, count: usize) -> (Vec<Frame>, Vec<u8>) {
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        while frames.len() < count {
            let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
                break;
            };
            let (header, payload) = wire::parse_prefix(prefix).unwrap();
            let total = PREFIX_LEN + header + payload;
            if buf.len() < total {
                break;
            }
            let message = wire::parse_header(&buf[PREFIX_LEN..PREFIX_LEN + header]).unwrap();
            let payload = buf[PREFIX_LEN + header..total].to_vec();
            buf.drain(..total);
            frames.push(Frame { message, payload });
        }
        if frames.len() == count {
            return (frames, buf);
        }
        let n = conn.read(&mut chunk).unwrap();
        assert!(n > 0, "the stream ended after {} frames", frames.len());
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Says hello, reads the stream's hello and `EgressOpen` and reports them; returns the
/// bytes after them.
fn open_stream(conn: &mut UnixStream, report: &mpsc::Sender<Opened>) -> Vec<u8> {
    say_hello(conn);
    let (mut frames, rest) = read_frames(conn, 2);
    let open = frames.pop().unwrap();
    let hello = frames.pop().unwrap();
    report
        .send(Opened {
            hello: hello.message,
            open: open.message,
            payload: open.payload.clone(),
        })
        .unwrap();
    let head = head_end(&open.payload).unwrap();
    [&open.payload[head..], &rest[..]].concat()
}

/// A gateway that accepts the stream with `200 Connection established` and echoes
/// everything after the request head until the client ends, then ends too.
fn echo_gateway() -> (Gateway, mpsc::Receiver<Opened>) {
    let (report, opened) = mpsc::channel();
    let gateway = Gateway::start(move |mut conn| {
        let early = open_stream(&mut conn, &report);
        conn.write_all(ESTABLISHED).unwrap();
        conn.write_all(&early).unwrap();
        let mut chunk = vec![0u8; CHUNK];
        loop {
            match conn.read(&mut chunk).unwrap() {
                0 => break,
                n => conn.write_all(&chunk[..n]).unwrap(),
            }
        }
        conn.shutdown(Shutdown::Write).unwrap();
    });
    (gateway, opened)
}

fn assert_opened(opened: &Opened, name: &str, port: u16, sent: &[u8]) {
    assert_eq!(
        opened.hello,
        LinkMessage::ShimHello {
            role: Role::Egress,
            boot_id: BOOT_ID.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            carrier: Carrier::Unix,
            pending: vec![],
        }
    );
    assert_eq!(
        opened.open,
        LinkMessage::EgressOpen {
            entry: EgressEntry::Explicit,
            name: Some(name.to_string()),
            port,
        }
    );
    assert_eq!(opened.payload, sent);
}

fn read_exactly(client: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    client.read_exact(&mut buf).unwrap();
    buf
}

/// Sends `request` and returns the whole response (to the end of the connection).
fn exchange(proxy: &Proxy, request: &[u8]) -> String {
    let mut client = proxy.client();
    client.write_all(request).unwrap();
    let mut response = Vec::new();
    client.read_to_end(&mut response).unwrap();
    String::from_utf8(response).unwrap()
}

/// Checks a response of PID 1's own: status line, egress header and one-line body.
fn assert_response(response: &str, status: &str, egress: &str, body: &str) {
    assert!(
        response.starts_with(&format!("HTTP/1.1 {status}\r\n")),
        "{response}"
    );
    assert!(
        response.contains(&format!("\r\nX-Beige-Egress: {egress}\r\n")),
        "{response}"
    );
    assert!(
        response.contains(&format!("\r\nContent-Length: {}\r\n", body.len() + 1)),
        "{response}"
    );
    assert!(
        response.ends_with(&format!("\r\n\r\n{body}\n")),
        "{response}"
    );
}

fn assert_unreachable(response: &str) {
    assert_response(
        response,
        "502 Bad Gateway",
        "upstream-error; reason=gateway_unreachable",
        "beige: the gateway cannot be reached for egress",
    );
}

const CONNECT: &[u8] = b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n";

#[test]
fn connect_is_opened_on_the_gateway_and_relayed() {
    let (gateway, opened) = echo_gateway();
    let proxy = Proxy::start(gateway.upstream(), limits());
    let mut client = proxy.client();
    // Bytes right behind the head (an eager TLS client) belong to the payload too.
    let sent = [CONNECT, b"early"].concat();
    client.write_all(&sent).unwrap();
    assert_eq!(read_exactly(&mut client, ESTABLISHED.len()), ESTABLISHED);
    assert_eq!(read_exactly(&mut client, 5), b"early");
    assert_opened(&opened.recv().unwrap(), "example.test", 443, &sent);
    client.write_all(b"ping").unwrap();
    assert_eq!(read_exactly(&mut client, 4), b"ping");
    client.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    gateway.join();
    // Both directions are done, so the stream was dropped in the step that ended the
    // client's side (the loop finishes its dispatch before it stops).
    assert!(proxy.finish().streams.is_empty());
}

#[test]
fn a_mebibyte_each_way_with_half_close() {
    let (gateway, opened) = echo_gateway();
    let proxy = Proxy::start(gateway.upstream(), limits());
    let mut client = proxy.client();
    client.write_all(CONNECT).unwrap();
    assert_eq!(read_exactly(&mut client, ESTABLISHED.len()), ESTABLISHED);
    assert_opened(&opened.recv().unwrap(), "example.test", 443, CONNECT);

    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut writer = client.try_clone().unwrap();
    let sending = data.clone();
    let upload = thread::spawn(move || {
        writer.write_all(&sending).unwrap();
        // Half-close: the echo keeps coming after this.
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut echoed = Vec::new();
    client.read_to_end(&mut echoed).unwrap();
    upload.join().unwrap();
    assert_eq!(echoed.len(), data.len());
    assert!(echoed == data, "the echo differs");
    gateway.join();
}

#[test]
fn absolute_form_goes_to_port_80_with_the_head_verbatim() {
    let (report, opened) = mpsc::channel();
    let gateway = Gateway::start(move |mut conn| {
        let early = open_stream(&mut conn, &report);
        assert!(early.is_empty());
        conn.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
    });
    let proxy = Proxy::start(gateway.upstream(), limits());
    let request = b"GET http://example.test/path?q=1 HTTP/1.1\r\nHost: example.test\r\n\
                    Proxy-Authorization: Basic eDp5\r\n\r\n";
    assert_eq!(exchange(&proxy, request), "HTTP/1.1 204 No Content\r\n\r\n");
    assert_opened(&opened.recv().unwrap(), "example.test", 80, request);
    gateway.join();
}

#[test]
fn other_requests_get_400() {
    // Never dialled.
    let proxy = Proxy::start(
        Upstream::Unix {
            socket: PathBuf::from("/nonexistent/ctl.sock"),
            boot_id: BOOT_ID.into(),
        },
        limits(),
    );
    for request in [
        &b"GET /relative HTTP/1.1\r\nHost: example.test\r\n\r\n"[..],
        b"GET https://example.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT example.test HTTP/1.1\r\n\r\n",
        b"CONNECT ::1:443 HTTP/1.1\r\n\r\n",
        b"CONNECT example.test:0 HTTP/1.1\r\n\r\n",
        b"hello there\r\n\r\n",
        b"\r\n\r\n",
    ] {
        assert_response(
            &exchange(&proxy, request),
            "400 Bad Request",
            "denied; reason=bad_request",
            BAD_REQUEST_BODY,
        );
    }
    // A client that ends before its head is complete.
    let mut client = proxy.client();
    client
        .write_all(b"CONNECT example.test:443 HTTP/1.1\r\n")
        .unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut response = String::new();
    client.read_to_string(&mut response).unwrap();
    assert_response(
        &response,
        "400 Bad Request",
        "denied; reason=bad_request",
        "beige: the connection ended before a complete request head",
    );
}

#[test]
fn an_oversize_head_gets_400() {
    let proxy = Proxy::start(Upstream::Unavailable("unused".into()), limits());
    let mut request = b"GET http://example.test/ HTTP/1.1\r\nX-Pad: ".to_vec();
    request.resize(17 * 1024, b'a');
    assert_response(
        &exchange(&proxy, &request),
        "400 Bad Request",
        "denied; reason=bad_request",
        "beige: the request head exceeds 16384 bytes",
    );
    // Exactly the limit, complete: fine.
    let mut request = b"GET http://example.test/ HTTP/1.1\r\nX-Pad: ".to_vec();
    request.resize(MAX_EGRESS_HEAD - 4, b'a');
    request.extend_from_slice(b"\r\n\r\n");
    assert!(exchange(&proxy, &request).starts_with("HTTP/1.1 503 "));
}

#[test]
fn a_slow_head_gets_408() {
    let limits = Limits {
        head: Duration::from_millis(150),
        ..limits()
    };
    let proxy = Proxy::start(Upstream::Unavailable("unused".into()), limits);
    let mut client = proxy.client();
    client
        .write_all(b"CONNECT example.test:443 HTTP/1.1\r\n")
        .unwrap();
    let mut response = String::new();
    client.read_to_string(&mut response).unwrap();
    assert_response(
        &response,
        "408 Request Timeout",
        "denied; reason=bad_request",
        "beige: no complete request head arrived within 0 s",
    );
}

#[test]
fn an_absent_gateway_gets_502() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(
        Upstream::Unix {
            socket: dir.path().join("ctl.sock"),
            boot_id: BOOT_ID.into(),
        },
        limits(),
    );
    assert_unreachable(&exchange(&proxy, CONNECT));
}

#[test]
fn a_refusing_gateway_gets_502() {
    let refused = LinkMessage::Refused {
        reason: "no control connection of this boot".into(),
    };
    let gateway = Gateway::start(move |mut conn| {
        conn.write_all(&encode(&refused, b"")).unwrap();
    });
    let proxy = Proxy::start(gateway.upstream(), limits());
    assert_unreachable(&exchange(&proxy, CONNECT));
    gateway.join();
}

#[test]
fn a_gateway_that_hangs_up_or_never_answers_gets_502() {
    // Closed before its hello.
    let gateway = Gateway::start(drop);
    let proxy = Proxy::start(gateway.upstream(), limits());
    assert_unreachable(&exchange(&proxy, CONNECT));
    gateway.join();

    // Closed after the hello without a byte for the client.
    let gateway = Gateway::start(|mut conn| {
        say_hello(&mut conn);
        read_frames(&mut conn, 2);
    });
    let proxy = Proxy::start(gateway.upstream(), limits());
    assert_unreachable(&exchange(&proxy, CONNECT));
    gateway.join();

    // Something else than a link frame.
    let gateway = Gateway::start(|mut conn| {
        conn.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
    });
    let proxy = Proxy::start(gateway.upstream(), limits());
    assert_unreachable(&exchange(&proxy, CONNECT));
    gateway.join();

    // Silent: the hello never comes.
    let (done, wait) = mpsc::channel::<()>();
    let gateway = Gateway::start(move |_conn| {
        let _ = wait.recv_timeout(PATIENCE);
    });
    let limits = Limits {
        hello: Duration::from_millis(150),
        ..limits()
    };
    let proxy = Proxy::start(gateway.upstream(), limits);
    let started = Instant::now();
    assert_unreachable(&exchange(&proxy, CONNECT));
    assert!(started.elapsed() < PATIENCE);
    done.send(()).unwrap();
    gateway.join();
}

#[test]
fn without_a_link_every_client_gets_503() {
    let proxy = Proxy::start(
        Upstream::Unavailable(ATTACH_UNSUPPORTED_BODY.into()),
        limits(),
    );
    assert_response(
        &exchange(&proxy, CONNECT),
        "503 Service Unavailable",
        "upstream-error; reason=gateway_unreachable",
        ATTACH_UNSUPPORTED_BODY,
    );
}

#[test]
fn streams_beyond_the_limit_get_503() {
    let limits = Limits {
        streams: 2,
        ..limits()
    };
    let proxy = Proxy::start(Upstream::Unavailable("beige: no link".into()), limits);
    // Two clients that have not sent their heads yet hold both places.
    let first = proxy.client();
    let second = proxy.client();
    let refused = exchange(&proxy, CONNECT);
    assert_response(
        &refused,
        "503 Service Unavailable",
        "denied; reason=too_many_streams",
        "beige: too many egress connections are open in this sandbox (at most 2)",
    );
    // Once one ends, a new client gets in again.
    drop(first);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let response = exchange(&proxy, CONNECT);
        if response.contains("beige: no link") {
            break;
        }
        assert!(response.contains("too_many_streams"), "{response}");
        assert!(Instant::now() < deadline, "the place was never freed");
        thread::sleep(TICK);
    }
    drop(second);
}

#[test]
fn idle_streams_are_closed() {
    let (gateway, _opened) = echo_gateway();
    let limits = Limits {
        idle: Duration::from_millis(150),
        ..limits()
    };
    let proxy = Proxy::start(gateway.upstream(), limits);
    let mut client = proxy.client();
    client.write_all(CONNECT).unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, ESTABLISHED);
    assert!(started.elapsed() < PATIENCE);
    gateway.join();
}

#[test]
fn the_listener_shares_its_port_with_nobody() {
    let listener = ProxyListener::bind(0).unwrap();
    let port = listener.port().unwrap();
    assert_ne!(port, 0);
    let addr = listener.listener.local_addr().unwrap();
    assert!(addr.ip().is_loopback());
    let fd = listener.listener.as_fd();
    let option = |name| sys::socket_option(fd, libc::SOL_SOCKET, name).unwrap();
    assert_eq!(option(libc::SO_REUSEADDR), 0);
    assert_eq!(option(libc::SO_REUSEPORT), 0);
    assert_ne!(sys::status_flags(fd).unwrap() & libc::O_NONBLOCK, 0);
    let flags = sys::descriptor_flags(fd.as_raw_fd()).unwrap();
    assert_ne!(flags & libc::FD_CLOEXEC, 0);
    // Neither a plain bind (std sets SO_REUSEADDR) nor ours gets the port.
    let err = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    let err = ProxyListener::bind(port).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
}

/// An op child (forked by `sys::fork_agent_child`, as the link does) holds none of the
/// proxy's descriptors, and each of them is close-on-exec anyway.
#[test]
fn op_children_hold_no_egress_descriptor() {
    let (release, hold) = mpsc::channel::<()>();
    let (report, _opened) = mpsc::channel();
    let gateway = Gateway::start(move |mut conn| {
        open_stream(&mut conn, &report);
        conn.write_all(ESTABLISHED).unwrap();
        let _ = hold.recv_timeout(PATIENCE);
    });
    let listener = ProxyListener::bind(0).unwrap();
    let port = listener.port().unwrap();
    let mut egress = Egress::with_limits(listener, gateway.upstream(), limits());
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    client.write_all(CONNECT).unwrap();
    // Drive the proxy here until the stream relays and the client has its answer.
    let deadline = Instant::now() + PATIENCE;
    let mut fds = Vec::new();
    client.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    while got.len() < ESTABLISHED.len() {
        assert!(Instant::now() < deadline, "the stream never opened");
        fds.clear();
        let timeout = egress
            .prepare(Instant::now(), &mut fds)
            .map_or(TICK, |t| t.min(TICK));
        sys::poll(&mut fds, Some(timeout)).unwrap();
        egress.dispatch(&fds);
        let mut buf = [0u8; 256];
        match client.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, ESTABLISHED);
    assert_eq!(egress.streams.len(), 1);
    let stream = &egress.streams[0];
    assert!(matches!(stream.phase, Phase::Relay));
    let fds: Vec<RawFd> = vec![
        egress.listener.as_raw_fd(),
        stream.client.as_raw_fd(),
        stream.gateway.as_ref().unwrap().as_raw_fd(),
    ];
    for &fd in &fds {
        assert!(fd > 2, "{fd}");
        let flags = sys::descriptor_flags(fd).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "descriptor {fd}");
    }

    let plan = PrivDrop::prepare(AgentUser {
        uid: 1000,
        gid: 1000,
    })
    .unwrap();
    let (reply_read, reply_write) = sys::pipe().unwrap();
    match sys::fork_agent_child(&plan, c"/", &reply_write, None, None).unwrap() {
        sys::Forked::Child(setup) => {
            // Only raw system calls here: the test process has other threads.
            let code = match setup {
                Err(_) => 99,
                Ok(_) => fds
                    .iter()
                    .position(|&fd| sys::descriptor_flags(fd).is_ok())
                    .map_or(0, |i| 10 + i as i32),
            };
            sys::exit_now(code)
        }
        sys::Forked::Parent(pid) => {
            drop(reply_write);
            drop(reply_read);
            assert_eq!(sys::wait_exit_code(pid).unwrap(), 0);
        }
    }
    release.send(()).unwrap();
    gateway.join();
}

#[test]
fn request_lines() {
    let target = |line: &str| {
        parse_request_line(format!("{line}\r\nHost: x\r\n\r\n").as_bytes())
            .map(|t| (t.name, t.port))
    };
    let ok = |name: &str, port| Some((name.to_string(), port));
    assert_eq!(
        target("CONNECT example.test:443 HTTP/1.1"),
        ok("example.test", 443)
    );
    assert_eq!(
        target("CONNECT Example.Test:8443 HTTP/1.0"),
        ok("Example.Test", 8443)
    );
    assert_eq!(target("CONNECT [::1]:443 HTTP/1.1"), ok("::1", 443));
    assert_eq!(
        target("CONNECT 127.77.0.9:443 HTTP/1.1"),
        ok("127.77.0.9", 443)
    );
    assert_eq!(
        target("GET http://example.test HTTP/1.1"),
        ok("example.test", 80)
    );
    assert_eq!(
        target("POST HTTP://example.test:8080/x HTTP/1.1"),
        ok("example.test", 8080)
    );
    assert_eq!(
        target("GET http://u:p@example.test:81/ HTTP/1.1"),
        ok("example.test", 81)
    );
    assert_eq!(
        target("GET http://example.test:/ HTTP/1.1"),
        ok("example.test", 80)
    );
    assert_eq!(
        target("GET http://example.test?q HTTP/1.1"),
        ok("example.test", 80)
    );
    assert_eq!(target("GET http://[fe80::1]/ HTTP/1.1"), ok("fe80::1", 80));
    assert_eq!(
        target("GET http://[fe80::1]:82/ HTTP/1.1"),
        ok("fe80::1", 82)
    );
    // A bare LF ends the line as well.
    assert_eq!(
        parse_request_line(b"CONNECT a.test:1 HTTP/1.1\nHost: a\r\n\r\n").map(|t| t.port),
        Some(1)
    );
    for bad in [
        "CONNECT example.test HTTP/1.1",
        "CONNECT example.test: HTTP/1.1",
        "CONNECT :443 HTTP/1.1",
        "CONNECT ::1:443 HTTP/1.1",
        "CONNECT [::1] HTTP/1.1",
        "CONNECT [::1]x:443 HTTP/1.1",
        "CONNECT example.test:65536 HTTP/1.1",
        "CONNECT example.test:+443 HTTP/1.1",
        "CONNECT http://example.test:443 HTTP/1.1",
        "GET / HTTP/1.1",
        "GET https://example.test/ HTTP/1.1",
        "GET ftp://example.test/ HTTP/1.1",
        "GET http:/// HTTP/1.1",
        "GET http://example.test:x/ HTTP/1.1",
        "GET http://example.test/ HTTP/2.0",
        "GET http://example.test/",
        "GET  http://example.test/ HTTP/1.1",
        "",
    ] {
        assert_eq!(target(bad), None, "{bad:?}");
    }
    assert_eq!(head_end(b"GET x\r\n\r\nrest"), Some(9));
    assert_eq!(head_end(b"GET x\r\n\r"), None);
}

#[test]
fn responses_are_complete() {
    let text = String::from_utf8(gateway_unreachable()).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(&format!("Content-Length: {}", body.len())));
    assert!(head.contains("Connection: close"));
    assert_eq!(body.lines().count(), 1);
}

#[test]
fn hello_frames_are_decoded_from_a_stream() {
    let hello = encode(
        &LinkMessage::GatewayHello {
            version: "1".into(),
        },
        b"",
    );
    let mut inbox = hello[..5].to_vec();
    assert_eq!(next_frame(&mut inbox), Ok(None));
    inbox.extend_from_slice(&hello[5..]);
    inbox.extend_from_slice(b"raw");
    assert!(matches!(
        next_frame(&mut inbox),
        Ok(Some(LinkMessage::GatewayHello { .. }))
    ));
    assert_eq!(inbox, b"raw");
    assert_eq!(next_frame(&mut b"HTTP".to_vec()), Err(FrameError::BadMagic));
}

#[test]
fn a_gateway_refusing_after_the_stream_hello_gets_502() {
    // What the gateway does for a stale boot id or when no control link is up.
    let gateway = Gateway::start(|mut conn| {
        say_hello(&mut conn);
        read_frames(&mut conn, 1);
        let refused = LinkMessage::Refused {
            reason: "no control link is up for this sandbox".into(),
        };
        let frame = encode(&refused, b"");
        // In two pieces: the first one alone decides nothing.
        conn.write_all(&frame[..3]).unwrap();
        thread::sleep(Duration::from_millis(50));
        conn.write_all(&frame[3..]).unwrap();
    });
    let proxy = Proxy::start(gateway.upstream(), limits());
    assert_unreachable(&exchange(&proxy, CONNECT));
    gateway.join();

    // Refused and closed without reading the stream's frames: the kernel resets the
    // connection behind the frame.
    let gateway = Gateway::start(|mut conn| {
        say_hello(&mut conn);
        thread::sleep(Duration::from_millis(50));
        let refused = LinkMessage::Refused {
            reason: "stale boot".into(),
        };
        conn.write_all(&encode(&refused, b"")).unwrap();
    });
    let proxy = Proxy::start(gateway.upstream(), limits());
    assert_unreachable(&exchange(&proxy, CONNECT));
    gateway.join();

    // Bytes that only start like the magic are the stream's, held back no longer than
    // it takes to tell.
    let (report, _opened) = mpsc::channel();
    let gateway = Gateway::start(move |mut conn| {
        open_stream(&mut conn, &report);
        conn.write_all(b"BG").unwrap();
        thread::sleep(Duration::from_millis(50));
        conn.write_all(b"X raw").unwrap();
    });
    let proxy = Proxy::start(gateway.upstream(), limits());
    assert_eq!(exchange(&proxy, CONNECT), "BGX raw");
    gateway.join();
}

/// A transparent listener on `0.0.0.0` and a free port (so that clients can dial any
/// loopback address, `127.77.0.0/16` included), and its port.
fn transparent_listener() -> (TransparentListener, u16) {
    let listener = TransparentListener::bind(0).unwrap();
    let port = listener.port().unwrap();
    assert!(listener
        .listener
        .local_addr()
        .unwrap()
        .ip()
        .is_unspecified());
    (listener, port)
}

/// The address the stub on `port` answers for `name` (over UDP).
fn resolve(port: u16, name: &str) -> std::net::Ipv4Addr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut query = vec![0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(u8::try_from(label.len()).unwrap());
        query.extend_from_slice(label.as_bytes());
    }
    query.extend([0, 0, 1, 0, 1]);
    socket.send_to(&query, ("127.0.0.1", port)).unwrap();
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).unwrap();
    // The answer's address is the last four bytes of the response.
    assert_eq!(&buf[..2], [0xab, 0xcd]);
    let ip: [u8; 4] = buf[n - 4..n].try_into().unwrap();
    std::net::Ipv4Addr::from(ip)
}

/// Something that starts like a TLS ClientHello.
const CLIENT_HELLO: &[u8] = b"\x16\x03\x01\x00\x05hello";

#[test]
fn transparent_clients_are_relayed_for_the_name_behind_the_address() {
    let (report, opened) = mpsc::channel();
    let gateway = Gateway::start(move |mut conn| {
        say_hello(&mut conn);
        let (mut frames, rest) = read_frames(&mut conn, 2);
        let open = frames.pop().unwrap();
        let hello = frames.pop().unwrap();
        // The client's first bytes: the payload, then what arrived after the frames.
        let mut sent = [&open.payload[..], &rest[..]].concat();
        let mut chunk = vec![0u8; 1024];
        while sent.len() < CLIENT_HELLO.len() {
            let n = conn.read(&mut chunk).unwrap();
            assert!(n > 0);
            sent.extend_from_slice(&chunk[..n]);
        }
        report
            .send(Opened {
                hello: hello.message,
                open: open.message,
                payload: sent,
            })
            .unwrap();
        conn.write_all(b"server hello").unwrap();
        let mut tail = Vec::new();
        conn.read_to_end(&mut tail).unwrap();
        assert_eq!(tail, b"bye");
        conn.shutdown(Shutdown::Write).unwrap();
    });
    let (listener, port) = transparent_listener();
    // The kernel picks the UDP port; TCP may find it taken.
    let dns = (0..20)
        .find_map(|_| crate::dns::DnsListener::bind(0).ok())
        .unwrap();
    let dns_port = dns.port().unwrap();
    let proxy = Proxy::start_with(gateway.upstream(), limits(), |egress| {
        egress.with_dns(dns).with_transparent(listener)
    });
    let ip = resolve(dns_port, "Example.Test");
    assert_eq!(ip, std::net::Ipv4Addr::new(127, 77, 0, 1));
    let mut client = TcpStream::connect((ip, port)).unwrap();
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    client.write_all(CLIENT_HELLO).unwrap();
    let opened = opened.recv_timeout(PATIENCE).unwrap();
    assert_eq!(
        opened.open,
        LinkMessage::EgressOpen {
            entry: EgressEntry::Transparent,
            name: Some("example.test".to_string()),
            port,
        }
    );
    assert!(matches!(
        opened.hello,
        LinkMessage::ShimHello {
            role: Role::Egress,
            ..
        }
    ));
    assert_eq!(opened.payload, CLIENT_HELLO);
    assert_eq!(read_exactly(&mut client, 12), b"server hello");
    client.write_all(b"bye").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    gateway.join();
    drop(proxy);
}

/// Whether the peer closed `client` without sending a byte.
fn closed_at_once(client: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    match client.read(&mut buf) {
        Ok(0) => true,
        Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn transparent_clients_of_other_addresses_are_closed() {
    let (listener, port) = transparent_listener();
    let proxy = Proxy::start_with(
        Upstream::Unavailable("test".into()),
        limits(),
        |mut egress| {
            egress
                .names
                .address_for("example.test", Instant::now())
                .unwrap();
            egress.with_transparent(listener)
        },
    );
    // Not synthetic, not handed out, and handed out but without a way to the gateway.
    for ip in ["127.0.0.1", "127.77.0.9", "127.77.0.1"] {
        let mut client = TcpStream::connect((ip, port)).unwrap();
        client.set_read_timeout(Some(PATIENCE)).unwrap();
        client.write_all(CLIENT_HELLO).unwrap();
        assert!(closed_at_once(&mut client), "{ip}");
    }
    assert!(proxy.finish().streams.is_empty());
}

#[test]
fn the_proxy_maps_synthetic_addresses_back_to_names() {
    let connect = b"CONNECT 127.77.0.1:443 HTTP/1.1\r\nHost: 127.77.0.1:443\r\n\r\n";
    let (gateway, opened) = echo_gateway();
    let proxy = Proxy::start_with(gateway.upstream(), limits(), |mut egress| {
        egress
            .names
            .address_for("example.test", Instant::now())
            .unwrap();
        egress
    });
    let mut client = proxy.client();
    client.write_all(connect).unwrap();
    assert_eq!(read_exactly(&mut client, ESTABLISHED.len()), ESTABLISHED);
    assert_opened(&opened.recv().unwrap(), "example.test", 443, connect);
    drop(client);
    gateway.join();

    // An address without a name goes as it is.
    let connect = b"CONNECT 127.77.0.2:443 HTTP/1.1\r\n\r\n";
    let (gateway, opened) = echo_gateway();
    let proxy = Proxy::start(gateway.upstream(), limits());
    let mut client = proxy.client();
    client.write_all(connect).unwrap();
    assert_eq!(read_exactly(&mut client, ESTABLISHED.len()), ESTABLISHED);
    assert_opened(&opened.recv().unwrap(), "127.77.0.2", 443, connect);
    drop(client);
    gateway.join();
}

#[test]
fn transparent_listeners_share_their_port_with_nobody() {
    let (listener, port) = transparent_listener();
    let fd = listener.listener.as_fd();
    let option = |name| sys::socket_option(fd, libc::SOL_SOCKET, name).unwrap();
    assert_eq!(option(libc::SO_REUSEADDR), 0);
    assert_eq!(option(libc::SO_REUSEPORT), 0);
    assert_ne!(sys::status_flags(fd).unwrap() & libc::O_NONBLOCK, 0);
    let flags = sys::descriptor_flags(fd.as_raw_fd()).unwrap();
    assert_ne!(flags & libc::FD_CLOEXEC, 0);
    for ip in ["0.0.0.0", "127.0.0.1", "127.77.0.1"] {
        let err = std::net::TcpListener::bind((ip, port)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{ip}");
    }
    let err = TransparentListener::bind(port).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
}
