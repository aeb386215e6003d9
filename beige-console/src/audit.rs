//! The Audit page: records of the audit log (`BEIGE_HOME/logs/audit.jsonl` and its
//! rotated files, read with [`LogReader`]) newest first, filtered by agent, tool,
//! decision and principal from the URL, and limited to what the caller may read (every
//! record of an agent with `ReadAudit`, else those of their own sessions). "Follow"
//! streams new matching rows over SSE. This module only reads the log.

use std::convert::Infallible;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

use askama::Template as _;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use beige_core::api::auth::{Action, Caller};
use beige_core::api::Gateway as _;
use beige_core::audit::chain::log_files;
use beige_core::audit::export::{LogEntry, LogReader, ReadLine};
use serde_json::Value;

use crate::error::{ConsoleError, PageResult};
use crate::pages::{html, session, SSE_KEEP_ALIVE};
use crate::views::{AuditPage, AuditQuery, AuditRow, AuditRows, Layout};
use crate::Shared;

/// Rows shown at most.
const MAX_ROWS: usize = 500;
/// How often follow mode looks for new records.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

fn field<'a>(e: &'a LogEntry, key: &str) -> &'a str {
    e.record.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Whether `caller` may read the record.
fn visible(caller: &Caller, e: &LogEntry) -> bool {
    let agent = field(e, "agent");
    if agent.is_empty() {
        return caller.may_administer().is_ok();
    }
    caller.may(Action::ReadAudit, agent).is_ok()
        || (caller.sees(agent) && caller.owns_session(agent, field(e, "session")))
}

fn matches(q: &AuditQuery, e: &LogEntry) -> bool {
    let want = |wanted: &str, key: &str| wanted.is_empty() || field(e, key) == wanted;
    want(&q.agent, "agent")
        && want(&q.tool, "tool")
        && want(&q.decision, "decision")
        && want(&q.principal, "principal")
}

fn row(e: &LogEntry) -> AuditRow {
    let args = match e.record.get("args") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(" "),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let principal = field(e, "principal");
    AuditRow {
        time: field(e, "ts").to_string(),
        agent: field(e, "agent").to_string(),
        kind: field(e, "type").to_string(),
        tool: field(e, "tool").to_string(),
        decision: field(e, "decision").to_string(),
        phase: field(e, "phase").to_string(),
        principal: if principal.is_empty() { "-" } else { principal }.to_string(),
        args: if args.is_empty() {
            "record".into()
        } else {
            args
        },
        json: serde_json::to_string_pretty(&e.record).unwrap_or_else(|_| e.raw.clone()),
    }
}

/// The matching records the caller may read, newest first.
fn read_rows(path: &Path, q: &AuditQuery, caller: &Caller) -> Result<Vec<AuditRow>, ConsoleError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    for line in LogReader::new(log_files(path)) {
        match line.map_err(|e| ConsoleError::Audit(e.to_string()))? {
            ReadLine::Entry(e) if visible(caller, &e) && matches(q, &e) => rows.push(row(&e)),
            _ => {}
        }
    }
    rows.reverse();
    rows.truncate(MAX_ROWS);
    Ok(rows)
}

/// `GET /console/audit`.
pub(crate) async fn page(
    State(s): State<Shared>,
    Query(q): Query<AuditQuery>,
    headers: HeaderMap,
) -> PageResult {
    let me = session(&s, &headers).await?;
    if !q.agent.is_empty() {
        me.caller.may(Action::See, &q.agent)?;
    }
    let rows = match s.options.audit_log.clone() {
        Some(path) => {
            let (q2, caller) = (q.clone(), me.caller.clone());
            tokio::task::spawn_blocking(move || read_rows(&path, &q2, &caller))
                .await
                .map_err(|e| ConsoleError::Audit(e.to_string()))??
        }
        None => Vec::new(),
    };
    let agents = s
        .api
        .gateway
        .agents()
        .await?
        .into_iter()
        .map(|a| a.name)
        .filter(|a| me.caller.sees(a))
        .collect();
    html(&AuditPage {
        l: Layout::new("Audit", "audit", Some(&me.caller), &me.csrf),
        q,
        agents,
        rows: AuditRows { rows },
    })
}

/// Lines of the current log file from line `from` on (0-based), and the new count. A
/// file shorter than `from` was rotated: it is read from its start.
fn read_from(path: &PathBuf, from: usize) -> (Vec<LogEntry>, usize) {
    let Ok(file) = std::fs::File::open(path) else {
        return (Vec::new(), from);
    };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    let from = if lines.len() < from { 0 } else { from };
    let entries = lines
        .iter()
        .enumerate()
        .skip(from)
        .filter(|(_, l)| !l.trim().is_empty())
        .filter_map(|(i, l)| LogEntry::parse(path, i + 1, l.clone()).ok())
        .collect();
    (entries, lines.len())
}

/// `GET /console/audit/events`: follow mode, a `rows` event with new matching rows
/// (newest first) whenever the log grows.
pub(crate) async fn events(
    State(s): State<Shared>,
    Query(q): Query<AuditQuery>,
    headers: HeaderMap,
) -> PageResult {
    let me = session(&s, &headers).await?;
    let Some(path) = s.options.audit_log.clone() else {
        return Err(ConsoleError::NotFound("no audit log is configured".into()));
    };
    let start = read_from(&path, usize::MAX).1;
    let state = (path, q, me.caller, start);
    let stream = futures_util::stream::unfold(state, |(path, q, caller, seen)| async move {
        let mut seen = seen;
        loop {
            tokio::time::sleep(FOLLOW_EVERY).await;
            let p = path.clone();
            let Ok((entries, count)) =
                tokio::task::spawn_blocking(move || read_from(&p, seen)).await
            else {
                return None;
            };
            seen = count;
            let mut rows: Vec<AuditRow> = entries
                .iter()
                .filter(|e| visible(&caller, e) && matches(&q, e))
                .map(row)
                .collect();
            if rows.is_empty() {
                continue;
            }
            rows.reverse();
            let html = AuditRows { rows }.render().unwrap_or_default();
            let event = Event::default()
                .event("rows")
                .data(html.replace('\r', "&#13;"));
            return Some((Ok::<Event, Infallible>(event), (path, q, caller, seen)));
        }
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response())
}
