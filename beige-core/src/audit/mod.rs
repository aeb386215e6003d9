//! The audit log: what every tool call was, who allowed it, how it ended.
//!
//! Owns the record format (the original's JSONL fields and phases), the [`AuditSink`]
//! trait and [`JsonlAudit`], an append-only file with size rotation and redaction of
//! configured secret values. A sink that cannot write returns an error, and the caller
//! then refuses the call (fail closed). It does not decide anything about the call.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::policy::ToolKind;

/// `started` before a call runs, `finished` after (or at once for a denied call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Started,
    Finished,
}

/// `core_tool` or `tool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditType {
    CoreTool,
    Tool,
    /// A security event that is not a tool call, e.g. `security.link_reject`.
    Security,
}

impl From<ToolKind> for AuditType {
    fn from(k: ToolKind) -> Self {
        match k {
            ToolKind::Core => AuditType::CoreTool,
            ToolKind::Plugin => AuditType::Tool,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditDecision {
    Allowed,
    Denied,
}

/// Where the call ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Gateway,
    Sandbox,
}

/// One line of `audit.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// Local time, `YYYY-MM-DDTHH:MM:SS.mmm±HH:MM`.
    pub ts: String,
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    pub phase: Phase,
    #[serde(rename = "type")]
    pub kind: AuditType,
    pub tool: String,
    pub args: Vec<String>,
    pub decision: AuditDecision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The current local time in the audit format.
pub fn now_ts() -> String {
    chrono::Local::now()
        .format("%Y-%m-%dT%H:%M:%S%.3f%:z")
        .to_string()
}

/// The audit record could not be written; the call must not run.
#[derive(Debug, thiserror::Error)]
#[error("the audit log {path} cannot be written ({source}); tool calls are refused until it can. Check the permissions and free space of its folder.")]
pub struct AuditError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

/// Where audit records go.
#[async_trait]
pub trait AuditSink: Send + Sync + std::fmt::Debug {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError>;
}

/// `logs/audit.jsonl`, rotated by size to `.1` … `.N`, secrets redacted as `***`.
#[derive(Debug)]
pub struct JsonlAudit {
    path: PathBuf,
    max_size: u64,
    max_files: u32,
    secrets: Vec<String>,
    lock: Mutex<()>,
}

/// Shortest value treated as a secret (shorter ones would redact ordinary words).
const MIN_SECRET_LEN: usize = 6;

impl JsonlAudit {
    /// `secrets` are values replaced by `***` wherever they appear in a record.
    pub fn new(
        path: impl Into<PathBuf>,
        max_size: u64,
        max_files: u32,
        secrets: Vec<String>,
    ) -> Self {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self {
            path: path.into(),
            max_size,
            max_files,
            secrets,
            lock: Mutex::new(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn redact(&self, v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => {
                for secret in &self.secrets {
                    if s.contains(secret.as_str()) {
                        *s = s.replace(secret.as_str(), "***");
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| self.redact(x)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|x| self.redact(x)),
            _ => {}
        }
    }

    /// The line written for a record (redacted, without the newline).
    pub fn line(&self, record: &AuditRecord) -> String {
        let mut v = serde_json::to_value(record).unwrap_or_default();
        self.redact(&mut v);
        v.to_string()
    }

    fn rotate_if_needed(&self) {
        let size = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        if size < self.max_size || self.max_size == 0 {
            return;
        }
        let numbered = |i: u32| PathBuf::from(format!("{}.{i}", self.path.display()));
        if self.max_files == 0 {
            let _ = std::fs::remove_file(&self.path);
            return;
        }
        let _ = std::fs::remove_file(numbered(self.max_files));
        for i in (1..self.max_files).rev() {
            let _ = std::fs::rename(numbered(i), numbered(i + 1));
        }
        let _ = std::fs::rename(&self.path, numbered(1));
    }

    fn append(&self, line: &str) -> std::io::Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.rotate_if_needed();
        // Opened per record, so a log that became unwritable is noticed at once.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        f.write_all(&buf)
    }
}

#[async_trait]
impl AuditSink for JsonlAudit {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let line = self.line(record);
        self.append(&line).map_err(|source| AuditError {
            path: self.path.display().to_string(),
            source,
        })?;
        tracing::info!(target: "beige::audit", "{}", human_line(record, &line));
        Ok(())
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
    let kind = match r.kind {
        AuditType::CoreTool => "CORE",
        AuditType::Tool => "TOOL",
        AuditType::Security => "SECURITY",
    };
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
    out.retain(|s| s.len() >= MIN_SECRET_LEN);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(args: Vec<String>) -> AuditRecord {
        AuditRecord {
            ts: now_ts(),
            agent: "a".into(),
            session: Some("socket:a".into()),
            model: None,
            channel: Some("socket".into()),
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
        }
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
}
