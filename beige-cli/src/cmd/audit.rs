//! `beige audit tail [-f] [--agent A] [--session KEY [--tree]] [-n N] [--json]`: the audit
//! log for people (`--tree` adds the session's sub-agents, followed through the `spawn`
//! records and the child records' `parentSession`);
//! `beige audit verify` and `beige audit pubkey`: its hash chain checked offline
//! ([`beige_core::audit::chain`]).
//!
//! Reads `<BEIGE_HOME>/logs/audit.jsonl` (and its newest rotated file when the current
//! one holds too few records) directly — no gateway needed. Each finished call becomes
//! one line, e.g. `✓ CORE assistant/exec ls → exit 0 (12 ms)`; `started` records are
//! skipped (every call has a `finished` one, denied calls only that).

use std::collections::HashSet;
use std::path::Path;

use anyhow::Result;
use beige_core::audit::{AuditDecision, AuditRecord, Phase};
use beige_core::home::BeigeHome;

use crate::logfile::{self, Follower};
use crate::Exit;

/// One record as a line.
pub fn render(r: &AuditRecord) -> String {
    let ok =
        r.decision == AuditDecision::Allowed && r.error.is_none() && r.exit_code.unwrap_or(0) == 0;
    let kind = r.kind.label();
    let args = r
        .args
        .iter()
        .map(|a| shorten(a, 80))
        .collect::<Vec<_>>()
        .join(" ");
    let outcome = match (r.decision, &r.error, r.exit_code) {
        (AuditDecision::Denied, Some(e), _) => format!("denied: {}", shorten(e, 120)),
        (AuditDecision::Denied, None, _) => "denied".to_string(),
        (AuditDecision::Allowed, Some(e), _) => format!("failed: {}", shorten(e, 120)),
        (AuditDecision::Allowed, None, Some(code)) => format!("exit {code}"),
        (AuditDecision::Allowed, None, None) => "finished".to_string(),
    };
    let time = r.ts.get(11..19).unwrap_or(&r.ts);
    let mut line = format!(
        "{time} {} {kind} {}/{}",
        if ok { "✓" } else { "✗" },
        r.agent,
        r.tool
    );
    // A spawn: which child, how deep, how it ended.
    let args = match (&r.spawn, args.is_empty()) {
        (Some(s), true) => {
            let mut facts = Vec::new();
            if let Some(child) = s["child"]["session"].as_str() {
                facts.push(format!("child={child}"));
            }
            if let Some(depth) = s["depth"].as_u64() {
                facts.push(format!("depth={depth}"));
            }
            if let Some(status) = s["status"].as_str() {
                facts.push(format!("status={status}"));
            }
            facts.join(" ")
        }
        _ => args,
    };
    if !args.is_empty() {
        line.push(' ');
        line.push_str(&args);
    }
    line.push_str(&format!(" → {outcome}"));
    if let Some(ms) = r.duration_ms {
        line.push_str(&format!(" ({ms} ms)"));
    }
    line
}

fn shorten(s: &str, max: usize) -> String {
    let one_line = s.replace('\n', "⏎");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// `--session KEY [--tree]`: the records of one session and, with `tree`, of the
/// sub-agents below it, learnt from the records in log order: a `spawn` record of a
/// session in the tree names its child, and a child's records name their parent
/// (`parentSession`).
#[derive(Debug, Clone)]
pub struct SessionFilter {
    sessions: HashSet<String>,
    tree: bool,
}

impl SessionFilter {
    /// Session `key`, with its sub-agents when `tree`.
    pub fn new(key: String, tree: bool) -> Self {
        Self {
            sessions: HashSet::from([key]),
            tree,
        }
    }

    /// Whether `r` belongs (every record goes through here, in log order).
    fn admits(&mut self, r: &AuditRecord) -> bool {
        let Some(session) = r.session.as_deref() else {
            return false;
        };
        let mut inside = self.sessions.contains(session);
        if self.tree {
            if !inside
                && r.parent_session
                    .as_deref()
                    .is_some_and(|p| self.sessions.contains(p))
            {
                self.sessions.insert(session.to_string());
                inside = true;
            }
            if inside {
                if let Some(child) = r
                    .spawn
                    .as_ref()
                    .and_then(|s| s["child"]["session"].as_str())
                {
                    self.sessions.insert(child.to_string());
                }
            }
        }
        inside
    }
}

/// Parse the finished records of a file's lines that match `agent` (and `session`,
/// which sees every record, finished or not).
fn finished<'a, 'f>(
    lines: impl Iterator<Item = &'a str> + 'f,
    agent: Option<&'f str>,
    session: &'f mut Option<SessionFilter>,
) -> impl Iterator<Item = (AuditRecord, &'a str)> + 'f
where
    'a: 'f,
{
    lines
        .filter_map(|l| serde_json::from_str::<AuditRecord>(l).ok().map(|r| (r, l)))
        .filter(move |(r, _)| session.as_mut().is_none_or(|f| f.admits(r)))
        .filter(|(r, _)| r.phase == Phase::Finished)
        .filter(move |(r, _)| agent.is_none_or(|a| r.agent == a))
}

fn print(record: &AuditRecord, raw: &str, json: bool) {
    if json {
        println!("{raw}");
    } else {
        println!("{}", render(record));
    }
}

pub fn tail(
    home: &BeigeHome,
    follow: bool,
    agent: Option<&str>,
    mut session: Option<SessionFilter>,
    count: usize,
    json: bool,
) -> Result<()> {
    let path = home.audit_log_path();
    if !path.exists() && !follow {
        return Err(Exit::new(
            1,
            format!(
                "error: no audit log at {} yet — it is written when an agent's tools are first called.",
                path.display()
            ),
        )
        .into());
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    let older;
    let mut records: Vec<(AuditRecord, &str)> = if session.is_some() {
        // A session's tree is learnt in log order: the rotated file first.
        older = std::fs::read_to_string(logfile::numbered(&path, 1)).unwrap_or_default();
        let mut all: Vec<(AuditRecord, &str)> =
            finished(older.lines(), agent, &mut session).collect();
        all.extend(finished(current.lines(), agent, &mut session));
        all
    } else {
        let mut records: Vec<(AuditRecord, &str)> =
            finished(current.lines(), agent, &mut session).collect();
        if records.len() < count {
            older = std::fs::read_to_string(logfile::numbered(&path, 1)).unwrap_or_default();
            let mut before: Vec<(AuditRecord, &str)> =
                finished(older.lines(), agent, &mut session).collect();
            before.append(&mut records);
            records = before;
        }
        records
    };
    let skip = records.len().saturating_sub(count);
    for (r, raw) in &records[skip..] {
        print(r, raw, json);
    }
    records.clear();
    if !follow {
        return Ok(());
    }
    follow_file(&path, agent, session, json)
}

fn follow_file(
    path: &Path,
    agent: Option<&str>,
    mut session: Option<SessionFilter>,
    json: bool,
) -> Result<()> {
    let mut follower = Follower::new(path, false);
    loop {
        let lines = follower.poll_lines();
        for (r, raw) in finished(lines.iter().map(String::as_str), agent, &mut session) {
            print(&r, raw, json);
        }
        std::thread::sleep(logfile::POLL);
    }
}

/// The public key file of `home`.
fn pubkey_path(home: &BeigeHome) -> std::path::PathBuf {
    home.root()
        .join("keys")
        .join(beige_core::audit::chain::PUBKEY_FILE)
}

/// `beige audit verify`: exit 0 intact, 1 tampered, 2 unreadable or bad usage.
pub fn verify(
    home: &BeigeHome,
    files: &[std::path::PathBuf],
    pubkey: Option<&Path>,
    json: bool,
) -> Result<()> {
    use beige_core::audit::chain;
    let key_path = pubkey.map_or_else(|| pubkey_path(home), Path::to_path_buf);
    let public = match std::fs::read_to_string(&key_path) {
        Ok(text) => Some(chain::parse_public_key(&text).ok_or_else(|| {
            Exit::new(
                2,
                format!(
                    "error: {} is not an audit public key (base64 of 32 bytes, as `beige audit pubkey` prints it)",
                    key_path.display()
                ),
            )
        })?),
        Err(_) if pubkey.is_none() => None,
        Err(e) => {
            return Err(Exit::new(
                2,
                format!("error: cannot read the public key {}: {e}", key_path.display()),
            )
            .into())
        }
    };
    let (files, head) = if files.is_empty() {
        let path = home.audit_log_path();
        let files = chain::log_files(&path);
        if files.is_empty() {
            return Err(Exit::new(
                2,
                format!(
                    "error: no audit log at {} — it is written when an agent's tools are first called.",
                    path.display()
                ),
            )
            .into());
        }
        let head_path = path.with_file_name(chain::HEAD_FILE);
        (files, chain::Head::read(&head_path))
    } else {
        (files.to_vec(), None)
    };
    let report = chain::verify(&files, public.as_ref(), head.as_ref());
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", chain::summary(&report));
    }
    if report.ok {
        Ok(())
    } else {
        Err(Exit::silent(1).into())
    }
}

/// `beige audit pubkey`.
pub fn pubkey(home: &BeigeHome) -> Result<()> {
    let path = pubkey_path(home);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Exit::new(
            2,
            format!(
                "error: no audit public key at {} ({e}) — the gateway makes its key pair when it first starts.",
                path.display()
            ),
        )
    })?;
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_session_tree_follows_spawns_and_parent_sessions() {
        let log = [
            json!({"session": "telegram:42", "phase": "finished", "type": "core_tool", "tool": "exec"}),
            json!({"session": "telegram:42", "phase": "started", "type": "spawn", "tool": "spawn",
                   "spawn": {"child": {"agent": "r", "session": "spawn:telegram:42:r:1"}, "depth": 1}}),
            json!({"session": "spawn:telegram:42:r:1", "parentSession": "telegram:42",
                   "phase": "finished", "type": "tool", "tool": "kv"}),
            // A grandchild, known only through its records' parent.
            json!({"session": "spawn:spawn:telegram:42:r:1:r:2", "parentSession": "spawn:telegram:42:r:1",
                   "phase": "finished", "type": "tool", "tool": "kv"}),
            json!({"session": "telegram:7", "phase": "finished", "type": "tool", "tool": "kv"}),
            json!({"session": "telegram:42", "phase": "finished", "type": "spawn", "tool": "spawn",
                   "spawn": {"child": {"agent": "r", "session": "spawn:telegram:42:r:1"}, "depth": 1,
                             "status": "ok"}}),
        ]
        .map(|mut v| {
            let o = v.as_object_mut().unwrap();
            o.insert("ts".into(), json!("2026-01-02T03:04:05.678+00:00"));
            o.insert("agent".into(), json!("a"));
            o.insert("decision".into(), json!("allowed"));
            o.insert("args".into(), json!([]));
            v.to_string()
        });
        let sessions = |filter: SessionFilter| {
            let mut filter = Some(filter);
            finished(log.iter().map(String::as_str), None, &mut filter)
                .map(|(r, _)| r.session.unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            sessions(SessionFilter::new("telegram:42".into(), false)),
            ["telegram:42", "telegram:42"]
        );
        assert_eq!(
            sessions(SessionFilter::new("telegram:42".into(), true)),
            [
                "telegram:42",
                "spawn:telegram:42:r:1",
                "spawn:spawn:telegram:42:r:1:r:2",
                "telegram:42"
            ]
        );
        let spawn: AuditRecord = serde_json::from_str(&log[5]).unwrap();
        assert_eq!(
            render(&spawn),
            "03:04:05 ✓ SPAWN a/spawn child=spawn:telegram:42:r:1 depth=1 status=ok → finished"
        );
    }

    #[test]
    fn lines_for_people() {
        let r: AuditRecord = serde_json::from_value(serde_json::json!({
            "ts": "2026-01-02T03:04:05.678+00:00", "agent": "assistant", "phase": "finished",
            "type": "core_tool", "tool": "exec", "args": ["ls"], "decision": "allowed",
            "durationMs": 12, "exitCode": 0
        }))
        .unwrap();
        assert_eq!(
            render(&r),
            "03:04:05 ✓ CORE assistant/exec ls → exit 0 (12 ms)"
        );
        let r: AuditRecord = serde_json::from_value(serde_json::json!({
            "ts": "2026-01-02T03:04:05.678+00:00", "agent": "a", "phase": "finished",
            "type": "tool", "tool": "kv", "args": ["get", "x"], "decision": "denied",
            "durationMs": 0, "error": "tool 'kv' is not allowed for agent 'a'"
        }))
        .unwrap();
        assert_eq!(
            render(&r),
            "03:04:05 ✗ TOOL a/kv get x → denied: tool 'kv' is not allowed for agent 'a' (0 ms)"
        );
    }
}
