//! The `init` role: PID 1 of a sandbox container.
//!
//! It owns the container's process lifetime and nothing else: it sleeps in a blocking
//! signal wait, reaps every orphan that is re-parented to it, forwards termination
//! signals to all other processes of the container, and after SIGTERM or SIGINT exits
//! once they are gone (or after [`SHUTDOWN_GRACE`], killing the rest). It never spawns
//! anything and never touches files.
//!
//! When it is not PID 1 (for example behind Docker's `--init`), it does not forward
//! signals — `kill(-1)` would then reach far more than the container — and simply exits
//! on SIGTERM or SIGINT, leaving the real init to clean up.

use std::time::{Duration, Instant};

use crate::sys::{self, SignalSet};

/// How long to wait for other processes after a SIGTERM before killing them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// While shutting down, how often to look whether other processes still exist. Exec'd
/// processes are not our children, so their exit sends us no SIGCHLD.
const SHUTDOWN_POLL: Duration = Duration::from_millis(100);

/// Signals forwarded to every other process of the container.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Runs the init loop; returns the process exit code.
pub fn run(extra_args: &[String]) -> i32 {
    if !extra_args.is_empty() {
        // Docker appends an image's CMD to the entrypoint; it is not ours to run.
        eprintln!("beige-shim init: ignoring arguments {extra_args:?}");
    }
    let pid1 = sys::is_pid1();
    let mut signals = vec![libc::SIGCHLD];
    signals.extend_from_slice(&FORWARDED);
    let set = match SignalSet::block(&signals) {
        Ok(set) => set,
        Err(err) => {
            eprintln!("beige-shim init: cannot block signals: {err}");
            return 1;
        }
    };

    let mut shutdown_deadline: Option<Instant> = None;
    loop {
        let timeout = shutdown_deadline.map(|_| SHUTDOWN_POLL);
        let signal = match set.wait(timeout) {
            Ok(signal) => signal,
            Err(err) => {
                eprintln!("beige-shim init: waiting for signals failed: {err}");
                return 1;
            }
        };
        if let Some(signal) = signal.filter(|&s| s != libc::SIGCHLD) {
            if pid1 {
                if let Err(err) = sys::signal_all_as_pid1(signal) {
                    eprintln!("beige-shim init: forwarding signal {signal} failed: {err}");
                }
            }
            if (signal == libc::SIGTERM || signal == libc::SIGINT) && shutdown_deadline.is_none() {
                shutdown_deadline = Some(Instant::now() + SHUTDOWN_GRACE);
            }
        }
        // Any wake-up is a good moment to collect zombies; SIGCHLDs coalesce.
        sys::reap_exited_children();

        if let Some(deadline) = shutdown_deadline {
            if !pid1 || !others_alive() {
                return 0;
            }
            if Instant::now() >= deadline {
                let _ = sys::signal_all_as_pid1(libc::SIGKILL);
                sys::reap_exited_children();
                return 0;
            }
        }
    }
}

/// Whether any other process we may signal still exists (signal 0 only checks).
fn others_alive() -> bool {
    sys::signal_all_as_pid1(0).unwrap_or(false)
}
