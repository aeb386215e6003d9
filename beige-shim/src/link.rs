//! PID 1's side of the shim link (design: `spec/link.md` §1–§2; frames:
//! [`beige_protocol::link`]).
//!
//! [`Link`] holds one connection to the gateway and runs core-tool operations for it.
//! It owns no thread and never blocks except for bounded writes: [`crate::init`]'s
//! `poll(2)` loop asks it which descriptors to watch ([`Link::prepare`]) and hands it
//! what became ready ([`Link::dispatch`]).
//!
//! - *Carriers.* `unix`: dial the control socket, again after a failure or disconnect
//!   with a backoff from [`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`] (driven by the poll
//!   timeout). `attach`: the process's own stdin and stdout (moved out of reach of
//!   children by `sys::take_stdio`); EOF on stdin ends the link for good.
//! - *Conversation.* Nothing is sent before the gateway's `GatewayHello`; it is answered
//!   with `ShimHello` (boot id, version, carrier, pending ids) followed by every
//!   unacknowledged `Result`, in order. A later hello (a new gateway session on the
//!   attach stream) is answered the same way. `Op` starts an op child unless one with
//!   the id runs (ignored) or its result is still held (re-sent). Results are kept until
//!   `Ack`, at most [`MAX_UNACKED_BYTES`] (oldest dropped). `Ping` → `Pong`. `Refused`
//!   or a bad frame drops the connection (on attach, where nothing can be dropped, the
//!   reader skips to the next frame start and waits for a new hello).
//! - *Op children.* A fork of PID 1 that becomes the agent user and performs the op in
//!   process ([`sys::fork_agent_child`], then [`op::serve`]) — the same code as `op
//!   <name>`, without the cost of executing a second shim. Its stdout (a pipe) is read to
//!   EOF: those bytes are the result. Their exit status is not needed; the caller reaps
//!   them.
//! - *Progress* (`exec` only). The op child also gets a second pipe, the *progress
//!   pipe*, as descriptor 3 (close-on-exec: the command never sees it). While the
//!   command runs, the op writes each piece of its output there (without ever blocking:
//!   a piece the pipe cannot take is skipped), as records of
//!
//!   ```text
//!   stream: u8 (1 = stdout, 2 = stderr) | len: u32 BE | len bytes of output
//!   ```
//!
//!   with `len` at most [`MAX_PROGRESS_RECORD`] (larger pieces are split) and at most
//!   [`MAX_STREAMED_BYTES`] output bytes per op in all. PID 1 reads the pipe as it
//!   becomes readable and sends each record as one [`LinkMessage::Output`] (`seq`
//!   counting the records of the op from 0) on the current connection if the gateway
//!   has said hello on it, else drops it: progress is never queued, stored, replayed
//!   or acknowledged. A record it cannot trust (a stream other than 1 or 2, a `len`
//!   above the bound) ends progress for that op (the pipe is closed; the op's writes
//!   then fail and it stops streaming), as does reaching [`MAX_STREAMED_BYTES`]; an
//!   incomplete record at end-of-file is dropped. Since the op writes all its progress
//!   before its reply, the progress pipe is drained once more when the reply is
//!   complete, so every `Output` of an op goes out before its `Result`, which stays
//!   exactly what the op replied.

use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use beige_protocol::link::{
    self as wire, Carrier, Frame, FrameError, LinkMessage, Role, MAGIC, MAX_PAYLOAD_BYTES,
    MAX_STREAMED_BYTES, PREFIX_LEN,
};
use beige_protocol::op::{OpError, OpErrorKind, OpReply, ReplyProgress};

use crate::privdrop::PrivDrop;
use crate::{op, sys};

/// First pause before dialling again.
pub const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest pause between two dials.
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long one frame may take to write before the connection counts as lost.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Payloads from this size on are written after their frame head rather than copied
/// into one buffer with it.
const LARGE_FRAME: usize = 64 * 1024;

/// Bytes of unacknowledged results kept; the oldest are dropped beyond.
pub const MAX_UNACKED_BYTES: usize = 64 * 1024 * 1024;
/// Op children running at once; further ops fail at once.
pub const MAX_RUNNING: usize = 256;
/// Bytes read per step, from the link or an op's stdout.
const READ_CHUNK: usize = 64 * 1024;
/// An incomplete frame that receives no byte for this long is a leftover of a gateway
/// that died while writing it (the gateway writes each frame in one go): it is dropped,
/// so the next gateway's hello is not swallowed as its payload.
pub const STALL: Duration = Duration::from_secs(2);
/// Steps of reading the link per wake-up, so op children are not starved.
const READS_PER_WAKE: usize = 16;
/// Bytes before the output in a progress record: the stream and the length.
pub const PROGRESS_HEADER_LEN: usize = 5;
/// Largest output of one progress record; a longer length means the pipe cannot be
/// trusted.
pub const MAX_PROGRESS_RECORD: usize = 64 * 1024;
/// The stream byte of a progress record (and of [`LinkMessage::Output`]) for stdout.
pub const PROGRESS_STDOUT: u8 = 1;
/// The stream byte for stderr.
pub const PROGRESS_STDERR: u8 = 2;

/// The header of a progress record of `len` (at most [`MAX_PROGRESS_RECORD`]) bytes
/// of `stream` (see the module documentation).
pub fn progress_header(stream: u8, len: usize) -> [u8; PROGRESS_HEADER_LEN] {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    [stream, len[0], len[1], len[2], len[3]]
}

/// The stream and length of the first record in `buf`: `Ok(None)` while it is
/// incomplete, `Err` when its header cannot be trusted.
fn progress_record(buf: &[u8]) -> Result<Option<(u8, usize)>, String> {
    let Some(header) = buf.first_chunk::<PROGRESS_HEADER_LEN>() else {
        return Ok(None);
    };
    let stream = header[0];
    if stream != PROGRESS_STDOUT && stream != PROGRESS_STDERR {
        return Err(format!("unknown stream {stream}"));
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > MAX_PROGRESS_RECORD {
        return Err(format!(
            "a record of {len} bytes exceeds {MAX_PROGRESS_RECORD}"
        ));
    }
    if buf.len() - PROGRESS_HEADER_LEN < len {
        return Ok(None);
    }
    Ok(Some((stream, len)))
}

/// Where the link runs.
#[derive(Debug)]
pub enum CarrierSpec {
    /// Dial this Unix socket.
    Unix(PathBuf),
    /// Read frames from `input`, write them to `output` (the former stdin and stdout).
    Attach { input: OwnedFd, output: OwnedFd },
}

/// How to run the link.
#[derive(Debug)]
pub struct LinkConfig {
    pub carrier: CarrierSpec,
    /// The op children's working directory.
    pub workdir: PathBuf,
    /// The privilege drop of every op child.
    pub plan: PrivDrop,
}

/// Where PID 1 logs when its stderr was moved away from descriptor 2 (attach carrier).
static LOG: OnceLock<File> = OnceLock::new();

/// Makes [`log`] write to `fd` (the original stderr, kept close-on-exec) instead of
/// descriptor 2.
pub fn log_to(fd: OwnedFd) {
    let _ = LOG.set(File::from(fd));
}

/// Logs one line of PID 1 (`beige-shim init: …`) to the container's stderr.
pub fn log(message: std::fmt::Arguments<'_>) {
    match LOG.get() {
        Some(mut file) => {
            let _ = writeln!(file, "beige-shim init: {message}");
        }
        None => eprintln!("beige-shim init: {message}"),
    }
}

/// PID 1's link to the gateway.
#[derive(Debug)]
pub struct Link {
    boot_id: String,
    workdir: CString,
    plan: PrivDrop,
    wire: Wire,
    ops: Vec<RunningOp>,
    /// The next op's child, forked ahead of time ([`Link::spawn`]).
    warm: Option<Warm>,
    results: ResultStore,
    /// What each descriptor handed out by the last [`Link::prepare`] belongs to.
    slots: Vec<Slot>,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Conn,
    Stdin(usize),
    Stdout(usize),
    Progress(usize),
}

impl Link {
    pub fn new(config: LinkConfig) -> Self {
        let now = Instant::now();
        let wire = match config.carrier {
            CarrierSpec::Unix(path) => Wire {
                carrier: Carrier::Unix,
                dial: Some(path),
                conn: None,
                retry_at: now,
                backoff: BACKOFF_MIN,
                gone: false,
            },
            CarrierSpec::Attach { input, output } => {
                let conn = Conn::new(input, output);
                if let Err(err) = &conn {
                    log(format_args!("cannot use stdin/stdout as the link: {err}"));
                }
                Wire {
                    carrier: Carrier::Attach,
                    dial: None,
                    gone: conn.is_err(),
                    conn: conn.ok(),
                    retry_at: now,
                    backoff: BACKOFF_MIN,
                }
            }
        };
        Self {
            boot_id: new_boot_id(),
            // A path with a NUL cannot come from the environment; `/` is the fallback.
            workdir: CString::new(config.workdir.as_os_str().as_bytes())
                .unwrap_or_else(|_| CString::from(c"/")),
            plan: config.plan,
            wire,
            ops: Vec::new(),
            warm: None,
            results: ResultStore::new(MAX_UNACKED_BYTES),
            slots: Vec::new(),
        }
    }

    /// The boot id this start of PID 1 presents in every `ShimHello` (egress streams
    /// present the same one: the gateway takes them only while this link is up).
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Whether the link is gone for good (the attach stream ended): the caller may drop
    /// it and go on as a pure init.
    pub fn is_gone(&self) -> bool {
        self.wire.gone
    }

    /// Dials when due, then appends the descriptors to watch to `fds` and returns the
    /// longest the caller may sleep (`None`: no limit).
    pub fn prepare(&mut self, now: Instant, fds: &mut Vec<libc::pollfd>) -> Option<Duration> {
        self.slots.clear();
        let mut timeout = self.wire.redial(now);
        if let Some(wait) = self.drop_stalled(now) {
            timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
        }
        let mut watch = |fd: i32, events: libc::c_short, slot: Slot| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            self.slots.push(slot);
        };
        if let Some(conn) = &self.wire.conn {
            watch(conn.input.as_raw_fd(), libc::POLLIN, Slot::Conn);
        }
        for (i, op) in self.ops.iter().enumerate() {
            if let Some(stdin) = &op.stdin {
                watch(stdin.as_raw_fd(), libc::POLLOUT, Slot::Stdin(i));
            }
            if let Some(stdout) = &op.stdout {
                watch(stdout.as_raw_fd(), libc::POLLIN, Slot::Stdout(i));
            }
            if let Some(progress) = &op.progress {
                watch(progress.file.as_raw_fd(), libc::POLLIN, Slot::Progress(i));
            }
        }
        timeout
    }

    /// Handles the events of the descriptors from the last [`Link::prepare`], in the
    /// same order.
    pub fn dispatch(&mut self, fds: &[libc::pollfd]) {
        let slots = std::mem::take(&mut self.slots);
        let mut conn_ready = false;
        for (slot, pfd) in slots.iter().zip(fds) {
            if pfd.revents == 0 {
                continue;
            }
            match *slot {
                Slot::Conn => conn_ready = true,
                Slot::Stdin(i) => self.ops[i].feed(),
                Slot::Stdout(i) => self.ops[i].drain(),
                Slot::Progress(i) => self.ops[i].pump_progress(&mut self.wire),
            }
        }
        self.finish_ops();
        if conn_ready {
            self.receive();
        }
    }

    /// Turns every op whose stdout ended into a result, after the last of its progress.
    fn finish_ops(&mut self) {
        let mut i = 0;
        while i < self.ops.len() {
            if self.ops[i].stdout.is_some() {
                i += 1;
                continue;
            }
            let mut op = self.ops.swap_remove(i);
            // The op wrote all its progress before its reply: what is left is in the
            // pipe already, and goes out before the result.
            op.pump_progress(&mut self.wire);
            op.progress = None;
            let id = std::mem::take(&mut op.id);
            self.complete(id, op.reply_payload());
        }
        self.refill();
    }

    /// Stores a result and sends it when the gateway listens.
    fn complete(&mut self, id: String, payload: Vec<u8>) {
        let message = LinkMessage::Result { id: id.clone() };
        self.wire.send(&message, &payload);
        self.results.insert(id, payload);
    }

    /// Drops an incomplete frame that stalled for [`STALL`] (see there); returns how
    /// long until the current one would count as stalled.
    fn drop_stalled(&mut self, now: Instant) -> Option<Duration> {
        let conn = self.wire.conn.as_mut()?;
        let since = conn.inbox.partial_since?;
        let stalled_for = now.saturating_duration_since(since);
        if stalled_for < STALL {
            return Some(STALL - stalled_for);
        }
        log(format_args!(
            "dropping {} bytes of an incomplete frame nothing was added to for {} s",
            conn.inbox.buf.len(),
            STALL.as_secs()
        ));
        match self.wire.carrier {
            Carrier::Unix => self.wire.lost("a frame stalled halfway", Loss::Closed),
            Carrier::Attach => {
                conn.inbox.buf.clear();
                conn.inbox.partial_since = None;
                conn.greeted = false;
            }
        }
        None
    }

    /// Reads what the connection has and handles the frames in it.
    fn receive(&mut self) {
        let mut ended = None;
        if let Some(conn) = self.wire.conn.as_mut() {
            let mut buf = vec![0u8; READ_CHUNK];
            for _ in 0..READS_PER_WAKE {
                match conn.input.read(&mut buf) {
                    Ok(0) => {
                        ended = Some("the gateway closed the link".to_string());
                        break;
                    }
                    Ok(n) => {
                        conn.inbox.push(&buf[..n]);
                        conn.inbox.partial_since = Some(Instant::now());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        ended = Some(format!("reading the link failed: {e}"));
                        break;
                    }
                }
            }
        }
        // Frames that arrived before the end still count.
        loop {
            let Some(conn) = self.wire.conn.as_mut() else {
                return;
            };
            match conn.inbox.next_frame() {
                Ok(Some(frame)) => self.on_frame(frame),
                Ok(None) => break,
                Err(err) => self.bad_frame(&err),
            }
        }
        if let Some(conn) = self.wire.conn.as_mut() {
            if conn.inbox.buf.is_empty() {
                conn.inbox.partial_since = None;
            }
        }
        if let Some(why) = ended {
            self.wire.lost(&why, Loss::Closed);
        }
    }

    fn bad_frame(&mut self, err: &FrameError) {
        match self.wire.carrier {
            Carrier::Unix => self.wire.lost(&format!("bad frame: {err}"), Loss::Closed),
            Carrier::Attach => {
                log(format_args!(
                    "bad frame on the attach stream ({err}); waiting for a new gateway hello"
                ));
                if let Some(conn) = self.wire.conn.as_mut() {
                    conn.inbox.resync();
                    conn.greeted = false;
                }
            }
        }
    }

    fn on_frame(&mut self, frame: Frame) {
        let greeted = self.wire.conn.as_ref().is_some_and(|c| c.greeted);
        match frame.message {
            LinkMessage::GatewayHello { .. } => self.hello(),
            LinkMessage::Refused { reason } => {
                self.wire.lost(
                    &format!("the gateway refused the link: {reason}"),
                    Loss::Refused,
                );
            }
            // Nothing counts before the gateway has said who it is.
            _ if !greeted => {}
            LinkMessage::Op { id, name } => self.start_op(id, name, frame.payload),
            LinkMessage::Ack { id } => self.results.remove(&id),
            LinkMessage::Ping { seq } => self.wire.send(&LinkMessage::Pong { seq }, b""),
            LinkMessage::Pong { .. }
            | LinkMessage::ShimHello { .. }
            | LinkMessage::Result { .. }
            | LinkMessage::Output { .. }
            | LinkMessage::ExecStarted { .. }
            | LinkMessage::EgressOpen { .. }
            | LinkMessage::SpawnOpen { .. } => {}
        }
    }

    /// Answers a gateway hello and re-sends every unacknowledged result.
    fn hello(&mut self) {
        let Some(conn) = self.wire.conn.as_mut() else {
            return;
        };
        conn.greeted = true;
        self.wire.backoff = BACKOFF_MIN;
        let pending = self
            .ops
            .iter()
            .map(|op| op.id.clone())
            .chain(self.results.ids().map(str::to_string))
            .collect();
        let hello = LinkMessage::ShimHello {
            role: Role::Control,
            boot_id: self.boot_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            carrier: self.wire.carrier,
            pending,
        };
        self.wire.send(&hello, b"");
        for (id, payload) in self.results.iter() {
            self.wire
                .send(&LinkMessage::Result { id: id.to_string() }, payload);
        }
        // Ready for the first op before it comes.
        self.refill();
    }

    fn start_op(&mut self, id: String, name: String, request: Vec<u8>) {
        if !wire::is_valid_id(&id) {
            log(format_args!("ignoring an op with an invalid id"));
            return;
        }
        if self.ops.iter().any(|op| op.id == id) {
            return;
        }
        if let Some(payload) = self.results.get(&id) {
            self.wire.send(&LinkMessage::Result { id }, payload);
            return;
        }
        if name == beige_protocol::spawn::SPAWN_OP {
            self.start_spawn(id, &request);
            return;
        }
        let Some(name) = op::NAMES.iter().copied().find(|n| *n == name) else {
            let message = format!(
                "Unknown operation {name:?}; expected one of: {}.",
                op::NAMES.join(", ")
            );
            self.complete(id, error_reply(OpErrorKind::BadRequest, message));
            return;
        };
        if self.ops.len() >= MAX_RUNNING {
            let message = format!(
                "Too many operations are running in the sandbox ({MAX_RUNNING}); the {name} \
                 operation was not started."
            );
            self.complete(id, error_reply(OpErrorKind::Io, message));
            return;
        }
        match self.spawn(id.clone(), name, request) {
            Ok(op) => self.ops.push(op),
            Err(err) => {
                let hint = if err.raw_os_error() == Some(libc::EAGAIN) {
                    " The sandbox has reached its process limit (sandbox.pidsLimit): end \
                     processes that are no longer needed, or raise the limit."
                } else {
                    ""
                };
                let message =
                    format!("Cannot start the process for the {name} operation: {err}.{hint}");
                self.complete(id, error_reply(OpErrorKind::Io, message));
            }
        }
    }

    /// Starts a `spawn` op ([`crate::spawn`]): a process of its own whose stdin and
    /// stdout are a new connection to the gateway. Its child is an op child like any
    /// other: its reply (the process's end) is the op's result.
    fn start_spawn(&mut self, id: String, request: &[u8]) {
        if self.ops.len() >= MAX_RUNNING {
            let message = format!(
                "Too many operations are running in the sandbox ({MAX_RUNNING}); the process \
                 was not started."
            );
            self.complete(id, crate::spawn::refusal_reply(message));
            return;
        }
        let ctl = self.wire.dial.clone();
        match crate::spawn::start(
            &id,
            request,
            ctl.as_deref(),
            &self.plan,
            &self.workdir,
            &self.boot_id,
        ) {
            Ok(started) => self.ops.push(RunningOp {
                id,
                name: beige_protocol::spawn::SPAWN_OP,
                pid: started.pid,
                stdin: None,
                request: Vec::new(),
                written: 0,
                stdout: Some(File::from(started.reply)),
                reply: Vec::new(),
                reply_progress: ReplyProgress::default(),
                too_large: false,
                progress: None,
            }),
            Err(refusal) => self.complete(id, crate::spawn::refusal_reply(refusal.0)),
        }
    }

    /// Starts an op: hands it to the warm child (a fork that already is the agent
    /// user, waiting for work on its stdin) when there is a live one, else forks one
    /// now. Taking the fork and the privilege drop off the critical path saves about
    /// 0.2 ms per op; [`Link::refill`] forks the next warm child once the results are
    /// out.
    fn spawn(&mut self, id: String, name: &'static str, request: Vec<u8>) -> io::Result<RunningOp> {
        let warm = match self.warm.take() {
            Some(warm) if warm.is_alive() => warm,
            // Killed (the agent can signal processes of its own uid) or failed to set
            // itself up: start a fresh one, which reports what goes wrong.
            _ => self.fork_warm()?,
        };
        let mut input = Vec::with_capacity(name.len() + 1 + request.len());
        input.extend_from_slice(name.as_bytes());
        input.push(b'\n');
        input.extend_from_slice(&request);
        let Warm {
            pid,
            stdin,
            reply,
            progress,
        } = warm;
        let progress = (name == "exec").then(|| ProgressIn::new(progress));
        if name == "exec" {
            // Before the child gets its request: nothing of the command runs before the
            // gateway has been told which process leads its session.
            self.report_exec_start(&id, pid, &request);
        }
        let mut op = RunningOp {
            id,
            name,
            pid,
            stdin: Some(stdin),
            request: input,
            written: 0,
            stdout: Some(File::from(reply)),
            reply: Vec::new(),
            reply_progress: ReplyProgress::default(),
            too_large: false,
            progress,
        };
        op.feed();
        Ok(op)
    }

    /// Tells the gateway that the `exec` op `id` runs in the child `pid`, the leader of
    /// the session its command runs in (the child called `setsid` when it was forked):
    /// [`LinkMessage::ExecStarted`] with the request's `execId` and the child's start
    /// time. Nothing is sent for a request without an id, or when the start time cannot
    /// be read (the caller is then unattributed, not misattributed).
    fn report_exec_start(&mut self, id: &str, pid: u32, request: &[u8]) {
        let Some(exec_id) = exec_id_of(request) else {
            return;
        };
        let Some(starttime) = std::fs::read(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| beige_protocol::procfs::parse_stat(&stat))
            .map(|stat| stat.starttime)
        else {
            log(format_args!(
                "cannot read the start time of op child {pid}; its exec is not reported"
            ));
            return;
        };
        let started = LinkMessage::ExecStarted {
            id: id.to_string(),
            exec_id,
            pid,
            starttime,
        };
        self.wire.send(&started, b"");
    }

    /// Forks the next warm child when there is none (after results went out, so the
    /// fork never delays one). A failure only means the next op forks for itself.
    fn refill(&mut self) {
        if self.warm.is_none() {
            self.warm = self.fork_warm().ok();
        }
    }

    /// Forks a child that becomes the agent user ([`sys::fork_agent_child`]) and waits
    /// on its stdin for `<op name>\n<request JSON>`, then performs that op in process
    /// ([`op::serve`]) with its reply on stdout and, for `exec`, live output on the
    /// progress pipe.
    fn fork_warm(&self) -> io::Result<Warm> {
        let (reply_read, reply_write) = sys::pipe()?;
        // A large reply (an exec's output) crosses in fewer, larger steps.
        sys::grow_pipe(reply_read.as_fd(), sys::BULK_PIPE_SIZE);
        let (stdin_read, stdin_write) = sys::pipe()?;
        let (progress_read, progress_write) = sys::pipe()?;
        sys::set_nonblocking(progress_read.as_fd())?;
        sys::set_nonblocking(progress_write.as_fd())?;
        let forked = sys::fork_agent_child(
            &self.plan,
            &self.workdir,
            &reply_write,
            Some(&progress_write),
            Some(&stdin_read),
        )?;
        match forked {
            sys::Forked::Child(setup) => {
                // The agent user now, in a copy of PID 1 with only stdin (the request
                // pipe), stdout (the reply pipe), stderr and descriptor 3 (the progress
                // pipe) open. PID 1's handles name closed descriptors here: forgotten,
                // never closed. Never returns to the loop.
                for fd in [
                    reply_read,
                    reply_write,
                    stdin_read,
                    stdin_write,
                    progress_read,
                    progress_write,
                ] {
                    std::mem::forget(fd);
                }
                // A panic must end this child, never unwind into the copy of PID 1's
                // loop (the release shim aborts anyway; test builds unwind).
                let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match setup {
                    Ok(progress) => warm_main(progress),
                    Err(failure) => {
                        let message =
                            format!("Cannot become the agent user for the operation: {failure}");
                        let _ = io::stdout().write_all(&error_reply(OpErrorKind::Io, message));
                        let _ = io::stdout().flush();
                        1
                    }
                }))
                .unwrap_or(1);
                sys::exit_now(code)
            }
            sys::Forked::Parent(pid) => {
                drop(reply_write);
                drop(stdin_read);
                drop(progress_write);
                sys::set_nonblocking(reply_read.as_fd())?;
                sys::set_nonblocking(stdin_write.as_fd())?;
                Ok(Warm {
                    pid,
                    stdin: File::from(stdin_write),
                    reply: reply_read,
                    progress: progress_read,
                })
            }
        }
    }
}

/// The `execId` of an `exec` request's JSON, when it has a valid one.
fn exec_id_of(request: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        #[serde(default, rename = "execId")]
        exec_id: Option<String>,
    }
    serde_json::from_slice::<IdOnly>(request)
        .ok()?
        .exec_id
        .filter(|id| beige_protocol::op::is_valid_exec_id(id))
}

/// A forked agent child waiting for its op (see [`Link::fork_warm`]).
#[derive(Debug)]
struct Warm {
    pid: u32,
    /// Where the op goes: `<name>\n<request JSON>`, then end-of-file.
    stdin: File,
    reply: OwnedFd,
    progress: OwnedFd,
}

impl Warm {
    /// A warm child that died (or wrote something before being asked) has its reply
    /// pipe readable: it cannot take an op.
    ///
    /// A child the agent just killed (`kill -9 -1`) may not have exited yet: its pipe is
    /// still quiet, but the kernel already holds its SIGKILL. So its `/proc` status is
    /// read too, and a pending SIGKILL or an exited state counts as dead.
    fn is_alive(&self) -> bool {
        let quiet = matches!(
            sys::wait_readable(self.reply.as_fd(), Duration::ZERO),
            Ok(false)
        );
        quiet
            && std::fs::read_to_string(format!("/proc/{}/status", self.pid))
                .map_or(true, |status| !status_says_dying(&status))
    }
}

/// Whether a `/proc/<pid>/status` text shows a process that has exited (`State: Z` or
/// `X`) or has a SIGKILL pending (bit 8 of `SigPnd` or `ShdPnd`).
fn status_says_dying(status: &str) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    status.lines().any(|line| {
        let Some((key, value)) = line.split_once(':') else {
            return false;
        };
        let value = value.trim();
        match key {
            "State" => value.starts_with('Z') || value.starts_with('X'),
            "SigPnd" | "ShdPnd" => {
                u64::from_str_radix(value, 16).is_ok_and(|mask| mask & SIGKILL_BIT != 0)
            }
            _ => false,
        }
    })
}

/// The body of a warm child: read `<op name>\n<request JSON>` from stdin, perform it.
/// End-of-file before anything arrives (PID 1 ended or dropped it) exits quietly.
fn warm_main(progress: Option<OwnedFd>) -> i32 {
    let mut input = Vec::new();
    if io::stdin().lock().read_to_end(&mut input).is_err() || input.is_empty() {
        return 0;
    }
    let Some(newline) = input.iter().position(|&b| b == b'\n') else {
        return 2;
    };
    let Some(name) = std::str::from_utf8(&input[..newline])
        .ok()
        .and_then(|n| op::NAMES.iter().copied().find(|known| *known == n))
    else {
        return 2;
    };
    let progress = if name == "exec" { progress } else { None };
    op::serve(name, &input[newline + 1..], progress)
}

/// One op child.
#[derive(Debug)]
struct RunningOp {
    id: String,
    name: &'static str,
    pid: u32,
    /// Open until the whole request is written.
    stdin: Option<File>,
    request: Vec<u8>,
    written: usize,
    /// Open until end-of-file.
    stdout: Option<File>,
    reply: Vec<u8>,
    /// How much of the reply is in ([`ReplyProgress`]).
    reply_progress: ReplyProgress,
    /// The reply grew beyond [`MAX_PAYLOAD_BYTES`]; the child was killed.
    too_large: bool,
    /// The progress pipe (`exec` only), until it ends or cannot be trusted.
    progress: Option<ProgressIn>,
}

impl RunningOp {
    /// Writes as much of the request as the pipe takes; closes it when done or broken.
    fn feed(&mut self) {
        let Some(stdin) = self.stdin.as_mut() else {
            return;
        };
        while self.written < self.request.len() {
            match stdin.write(&self.request[self.written..]) {
                Ok(0) => break,
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EPIPE: the child is gone; its (missing) reply tells.
                Err(_) => break,
            }
        }
        self.stdin = None;
        self.request = Vec::new();
    }

    /// Forwards what the progress pipe has; closes it when it ended or is done with.
    fn pump_progress(&mut self, wire: &mut Wire) {
        let Some(progress) = self.progress.as_mut() else {
            return;
        };
        if !progress.pump(&self.id, wire) {
            self.progress = None;
        }
    }

    /// Reads what the child wrote; at end-of-file (or error) closes stdout.
    fn drain(&mut self) {
        let Some(stdout) = self.stdout.as_mut() else {
            return;
        };
        loop {
            // Straight into the reply (no zeroed scratch buffer per wake-up).
            if self.reply.capacity() - self.reply.len() < READ_CHUNK {
                self.reply.reserve(READ_CHUNK.max(self.reply.len()));
            }
            let room = (MAX_PAYLOAD_BYTES + 1).saturating_sub(self.reply.len());
            match (&mut *stdout)
                .take(room as u64)
                .read_to_end(&mut self.reply)
            {
                // End of file (or the limit, which the next check tells apart).
                Ok(_) if self.reply.len() > MAX_PAYLOAD_BYTES => {
                    self.too_large = true;
                    let _ = sys::kill_process(self.pid, libc::SIGKILL);
                    break;
                }
                Ok(_) => break,
                // Once the whole reply is here it is complete, and the result need not
                // wait for the child's exit to close the pipe.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !self.reply_progress.complete(&self.reply) {
                        return;
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.stdout = None;
        self.stdin = None;
    }

    /// The result's payload: the child's reply, or an error when it is missing.
    fn reply_payload(mut self) -> Vec<u8> {
        if self.too_large {
            let message = format!(
                "The {} operation's reply exceeded {MAX_PAYLOAD_BYTES} bytes; it was stopped.",
                self.name
            );
            return error_reply(OpErrorKind::Io, message);
        }
        // A reply is complete when its JSON line (and, in the raw form, the output it
        // announces) is all here. It is not parsed here (megabytes with the output cap
        // raised); the gateway decodes it and treats a bad one as a protocol error.
        let readable =
            self.reply.first() == Some(&b'{') && self.reply_progress.complete(&self.reply);
        if !readable {
            let message = format!(
                "The {} operation ended without a readable reply (its process failed or \
                 was killed).",
                self.name
            );
            return error_reply(OpErrorKind::Io, message);
        }
        self.reply
    }
}

/// PID 1's end of an `exec` op's progress pipe (see the module documentation).
#[derive(Debug)]
struct ProgressIn {
    file: File,
    /// Bytes read but not yet forwarded: at most one incomplete record.
    buf: Vec<u8>,
    /// The `seq` of the next [`LinkMessage::Output`].
    seq: u64,
    /// Output bytes forwarded (or dropped while no gateway listened) so far.
    streamed: usize,
}

impl ProgressIn {
    fn new(fd: OwnedFd) -> Self {
        Self {
            file: File::from(fd),
            buf: Vec::new(),
            seq: 0,
            streamed: 0,
        }
    }

    /// Reads what the pipe has and forwards every complete record; returns whether the
    /// pipe is still worth watching (not at end-of-file, broken, untrustworthy or
    /// spent).
    fn pump(&mut self, id: &str, wire: &mut Wire) -> bool {
        let mut chunk = vec![0u8; READ_CHUNK];
        for _ in 0..READS_PER_WAKE {
            match self.file.read(&mut chunk) {
                // An incomplete record at the end is dropped.
                Ok(0) => return false,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if !self.forward(id, wire) {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Sends the complete records in the buffer; returns whether more may follow.
    fn forward(&mut self, id: &str, wire: &mut Wire) -> bool {
        loop {
            let (stream, len) = match progress_record(&self.buf) {
                Ok(Some(record)) => record,
                Ok(None) => return true,
                Err(why) => {
                    log(format_args!(
                        "op {id}: unreadable progress ({why}); no more of its output is \
                         streamed"
                    ));
                    return false;
                }
            };
            let end = PROGRESS_HEADER_LEN + len;
            let room = MAX_STREAMED_BYTES.saturating_sub(self.streamed);
            let piece = &self.buf[PROGRESS_HEADER_LEN..PROGRESS_HEADER_LEN + len.min(room)];
            if !piece.is_empty() {
                let message = LinkMessage::Output {
                    id: id.to_string(),
                    stream,
                    seq: self.seq,
                };
                wire.send_progress(&message, piece);
                self.seq += 1;
                self.streamed += piece.len();
            }
            self.buf.drain(..end);
            if self.streamed >= MAX_STREAMED_BYTES {
                return false;
            }
        }
    }
}

/// An [`OpReply::Error`] as the JSON line an op child would have written.
fn error_reply(kind: OpErrorKind, message: String) -> Vec<u8> {
    let mut line =
        serde_json::to_vec(&OpReply::Error(OpError { kind, message })).unwrap_or_default();
    line.push(b'\n');
    line
}

/// A random hex id, new for every start of PID 1.
fn new_boot_id() -> String {
    let mut bytes = [0u8; 16];
    if sys::fill_random(&mut bytes).is_err() {
        // Only uniqueness matters: fall back on the clock.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = nanos.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How a connection was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Closed, broken or unreadable.
    Closed,
    /// A write did not finish in time.
    Timeout,
    /// The gateway sent `Refused`.
    Refused,
}

/// The carrier and the current connection over it.
#[derive(Debug)]
struct Wire {
    carrier: Carrier,
    /// The Unix socket to dial (none on attach).
    dial: Option<PathBuf>,
    conn: Option<Conn>,
    retry_at: Instant,
    backoff: Duration,
    /// The attach stream ended: no link any more.
    gone: bool,
}

impl Wire {
    /// Dials the Unix socket when disconnected and due; returns how long until the next
    /// attempt when still disconnected.
    fn redial(&mut self, now: Instant) -> Option<Duration> {
        if self.conn.is_some() {
            return None;
        }
        let path = self.dial.as_ref()?;
        if now >= self.retry_at {
            match sys::connect_unix(path).and_then(|fd| {
                let output = fd.try_clone()?;
                Conn::new(fd, output)
            }) {
                Ok(conn) => {
                    self.conn = Some(conn);
                    return None;
                }
                Err(_) => self.schedule(now),
            }
        }
        Some(self.retry_at.saturating_duration_since(now))
    }

    fn schedule(&mut self, now: Instant) {
        self.retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }

    /// Writes one frame if the gateway has said hello; a failed write loses the
    /// connection.
    fn send(&mut self, message: &LinkMessage, payload: &[u8]) {
        let Some(conn) = self.conn.as_mut().filter(|c| c.greeted) else {
            return;
        };
        // A large payload (a result) is written from where it is, after its head,
        // instead of being copied into one frame buffer first.
        let written = if payload.len() >= LARGE_FRAME {
            let head = wire::encode_head(message, payload.len());
            conn.write_frame(&head, false)
                .and_then(|()| conn.write_frame(payload, false))
        } else {
            conn.write_frame(&wire::encode(message, payload), false)
        };
        if let Err(loss) = written {
            self.lost("writing to the link failed", loss);
        }
    }

    /// Writes a progress frame if the gateway has said hello and the connection takes
    /// it without waiting: a frame that cannot even start (the socket is full) is
    /// dropped, one that started is completed like any other. Progress is never queued.
    fn send_progress(&mut self, message: &LinkMessage, payload: &[u8]) {
        let Some(conn) = self.conn.as_mut().filter(|c| c.greeted) else {
            return;
        };
        let frame = wire::encode(message, payload);
        if let Err(loss) = conn.write_frame(&frame, true) {
            self.lost("writing to the link failed", loss);
        }
    }

    /// Ends the connection (Unix: dial again after the backoff; attach: wait for a new
    /// hello, or give up when the stream is closed).
    fn lost(&mut self, why: &str, loss: Loss) {
        match self.carrier {
            Carrier::Unix => {
                if self.conn.take().is_some() {
                    log(format_args!("link down: {why}"));
                }
                self.schedule(Instant::now());
            }
            Carrier::Attach if loss == Loss::Closed => {
                log(format_args!(
                    "link down for good: {why}; going on as a plain init"
                ));
                self.conn = None;
                self.gone = true;
            }
            Carrier::Attach => {
                log(format_args!("{why}; waiting for a new gateway hello"));
                if let Some(conn) = self.conn.as_mut() {
                    conn.greeted = false;
                }
            }
        }
    }
}

/// One connection: the two directions of the carrier and what was read so far.
#[derive(Debug)]
struct Conn {
    input: File,
    output: File,
    inbox: Inbox,
    /// The gateway said hello on this connection.
    greeted: bool,
}

impl Conn {
    fn new(input: OwnedFd, output: OwnedFd) -> io::Result<Self> {
        sys::set_nonblocking(input.as_fd())?;
        sys::set_nonblocking(output.as_fd())?;
        Ok(Self {
            input: File::from(input),
            output: File::from(output),
            inbox: Inbox::default(),
            greeted: false,
        })
    }

    /// Writes the whole frame within [`WRITE_TIMEOUT`]; with `skippable`, writes
    /// nothing when not even its first byte can be written at once.
    fn write_frame(&mut self, frame: &[u8], skippable: bool) -> Result<(), Loss> {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        let mut done = 0;
        while done < frame.len() {
            match self.output.write(&frame[done..]) {
                Ok(0) => return Err(Loss::Closed),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && skippable && done == 0 => {
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Loss::Timeout);
                    }
                    let mut pfd = [libc::pollfd {
                        fd: self.output.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    }];
                    sys::poll(&mut pfd, Some(left)).map_err(|_| Loss::Closed)?;
                }
                Err(_) => return Err(Loss::Closed),
            }
        }
        Ok(())
    }
}

/// Received bytes not yet decoded into frames.
///
/// Decodes like [`beige_protocol::link::FrameDecoder`] (through the same
/// `parse_prefix`/`parse_header`), but can skip ahead to the next frame start after an
/// error, which the attach stream needs: it cannot be dropped and dialled again.
#[derive(Debug, Default)]
struct Inbox {
    buf: Vec<u8>,
    /// When bytes last arrived while a frame is incomplete.
    partial_since: Option<Instant>,
}

impl Inbox {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let Some(prefix) = self.buf.first_chunk::<PREFIX_LEN>() else {
            let n = self.buf.len().min(MAGIC.len());
            if self.buf[..n] != MAGIC[..n] {
                return Err(FrameError::BadMagic);
            }
            return Ok(None);
        };
        let (header_len, payload_len) = wire::parse_prefix(prefix)?;
        let total = PREFIX_LEN + header_len + payload_len;
        if self.buf.len() < total {
            return Ok(None);
        }
        let message = wire::parse_header(&self.buf[PREFIX_LEN..PREFIX_LEN + header_len])?;
        let payload = self.buf[PREFIX_LEN + header_len..total].to_vec();
        self.buf.drain(..total);
        Ok(Some(Frame { message, payload }))
    }

    /// Drops at least one byte, then everything up to the next [`MAGIC`] (keeping a
    /// possible start of one at the end).
    fn resync(&mut self) {
        let next = self
            .buf
            .windows(MAGIC.len())
            .skip(1)
            .position(|w| w == MAGIC)
            .map(|p| p + 1);
        let cut = next.unwrap_or_else(|| self.buf.len().saturating_sub(MAGIC.len() - 1).max(1));
        let cut = cut.min(self.buf.len());
        self.buf.drain(..cut);
    }
}

/// Results waiting for the gateway's `Ack`, oldest first, bounded in bytes.
#[derive(Debug)]
struct ResultStore {
    items: VecDeque<(String, Vec<u8>)>,
    bytes: usize,
    limit: usize,
}

impl ResultStore {
    fn new(limit: usize) -> Self {
        Self {
            items: VecDeque::new(),
            bytes: 0,
            limit,
        }
    }

    fn insert(&mut self, id: String, payload: Vec<u8>) {
        self.remove(&id);
        self.bytes += payload.len();
        self.items.push_back((id, payload));
        while self.bytes > self.limit && self.items.len() > 1 {
            if let Some((old, payload)) = self.items.pop_front() {
                self.bytes -= payload.len();
                log(format_args!(
                    "dropped the unacknowledged result of op {old} ({} bytes): more than \
                     {} bytes of results are waiting for the gateway",
                    payload.len(),
                    self.limit
                ));
            }
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(pos) = self.items.iter().position(|(i, _)| i == id) {
            if let Some((_, payload)) = self.items.remove(pos) {
                self.bytes -= payload.len();
            }
        }
    }

    fn get(&self, id: &str) -> Option<&[u8]> {
        self.items
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, p)| p.as_slice())
    }

    fn ids(&self) -> impl Iterator<Item = &str> {
        self.items.iter().map(|(i, _)| i.as_str())
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.items.iter().map(|(i, p)| (i.as_str(), p.as_slice()))
    }
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
