//! Safe wrappers over the raw libc calls the shim needs. This is the only module of
//! the shim that contains `unsafe` code; everything else goes through the small, checked
//! functions below. What it wraps:
//!
//! - signals: blocking them ([`SignalSet`]) and reading them with the sender's pid from
//!   a signalfd ([`SignalFd`]), ignoring SIGPIPE, resetting mask and SIGPIPE for
//!   commands ([`reset_signals_on_exec`]);
//! - processes: signalling process groups and single processes (and, for PID 1 only,
//!   every process of the container), the own process group and ids, reaping children,
//!   learning of a child's exit without reaping it (pidfd, `waitid(WNOWAIT)`), making
//!   the process non-dumpable;
//! - file descriptors: bounded waits for readability, `poll(2)`, non-blocking mode,
//!   pipes, moving stdin and stdout out of reach of children (the attach carrier), a
//!   non-blocking Unix-socket connect (the Unix carrier and egress streams), a loopback
//!   TCP listener without address reuse (the egress proxy), random bytes;
//! - PID 1's op children ([`fork_agent_child`]): a fork with only the reply pipe (as
//!   stdout) and, for `exec`, the progress pipe (as descriptor [`PROGRESS_FD`],
//!   close-on-exec) left open, then the privilege drop below;
//! - the privilege drop of the agent's processes ([`drop_privileges`],
//!   `drop_privileges_on_exec` in tests): new session, agent uid and gid, empty capability sets
//!   (bounding, permitted, effective, inheritable, ambient), no_new_privs and the child
//!   seccomp filter (built in [`crate::privdrop`]).
//!
//! None of them can signal "all processes" unless the shim really is PID 1 of its PID
//! namespace.

#![allow(unsafe_code)]

#[cfg(test)]
use std::ffi::CString;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
#[cfg(test)]
use std::process::Command;
use std::ptr;
use std::time::{Duration, Instant};

use crate::privdrop::PrivDrop;

/// A set of signals blocked in the calling thread (and in every thread spawned from it
/// afterwards), to be received synchronously through a [`SignalFd`].
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
}

/// Makes large allocations (256 KiB and more) always their own mappings, returned to
/// the kernel when freed.
///
/// glibc otherwise raises its mmap threshold after the first large free and serves
/// later large buffers from the heap, which it keeps: after one 10 MiB `exec` output,
/// PID 1 would hold tens of MiB for the container's life, and every fork of it (each
/// op child) would copy the page tables for them. Best effort: a failure changes
/// nothing but memory use.
pub fn return_large_allocations() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
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

/// A pidfd for the child `pid`: it becomes readable once the child has exited (before
/// it is reaped). Needs Linux 5.3; callers fall back on [`has_exited`] without it.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: raw pidfd_open(2) with integer arguments only.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).unwrap_or(-1);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a freshly created descriptor (close-on-exec by default) that
    // nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the child `pid` has exited, without waiting and without reaping it (WNOWAIT).
pub fn has_exited(pid: u32) -> io::Result<bool> {
    let id = libc::id_t::from(pid);
    loop {
        // SAFETY: `siginfo_t` is plain old data; all-zero is a valid value to pass as an
        // out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer for the duration of the call.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                id,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            // SAFETY: waitid filled `info`; with WNOHANG an unchanged child leaves
            // si_pid 0, which reading the field reports.
            return Ok(unsafe { info.si_pid() } != 0);
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

/// A signal read from a [`SignalFd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceivedSignal {
    pub signal: libc::c_int,
    /// The sender's pid as seen from our PID namespace: 0 for the kernel and for
    /// senders outside the namespace (Docker, the kubelet).
    pub sender: u32,
}

/// A non-blocking, close-on-exec signalfd for the signals of a [`SignalSet`] (which
/// must stay blocked), to be watched with [`poll`].
#[derive(Debug)]
pub struct SignalFd {
    fd: OwnedFd,
}

impl SignalFd {
    pub fn new(set: &SignalSet) -> io::Result<Self> {
        // SAFETY: `set.set` is an initialised signal set; -1 asks for a new descriptor.
        let fd = unsafe { libc::signalfd(-1, &set.set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The next pending signal, or `None` when none is pending.
    pub fn read(&self) -> io::Result<Option<ReceivedSignal>> {
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        loop {
            // SAFETY: `signalfd_siginfo` is plain old data; all-zero is a valid value.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            // SAFETY: `info` is a valid, writable buffer of exactly `size` bytes and the
            // descriptor is owned by `self`.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    ptr::addr_of_mut!(info).cast::<libc::c_void>(),
                    size,
                )
            };
            if usize::try_from(n).ok() == Some(size) {
                return Ok(Some(ReceivedSignal {
                    signal: libc::c_int::try_from(info.ssi_signo).unwrap_or(0),
                    sender: info.ssi_pid,
                }));
            }
            if n >= 0 {
                return Err(io::Error::other("short read from the signalfd"));
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(None),
                Some(libc::EINTR) => continue,
                _ => return Err(err),
            }
        }
    }
}

impl AsFd for SignalFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `poll(2)` over `fds` (entries with a negative fd are skipped), waiting at most
/// `timeout` (`None`: without limit). An interruption counts as a timeout: callers
/// loop. Returns the number of entries with events.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let millis = match timeout {
        None => -1,
        // Round up so a sub-millisecond remainder still waits instead of spinning.
        Some(t) => libc::c_int::try_from(t.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX),
    };
    let count = libc::nfds_t::try_from(fds.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors"))?;
    // SAFETY: `fds` is a valid, exclusively borrowed array of `count` pollfds for the
    // duration of the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, millis) };
    if let Ok(n) = usize::try_from(rc) {
        return Ok(n);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINTR) {
        return Ok(0);
    }
    Err(err)
}

/// Puts `fd` into non-blocking mode.
/// Pipe capacity asked for where output moves in bulk: the command's output pipes and
/// an op's reply pipe. 1 MiB is the default most an unprivileged process may ask for
/// (`/proc/sys/fs/pipe-max-size`); 16 times the default 64 KiB means 16 times fewer
/// wake-ups of reader and writer for a large output.
pub const BULK_PIPE_SIZE: libc::c_int = 1 << 20;

/// Asks the kernel for a pipe of `size` bytes behind `fd`. Best effort: a refusal (a
/// lower `pipe-max-size`, the user's pipe budget spent) leaves the pipe as it is, which
/// only costs speed.
pub fn grow_pipe(fd: BorrowedFd<'_>, size: libc::c_int) {
    // SAFETY: fcntl(2) on a borrowed, open descriptor; F_SETPIPE_SZ takes an int.
    let _ = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl(2) on a borrowed, open descriptor; F_GETFL takes no argument.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; F_SETFL takes an int argument.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ignores SIGPIPE, so a write to a closed pipe or socket fails with EPIPE instead of
/// killing the process.
pub fn ignore_sigpipe() {
    // SAFETY: signal(2) with a valid signal number and SIG_IGN.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Makes the calling process non-dumpable: processes of other uids (and, without
/// CAP_SYS_PTRACE, of the same uid) can then neither trace it nor read its memory,
/// environment or file descriptors through `/proc`. Lasts until the process execs.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl(2) with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves stdin, stdout and stderr to new close-on-exec descriptors numbered 100 or
/// higher and reopens descriptors 0, 1 and 2 on `/dev/null`, so no child can reach the
/// originals. Returns the new `[stdin, stdout, stderr]`.
pub fn take_stdio() -> io::Result<[OwnedFd; 3]> {
    let dup_high = |fd: RawFd| -> io::Result<OwnedFd> {
        // SAFETY: fcntl(2) F_DUPFD_CLOEXEC only creates a new descriptor.
        let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
        if new < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `new` is a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(new) })
    };
    let taken = [dup_high(0)?, dup_high(1)?, dup_high(2)?];
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for target in 0..=2 {
        // SAFETY: dup2(2) onto the standard descriptors, which this process owns; the
        // source stays open for the duration of the call.
        if unsafe { libc::dup2(null.as_raw_fd(), target) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(taken)
}

/// Connects a non-blocking, close-on-exec Unix stream socket to `path` without ever
/// blocking: a listener whose backlog is full fails with EAGAIN instead of making the
/// caller wait.
pub fn connect_unix(path: &Path) -> io::Result<OwnedFd> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: `sockaddr_un` is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unusable Unix socket path",
        ));
    }
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX).unwrap_or(1);
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = libc::c_char::from_ne_bytes([src]);
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    let len = libc::socklen_t::try_from(len).unwrap_or(libc::socklen_t::MAX);
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `addr` is an initialised `sockaddr_un` and `len` does not exceed its size.
    let rc = unsafe {
        libc::connect(
            owned.as_raw_fd(),
            ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// Backlog of [`listen_tcp`]: connections the kernel completes before PID 1 accepts
/// them.
const TCP_BACKLOG: libc::c_int = 128;

/// A TCP listener on `127.0.0.1:port` (0: a port the kernel picks); see [`listen_tcp`].
pub fn listen_tcp_loopback(port: u16) -> io::Result<OwnedFd> {
    listen_tcp(Ipv4Addr::LOCALHOST, port)
}

/// A TCP listener on `ip:port` (0: a port the kernel picks), made with plain `socket`,
/// `bind` and `listen`: non-blocking, close-on-exec, and with neither `SO_REUSEADDR`
/// nor `SO_REUSEPORT` (std's `TcpListener::bind` sets `SO_REUSEADDR`), so no other
/// socket can share the port while it is open.
pub fn listen_tcp(ip: Ipv4Addr, port: u16) -> io::Result<OwnedFd> {
    let owned = bound_socket(libc::SOCK_STREAM, ip, port)?;
    // SAFETY: listen(2) on a bound socket this function owns.
    if unsafe { libc::listen(owned.as_raw_fd(), TCP_BACKLOG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// A UDP socket bound to `ip:port` (0: a port the kernel picks): non-blocking,
/// close-on-exec, with neither `SO_REUSEADDR` nor `SO_REUSEPORT` (UDP sockets share a
/// port when both set `SO_REUSEADDR`).
pub fn bind_udp(ip: Ipv4Addr, port: u16) -> io::Result<OwnedFd> {
    bound_socket(libc::SOCK_DGRAM, ip, port)
}

/// A non-blocking, close-on-exec IPv4 socket of `kind` bound to `ip:port`, no socket
/// options set.
fn bound_socket(kind: libc::c_int, ip: Ipv4Addr, port: u16) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            kind | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a freshly created descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `sockaddr_in` is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2);
    addr.sin_port = port.to_be();
    addr.sin_addr.s_addr = u32::from(ip).to_be();
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_in>())
        .unwrap_or(libc::socklen_t::MAX);
    // SAFETY: `addr` is an initialised `sockaddr_in` of exactly `len` bytes.
    let rc = unsafe {
        libc::bind(
            owned.as_raw_fd(),
            ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// The integer value of a socket option (`getsockopt(2)`).
#[cfg(test)]
pub fn socket_option(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: `value` and `len` are valid out-pointers sized for an int option.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            ptr::addr_of_mut!(value).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// The descriptor flags (`F_GETFD`) of descriptor number `fd`; `EBADF` when it is not
/// open. Async-signal-safe, so a forked child may call it.
#[cfg(test)]
pub fn descriptor_flags(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: fcntl(2) F_GETFD on a descriptor number; a closed one only yields EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags)
}

/// The file status flags (`F_GETFL`, e.g. `O_NONBLOCK`) of `fd`.
#[cfg(test)]
pub fn status_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: fcntl(2) F_GETFL on a borrowed, open descriptor.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags)
}

/// Waits for the child `pid` to exit, reaps it and returns its exit code (128 plus the
/// signal number when a signal ended it).
#[cfg(test)]
pub fn wait_exit_code(pid: u32) -> io::Result<i32> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid out-pointer; only the child `pid` is waited for.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            if libc::WIFEXITED(status) {
                return Ok(libc::WEXITSTATUS(status));
            }
            return Ok(128 + libc::WTERMSIG(status));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Fills `buf` with random bytes from the kernel.
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(n) {
            Ok(n) => filled += n,
            Err(_) => {
                let err = io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EINTR) {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

/// The effective uid of the calling process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// The real uid of the calling process.
pub fn real_uid() -> u32 {
    // SAFETY: getuid(2) takes no arguments and cannot fail.
    unsafe { libc::getuid() }
}

/// Whether capability `cap` is in the bounding set; `None` when the kernel does not
/// know that capability number.
pub fn bounding_set_has(cap: u32) -> Option<bool> {
    // SAFETY: prctl(2) with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) };
    (rc >= 0).then_some(rc > 0)
}

/// Why a privilege drop failed: the step and its errno. Built without allocating, so
/// it can be produced between fork and exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropFailure {
    pub step: &'static str,
    pub errno: i32,
}

impl fmt::Display for DropFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {}",
            self.step,
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for DropFailure {}

/// The syscall numbers taking 32-bit ids (the plain ones on 64-bit targets).
#[cfg(any(target_arch = "x86", target_arch = "arm"))]
mod id_calls {
    pub const SETGROUPS: libc::c_long = libc::SYS_setgroups32;
    pub const SETRESGID: libc::c_long = libc::SYS_setresgid32;
    pub const SETRESUID: libc::c_long = libc::SYS_setresuid32;
}
#[cfg(not(any(target_arch = "x86", target_arch = "arm")))]
mod id_calls {
    pub const SETGROUPS: libc::c_long = libc::SYS_setgroups;
    pub const SETRESGID: libc::c_long = libc::SYS_setresgid;
    pub const SETRESUID: libc::c_long = libc::SYS_setresuid;
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit data words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn failed(step: &'static str) -> DropFailure {
    DropFailure {
        step,
        errno: io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    }
}

/// Sets no_new_privs for the calling thread (and everything it execs).
pub fn set_no_new_privs() -> Result<(), DropFailure> {
    // SAFETY: prctl(2) with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(failed("PR_SET_NO_NEW_PRIVS"));
    }
    Ok(())
}

/// Installs a seccomp filter on the calling thread (no_new_privs must be set, or the
/// thread must hold CAP_SYS_ADMIN). Async-signal-safe.
pub fn install_seccomp(filter: &[libc::sock_filter]) -> Result<(), DropFailure> {
    let Ok(len) = libc::c_ushort::try_from(filter.len()) else {
        return Err(DropFailure {
            step: "seccomp",
            errno: libc::EINVAL,
        });
    };
    let prog = libc::sock_fprog {
        len,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `len` valid instructions that outlive the call; the
    // kernel copies the program and never writes through the pointer.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::c_ulong::from(libc::SECCOMP_MODE_FILTER),
            ptr::addr_of!(prog),
        )
    };
    if rc != 0 {
        return Err(failed("seccomp"));
    }
    Ok(())
}

/// Applies a prepared privilege drop to the calling thread, in the order described in
/// [`crate::privdrop`]: setsid (EPERM, i.e. already a group leader, is ignored);
/// setgroups, setresgid, clearing the bounding set and setresuid when the plan switches
/// ids; capset to all-zero sets; clearing the ambient set; no_new_privs; the seccomp
/// filter.
///
/// Only raw system calls, no allocation and no locks, so it is async-signal-safe and may
/// run between fork and exec. The ids change for the calling thread only: the process
/// must be single-threaded (a fresh child, or an `op` process before it starts threads).
pub fn drop_privileges(plan: &PrivDrop) -> Result<(), DropFailure> {
    // SAFETY: setsid(2) has no memory-safety requirements.
    if unsafe { libc::setsid() } < 0 {
        let err = failed("setsid");
        if err.errno != libc::EPERM {
            return Err(err);
        }
    }
    if let Some((uid, gid)) = plan.ids() {
        let groups: [libc::gid_t; 1] = [gid];
        // SAFETY: `groups` is a valid array of one gid for the duration of the call.
        if unsafe { libc::syscall(id_calls::SETGROUPS, 1 as libc::c_long, groups.as_ptr()) } != 0 {
            return Err(failed("setgroups"));
        }
        let gid = gid as libc::c_long;
        // SAFETY: raw setresgid(2) with integer arguments only.
        if unsafe { libc::syscall(id_calls::SETRESGID, gid, gid, gid) } != 0 {
            return Err(failed("setresgid"));
        }
        for cap in 0..=plan.last_cap() {
            let cap = libc::c_ulong::from(cap);
            // SAFETY: prctl(2) with integer arguments only.
            let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
            if present < 0 {
                return Err(failed("PR_CAPBSET_READ"));
            }
            // SAFETY: as above.
            if present > 0 && unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
                return Err(failed("PR_CAPBSET_DROP"));
            }
        }
        let uid = uid as libc::c_long;
        // SAFETY: raw setresuid(2) with integer arguments only.
        if unsafe { libc::syscall(id_calls::SETRESUID, uid, uid, uid) } != 0 {
            return Err(failed("setresuid"));
        }
    }
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: `header` and the two `data` entries (as version 3 requires) are valid for
    // the duration of the call; capset(2) only reads `data`.
    let rc = unsafe { libc::syscall(libc::SYS_capset, ptr::addr_of_mut!(header), data.as_ptr()) };
    if rc != 0 {
        return Err(failed("capset"));
    }
    // SAFETY: prctl(2) with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::c_ulong::try_from(libc::PR_CAP_AMBIENT_CLEAR_ALL).unwrap_or(4),
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    // EINVAL: a kernel without ambient capabilities (before 4.3) has none to clear.
    if rc != 0 {
        let err = failed("PR_CAP_AMBIENT_CLEAR_ALL");
        if err.errno != libc::EINVAL {
            return Err(err);
        }
    }
    set_no_new_privs()?;
    install_seccomp(plan.filter())
}

/// A pipe, both ends close-on-exec: `(read end, write end)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [libc::c_int; 2] = [-1, -1];
    // SAFETY: `fds` is a valid array of two ints for pipe2(2) to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Descriptor 0 as an owned handle, for a child of [`fork_agent_child`] whose `stdin`
/// was a connection it now owns alone (a spawn child, [`crate::spawn`]). Call it once.
pub fn take_descriptor_0() -> OwnedFd {
    // SAFETY: descriptor 0 is open (fork_agent_child put the caller's `stdin` there)
    // and, as documented, nothing else in this process owns or closes it.
    unsafe { OwnedFd::from_raw_fd(0) }
}

/// The descriptor number of the progress pipe in an op child of PID 1
/// ([`fork_agent_child`] with a progress pipe).
pub const PROGRESS_FD: RawFd = 3;

/// Where [`fork_agent_child`] returns.
#[derive(Debug)]
pub enum Forked {
    /// In the caller, with the child's pid.
    Parent(u32),
    /// In the child, already the agent user, with descriptor [`PROGRESS_FD`] when a
    /// progress pipe was given: `Err` names the step that failed (the child must then
    /// report and [`exit_now`] without running anything).
    Child(Result<Option<OwnedFd>, DropFailure>),
}

/// Forks a child that performs an operation *in process* as the agent user, saving the
/// `execve` of a second shim (about 0.7 ms on a small machine).
///
/// In the child: `stdin`, when given, becomes descriptor 0 (a warm child reads its op
/// from it); `reply` becomes descriptor 1; `progress`, when given (PID 1's
/// `exec` ops), becomes descriptor [`PROGRESS_FD`] (3), close-on-exec, so only the op
/// process itself can write to it — never the commands it runs; every other descriptor
/// above 2 is closed (the link, the signalfd, other operations' pipes — nothing of PID 1
/// stays reachable). The process is made non-dumpable, drops privileges per `plan`
/// ([`drop_privileges`]), changes to `workdir` (or `/`), and unblocks every signal.
/// SIGPIPE is at its default, except with a progress pipe: then it is ignored, because
/// PID 1 may stop reading that pipe at any time and a write to it must fail with EPIPE
/// rather than kill the op (commands get SIGPIPE back, [`reset_signals_on_exec`]).
///
/// The caller must be single-threaded (PID 1's loop is), so the child may allocate and
/// run ordinary code; it must end with [`exit_now`], never return to the caller's loop.
/// In the child the caller's handles of `stdin`, `reply` and `progress` (and of anything else it
/// held) name closed or reused descriptor numbers: they must be forgotten, not dropped.
pub fn fork_agent_child(
    plan: &PrivDrop,
    workdir: &std::ffi::CStr,
    reply: &OwnedFd,
    progress: Option<&OwnedFd>,
    stdin: Option<&OwnedFd>,
) -> io::Result<Forked> {
    // SAFETY: fork(2) in a single-threaded process (documented requirement): the child
    // owns a consistent copy of the address space, so running ordinary code is sound.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(Forked::Parent(u32::try_from(pid).unwrap_or(0)));
    }
    let step = |step: &'static str| DropFailure {
        step,
        errno: io::Error::last_os_error().raw_os_error().unwrap_or(0),
    };
    let setup = || -> Result<Option<OwnedFd>, DropFailure> {
        // SAFETY: dup2(2) of a descriptor this process owns onto descriptor 1.
        if unsafe { libc::dup2(reply.as_raw_fd(), 1) } < 0 {
            return Err(step("dup2"));
        }
        if let Some(fd) = stdin {
            // SAFETY: dup2(2) of a descriptor this process owns onto descriptor 0.
            if unsafe { libc::dup2(fd.as_raw_fd(), 0) } < 0 {
                return Err(step("dup2"));
            }
        }
        let progress = match progress {
            Some(fd) => {
                // SAFETY: dup2(2) of a descriptor this process owns onto descriptor 3
                // (whatever was there belongs to PID 1's state and must go anyway). When
                // `fd` already is 3 this does nothing, which is as good.
                if unsafe { libc::dup2(fd.as_raw_fd(), PROGRESS_FD) } < 0 {
                    return Err(step("dup2"));
                }
                // SAFETY: fcntl(2) F_SETFD with an integer argument on descriptor 3, open
                // since the dup2 above. dup2 cleared close-on-exec; it must be set again
                // so no command the op starts inherits the pipe.
                if unsafe { libc::fcntl(PROGRESS_FD, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
                    return Err(step("fcntl(F_SETFD)"));
                }
                close_from(4);
                // SAFETY: descriptor 3 is open (above) and this is its only owner in the
                // child: the caller's handles are never dropped here (documented
                // requirement), so nothing else closes it.
                Some(unsafe { OwnedFd::from_raw_fd(PROGRESS_FD) })
            }
            None => {
                close_from(3);
                None
            }
        };
        // SAFETY: prctl(2) with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(step("PR_SET_DUMPABLE"));
        }
        drop_privileges(plan)?;
        // SAFETY: chdir(2) with NUL-terminated strings that outlive the call.
        if unsafe { libc::chdir(workdir.as_ptr()) } != 0 {
            // SAFETY: as above.
            unsafe { libc::chdir(c"/".as_ptr()) };
        }
        let sigpipe = if progress.is_some() {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        // SAFETY: `sigset_t` is plain old data; sigemptyset initialises it.
        let mut empty: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `empty` is a valid, exclusively borrowed `sigset_t`; a null old-mask
        // pointer is allowed; SIG_IGN and SIG_DFL are valid dispositions.
        unsafe {
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, ptr::null_mut());
            libc::signal(libc::SIGPIPE, sigpipe);
        }
        Ok(progress)
    };
    Ok(Forked::Child(setup()))
}

/// Closes every descriptor numbered `first` or higher (close_range(2), or one by one
/// from `/proc/self/fd` on kernels before 5.9).
fn close_from(first: u32) {
    // SAFETY: close_range(2) with integer arguments only; closing descriptors this
    // process owns (all of them are its own after fork).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    if rc == 0 {
        return;
    }
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        if fd >= first as RawFd {
            // SAFETY: close(2) of a descriptor number; a stale one (the directory
            // handle itself) only yields EBADF.
            unsafe { libc::close(fd) };
        }
    }
}

/// Ends the calling process at once with `code`, without running destructors or
/// flushing anything of a forked parent's state (`_exit(2)`).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) never returns and has no memory-safety requirements.
    unsafe { libc::_exit(code) }
}

/// Makes `command` apply `plan` between fork and exec ([`drop_privileges`]), then change
/// to `workdir` (or `/` when the agent user cannot enter it), then start with an empty
/// signal mask and SIGPIPE at its default ([`reset_signals_on_exec`]). A failed drop
/// makes the spawn fail with its errno; nothing is executed.
///
/// Ids must not be set with `Command::uid`/`gid`: std applies those before `pre_exec`
/// closures run, too early to clear the bounding set.
#[cfg(test)]
pub fn drop_privileges_on_exec(command: &mut Command, plan: PrivDrop, workdir: CString) {
    use std::os::unix::process::CommandExt;
    let hook = move || {
        drop_privileges(&plan).map_err(|f| io::Error::from_raw_os_error(f.errno))?;
        // SAFETY: chdir(2) with NUL-terminated strings that outlive the call.
        if unsafe { libc::chdir(workdir.as_ptr()) } != 0 {
            // SAFETY: as above.
            unsafe { libc::chdir(c"/".as_ptr()) };
        }
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe raw system calls; the plan and
    // the path were prepared before fork, so it neither allocates nor takes locks, as
    // `pre_exec` requires.
    unsafe {
        command.pre_exec(hook);
    }
    reset_signals_on_exec(command);
}

#[cfg(test)]
#[path = "sys_tests.rs"]
mod tests;
