use super::*;

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// The longest a test waits for anything.
const PATIENCE: Duration = Duration::from_secs(5);
/// The longest the stub's thread sleeps, so it notices when to stop.
const TICK: Duration = Duration::from_millis(20);

const T_A: u16 = 1;
const T_PTR: u16 = 12;
const T_MX: u16 = 15;
const T_AAAA: u16 = 28;
const T_SVCB: u16 = 64;
const T_HTTPS: u16 = 65;
const T_ANY: u16 = 255;

/// `name` in the wire format (labels split at dots, no compression).
fn wire_name(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(u8::try_from(label.len()).unwrap());
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out
}

/// A query with `RD` set and one question per `(name, type)`.
fn query_many(id: u16, questions: &[(&str, u16)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(id.to_be_bytes());
    out.extend([0x01, 0x00]);
    out.extend(u16::try_from(questions.len()).unwrap().to_be_bytes());
    out.extend([0, 0, 0, 0, 0, 0]);
    for (name, qtype) in questions {
        out.extend(wire_name(name));
        out.extend(qtype.to_be_bytes());
        out.extend(1u16.to_be_bytes());
    }
    out
}

fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    query_many(id, &[(name, qtype)])
}

/// `query` with an EDNS OPT record (4096-byte payload).
fn with_opt(mut query: Vec<u8>) -> Vec<u8> {
    query[11] = 1;
    query.extend([0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0]);
    query
}

/// What a response says.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    id: u16,
    rcode: RCODE,
    rd: bool,
    /// The echoed question's name, as sent, and type.
    question: Option<(String, u16)>,
    /// `A` answers: address and TTL.
    answers: Vec<(Ipv4Addr, u32)>,
}

/// Decodes `response`, checking what every response has.
fn decode(response: &[u8]) -> Reply {
    let packet = Packet::parse(response).expect("a well-formed response");
    assert!(packet.has_flags(PacketFlag::RESPONSE));
    assert!(packet.has_flags(PacketFlag::RECURSION_AVAILABLE));
    assert!(packet.questions.len() <= 1);
    assert!(packet.name_servers.is_empty() && packet.additional_records.is_empty());
    let question = packet.questions.first().map(|q| {
        let name = q
            .qname
            .get_labels()
            .iter()
            .map(|l| String::from_utf8_lossy(l.as_ref()).into_owned())
            .collect::<Vec<_>>()
            .join(".");
        (name, u16::from(q.qtype))
    });
    let answers = packet
        .answers
        .iter()
        .map(|rr| match &rr.rdata {
            RData::A(a) => (Ipv4Addr::from(a.address), rr.ttl),
            other => panic!("not an A record: {other:?}"),
        })
        .collect();
    Reply {
        id: packet.id(),
        rcode: packet.rcode(),
        rd: packet.has_flags(PacketFlag::RECURSION_DESIRED),
        question,
        answers,
    }
}

fn ask(names: &mut SyntheticNames, now: Instant, query: &[u8]) -> Reply {
    decode(&answer(query, names, now).expect("an answer"))
}

fn a_for(names: &mut SyntheticNames, now: Instant, name: &str) -> Reply {
    ask(names, now, &query(7, name, T_A))
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn a_queries_get_stable_synthetic_addresses() {
    let mut names = SyntheticNames::new();
    let now = Instant::now();
    let reply = ask(&mut names, now, &query(0x1234, "Example.COM.", T_A));
    assert_eq!(
        reply,
        Reply {
            id: 0x1234,
            rcode: RCODE::NoError,
            rd: true,
            // The question goes back as it was asked.
            question: Some(("Example.COM".into(), T_A)),
            answers: vec![(ip("127.77.0.1"), TTL_SECS)],
        }
    );
    let second = a_for(&mut names, now, "api.example.org");
    assert_eq!(second.answers, [(ip("127.77.0.2"), 30)]);
    // Case and the trailing dot do not make another name.
    for same in ["example.com", "EXAMPLE.com.", "example.com"] {
        assert_eq!(
            a_for(&mut names, now, same).answers,
            [(ip("127.77.0.1"), 30)]
        );
    }
    assert_eq!(
        names.name_for(ip("127.77.0.1"), now).as_deref(),
        Some("example.com")
    );
    assert_eq!(
        names.name_for(ip("127.77.0.2"), now).as_deref(),
        Some("api.example.org")
    );
    assert_eq!(names.name_for(ip("127.77.0.3"), now), None);
    assert_eq!(names.name_for(ip("127.0.0.1"), now), None);
    // EDNS and a cleared RD are fine; RD is copied.
    let mut q = with_opt(query(9, "example.com", T_A));
    q[2] = 0;
    let reply = ask(&mut names, now, &q);
    assert!(!reply.rd);
    assert_eq!(reply.answers, [(ip("127.77.0.1"), 30)]);
    // A 253-byte name is still a name.
    let long = [
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61),
    ]
    .join(".");
    assert_eq!(long.len(), MAX_NAME_LEN);
    assert_eq!(
        a_for(&mut names, now, &long).answers,
        [(ip("127.77.0.3"), 30)]
    );
}

#[test]
fn the_pool_skips_the_network_and_broadcast_addresses() {
    let mut names = SyntheticNames::new();
    let now = Instant::now();
    let mut last = None;
    for i in 0..usize::from(POOL_SIZE) {
        last = names.address_for(&format!("n{i}"), now);
        if i == 254 {
            assert_eq!(last, Some(ip("127.77.0.255")));
        }
        if i == 255 {
            assert_eq!(last, Some(ip("127.77.1.0")));
        }
    }
    assert_eq!(last, Some(ip("127.77.255.254")));
    assert_eq!(names.address_for("one-more", now), None);
    assert_eq!(names.name_for(ip("127.77.0.0"), now), None);
    assert_eq!(names.name_for(ip("127.77.255.255"), now), None);
}

#[test]
fn localhost_is_loopback() {
    let mut names = SyntheticNames::new();
    let now = Instant::now();
    for name in ["localhost", "LocalHost.", "app.localhost"] {
        assert_eq!(
            a_for(&mut names, now, name).answers,
            [(Ipv4Addr::LOCALHOST, 30)]
        );
    }
    let reply = ask(&mut names, now, &query(1, "localhost", T_AAAA));
    assert_eq!((reply.rcode, reply.answers.len()), (RCODE::NoError, 0));
    // No synthetic address went to them.
    assert_eq!(
        a_for(&mut names, now, "x.test").answers,
        [(ip("127.77.0.1"), 30)]
    );
}

#[test]
fn other_types_get_nodata() {
    let mut names = SyntheticNames::new();
    let now = Instant::now();
    for qtype in [T_AAAA, T_HTTPS, T_SVCB, T_MX, 16, 257] {
        let reply = ask(&mut names, now, &with_opt(query(3, "example.com", qtype)));
        assert_eq!(reply.rcode, RCODE::NoError, "type {qtype}");
        assert_eq!(reply.question, Some(("example.com".into(), qtype)));
        assert!(reply.answers.is_empty());
    }
    // Nothing was handed out for them.
    assert_eq!(names.name_for(ip("127.77.0.1"), now), None);
}

#[test]
fn ptr_any_and_other_counts_are_refused() {
    let mut names = SyntheticNames::new();
    let now = Instant::now();
    for (name, qtype) in [("1.0.77.127.in-addr.arpa", T_PTR), ("example.com", T_ANY)] {
        let reply = ask(&mut names, now, &query(4, name, qtype));
        assert_eq!(reply.rcode, RCODE::Refused);
        assert_eq!(reply.question, Some((name.into(), qtype)));
    }
    let two = query_many(5, &[("a.test", T_A), ("b.test", T_A)]);
    let reply = ask(&mut names, now, &two);
    assert_eq!((reply.id, reply.rcode), (5, RCODE::Refused));
    assert_eq!(reply.question, None);
    let none = query_many(6, &[]);
    assert_eq!(ask(&mut names, now, &none).rcode, RCODE::Refused);
    // A class other than IN.
    let mut chaos = query(8, "version.bind", 16);
    let at = chaos.len() - 1;
    chaos[at] = 3;
    assert_eq!(ask(&mut names, now, &chaos).rcode, RCODE::Refused);
    assert_eq!(names.name_for(ip("127.77.0.1"), now), None);
}

#[test]
fn malformed_queries() {
    let mut names = SyntheticNames::new();
    let now = Instant::now();
    // A 300-byte name does not parse; 254 bytes parse but are too long.
    let long = vec!["x".repeat(59); 5].join(".");
    assert_eq!(long.len(), 299);
    let reply = ask(&mut names, now, &query(10, &long, T_A));
    assert_eq!((reply.id, reply.rcode), (10, RCODE::FormatError));
    let long = [
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(62),
    ]
    .join(".");
    assert_eq!(long.len(), 254);
    assert_eq!(a_for(&mut names, now, &long).rcode, RCODE::FormatError);
    // A cut question.
    let mut cut = query(11, "example.com", T_A);
    cut.truncate(cut.len() - 3);
    let reply = ask(&mut names, now, &cut);
    assert_eq!(
        (reply.id, reply.rcode, reply.rd),
        (11, RCODE::FormatError, true)
    );
    // Answers in a query.
    let mut q = query(12, "example.com", T_A);
    q[7] = 1;
    assert_eq!(ask(&mut names, now, &q).rcode, RCODE::FormatError);
    // Names that cannot be host names.
    for name in ["a b.test", "x\u{1}.test"] {
        assert_eq!(a_for(&mut names, now, name).rcode, RCODE::NameError);
    }
    assert_eq!(a_for(&mut names, now, "").rcode, RCODE::NameError);
    // Another opcode.
    let mut q = query(13, "example.com", T_A);
    q[2] |= 2 << 3;
    assert_eq!(ask(&mut names, now, &q).rcode, RCODE::NotImplemented);
    // Nothing for a short datagram or a response.
    assert_eq!(answer(&q[..11], &mut names, now), None);
    assert_eq!(answer(&[], &mut names, now), None);
    let mut response = query(14, "example.com", T_A);
    response[2] |= 0x80;
    assert_eq!(answer(&response, &mut names, now), None);
    assert_eq!(names.name_for(ip("127.77.0.1"), now), None);
}

#[test]
fn a_full_pool_fails_until_an_address_is_idle() {
    let idle = Duration::from_secs(600);
    let mut names = SyntheticNames::with_pool(2, idle);
    let t0 = Instant::now();
    assert_eq!(
        a_for(&mut names, t0, "a.test").answers,
        [(ip("127.77.0.1"), 30)]
    );
    assert_eq!(
        a_for(&mut names, t0, "b.test").answers,
        [(ip("127.77.0.2"), 30)]
    );
    let reply = a_for(&mut names, t0, "c.test");
    assert_eq!(
        (reply.rcode, reply.answers.len()),
        (RCODE::ServerFailure, 0)
    );
    assert_eq!(reply.question, Some(("c.test".into(), T_A)));
    // Known names still resolve.
    assert_eq!(
        a_for(&mut names, t0, "b.test").answers,
        [(ip("127.77.0.2"), 30)]
    );

    // a is used again (a connection to its address), b is not.
    let t1 = t0 + Duration::from_secs(300);
    assert_eq!(
        names.name_for(ip("127.77.0.1"), t1).as_deref(),
        Some("a.test")
    );
    let t2 = t0 + idle - Duration::from_secs(1);
    assert_eq!(a_for(&mut names, t2, "c.test").rcode, RCODE::ServerFailure);
    let t3 = t0 + idle;
    assert_eq!(
        a_for(&mut names, t3, "c.test").answers,
        [(ip("127.77.0.2"), 30)]
    );
    assert_eq!(
        names.name_for(ip("127.77.0.2"), t3).as_deref(),
        Some("c.test")
    );
    assert_eq!(
        names.name_for(ip("127.77.0.1"), t3).as_deref(),
        Some("a.test")
    );
    // b is gone: it gets the next idle address, none yet.
    assert_eq!(a_for(&mut names, t3, "b.test").rcode, RCODE::ServerFailure);
    // a was last used at t3 (the look-up above counts too).
    assert_eq!(
        a_for(&mut names, t1 + idle, "b.test").rcode,
        RCODE::ServerFailure
    );
    let t4 = t3 + idle;
    assert_eq!(
        a_for(&mut names, t4, "b.test").answers,
        [(ip("127.77.0.1"), 30)]
    );
    assert_eq!(
        names.name_for(ip("127.77.0.1"), t4).as_deref(),
        Some("b.test")
    );
}

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n.max(1)).unwrap()).unwrap()
    }
}

#[test]
fn mutated_queries_get_a_well_formed_answer_or_none() {
    let seeds = [
        query(1, "example.com", T_A),
        with_opt(query(2, "api.Example.org", T_AAAA)),
        query(3, "a.b.c.d.e.f.localhost", T_A),
        query_many(4, &[("a.test", T_A), ("b.test", T_HTTPS)]),
        query(5, "1.0.77.127.in-addr.arpa", T_PTR),
        // A compression pointer in the question.
        [
            &query(6, "x.test", T_A)[..12],
            &[1, b'y', 0xc0, 12],
            &[0, 1, 0, 1],
        ]
        .concat(),
    ];
    let mut rng = Rng(0x5eed_beef_cafe_f00d);
    let mut names = SyntheticNames::with_pool(64, Duration::from_secs(600));
    let now = Instant::now();
    let mut answered = 0;
    for round in 0..5000 {
        let mut q = seeds[round % seeds.len()].clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(q.len() + 1);
            match rng.below(6) {
                0 if at < q.len() => q[at] ^= 1 << rng.below(8),
                1 if at < q.len() => q[at] = u8::try_from(rng.below(256)).unwrap(),
                2 if at < q.len() => q[at] = [0, 0x3f, 0x40, 0xc0, 0xff][rng.below(5)],
                3 => q.truncate(at),
                4 => q.insert(at, u8::try_from(rng.below(256)).unwrap()),
                _ => q.extend_from_within(at..),
            }
        }
        let Some(response) = answer(&q, &mut names, now) else {
            continue;
        };
        answered += 1;
        let packet = Packet::parse(&response)
            .unwrap_or_else(|e| panic!("round {round}: {e:?}: {q:?} → {response:?}"));
        assert!(packet.has_flags(PacketFlag::RESPONSE));
        assert_eq!(packet.id(), u16::from_be_bytes([q[0], q[1]]));
        assert!(packet.questions.len() <= 1);
        assert!(packet.answers.len() <= 1);
        assert!(
            response.len() <= 512,
            "round {round}: {} bytes",
            response.len()
        );
    }
    assert!(answered > 2500, "{answered}");
}

/// A [`DnsStub`] run by a poll loop in a thread, like init's.
struct Stub {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Binds a stub on a free port of 127.0.0.1 (UDP and TCP).
fn bind_stub() -> DnsListener {
    let mut last = None;
    for _ in 0..20 {
        match DnsListener::bind(0) {
            Ok(listener) => return listener,
            // The port the kernel picked for UDP was taken for TCP.
            Err(e) => last = Some(e),
        }
    }
    panic!("cannot bind a stub: {last:?}");
}

impl Stub {
    fn start() -> Self {
        let listener = bind_stub();
        let port = listener.port().unwrap();
        let mut stub = DnsStub::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let mut names = SyntheticNames::new();
            let mut fds = Vec::new();
            while !stopping.load(Ordering::Relaxed) {
                fds.clear();
                let timeout = stub
                    .prepare(Instant::now(), &mut fds)
                    .map_or(TICK, |t| t.min(TICK));
                sys::poll(&mut fds, Some(timeout)).unwrap();
                stub.dispatch(Instant::now(), &fds, &mut names);
            }
        });
        Self {
            port,
            stop,
            thread: Some(thread),
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn udp_ask(stub: &Stub, query: &[u8]) -> Option<Vec<u8>> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    socket.send_to(query, stub.addr()).unwrap();
    let mut buf = vec![0u8; 2048];
    match socket.recv(&mut buf) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn the_stub_answers_over_udp() {
    let stub = Stub::start();
    let reply = decode(&udp_ask(&stub, &query(21, "example.com", T_A)).unwrap());
    assert_eq!(
        (reply.id, reply.answers),
        (21, vec![(ip("127.77.0.1"), 30)])
    );
    let reply = decode(&udp_ask(&stub, &query(22, "other.test", T_A)).unwrap());
    assert_eq!(reply.answers, [(ip("127.77.0.2"), 30)]);
    let reply = decode(&udp_ask(&stub, &query(23, "Example.com", T_A)).unwrap());
    assert_eq!(reply.answers, [(ip("127.77.0.1"), 30)]);
    let reply = decode(&udp_ask(&stub, &query(24, "example.com", T_HTTPS)).unwrap());
    assert_eq!((reply.rcode, reply.answers.len()), (RCODE::NoError, 0));
    // A short datagram gets nothing, and the stub goes on.
    assert_eq!(udp_ask(&stub, b"short"), None);
    let reply = decode(&udp_ask(&stub, &query(25, "example.com", T_ANY)).unwrap());
    assert_eq!(reply.rcode, RCODE::Refused);
}

fn framed(message: &[u8]) -> Vec<u8> {
    [
        &u16::try_from(message.len()).unwrap().to_be_bytes()[..],
        message,
    ]
    .concat()
}

fn read_framed(conn: &mut TcpStream) -> Vec<u8> {
    let mut prefix = [0u8; 2];
    conn.read_exact(&mut prefix).unwrap();
    let mut message = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
    conn.read_exact(&mut message).unwrap();
    message
}

#[test]
fn the_stub_answers_over_tcp() {
    let stub = Stub::start();
    let mut conn = TcpStream::connect(stub.addr()).unwrap();
    conn.set_read_timeout(Some(PATIENCE)).unwrap();
    // Two queries in one write, then one in pieces.
    let two = [
        framed(&query(31, "example.com", T_A)),
        framed(&query(32, "example.com", T_AAAA)),
    ]
    .concat();
    conn.write_all(&two).unwrap();
    let reply = decode(&read_framed(&mut conn));
    assert_eq!(
        (reply.id, reply.answers),
        (31, vec![(ip("127.77.0.1"), 30)])
    );
    let reply = decode(&read_framed(&mut conn));
    assert_eq!(
        (reply.id, reply.rcode, reply.answers.len()),
        (32, RCODE::NoError, 0)
    );
    let third = framed(&query(33, "two.test", T_A));
    conn.write_all(&third[..1]).unwrap();
    thread::sleep(Duration::from_millis(50));
    conn.write_all(&third[1..9]).unwrap();
    thread::sleep(Duration::from_millis(50));
    conn.write_all(&third[9..]).unwrap();
    let reply = decode(&read_framed(&mut conn));
    assert_eq!(
        (reply.id, reply.answers),
        (33, vec![(ip("127.77.0.2"), 30)])
    );
    // The same mapping as over UDP.
    let reply = decode(&udp_ask(&stub, &query(34, "two.test", T_A)).unwrap());
    assert_eq!(reply.answers, [(ip("127.77.0.2"), 30)]);
    // Ending the connection after a query still gets its answer.
    conn.write_all(&framed(&query(35, "example.com", T_A)))
        .unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(decode(&read_framed(&mut conn)).id, 35);
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());

    // An over-long message closes the connection.
    let mut conn = TcpStream::connect(stub.addr()).unwrap();
    conn.set_read_timeout(Some(PATIENCE)).unwrap();
    let len = u16::try_from(MAX_TCP_MESSAGE + 1).unwrap();
    conn.write_all(&len.to_be_bytes()).unwrap();
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    assert!(rest.is_empty());
}

#[test]
fn the_sockets_share_their_port_with_nobody() {
    let listener = bind_stub();
    let port = listener.port().unwrap();
    assert_eq!(listener.tcp.local_addr().unwrap().port(), port);
    assert!(listener.udp.local_addr().unwrap().ip().is_loopback());
    for fd in [listener.udp.as_fd(), listener.tcp.as_fd()] {
        let option = |name| sys::socket_option(fd, libc::SOL_SOCKET, name).unwrap();
        assert_eq!(option(libc::SO_REUSEADDR), 0);
        assert_eq!(option(libc::SO_REUSEPORT), 0);
        assert_ne!(sys::status_flags(fd).unwrap() & libc::O_NONBLOCK, 0);
        let flags = sys::descriptor_flags(fd.as_raw_fd()).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
    }
    assert!(UdpSocket::bind(("127.0.0.1", port)).is_err());
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err());
    assert!(DnsListener::bind(port).is_err());
}

/// The fuzz target's seeds (`fuzz/corpus/dns_stub`), on the normal build: each gets a
/// reply that parses, with the query's id, and the A query gets a synthetic address.
#[test]
fn fuzz_seeds_get_well_formed_replies() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/dns_stub");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let query = std::fs::read(&path).unwrap();
        let mut names = SyntheticNames::new();
        let reply = answer(&query, &mut names, Instant::now())
            .unwrap_or_else(|| panic!("{}: no reply", path.display()));
        assert_eq!(reply[..2], query[..2], "{}", path.display());
        let packet = Packet::parse(&reply).unwrap();
        if path.ends_with("a") {
            let RData::A(a) = &packet.answers[0].rdata else {
                panic!("{}: {packet:?}", path.display());
            };
            assert!(is_synthetic(Ipv4Addr::from(a.address)), "{a:?}");
        }
        seen += 1;
    }
    assert!(seen >= 4, "{}: {seen} seeds", dir.display());
}
