//! The built-in `sessions` tool: an agent lists, reads and greps **its own** sessions
//! (`sessions list|get|grep`, platform.md §3).
//!
//! Owns the command line, the rendering (text and JSON) and the limits of one call:
//! output at most [`MAX_OUTPUT`] bytes, cut with a note; `grep` over at most
//! [`MAX_GREP_SESSIONS`] sessions or [`GREP_TIME_LIMIT`], with a linear-time regex (the
//! `regex` crate, size-limited); [`DEFAULT_MAX_CALLS_PER_EXEC`] calls per exec, counted
//! here by the exec the kernel attributed the caller to. Ownership is the connection's:
//! the agent is the socket's ([`ToolCall::session`]), never a field of the arguments or of
//! the `sessionContext`, and another agent's session answers exactly like a missing one
//! ([`NOT_FOUND`]), so existence does not leak. Sessions are read through the gateway's
//! [`Host`] and so through the store, never from files. It does not decide whether the
//! call may run (policy, approvals and budgets ran before it) and does not audit it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{Host, HostSlot};
use crate::llm::{Block, Role, ToolResultPart};
use crate::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use crate::store::{SessionRecord, StoredMessage};

/// The plugin and tool name.
pub(crate) const NAME: &str = "sessions";

/// Most bytes one call prints, the cut note included (64 KiB).
pub(crate) const MAX_OUTPUT: usize = 64 * 1024;
/// Most sessions one `grep` searches (`--max-sessions` may not ask for more).
pub(crate) const MAX_GREP_SESSIONS: usize = 200;
/// Sessions `grep` searches unless `--max-sessions` says otherwise.
pub(crate) const DEFAULT_GREP_SESSIONS: usize = 20;
/// Most matching lines one `grep` prints (`--max-matches` may not ask for more).
pub(crate) const MAX_GREP_MATCHES: usize = 1000;
/// Matching lines `grep` prints unless `--max-matches` says otherwise.
pub(crate) const DEFAULT_GREP_MATCHES: usize = 50;
/// How long one `grep` searches before it stops and says so.
pub(crate) const GREP_TIME_LIMIT: Duration = Duration::from_secs(5);
/// Sessions `list` prints unless `--limit` says otherwise.
pub(crate) const DEFAULT_LIST_LIMIT: usize = 20;
/// Calls one exec may make unless `maxCallsPerExec` says otherwise.
pub(crate) const DEFAULT_MAX_CALLS_PER_EXEC: u64 = 10;
/// What a session that does not exist, or is another agent's, answers: the same bytes
/// whatever was asked for.
pub(crate) const NOT_FOUND: &str =
    "sessions: session not found; `sessions list` shows this agent's sessions\n";

/// Longest compiled regex (bytes of the compiled program).
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Longest stretch of text one match attempt looks at: longer lines are searched in
/// overlapping windows, so that no single search step outlasts the time limit.
const GREP_WINDOW: usize = 64 * 1024;
/// Overlap of consecutive windows of a long line.
const GREP_OVERLAP: usize = 4 * 1024;
/// Characters of a matching line shown around the match.
const GREP_CONTEXT: usize = 100;
/// Execs whose call counts are remembered; the oldest is forgotten past this.
const REMEMBERED_EXECS: usize = 4096;

const USAGE: &str = "Usage:
  sessions list [--limit 20] [--all] [--json]
      this agent's sessions, newest first; --all also shows the child sessions
      `spawn --target SELF` made, under their parent
  sessions get <key|id> [--all] [--last N] [--format text|json]
      a session's transcript (its current context; --all: compacted messages too)
  sessions grep <pattern> [--regex] [--session KEY|ID] [--max-sessions 20] [--max-matches 50]
      lines of this agent's sessions containing <pattern> (a regex with --regex)
  sessions help";

/// The built-in `sessions` plugin. Enable it with `plugins: { sessions: {} }` and give
/// agents the tool with `tools: ["sessions"]`.
#[derive(Debug)]
pub(crate) struct SessionsPlugin {
    host: HostSlot,
}

impl SessionsPlugin {
    /// The plugin, reaching the gateway through `host`.
    pub(crate) fn new(host: HostSlot) -> Self {
        Self { host }
    }
}

#[async_trait]
impl Plugin for SessionsPlugin {
    fn name(&self) -> &str {
        NAME
    }

    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(SessionsTool {
            host: self.host.clone(),
            calls: ExecCalls::default(),
        }))
    }
}

/// The `sessions` tool.
#[derive(Debug)]
struct SessionsTool {
    host: HostSlot,
    calls: ExecCalls,
}

#[async_trait]
impl Tool for SessionsTool {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "This agent's own past sessions: list them, read a transcript, grep them."
    }

    fn commands(&self) -> Vec<String> {
        [
            "sessions list [--limit 20] [--all] [--json]",
            "sessions get <key|id> [--all] [--last N] [--format text|json]",
            "sessions grep <pattern> [--regex] [--session KEY] [--max-sessions 20] [--max-matches 50]",
        ]
        .map(String::from)
        .to_vec()
    }

    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        let command = match Command::parse(&call.args) {
            Ok(command) => command,
            Err(usage_error) => return Ok(ToolResult::fail(usage_error, 2)),
        };
        if command == Command::Help {
            return Ok(help(self.description()));
        }
        let limit = max_calls_per_exec(&call.config)?;
        let agent = call.session.agent.as_str();
        if let Some(exec) = call.exec.as_deref() {
            if let Err(used) = self.calls.note(agent, exec, limit) {
                return Ok(ToolResult::fail(
                    format!(
                        "sessions: budget exhausted: exec {exec} has made {used} sessions calls, \
                         the most one exec may make ({limit}); run the next ones from a new exec, \
                         or raise pluginConfigs.sessions.maxCallsPerExec\n"
                    ),
                    beige_protocol::socket::EXIT_BUDGET_EXHAUSTED,
                ));
            }
        }
        let host = self.host.get()?;
        let result = match command {
            Command::Help => help(self.description()),
            Command::List { limit, all, json } => {
                list(host.as_ref(), agent, limit, all, json).await?
            }
            Command::Get {
                target,
                all,
                last,
                json,
            } => get(host.as_ref(), agent, &target, all, last, json).await?,
            Command::Grep(grep) => run_grep(host, agent, grep).await?,
        };
        Ok(result)
    }
}

/// `sessions help`: answered before the call is counted or the gateway consulted.
fn help(description: &str) -> ToolResult {
    ToolResult::ok(format!("sessions — {description}\n\n{USAGE}\n"))
}

/// `maxCallsPerExec` from the call's config (the plugin's config merged with the agent's
/// `pluginConfigs.sessions`).
fn max_calls_per_exec(config: &Value) -> Result<u64, ToolError> {
    match config.get("maxCallsPerExec") {
        None | Some(Value::Null) => Ok(DEFAULT_MAX_CALLS_PER_EXEC),
        Some(v) => v.as_u64().ok_or_else(|| {
            ToolError::Failed(format!(
                "maxCallsPerExec (plugins.sessions.config, or the agent's pluginConfigs.sessions) \
                 must be a whole number ≥ 0, not {v}"
            ))
        }),
    }
}

/// `(agent, exec id)`.
type ExecKey = (String, String);

/// Calls per exec: `(agent, exec)` → calls so far, and the execs in the order they
/// first called, so the oldest are forgotten first.
#[derive(Debug, Default)]
struct ExecCalls(Mutex<(HashMap<ExecKey, u64>, VecDeque<ExecKey>)>);

impl ExecCalls {
    /// Count one call of `exec`; `Err(calls so far)` when it already made `limit`.
    fn note(&self, agent: &str, exec: &str, limit: u64) -> Result<(), u64> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (counts, order) = &mut *guard;
        let key = (agent.to_string(), exec.to_string());
        let used = counts.get(&key).copied().unwrap_or(0);
        if used >= limit {
            return Err(used);
        }
        if used == 0 {
            order.push_back(key.clone());
            while order.len() > REMEMBERED_EXECS {
                if let Some(old) = order.pop_front() {
                    counts.remove(&old);
                }
            }
        }
        counts.insert(key, used + 1);
        Ok(())
    }
}

/// One parsed `sessions` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Help,
    List {
        limit: usize,
        all: bool,
        json: bool,
    },
    Get {
        target: String,
        all: bool,
        last: Option<usize>,
        json: bool,
    },
    Grep(Grep),
}

/// The arguments of `sessions grep`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Grep {
    pattern: String,
    regex: bool,
    session: Option<String>,
    max_sessions: usize,
    max_matches: usize,
}

/// The flags and positional arguments of one command line.
#[derive(Debug, Default)]
struct Parsed {
    flags: HashMap<&'static str, Option<String>>,
    positional: Vec<String>,
}

/// Split `args` into the flags `known` allows (`(name, takes a value)`) and positional
/// arguments; `--` ends the flags. `Err` is a usage message.
fn split_args(
    command: &str,
    args: &[String],
    known: &[(&'static str, bool)],
) -> Result<Parsed, String> {
    let mut parsed = Parsed::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            parsed.positional.extend(rest.by_ref().cloned());
            break;
        }
        if !arg.starts_with("--") {
            parsed.positional.push(arg.clone());
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let Some(&(flag, takes_value)) = known.iter().find(|(f, _)| *f == name) else {
            return Err(format!(
                "sessions {command}: unknown option '{name}'. {USAGE}\n"
            ));
        };
        let value =
            match (takes_value, inline) {
                (true, Some(v)) => Some(v),
                (true, None) => Some(rest.next().cloned().ok_or_else(|| {
                    format!("sessions {command}: {flag} needs a value. {USAGE}\n")
                })?),
                (false, None) => None,
                (false, Some(_)) => {
                    return Err(format!(
                        "sessions {command}: {flag} takes no value. {USAGE}\n"
                    ))
                }
            };
        parsed.flags.insert(flag, value);
    }
    Ok(parsed)
}

impl Parsed {
    fn has(&self, flag: &str) -> bool {
        self.flags.contains_key(flag)
    }

    /// A whole-number flag in `1..=max`, or `default` when absent.
    fn number(
        &self,
        command: &str,
        flag: &str,
        default: usize,
        max: usize,
    ) -> Result<usize, String> {
        let Some(Some(raw)) = self.flags.get(flag) else {
            return Ok(default);
        };
        match raw.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(format!(
                "sessions {command}: {flag} must be a whole number from 1 to {max}, not '{raw}'\n"
            )),
        }
    }
}

impl Command {
    /// Parse the arguments after `sessions`. `Err` is the message of a usage error.
    fn parse(args: &[String]) -> Result<Self, String> {
        let Some((name, rest)) = args.split_first() else {
            return Ok(Command::Help);
        };
        match name.as_str() {
            "help" | "--help" | "-h" if rest.is_empty() => Ok(Command::Help),
            "list" => {
                let p = split_args(
                    "list",
                    rest,
                    &[("--limit", true), ("--all", false), ("--json", false)],
                )?;
                if let Some(extra) = p.positional.first() {
                    return Err(format!(
                        "sessions list: unexpected argument '{extra}'. {USAGE}\n"
                    ));
                }
                Ok(Command::List {
                    limit: p.number("list", "--limit", DEFAULT_LIST_LIMIT, 1000)?,
                    all: p.has("--all"),
                    json: p.has("--json"),
                })
            }
            "get" => {
                let p = split_args(
                    "get",
                    rest,
                    &[
                        ("--all", false),
                        ("--last", true),
                        ("--format", true),
                        ("--json", false),
                    ],
                )?;
                let [target] = p.positional.as_slice() else {
                    return Err(format!(
                        "sessions get: give exactly one session key or id. {USAGE}\n"
                    ));
                };
                let json = match p.flags.get("--format") {
                    None => p.has("--json"),
                    Some(Some(f)) if f == "json" => true,
                    Some(Some(f)) if f == "text" => p.has("--json"),
                    Some(other) => {
                        return Err(format!(
                            "sessions get: --format must be text or json, not '{}'\n",
                            other.as_deref().unwrap_or("")
                        ))
                    }
                };
                let last = match p.has("--last") {
                    true => Some(p.number("get", "--last", 1, usize::MAX)?),
                    false => None,
                };
                Ok(Command::Get {
                    target: target.clone(),
                    all: p.has("--all"),
                    last,
                    json,
                })
            }
            "grep" => {
                let p = split_args(
                    "grep",
                    rest,
                    &[
                        ("--regex", false),
                        ("--session", true),
                        ("--max-sessions", true),
                        ("--max-matches", true),
                    ],
                )?;
                let [pattern] = p.positional.as_slice() else {
                    return Err(format!(
                        "sessions grep: give exactly one pattern (quote it if it has spaces; \
                         put `--` before one that starts with '--'). {USAGE}\n"
                    ));
                };
                if pattern.is_empty() {
                    return Err("sessions grep: the pattern is empty\n".to_string());
                }
                Ok(Command::Grep(Grep {
                    pattern: pattern.clone(),
                    regex: p.has("--regex"),
                    session: p.flags.get("--session").cloned().flatten(),
                    max_sessions: p.number(
                        "grep",
                        "--max-sessions",
                        DEFAULT_GREP_SESSIONS,
                        MAX_GREP_SESSIONS,
                    )?,
                    max_matches: p.number(
                        "grep",
                        "--max-matches",
                        DEFAULT_GREP_MATCHES,
                        MAX_GREP_MATCHES,
                    )?,
                }))
            }
            "help" | "--help" | "-h" => {
                Err(format!("sessions: '{name}' takes no arguments. {USAGE}\n"))
            }
            _ => Err(format!("sessions: unknown command '{name}'. {USAGE}\n")),
        }
    }
}

/// What kind of session a record is, by how it was made.
fn kind(record: &SessionRecord) -> &'static str {
    if record.key.starts_with("schedule:") {
        "schedule"
    } else if record.key.starts_with("spawn:") {
        "spawn"
    } else {
        "session"
    }
}

/// Whether `record` is a child session `spawn --target SELF` made: a `spawn:` session
/// whose parent is one of the agent's own sessions (`own`), or, when the parent is not
/// recorded, whose key names this agent (or `SELF`) as the target.
fn is_self_child(record: &SessionRecord, own: &HashSet<&str>) -> bool {
    if !record.key.starts_with("spawn:") {
        return false;
    }
    match record.parent_id.as_deref() {
        Some(parent) => own.contains(parent),
        None => {
            let segments: Vec<&str> = record.key.split(':').collect();
            segments.len() >= 3 && {
                let target = segments[segments.len() - 2];
                target == record.agent || target == "SELF"
            }
        }
    }
}

/// Unix ms as `2026-12-01T10:15:00Z`.
fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

fn session_json(record: &SessionRecord, children: Option<Vec<Value>>) -> Value {
    let mut v = json!({
        "id": record.id,
        "key": record.key,
        "kind": kind(record),
        "title": record.title,
        "created": time(record.created),
        "updated": time(record.updated),
        "messageCount": record.message_count,
        "parentId": record.parent_id,
    });
    if let (Some(children), Some(obj)) = (children, v.as_object_mut()) {
        obj.insert("children".into(), Value::Array(children));
    }
    v
}

fn session_line(record: &SessionRecord, indent: &str) -> String {
    let mark = match kind(record) {
        "schedule" => " [schedule run]",
        "spawn" => " [spawn]",
        _ => "",
    };
    let title = record
        .title
        .as_deref()
        .map(|t| format!("  \"{t}\""))
        .unwrap_or_default();
    format!(
        "{indent}{}  {}  {}  {} messages{mark}{title}\n",
        record.id,
        time(record.updated),
        record.key,
        record.message_count
    )
}

/// `sessions list`.
async fn list(
    host: &dyn Host,
    agent: &str,
    limit: usize,
    all: bool,
    as_json: bool,
) -> Result<ToolResult, ToolError> {
    let sessions = host.agent_sessions(agent).await?;
    let own: HashSet<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
    let (children, top): (Vec<&SessionRecord>, Vec<&SessionRecord>) =
        sessions.iter().partition(|s| is_self_child(s, &own));
    let hidden = children.len();
    let shown: Vec<&SessionRecord> = top.into_iter().take(limit).collect();
    let children_of = |parent: &str| -> Vec<&SessionRecord> {
        children
            .iter()
            .copied()
            .filter(|c| c.parent_id.as_deref() == Some(parent))
            .collect()
    };
    let output = if as_json {
        let rows: Vec<Value> = shown
            .iter()
            .map(|s| {
                let kids = all.then(|| {
                    children_of(&s.id)
                        .into_iter()
                        .map(|c| session_json(c, None))
                        .collect()
                });
                session_json(s, kids)
            })
            .collect();
        let body = json!({
            "agent": agent,
            "sessions": rows,
            "total": sessions.len() - hidden,
            "hiddenChildren": if all { 0 } else { hidden },
        });
        let mut text = serde_json::to_string_pretty(&body).unwrap_or_default();
        text.push('\n');
        text
    } else {
        let mut text = String::new();
        if shown.is_empty() {
            text.push_str("no sessions yet\n");
        }
        for s in &shown {
            text.push_str(&session_line(s, ""));
            if all {
                for c in children_of(&s.id) {
                    text.push_str(&session_line(c, "  ↳ "));
                }
            }
        }
        let total = sessions.len() - hidden;
        if total > shown.len() {
            let _ = writeln!(
                text,
                "({} of {total} sessions shown; --limit N shows more)",
                shown.len()
            );
        }
        if hidden > 0 && !all {
            let _ = writeln!(
                text,
                "({hidden} child sessions of `spawn --target SELF` hidden; --all shows them)"
            );
        }
        text
    };
    Ok(ToolResult::ok(cap(
        output,
        "use --limit N for fewer sessions",
    )))
}

/// `sessions get`.
async fn get(
    host: &dyn Host,
    agent: &str,
    target: &str,
    all: bool,
    last: Option<usize>,
    as_json: bool,
) -> Result<ToolResult, ToolError> {
    let Some(record) = host.agent_session(agent, target).await? else {
        return Ok(ToolResult::fail(NOT_FOUND, 1));
    };
    let Some(mut messages) = host.agent_session_messages(agent, &record.id, all).await? else {
        return Ok(ToolResult::fail(NOT_FOUND, 1));
    };
    let total = messages.len();
    if let Some(n) = last {
        messages.drain(..total.saturating_sub(n));
    }
    if as_json {
        return Ok(ToolResult::ok(transcript_json(&record, &messages, total)));
    }
    let mut text = format!(
        "SESSION {} ({}){}\n{} of {} messages{}\n",
        record.id,
        record.key,
        record
            .title
            .as_deref()
            .map(|t| format!(" \"{t}\""))
            .unwrap_or_default(),
        messages.len(),
        total,
        if all { ", compacted ones included" } else { "" },
    );
    for m in &messages {
        text.push_str("---\n");
        text.push_str(&message_text(m));
    }
    Ok(ToolResult::ok(cap(
        text,
        "use --last N for the latest messages only",
    )))
}

/// The heading and text of one message.
fn message_text(m: &StoredMessage) -> String {
    let role = match (m.summary, m.message.role) {
        (true, _) => "summary",
        (false, Role::User) => "user",
        (false, Role::Assistant) => "assistant",
    };
    let mut out = format!(
        "#{} {role} {}{}{}\n",
        m.seq,
        time(m.created),
        m.model
            .as_deref()
            .map(|model| format!(" {model}"))
            .unwrap_or_default(),
        if m.compacted { " (compacted)" } else { "" }
    );
    for block in &m.message.content {
        match block {
            Block::Text { text } => out.push_str(text),
            Block::Image { mime_type, data } => {
                let _ = write!(out, "[image {mime_type}, {} bytes of base64]", data.len());
            }
            Block::Thinking { .. } => out.push_str("[thinking]"),
            Block::ToolUse { name, input, .. } => {
                let _ = write!(out, "[tool call: {name} {input}]");
            }
            Block::ToolResult {
                content, is_error, ..
            } => {
                out.push_str(if *is_error {
                    "[tool result, error]\n"
                } else {
                    "[tool result]\n"
                });
                for part in content {
                    match part {
                        ToolResultPart::Text { text } => out.push_str(text),
                        ToolResultPart::Image { mime_type, .. } => {
                            let _ = write!(out, "[image {mime_type}]");
                        }
                    }
                }
            }
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The transcript as one JSON object; whole messages are left out from the end once the
/// output would pass [`MAX_OUTPUT`], and `truncated` says how many.
fn transcript_json(record: &SessionRecord, messages: &[StoredMessage], total: usize) -> String {
    let head = json!({
        "session": session_json(record, None),
        "totalMessages": total,
    });
    let rows: Vec<Value> = messages
        .iter()
        .map(|m| {
            json!({
                "seq": m.seq,
                "role": if m.summary { "summary" } else { match m.message.role { Role::User => "user", Role::Assistant => "assistant" } },
                "created": time(m.created),
                "model": m.model,
                "compacted": m.compacted,
                "content": m.message.content,
            })
        })
        .collect();
    // Room for the note, the object around the messages and the head.
    let budget = MAX_OUTPUT.saturating_sub(head.to_string().len() + 512);
    let mut used = 0;
    let mut kept = Vec::new();
    for row in &rows {
        let len = row.to_string().len() + 1;
        if used + len > budget {
            break;
        }
        used += len;
        kept.push(row.clone());
    }
    let left_out = rows.len() - kept.len();
    let mut body = head;
    if let Some(obj) = body.as_object_mut() {
        obj.insert("messages".into(), Value::Array(kept));
        obj.insert(
            "truncated".into(),
            if left_out == 0 {
                Value::Null
            } else {
                json!(format!(
                    "output limited to {MAX_OUTPUT} bytes: the last {left_out} of these {} messages were left out; use --last N",
                    rows.len()
                ))
            },
        );
    }
    let mut text = body.to_string();
    text.push('\n');
    text
}

/// `output` cut to [`MAX_OUTPUT`] bytes (at a character boundary) with a note saying so
/// and `hint`; the note is counted in the limit.
fn cap(mut output: String, hint: &str) -> String {
    if output.len() <= MAX_OUTPUT {
        return output;
    }
    let total = output.len();
    let note =
        format!("\n[sessions: output cut at {MAX_OUTPUT} bytes (64 KiB) of {total}; {hint}]\n");
    let mut cut = MAX_OUTPUT - note.len();
    while !output.is_char_boundary(cut) {
        cut -= 1;
    }
    output.truncate(cut);
    output.push_str(&note);
    output
}

/// The text of a message that `grep` searches: its text, tool calls and tool results.
fn searchable_text(m: &StoredMessage) -> String {
    let mut out = String::new();
    for block in &m.message.content {
        match block {
            Block::Text { text } => out.push_str(text),
            Block::ToolUse { name, input, .. } => {
                let _ = write!(out, "{name} {input}");
            }
            Block::ToolResult { content, .. } => {
                for part in content {
                    if let ToolResultPart::Text { text } = part {
                        out.push_str(text);
                        out.push('\n');
                    }
                }
            }
            Block::Image { .. } | Block::Thinking { .. } => {}
        }
        out.push('\n');
    }
    out
}

/// What `grep` looks for.
enum Matcher {
    Substring(String),
    Regex(regex::Regex),
}

impl Matcher {
    /// The byte range of the first match in `text`.
    fn find(&self, text: &str) -> Option<(usize, usize)> {
        match self {
            Matcher::Substring(s) => text.find(s.as_str()).map(|i| (i, i + s.len())),
            Matcher::Regex(r) => r.find(text).map(|m| (m.start(), m.end())),
        }
    }

    /// The first match in `line`, searched in windows of [`GREP_WINDOW`] bytes when the
    /// line is longer; `None` also when `deadline` passed.
    fn find_in_line(&self, line: &str, deadline: Instant) -> Option<(usize, usize)> {
        if line.len() <= GREP_WINDOW {
            return self.find(line);
        }
        let mut start = 0;
        while start < line.len() {
            if Instant::now() >= deadline {
                return None;
            }
            let mut end = (start + GREP_WINDOW).min(line.len());
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            if let Some((s, e)) = self.find(&line[start..end]) {
                return Some((start + s, start + e));
            }
            if end == line.len() {
                break;
            }
            let mut next = end.saturating_sub(GREP_OVERLAP).max(start + 1);
            while !line.is_char_boundary(next) {
                next += 1;
            }
            start = next;
        }
        None
    }
}

/// One matching line, ready to print.
struct Hit {
    seq: i64,
    role: &'static str,
    excerpt: String,
}

/// `line` shortened to [`GREP_CONTEXT`] characters on each side of the match.
fn excerpt(line: &str, (start, end): (usize, usize)) -> String {
    let before: String = {
        let chars: Vec<char> = line[..start].chars().rev().take(GREP_CONTEXT).collect();
        chars.into_iter().rev().collect()
    };
    let matched: String = line[start..end].chars().take(GREP_CONTEXT * 2).collect();
    let after: String = line[end..].chars().take(GREP_CONTEXT).collect();
    let lead = if before.len() < start { "…" } else { "" };
    let tail = if after.len() < line.len() - end {
        "…"
    } else {
        ""
    };
    format!("{lead}{before}{matched}{after}{tail}")
}

/// Search `messages` for lines `matcher` finds, at most `room` of them, until `deadline`.
/// The second value is `false` when the deadline cut the search short.
fn search_messages(
    matcher: &Matcher,
    messages: &[StoredMessage],
    room: usize,
    deadline: Instant,
) -> (Vec<Hit>, bool) {
    let mut hits = Vec::new();
    for m in messages {
        let text = searchable_text(m);
        for line in text.lines() {
            if Instant::now() >= deadline {
                return (hits, false);
            }
            if let Some(range) = matcher.find_in_line(line, deadline) {
                hits.push(Hit {
                    seq: m.seq,
                    role: if m.summary {
                        "summary"
                    } else {
                        match m.message.role {
                            Role::User => "user",
                            Role::Assistant => "assistant",
                        }
                    },
                    excerpt: excerpt(line, range),
                });
                if hits.len() >= room {
                    return (hits, true);
                }
            }
        }
    }
    (hits, Instant::now() < deadline)
}

/// `sessions grep`.
async fn run_grep(host: Arc<dyn Host>, agent: &str, grep: Grep) -> Result<ToolResult, ToolError> {
    let started = Instant::now();
    let deadline = started + GREP_TIME_LIMIT;
    let matcher = if grep.regex {
        match regex::RegexBuilder::new(&grep.pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(4 * REGEX_SIZE_LIMIT)
            .build()
        {
            Ok(r) => Matcher::Regex(r),
            Err(e) => {
                return Ok(ToolResult::fail(
                    format!(
                        "sessions grep: the pattern is not a usable regex ({e}); \
                         simplify it, or drop --regex for a plain substring search\n"
                    ),
                    2,
                ))
            }
        }
    } else {
        Matcher::Substring(grep.pattern.clone())
    };
    let sessions: Vec<SessionRecord> = match &grep.session {
        Some(target) => match host.agent_session(agent, target).await? {
            Some(record) => vec![record],
            None => return Ok(ToolResult::fail(NOT_FOUND, 1)),
        },
        None => host.agent_sessions(agent).await?,
    };
    let available = sessions.len();
    let matcher = Arc::new(matcher);
    let mut out = String::new();
    let mut matches = 0usize;
    let mut searched = 0usize;
    let mut sessions_hit = 0usize;
    let mut timed_out = false;
    for record in sessions.into_iter().take(grep.max_sessions) {
        if matches >= grep.max_matches {
            break;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        let Some(messages) = host.agent_session_messages(agent, &record.id, true).await? else {
            continue;
        };
        let room = grep.max_matches - matches;
        let m = matcher.clone();
        let (hits, finished) =
            tokio::task::spawn_blocking(move || search_messages(&m, &messages, room, deadline))
                .await
                .map_err(|e| {
                    ToolError::Failed(format!("sessions grep: the search task failed: {e}"))
                })?;
        searched += 1;
        if !hits.is_empty() {
            sessions_hit += 1;
        }
        for hit in &hits {
            let _ = writeln!(
                out,
                "{} {} #{} {}: {}",
                record.id, record.key, hit.seq, hit.role, hit.excerpt
            );
        }
        matches += hits.len();
        if !finished {
            timed_out = true;
            break;
        }
    }
    let _ = write!(
        out,
        "({matches} matching lines in {sessions_hit} sessions; searched {searched} of {available} sessions"
    );
    if matches >= grep.max_matches {
        let _ = write!(out, "; stopped at --max-matches {}", grep.max_matches);
    }
    if timed_out {
        let _ = write!(
            out,
            "; stopped after {} s, the time limit of one search",
            GREP_TIME_LIMIT.as_secs()
        );
    } else if searched < available && matches < grep.max_matches {
        let _ = write!(
            out,
            "; --max-sessions N searches more, up to {MAX_GREP_SESSIONS}"
        );
    }
    out.push_str(")\n");
    let code = if matches == 0 { 1 } else { 0 };
    let output = cap(out, "use a narrower pattern, --session or --max-matches");
    Ok(ToolResult {
        output,
        exit_code: code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_the_three_commands() {
        assert_eq!(Command::parse(&[]).unwrap(), Command::Help);
        assert_eq!(
            Command::parse(&args(&["list"])).unwrap(),
            Command::List {
                limit: 20,
                all: false,
                json: false
            }
        );
        assert_eq!(
            Command::parse(&args(&["list", "--limit=3", "--json", "--all"])).unwrap(),
            Command::List {
                limit: 3,
                all: true,
                json: true
            }
        );
        assert_eq!(
            Command::parse(&args(&[
                "get",
                "telegram:42",
                "--last",
                "5",
                "--format",
                "json"
            ]))
            .unwrap(),
            Command::Get {
                target: "telegram:42".into(),
                all: false,
                last: Some(5),
                json: true
            }
        );
        assert_eq!(
            Command::parse(&args(&["grep", "--regex", "--", "--x+"])).unwrap(),
            Command::Grep(Grep {
                pattern: "--x+".into(),
                regex: true,
                session: None,
                max_sessions: 20,
                max_matches: 50
            })
        );
        for bad in [
            &["list", "--agent", "b"][..],
            &["get"],
            &["get", "a", "b"],
            &["get", "x", "--format", "xml"],
            &["grep", "x", "--max-sessions", "201"],
            &["grep", "x", "--max-matches", "0"],
            &["grep", ""],
            &["fetch"],
            &["list", "--limit"],
        ] {
            let err = Command::parse(&args(bad)).unwrap_err();
            assert!(err.starts_with("sessions"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn counts_calls_per_exec() {
        let calls = ExecCalls::default();
        for _ in 0..3 {
            calls.note("a", "x1", 3).unwrap();
        }
        assert_eq!(calls.note("a", "x1", 3), Err(3));
        // Another exec, or the same id of another agent, has its own count.
        calls.note("a", "x2", 3).unwrap();
        calls.note("b", "x1", 3).unwrap();
        // Old execs are forgotten, so the map stays bounded.
        for i in 0..REMEMBERED_EXECS + 10 {
            calls.note("a", &format!("y{i}"), 3).unwrap();
        }
        let guard = calls.0.lock().unwrap();
        assert_eq!(guard.0.len(), REMEMBERED_EXECS);
        assert_eq!(guard.1.len(), REMEMBERED_EXECS);
    }

    #[test]
    fn caps_output_with_a_note_inside_the_limit() {
        let small = "abc".to_string();
        assert_eq!(cap(small.clone(), "hint"), small);
        let big = "é".repeat(MAX_OUTPUT);
        let out = cap(big, "use --last N");
        assert!(out.len() <= MAX_OUTPUT, "{}", out.len());
        assert!(
            out.ends_with("; use --last N]\n"),
            "{}",
            &out[out.len() - 100..]
        );
        assert!(out.contains("output cut at 65536 bytes (64 KiB) of 131072"));
    }

    #[test]
    fn long_lines_are_searched_in_windows() {
        let far = Instant::now() + Duration::from_secs(60);
        let m = Matcher::Substring("needle".into());
        let mut line = "x".repeat(300_000);
        line.push_str("needle");
        line.push_str(&"y".repeat(1000));
        let found = m.find_in_line(&line, far).unwrap();
        assert_eq!(&line[found.0..found.1], "needle");
        // A match straddling a window edge is found by the overlap.
        let mut edge = "x".repeat(GREP_WINDOW - 3);
        edge.push_str("needle");
        edge.push_str(&"z".repeat(GREP_WINDOW));
        let (s, _) = m.find_in_line(&edge, far).unwrap();
        assert_eq!(s, GREP_WINDOW - 3);
        assert!(m.find_in_line(&"x".repeat(200_000), far).is_none());
        let ex = excerpt(&line, found);
        assert!(ex.starts_with('…') && ex.ends_with('…') && ex.contains("needle"));
    }
}
