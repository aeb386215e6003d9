//! Survivors of an `exec`: processes the command started that escaped its process group
//! (`setsid`, double fork) and still run after the group was killed.
//!
//! Without cgroup delegation there is no exact tracking, so this is a best effort with
//! one read of `/proc`. A survivor is a live process that
//!
//! - has the same real uid as the `op exec` process;
//! - was re-parented to a reaper: its parent is PID 1 or one of the op process's own
//!   ancestors (outside a container the nearest subreaper or the host's init takes
//!   orphans, and in a container that is PID 1);
//! - started no earlier than the op process (field 22 of `/proc/<pid>/stat`);
//! - is not in the command's process group (those were just sent SIGKILL and are dying);
//! - is not the op process itself, nor another shim process (its command line starts
//!   with the shim's own path: other op processes are PID 1's children too);
//! - has a command line (one without is exiting: its memory is already released).
//!
//! Survivors are reported, not killed: a daemon may be intended. Another `exec` running
//! at the same time can have its daemons reported here as well.

use std::fs;
use std::path::{Path, PathBuf};

use beige_protocol::op::Survivor;

use crate::sys;

/// Most survivors reported by one `exec`.
const MAX_SURVIVORS: usize = 32;
/// Longest command line reported, in bytes.
const MAX_COMMAND_BYTES: usize = 200;
/// Longest ancestor chain followed.
const MAX_ANCESTORS: usize = 64;

/// What one process's `/proc/<pid>/stat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    ended: bool,
    ppid: u32,
    pgid: u32,
    start: u64,
}

/// Parses the fields after the command name (after the last `)`).
fn parse_stat(stat: &[u8]) -> Option<Stat> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is field 3 (state); starttime is field 22.
    Some(Stat {
        ended: matches!(*fields.first()?, "Z" | "X" | "x"),
        ppid: fields.get(1)?.parse().ok()?,
        pgid: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The real uid from `/proc/<pid>/status`.
fn parse_real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The state of the op process when the command starts, to compare against later.
#[derive(Debug, Clone)]
pub struct Baseline {
    root: PathBuf,
    me: u32,
    uid: u32,
    since: u64,
    /// PID 1 and the op process's ancestors: where orphans go.
    reapers: Vec<u32>,
    /// Command-line starts that mark a shim process.
    shim_paths: Vec<Vec<u8>>,
}

impl Baseline {
    /// Takes the baseline from the real `/proc`; `None` when it is not readable.
    pub fn take() -> Option<Self> {
        let mut shim_paths = Vec::new();
        if let Ok(exe) = std::env::current_exe() {
            shim_paths.push(exe.into_os_string().into_encoded_bytes());
        }
        if let Some(arg0) = std::env::args_os().next() {
            shim_paths.push(arg0.into_encoded_bytes());
        }
        Self::take_in(
            Path::new("/proc"),
            std::process::id(),
            sys::real_uid(),
            shim_paths,
        )
    }

    fn take_in(root: &Path, me: u32, uid: u32, shim_paths: Vec<Vec<u8>>) -> Option<Self> {
        let stat = |pid: u32| {
            fs::read(root.join(pid.to_string()).join("stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
        };
        let own = stat(me)?;
        let mut reapers = vec![1];
        let mut parent = own.ppid;
        while parent > 1 && reapers.len() < MAX_ANCESTORS {
            reapers.push(parent);
            parent = stat(parent).map_or(0, |s| s.ppid);
        }
        Some(Self {
            root: root.to_path_buf(),
            me,
            uid,
            since: own.start,
            reapers,
            shim_paths: shim_paths.into_iter().filter(|p| !p.is_empty()).collect(),
        })
    }

    /// The survivors of the command whose process group was `pgid`, by pid.
    pub fn survivors(&self, pgid: u32) -> Vec<Survivor> {
        let Ok(dir) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == self.me {
                continue;
            }
            let path = entry.path();
            let Some(stat) = fs::read(path.join("stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
            else {
                continue;
            };
            if stat.ended
                || stat.start < self.since
                || stat.pgid == pgid
                || !self.reapers.contains(&stat.ppid)
            {
                continue;
            }
            let uid = fs::read_to_string(path.join("status"))
                .ok()
                .and_then(|s| parse_real_uid(&s));
            if uid != Some(self.uid) {
                continue;
            }
            let cmdline = fs::read(path.join("cmdline")).unwrap_or_default();
            // No command line: a process that is exiting (its memory already released,
            // not yet a zombie), never a daemon that stays.
            if cmdline.is_empty() {
                continue;
            }
            let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            if self.shim_paths.iter().any(|p| p.as_slice() == first) {
                continue;
            }
            found.push(Survivor {
                pid,
                command: command_text(&cmdline),
            });
        }
        found.sort_by_key(|s| s.pid);
        found.truncate(MAX_SURVIVORS);
        found
    }
}

/// A NUL-separated command line as one space-joined line of at most
/// [`MAX_COMMAND_BYTES`] bytes.
fn command_text(cmdline: &[u8]) -> String {
    let joined: Vec<u8> = cmdline
        .strip_suffix(b"\0")
        .unwrap_or(cmdline)
        .iter()
        .map(|&b| if b == 0 { b' ' } else { b })
        .collect();
    let mut text = String::from_utf8_lossy(&joined).into_owned();
    if text.len() > MAX_COMMAND_BYTES {
        let mut cut = MAX_COMMAND_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    /// utime stime cutime cstime priority nice threads itreal starttime …`
    fn stat_line(pid: u32, state: &str, ppid: u32, pgid: u32, start: u64) -> String {
        format!("{pid} (a (b) c) {state} {ppid} {pgid} {pgid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1000 10")
    }

    #[test]
    fn stat_and_status_parse() {
        let s = parse_stat(stat_line(7, "S", 1, 9, 12345).as_bytes()).unwrap();
        assert_eq!(
            s,
            Stat {
                ended: false,
                ppid: 1,
                pgid: 9,
                start: 12345
            }
        );
        assert!(parse_stat(b"7 (x) S 1 2").is_none());
        assert_eq!(
            parse_real_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n"),
            Some(1000)
        );
        assert_eq!(parse_real_uid("Name:\tx\n"), None);
    }

    #[test]
    fn command_lines_are_joined_and_cut() {
        assert_eq!(command_text(b"sleep\x0030\x00"), "sleep 30");
        let long = "é".repeat(150);
        let cut = command_text(long.as_bytes());
        assert!(cut.len() <= MAX_COMMAND_BYTES && cut.len() >= MAX_COMMAND_BYTES - 1);
    }

    #[test]
    fn finds_escaped_processes_in_a_proc_tree() {
        let root = tempfile::tempdir().unwrap();
        let add = |pid: u32, stat: String, uid: u32, cmdline: &[u8]| {
            let dir = root.path().join(pid.to_string());
            fs::create_dir(&dir).unwrap();
            fs::write(dir.join("stat"), stat).unwrap();
            fs::write(
                dir.join("status"),
                format!("Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
            )
            .unwrap();
            fs::write(dir.join("cmdline"), cmdline).unwrap();
        };
        // The op (50, child of 40, child of 1) started at tick 100.
        add(1, stat_line(1, "S", 0, 1, 1), 0, b"/beige/shim\0init\0");
        add(40, stat_line(40, "S", 1, 40, 50), 0, b"gateway\0");
        add(
            50,
            stat_line(50, "S", 40, 50, 100),
            1000,
            b"/beige/shim\0op\0exec\0",
        );
        add(60, stat_line(60, "S", 1, 60, 120), 1000, b"sleep\x0030\0"); // escaped
        add(61, stat_line(61, "S", 40, 61, 130), 1000, b"daemon\0"); // to an ancestor
        add(62, stat_line(62, "S", 1, 62, 90), 1000, b"older\0"); // started before
        add(63, stat_line(63, "S", 1, 63, 120), 0, b"root-owned\0"); // other uid
        add(64, stat_line(64, "Z", 1, 64, 120), 1000, b""); // zombie
        add(68, stat_line(68, "R", 1, 68, 120), 1000, b""); // exiting
        add(
            65,
            stat_line(65, "S", 1, 70, 120),
            1000,
            b"/beige/shim\0op\0read\0",
        ); // shim
        add(66, stat_line(66, "S", 1, 77, 120), 1000, b"in-group\0"); // the command's group
        add(67, stat_line(67, "S", 66, 67, 120), 1000, b"child\0"); // not orphaned
        fs::create_dir(root.path().join("self")).unwrap();

        let base = Baseline::take_in(root.path(), 50, 1000, vec![b"/beige/shim".to_vec()]).unwrap();
        assert_eq!(base.since, 100);
        assert_eq!(base.reapers, [1, 40]);
        let found = base.survivors(77);
        let summary: Vec<(u32, &str)> = found.iter().map(|s| (s.pid, s.command.as_str())).collect();
        assert_eq!(summary, [(60, "sleep 30"), (61, "daemon")]);

        assert!(Baseline::take_in(root.path(), 99, 1000, Vec::new()).is_none());
    }
}
