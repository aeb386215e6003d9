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

/// Forks a child that installs the child seccomp filter and checks each blocked
/// call for EPERM (and that ordinary calls still work); the exit code says which
/// check failed.
#[test]
fn child_filter_blocks_tracing_calls() {
    let filter = crate::privdrop::child_filter().unwrap();
    let eperm = |rc: libc::c_long| -> bool {
        rc == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    };
    let child = || -> i32 {
        if set_no_new_privs().is_err() {
            return 2;
        }
        if install_seccomp(&filter).is_err() {
            return 3;
        }
        // SAFETY: raw system calls with integer or null arguments only; every one
        // of them is expected to be refused before it does anything.
        unsafe {
            if !eperm(libc::syscall(
                libc::SYS_ptrace,
                libc::PTRACE_TRACEME,
                0,
                0,
                0,
            )) {
                return 10;
            }
            let parent = libc::c_long::from(libc::getppid());
            // A sibling-style target: SEIZE (unlike ATTACH) would not stop the
            // parent even if the filter let it through.
            if !eperm(libc::syscall(
                libc::SYS_ptrace,
                libc::PTRACE_SEIZE,
                parent,
                0,
                0,
            )) {
                return 18;
            }
            let nul = ptr::null::<libc::iovec>();
            if !eperm(libc::syscall(
                libc::SYS_process_vm_readv,
                parent,
                nul,
                0,
                nul,
                0,
                0,
            )) {
                return 11;
            }
            if !eperm(libc::syscall(
                libc::SYS_process_vm_writev,
                parent,
                nul,
                0,
                nul,
                0,
                0,
            )) {
                return 12;
            }
            if !eperm(libc::syscall(libc::SYS_pidfd_getfd, 0, 0, 0)) {
                return 13;
            }
            if !eperm(libc::syscall(libc::SYS_kcmp, parent, parent, 0, 0, 0)) {
                return 14;
            }
            if !eperm(libc::syscall(libc::SYS_bpf, 0, 0, 0)) {
                return 15;
            }
            if !eperm(libc::syscall(libc::SYS_perf_event_open, 0, 0, -1, -1, 0)) {
                return 16;
            }
            if !eperm(libc::syscall(libc::SYS_userfaultfd, 0)) {
                return 17;
            }
            if libc::syscall(libc::SYS_getpid) <= 0 {
                return 20;
            }
        }
        0
    };
    // SAFETY: the child only makes raw system calls (no allocation, no locks: the
    // filter was built before the fork) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child();
        // SAFETY: _exit(2) ends the forked child without running the parent's
        // exit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer; `pid` is our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid);
    assert!(libc::WIFEXITED(status), "status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "a check failed in the child");
}

#[test]
fn signalfd_reports_the_sender() {
    std::thread::spawn(|| {
        let set = SignalSet::block(&[libc::SIGUSR1]).unwrap();
        let fd = SignalFd::new(&set).unwrap();
        assert_eq!(fd.read().unwrap(), None);
        // SAFETY: tgkill(2) to the calling thread with a blocked signal.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                libc::syscall(libc::SYS_gettid),
                libc::SIGUSR1,
            )
        };
        assert_eq!(rc, 0);
        let mut pfd = [libc::pollfd {
            fd: fd.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(poll(&mut pfd, Some(Duration::from_secs(5))).unwrap(), 1);
        let got = fd.read().unwrap().unwrap();
        assert_eq!(got.signal, libc::SIGUSR1);
        assert_eq!(got.sender, std::process::id());
    })
    .join()
    .unwrap();
}

#[test]
fn unix_connect_never_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    assert!(connect_unix(&path).is_err());
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let fd = connect_unix(&path).unwrap();
    let (peer, _) = listener.accept().unwrap();
    let cred_pid = {
        use std::io::Write;
        let mut file = std::fs::File::from(fd);
        file.write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        std::io::Read::read_exact(&mut &peer, &mut buf).unwrap();
        buf
    };
    assert_eq!(&cred_pid, b"hi");
    assert!(connect_unix(Path::new("")).is_err());
    assert!(connect_unix(&dir.path().join("x".repeat(200))).is_err());
}

#[test]
fn random_bytes_differ() {
    let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
    fill_random(&mut a).unwrap();
    fill_random(&mut b).unwrap();
    assert_ne!(a, b);
}
