//! `exec`: runs `/bin/sh -c <command>` in a new process group, captures its output
//! within a cap, enforces the timeout, and leaves nothing of the group behind.
//!
//! Threads, no async: two pump threads move stdout and stderr into a shared
//! [`Capture`]; a waiter thread blocks until the shell has exited *without reaping it*
//! (so its pid, which is the group id, cannot be reused); an optional signal thread
//! passes SIGTERM/SIGINT/SIGHUP sent to the shim on to the group. The calling thread
//! supervises: on timeout it sends SIGTERM to the group and SIGKILL after
//! [`EXEC_KILL_GRACE_SECS`]. Whenever the shell is gone — normally or not — the whole
//! group gets SIGKILL, so background children (`sleep 100 &`) do not survive, and the
//! pipes are drained for at most [`DRAIN_GRACE`]: a process that left the group
//! (`setsid`) and still holds them open cannot keep the reply waiting.
//!
//! With an `execId`, the command runs with `BEIGE_EXEC_ID=<id>` in its environment, so
//! a second `beige-shim op kill` can find its processes (see [`super::kill`]); the
//! `exec` then replies as usual, with the signal that ended the shell.

use std::fs;
use std::io::{self, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use beige_protocol::op::{
    ExecReply, ExecRequest, OpError, OpErrorKind, EXEC_ID_ENV, EXEC_KILL_GRACE_SECS,
};

use super::capture::{Capture, Stream};
use super::{op_error, Context};
use crate::sys::{self, SignalSet};

/// The shell every command runs under.
pub const SHELL: &str = "/bin/sh";

/// How long to wait for the pipes to reach end-of-file once the shell is dead and its
/// group killed.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

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

/// What the supervisor hears about.
#[derive(Debug)]
enum Event {
    /// The shell exited (not yet reaped).
    Exited,
    /// The shim received this signal.
    Signal(libc::c_int),
}

/// How the supervision ended.
#[derive(Debug, Default)]
struct Outcome {
    timed_out: bool,
    /// The shell exited and can be reaped.
    exited: bool,
}

/// Performs an `exec` request. With `forward_signals`, termination signals the shim
/// receives while the command runs are passed on to its process group.
pub fn exec(ctx: &Context, req: &ExecRequest, forward_signals: bool) -> Result<ExecReply, OpError> {
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
    // Block before any thread exists so every thread inherits the mask; the command
    // itself starts with an empty mask (`reset_signals_on_exec`).
    let signals = if forward_signals {
        SignalSet::block(&FORWARDED).ok()
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

    let started = Instant::now();
    let mut child = command.spawn().map_err(|e| spawn_error(&e))?;
    let pgid = child.id();

    let cap = usize::try_from(req.max_output_bytes).unwrap_or(usize::MAX);
    let capture = Arc::new(Mutex::new(Capture::new(cap)));
    let (drained_tx, drained_rx) = mpsc::channel::<()>();
    let mut pumps = 0;
    if let Some(out) = child.stdout.take() {
        spawn_pump(out, Stream::Stdout, &capture, drained_tx.clone());
        pumps += 1;
    }
    if let Some(err) = child.stderr.take() {
        spawn_pump(err, Stream::Stderr, &capture, drained_tx);
        pumps += 1;
    }

    let (events_tx, events) = mpsc::channel::<Event>();
    let waiter_tx = events_tx.clone();
    thread::spawn(move || {
        // An error here means the child is already gone (or was reaped): exited too.
        let _ = sys::wait_exit_keep_zombie(pgid);
        let _ = waiter_tx.send(Event::Exited);
    });
    if let Some(signals) = signals {
        thread::spawn(move || loop {
            match signals.wait(None) {
                Ok(Some(signal)) => {
                    if events_tx.send(Event::Signal(signal)).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(_) => return,
            }
        });
    }

    let timeout = Duration::from_secs(req.timeout_secs.clamp(1, MAX_TIMEOUT_SECS));
    let outcome = supervise(pgid, &events, timeout);
    let duration = started.elapsed();

    // Nothing of the group may outlive the command. The shell is still an unreaped
    // zombie here, so the group id cannot have been reused.
    let _ = sys::kill_process_group(pgid, libc::SIGKILL);
    let status = if outcome.exited {
        reap(&mut child)
    } else {
        None
    };

    let deadline = Instant::now() + DRAIN_GRACE;
    for _ in 0..pumps {
        let left = deadline.saturating_duration_since(Instant::now());
        if drained_rx.recv_timeout(left).is_err() {
            break;
        }
    }

    let capture = capture.lock().unwrap_or_else(PoisonError::into_inner);
    let stdout = capture.finish(Stream::Stdout);
    let stderr = capture.finish(Stream::Stderr);
    Ok(ExecReply {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        stdout: stdout.text,
        stderr: stderr.text,
        stdout_omitted: stdout.omitted,
        stderr_omitted: stderr.omitted,
        timed_out: outcome.timed_out,
        duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
    })
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

/// Waits for the shell to exit, enforcing the timeout and forwarding signals.
fn supervise(pgid: u32, events: &mpsc::Receiver<Event>, timeout: Duration) -> Outcome {
    let grace = Duration::from_secs(EXEC_KILL_GRACE_SECS);
    let mut outcome = Outcome::default();
    let mut deadline = Instant::now() + timeout;
    let mut stage = Stage::Running;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Exited) | Err(RecvTimeoutError::Disconnected) => {
                outcome.exited = true;
                return outcome;
            }
            Ok(Event::Signal(signal)) => {
                let _ = sys::kill_process_group(pgid, signal);
                if stage == Stage::Running {
                    stage = Stage::Terminating;
                    deadline = Instant::now() + grace;
                }
            }
            Err(RecvTimeoutError::Timeout) => match stage {
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
            },
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

fn spawn_pump(
    mut pipe: impl Read + Send + 'static,
    stream: Stream,
    capture: &Arc<Mutex<Capture>>,
    drained: mpsc::Sender<()>,
) {
    let capture = Arc::clone(capture);
    thread::spawn(move || {
        let mut buf = vec![0u8; PIPE_CHUNK];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => capture
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(stream, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = drained.send(());
    });
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
mod tests {
    use super::*;

    fn req(command: &str, timeout_secs: u64) -> ExecRequest {
        ExecRequest {
            command: command.into(),
            timeout_secs,
            env: Vec::new(),
            cwd: None,
            max_output_bytes: beige_protocol::op::DEFAULT_EXEC_MAX_OUTPUT_BYTES,
            exec_id: None,
        }
    }

    fn run(dir: &Path, r: &ExecRequest) -> ExecReply {
        exec(&Context::new(dir), r, false).unwrap()
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
            exec(&ctx, &r, false).unwrap_err().kind,
            OpErrorKind::BadRequest
        );
        let mut r = req("true", 10);
        r.exec_id = Some("bad id".into());
        assert_eq!(
            exec(&ctx, &r, false).unwrap_err().kind,
            OpErrorKind::BadRequest
        );
        let mut r = req("true", 10);
        r.cwd = Some("nope".into());
        assert_eq!(
            exec(&ctx, &r, false).unwrap_err().kind,
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
            thread::sleep(Duration::from_millis(50));
        }
    }
}
