//! `kill`: ends the processes of a running `exec`, from a second `beige-shim op kill`.
//!
//! An `exec` started with an `execId` puts `BEIGE_EXEC_ID=<id>` into its command's
//! environment, so every process of the command carries it, including those that left
//! the command's process group (`setsid`). `kill` finds them by scanning
//! `/proc/<pid>/environ` (readable for processes of the same user; the others are
//! skipped silently), sends SIGTERM to their process groups, polls every [`POLL`] for up
//! to [`EXEC_KILL_GRACE_SECS`] until none is left, then sends SIGKILL to the groups and
//! to every matching process still there. The `op exec` that ran the command then
//! replies as usual, with the signal that ended its shell.
//!
//! Never signalled: process groups 0 and 1, the group of this shim (when `kill` runs
//! inside the very command it kills, its own group is the command's; its processes are
//! then signalled one by one), and this shim itself.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use beige_protocol::op::{
    is_valid_exec_id, KillReply, KillRequest, OpError, OpErrorKind, EXEC_ID_ENV,
    EXEC_KILL_GRACE_SECS, MAX_EXEC_ID_LEN,
};

use super::op_error;
use crate::sys;

/// Where the processes are listed.
const PROC: &str = "/proc";

/// Pause between two scans of `/proc`.
const POLL: Duration = Duration::from_millis(50);

/// How long to wait for the processes to vanish after SIGKILL (a process in
/// uninterruptible sleep may take a moment), re-sending SIGKILL to newcomers.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// One process seen in `/proc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Proc {
    pid: u32,
    /// Process-group id (field 5 of `/proc/<pid>/stat`).
    pgid: u32,
    /// A zombie (or dead) process: it has ended and only waits to be reaped.
    ended: bool,
    /// Its environment holds the exec id entry.
    matches: bool,
}

/// Refuses exec ids outside `[A-Za-z0-9_-]{1,64}` with `bad_request`.
pub fn check_exec_id(id: &str) -> Result<(), OpError> {
    if is_valid_exec_id(id) {
        return Ok(());
    }
    let shown: String = id.chars().take(MAX_EXEC_ID_LEN + 8).collect();
    let more = if shown.len() < id.len() { "…" } else { "" };
    Err(op_error(
        OpErrorKind::BadRequest,
        format!(
            "Invalid exec id {shown:?}{more}: it must be 1 to {MAX_EXEC_ID_LEN} characters \
             of A-Z, a-z, 0-9, '_' and '-'."
        ),
    ))
}

/// Performs a `kill` request.
pub fn kill(req: &KillRequest) -> Result<KillReply, OpError> {
    check_exec_id(&req.exec_id)?;
    let entry = format!("{EXEC_ID_ENV}={}", req.exec_id);
    let killer = Killer {
        root: Path::new(PROC),
        entry: entry.as_bytes(),
        me: std::process::id(),
        own_group: sys::own_process_group(),
    };
    let first = killer.scan().map_err(|err| {
        op_error(
            OpErrorKind::Io,
            format!("Cannot list the processes in {PROC}: {err}"),
        )
    })?;
    let found = killer.run(first, Duration::from_secs(EXEC_KILL_GRACE_SECS));
    Ok(KillReply {
        found: u32::try_from(found).unwrap_or(u32::MAX),
    })
}

/// The scan and the signalling for one exec id.
#[derive(Debug)]
struct Killer<'a> {
    root: &'a Path,
    /// `BEIGE_EXEC_ID=<id>`, compared with whole environment entries.
    entry: &'a [u8],
    /// This shim's pid: never signalled, never counted.
    me: u32,
    /// This shim's process group: never signalled as a group.
    own_group: u32,
}

impl Killer<'_> {
    /// SIGTERM, the grace, SIGKILL. Starts from the processes of the first scan and
    /// returns the number of process groups signalled.
    fn run(&self, first: Vec<Proc>, grace: Duration) -> usize {
        let mut groups = BTreeSet::new();
        let mut termed = BTreeSet::new();
        let deadline = Instant::now() + grace;
        let mut procs = first;
        loop {
            for p in procs.iter().filter(|p| p.matches && !p.ended) {
                match self.group_of(p) {
                    Some(g) => {
                        if groups.insert(g) {
                            let _ = sys::kill_process_group(g, libc::SIGTERM);
                        }
                    }
                    None => {
                        if termed.insert(p.pid) {
                            let _ = sys::kill_process(p.pid, libc::SIGTERM);
                        }
                    }
                }
            }
            if !self.anything_left(&procs, &groups) {
                return groups.len();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            thread::sleep(POLL.min(left));
            procs = self.scan().unwrap_or_default();
        }

        let deadline = Instant::now() + KILL_WAIT;
        loop {
            // Groups already signalled that still have members, and the groups of the
            // matching processes (one may have moved to a new group meanwhile).
            let live: BTreeSet<u32> = procs.iter().map(|p| p.pgid).collect();
            let alive_signalled: Vec<u32> = groups.intersection(&live).copied().collect();
            for g in alive_signalled {
                let _ = sys::kill_process_group(g, libc::SIGKILL);
            }
            for p in procs.iter().filter(|p| p.matches && !p.ended) {
                if let Some(g) = self.group_of(p) {
                    if groups.insert(g) {
                        let _ = sys::kill_process_group(g, libc::SIGKILL);
                    }
                }
                // Also one by one: it may have left the group since the scan.
                let _ = sys::kill_process(p.pid, libc::SIGKILL);
            }
            if Instant::now() >= deadline {
                return groups.len();
            }
            thread::sleep(POLL);
            procs = self.scan().unwrap_or_default();
            if !self.anything_left(&procs, &groups) {
                return groups.len();
            }
        }
    }

    /// The process group of `p` if it may be signalled as a whole.
    fn group_of(&self, p: &Proc) -> Option<u32> {
        (p.pgid > 1 && p.pgid != self.own_group).then_some(p.pgid)
    }

    /// Whether a matching process is still running, or a process (matching or not, e.g.
    /// one started with `env -i`) in one of the signalled groups.
    fn anything_left(&self, procs: &[Proc], groups: &BTreeSet<u32>) -> bool {
        procs
            .iter()
            .any(|p| !p.ended && (p.matches || groups.contains(&p.pgid)))
    }

    /// Every process of `root` except this shim, with its group and whether it carries
    /// the entry. Processes that vanish meanwhile or cannot be read are left out (or,
    /// when only their environment is unreadable, counted as not matching).
    fn scan(&self) -> io::Result<Vec<Proc>> {
        let mut procs = Vec::new();
        for dirent in fs::read_dir(self.root)? {
            let Ok(dirent) = dirent else { continue };
            let Some(pid) = dirent
                .file_name()
                .to_str()
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == self.me {
                continue;
            }
            let dir = dirent.path();
            let Some((ended, pgid)) = fs::read(dir.join("stat"))
                .ok()
                .and_then(|stat| parse_stat(&stat))
            else {
                continue;
            };
            let matches = !ended
                && fs::read(dir.join("environ"))
                    .map(|env| has_entry(&env, self.entry))
                    .unwrap_or(false);
            procs.push(Proc {
                pid,
                pgid,
                ended,
                matches,
            });
        }
        Ok(procs)
    }
}

/// Parses `/proc/<pid>/stat`: whether the process has ended (state `Z`, `X` or `x`) and
/// its process-group id. The fields are read after the last `)`, as the command name
/// before it may contain spaces and parentheses.
fn parse_stat(stat: &[u8]) -> Option<(bool, u32)> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let _ppid = fields.next()?;
    let pgid = fields.next()?.parse::<i64>().ok()?;
    let ended = matches!(state, "Z" | "X" | "x");
    // A group outside our PID namespace shows as 0; negative values never appear.
    Some((ended, u32::try_from(pgid).unwrap_or(0)))
}

/// Whether the NUL-separated environment block holds exactly `entry`.
fn has_entry(environ: &[u8], entry: &[u8]) -> bool {
    environ.split(|&b| b == 0).any(|e| e == entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_ids_are_checked() {
        assert!(check_exec_id("t1").is_ok());
        assert!(check_exec_id("A_b-9").is_ok());
        for bad in ["", "a b", "x=y", "a\0b", "ü"] {
            let err = check_exec_id(bad).unwrap_err();
            assert_eq!(err.kind, OpErrorKind::BadRequest, "{bad:?}");
        }
        let long = "a".repeat(1000);
        let err = check_exec_id(&long).unwrap_err();
        assert!(err.message.len() < 200, "{}", err.message);
        let err = kill(&KillRequest {
            exec_id: "no/slash".into(),
        })
        .unwrap_err();
        assert_eq!(err.kind, OpErrorKind::BadRequest);
    }

    #[test]
    fn stat_fields_come_after_the_last_paren() {
        let stat = b"1234 (we ird) (x) S 1 4321 4321 0 -1 4194560 100 0 0 0";
        assert_eq!(parse_stat(stat), Some((false, 4321)));
        assert_eq!(parse_stat(b"7 (sh) Z 1 0 0"), Some((true, 0)));
        assert_eq!(parse_stat(b"7 (sh) S 1"), None);
        assert_eq!(parse_stat(b"garbage"), None);
    }

    #[test]
    fn entries_match_exactly() {
        let env = b"PATH=/bin\0BEIGE_EXEC_ID=t10\0X=BEIGE_EXEC_ID=t1\0";
        assert!(!has_entry(env, b"BEIGE_EXEC_ID=t1"));
        assert!(has_entry(env, b"BEIGE_EXEC_ID=t10"));
        assert!(has_entry(b"BEIGE_EXEC_ID=t1", b"BEIGE_EXEC_ID=t1"));
        assert!(!has_entry(b"", b"BEIGE_EXEC_ID=t1"));
    }

    #[test]
    fn scan_reads_a_proc_tree() {
        let root = tempfile::tempdir().unwrap();
        let add = |pid: &str, stat: &str, environ: Option<&[u8]>| {
            let dir = root.path().join(pid);
            fs::create_dir(&dir).unwrap();
            fs::write(dir.join("stat"), stat).unwrap();
            if let Some(env) = environ {
                fs::write(dir.join("environ"), env).unwrap();
            }
        };
        add("10", "10 (sh) S 1 10 10", Some(b"A=1\0BEIGE_EXEC_ID=k\0"));
        add("11", "11 (sleep) S 10 10 10", Some(b"BEIGE_EXEC_ID=k\0"));
        add("12", "12 (other) S 1 12 12", Some(b"BEIGE_EXEC_ID=kk\0"));
        add("13", "13 (zombie) Z 10 10 10", Some(b"BEIGE_EXEC_ID=k\0"));
        add("14", "14 (secret) S 1 14 14", None);
        add("15", "15 (me) S 1 15 15", Some(b"BEIGE_EXEC_ID=k\0"));
        fs::create_dir(root.path().join("self")).unwrap();
        fs::create_dir(root.path().join("99")).unwrap();
        let killer = Killer {
            root: root.path(),
            entry: b"BEIGE_EXEC_ID=k",
            me: 15,
            own_group: 15,
        };
        let mut procs = killer.scan().unwrap();
        procs.sort_by_key(|p| p.pid);
        let summary: Vec<(u32, u32, bool, bool)> = procs
            .iter()
            .map(|p| (p.pid, p.pgid, p.ended, p.matches))
            .collect();
        assert_eq!(
            summary,
            [
                (10, 10, false, true),
                (11, 10, false, true),
                (12, 12, false, false),
                (13, 10, true, false),
                (14, 14, false, false),
            ]
        );
        let p = |pgid| Proc {
            pid: 20,
            pgid,
            ended: false,
            matches: true,
        };
        assert_eq!(killer.group_of(&p(10)), Some(10));
        assert_eq!(killer.group_of(&p(15)), None);
        assert_eq!(killer.group_of(&p(1)), None);
        assert_eq!(killer.group_of(&p(0)), None);

        let none = Killer {
            root: &root.path().join("missing"),
            ..killer
        };
        assert!(none.scan().is_err());
    }

    #[test]
    fn unknown_id_finds_nothing() {
        let id = format!("unit-none-{}", std::process::id());
        let started = Instant::now();
        let reply = kill(&KillRequest { exec_id: id }).unwrap();
        assert_eq!(reply.found, 0);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn kills_a_running_exec_in_process() {
        use beige_protocol::op::ExecRequest;
        let dir = tempfile::tempdir().unwrap();
        let id = format!("unit-run-{}", std::process::id());
        let req = ExecRequest {
            command: "sleep 100 & sleep 100; wait".into(),
            timeout_secs: 60,
            env: Vec::new(),
            cwd: None,
            max_output_bytes: beige_protocol::op::DEFAULT_EXEC_MAX_OUTPUT_BYTES,
            exec_id: Some(id.clone()),
            raw_output: false,
        };
        let ctx = super::super::Context::new(dir.path());
        let runner = thread::spawn(move || super::super::exec::exec(&ctx, &req, false, None));
        let entry = format!("{EXEC_ID_ENV}={id}");
        let killer = Killer {
            root: Path::new(PROC),
            entry: entry.as_bytes(),
            me: std::process::id(),
            own_group: sys::own_process_group(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while killer.scan().unwrap().iter().filter(|p| p.matches).count() < 3 {
            assert!(Instant::now() < deadline, "the command did not start");
            thread::sleep(Duration::from_millis(20));
        }
        let started = Instant::now();
        let reply = kill(&KillRequest { exec_id: id }).unwrap();
        assert_eq!(reply.found, 1);
        let exec = runner.join().unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(exec.signal, Some(libc::SIGTERM), "{exec:?}");
        assert!(!exec.timed_out);
        assert!(!killer.scan().unwrap().iter().any(|p| p.matches));
    }
}
