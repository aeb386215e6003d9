//! Exporting the audit log to other systems, offline: `beige audit export`.
//!
//! Owns reading the log's files in `seq` order (rotated `.N` … `.1`, then the current
//! file) line by line — an unreadable or torn line is reported and skipped, never fatal
//! — filtering by time (`--since`) and agent, and converting each record to one of three
//! forms: the stored line itself (`jsonl`), an OCSF 1.3 event (hand-written serde structs,
//! one class per kind of record: API, Process, Network and HTTP Activity, Detection
//! Finding, Application Lifecycle, Device Config State Change, Authentication, Base
//! Event), or an OTLP/JSON log record, batched into `ExportLogsServiceRequest`s that it
//! can also POST to a collector's `/v1/logs`. Records are read as JSON objects, not as
//! [`AuditRecord`](crate::audit::AuditRecord)s, so that chain records and fields added by later versions are
//! exported too. Every value exported comes from the stored (already redacted) line;
//! nothing is added from elsewhere but fixed names (product, schema version).

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use chrono::{DateTime, FixedOffset, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::Digest as _;

/// The OCSF schema version the events follow.
pub const OCSF_VERSION: &str = "1.3.0";
/// Log records per OTLP `ExportLogsServiceRequest`.
pub const OTLP_BATCH: usize = 512;
/// The product name in OCSF metadata and the OTLP `service.name`.
const PRODUCT: &str = "beige";

/// What went wrong exporting. Lines that cannot be read are not errors: they are
/// skipped ([`SkippedLine`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// A log file could not be opened or read.
    #[error(
        "cannot read the audit log file {path} ({source}); check that it exists and is readable"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `--since` is neither a time nor a duration.
    #[error("--since '{text}' is not a time: {reason}. Give an RFC 3339 time (2026-11-30T08:00:00Z, 2026-11-30T09:00:00+01:00) or a duration back from now (30m, 24h, 7d)")]
    Since {
        /// What was given.
        text: String,
        /// Why it did not parse.
        reason: String,
    },
    /// The OTLP endpoint is not an http(s) URL.
    #[error("the OTLP endpoint '{url}' {reason}; give an http:// or https:// URL such as http://127.0.0.1:4318 (/v1/logs is appended when it has no path)")]
    Endpoint {
        /// What was given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A batch could not be sent.
    #[error("could not send audit records to the OTLP endpoint {endpoint} ({source}); check that a collector listens there")]
    Send {
        /// The URL posted to.
        endpoint: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The endpoint refused a batch.
    #[error("the OTLP endpoint {endpoint} answered HTTP {status}{body}; the batch was not accepted ({sent} records were accepted before it)")]
    Status {
        /// The URL posted to.
        endpoint: String,
        /// The HTTP status, with its reason phrase.
        status: String,
        /// `: <the start of the response body>`, or empty.
        body: String,
        /// Records the endpoint accepted in earlier batches.
        sent: u64,
    },
    /// A converted record could not be encoded (not expected: every value is JSON).
    #[error("cannot encode an exported record as JSON ({source})")]
    Encode {
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
}

/// The form records are exported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The stored lines, as they are.
    Jsonl,
    /// One OCSF 1.3 event per line.
    Ocsf,
    /// OTLP/JSON: one `ExportLogsServiceRequest` per [`OTLP_BATCH`] records, per line.
    Otlp,
}

// ---------------------------------------------------------------------------------------
// Reading

/// One record of the log, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry {
    /// The file it was read from.
    pub file: PathBuf,
    /// Its line number there (from 1).
    pub line: usize,
    /// The line, without its newline.
    pub raw: String,
    /// The record.
    pub record: Map<String, Value>,
    /// Its `ts`.
    pub time: DateTime<FixedOffset>,
}

impl LogEntry {
    /// Parse one line; `Err` says why it is not a record.
    pub fn parse(file: &Path, line: usize, raw: String) -> Result<Self, SkippedLine> {
        let skipped = |reason: String| SkippedLine {
            file: file.to_path_buf(),
            line,
            reason,
        };
        let record = match serde_json::from_str::<Value>(&raw) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(skipped("not a JSON object".into())),
            Err(e) => return Err(skipped(format!("not JSON ({e}), a torn or edited line"))),
        };
        let time = match record.get("ts").and_then(Value::as_str) {
            Some(ts) => DateTime::parse_from_rfc3339(ts)
                .map_err(|e| skipped(format!("its ts '{ts}' is not an RFC 3339 time ({e})")))?,
            None => return Err(skipped("the record has no ts".into())),
        };
        Ok(Self {
            file: file.to_path_buf(),
            line,
            raw,
            record,
            time,
        })
    }

    fn str_field(&self, key: &str) -> Option<&str> {
        self.record.get(key).and_then(Value::as_str)
    }
}

/// A line that was not exported because it is not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    /// The file.
    pub file: PathBuf,
    /// The line number (from 1).
    pub line: usize,
    /// Why.
    pub reason: String,
}

impl fmt::Display for SkippedLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.reason)
    }
}

/// What reading a line gave.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadLine {
    /// A record.
    Entry(Box<LogEntry>),
    /// A line that is not one.
    Skipped(SkippedLine),
}

/// The lines of `files`, in order. Empty lines are passed over.
#[derive(Debug)]
pub struct LogReader {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<(PathBuf, BufReader<File>, usize)>,
}

impl LogReader {
    /// Read `files` in the order given (see [`super::chain::log_files`]).
    pub fn new(files: Vec<PathBuf>) -> Self {
        Self {
            files: files.into_iter(),
            current: None,
        }
    }
}

impl Iterator for LogReader {
    type Item = Result<ReadLine, ExportError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                let path = self.files.next()?;
                match File::open(&path) {
                    Ok(f) => self.current = Some((path, BufReader::new(f), 0)),
                    Err(source) => return Some(Err(ExportError::Read { path, source })),
                }
            }
            let (path, reader, n) = self.current.as_mut()?;
            let mut buf = Vec::new();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) => {
                    self.current = None;
                    continue;
                }
                Ok(_) => {}
                Err(source) => {
                    let path = path.clone();
                    self.current = None;
                    return Some(Err(ExportError::Read { path, source }));
                }
            }
            *n += 1;
            while matches!(buf.last(), Some(b'\n' | b'\r')) {
                buf.pop();
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let line = *n;
            return Some(Ok(match String::from_utf8(buf) {
                Ok(raw) => match LogEntry::parse(path, line, raw) {
                    Ok(e) => ReadLine::Entry(Box::new(e)),
                    Err(s) => ReadLine::Skipped(s),
                },
                Err(_) => ReadLine::Skipped(SkippedLine {
                    file: path.clone(),
                    line,
                    reason: "not UTF-8, a torn or corrupted line".into(),
                }),
            }));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Filtering

/// Which records to export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only records at or after this time.
    pub since: Option<DateTime<FixedOffset>>,
    /// Only this agent's records (the chain's own records have no agent).
    pub agent: Option<String>,
}

impl Filter {
    /// Whether `e` is exported.
    pub fn admits(&self, e: &LogEntry) -> bool {
        self.since.is_none_or(|s| e.time >= s)
            && self
                .agent
                .as_deref()
                .is_none_or(|a| e.str_field("agent") == Some(a))
    }
}

/// `--since`: an RFC 3339 time, or a duration back from `now` (`30m`, `24h`, `7d`, `45s`).
pub fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<FixedOffset>, ExportError> {
    let t = text.trim();
    if let Ok(time) = DateTime::parse_from_rfc3339(t) {
        return Ok(time);
    }
    let looks_like_duration =
        t.chars().next().is_some_and(|c| c.is_ascii_digit()) && !t.contains(['-', ':', 'T']);
    if !looks_like_duration {
        let reason = DateTime::parse_from_rfc3339(t)
            .err()
            .map_or_else(String::new, |e| format!("not an RFC 3339 time ({e})"));
        return Err(ExportError::Since {
            text: text.into(),
            reason,
        });
    }
    let ms = beige_client::usage::parse_since(t).map_err(|reason| ExportError::Since {
        text: text.into(),
        reason,
    })?;
    let back = chrono::Duration::try_milliseconds(ms)
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(|| ExportError::Since {
            text: text.into(),
            reason: "it reaches back before any date".into(),
        })?;
    Ok(back.fixed_offset())
}

// ---------------------------------------------------------------------------------------
// How severe a record is (shared by OCSF and OTLP)

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    /// An ordinary call or event.
    Info,
    /// A call that was allowed but failed (error, non-zero exit code).
    Low,
    /// A refusal, or a chain recovery.
    Medium,
    /// A security event that refused something.
    High,
}

impl Level {
    fn ocsf(self) -> (u8, &'static str) {
        match self {
            Level::Info => (1, "Informational"),
            Level::Low => (2, "Low"),
            Level::Medium => (3, "Medium"),
            Level::High => (4, "High"),
        }
    }

    fn otlp(self) -> (u8, &'static str) {
        match self {
            Level::Info => (9, "INFO"),
            Level::Low | Level::Medium => (13, "WARN"),
            Level::High => (17, "ERROR"),
        }
    }
}

/// A view of the fields the mappings look at.
struct Facts<'a> {
    kind: &'a str,
    tool: &'a str,
    denied: bool,
    failed: bool,
}

impl<'a> Facts<'a> {
    fn of(r: &'a Map<String, Value>) -> Self {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        let denied = s("decision") == "denied";
        // A security event's `error` says what happened, not that something failed.
        let failed = !denied
            && s("type") != "security"
            && (r.get("error").is_some_and(|e| !e.is_null())
                || r.get("exitCode").and_then(Value::as_i64).unwrap_or(0) != 0);
        Self {
            kind: s("type"),
            tool: s("tool"),
            denied,
            failed,
        }
    }

    fn level(&self) -> Level {
        match self.kind {
            "security" if self.denied => Level::High,
            "recovery" => Level::Medium,
            _ if self.denied => Level::Medium,
            _ if self.failed => Level::Low,
            _ => Level::Info,
        }
    }
}

// ---------------------------------------------------------------------------------------
// OCSF

/// An OCSF 1.3 event: the base attributes every class has, and the objects of the class
/// it is (the others left out).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct OcsfEvent {
    /// The class (`6003` API Activity, …).
    pub class_uid: u32,
    /// Its name.
    pub class_name: &'static str,
    /// The class's category.
    pub category_uid: u32,
    /// Its name.
    pub category_name: &'static str,
    /// The activity within the class.
    pub activity_id: u32,
    /// Its name.
    pub activity_name: String,
    /// `class_uid * 100 + activity_id`.
    pub type_uid: u64,
    /// `<class name>: <activity name>`.
    pub type_name: String,
    /// 1 Informational, 2 Low, 3 Medium, 4 High.
    pub severity_id: u8,
    /// Its name.
    pub severity: &'static str,
    /// The record's `ts`, in milliseconds since the epoch.
    pub time: i64,
    /// The offset of the record's `ts`, in minutes.
    pub timezone_offset: i32,
    /// Activities: 1 Success, 2 Failure. Findings: 1 New.
    pub status_id: u8,
    /// Its name.
    pub status: &'static str,
    /// The exit code of a call that ran, as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_code: Option<String>,
    /// Why a call was refused or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_detail: Option<String>,
    /// 1 Allowed, 2 Denied: the record's `decision`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_id: Option<u8>,
    /// Its name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<&'static str>,
    /// The record's `error` (or, for a finding, what happened).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The record's `durationMs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<u64>,
    /// Schema version, product, the record's `hash` and `seq`.
    pub metadata: OcsfMetadata,
    /// Who acted: the agent (`app_name`), the principal (`user.name`), the session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<OcsfActor>,
    /// API Activity: the tool called.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<OcsfApi>,
    /// Process Activity: the command an `exec` ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<OcsfProcess>,
    /// Where a call or connection came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src_endpoint: Option<OcsfEndpoint>,
    /// Where a connection went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_endpoint: Option<OcsfEndpoint>,
    /// Network Activity: the connection's id and direction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_info: Option<OcsfConnectionInfo>,
    /// Bytes carried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic: Option<OcsfTraffic>,
    /// HTTP Activity: the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_request: Option<OcsfHttpRequest>,
    /// HTTP Activity: the response's status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_response: Option<OcsfHttpResponse>,
    /// Detection Finding: what was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finding_info: Option<OcsfFindingInfo>,
    /// Application Lifecycle: the application (beige).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app: Option<OcsfProduct>,
    /// Device Config State Change: the device (the gateway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<OcsfDevice>,
    /// Authentication: who authenticated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<OcsfUser>,
    /// The record's fields that no attribute above holds, under their own names.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub unmapped: Map<String, Value>,
}

/// `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfMetadata {
    /// [`OCSF_VERSION`].
    pub version: &'static str,
    /// beige.
    pub product: OcsfProduct,
    /// The record's `hash` (chained logs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The record's `seq` (chained logs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// The record's `ts`, as written.
    pub original_time: String,
}

/// A `product` (also `app`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfProduct {
    /// `beige`.
    pub name: &'static str,
    /// `beige`.
    pub vendor_name: &'static str,
}

const BEIGE: OcsfProduct = OcsfProduct {
    name: PRODUCT,
    vendor_name: PRODUCT,
};

/// `actor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfActor {
    /// The agent that acted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_name: Option<String>,
    /// The principal behind the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<OcsfUser>,
    /// The session the call ran in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<OcsfSession>,
}

/// `user`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfUser {
    /// The user's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// 0 Unknown when the record names no one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_id: Option<u8>,
}

/// `session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfSession {
    /// The session key.
    pub uid: String,
}

/// `api`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfApi {
    /// The tool's name.
    pub operation: String,
    /// Where it ran.
    pub service: OcsfService,
}

/// `api.service`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfService {
    /// `gateway` or `sandbox` (the record's `target`), else `beige`.
    pub name: String,
}

/// `process`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfProcess {
    /// The command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmd_line: Option<String>,
    /// The exec id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// A network endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfEndpoint {
    /// A name: the agent whose sandbox it is, the channel a call came through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u64>,
}

/// `connection_info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfConnectionInfo {
    /// The connection's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// 2 Outbound.
    pub direction_id: u8,
    /// `Outbound`.
    pub direction: &'static str,
}

/// `traffic`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfTraffic {
    /// Bytes from the sandbox to the upstream.
    pub bytes_out: u64,
    /// Bytes from the upstream to the sandbox.
    pub bytes_in: u64,
}

/// `http_request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfHttpRequest {
    /// The method (`CONNECT` for the connection itself).
    pub http_method: String,
    /// The URL.
    pub url: OcsfUrl,
}

/// `url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfUrl {
    /// `https`: requests the gateway inspected came over TLS.
    pub scheme: &'static str,
    /// The host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u64>,
    /// The path (and query), as recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `http_response`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfHttpResponse {
    /// The status code.
    pub code: u64,
}

/// `finding_info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfFindingInfo {
    /// The record's `hash`, or the SHA-256 of its line when the log is not chained.
    pub uid: String,
    /// What was refused or happened.
    pub title: String,
    /// The record's `type`.
    pub types: Vec<String>,
}

/// `device`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OcsfDevice {
    /// `beige`.
    pub name: &'static str,
    /// 99 Other.
    pub type_id: u8,
}

/// The class of a record, with its activity.
struct Class {
    uid: u32,
    name: &'static str,
    category: u32,
    category_name: &'static str,
    activity: u32,
    activity_name: String,
}

impl Class {
    fn new(uid: u32, name: &'static str, activity: u32, activity_name: &str) -> Self {
        let (category, category_name) = match uid / 1000 {
            1 => (1, "System Activity"),
            2 => (2, "Findings"),
            3 => (3, "Identity & Access Management"),
            4 => (4, "Network Activity"),
            5 => (5, "Discovery"),
            6 => (6, "Application Activity"),
            _ => (0, "Uncategorized"),
        };
        Self {
            uid,
            name,
            category,
            category_name,
            activity,
            activity_name: activity_name.to_string(),
        }
    }
}

/// Takes fields out of a copy of the record: what is left is `unmapped`.
struct Fields(Map<String, Value>);

impl Fields {
    fn string(&mut self, key: &str) -> Option<String> {
        match self.0.get(key) {
            Some(Value::String(_)) => match self.0.remove(key) {
                Some(Value::String(s)) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    fn u64(&mut self, key: &str) -> Option<u64> {
        let n = self.0.get(key)?.as_u64()?;
        self.0.remove(key);
        Some(n)
    }

    fn i64(&mut self, key: &str) -> Option<i64> {
        let n = self.0.get(key)?.as_i64()?;
        self.0.remove(key);
        Some(n)
    }

    /// Take `key` from the object under `object` (dropping the object once empty).
    fn nested(&mut self, object: &str, key: &str) -> Option<Value> {
        let o = self.0.get_mut(object)?.as_object_mut()?;
        let v = o.remove(key);
        if o.is_empty() {
            self.0.remove(object);
        }
        v
    }

    fn nested_string(&mut self, object: &str, key: &str) -> Option<String> {
        match self.nested(object, key)? {
            Value::String(s) => Some(s),
            other => {
                self.put_back(object, key, other);
                None
            }
        }
    }

    fn nested_u64(&mut self, object: &str, key: &str) -> Option<u64> {
        let v = self.nested(object, key)?;
        match v.as_u64() {
            Some(n) => Some(n),
            None => {
                self.put_back(object, key, v);
                None
            }
        }
    }

    fn put_back(&mut self, object: &str, key: &str, v: Value) {
        let o = self
            .0
            .entry(object.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(o) = o.as_object_mut() {
            o.insert(key.to_string(), v);
        }
    }
}

/// The OCSF event of a record.
pub fn ocsf_event(entry: &LogEntry) -> OcsfEvent {
    let facts = Facts::of(&entry.record);
    let mut f = Fields(entry.record.clone());
    // Base attributes, from fields every record has.
    f.0.remove("ts");
    let hash = f.string("hash");
    let sequence = f.u64("seq");
    let principal = f.string("principal");
    let agent = f.string("agent").filter(|a| !a.is_empty());
    let session = f.string("session");
    let session_kept = session.clone();
    let error = f.string("error");
    let duration = f.u64("durationMs");
    let exit_code = f.i64("exitCode");
    let decision = f.string("decision");
    let (action_id, action) = match decision.as_deref() {
        Some("allowed") => (Some(1), Some("Allowed")),
        Some("denied") => (Some(2), Some("Denied")),
        Some(other) => {
            f.0.insert("decision".into(), Value::String(other.to_string()));
            (None, None)
        }
        None => (None, None),
    };
    let mut event = OcsfEvent {
        class_uid: 0,
        class_name: "",
        category_uid: 0,
        category_name: "",
        activity_id: 0,
        activity_name: String::new(),
        type_uid: 0,
        type_name: String::new(),
        severity_id: 0,
        severity: "",
        time: entry.time.timestamp_millis(),
        timezone_offset: entry.time.offset().local_minus_utc() / 60,
        status_id: if facts.denied || facts.failed { 2 } else { 1 },
        status: if facts.denied || facts.failed {
            "Failure"
        } else {
            "Success"
        },
        status_code: exit_code.map(|c| c.to_string()),
        status_detail: error.clone(),
        action_id,
        action,
        message: error,
        duration,
        metadata: OcsfMetadata {
            version: OCSF_VERSION,
            product: BEIGE,
            uid: hash.clone(),
            sequence,
            original_time: entry.str_field("ts").unwrap_or_default().to_string(),
        },
        actor: None,
        api: None,
        process: None,
        src_endpoint: None,
        dst_endpoint: None,
        connection_info: None,
        traffic: None,
        http_request: None,
        http_response: None,
        finding_info: None,
        app: None,
        device: None,
        user: None,
        unmapped: Map::new(),
    };
    let actor = (agent.is_some() || principal.is_some() || session.is_some()).then(|| OcsfActor {
        app_name: agent.clone(),
        user: principal.clone().map(|name| OcsfUser {
            name: Some(name),
            type_id: None,
        }),
        session: session.map(|uid| OcsfSession { uid }),
    });
    let egress_mode = entry
        .record
        .get("egress")
        .and_then(|e| e.get("mode"))
        .and_then(Value::as_str);
    let class = match facts.kind {
        "lifecycle" => {
            f.0.remove("tool");
            event.app = Some(BEIGE);
            let (id, name) = match facts.tool.rsplit('.').next().unwrap_or("") {
                "start" => (3, "Start"),
                "stop" => (4, "Stop"),
                "restart" => (5, "Restart"),
                "genesis" => (99, "Genesis"),
                _ => (99, "Other"),
            };
            Class::new(6002, "Application Lifecycle", id, name)
        }
        "checkpoint" | "rotate" | "recovery" => Class::new(0, "Base Event", 99, facts.tool),
        "auth" => {
            f.0.remove("tool");
            event.actor = actor;
            event.user = Some(OcsfUser {
                type_id: principal.is_none().then_some(0),
                name: principal,
            });
            let t = facts.tool.to_ascii_lowercase();
            let (id, name) = if t.contains("logout") || t.contains("logoff") {
                (2, "Logoff")
            } else if t.contains("login") || t.contains("logon") {
                (1, "Logon")
            } else {
                (99, facts.tool)
            };
            Class::new(3002, "Authentication", id, name)
        }
        "config_change" => {
            event.actor = actor;
            event.device = Some(OcsfDevice {
                name: PRODUCT,
                type_id: 99,
            });
            Class::new(5019, "Device Config State Change", 1, "Log")
        }
        _ if facts.kind == "security" || facts.denied => {
            event.actor = actor;
            event.status_id = 1;
            event.status = "New";
            let uid = hash.unwrap_or_else(|| hex::encode(sha2::Sha256::digest(&entry.raw)));
            let title = if facts.kind == "security" {
                facts.tool.to_string()
            } else {
                format!(
                    "{} '{}' of agent '{}' denied",
                    match facts.kind {
                        "core_tool" | "tool" => "tool call",
                        "egress" => "connection",
                        k => k,
                    },
                    facts.tool,
                    agent.as_deref().unwrap_or("")
                )
            };
            event.finding_info = Some(OcsfFindingInfo {
                uid,
                title,
                types: vec![facts.kind.to_string()],
            });
            Class::new(2004, "Detection Finding", 1, "Create")
        }
        "egress" => {
            event.actor = actor;
            f.0.remove("tool");
            let host = f.nested_string("egress", "host");
            let port = f.nested_u64("egress", "port");
            let ip = f.nested_string("egress", "ip");
            event.src_endpoint = agent.clone().map(|name| OcsfEndpoint {
                name: Some(name),
                hostname: None,
                ip: None,
                port: None,
            });
            event.dst_endpoint = Some(OcsfEndpoint {
                name: None,
                hostname: host.clone(),
                ip,
                port,
            });
            if let (Some(up), Some(down)) = (
                entry.record["egress"]
                    .get("bytesUp")
                    .and_then(Value::as_u64),
                entry.record["egress"]
                    .get("bytesDown")
                    .and_then(Value::as_u64),
            ) {
                f.nested("egress", "bytesUp");
                f.nested("egress", "bytesDown");
                event.traffic = Some(OcsfTraffic {
                    bytes_out: up,
                    bytes_in: down,
                });
            }
            if egress_mode == Some("inspect") {
                f.nested("egress", "mode");
                let method = f
                    .nested_string("egress", "method")
                    .unwrap_or_else(|| "CONNECT".into());
                if let Some(code) = f.nested_u64("egress", "status") {
                    event.http_response = Some(OcsfHttpResponse { code });
                }
                let (id, name) = match method.as_str() {
                    "CONNECT" => (1, "Connect"),
                    "DELETE" => (2, "Delete"),
                    "GET" => (3, "Get"),
                    "HEAD" => (4, "Head"),
                    "OPTIONS" => (5, "Options"),
                    "POST" => (6, "Post"),
                    "PUT" => (7, "Put"),
                    "TRACE" => (8, "Trace"),
                    "PATCH" => (9, "Patch"),
                    _ => (99, method.as_str()),
                };
                let class = Class::new(4002, "HTTP Activity", id, name);
                event.http_request = Some(OcsfHttpRequest {
                    url: OcsfUrl {
                        scheme: "https",
                        hostname: host,
                        port,
                        path: f.nested_string("egress", "path"),
                    },
                    http_method: method,
                });
                class
            } else {
                event.connection_info = Some(OcsfConnectionInfo {
                    uid: f.nested_string("egress", "id"),
                    direction_id: 2,
                    direction: "Outbound",
                });
                let started = entry.str_field("phase") == Some("started");
                let (id, name) = match (started, facts.failed) {
                    (true, _) => (1, "Open"),
                    (false, false) => (2, "Close"),
                    (false, true) => (4, "Fail"),
                };
                Class::new(4001, "Network Activity", id, name)
            }
        }
        "core_tool" if facts.tool == "exec" => {
            f.0.remove("tool");
            event.actor = actor;
            let cmd_line = match f.0.get("args").and_then(Value::as_array) {
                Some(a) if a.iter().all(Value::is_string) => {
                    let line = a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" ");
                    f.0.remove("args");
                    Some(line)
                }
                _ => None,
            };
            event.process = Some(OcsfProcess {
                cmd_line,
                uid: f.string("exec"),
            });
            let (id, name) = if entry.str_field("phase") == Some("started") {
                (1, "Launch")
            } else {
                (2, "Terminate")
            };
            Class::new(1007, "Process Activity", id, name)
        }
        "core_tool" | "tool" | "spawn" => {
            f.0.remove("tool");
            event.actor = actor;
            event.api = Some(OcsfApi {
                operation: facts.tool.to_string(),
                service: OcsfService {
                    name: f.string("target").unwrap_or_else(|| PRODUCT.into()),
                },
            });
            event.src_endpoint = Some(OcsfEndpoint {
                name: Some(f.string("channel").unwrap_or_else(|| PRODUCT.into())),
                hostname: None,
                ip: None,
                port: None,
            });
            let (id, name) = match (facts.kind, facts.tool) {
                ("core_tool", "read") => (2, "Read"),
                ("core_tool", "write" | "patch") => (3, "Update"),
                _ => (99, "Other"),
            };
            Class::new(6003, "API Activity", id, name)
        }
        _ => {
            event.actor = actor;
            Class::new(0, "Base Event", 99, facts.tool)
        }
    };
    let (severity_id, severity) = facts.level().ocsf();
    event.severity_id = severity_id;
    event.severity = severity;
    event.class_uid = class.uid;
    event.class_name = class.name;
    event.category_uid = class.category;
    event.category_name = class.category_name;
    event.activity_id = class.activity;
    event.type_uid = u64::from(class.uid) * 100 + u64::from(class.activity);
    event.type_name = format!("{}: {}", class.name, class.activity_name);
    event.activity_name = class.activity_name;
    if event.actor.is_none() {
        // Classes without an actor keep who acted in `unmapped`.
        if let Some(a) = agent {
            f.0.insert("agent".into(), Value::String(a));
        }
        if let Some(s) = session_kept {
            f.0.insert("session".into(), Value::String(s));
        }
    }
    event.unmapped = f.0;
    event
}

// ---------------------------------------------------------------------------------------
// OTLP/JSON

/// `ExportLogsServiceRequest` in the OTLP/JSON encoding.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ExportLogsServiceRequest {
    /// One resource: beige.
    pub resource_logs: Vec<ResourceLogs>,
}

/// `ResourceLogs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ResourceLogs {
    /// `service.name = beige`.
    pub resource: Resource,
    /// One scope: the audit log.
    pub scope_logs: Vec<ScopeLogs>,
}

/// `Resource`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Resource {
    /// Its attributes.
    pub attributes: Vec<KeyValue>,
}

/// `ScopeLogs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ScopeLogs {
    /// `beige.audit`.
    pub scope: Scope,
    /// The records.
    pub log_records: Vec<LogRecord>,
}

/// `InstrumentationScope`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Scope {
    /// `beige.audit`.
    pub name: &'static str,
}

/// `LogRecord`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct LogRecord {
    /// The record's `ts`, in nanoseconds since the epoch (a decimal string).
    pub time_unix_nano: String,
    /// 9 INFO, 13 WARN, 17 ERROR.
    pub severity_number: u8,
    /// Its name.
    pub severity_text: &'static str,
    /// `beige.<type>`.
    pub event_name: String,
    /// A one-line summary.
    pub body: AnyValue,
    /// `event.name`, and every field of the record as `beige.<field>`.
    pub attributes: Vec<KeyValue>,
    /// The record's `traceId` (32 hex digits), when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The record's `spanId` (16 hex digits), when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
}

/// `KeyValue`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: AnyValue,
}

/// `AnyValue` (one of its fields).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum AnyValue {
    /// Text.
    StringValue(String),
    /// A boolean.
    BoolValue(bool),
    /// An integer (a decimal string, as OTLP/JSON encodes 64-bit integers).
    IntValue(String),
    /// A number with a fraction.
    DoubleValue(f64),
    /// An array.
    ArrayValue(ArrayValue),
    /// An object.
    KvlistValue(KvlistValue),
}

/// `ArrayValue`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ArrayValue {
    /// The elements.
    pub values: Vec<AnyValue>,
}

/// `KeyValueList`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KvlistValue {
    /// The entries.
    pub values: Vec<KeyValue>,
}

fn any_value(v: &Value) -> AnyValue {
    match v {
        Value::String(s) => AnyValue::StringValue(s.clone()),
        Value::Bool(b) => AnyValue::BoolValue(*b),
        Value::Number(n) if n.is_i64() || n.is_u64() => AnyValue::IntValue(n.to_string()),
        Value::Number(n) => AnyValue::DoubleValue(n.as_f64().unwrap_or_default()),
        Value::Array(a) => AnyValue::ArrayValue(ArrayValue {
            values: a.iter().map(any_value).collect(),
        }),
        Value::Object(o) => AnyValue::KvlistValue(KvlistValue {
            values: o
                .iter()
                .map(|(k, v)| KeyValue {
                    key: k.clone(),
                    value: any_value(v),
                })
                .collect(),
        }),
        Value::Null => AnyValue::StringValue(String::new()),
    }
}

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: AnyValue::StringValue(value.into()),
    }
}

fn hex_id(v: Option<&Value>, len: usize) -> Option<String> {
    let s = v?.as_str()?;
    (s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit()) && s.bytes().any(|b| b != b'0'))
        .then(|| s.to_ascii_lowercase())
}

/// The OTLP log record of a record.
pub fn otlp_log_record(entry: &LogEntry) -> LogRecord {
    let facts = Facts::of(&entry.record);
    let r = &entry.record;
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    let event_name = format!(
        "beige.{}",
        if facts.kind.is_empty() {
            "record"
        } else {
            facts.kind
        }
    );
    let trace_id = hex_id(r.get("traceId"), 32);
    let span_id = hex_id(r.get("spanId"), 16);
    let mut attributes = vec![string_kv("event.name", &event_name)];
    for (k, v) in r {
        if k == "ts"
            || (k == "traceId" && trace_id.is_some())
            || (k == "spanId" && span_id.is_some())
            || v.is_null()
        {
            continue;
        }
        attributes.push(KeyValue {
            key: format!("beige.{k}"),
            value: any_value(v),
        });
    }
    let agent = s("agent");
    let mut body = if agent.is_empty() {
        facts.tool.to_string()
    } else {
        format!("{agent}/{}", facts.tool)
    };
    for part in [s("phase"), s("decision")] {
        if !part.is_empty() {
            body.push(' ');
            body.push_str(part);
        }
    }
    if let Some(e) = r.get("error").and_then(Value::as_str) {
        body.push_str(": ");
        body.push_str(e);
    }
    let (severity_number, severity_text) = facts.level().otlp();
    let nanos = entry
        .time
        .timestamp_nanos_opt()
        .unwrap_or_else(|| entry.time.timestamp_millis().saturating_mul(1_000_000));
    LogRecord {
        time_unix_nano: nanos.max(0).to_string(),
        severity_number,
        severity_text,
        event_name,
        body: AnyValue::StringValue(body),
        attributes,
        trace_id,
        span_id,
    }
}

/// An `ExportLogsServiceRequest` holding `records`.
pub fn otlp_request(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Resource {
                attributes: vec![
                    string_kv("service.name", PRODUCT),
                    string_kv("service.version", env!("CARGO_PKG_VERSION")),
                ],
            },
            scope_logs: vec![ScopeLogs {
                scope: Scope {
                    name: "beige.audit",
                },
                log_records: records,
            }],
        }],
    }
}

/// The URL to POST logs to: `endpoint`, with `/v1/logs` appended when it has no path.
pub fn otlp_logs_url(endpoint: &str) -> Result<reqwest::Url, ExportError> {
    let bad = |reason: String| ExportError::Endpoint {
        url: endpoint.into(),
        reason,
    };
    let mut url = reqwest::Url::parse(endpoint).map_err(|e| bad(format!("is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(format!("uses {}://", url.scheme())));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host".into()));
    }
    if url.path() == "/" || url.path().is_empty() {
        url.set_path("/v1/logs");
    }
    Ok(url)
}

/// POST one batch (an `ExportLogsServiceRequest` as JSON) to `url`. `sent`: records
/// accepted before, for the error.
pub async fn post_otlp(
    client: &reqwest::Client,
    url: &reqwest::Url,
    body: String,
    sent: u64,
) -> Result<(), ExportError> {
    let endpoint = url.to_string();
    let response = client
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|source| ExportError::Send {
            endpoint: endpoint.clone(),
            source,
        })?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let text = response.text().await.unwrap_or_default();
    let text: String = text.trim().chars().take(200).collect();
    Err(ExportError::Status {
        endpoint,
        status: status.to_string(),
        body: if text.is_empty() {
            String::new()
        } else {
            format!(": {text}")
        },
        sent,
    })
}

// ---------------------------------------------------------------------------------------
// The export

/// What an export produced so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records exported.
    pub exported: u64,
    /// Lines skipped because they are not records.
    pub skipped: u64,
    /// Records the filter left out.
    pub filtered: u64,
}

/// A piece of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// One line of output, without its newline: a record (jsonl, OCSF) or a batch (OTLP).
    pub text: String,
    /// How many records it holds.
    pub records: usize,
}

/// What an export yields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Output.
    Chunk(Chunk),
    /// A line that is not a record (say so, and go on).
    Skipped(SkippedLine),
}

/// An export: the log's records, filtered and converted, as an iterator of [`Piece`]s.
/// [`Exporter::summary`] counts what it did.
#[derive(Debug)]
pub struct Exporter {
    reader: LogReader,
    format: Format,
    filter: Filter,
    batch: usize,
    pending: Vec<LogRecord>,
    summary: Summary,
}

impl Exporter {
    /// Export the records of `files` (in `seq` order) that `filter` admits, as `format`.
    pub fn new(files: Vec<PathBuf>, format: Format, filter: Filter) -> Self {
        Self {
            reader: LogReader::new(files),
            format,
            filter,
            batch: OTLP_BATCH,
            pending: Vec::new(),
            summary: Summary::default(),
        }
    }

    /// Records per OTLP batch (at least 1).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// What was exported, skipped and left out so far.
    pub fn summary(&self) -> Summary {
        self.summary
    }

    fn flush(&mut self) -> Option<Result<Piece, ExportError>> {
        if self.pending.is_empty() {
            return None;
        }
        let records = std::mem::take(&mut self.pending);
        let n = records.len();
        Some(
            serde_json::to_string(&otlp_request(records))
                .map(|text| Piece::Chunk(Chunk { text, records: n }))
                .map_err(|source| ExportError::Encode { source }),
        )
    }
}

impl Iterator for Exporter {
    type Item = Result<Piece, ExportError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let entry = match self.reader.next() {
                None => return self.flush(),
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(ReadLine::Skipped(s))) => {
                    self.summary.skipped += 1;
                    return Some(Ok(Piece::Skipped(s)));
                }
                Some(Ok(ReadLine::Entry(e))) => e,
            };
            if !self.filter.admits(&entry) {
                self.summary.filtered += 1;
                continue;
            }
            self.summary.exported += 1;
            let text = match self.format {
                Format::Jsonl => Ok(entry.raw),
                Format::Ocsf => serde_json::to_string(&ocsf_event(&entry))
                    .map_err(|source| ExportError::Encode { source }),
                Format::Otlp => {
                    self.pending.push(otlp_log_record(&entry));
                    if self.pending.len() >= self.batch {
                        return self.flush();
                    }
                    continue;
                }
            };
            return Some(text.map(|text| Piece::Chunk(Chunk { text, records: 1 })));
        }
    }
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
