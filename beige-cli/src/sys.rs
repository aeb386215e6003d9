//! The few process-level system calls the CLI needs: sending a signal to a pid, asking
//! whether a pid is a live process, and starting a child in a new session.
//!
//! This is the only module of the CLI with `unsafe` code; each block is one libc call
//! with plain integer arguments.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

pub use libc::SIGTERM;

/// Send `signal` to process `pid`.
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to signal pid {pid}"),
        ));
    }
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `pid` is a running process (a zombie, which has exited but is not reaped yet,
/// counts as gone).
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => match stat.rfind(')') {
            Some(i) => !matches!(stat[i + 1..].trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        Err(_) => {
            // No /proc: fall back to signal 0 (EPERM means it exists).
            // SAFETY: as in `kill`; signal 0 only checks.
            let rc = unsafe { libc::kill(pid, 0) };
            rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

/// The command line of `pid` as its arguments (empty when unknown).
pub fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Make `cmd` start its child in a new session (no controlling terminal, its own process
/// group), so the terminal's Ctrl+C and hang-up never reach it.
pub fn new_session(cmd: &mut Command) {
    // SAFETY: setsid(2) is async-signal-safe and the closure touches no shared state.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_nonsense_is_not() {
        assert!(alive(std::process::id() as i32));
        assert!(!alive(0));
        assert!(!alive(-1));
        assert!(kill(0, SIGTERM).is_err());
        assert!(!cmdline(std::process::id() as i32).is_empty());
    }
}
