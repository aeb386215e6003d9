//! The audit log: what every tool call was, who allowed it, how it ended.
//!
//! Owns the record format (the original's JSONL fields and phases), the [`AuditSink`]
//! trait, [`JsonlAudit`] (an append-only file with rotation by size and age that never
//! deletes records younger than a retention, and redaction of configured secret values)
//! and [`BoundedAudit`], which every gateway puts in front of its sink so that a sandbox
//! cannot erase the log by filling it: denied and malformed requests are recorded with a
//! bounded excerpt and a hash of their arguments, and each agent has a budget of audit
//! bytes per minute beyond which its calls are refused. A sink that cannot write (or
//! refuses) returns an error, and the caller then refuses the call (fail closed). It does
//! not decide anything else about the call.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::vocab::ToolKind;

pub mod chain;
/// `beige audit export`: the log as JSONL, OCSF events or OTLP logs, offline.
pub mod export;

/// `started` before a call runs, `finished` after (or at once for a denied call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Written once a call is allowed, just before it runs.
    Started,
    /// Written when the call has ended (with its duration, exit code and any error), or
    /// at once for a call that was refused or an event that is not a call.
    Finished,
    /// On `type: budget` records: a budget reached 80 % (once per scope and period).
    Warning,
    /// On `type: budget` records: a budget was reached and the turn (or call) ended.
    Exhausted,
    /// A schedule's fire instant was claimed (`type: schedule`).
    Claimed,
    /// A schedule's fire instant was recorded without running (missed, too late,
    /// overlapping).
    Skipped,
    /// A schedule run cut off by a crash, found after the restart.
    Interrupted,
}

/// `core_tool` or `tool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditType {
    /// One of the four core tools (`read`, `write`, `patch`, `exec`).
    CoreTool,
    /// A plugin tool, called by a script in the sandbox over the tool socket.
    Tool,
    /// A security event that is not a tool call, e.g. `security.link_reject`.
    Security,
    /// An outbound connection from a sandbox (`egress.connect`), with its `egress`
    /// object.
    Egress,
    /// A step of an approval request, with its `approval` object.
    Approval,
    /// A budget warning or exhaustion (`phase: warning | exhausted`); `tool` is
    /// `budget.<scope>.<key>` and `args` carry `scope=`, `key=`, `limit=`, `used=`,
    /// `sessionId=` and `turn=`.
    Budget,
    /// A sub-agent's run (`phase: started | finished`), with its `spawn` object.
    Spawn,
    /// A step of a schedule run (`phase: claimed | started | finished | skipped |
    /// interrupted`); `tool` is the schedule id and `args` carry `run=`, `fireAt=`,
    /// `status=`, `session=`, `exec=`.
    Schedule,
    /// A person's authentication or a refusal of what they asked (`tool`
    /// `auth.token_created`, `auth.token_revoked`, `auth.failed`, `auth.refused`,
    /// `auth.login`, `auth.logout`), with `principal` and `via` when known. `agent` is
    /// the agent concerned, or `*` for the gateway.
    Auth,
    /// A prompt accepted for an agent (`tool: "prompt"`), with its session, channel,
    /// `principal` (the person, or `system` for the gateway's own runs) and `via`;
    /// `args` carry the message's size, never its text.
    Prompt,
}

impl AuditType {
    /// The record's kind as the human log and `beige audit` show it (`CORE`, `AUTH`, …).
    pub fn label(self) -> &'static str {
        match self {
            AuditType::CoreTool => "CORE",
            AuditType::Tool => "TOOL",
            AuditType::Security => "SECURITY",
            AuditType::Egress => "EGRESS",
            AuditType::Approval => "APPROVAL",
            AuditType::Budget => "BUDGET",
            AuditType::Spawn => "SPAWN",
            AuditType::Schedule => "SCHEDULE",
            AuditType::Auth => "AUTH",
            AuditType::Prompt => "PROMPT",
        }
    }
}

impl From<ToolKind> for AuditType {
    fn from(k: ToolKind) -> Self {
        match k {
            ToolKind::Core => AuditType::CoreTool,
            ToolKind::Plugin => AuditType::Tool,
        }
    }
}

/// `allowed` or `denied`: whether the call was let run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditDecision {
    /// The policy (or the approver) and the `preToolExec` hooks let the call run.
    Allowed,
    /// The call was refused before it ran; the record's `error` says why.
    Denied,
}

/// Where the call ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// On the host, in the gateway: plugin tools and security events.
    Gateway,
    /// In the agent's sandbox: the core tools.
    Sandbox,
}

/// One line of `audit.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// Local time, `YYYY-MM-DDTHH:MM:SS.mmm±HH:MM`.
    pub ts: String,
    /// The agent that made the call (or whose sandbox the event concerns).
    pub agent: String,
    /// The session key the call ran in, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The model that asked for the call; unset for calls from a script in the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The channel the session's prompts come from (`api`, `telegram`, `socket`, …),
    /// when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// New in beige, on calls of an authenticated outside client (the MCP server): who
    /// made the call (`owner` for the gateway's token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// New in beige, with `principal`: the connection the call came through
    /// (`mcp:<token id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Whether this is the record before the call ran or after it ended.
    pub phase: Phase,
    /// What kind of call (or event) this is; `type` in the log.
    #[serde(rename = "type")]
    pub kind: AuditType,
    /// The tool's name, or for a security event its name (`security.link_reject`, …);
    /// cut to [`MAX_TOOL_LEN`].
    pub tool: String,
    /// The call's arguments as text: for a core tool its path or command (`write` adds
    /// the content's size), for a plugin tool the arguments the script passed.
    pub args: Vec<String>,
    /// Whether the call was let run.
    pub decision: AuditDecision,
    /// Where the call ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// On `finished` records: how long the call ran, in milliseconds (`0` when it was
    /// refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// On `finished` records of calls that ran: the exit code after the `postToolExec`
    /// hooks (for a core tool `0`, or `1` when it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// On `finished` records of calls that ran: the size in bytes of the output the
    /// model or script got back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Why the call was refused or what went wrong running it; for a security event,
    /// what happened. Cut to [`MAX_ERROR_LEN`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// New in beige, on denied records: the size in bytes of the full arguments (the sum
    /// of their UTF-8 lengths), whatever `args` kept of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_bytes: Option<u64>,
    /// New in beige, on denied records: SHA-256 (hex) of the full arguments as a compact
    /// JSON array, after redaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_sha256: Option<String>,
    /// New in beige: `true` when `args` is an excerpt of longer arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_truncated: Option<bool>,
    /// On `type: egress` records: the connection (`id`, `entry`, `host`, `port`, `ip`,
    /// `mode`, `rule`, `policyVersion`, `bytesUp`, `bytesDown`, and `reason` when it was
    /// refused; fields that do not apply are left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<serde_json::Value>,
    /// New in beige: the exec the call belongs to — for a plugin call from the sandbox,
    /// the exec its calling process was attributed to; for a core `exec`, its own id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<crate::ident::ExecId>,
    /// New in beige, on records of calls from the sandbox: how the calling process was
    /// bound to `exec` (`session-id`, `ancestry`), or `unbound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<crate::ident::AttributionMethod>,
    /// New in beige, with traces on: the trace of the span the record was written in
    /// (32 hex digits), as exported over OTLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// New in beige, with traces on: that span's id (16 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// On `type: approval` records: the request and the step (`phase` requested,
    /// decided, refused, expired, consumed, unattended), with the approver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalAudit>,
    /// On `type: spawn` records: `parent {agent, session, exec}`, `child {agent,
    /// session}`, `depth`, `rights {tools, digest}`, and on `finished` records `status`
    /// and `costMicros`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn: Option<serde_json::Value>,
    /// New in beige, on records of a sub-agent's calls: the session that spawned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<String>,
}

/// The `approval` object of a `type: approval` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalAudit {
    /// The request's id (empty for an unattended denial, which makes no request).
    pub id: String,
    /// `requested`, `decided`, `refused` (a decision that was not taken), `expired`,
    /// `consumed` or `unattended`.
    pub phase: String,
    /// SHA-256 of the canonical call.
    pub call_digest: String,
    /// The rule that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// `once`, `session`, `duration` or `always`, on approvals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Who decided (or tried to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// The channel the decision came through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// The approver's words, or why a decision was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The exec that made the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// The call's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// Bytes of arguments a denied record keeps, all arguments together.
pub const DENIED_ARGS_EXCERPT: usize = 1024;
/// Longest `error` a record keeps.
pub const MAX_ERROR_LEN: usize = 2048;
/// Longest `tool` a record keeps (registered tool names are far shorter; a refused
/// request may name anything).
pub const MAX_TOOL_LEN: usize = 128;

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What a `type: budget` record says about the budget.
#[derive(Debug, Clone, Copy)]
pub struct BudgetFacts<'a> {
    /// `session`, `turn`, `agent.day`, `exec`.
    pub scope: &'a str,
    /// `tokens`, `costUsd`, `modelCalls`, `wallSeconds`, `toolCalls`.
    pub key: &'a str,
    /// The limit.
    pub limit: f64,
    /// How much was used.
    pub used: f64,
    /// The session's id, when the budget concerns one.
    pub session_id: Option<&'a str>,
    /// The turn's id, when the budget concerns one.
    pub turn: Option<&'a str>,
}

impl AuditRecord {
    /// A `type: budget` record: `phase` [`Phase::Warning`] (allowed) or
    /// [`Phase::Exhausted`] (denied, `error` the message).
    pub fn budget(
        phase: Phase,
        agent: &str,
        session: Option<&str>,
        facts: &BudgetFacts<'_>,
        error: Option<String>,
    ) -> Self {
        let decision = if phase == Phase::Exhausted {
            AuditDecision::Denied
        } else {
            AuditDecision::Allowed
        };
        let mut args = vec![
            format!("scope={}", facts.scope),
            format!("key={}", facts.key),
            format!("limit={}", facts.limit),
            format!("used={}", facts.used),
        ];
        if let Some(s) = facts.session_id {
            args.push(format!("sessionId={s}"));
        }
        if let Some(t) = facts.turn {
            args.push(format!("turn={t}"));
        }
        let mut r = Self::security(
            agent,
            &format!("budget.{}.{}", facts.scope, facts.key),
            args,
            decision,
        );
        r.kind = AuditType::Budget;
        r.phase = phase;
        r.session = session.map(str::to_string);
        r.error = error;
        r
    }

    /// A record of an event that is not a tool call (`type: security`), `finished`.
    pub fn security(agent: &str, tool: &str, args: Vec<String>, decision: AuditDecision) -> Self {
        Self {
            trace_id: None,
            span_id: None,
            ts: now_ts(),
            agent: agent.to_string(),
            session: None,
            model: None,
            channel: None,
            principal: None,
            via: None,
            phase: Phase::Finished,
            kind: AuditType::Security,
            tool: tool.to_string(),
            args,
            decision,
            target: Some(Target::Gateway),
            duration_ms: None,
            exit_code: None,
            output_bytes: None,
            error: None,
            args_bytes: None,
            args_sha256: None,
            args_truncated: None,
            egress: None,
            approval: None,
            spawn: None,
            parent_session: None,
            exec: None,
            attribution: None,
        }
    }

    /// Bound what a record carries: on a denied record the arguments become an excerpt
    /// of at most [`DENIED_ARGS_EXCERPT`] bytes with their full size and hash
    /// (`argsBytes`, `argsSha256`, `argsTruncated`); on every record `tool` and `error`
    /// are cut to [`MAX_TOOL_LEN`] and [`MAX_ERROR_LEN`].
    pub fn bound(&mut self) {
        if self.tool.len() > MAX_TOOL_LEN {
            self.tool = format!("{}…", cut(&self.tool, MAX_TOOL_LEN));
        }
        if let Some(e) = &mut self.error {
            if e.len() > MAX_ERROR_LEN {
                *e = format!("{}… ({} bytes)", cut(e, MAX_ERROR_LEN), e.len());
            }
        }
        if self.decision != AuditDecision::Denied || self.args_sha256.is_some() {
            return;
        }
        let total: usize = self.args.iter().map(String::len).sum();
        let json = serde_json::to_vec(&self.args).unwrap_or_default();
        self.args_bytes = Some(total as u64);
        self.args_sha256 = Some(hex::encode(sha2::Sha256::digest(&json)));
        if total <= DENIED_ARGS_EXCERPT {
            return;
        }
        let mut room = DENIED_ARGS_EXCERPT;
        let mut kept = Vec::new();
        for a in &self.args {
            if room == 0 {
                break;
            }
            let part = cut(a, room);
            room -= part.len();
            kept.push(if part.len() < a.len() {
                format!("{part}…")
            } else {
                part.to_string()
            });
        }
        self.args = kept;
        self.args_truncated = Some(true);
    }

    /// About how many bytes the record takes in the log (without computing the line).
    pub fn approx_len(&self) -> u64 {
        let strings = [
            &self.session,
            &self.model,
            &self.channel,
            &self.error,
            &self.args_sha256,
        ]
        .iter()
        .filter_map(|s| s.as_ref().map(String::len))
        .sum::<usize>();
        let args: usize = self.args.iter().map(|a| a.len() + 3).sum();
        (200 + self.ts.len() + self.agent.len() + self.tool.len() + strings + args) as u64
    }
}

/// The current local time in the audit format.
pub fn now_ts() -> String {
    chrono::Local::now()
        .format("%Y-%m-%dT%H:%M:%S%.3f%:z")
        .to_string()
}

/// The audit record could not be written, or was refused; the call must not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The audit log cannot be written.
    #[error("the audit log {path} cannot be written ({source}); tool calls are refused until it can. Check the permissions and free space of its folder.")]
    Write {
        /// The log file that could not be written.
        path: String,
        /// The I/O error writing it.
        #[source]
        source: std::io::Error,
    },
    /// The agent used up its audit budget ([`BoundedAudit`]).
    #[error("agent '{agent}' made more than {budget} bytes of audit records within a minute (gateway.audit.budgetBytesPerMinute); its tool calls are refused for about {retry_secs} s. Make fewer or smaller calls (the owner can raise the budget)")]
    Throttled {
        /// The agent over its budget.
        agent: String,
        /// Its budget, in bytes of records per minute.
        budget: u64,
        /// About how many seconds until enough of the budget is back for a call.
        retry_secs: u64,
    },
}

/// Where audit records go.
#[async_trait]
pub trait AuditSink: Send + Sync + std::fmt::Debug {
    /// Write one record. An error means it was not written (or was refused), and the
    /// call it belongs to must not run.
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError>;
}

/// `logs/audit.jsonl`, rotated by size (and age) to `.1` … `.N`, secrets redacted as
/// `***`. A rotated file that still holds records younger than the retention is never
/// deleted: rotation keeps more files than `max_files` instead, and warns.
#[derive(Debug)]
pub struct JsonlAudit {
    path: PathBuf,
    max_size: u64,
    max_files: u32,
    retention: Duration,
    max_age: Duration,
    secrets: Vec<String>,
    /// What appending needs, under one lock so that file order is `seq` order.
    state: Mutex<WriterState>,
}

#[derive(Debug, Default)]
struct WriterState {
    /// When the current file was begun (for rotation by age), once known.
    begun: Option<SystemTime>,
    /// The hash chain, when the log is chained ([`JsonlAudit::chained`]).
    chain: Option<chain::ChainWriter>,
}

/// Shortest value treated as a secret (shorter ones would redact ordinary words).
const MIN_SECRET_LEN: usize = 6;

/// Secret values worth redacting, longest first (so a secret containing another is
/// replaced whole).
fn secret_list(secrets: Vec<String>) -> Vec<String> {
    let mut secrets: Vec<String> = secrets
        .into_iter()
        .filter(|s| s.len() >= MIN_SECRET_LEN)
        .collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

fn redact_value(secrets: &[String], v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => redact_str(secrets, s),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|x| redact_value(secrets, x)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|x| redact_value(secrets, x)),
        _ => {}
    }
}

fn redact_str(secrets: &[String], s: &mut String) {
    for secret in secrets {
        if s.contains(secret.as_str()) {
            *s = s.replace(secret.as_str(), "***");
        }
    }
}

/// `path` with `.n` appended.
fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl JsonlAudit {
    /// `secrets` are values replaced by `***` wherever they appear in a record. Rotation
    /// by size only and no retention (as the original) until [`JsonlAudit::retention`]
    /// and [`JsonlAudit::max_age`] say otherwise.
    pub fn new(
        path: impl Into<PathBuf>,
        max_size: u64,
        max_files: u32,
        secrets: Vec<String>,
    ) -> Self {
        Self {
            path: path.into(),
            max_size,
            max_files,
            retention: Duration::ZERO,
            max_age: Duration::ZERO,
            secrets: secret_list(secrets),
            state: Mutex::new(WriterState::default()),
        }
    }

    /// Chain the records ([`chain`]): each line gets `seq`, `prev` and `hash`, signed
    /// checkpoints are written with `key`, and the head is kept in `head_path`.
    /// `installation` names the chain (its genesis and its checkpoints' origin).
    pub fn chained(
        self,
        key: chain::SigningKey,
        installation: impl Into<String>,
        head_path: impl Into<PathBuf>,
    ) -> Self {
        let writer = chain::ChainWriter::new(key, installation.into(), head_path.into());
        self.state.lock().unwrap_or_else(|e| e.into_inner()).chain = Some(writer);
        self
    }

    /// Never delete a rotated file whose last record is younger than this
    /// (`Duration::ZERO`: rotation deletes the oldest beyond `max_files`, as before).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Also rotate the current file once it was begun this long ago
    /// (`Duration::ZERO`: by size only).
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// The current log file (rotated files are it with `.1` … appended).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The line written for a record (redacted, without the newline).
    pub fn line(&self, record: &AuditRecord) -> String {
        let mut v = serde_json::to_value(record).unwrap_or_default();
        redact_value(&self.secrets, &mut v);
        v.to_string()
    }

    /// Whether the current file is due for rotation: `begun` is when it was started.
    fn due(&self, begun: &mut Option<SystemTime>) -> bool {
        let Ok(meta) = std::fs::metadata(&self.path) else {
            *begun = None;
            return false;
        };
        if meta.len() == 0 {
            return false;
        }
        if self.max_size > 0 && meta.len() >= self.max_size {
            return true;
        }
        if self.max_age.is_zero() {
            return false;
        }
        let started = *begun.get_or_insert_with(|| {
            meta.created()
                .or_else(|_| meta.modified())
                .unwrap_or_else(|_| SystemTime::now())
        });
        started
            .elapsed()
            .map(|age| age >= self.max_age)
            .unwrap_or(false)
    }

    /// May the file at `path` be deleted: all its records are older than the retention.
    fn expired(&self, path: &Path) -> bool {
        if self.retention.is_zero() {
            return true;
        }
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= self.retention)
    }

    /// Indices of the rotated files present (`audit.jsonl.N`), ascending.
    fn rotated(&self) -> Vec<u32> {
        let (Some(dir), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Vec::new();
        };
        let prefix = format!("{}.", name.to_string_lossy());
        let mut out: Vec<u32> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_prefix(&prefix)?
                            .parse::<u32>()
                            .ok()
                    })
                    .filter(|n| *n > 0)
                    .collect()
            })
            .unwrap_or_default();
        out.sort_unstable();
        out
    }

    /// Shift `audit.jsonl` → `.1` → `.2` …, deleting from the oldest end what would
    /// pass `max_files` — but only files whose records are all older than the retention.
    fn rotate(&self) {
        let mut present = self.rotated();
        // Index 0 stands for the current file.
        while let Some(&oldest) = present.last() {
            if oldest < self.max_files || !self.expired(&numbered(&self.path, oldest)) {
                break;
            }
            let _ = std::fs::remove_file(numbered(&self.path, oldest));
            present.pop();
        }
        if self.max_files == 0 && present.is_empty() && self.expired(&self.path) {
            let _ = std::fs::remove_file(&self.path);
            return;
        }
        for &i in present.iter().rev() {
            let _ = std::fs::rename(numbered(&self.path, i), numbered(&self.path, i + 1));
        }
        let _ = std::fs::rename(&self.path, numbered(&self.path, 1));
        let kept = present.len() as u32 + 1;
        if kept > self.max_files {
            tracing::warn!(
                path = %self.path.display(),
                kept,
                max_files = self.max_files,
                retention_days = self.retention.as_secs() / 86_400,
                "the audit log keeps more rotated files than gateway.log.maxFiles because the oldest still holds records younger than gateway.audit.retentionDays; raise gateway.log.maxFiles or maxSizeBytes, and check which agent writes this much"
            );
        }
    }

    /// Append `record` (redacted, as JSON); returns the line written for it.
    fn append(&self, record: serde_json::Value) -> std::io::Result<String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let WriterState { begun, chain } = &mut *state;
        let mut text = String::new();
        if self.due(begun) {
            if let Some(c) = chain.as_mut() {
                let closing = c.closing_lines();
                if !closing.is_empty() {
                    if let Err(e) = append_to(&self.path, closing.as_bytes()) {
                        c.forget();
                        return Err(e);
                    }
                }
            }
            self.rotate();
            *begun = None;
            if let Some(c) = chain.as_mut() {
                text.push_str(&c.opening_lines());
            }
        }
        let line = match chain.as_mut() {
            Some(c) => {
                let (lines, own) = c.lines_for(&self.path, record)?;
                text.push_str(&lines);
                own
            }
            None => {
                let line = record.to_string();
                text.push_str(&line);
                text.push('\n');
                line
            }
        };
        // Opened per record, so a log that became unwritable is noticed at once.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .inspect_err(|_| {
                if let Some(c) = chain.as_mut() {
                    c.forget();
                }
            })?;
        if begun.is_none() && !self.max_age.is_zero() {
            let empty = f.metadata().map(|m| m.len() == 0).unwrap_or(true);
            if empty {
                *begun = Some(SystemTime::now());
            }
        }
        match f.write_all(text.as_bytes()) {
            Ok(()) => {
                if let Some(c) = chain.as_mut() {
                    c.committed();
                }
                Ok(line)
            }
            Err(e) => {
                if let Some(c) = chain.as_mut() {
                    c.forget();
                }
                Err(e)
            }
        }
    }
}

/// Append `bytes` to the file at `path`.
fn append_to(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(bytes)
}

#[async_trait]
impl AuditSink for JsonlAudit {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let mut v = serde_json::to_value(record).unwrap_or_default();
        redact_value(&self.secrets, &mut v);
        let line = self.append(v).map_err(|source| AuditError::Write {
            path: self.path.display().to_string(),
            source,
        })?;
        tracing::info!(target: "beige::audit", "{}", human_line(record, &line));
        Ok(())
    }
}

/// The audit volume one agent may cause: `bytes_per_minute` of records on average, with
/// bursts of up to a minute's worth (a token bucket). Once over it, the agent stays
/// refused until half a minute's worth is back. `0` is no budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditBudget {
    /// Bytes of audit records an agent may cause per minute on average
    /// (`gateway.audit.budgetBytesPerMinute`); `0` for no limit.
    pub bytes_per_minute: u64,
}

/// What one agent has left of its budget.
#[derive(Debug)]
struct Bucket {
    /// May go below zero: the `finished` record of a call that was let in is always
    /// written, and paid for later.
    tokens: f64,
    last: Instant,
    /// Set while the agent is throttled: since when, and how many records were refused.
    throttled: Option<(Instant, u64)>,
}

/// What [`BoundedAudit`] does with one record.
enum Admission {
    Write,
    /// Write a `security.audit_throttle_lifted` record first (refused, throttled for).
    LiftedThenWrite(u64, Duration),
    /// Refuse; write a `security.audit_throttled` record first when `true`.
    Refuse {
        first: bool,
        retry_secs: u64,
    },
}

/// The sink every gateway puts in front of its own: bounds each record ([`AuditRecord::bound`],
/// after redacting configured secrets, so that an excerpt never holds half a secret) and
/// keeps each agent within its [`AuditBudget`]. Over the budget, records that would let a
/// call start (or record a refusal) are refused with [`AuditError::Throttled`] — the call
/// does not run — and one `security.audit_throttled` record says so; when the agent is
/// back within its budget, one `security.audit_throttle_lifted` record gives the number
/// of records refused meanwhile. `finished` records of calls that did start are always
/// written.
#[derive(Debug)]
pub struct BoundedAudit {
    inner: Arc<dyn AuditSink>,
    secrets: Vec<String>,
    budget: AuditBudget,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl BoundedAudit {
    /// Put the bounds in front of `inner`. `secrets` are the values redacted as `***`
    /// before a record is bounded (a gateway passes [`secrets_of`] its config); `budget`
    /// applies to each agent on its own.
    pub fn new(inner: Arc<dyn AuditSink>, secrets: Vec<String>, budget: AuditBudget) -> Self {
        Self {
            inner,
            secrets: secret_list(secrets),
            budget,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn admit(&self, record: &AuditRecord) -> Admission {
        let per_minute = self.budget.bytes_per_minute;
        if per_minute == 0 {
            return Admission::Write;
        }
        let capacity = per_minute as f64;
        let rate = capacity / 60.0;
        let cost = record.approx_len() as f64;
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let bucket = buckets.entry(record.agent.clone()).or_insert(Bucket {
            tokens: capacity,
            last: now,
            throttled: None,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.last).as_secs_f64() * rate).min(capacity);
        bucket.last = now;
        let completes_a_call =
            record.phase == Phase::Finished && record.decision == AuditDecision::Allowed;
        if completes_a_call {
            bucket.tokens -= cost;
            return Admission::Write;
        }
        // A record bigger than the whole budget passes when the bucket is full; a
        // throttled agent waits until half of it is back, so that an episode is one
        // `throttled` and one `lifted` record, not a pair for every record it can afford.
        let need = if bucket.throttled.is_some() {
            (capacity / 2.0).max(cost.min(capacity))
        } else {
            cost.min(capacity)
        };
        if bucket.tokens >= need {
            bucket.tokens -= cost;
            return match bucket.throttled.take() {
                Some((since, refused)) => Admission::LiftedThenWrite(refused, since.elapsed()),
                None => Admission::Write,
            };
        }
        let retry_secs = ((need - bucket.tokens) / rate).ceil().max(1.0) as u64;
        match &mut bucket.throttled {
            Some((_, refused)) => {
                *refused += 1;
                Admission::Refuse {
                    first: false,
                    retry_secs,
                }
            }
            None => {
                bucket.throttled = Some((now, 1));
                Admission::Refuse {
                    first: true,
                    retry_secs,
                }
            }
        }
    }
}

#[async_trait]
impl AuditSink for BoundedAudit {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let mut r = record.clone();
        for a in &mut r.args {
            redact_str(&self.secrets, a);
        }
        if let Some(e) = &mut r.error {
            redact_str(&self.secrets, e);
        }
        redact_str(&self.secrets, &mut r.tool);
        r.bound();
        match self.admit(&r) {
            Admission::Write => self.inner.record(&r).await,
            Admission::LiftedThenWrite(refused, for_how_long) => {
                let mut lifted = AuditRecord::security(
                    &r.agent,
                    "security.audit_throttle_lifted",
                    vec![
                        format!("refused={refused}"),
                        format!("throttledMs={}", for_how_long.as_millis()),
                    ],
                    AuditDecision::Allowed,
                );
                lifted.error = Some(format!(
                    "agent '{}' is within its audit budget again; {refused} records (calls) were refused while it was throttled",
                    r.agent
                ));
                self.inner.record(&lifted).await?;
                self.inner.record(&r).await
            }
            Admission::Refuse { first, retry_secs } => {
                let err = AuditError::Throttled {
                    agent: r.agent.clone(),
                    budget: self.budget.bytes_per_minute,
                    retry_secs,
                };
                if first {
                    tracing::warn!(agent = %r.agent, "{err}");
                    let mut throttled = AuditRecord::security(
                        &r.agent,
                        "security.audit_throttled",
                        vec![format!(
                            "budgetBytesPerMinute={}",
                            self.budget.bytes_per_minute
                        )],
                        AuditDecision::Denied,
                    );
                    throttled.error = Some(err.to_string());
                    self.inner.record(&throttled).await?;
                }
                Err(err)
            }
        }
    }
}

/// `✓ CORE assistant/exec ls -la → allowed, started` (secrets already redacted in
/// `json`, so the human line is built from it).
fn human_line(record: &AuditRecord, json: &str) -> String {
    let r: AuditRecord = serde_json::from_str(json).unwrap_or_else(|_| record.clone());
    let mark = match r.decision {
        AuditDecision::Allowed => "✓",
        AuditDecision::Denied => "✗",
    };
    let kind = r.kind.label();
    let mut ctx = String::new();
    for (k, v) in [
        ("session", &r.session),
        ("model", &r.model),
        ("channel", &r.channel),
    ] {
        if let Some(v) = v {
            ctx.push_str(&format!(" {k}={v}"));
        }
    }
    let end = match (r.phase, r.decision) {
        (_, AuditDecision::Denied) => format!(
            "denied{}",
            r.error.map(|e| format!(": {e}")).unwrap_or_default()
        ),
        (Phase::Started, _) => "allowed, started".to_string(),
        (Phase::Warning, _) => "warning".to_string(),
        (Phase::Exhausted, _) => "exhausted".to_string(),
        (Phase::Claimed, _) => "claimed".to_string(),
        (Phase::Skipped, _) => "skipped".to_string(),
        (Phase::Interrupted, _) => "interrupted".to_string(),
        (Phase::Finished, _) => format!(
            "finished ({}ms){}",
            r.duration_ms.unwrap_or(0),
            r.error.map(|e| format!(", error: {e}")).unwrap_or_default()
        ),
    };
    format!(
        "[{}]{ctx} {mark} {kind} {}/{} {} → {end}",
        r.ts,
        r.agent,
        r.tool,
        r.args.join(" ")
    )
}

/// Secret values in a config: provider API keys, and plugin config strings under keys
/// that look like credentials (`token`, `secret`, `password`, `key`).
pub fn secrets_of(config: &crate::config::Config) -> Vec<String> {
    fn walk(v: &serde_json::Value, credential: bool, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) if credential => out.push(s.clone()),
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, credential, out)),
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    let k = k.to_ascii_lowercase();
                    let cred = credential
                        || ["token", "secret", "password", "passwd", "key", "credential"]
                            .iter()
                            .any(|w| k.contains(w));
                    walk(x, cred, out);
                }
            }
            _ => {}
        }
    }
    let mut out: Vec<String> = config
        .llm
        .providers
        .values()
        .filter_map(|p| p.api_key.clone())
        .collect();
    for p in config.plugins.values() {
        if let Some(c) = &p.config {
            walk(c, false, &mut out);
        }
    }
    for a in config.agents.values() {
        for c in a.plugin_configs.values() {
            walk(c, false, &mut out);
        }
    }
    // Egress credentials never reach a sandbox; should one be written anywhere else,
    // the audit log still does not keep it.
    if let Some(egress) = &config.egress {
        out.extend(
            egress
                .credentials
                .values()
                .map(|c| c.secret.expose().to_string()),
        );
    }
    // The OTLP collector's headers (an `authorization` token, typically).
    if let Some(otlp) = config.telemetry.as_ref().and_then(|t| t.otlp.as_ref()) {
        out.extend(otlp.headers.values().cloned());
    }
    out.retain(|s| s.len() >= MIN_SECRET_LEN);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_credential_secrets_are_redacted_like_every_other_secret() {
        let config: crate::config::Config = serde_json::from_value(serde_json::json!({
            "llm": {"providers": {"anthropic": {}}},
            "agents": {"a": {"model": {"provider": "anthropic", "model": "m"}, "tools": []}},
            "egress": {"credentials": {"gh": {
                "secret": "ghp_egress_secret_value_123", "hosts": ["api.github.com"],
                "inject": {"header": "Authorization", "format": "Bearer {}"}
            }}}
        }))
        .unwrap();
        assert!(secrets_of(&config).contains(&"ghp_egress_secret_value_123".to_string()));
    }

    fn record(args: Vec<String>) -> AuditRecord {
        AuditRecord {
            trace_id: None,
            span_id: None,
            ts: now_ts(),
            agent: "a".into(),
            session: Some("socket:a".into()),
            model: None,
            channel: Some("socket".into()),
            principal: None,
            via: None,
            phase: Phase::Started,
            kind: AuditType::Tool,
            tool: "kv".into(),
            args,
            decision: AuditDecision::Allowed,
            target: Some(Target::Gateway),
            duration_ms: None,
            exit_code: None,
            output_bytes: None,
            error: None,
            args_bytes: None,
            args_sha256: None,
            args_truncated: None,
            egress: None,
            approval: None,
            spawn: None,
            parent_session: None,
            exec: None,
            attribution: None,
        }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn writes_redacts_and_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = JsonlAudit::new(&path, 400, 2, vec!["sk-live-1234567".into(), "abc".into()]);
        audit
            .record(&record(vec![
                "set".into(),
                "x=sk-live-1234567".into(),
                "abc".into(),
            ]))
            .await
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("x=***"), "{text}");
        assert!(!text.contains("sk-live"));
        assert!(
            text.contains("\"abc\""),
            "short values are not treated as secrets"
        );
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["phase"], "started");
        assert_eq!(v["type"], "tool");
        assert_eq!(v["decision"], "allowed");
        assert!(v["ts"].as_str().unwrap().len() >= 29);
        for _ in 0..20 {
            audit.record(&record(vec!["get".into()])).await.unwrap();
        }
        assert!(dir.path().join("audit.jsonl.1").exists());
        assert!(dir.path().join("audit.jsonl.2").exists());
        assert!(!dir.path().join("audit.jsonl.3").exists());
        assert!(std::fs::metadata(&path).unwrap().len() < 800);
    }

    #[tokio::test]
    async fn unwritable_log_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the log's folder should be: nothing can be created below it.
        std::fs::write(dir.path().join("logs"), "not a folder").unwrap();
        let audit = JsonlAudit::new(dir.path().join("logs/audit.jsonl"), 1000, 2, vec![]);
        let err = audit.record(&record(vec![])).await.unwrap_err();
        assert!(err.to_string().contains("tool calls are refused"), "{err}");
    }

    #[test]
    fn denied_records_keep_an_excerpt_with_size_and_hash() {
        let mut r = record(vec!["a".repeat(1500), "b".repeat(600), "c".into()]);
        r.decision = AuditDecision::Denied;
        r.tool = "t".repeat(1000);
        r.error = Some("e".repeat(5000));
        let full = serde_json::to_vec(&r.args).unwrap();
        r.bound();
        assert_eq!(r.args.len(), 1);
        assert_eq!(r.args[0], format!("{}…", "a".repeat(DENIED_ARGS_EXCERPT)));
        assert_eq!(r.args_bytes, Some(2101));
        assert_eq!(
            r.args_sha256.as_deref(),
            Some(hex::encode(sha2::Sha256::digest(&full)).as_str())
        );
        assert_eq!(r.args_truncated, Some(true));
        assert!(r.tool.len() <= MAX_TOOL_LEN + 3);
        assert!(r.error.as_deref().unwrap().ends_with("… (5000 bytes)"));
        // Small denied arguments stay whole, with their size and hash.
        let mut small = record(vec!["get".into(), "x".into()]);
        small.decision = AuditDecision::Denied;
        small.bound();
        assert_eq!(small.args, ["get", "x"]);
        assert_eq!(small.args_bytes, Some(4));
        assert!(small.args_sha256.is_some() && small.args_truncated.is_none());
        // Allowed records keep their arguments.
        let mut allowed = record(vec!["z".repeat(5000)]);
        allowed.bound();
        assert_eq!(allowed.args[0].len(), 5000);
        assert!(allowed.args_sha256.is_none());
        let v = serde_json::to_value(&small).unwrap();
        assert_eq!(v["argsBytes"], 4);
        assert!(v.get("argsTruncated").is_none());
    }

    #[tokio::test]
    async fn an_agent_over_its_budget_is_refused_with_one_record_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let file = Arc::new(JsonlAudit::new(&path, 0, 1, vec![]));
        let audit = BoundedAudit::new(
            file,
            vec!["sk-secret-value-123".into()],
            AuditBudget {
                bytes_per_minute: 6000,
            },
        );
        let mut denied = record(vec!["x".repeat(50_000)]);
        denied.decision = AuditDecision::Denied;
        denied.phase = Phase::Finished;
        let mut refused = 0;
        let mut first_error = None;
        for _ in 0..40 {
            match audit.record(&denied).await {
                Ok(()) => {}
                Err(e) => {
                    refused += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
        assert!(refused > 30, "{refused}");
        let e = first_error.unwrap();
        assert!(
            e.contains("agent 'a' made more than 6000 bytes of audit records within a minute")
                && e.contains("gateway.audit.budgetBytesPerMinute"),
            "{e}"
        );
        // The `finished` record of a call that started is written even now.
        let mut finished = record(vec!["get".into()]);
        finished.phase = Phase::Finished;
        audit.record(&finished).await.unwrap();
        // Another agent has its own budget.
        let mut other = record(vec!["get".into()]);
        other.agent = "b".into();
        audit.record(&other).await.unwrap();
        let written = lines(&path);
        let throttled: Vec<_> = written
            .iter()
            .filter(|r| r["tool"] == "security.audit_throttled")
            .collect();
        assert_eq!(throttled.len(), 1, "one record for the whole episode");
        assert_eq!(throttled[0]["type"], "security");
        assert_eq!(throttled[0]["agent"], "a");
        assert!(written.len() < 12, "{}", written.len());
        // Every denied record is an excerpt, with the full size.
        assert!(written
            .iter()
            .filter(|r| r["tool"] == "kv")
            .filter(|r| r["decision"] == "denied")
            .all(|r| r["argsBytes"] == 50_000 && r["argsTruncated"] == true));

        // Once the bucket refills, calls pass again and one record says how many were
        // refused.
        {
            let mut b = audit.buckets.lock().unwrap();
            b.get_mut("a").unwrap().tokens = 6000.0;
        }
        audit.record(&record(vec!["get".into()])).await.unwrap();
        let written = lines(&path);
        let lifted: Vec<_> = written
            .iter()
            .filter(|r| r["tool"] == "security.audit_throttle_lifted")
            .collect();
        assert_eq!(lifted.len(), 1);
        assert_eq!(lifted[0]["args"][0], format!("refused={refused}"));
    }

    #[tokio::test]
    async fn secrets_are_redacted_before_the_excerpt_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let secret = "sk-live-0123456789abcdef";
        let file = Arc::new(JsonlAudit::new(&path, 0, 1, vec![secret.into()]));
        let audit = BoundedAudit::new(
            file,
            vec![secret.into()],
            AuditBudget {
                bytes_per_minute: 0,
            },
        );
        // Without redaction first, the cut would fall inside the secret.
        let mut r = record(vec![format!(
            "{}{secret}",
            "p".repeat(DENIED_ARGS_EXCERPT - 10)
        )]);
        r.decision = AuditDecision::Denied;
        audit.record(&r).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("sk-live-01"), "{text}");
    }

    #[tokio::test]
    async fn rotation_never_deletes_records_younger_than_the_retention() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = JsonlAudit::new(&path, 300, 1, vec![]).retention(Duration::from_secs(3600));
        let mut first = record(vec!["the-very-first".into()]);
        first.phase = Phase::Finished;
        audit.record(&first).await.unwrap();
        for _ in 0..20 {
            audit.record(&record(vec!["get".into()])).await.unwrap();
        }
        // More files than maxFiles, none lost.
        assert!(numbered(&path, 3).exists());
        let all: String = std::iter::once(path.clone())
            .chain((1..30).map(|i| numbered(&path, i)))
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect();
        assert_eq!(all.lines().count(), 21);
        assert!(all.contains("the-very-first"));
        // Without a retention the same rotation drops them (the original's behaviour).
        let dir2 = tempfile::tempdir().unwrap();
        let path2 = dir2.path().join("audit.jsonl");
        let plain = JsonlAudit::new(&path2, 300, 1, vec![]);
        plain.record(&first).await.unwrap();
        for _ in 0..20 {
            plain.record(&record(vec!["get".into()])).await.unwrap();
        }
        assert!(!numbered(&path2, 2).exists());
        let kept: String = [path2.clone(), numbered(&path2, 1)]
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect();
        assert!(!kept.contains("the-very-first"));
        // Expired files beyond maxFiles do go.
        let old = std::fs::File::options()
            .write(true)
            .open(numbered(&path, 3))
            .unwrap();
        old.set_modified(SystemTime::now() - Duration::from_secs(7200))
            .unwrap();
        let highest = audit.rotated().last().copied().unwrap();
        let oldest = std::fs::File::options()
            .write(true)
            .open(numbered(&path, highest))
            .unwrap();
        oldest
            .set_modified(SystemTime::now() - Duration::from_secs(7200))
            .unwrap();
        audit.rotate();
        assert!(!numbered(&path, highest + 1).exists());
    }

    #[tokio::test]
    async fn the_current_file_is_rotated_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = JsonlAudit::new(&path, 0, 3, vec![]).max_age(Duration::from_millis(200));
        audit.record(&record(vec!["one".into()])).await.unwrap();
        audit.record(&record(vec!["two".into()])).await.unwrap();
        assert!(!numbered(&path, 1).exists());
        tokio::time::sleep(Duration::from_millis(300)).await;
        audit.record(&record(vec!["three".into()])).await.unwrap();
        assert_eq!(lines(&numbered(&path, 1)).len(), 2);
        assert_eq!(lines(&path).len(), 1);
    }
}
