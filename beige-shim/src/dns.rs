//! PID 1's DNS stub and its synthetic addresses (design: `spec/egress.md` §4).
//!
//! The container's resolver is `127.0.0.1` (no search domains), and this stub is what
//! answers there, on UDP and TCP port 53 ([`DNS_PORT`]). It resolves nothing: every
//! name asked for with an `A` query gets an address of its own from `127.77.0.0/16`
//! ([`SyntheticNames`]), stable for the life of PID 1, so that a client that is not
//! proxy-aware connects to that address, where a transparent listener of
//! [`crate::egress`] takes the connection, maps the address back to the name and hands
//! the stream to the gateway, which decides. Answers ([`answer`]), always with the
//! query's id and question, `QR` and `RA` set and `RD` copied:
//!
//! - `A`: the name's synthetic address, TTL [`TTL_SECS`]; `localhost` and
//!   `*.localhost`: `127.0.0.1`. An address unused (no answer naming it, no connection
//!   to it) for [`REUSE_IDLE`] may go to another name; when none is free the answer is
//!   `SERVFAIL`;
//! - `AAAA`, `HTTPS`, `SVCB` and every other type: `NOERROR` without answers (NODATA),
//!   so clients get neither IPv6 addresses nor ECH configurations;
//! - `PTR`, `ANY`, a class other than `IN`, or not exactly one question: `REFUSED`;
//!   an opcode other than a standard query: `NOTIMP`;
//! - a name over [`MAX_NAME_LEN`] bytes, or a message that does not parse (but has a
//!   whole 12-byte header): `FORMERR`; shorter datagrams and responses get nothing;
//! - a name that cannot be a host name (a byte other than letters, digits, `-` and
//!   `_`, or the root): `NXDOMAIN`.
//!
//! Names are compared lower-cased, without a trailing dot. Messages are parsed with
//! `simple-dns`; the parser faces the agent, so nothing in here may panic on what it
//! is sent. Like the rest of PID 1, the stub owns no thread and never blocks: its
//! sockets are non-blocking and close-on-exec, bound ([`DnsListener::bind`]) with the
//! other listeners before the link is dialled, and the `poll(2)` loop drives it
//! through [`DnsStub::prepare`] and [`DnsStub::dispatch`]. Over TCP each message has
//! its 2-byte length prefix; at most [`MAX_TCP_CONNS`] connections are open, each with
//! bounded buffers and closed after [`TCP_IDLE`] without a query.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use simple_dns::rdata::{RData, A};
use simple_dns::{Packet, PacketFlag, Question, ResourceRecord, CLASS, OPCODE, QCLASS, QTYPE};
use simple_dns::{RCODE, TYPE};

use crate::link::log;
use crate::sys;

/// The stub's port on `127.0.0.1`, UDP and TCP.
pub const DNS_PORT: u16 = 53;
/// The TTL of every answer, in seconds.
pub const TTL_SECS: u32 = 30;
/// How long a synthetic address must go unused before it may be given to another name.
pub const REUSE_IDLE: Duration = Duration::from_secs(600);
/// The longest name answered (in its dotted form, without the trailing dot); longer
/// ones get `FORMERR`.
pub const MAX_NAME_LEN: usize = 253;
/// TCP connections open at once; further ones are closed at once.
pub const MAX_TCP_CONNS: usize = 16;
/// A TCP connection without a complete query for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// The longest message taken over TCP; a longer length prefix closes the connection.
pub const MAX_TCP_MESSAGE: usize = 4096;

/// The first two octets of every synthetic address.
const NET: [u8; 2] = [127, 77];
/// Addresses in the pool: `127.77.0.1` to `127.77.255.254`.
const POOL_SIZE: u16 = 0xfffe;
/// Bytes of a DNS header.
const HEADER_LEN: usize = 12;
/// The largest UDP datagram read; longer ones are cut, and so do not parse.
const MAX_DATAGRAM: usize = 4096;
/// Datagrams (and TCP accepts) handled per wake-up.
const PER_WAKE: usize = 64;
/// Bytes of answers waiting for a TCP client before it is read no more.
const MAX_TCP_OUTBOX: usize = 64 * 1024;
/// Pause before accepting again after `accept` failed.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Whether `ip` is in the synthetic range, `127.77.0.0/16`.
pub fn is_synthetic(ip: Ipv4Addr) -> bool {
    ip.octets()[..2] == NET
}

/// The names the stub has handed addresses out for, both ways (see the module
/// documentation). Every use is stamped with the caller's `now`.
#[derive(Debug)]
pub struct SyntheticNames {
    /// Addresses in the pool: offsets `1..=size` in `127.77.0.0/16`.
    size: u16,
    /// How long an address must go unused before it is reused.
    idle: Duration,
    /// The next offset never handed out.
    next: u32,
    by_name: HashMap<String, u16>,
    /// Offset → (name, last use).
    by_offset: HashMap<u16, (String, Instant)>,
    /// (last use, offset) of every address handed out, least recently used first.
    by_use: BTreeSet<(Instant, u16)>,
}

impl Default for SyntheticNames {
    fn default() -> Self {
        Self::new()
    }
}

impl SyntheticNames {
    /// An empty mapping over the whole pool, `127.77.0.1` to `127.77.255.254`, reusing
    /// addresses after [`REUSE_IDLE`].
    pub fn new() -> Self {
        Self::with_pool(POOL_SIZE, REUSE_IDLE)
    }

    /// An empty mapping over the first `size` addresses of the pool (at most the whole
    /// pool), reusing addresses after `idle`.
    pub(crate) fn with_pool(size: u16, idle: Duration) -> Self {
        Self {
            size: size.min(POOL_SIZE),
            idle,
            next: 1,
            by_name: HashMap::new(),
            by_offset: HashMap::new(),
            by_use: BTreeSet::new(),
        }
    }

    /// The address of `name` (already lower-cased, without a trailing dot), handing a
    /// new one out when it has none; `None` when the pool is full. Counts as a use.
    pub fn address_for(&mut self, name: &str, now: Instant) -> Option<Ipv4Addr> {
        if let Some(&offset) = self.by_name.get(name) {
            self.touch(offset, now);
            return Some(address(offset));
        }
        let offset = match u16::try_from(self.next).ok().filter(|&o| o <= self.size) {
            Some(offset) => {
                self.next += 1;
                offset
            }
            None => {
                let &(last, offset) = self.by_use.first()?;
                if now.saturating_duration_since(last) < self.idle {
                    return None;
                }
                self.by_use.remove(&(last, offset));
                if let Some((old, _)) = self.by_offset.remove(&offset) {
                    self.by_name.remove(&old);
                }
                offset
            }
        };
        self.by_name.insert(name.to_string(), offset);
        self.by_offset.insert(offset, (name.to_string(), now));
        self.by_use.insert((now, offset));
        Some(address(offset))
    }

    /// The name `ip` was handed out for, if any. Counts as a use.
    pub fn name_for(&mut self, ip: Ipv4Addr, now: Instant) -> Option<String> {
        if !is_synthetic(ip) {
            return None;
        }
        let [_, _, hi, lo] = ip.octets();
        let offset = u16::from_be_bytes([hi, lo]);
        let name = self.by_offset.get(&offset)?.0.clone();
        self.touch(offset, now);
        Some(name)
    }

    /// Stamps a use of `offset` (handed out) at `now`.
    fn touch(&mut self, offset: u16, now: Instant) {
        if let Some((_, last)) = self.by_offset.get_mut(&offset) {
            if *last < now {
                self.by_use.remove(&(*last, offset));
                *last = now;
                self.by_use.insert((now, offset));
            }
        }
    }
}

/// The synthetic address at `offset` in `127.77.0.0/16`.
fn address(offset: u16) -> Ipv4Addr {
    let [hi, lo] = offset.to_be_bytes();
    Ipv4Addr::new(NET[0], NET[1], hi, lo)
}

/// What a query is answered with, before it is encoded.
#[derive(Debug)]
enum Outcome {
    /// `NOERROR` with this address (or none: NODATA).
    Answer(Option<Ipv4Addr>),
    /// An error code.
    Error(RCODE),
}

/// The response to the DNS message `query` (without a TCP length prefix), or `None`
/// when it gets none (shorter than a header, or a response itself). `A` answers use
/// (and may extend) `names` at `now`.
pub fn answer(query: &[u8], names: &mut SyntheticNames, now: Instant) -> Option<Vec<u8>> {
    let header = query.get(..HEADER_LEN)?;
    let flags = u16::from_be_bytes([header[2], header[3]]);
    if flags & PacketFlag::RESPONSE.bits() != 0 {
        return None;
    }
    let opcode = (header[2] >> 3) & 0x0f;
    let count = |at: usize| u16::from_be_bytes([header[at], header[at + 1]]);
    let bare = |rcode: RCODE| Some(bare_response(header, rcode));
    if opcode != 0 {
        return bare(RCODE::NotImplemented);
    }
    if count(4) != 1 {
        return bare(RCODE::Refused);
    }
    // A query has no answers or authority records, and at most an OPT and a TSIG
    // record: this also keeps the parser from sizing sections from hostile counts.
    if count(6) != 0 || count(8) != 0 || count(10) > 2 {
        return bare(RCODE::FormatError);
    }
    let Ok(packet) = Packet::parse(query) else {
        return bare(RCODE::FormatError);
    };
    let Some(question) = packet.questions.first() else {
        return bare(RCODE::FormatError);
    };
    let outcome = resolve(question, names, now);
    let mut reply = Packet::new_reply(packet.id());
    let mut set = PacketFlag::RECURSION_AVAILABLE;
    if packet.has_flags(PacketFlag::RECURSION_DESIRED) {
        set |= PacketFlag::RECURSION_DESIRED;
    }
    reply.set_flags(set);
    *reply.opcode_mut() = OPCODE::StandardQuery;
    reply.questions.push(question.clone());
    match outcome {
        Outcome::Answer(Some(ip)) => reply.answers.push(ResourceRecord::new(
            question.qname.clone(),
            CLASS::IN,
            TTL_SECS,
            RData::A(A::from(ip)),
        )),
        Outcome::Answer(None) => {}
        Outcome::Error(rcode) => *reply.rcode_mut() = rcode,
    }
    match reply.build_bytes_vec_compressed() {
        Ok(bytes) => Some(bytes),
        Err(_) => bare(RCODE::ServerFailure),
    }
}

/// What the one question of a well-formed query gets.
fn resolve(question: &Question<'_>, names: &mut SyntheticNames, now: Instant) -> Outcome {
    let labels = question.qname.get_labels();
    let len = labels
        .iter()
        .map(|l| l.len() + 1)
        .sum::<usize>()
        .saturating_sub(1);
    if len > MAX_NAME_LEN {
        return Outcome::Error(RCODE::FormatError);
    }
    if matches!(question.qtype, QTYPE::ANY | QTYPE::TYPE(TYPE::PTR)) {
        return Outcome::Error(RCODE::Refused);
    }
    if question.qclass != QCLASS::CLASS(CLASS::IN) {
        return Outcome::Error(RCODE::Refused);
    }
    let host_byte = |b: &u8| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_';
    if labels.is_empty() || !labels.iter().all(|l| l.as_ref().iter().all(host_byte)) {
        return Outcome::Error(RCODE::NameError);
    }
    if question.qtype != QTYPE::TYPE(TYPE::A) {
        return Outcome::Answer(None);
    }
    let mut name = String::with_capacity(len);
    for (i, label) in labels.iter().enumerate() {
        if i > 0 {
            name.push('.');
        }
        name.extend(
            label
                .as_ref()
                .iter()
                .map(|b| char::from(b.to_ascii_lowercase())),
        );
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return Outcome::Answer(Some(Ipv4Addr::LOCALHOST));
    }
    match names.address_for(&name, now) {
        Some(ip) => Outcome::Answer(Some(ip)),
        None => Outcome::Error(RCODE::ServerFailure),
    }
}

/// A response of only a header: the query's id and opcode, `QR` and `RA` set, `RD`
/// copied, `rcode`, no records.
fn bare_response(header: &[u8], rcode: RCODE) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    out[..2].copy_from_slice(&header[..2]);
    // QR, the opcode, RD.
    out[2] = 0x80 | (header[2] & 0x79);
    // RA, the code (all codes used fit in four bits).
    out[3] = 0x80 | (rcode as u8 & 0x0f);
    out
}

/// The stub's sockets, bound ahead of everything else (see the module documentation).
#[derive(Debug)]
pub struct DnsListener {
    udp: UdpSocket,
    tcp: TcpListener,
}

impl DnsListener {
    /// Binds UDP and TCP `127.0.0.1:port` (0: a port the kernel picks for UDP, then the
    /// same port for TCP): non-blocking, close-on-exec, with neither `SO_REUSEADDR` nor
    /// `SO_REUSEPORT`.
    pub fn bind(port: u16) -> io::Result<Self> {
        let udp = UdpSocket::from(sys::bind_udp(Ipv4Addr::LOCALHOST, port)?);
        let port = udp.local_addr()?.port();
        let tcp = TcpListener::from(sys::listen_tcp(Ipv4Addr::LOCALHOST, port)?);
        Ok(Self { udp, tcp })
    }

    /// The port both sockets are bound to.
    pub fn port(&self) -> io::Result<u16> {
        Ok(self.udp.local_addr()?.port())
    }
}

/// One TCP client of the stub.
#[derive(Debug)]
struct TcpConn {
    stream: TcpStream,
    /// What it sent that is not answered yet.
    inbox: Vec<u8>,
    /// Answers, with their length prefixes, not written yet.
    outbox: VecDeque<u8>,
    /// It ended its side: close once the outbox is written.
    eof: bool,
    /// When it last sent a complete query (or connected).
    last_query: Instant,
    done: bool,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Udp,
    Listener,
    Conn(usize),
}

/// The DNS stub (see the module documentation).
#[derive(Debug)]
pub struct DnsStub {
    udp: UdpSocket,
    tcp: TcpListener,
    conns: Vec<TcpConn>,
    /// What each descriptor handed out by the last [`DnsStub::prepare`] belongs to.
    slots: Vec<Slot>,
    accept_paused_until: Option<Instant>,
    accept_failure_logged: bool,
    scratch: Vec<u8>,
}

impl DnsStub {
    /// The stub on `listener`'s sockets.
    pub fn new(listener: DnsListener) -> Self {
        Self {
            udp: listener.udp,
            tcp: listener.tcp,
            conns: Vec::new(),
            slots: Vec::new(),
            accept_paused_until: None,
            accept_failure_logged: false,
            scratch: vec![0u8; MAX_DATAGRAM],
        }
    }

    /// Closes what timed out at `now`, then appends the descriptors to watch to `fds`
    /// and returns the longest the caller may sleep (`None`: no limit).
    pub fn prepare(&mut self, now: Instant, fds: &mut Vec<libc::pollfd>) -> Option<Duration> {
        self.slots.clear();
        self.conns
            .retain(|c| !c.done && now.saturating_duration_since(c.last_query) < TCP_IDLE);
        let mut next: Option<Instant> = None;
        let mut watch = |fd: i32, events: libc::c_short, slot: Slot| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            self.slots.push(slot);
        };
        watch(self.udp.as_raw_fd(), libc::POLLIN, Slot::Udp);
        match self.accept_paused_until {
            Some(until) if until > now => next = Some(until),
            _ => {
                self.accept_paused_until = None;
                watch(self.tcp.as_raw_fd(), libc::POLLIN, Slot::Listener);
            }
        }
        for (i, conn) in self.conns.iter().enumerate() {
            let mut events = 0;
            if !conn.eof && conn.outbox.len() < MAX_TCP_OUTBOX {
                events |= libc::POLLIN;
            }
            if !conn.outbox.is_empty() {
                events |= libc::POLLOUT;
            }
            watch(conn.stream.as_raw_fd(), events, Slot::Conn(i));
            let at = conn.last_query + TCP_IDLE;
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        next.map(|at| at.saturating_duration_since(now))
    }

    /// Handles the events of the descriptors from the last [`DnsStub::prepare`], in the
    /// same order; `A` answers use `names` at `now`.
    pub fn dispatch(&mut self, now: Instant, fds: &[libc::pollfd], names: &mut SyntheticNames) {
        let slots = std::mem::take(&mut self.slots);
        let mut accept = false;
        for (slot, pfd) in slots.iter().zip(fds) {
            if pfd.revents == 0 {
                continue;
            }
            match *slot {
                Slot::Udp => self.serve_udp(now, names),
                Slot::Listener => accept = true,
                Slot::Conn(i) => {
                    if let Some(conn) = self.conns.get_mut(i) {
                        conn.step(now, names, &mut self.scratch);
                    }
                }
            }
        }
        self.conns.retain(|c| !c.done);
        if accept {
            self.accept(now);
        }
        self.slots = slots;
        self.slots.clear();
    }

    /// Answers the datagrams waiting; an answer the socket cannot take now is dropped.
    fn serve_udp(&mut self, now: Instant, names: &mut SyntheticNames) {
        for _ in 0..PER_WAKE {
            let (n, peer) = match self.udp.recv_from(&mut self.scratch) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock, or an ICMP error of an earlier answer.
                Err(_) => return,
            };
            if let Some(response) = answer(&self.scratch[..n], names, now) {
                let _ = self.udp.send_to(&response, peer);
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        for _ in 0..PER_WAKE {
            match self.tcp.accept() {
                Ok((stream, _)) => {
                    self.accept_failure_logged = false;
                    if self.conns.len() >= MAX_TCP_CONNS || stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    self.conns.push(TcpConn {
                        stream,
                        inbox: Vec::new(),
                        outbox: VecDeque::new(),
                        eof: false,
                        last_query: now,
                        done: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    if !self.accept_failure_logged {
                        log(format_args!(
                            "dns: accepting a TCP client failed: {e}; pausing briefly"
                        ));
                        self.accept_failure_logged = true;
                    }
                    self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }
}

impl TcpConn {
    /// Reads what is there, answers every complete query, writes what it can.
    fn step(&mut self, now: Instant, names: &mut SyntheticNames, scratch: &mut [u8]) {
        while !self.eof && self.outbox.len() < MAX_TCP_OUTBOX {
            // Never more than one whole message (and the next prefix) buffered.
            let room = (2 + MAX_TCP_MESSAGE + 2)
                .saturating_sub(self.inbox.len())
                .min(scratch.len());
            if room == 0 {
                break;
            }
            match self.stream.read(&mut scratch[..room]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.inbox.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.done = true;
                    return;
                }
            }
            while let Some(&[hi, lo]) = self.inbox.first_chunk::<2>() {
                let len = usize::from(u16::from_be_bytes([hi, lo]));
                if len > MAX_TCP_MESSAGE {
                    self.done = true;
                    return;
                }
                if self.inbox.len() < 2 + len {
                    break;
                }
                if let Some(response) = answer(&self.inbox[2..2 + len], names, now) {
                    // An answer always fits in 64 KiB; a longer one would be dropped.
                    if let Ok(prefix) = u16::try_from(response.len()) {
                        self.outbox.extend(prefix.to_be_bytes());
                        self.outbox.extend(response);
                    }
                }
                self.inbox.drain(..2 + len);
                self.last_query = now;
            }
        }
        while !self.outbox.is_empty() {
            let (front, _) = self.outbox.as_slices();
            match self.stream.write(front) {
                Ok(0) => {
                    self.done = true;
                    return;
                }
                Ok(n) => {
                    self.outbox.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.done = true;
                    return;
                }
            }
        }
        if self.eof && self.outbox.is_empty() {
            self.done = true;
        }
    }
}

#[cfg(test)]
#[path = "dns_tests.rs"]
mod tests;
