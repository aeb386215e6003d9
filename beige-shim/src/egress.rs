//! PID 1's explicit egress proxy (design: `spec/egress.md` §3–§4; frames:
//! [`beige_protocol::link`]).
//!
//! [`Egress`] owns the proxy's listener on `127.0.0.1:3128`
//! ([`beige_protocol::link::EGRESS_PROXY_PORT`], what `HTTPS_PROXY` points at), every
//! client connection accepted on it and, per client, one connection to the gateway's
//! control socket that carries that client's bytes. The
//! listener is made by [`ProxyListener::bind`], which [`crate::init`] calls before the
//! link is dialled and before any child runs, so no agent process can take the port
//! first. Like [`crate::link::Link`], it owns no thread and never blocks: every socket
//! is non-blocking, every write partial-aware, and the `poll(2)` loop asks it which
//! descriptors to watch ([`Egress::prepare`]) and hands it what became ready
//! ([`Egress::dispatch`]).
//!
//! A client connection (a *stream*; at most [`MAX_STREAMS`] open, further clients get a
//! `503` with `X-Beige-Egress: denied; reason=too_many_streams`) goes through:
//!
//! 1. *head*: its bytes are read until the end of the request head (`\r\n\r\n`), at most
//!    [`MAX_EGRESS_HEAD`] within [`HEAD_TIMEOUT`] (else `400` or `408`). Only the request
//!    line is parsed (`httparse`): `CONNECT host:port` or an absolute-form
//!    `METHOD http://host[:port]/…` (port 80 by default) gives the name (IPv6 brackets
//!    removed, nothing else interpreted: the gateway decides) and the port; anything
//!    else gets a `400`;
//! 2. *hello*: PID 1 dials the control socket and waits up to [`HELLO_TIMEOUT`] for the
//!    gateway's `GatewayHello`; a `Refused` frame, anything else, the end of the
//!    connection or no answer in time gets the client a `502` with `X-Beige-Egress:
//!    upstream-error; reason=gateway_unreachable`. It then sends `ShimHello` (role
//!    `egress`, the control link's boot id) and `EgressOpen` (entry `explicit`, name,
//!    port) with every byte read from the client so far as its payload;
//! 3. *relay*: raw bytes both ways, never parsed (the gateway answers the client's
//!    request itself). The one exception is the gateway's first bytes: a stream it does
//!    not take (a stale boot id, no control link up) gets a `Refused` frame after the
//!    stream's hello, so bytes that start with the link's magic are held back and,
//!    once a whole frame, answered with the same `502` (an answer to the client, an
//!    HTTP response, never starts with the magic). The relay goes through a buffer of
//!    [`RELAY_BUFFER`] per direction with
//!    backpressure (a side whose buffer is full is not read). When one side has ended
//!    and its bytes are delivered, the other side's write half is shut down; the stream
//!    closes when both directions are done, on an error, or after [`IDLE_TIMEOUT`]
//!    without a byte either way. A gateway that ends the stream without sending a byte
//!    gets the client a `502` too;
//! 4. *answer* (for every response PID 1 gives itself): the response is written, the
//!    client's write half shut down, and what the client still sends is read and dropped
//!    until it closes (at most [`ANSWER_TIMEOUT`]), so closing never resets the
//!    connection before the client has read the response.
//!
//! Two more ways in share the streams and their limit:
//!
//! - *transparent listeners* ([`TransparentListener`], [`Egress::with_transparent`]) on
//!   `0.0.0.0:PORT` (80 and 443 in production): the local address a client dialled
//!   (`getsockname`) is a synthetic one that the DNS stub ([`crate::dns`],
//!   [`Egress::with_dns`]) handed out for a name, and the stream goes to the gateway at
//!   once, without waiting for a byte, as `EgressOpen` (entry `transparent`, that name,
//!   the local port) with whatever the client had sent as its payload. A client of any
//!   other address, one beyond [`MAX_STREAMS`], or one whose stream the gateway does
//!   not take is closed: PID 1 never answers a transparent client itself;
//! - the proxy maps a synthetic address in a request line (`CONNECT 127.77.0.5:443`,
//!   from a client that resolved first) back to its name; an address without one goes
//!   as it is.
//!
//! Without a usable link ([`Upstream::Unavailable`], e.g. on the attach carrier, which
//! does not carry egress yet) every well-formed request gets a `503` saying why.
//!
//! Every descriptor here is close-on-exec, and op children close every descriptor of
//! PID 1 above 2 right after the fork (`sys::fork_agent_child`), so no agent process
//! holds the listener or a stream. Only summaries are logged, never what a client sent
//! or where it wanted to go.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use beige_protocol::link::{
    self as wire, Carrier, EgressEntry, FrameError, LinkMessage, Role, EGRESS_HEAD_TIMEOUT_SECS,
    MAGIC, MAX_EGRESS_HEAD, PREFIX_LEN,
};

use crate::dns::{DnsListener, DnsStub, SyntheticNames};
use crate::link::log;
use crate::sys;

/// Streams open at once; further clients are answered `503` (`too_many_streams`).
pub const MAX_STREAMS: usize = 256;
/// Bytes buffered per direction of a stream; a side is not read while its buffer is
/// full.
pub const RELAY_BUFFER: usize = 256 * 1024;
/// How long a client has to send its complete request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(EGRESS_HEAD_TIMEOUT_SECS);
/// How long the gateway has to say hello on a new stream's connection.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// A relayed stream without a byte either way for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a response PID 1 gives itself may take to deliver before the connection is
/// closed anyway.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before dialling again when the control socket's backlog is full.
const DIAL_RETRY: Duration = Duration::from_millis(50);
/// Pause before accepting again after `accept` failed (e.g. out of descriptors), so a
/// listener that stays readable does not make the loop spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Connections accepted per wake-up.
const ACCEPTS_PER_WAKE: usize = 64;
/// Clients beyond [`MAX_STREAMS`] being answered `503` at once; more are closed at once.
const MAX_REFUSING: usize = 32;
/// Bytes read from the gateway before its hello must be complete.
const MAX_HELLO_BYTES: usize = 128 * 1024;
/// Bytes moved per read.
const CHUNK: usize = 64 * 1024;
/// Reads of a client that only gets dropped bytes, per wake-up.
const DISCARDS_PER_WAKE: usize = 16;

/// The one-line body of the `400` for a request line the proxy does not take.
pub const BAD_REQUEST_BODY: &str =
    "beige: the egress proxy takes CONNECT or absolute-form http:// requests";
/// The one-line body of the `503` on the attach carrier.
pub const ATTACH_UNSUPPORTED_BODY: &str = "beige: egress over the attach link is not supported yet";

/// The bounds of an [`Egress`] (the constants above; smaller in tests).
#[derive(Debug, Clone, Copy)]
struct Limits {
    streams: usize,
    head: Duration,
    hello: Duration,
    idle: Duration,
    answer: Duration,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        streams: MAX_STREAMS,
        head: HEAD_TIMEOUT,
        hello: HELLO_TIMEOUT,
        idle: IDLE_TIMEOUT,
        answer: ANSWER_TIMEOUT,
    };
}

/// The proxy's listening socket, bound ahead of everything else (see the module
/// documentation).
#[derive(Debug)]
pub struct ProxyListener {
    listener: TcpListener,
}

impl ProxyListener {
    /// Listens on `127.0.0.1:port` (0: a port the kernel picks): non-blocking,
    /// close-on-exec, with neither `SO_REUSEADDR` nor `SO_REUSEPORT`.
    pub fn bind(port: u16) -> io::Result<Self> {
        let fd = sys::listen_tcp_loopback(port)?;
        Ok(Self {
            listener: TcpListener::from(fd),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> io::Result<u16> {
        Ok(self.listener.local_addr()?.port())
    }
}

/// A transparent listener's socket, on `0.0.0.0:port`, bound ahead of everything else
/// like the proxy's.
#[derive(Debug)]
pub struct TransparentListener {
    listener: TcpListener,
}

impl TransparentListener {
    /// Listens on `0.0.0.0:port` (0: a port the kernel picks): non-blocking,
    /// close-on-exec, with neither `SO_REUSEADDR` nor `SO_REUSEPORT`.
    pub fn bind(port: u16) -> io::Result<Self> {
        let fd = sys::listen_tcp(Ipv4Addr::UNSPECIFIED, port)?;
        Ok(Self {
            listener: TcpListener::from(fd),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> io::Result<u16> {
        Ok(self.listener.local_addr()?.port())
    }
}

/// Where the proxy sends its streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// Dial this control socket once per stream and present `boot_id`, the boot id of
    /// PID 1's control connection.
    Unix { socket: PathBuf, boot_id: String },
    /// No way to the gateway: every well-formed request gets a `503` with this one-line
    /// body.
    Unavailable(String),
}

/// PID 1's explicit egress proxy (see the module documentation).
#[derive(Debug)]
pub struct Egress {
    listener: TcpListener,
    /// The transparent listeners.
    transparent: Vec<TcpListener>,
    /// The DNS stub, which hands out the synthetic addresses.
    dns: Option<DnsStub>,
    /// The synthetic addresses and their names (see [`crate::dns`]).
    names: SyntheticNames,
    upstream: Upstream,
    limits: Limits,
    streams: Vec<Stream>,
    /// What each descriptor handed out by the last [`Egress::prepare`] belongs to.
    slots: Vec<Slot>,
    /// `accept` failed; the listener is not watched until then.
    accept_paused_until: Option<Instant>,
    /// An `accept` failure was logged and none succeeded since.
    accept_failure_logged: bool,
    /// Clients are being refused for [`MAX_STREAMS`] (logged once per episode).
    saturated: bool,
    scratch: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    /// The proxy's listener (0) or a transparent one (1 on).
    Listener(usize),
    Client(usize),
    Gateway(usize),
}

impl Egress {
    /// The proxy on `listener`, sending its streams to `upstream`.
    pub fn new(listener: ProxyListener, upstream: Upstream) -> Self {
        Self::with_limits(listener, upstream, Limits::DEFAULT)
    }

    fn with_limits(listener: ProxyListener, upstream: Upstream, limits: Limits) -> Self {
        Self {
            listener: listener.listener,
            transparent: Vec::new(),
            dns: None,
            names: SyntheticNames::new(),
            upstream,
            limits,
            streams: Vec::new(),
            slots: Vec::new(),
            accept_paused_until: None,
            accept_failure_logged: false,
            saturated: false,
            scratch: vec![0u8; CHUNK],
        }
    }

    /// Also takes the connections of `listener`: a client that dialled a synthetic
    /// address is relayed to the gateway as a transparent stream for the address's
    /// name, with what it sent so far; any other client is closed at once.
    pub fn with_transparent(mut self, listener: TransparentListener) -> Self {
        self.transparent.push(listener.listener);
        self
    }

    /// Also runs the DNS stub on `listener`, whose synthetic addresses the transparent
    /// listeners and the proxy map back to names.
    pub fn with_dns(mut self, listener: DnsListener) -> Self {
        self.dns = Some(DnsStub::new(listener));
        self
    }

    /// Handles what is due at `now` (timeouts, dialling again), then appends the
    /// descriptors to watch to `fds` and returns the longest the caller may sleep
    /// (`None`: no limit).
    pub fn prepare(&mut self, now: Instant, fds: &mut Vec<libc::pollfd>) -> Option<Duration> {
        self.slots.clear();
        for stream in &mut self.streams {
            stream.on_time(now, &self.upstream, &self.limits);
        }
        self.streams.retain(|s| !s.is_done());
        if self.saturated && self.open_streams() < self.limits.streams {
            self.saturated = false;
        }

        let mut next: Option<Instant> = None;
        let mut earliest = |at: Instant| next = Some(next.map_or(at, |n| n.min(at)));
        let mut watch = |fd: i32, events: libc::c_short, slot: Slot| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            self.slots.push(slot);
        };
        match self.accept_paused_until {
            Some(until) if until > now => earliest(until),
            _ => {
                self.accept_paused_until = None;
                watch(self.listener.as_raw_fd(), libc::POLLIN, Slot::Listener(0));
                for (i, listener) in self.transparent.iter().enumerate() {
                    watch(listener.as_raw_fd(), libc::POLLIN, Slot::Listener(i + 1));
                }
            }
        }
        for (i, stream) in self.streams.iter().enumerate() {
            let (client, gateway) = stream.interest();
            if client != 0 {
                watch(stream.client.as_raw_fd(), client, Slot::Client(i));
            }
            if let Some(conn) = stream.gateway.as_ref().filter(|_| gateway != 0) {
                watch(conn.as_raw_fd(), gateway, Slot::Gateway(i));
            }
            if let Some(at) = stream.deadline(&self.limits) {
                earliest(at);
            }
        }
        let mut sleep = next.map(|at| at.saturating_duration_since(now));
        // The stub's descriptors follow the proxy's (`dispatch` splits them there).
        if let Some(t) = self.dns.as_mut().and_then(|dns| dns.prepare(now, fds)) {
            sleep = Some(sleep.map_or(t, |s| s.min(t)));
        }
        sleep
    }

    /// Handles the events of the descriptors from the last [`Egress::prepare`], in the
    /// same order.
    pub fn dispatch(&mut self, fds: &[libc::pollfd]) {
        let slots = std::mem::take(&mut self.slots);
        let now = Instant::now();
        let mut accept = Vec::new();
        let mut last = None;
        if let Some(dns) = self.dns.as_mut() {
            dns.dispatch(now, fds.get(slots.len()..).unwrap_or(&[]), &mut self.names);
        }
        for (slot, pfd) in slots.iter().zip(fds) {
            if pfd.revents == 0 {
                continue;
            }
            let i = match *slot {
                Slot::Listener(which) => {
                    accept.push(which);
                    continue;
                }
                Slot::Client(i) | Slot::Gateway(i) => i,
            };
            // A stream's two descriptors are adjacent: step it once.
            if last == Some(i) {
                continue;
            }
            last = Some(i);
            if let Some(stream) = self.streams.get_mut(i) {
                stream.step(
                    now,
                    &self.upstream,
                    &self.limits,
                    &mut self.names,
                    &mut self.scratch,
                );
            }
        }
        self.streams.retain(|s| !s.is_done());
        for which in accept {
            self.accept(now, which);
        }
        self.slots = slots;
        self.slots.clear();
    }

    /// Streams that count against [`MAX_STREAMS`] (not those being refused for it).
    fn open_streams(&self) -> usize {
        self.streams.iter().filter(|s| !s.refusal).count()
    }

    /// Accepts what listener `which` (0: the proxy's, 1 on: transparent ones) has.
    fn accept(&mut self, now: Instant, which: usize) {
        for _ in 0..ACCEPTS_PER_WAKE {
            let listener = match which.checked_sub(1) {
                None => &self.listener,
                Some(i) => match self.transparent.get(i) {
                    Some(listener) => listener,
                    None => return,
                },
            };
            match listener.accept() {
                Ok((client, _)) => {
                    self.accept_failure_logged = false;
                    if which == 0 {
                        self.admit(client, now);
                    } else {
                        self.admit_transparent(client, now);
                    }
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
                            "egress: accepting a client failed: {e}; pausing the proxy \
                             briefly"
                        ));
                        self.accept_failure_logged = true;
                    }
                    self.accept_paused_until = Some(now + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    /// Takes a new client in, or refuses it when [`MAX_STREAMS`] are open.
    fn admit(&mut self, client: TcpStream, now: Instant) {
        if client.set_nonblocking(true).is_err() {
            return;
        }
        let open = self.open_streams();
        if open < self.limits.streams {
            self.streams.push(Stream::new(client, now, &self.limits));
            return;
        }
        if !self.saturated {
            log(format_args!(
                "egress: {open} streams are open; refusing new clients until some close"
            ));
            self.saturated = true;
        }
        if self.streams.len() - open >= MAX_REFUSING {
            return;
        }
        let mut stream = Stream::new(client, now, &self.limits);
        stream.refusal = true;
        let body = format!(
            "beige: too many egress connections are open in this sandbox (at most {})",
            self.limits.streams
        );
        stream.answer(
            now,
            &self.limits,
            response(
                "503 Service Unavailable",
                "denied; reason=too_many_streams",
                &body,
            ),
        );
        stream.step(
            now,
            &self.upstream,
            &self.limits,
            &mut self.names,
            &mut self.scratch,
        );
        if !stream.is_done() {
            self.streams.push(stream);
        }
    }

    /// Takes a client of a transparent listener in: when the local address it dialled
    /// is a synthetic one with a name, dials the gateway for that name and the local
    /// port at once, with whatever the client sent so far; otherwise (or when
    /// [`MAX_STREAMS`] are open) closes it.
    fn admit_transparent(&mut self, client: TcpStream, now: Instant) {
        let target = match client.local_addr() {
            Ok(SocketAddr::V4(local)) => self.names.name_for(*local.ip(), now).map(|name| Target {
                name,
                port: local.port(),
            }),
            _ => None,
        };
        let Some(target) = target else {
            return;
        };
        if client.set_nonblocking(true).is_err() {
            return;
        }
        let open = self.open_streams();
        if open >= self.limits.streams {
            if !self.saturated {
                log(format_args!(
                    "egress: {open} streams are open; refusing new clients until some close"
                ));
                self.saturated = true;
            }
            return;
        }
        let mut stream = Stream::new(client, now, &self.limits);
        stream.entry = EgressEntry::Transparent;
        match fill(
            &mut stream.client,
            &mut stream.up,
            MAX_EGRESS_HEAD,
            &mut self.scratch,
        ) {
            Ok((_, eof)) => stream.client_eof = eof,
            Err(_) => return,
        }
        stream.on_target(now, target, &self.upstream, &self.limits);
        if !stream.is_done() {
            self.streams.push(stream);
        }
    }
}

/// Where a stream is (see the module documentation).
#[derive(Debug)]
enum Phase {
    /// Reading the client's request head.
    Head { deadline: Instant },
    /// Dialling the gateway and waiting for its hello.
    Hello {
        deadline: Instant,
        /// When to dial again (the socket's backlog was full); `None` once connected.
        retry_at: Option<Instant>,
        /// What the gateway sent so far.
        inbox: Vec<u8>,
        name: String,
        port: u16,
    },
    /// Relaying raw bytes.
    Relay,
    /// Delivering a response of PID 1's own, then waiting for the client to close.
    Answer { deadline: Instant },
    /// Finished: to be dropped, which closes its sockets.
    Done,
}

/// One client and, once dialled, its connection to the gateway.
#[derive(Debug)]
struct Stream {
    /// How the client came in: through the proxy (`Explicit`), or a transparent
    /// listener, where PID 1 never answers itself but closes.
    entry: EgressEntry,
    client: TcpStream,
    gateway: Option<UnixStream>,
    phase: Phase,
    /// Client → gateway: the request head while it is read, then the hello frames with
    /// it, then the client's bytes.
    up: VecDeque<u8>,
    /// Gateway → client (or PID 1's own response).
    down: VecDeque<u8>,
    client_eof: bool,
    gateway_eof: bool,
    /// The gateway connection's write half is shut down.
    gateway_shut: bool,
    /// The client's write half is shut down.
    client_shut: bool,
    /// Relaying, but the gateway has sent nothing yet that rules out a link frame (its
    /// `Refused` after the stream's hello): what it sent is held back until then.
    sniffing: bool,
    /// When a byte last moved.
    last_active: Instant,
    /// Being refused for [`MAX_STREAMS`]; does not count against it.
    refusal: bool,
}

impl Stream {
    fn new(client: TcpStream, now: Instant, limits: &Limits) -> Self {
        Self {
            entry: EgressEntry::Explicit,
            client,
            gateway: None,
            phase: Phase::Head {
                deadline: now + limits.head,
            },
            up: VecDeque::new(),
            down: VecDeque::new(),
            client_eof: false,
            gateway_eof: false,
            gateway_shut: false,
            client_shut: false,
            sniffing: false,
            last_active: now,
            refusal: false,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The poll events wanted on the client and on the gateway connection.
    fn interest(&self) -> (libc::c_short, libc::c_short) {
        match self.phase {
            Phase::Head { .. } => (libc::POLLIN, 0),
            Phase::Hello { .. } => (0, libc::POLLIN),
            Phase::Relay => {
                let (mut client, mut gateway) = (0, 0);
                if !self.client_eof && self.up.len() < RELAY_BUFFER {
                    client |= libc::POLLIN;
                }
                if !self.client_shut && !self.sniffing && !self.down.is_empty() {
                    client |= libc::POLLOUT;
                }
                if !self.gateway_eof && self.down.len() < RELAY_BUFFER {
                    gateway |= libc::POLLIN;
                }
                if !self.gateway_shut && !self.up.is_empty() {
                    gateway |= libc::POLLOUT;
                }
                (client, gateway)
            }
            Phase::Answer { .. } if self.down.is_empty() => (libc::POLLIN, 0),
            Phase::Answer { .. } => (libc::POLLOUT, 0),
            Phase::Done => (0, 0),
        }
    }

    /// When something is due without any event.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        match &self.phase {
            Phase::Head { deadline } | Phase::Answer { deadline } => Some(*deadline),
            Phase::Hello {
                deadline, retry_at, ..
            } => Some(retry_at.map_or(*deadline, |r| r.min(*deadline))),
            Phase::Relay => Some(self.last_active + limits.idle),
            Phase::Done => None,
        }
    }

    /// Handles the timeouts and retries due at `now`.
    fn on_time(&mut self, now: Instant, upstream: &Upstream, limits: &Limits) {
        match &self.phase {
            Phase::Head { deadline } if now >= *deadline => {
                let body = format!(
                    "beige: no complete request head arrived within {} s",
                    limits.head.as_secs()
                );
                self.answer(
                    now,
                    limits,
                    response("408 Request Timeout", "denied; reason=bad_request", &body),
                );
            }
            Phase::Hello { deadline, .. } if now >= *deadline => {
                log(format_args!(
                    "egress: the gateway did not say hello on a stream within {} s",
                    limits.hello.as_secs()
                ));
                self.answer(now, limits, gateway_unreachable());
            }
            Phase::Hello {
                retry_at: Some(at), ..
            } if now >= *at => {
                if let Upstream::Unix { socket, .. } = upstream {
                    self.dial(now, socket, limits);
                }
            }
            Phase::Relay if now >= self.last_active + limits.idle => {
                self.phase = Phase::Done;
            }
            Phase::Answer { deadline } if now >= *deadline => self.phase = Phase::Done,
            _ => {}
        }
    }

    /// Makes what progress its sockets allow.
    fn step(
        &mut self,
        now: Instant,
        upstream: &Upstream,
        limits: &Limits,
        names: &mut SyntheticNames,
        scratch: &mut [u8],
    ) {
        match self.phase {
            Phase::Head { .. } => self.read_head(now, upstream, limits, names, scratch),
            Phase::Hello { .. } => self.read_hello(now, upstream, limits, scratch),
            Phase::Relay => self.relay(now, limits, scratch),
            Phase::Answer { .. } => self.deliver_answer(scratch),
            Phase::Done => {}
        }
    }

    /// Replaces whatever the stream was doing with delivering `response` (a
    /// transparent stream is closed instead: its client may not speak HTTP).
    fn answer(&mut self, now: Instant, limits: &Limits, response: Vec<u8>) {
        self.gateway = None;
        if self.entry == EgressEntry::Transparent {
            self.phase = Phase::Done;
            return;
        }
        self.up = VecDeque::new();
        self.down = VecDeque::from(response);
        self.phase = Phase::Answer {
            deadline: now + limits.answer,
        };
    }

    fn read_head(
        &mut self,
        now: Instant,
        upstream: &Upstream,
        limits: &Limits,
        names: &mut SyntheticNames,
        scratch: &mut [u8],
    ) {
        let Ok((n, eof)) = fill(&mut self.client, &mut self.up, MAX_EGRESS_HEAD, scratch) else {
            self.phase = Phase::Done;
            return;
        };
        if n > 0 {
            self.last_active = now;
        }
        let buf = self.up.make_contiguous();
        if let Some(end) = head_end(buf) {
            match parse_request_line(&buf[..end]) {
                Some(mut target) => {
                    // A client that resolved first names the synthetic address; an
                    // address without a name goes as it is (the gateway refuses IP
                    // literals).
                    if let Some(name) = target
                        .name
                        .parse::<Ipv4Addr>()
                        .ok()
                        .and_then(|ip| names.name_for(ip, now))
                    {
                        target.name = name;
                    }
                    self.on_target(now, target, upstream, limits);
                }
                None => self.answer(
                    now,
                    limits,
                    response(
                        "400 Bad Request",
                        "denied; reason=bad_request",
                        BAD_REQUEST_BODY,
                    ),
                ),
            }
        } else if eof {
            if self.up.is_empty() {
                self.phase = Phase::Done;
            } else {
                self.answer(
                    now,
                    limits,
                    response(
                        "400 Bad Request",
                        "denied; reason=bad_request",
                        "beige: the connection ended before a complete request head",
                    ),
                );
            }
        } else if self.up.len() >= MAX_EGRESS_HEAD {
            let body = format!("beige: the request head exceeds {MAX_EGRESS_HEAD} bytes");
            self.answer(
                now,
                limits,
                response("400 Bad Request", "denied; reason=bad_request", &body),
            );
        }
    }

    /// The request head named a target: open a stream to the gateway for it.
    fn on_target(&mut self, now: Instant, target: Target, upstream: &Upstream, limits: &Limits) {
        match upstream {
            Upstream::Unavailable(body) => self.answer(
                now,
                limits,
                response(
                    "503 Service Unavailable",
                    "upstream-error; reason=gateway_unreachable",
                    body,
                ),
            ),
            Upstream::Unix { socket, .. } => {
                self.phase = Phase::Hello {
                    deadline: now + limits.hello,
                    retry_at: None,
                    inbox: Vec::new(),
                    name: target.name,
                    port: target.port,
                };
                self.dial(now, socket, limits);
            }
        }
    }

    /// Dials the control socket (in the hello phase).
    fn dial(&mut self, now: Instant, socket: &Path, limits: &Limits) {
        match sys::connect_unix(socket) {
            Ok(fd) => {
                self.gateway = Some(UnixStream::from(fd));
                if let Phase::Hello { retry_at, .. } = &mut self.phase {
                    *retry_at = None;
                }
            }
            // The backlog is full: the gateway is busy, not gone.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                if let Phase::Hello { retry_at, .. } = &mut self.phase {
                    *retry_at = Some(now + DIAL_RETRY);
                }
            }
            Err(e) => {
                log(format_args!("egress: cannot reach the gateway: {e}"));
                self.answer(now, limits, gateway_unreachable());
            }
        }
    }

    /// Reads the gateway's hello; answers it and starts relaying once it is there.
    fn read_hello(
        &mut self,
        now: Instant,
        upstream: &Upstream,
        limits: &Limits,
        scratch: &mut [u8],
    ) {
        let Upstream::Unix { boot_id, .. } = upstream else {
            return;
        };
        let (Some(gateway), Phase::Hello { inbox, .. }) = (self.gateway.as_mut(), &mut self.phase)
        else {
            return;
        };
        let mut ended = None;
        while inbox.len() < MAX_HELLO_BYTES {
            let room = (MAX_HELLO_BYTES - inbox.len()).min(scratch.len());
            match gateway.read(&mut scratch[..room]) {
                Ok(0) => {
                    ended = Some("the gateway closed a stream before its hello".to_string());
                    break;
                }
                Ok(n) => inbox.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    ended = Some(format!("reading a stream's hello failed: {e}"));
                    break;
                }
            }
        }
        let failure = match next_frame(inbox) {
            Ok(Some(LinkMessage::GatewayHello { .. })) => {
                let rest = std::mem::take(inbox);
                self.start_relay(now, boot_id, rest, limits, scratch);
                return;
            }
            Ok(Some(LinkMessage::Refused { reason })) => {
                format!("the gateway refused a stream: {reason}")
            }
            Ok(Some(_)) => "the gateway sent something else than its hello".to_string(),
            Err(e) => format!("bad frame instead of the gateway's hello: {e}"),
            Ok(None) if inbox.len() >= MAX_HELLO_BYTES => {
                "the gateway's hello is too large".to_string()
            }
            Ok(None) => match ended {
                Some(why) => why,
                None => return,
            },
        };
        log(format_args!("egress: {failure}"));
        self.answer(now, limits, gateway_unreachable());
    }

    /// Sends the stream's hello and `EgressOpen` with what the client sent so far, and
    /// relays from then on. `rest` is what the gateway sent after its hello.
    fn start_relay(
        &mut self,
        now: Instant,
        boot_id: &str,
        rest: Vec<u8>,
        limits: &Limits,
        scratch: &mut [u8],
    ) {
        let Phase::Hello { name, port, .. } = std::mem::replace(&mut self.phase, Phase::Relay)
        else {
            return;
        };
        let hello = LinkMessage::ShimHello {
            role: Role::Egress,
            boot_id: boot_id.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            carrier: Carrier::Unix,
            pending: Vec::new(),
        };
        let open = LinkMessage::EgressOpen {
            entry: self.entry,
            name: Some(name),
            port,
        };
        let payload: Vec<u8> = self.up.drain(..).collect();
        self.up.extend(&wire::encode(&hello, b""));
        self.up.extend(&wire::encode(&open, &payload));
        self.down.extend(&rest);
        self.sniffing = true;
        self.last_active = now;
        self.relay(now, limits, scratch);
    }

    fn relay(&mut self, now: Instant, limits: &Limits, scratch: &mut [u8]) {
        match self.relay_once(scratch) {
            Ok(true) => self.last_active = now,
            Ok(false) => {}
            Err(_) => {
                self.phase = Phase::Done;
                return;
            }
        }
        if self.sniffing {
            match sniff(self.down.make_contiguous()) {
                Sniff::Raw => {
                    self.sniffing = false;
                    // What was held back goes out now.
                    if self.relay_once(scratch).is_err() {
                        self.phase = Phase::Done;
                        return;
                    }
                }
                Sniff::Pending if !self.gateway_eof => return,
                Sniff::Pending => {
                    if self.down.is_empty() {
                        // The gateway always answers a proxy request; ending without a
                        // byte means it could not take the stream.
                        log(format_args!(
                            "egress: the gateway ended a stream without answering"
                        ));
                    } else {
                        log(format_args!(
                            "egress: the gateway ended a stream halfway through a frame"
                        ));
                    }
                    self.answer(now, limits, gateway_unreachable());
                    return;
                }
                Sniff::Frame(frame) => {
                    match frame {
                        Ok(LinkMessage::Refused { reason }) => log(format_args!(
                            "egress: the gateway refused a stream: {reason}"
                        )),
                        Ok(_) => log(format_args!(
                            "egress: the gateway sent a frame instead of the stream's bytes"
                        )),
                        Err(e) => log(format_args!(
                            "egress: bad frame from the gateway on a stream: {e}"
                        )),
                    }
                    self.answer(now, limits, gateway_unreachable());
                    return;
                }
            }
        }
        if self.gateway_shut && self.client_shut {
            self.phase = Phase::Done;
        }
    }

    /// Moves what can be moved both ways; returns whether a byte moved. An error ends
    /// the stream, except on writing to the gateway: it no longer reads, but what it
    /// sent still goes to the client.
    fn relay_once(&mut self, scratch: &mut [u8]) -> io::Result<bool> {
        let Some(gateway) = self.gateway.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let mut moved = false;
        if !self.client_eof {
            let (n, eof) = fill(&mut self.client, &mut self.up, RELAY_BUFFER, scratch)?;
            moved |= n > 0;
            self.client_eof = eof;
        }
        if !self.gateway_shut {
            match flush(&mut *gateway, &mut self.up) {
                Ok(n) => moved |= n > 0,
                Err(_) => {
                    self.up.clear();
                    self.client_eof = true;
                }
            }
            if self.client_eof && self.up.is_empty() {
                // ENOTCONN: the gateway is gone already, which is as good.
                let _ = gateway.shutdown(Shutdown::Write);
                self.gateway_shut = true;
            }
        }
        if !self.gateway_eof {
            match fill(&mut *gateway, &mut self.down, RELAY_BUFFER, scratch) {
                Ok((n, eof)) => {
                    moved |= n > 0;
                    self.gateway_eof = eof;
                }
                // A gateway that refuses a stream closes it with the stream's frames
                // unread, which resets it behind its `Refused`: that frame, already in
                // `down`, still tells why (`relay`).
                Err(_) if self.sniffing => self.gateway_eof = true,
                Err(e) => return Err(e),
            }
        }
        if !self.client_shut && !self.sniffing {
            moved |= flush(&mut self.client, &mut self.down)? > 0;
            if self.gateway_eof && self.down.is_empty() {
                let _ = self.client.shutdown(Shutdown::Write);
                self.client_shut = true;
            }
        }
        Ok(moved)
    }

    /// Writes PID 1's response; then shuts the client's write half down and drops what
    /// it still sends until it closes.
    fn deliver_answer(&mut self, scratch: &mut [u8]) {
        if flush(&mut self.client, &mut self.down).is_err() {
            self.phase = Phase::Done;
            return;
        }
        if !self.down.is_empty() {
            return;
        }
        if !self.client_shut {
            let _ = self.client.shutdown(Shutdown::Write);
            self.client_shut = true;
        }
        for _ in 0..DISCARDS_PER_WAKE {
            match self.client.read(scratch) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.phase = Phase::Done;
    }
}

/// Reads from `src` into `buf` until it holds `cap` bytes or nothing more is there;
/// returns the bytes read and whether `src` reached its end.
fn fill(
    mut src: impl Read,
    buf: &mut VecDeque<u8>,
    cap: usize,
    scratch: &mut [u8],
) -> io::Result<(usize, bool)> {
    let mut total = 0;
    while buf.len() < cap {
        let room = (cap - buf.len()).min(scratch.len());
        match src.read(&mut scratch[..room]) {
            Ok(0) => return Ok((total, true)),
            Ok(n) => {
                buf.extend(&scratch[..n]);
                total += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((total, false))
}

/// Writes what `buf` holds to `dst` until it is empty or `dst` takes no more; returns
/// the bytes written.
fn flush(mut dst: impl Write, buf: &mut VecDeque<u8>) -> io::Result<usize> {
    let mut total = 0;
    while !buf.is_empty() {
        let (front, _) = buf.as_slices();
        match dst.write(front) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf.drain(..n);
                total += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// The next frame in `inbox` (taken out of it), if complete.
fn next_frame(inbox: &mut Vec<u8>) -> Result<Option<LinkMessage>, FrameError> {
    let Some((message, len)) = peek_frame(inbox)? else {
        return Ok(None);
    };
    inbox.drain(..len);
    Ok(Some(message))
}

/// The frame at the start of `buf` and its length, if complete.
fn peek_frame(buf: &[u8]) -> Result<Option<(LinkMessage, usize)>, FrameError> {
    let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
        let n = buf.len().min(MAGIC.len());
        if buf[..n] != MAGIC[..n] {
            return Err(FrameError::BadMagic);
        }
        return Ok(None);
    };
    let (header_len, payload_len) = wire::parse_prefix(prefix)?;
    let total = PREFIX_LEN + header_len + payload_len;
    if buf.len() < total {
        return Ok(None);
    }
    let message = wire::parse_header(&buf[PREFIX_LEN..PREFIX_LEN + header_len])?;
    Ok(Some((message, total)))
}

/// What the first bytes the gateway sent on a relayed stream are.
#[derive(Debug)]
enum Sniff {
    /// Not a link frame: the stream's bytes, for the client.
    Raw,
    /// Nothing yet, or the start of a link frame.
    Pending,
    /// A link frame (the gateway refused the stream after its hello), or a broken one.
    Frame(Result<LinkMessage, FrameError>),
}

/// Looks at the first bytes the gateway sent after the stream's hello. Only their
/// first four bytes are compared with the link's magic: an answer to the client (an
/// HTTP response) never starts with it.
fn sniff(buf: &[u8]) -> Sniff {
    let n = buf.len().min(MAGIC.len());
    if buf[..n] != MAGIC[..n] {
        return Sniff::Raw;
    }
    match peek_frame(buf) {
        Ok(Some((message, _))) => Sniff::Frame(Ok(message)),
        Ok(None) if buf.len() < MAX_HELLO_BYTES => Sniff::Pending,
        Ok(None) => Sniff::Frame(Err(FrameError::PayloadTooLarge(buf.len()))),
        Err(e) => Sniff::Frame(Err(e)),
    }
}

/// Where a request asks to go.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    name: String,
    port: u16,
}

/// The length of the request head at the start of `buf` (through its `\r\n\r\n`), once
/// it is complete.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// The target of a request head's request line: `CONNECT host:port` or an
/// absolute-form `http://` request (port 80 unless given). Only the request line is
/// looked at; `None` for anything else.
fn parse_request_line(head: &[u8]) -> Option<Target> {
    let line_end = head.iter().position(|&b| b == b'\n')?;
    let mut line = head[..=line_end].to_vec();
    line.extend_from_slice(b"\r\n");
    let mut headers: [httparse::Header<'_>; 0] = [];
    let mut request = httparse::Request::new(&mut headers);
    if !matches!(request.parse(&line), Ok(httparse::Status::Complete(_))) {
        return None;
    }
    let (method, target) = (request.method?, request.path?);
    if method == "CONNECT" {
        return split_authority(target, None);
    }
    let scheme = target.get(..7)?;
    if !scheme.eq_ignore_ascii_case("http://") {
        return None;
    }
    let rest = &target[7..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    split_authority(authority, Some(80))
}

/// `host:port`, `[v6]:port`, or (with a default port) `host` and `[v6]`: the host
/// without brackets and the port.
fn split_authority(authority: &str, default_port: Option<u16>) -> Option<Target> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':')?),
            };
            (host, port)
        }
        None => match authority.rsplit_once(':') {
            // An IPv6 literal needs brackets.
            Some((host, _)) if host.contains(':') => return None,
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port.filter(|p| !p.is_empty()) {
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok().filter(|&p| p != 0)?,
        Some(_) => return None,
        None => default_port?,
    };
    if host.is_empty() || host.contains(['[', ']', '@']) {
        return None;
    }
    Some(Target {
        name: host.to_string(),
        port,
    })
}

/// A complete HTTP/1.1 response of PID 1's own, closing the connection.
fn response(status: &str, egress: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\n\
         Connection: close\r\n\
         X-Beige-Egress: {egress}\r\n\
         \r\n\
         {body}\n",
        body.len() + 1
    )
    .into_bytes()
}

/// The `502` for a stream the gateway did not take.
fn gateway_unreachable() -> Vec<u8> {
    response(
        "502 Bad Gateway",
        "upstream-error; reason=gateway_unreachable",
        "beige: the gateway cannot be reached for egress",
    )
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
