//! The two `/proc` texts both sides of the sandbox boundary read to name a process:
//! `/proc/<pid>/stat` (parent, session and start time) and the `NS*:` lines of
//! `/proc/<pid>/status` (the same pid as seen from each nested pid namespace).
//!
//! The shim reports an exec's root as `(pid, starttime)` read with [`parse_stat`]; the
//! gateway reads the same fields of a caller on the host and compares. Both must parse
//! alike, so the parsers live here. They are pure functions over bytes: no I/O, no
//! allocation beyond the result. A `stat` line is parsed after its *last* `)`, because
//! the command name before it is chosen by the process and may contain spaces,
//! parentheses and even newlines.

/// The fields of `/proc/<pid>/stat` that identity needs, in the pid namespace of the
/// procfs they were read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `Z`, …
    pub state: u8,
    /// Field 4: the parent's pid (0 for a namespace's init seen from inside).
    pub ppid: u32,
    /// Field 6: the session id, i.e. the pid of the session's leader.
    pub sid: u32,
    /// Field 22: when the process started, in clock ticks after boot. A pid is reused
    /// only by a process with a later start time.
    pub starttime: u64,
}

/// Parses one `/proc/<pid>/stat` text; `None` when it is not one.
pub fn parse_stat(stat: &[u8]) -> Option<ProcStat> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    // `rest` starts at field 3; field n is at index n - 3.
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    let _pgrp = fields.next()?;
    let sid = fields.next()?.parse().ok()?;
    let starttime = fields.nth(22 - 7)?.parse().ok()?;
    Some(ProcStat {
        state,
        ppid,
        sid,
        starttime,
    })
}

/// The values of an `NS*:` line of `/proc/<pid>/status` (`NSpid`, `NSsid`, `NSpgid`,
/// `NStgid`), outermost namespace first: `NSpid:\t4711\t12` is a process that is 4711
/// in the reader's namespace and 12 in its own. `None` when the line is missing (kernels
/// before 4.1) or unreadable.
pub fn ns_ids(status: &str, key: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?;
        rest.strip_prefix(':')
    })?;
    let ids: Option<Vec<u32>> = line
        .split_ascii_whitespace()
        .map(|v| v.parse().ok())
        .collect();
    ids.filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_with(comm: &str) -> Vec<u8> {
        format!(
            "4711 ({comm}) S 12 4711 4700 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
        )
        .into_bytes()
    }

    #[test]
    fn stat_fields_survive_hostile_command_names() {
        for comm in [
            "sh",
            "a b",
            "x) R 1 1 1 1",
            "((()",
            ")",
            "tab\there",
            "new\nline",
            "",
        ] {
            let s = parse_stat(&stat_with(comm)).unwrap_or_else(|| panic!("{comm:?}"));
            assert_eq!(
                s,
                ProcStat {
                    state: b'S',
                    ppid: 12,
                    sid: 4700,
                    starttime: 987654
                },
                "{comm:?}"
            );
        }
    }

    #[test]
    fn truncated_or_foreign_stat_is_refused() {
        assert_eq!(parse_stat(b""), None);
        assert_eq!(parse_stat(b"4711 (sh"), None);
        assert_eq!(parse_stat(b"4711 (sh) S 12 4711 4700 0"), None);
        assert_eq!(
            parse_stat(b"4711 (sh) S x 4711 4700 0 -1 1 1 1 1 1 1 1 1 1 1 1 1 1 5"),
            None
        );
        // Exactly up to field 22 is enough.
        let s = parse_stat(b"9 (a) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42").unwrap();
        assert_eq!((s.state, s.ppid, s.sid, s.starttime), (b'Z', 1, 9, 42));
    }

    #[test]
    fn ns_lines_are_read_outermost_first() {
        let status = "Name:\tNSpid: fake\nUmask:\t0022\nNStgid:\t4711\t12\nNSpid:\t4711\t12\nNSpgid:\t4700\t9\nNSsid:\t4700\t9\n";
        assert_eq!(ns_ids(status, "NSpid"), Some(vec![4711, 12]));
        assert_eq!(ns_ids(status, "NSsid"), Some(vec![4700, 9]));
        assert_eq!(ns_ids("Name:\tsh\nNSpid:\t5\n", "NSpid"), Some(vec![5]));
        assert_eq!(ns_ids("Name:\tsh\n", "NSpid"), None);
        assert_eq!(ns_ids("NSpid:\t\n", "NSpid"), None);
        assert_eq!(ns_ids("NSpid:\t1\tx\n", "NSpid"), None);
    }
}
