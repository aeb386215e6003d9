//! `exec`: runs `/bin/sh -c <command>` in a new process group, captures its output
//! within a cap, enforces the timeout, and leaves nothing of the group behind.
//!
//! One thread, no async — each running `exec` costs the container's pids limit one
//! task plus the command's own: a `poll(2)` loop moves stdout and stderr into a
//! [`Capture`], learns of the shell's exit from a pidfd (without reaping it, so its
//! pid, which is the group id, cannot be reused; kernels before 5.3 have no pidfd and
//! are asked every [`EXIT_TICK`] instead), and, when asked to, reads SIGTERM/SIGINT/SIGHUP
//! sent to the shim from a signalfd and passes them on to the group. On timeout it
//! sends SIGTERM to the group and SIGKILL after [`EXEC_KILL_GRACE_SECS`]. Whenever the
//! shell is gone — normally or not — the whole group gets SIGKILL, so background
//! children (`sleep 100 &`) do not survive, and the pipes are drained for at most
//! [`DRAIN_GRACE`]: a process that left the group (`setsid`) and still holds them open
//! cannot keep the reply waiting.
//!
//! Once the command has ended and its group is killed, processes it started that left
//! the group and still run are reported as `survivors` ([`super::survivors`]); they are
//! not killed.
//!
//! Given a progress pipe (only PID 1's op children have one, see [`crate::link`]), every
//! chunk read from the command's pipes is also written there as a record, so PID 1 can
//! stream the output to the gateway while the command runs ([`Progress`]). Those writes
//! never block: a chunk the pipe cannot take at once is skipped, a failed write ends
//! streaming, and at most [`MAX_STREAMED_BYTES`] are streamed. Streaming never delays
//! the command nor changes the reply.
//!
//! With an `execId`, output that outgrows the cap is also kept whole in the workspace at
//! `.beige/out/<exec id>.log` ([`super::spool`]); the reply says how much.
//!
//! With an `execId`, the command runs with `BEIGE_EXEC_ID=<id>` in its environment, so
//! a second `beige-shim op kill` can find its processes (see [`super::kill`]); the
//! `exec` then replies as usual, with the signal that ended the shell.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use beige_protocol::link::MAX_STREAMED_BYTES;
use beige_protocol::op::{
    ExecReply, ExecRequest, OpError, OpErrorKind, EXEC_ID_ENV, EXEC_KILL_GRACE_SECS,
};

use super::capture::{Capture, Stream};
use super::spool::Spool;
use super::survivors::Baseline;
use super::{op_error, Context};
use crate::link::{progress_header, MAX_PROGRESS_RECORD, PROGRESS_STDERR, PROGRESS_STDOUT};
use crate::sys::{self, SignalFd, SignalSet};

/// The shell every command runs under.
pub const SHELL: &str = "/bin/sh";

/// How long to wait for the pipes to reach end-of-file once the shell is dead and its
/// group killed.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// Without a pidfd, how often to look whether the shell has exited.
pub const EXIT_TICK: Duration = Duration::from_millis(10);

/// How long to wait for the shell to die after SIGKILL before giving up on it (a
/// process stuck in uninterruptible sleep).
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Longest timeout honoured (a year); larger values are clamped so deadlines cannot
/// overflow. A timeout of 0 counts as 1 second.
const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

/// Bytes read from a pipe per step.
const PIPE_CHUNK: usize = 64 * 1024;

/// Signals sent to the shim that are passed on to the command's process group.
const FORWARDED: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// How the supervision ended.
#[derive(Debug, Default)]
struct Outcome {
    timed_out: bool,
    /// The shell exited and can be reaped.
    exited: bool,
}

/// Performs an `exec` request. With `forward_signals`, termination signals the shim
/// receives while the command runs are passed on to its process group (only sensible
/// in a single-threaded shim process: the signals are blocked in the calling thread).
/// With `progress`, the output is also streamed there while it comes ([`Progress`]).
pub fn exec(
    ctx: &Context,
    req: &ExecRequest,
    forward_signals: bool,
    progress: Option<OwnedFd>,
) -> Result<ExecReply, OpError> {
    validate_env(&req.env)?;
    if let Some(id) = &req.exec_id {
        super::kill::check_exec_id(id)?;
    }
    let cwd = match &req.cwd {
        Some(cwd) => ctx.resolve(cwd)?,
        None => ctx.workspace().to_path_buf(),
    };
    check_cwd(&cwd)?;
    if fs::metadata(SHELL).is_err() {
        return Err(op_error(
            OpErrorKind::NoShell,
            format!(
                "exec needs {SHELL}, but this sandbox image has none, so commands cannot run. \
                 read, write and patch still work; use an image with a shell to run commands."
            ),
        ));
    }
    // The command itself starts with an empty mask (`reset_signals_on_exec`).
    let signals = if forward_signals {
        SignalSet::block(&FORWARDED)
            .and_then(|set| SignalFd::new(&set))
            .ok()
    } else {
        None
    };

    let mut command = Command::new(SHELL);
    command
        .arg("-c")
        .arg(&req.command)
        .current_dir(&cwd)
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(id) = &req.exec_id {
        // After `env`, so a request cannot override the id `kill` will look for.
        command.env(EXEC_ID_ENV, id);
    }
    sys::reset_signals_on_exec(&mut command);

    let baseline = Baseline::take();
    let started = Instant::now();
    let mut child = command.spawn().map_err(|e| spawn_error(&e))?;
    let pgid = child.id();
    let mut pipes = Pipes {
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        capture: Capture::new(usize::try_from(req.max_output_bytes).unwrap_or(usize::MAX)),
        spool: req
            .exec_id
            .as_deref()
            .map(|id| Spool::new(ctx.workspace(), id, req.max_output_bytes)),
        progress: progress.map(Progress::new),
    };
    pipes.set_nonblocking();
    let exit_fd = sys::pidfd_open(pgid).ok();

    let timeout = Duration::from_secs(req.timeout_secs.clamp(1, MAX_TIMEOUT_SECS));
    let outcome = supervise(
        pgid,
        &mut pipes,
        exit_fd.as_ref(),
        signals.as_ref(),
        timeout,
    );
    let duration = started.elapsed();

    // Nothing of the group may outlive the command. The shell is still an unreaped
    // zombie here, so the group id cannot have been reused.
    let _ = sys::kill_process_group(pgid, libc::SIGKILL);
    let status = if outcome.exited {
        reap(&mut child)
    } else {
        None
    };
    pipes.drain(Instant::now() + DRAIN_GRACE);
    // The end of the stream: all of it is in the pipe before the reply is written.
    if let Some(mut progress) = pipes.progress.take() {
        progress.finish();
    }

    let survivors = baseline.map(|b| b.survivors(pgid)).unwrap_or_default();
    let dropped = pipes.capture.dropped();
    let output_file = pipes.spool.take().and_then(|s| s.finish(dropped));
    let stdout = pipes.capture.take(Stream::Stdout);
    let stderr = pipes.capture.take(Stream::Stderr);
    Ok(ExecReply {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        stdout: stdout.text,
        stderr: stderr.text,
        stdout_omitted: stdout.omitted,
        stderr_omitted: stderr.omitted,
        timed_out: outcome.timed_out,
        duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
        survivors,
        output_file,
    })
}

/// The command's output pipes (each open until end-of-file) and what came through.
#[derive(Debug)]
struct Pipes {
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    capture: Capture,
    /// Where all of the output goes once it outgrows the cap (only with an exec id).
    spool: Option<Spool>,
    /// Where the output is streamed as well, if anywhere.
    progress: Option<Progress>,
}

impl Pipes {
    fn set_nonblocking(&mut self) {
        // A pipe left blocking is only read after poll said it is readable. Larger
        // pipes: a big output moves in fewer, larger steps.
        if let Some(p) = &self.stdout {
            let _ = sys::set_nonblocking(p.as_fd());
            sys::grow_pipe(p.as_fd(), sys::BULK_PIPE_SIZE);
        }
        if let Some(p) = &self.stderr {
            let _ = sys::set_nonblocking(p.as_fd());
            sys::grow_pipe(p.as_fd(), sys::BULK_PIPE_SIZE);
        }
    }

    fn is_open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some()
    }

    /// Appends pollfds for the open pipes (stdout first) and returns how many.
    fn watch(&self, fds: &mut Vec<libc::pollfd>) -> usize {
        let before = fds.len();
        let raw = [
            self.stdout.as_ref().map(|p| p.as_raw_fd()),
            self.stderr.as_ref().map(|p| p.as_raw_fd()),
        ];
        for fd in raw.into_iter().flatten() {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        fds.len() - before
    }

    /// Reads the pipes whose pollfds (as added by [`Pipes::watch`]) have events.
    fn pump(&mut self, fds: &[libc::pollfd], buf: &mut [u8]) {
        let mut ready = fds.iter().map(|f| f.revents != 0);
        if self.stdout.is_some() && ready.next() == Some(true) {
            if let Some(p) = self.stdout.as_mut() {
                let sinks = Sinks {
                    capture: &mut self.capture,
                    spool: self.spool.as_mut(),
                    progress: self.progress.as_mut(),
                };
                if !read_into(p, Stream::Stdout, sinks, buf) {
                    self.stdout = None;
                }
            }
        }
        if self.stderr.is_some() && ready.next() == Some(true) {
            if let Some(p) = self.stderr.as_mut() {
                let sinks = Sinks {
                    capture: &mut self.capture,
                    spool: self.spool.as_mut(),
                    progress: self.progress.as_mut(),
                };
                if !read_into(p, Stream::Stderr, sinks, buf) {
                    self.stderr = None;
                }
            }
        }
    }

    /// Reads the pipes until both end or `deadline` passes.
    fn drain(&mut self, deadline: Instant) {
        let mut buf = vec![0u8; PIPE_CHUNK];
        let mut fds = Vec::with_capacity(2);
        while self.is_open() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            fds.clear();
            self.watch(&mut fds);
            if sys::poll(&mut fds, Some(left)).is_err() {
                return;
            }
            self.pump(&fds, &mut buf);
        }
    }
}

/// Where a chunk read from a pipe goes.
struct Sinks<'a> {
    capture: &'a mut Capture,
    spool: Option<&'a mut Spool>,
    progress: Option<&'a mut Progress>,
}

/// Reads what `pipe` has into the capture (and the spool and the progress pipe);
/// returns whether it is still open.
fn read_into(pipe: &mut impl Read, stream: Stream, mut sinks: Sinks<'_>, buf: &mut [u8]) -> bool {
    loop {
        match pipe.read(buf) {
            Ok(0) => return false,
            Ok(n) => {
                let chunk = &buf[..n];
                if let Some(spool) = sinks.spool.as_deref_mut() {
                    // Before the capture takes it: the spool replays what came earlier.
                    spool.push(stream, chunk, sinks.capture);
                }
                sinks.capture.push(stream, chunk);
                if let Some(progress) = sinks.progress.as_deref_mut() {
                    progress.push(stream, chunk);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// The op's end of the progress pipe: every chunk of output is also written there as a
/// record (format in [`crate::link`]), split into records of at most
/// [`MAX_PROGRESS_RECORD`] bytes, without ever waiting.
///
/// The pipe carries whole records only, in order. A record the pipe takes only part of
/// keeps its rest here, written before anything else; while that rest does not fit,
/// and whenever a new record does not fit at all (EAGAIN), the chunk at hand is skipped
/// and not counted. A failed write (PID 1 closed its end) ends streaming; so does
/// reaching [`MAX_STREAMED_BYTES`].
#[derive(Debug)]
struct Progress {
    pipe: File,
    /// Output bytes handed to the pipe so far.
    streamed: usize,
    /// The unwritten rest of the last record.
    pending: Vec<u8>,
    /// Nothing more is written.
    done: bool,
}

impl Progress {
    fn new(fd: OwnedFd) -> Self {
        // A pipe that could block is not used at all: streaming must not delay anything.
        let done = sys::set_nonblocking(fd.as_fd()).is_err();
        Self {
            pipe: File::from(fd),
            streamed: 0,
            pending: Vec::new(),
            done,
        }
    }

    /// Streams one chunk of `stream` (as far as the pipe takes it now).
    fn push(&mut self, stream: Stream, data: &[u8]) {
        let stream = match stream {
            Stream::Stdout => PROGRESS_STDOUT,
            Stream::Stderr => PROGRESS_STDERR,
        };
        for piece in data.chunks(MAX_PROGRESS_RECORD) {
            if !self.flush() {
                return;
            }
            let room = MAX_STREAMED_BYTES.saturating_sub(self.streamed);
            if room == 0 {
                self.done = true;
                return;
            }
            let piece = &piece[..piece.len().min(room)];
            self.pending
                .extend_from_slice(&progress_header(stream, piece.len()));
            self.pending.extend_from_slice(piece);
            if self.write_pending() == 0 {
                // The pipe is full: this chunk is skipped.
                self.pending.clear();
                return;
            }
            self.streamed += piece.len();
        }
    }

    /// Writes the rest of the last record if there is one; returns whether streaming
    /// may go on with a new record.
    fn flush(&mut self) -> bool {
        if !self.pending.is_empty() {
            self.write_pending();
        }
        !self.done && self.pending.is_empty()
    }

    /// Writes as much of `pending` as the pipe takes now; returns how much that was.
    fn write_pending(&mut self) -> usize {
        let mut written = 0;
        while written < self.pending.len() && !self.done {
            match self.pipe.write(&self.pending[written..]) {
                Ok(0) => self.done = true,
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EPIPE: PID 1 stopped reading.
                Err(_) => self.done = true,
            }
        }
        if self.done {
            self.pending.clear();
        } else {
            self.pending.drain(..written);
        }
        written
    }

    /// A last try at the rest of the last record, before the pipe is closed (an
    /// incomplete record at the end is dropped by PID 1).
    fn finish(&mut self) {
        self.flush();
        self.done = true;
    }
}

/// Where the supervisor is in killing the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Running,
    /// SIGTERM (or a forwarded signal) sent; SIGKILL follows after the grace.
    Terminating,
    /// SIGKILL sent; waiting at most [`KILL_WAIT`] more.
    Killed,
}

/// Waits for the shell to exit while pumping its output, enforcing the timeout and
/// forwarding signals.
fn supervise(
    pgid: u32,
    pipes: &mut Pipes,
    exit_fd: Option<&OwnedFd>,
    signals: Option<&SignalFd>,
    timeout: Duration,
) -> Outcome {
    let grace = Duration::from_secs(EXEC_KILL_GRACE_SECS);
    let mut outcome = Outcome::default();
    let mut deadline = Instant::now() + timeout;
    let mut stage = Stage::Running;
    let mut buf = vec![0u8; PIPE_CHUNK];
    let mut fds = Vec::with_capacity(4);
    loop {
        // An error means the child is already gone (or was reaped): exited too.
        if exit_fd.is_none() && sys::has_exited(pgid).unwrap_or(true) {
            outcome.exited = true;
            return outcome;
        }
        fds.clear();
        let piped = pipes.watch(&mut fds);
        for fd in [
            exit_fd.map(|f| f.as_raw_fd()),
            signals.map(|s| s.as_fd().as_raw_fd()),
        ]
        .into_iter()
        .flatten()
        {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let mut wait = deadline.saturating_duration_since(Instant::now());
        if exit_fd.is_none() {
            wait = wait.min(EXIT_TICK);
        }
        if sys::poll(&mut fds, Some(wait)).is_err() {
            // Cannot wait any more: treat as ended; the caller kills the group.
            return outcome;
        }
        pipes.pump(&fds[..piped], &mut buf);
        let mut extra = fds[piped..].iter();
        if exit_fd.is_some() && extra.next().is_some_and(|f| f.revents != 0) {
            outcome.exited = true;
            return outcome;
        }
        if let Some(signals) = signals {
            if extra.next().is_some_and(|f| f.revents != 0) {
                while let Ok(Some(received)) = signals.read() {
                    let _ = sys::kill_process_group(pgid, received.signal);
                    if stage == Stage::Running {
                        stage = Stage::Terminating;
                        deadline = Instant::now() + grace;
                    }
                }
            }
        }
        if Instant::now() < deadline {
            continue;
        }
        match stage {
            Stage::Running => {
                outcome.timed_out = true;
                let _ = sys::kill_process_group(pgid, libc::SIGTERM);
                stage = Stage::Terminating;
                deadline = Instant::now() + grace;
            }
            Stage::Terminating => {
                let _ = sys::kill_process_group(pgid, libc::SIGKILL);
                stage = Stage::Killed;
                deadline = Instant::now() + KILL_WAIT;
            }
            Stage::Killed => return outcome,
        }
    }
}

fn reap(child: &mut Child) -> Option<ExitStatus> {
    loop {
        match child.wait() {
            Ok(status) => return Some(status),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
}

fn validate_env(env: &[(String, String)]) -> Result<(), OpError> {
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(op_error(
                OpErrorKind::BadRequest,
                format!("Invalid environment variable {key:?}: names must be non-empty without '=' or NUL, values without NUL."),
            ));
        }
    }
    Ok(())
}

fn check_cwd(cwd: &Path) -> Result<(), OpError> {
    let shown = cwd.display();
    match fs::metadata(cwd) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(op_error(
            OpErrorKind::BadRequest,
            format!("The working directory {shown} is not a directory."),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(op_error(
            OpErrorKind::NotFound,
            format!("The working directory {shown} does not exist."),
        )),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(op_error(
            OpErrorKind::PermissionDenied,
            format!("Permission denied: working directory {shown}"),
        )),
        Err(e) => Err(op_error(
            OpErrorKind::Io,
            format!("Cannot use the working directory {shown}: {e}"),
        )),
    }
}

fn spawn_error(err: &io::Error) -> OpError {
    match err.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => op_error(
            OpErrorKind::NoShell,
            format!(
                "Cannot run {SHELL} in this sandbox ({err}); read, write and patch still work."
            ),
        ),
        _ => op_error(OpErrorKind::Io, format!("Failed to start {SHELL}: {err}")),
    }
}

#[cfg(test)]
#[path = "exec_tests.rs"]
mod tests;
