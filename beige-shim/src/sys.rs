//! Safe wrappers over the few raw libc calls the shim needs: blocking and waiting for
//! signals, sending signals to process groups and single processes (and, for PID 1
//! only, to every process of the container), reading the own process group, reaping
//! children, waiting for a child's exit without reaping it, and waiting (bounded) for a
//! file descriptor to become readable.
//!
//! This is the only module of the shim that contains `unsafe` code. Everything else goes
//! through the small, checked functions below; none of them can signal "all processes"
//! unless the shim really is PID 1 of its PID namespace.

#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;
use std::time::{Duration, Instant};

/// A set of signals blocked in the calling thread (and in every thread spawned from it
/// afterwards), to be received synchronously with [`SignalSet::wait`].
///
/// Child processes do not inherit the mask: `std::process::Command` resets it.
pub struct SignalSet {
    set: libc::sigset_t,
}

impl fmt::Debug for SignalSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignalSet").finish_non_exhaustive()
    }
}

impl SignalSet {
    /// Blocks `signals` in the calling thread and returns the set for waiting.
    pub fn block(signals: &[libc::c_int]) -> io::Result<Self> {
        // SAFETY: `sigset_t` is plain old data; an all-zero value is a valid bit pattern
        // and `sigemptyset` below initialises it properly before any other use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, exclusively borrowed `sigset_t`.
        if unsafe { libc::sigemptyset(&mut set) } != 0 {
            return Err(io::Error::last_os_error());
        }
        for &signal in signals {
            // SAFETY: `set` is a valid, initialised `sigset_t`; an invalid signal number
            // is reported through the return value.
            if unsafe { libc::sigaddset(&mut set, signal) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: `set` is initialised; a null pointer for the old mask is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Self { set })
    }

    /// Waits until one of the signals is pending and consumes it. With a timeout,
    /// returns `Ok(None)` when it expires; an interruption also yields `Ok(None)`, so
    /// callers simply loop.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Option<libc::c_int>> {
        let rc = match timeout {
            None => {
                // SAFETY: `self.set` is an initialised signal set; a null `siginfo_t`
                // pointer is allowed by sigwaitinfo(2).
                unsafe { libc::sigwaitinfo(&self.set, ptr::null_mut()) }
            }
            Some(timeout) => {
                // `c_long` is 32 bits on 32-bit targets, where the conversion can fail.
                #[allow(clippy::unnecessary_fallible_conversions)]
                let ts = libc::timespec {
                    tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
                    tv_nsec: libc::c_long::try_from(timeout.subsec_nanos()).unwrap_or(0),
                };
                // SAFETY: `self.set` and `ts` are valid for the duration of the call; a
                // null `siginfo_t` pointer is allowed by sigtimedwait(2).
                unsafe { libc::sigtimedwait(&self.set, ptr::null_mut(), &ts) }
            }
        };
        if rc >= 0 {
            return Ok(Some(rc));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(err),
        }
    }
}

/// Makes `command` start with an empty signal mask and SIGPIPE at its default action,
/// whatever the shim has blocked or ignored.
///
/// Needed because the mask is inherited across fork and exec, and std resets it only on
/// some spawn paths (the statically linked shim takes one that does not), so a command
/// could otherwise start with SIGTERM blocked and be deaf to the timeout.
pub fn reset_signals_on_exec(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let reset = || {
        // SAFETY: `sigset_t` is plain old data; all-zero is a valid value and
        // sigemptyset initialises it.
        let mut empty: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `empty` is a valid, exclusively borrowed `sigset_t`.
        unsafe { libc::sigemptyset(&mut empty) };
        // SAFETY: async-signal-safe calls with valid arguments, as required between
        // fork and exec; a null old-mask pointer is allowed.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &empty, ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        // SAFETY: signal(2) is async-signal-safe; SIG_DFL is a valid disposition.
        if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) } == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure only calls async-signal-safe functions (sigemptyset,
    // pthread_sigmask, signal), does not allocate and touches no shared state, as
    // `pre_exec` requires.
    unsafe {
        command.pre_exec(reset);
    }
}

/// Sends `signal` to every process of the process group `pgid`.
///
/// Refuses group ids 0 and 1, which would mean "my own group" or "everything" to
/// kill(2). A group that no longer exists is not an error.
pub fn kill_process_group(pgid: u32, signal: libc::c_int) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid)
        .ok()
        .filter(|&p| p > 1)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "refusing to signal process group 0 or 1",
            )
        })?;
    // SAFETY: kill(2) has no memory-safety requirements; a negative pid addresses the
    // process group `pgid` (> 1, checked above).
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(err)
}

/// Sends `signal` to the single process `pid`.
///
/// Refuses pids 0 and 1 and the calling process itself (kill(2) would read 0 as "my
/// group"; 1 is the container's init). A process that no longer exists is not an error.
pub fn kill_process(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let target = libc::pid_t::try_from(pid)
        .ok()
        .filter(|&p| p > 1 && pid != std::process::id())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "refusing to signal process 0, 1 or the shim itself",
            )
        })?;
    // SAFETY: kill(2) has no memory-safety requirements; `target` is a positive pid
    // (> 1, checked above), so exactly one process is addressed.
    let rc = unsafe { libc::kill(target, signal) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(err)
}

/// The process-group id of the calling process.
pub fn own_process_group() -> u32 {
    // SAFETY: getpgrp(2) takes no arguments, has no memory-safety requirements and
    // cannot fail.
    let pgid = unsafe { libc::getpgrp() };
    u32::try_from(pgid).unwrap_or(0)
}

/// Whether the shim runs as PID 1 of its PID namespace (the container's init).
pub fn is_pid1() -> bool {
    std::process::id() == 1
}

/// Sends `signal` to every process this process may signal, except itself:
/// `kill(-1, signal)`. Only allowed as PID 1 (inside a container that is "every other
/// process of the container"); anywhere else it would hit every process of the user,
/// so it is refused.
///
/// Returns whether at least one process received the signal.
pub fn signal_all_as_pid1(signal: libc::c_int) -> io::Result<bool> {
    if !is_pid1() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "only PID 1 may signal every process",
        ));
    }
    // SAFETY: kill(2) has no memory-safety requirements; -1 addresses every process the
    // caller may signal except itself, which as PID 1 of a container is its own tree.
    let rc = unsafe { libc::kill(-1, signal) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        // ESRCH: nobody else exists; EPERM: only processes we may not signal remain.
        Some(libc::ESRCH) | Some(libc::EPERM) => Ok(false),
        _ => Err(err),
    }
}

/// Reaps every child that has exited, without blocking. Returns whether children
/// (running ones) remain.
pub fn reap_exited_children() -> bool {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid out-pointer; WNOHANG makes the call non-blocking.
        let rc = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if rc > 0 {
            continue;
        }
        if rc == 0 {
            return true;
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        // ECHILD: no children at all.
        return false;
    }
}

/// Blocks until the child `pid` has exited, but leaves it a zombie (WNOWAIT), so its
/// pid — and therefore its process-group id — cannot be reused until the caller reaps
/// it with `Child::wait`. That makes a following [`kill_process_group`] safe.
pub fn wait_exit_keep_zombie(pid: u32) -> io::Result<()> {
    let id = libc::id_t::from(pid);
    loop {
        // SAFETY: `siginfo_t` is plain old data; all-zero is a valid value to pass as an
        // out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer for the duration of the call.
        let rc = unsafe { libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Waits up to `timeout` for `fd` to become readable and returns whether it did.
///
/// "Readable" means a read would not block: data is there, or the other end is gone
/// (end of file, POLLHUP) or in error — the following read reports which. An invalid
/// descriptor (POLLNVAL) is an error. Interruptions by signals are retried with the
/// remaining time.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        // Round up so a sub-millisecond remainder still waits instead of spinning.
        let millis = remaining.as_micros().div_ceil(1000);
        let millis = libc::c_int::try_from(millis).unwrap_or(libc::c_int::MAX);
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid, exclusively borrowed array of exactly one pollfd for
        // the duration of the call; `fd` is borrowed, so it stays open meanwhile.
        let rc = unsafe { libc::poll(&mut pfd, 1, millis) };
        if rc > 0 {
            if pfd.revents & libc::POLLNVAL != 0 {
                return Err(io::Error::from_raw_os_error(libc::EBADF));
            }
            return Ok(pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0);
        }
        if rc == 0 {
            return Ok(false);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_dangerous_groups() {
        assert!(kill_process_group(0, 0).is_err());
        assert!(kill_process_group(1, 0).is_err());
        if !is_pid1() {
            assert!(signal_all_as_pid1(0).is_err());
        }
    }

    #[test]
    fn refuses_dangerous_processes() {
        assert!(kill_process(0, 0).is_err());
        assert!(kill_process(1, 0).is_err());
        assert!(kill_process(std::process::id(), 0).is_err());
        assert!(kill_process(0x7fff_fff0, 0).is_ok());
        let pgid = own_process_group();
        assert!(pgid > 0);
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(fields[2], pgid.to_string());
    }

    #[test]
    fn missing_group_is_not_an_error() {
        // Pid numbers this large are never allocated (pid_max is at most 2^22).
        assert!(kill_process_group(0x7fff_fff0, 0).is_ok());
    }

    #[test]
    fn commands_start_with_an_empty_mask() {
        // Block in a helper thread so the test harness's other threads are unaffected.
        std::thread::spawn(|| {
            let _set = SignalSet::block(&[libc::SIGTERM, libc::SIGHUP]).unwrap();
            let mut cmd = std::process::Command::new("/bin/sh");
            // `exec`: grep reads its own status, inherited from the shell. Reading the
            // shell's while it forks races with the all-signals mask the shell's libc
            // may hold during the fork.
            cmd.args(["-c", "exec grep -E '^SigBlk' /proc/self/status"]);
            reset_signals_on_exec(&mut cmd);
            let out = cmd.output().unwrap();
            let text = String::from_utf8(out.stdout).unwrap();
            assert_eq!(text.trim(), "SigBlk:\t0000000000000000");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn timed_wait_expires() {
        let set = SignalSet::block(&[libc::SIGUSR2]).unwrap();
        let got = set.wait(Some(Duration::from_millis(20))).unwrap();
        assert_eq!(got, None);
    }

    #[test]
    fn readable_after_write_or_hangup_but_not_when_idle() {
        use std::io::Write;
        use std::os::fd::AsFd;
        use std::os::unix::net::UnixStream;
        let (a, mut b) = UnixStream::pair().unwrap();
        let started = Instant::now();
        assert!(!wait_readable(a.as_fd(), Duration::from_millis(30)).unwrap());
        assert!(started.elapsed() >= Duration::from_millis(25));
        b.write_all(b"x").unwrap();
        assert!(wait_readable(a.as_fd(), Duration::from_millis(30)).unwrap());
        let (c, d) = UnixStream::pair().unwrap();
        drop(d);
        assert!(wait_readable(c.as_fd(), Duration::ZERO).unwrap());
    }
}
