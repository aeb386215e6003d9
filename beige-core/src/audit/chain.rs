//! The tamper-evident chain over the audit log: what makes a changed, removed,
//! reordered or forged record show.
//!
//! Owns the chain's format and both of its ends. Every line of `audit.jsonl` is its
//! record in canonical JSON (keys sorted, no whitespace) with three fields added: `seq`
//! (one more than the record before it, across files and restarts), `prev` (the `hash`
//! of the record before it) and `hash` (base64url of SHA-256 over
//! [`DOMAIN`] ‖ the canonical record without `hash`). The first record of a chain is
//! `lifecycle.genesis`, whose `prev` hashes the installation id, followed by a
//! `checkpoint`: a signed note (C2SP format) naming the `seq` and `hash` of the record
//! before it, signed with the gateway's Ed25519 key (`keys/audit_ed25519`, 0600; the
//! public key beside it in `audit_ed25519.pub`). Checkpoints follow every
//! [`CHECKPOINT_EVERY`] records, every [`CHECKPOINT_INTERVAL`] with new records, and
//! close a file before rotation; the next file opens with a `rotate` record. The head
//! (`seq` and `hash` of the last record) is kept in `logs/audit.head`, so a log cut
//! short shows. A torn last line (a crash mid-write) is moved to
//! `audit.jsonl.torn-<time>` and a `recovery` record says so.
//!
//! [`verify`] checks files offline with only the public key and names the first bad
//! line. What the chain cannot stop: whoever holds the key can forge a history that
//! verifies; a copy of the checkpoints kept off the host is what catches that.

use std::fmt::Write as _;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// What every record's hash starts with, so a hash of one cannot pass for another kind.
pub const DOMAIN: &[u8] = b"beige-audit-v1\0";
/// A checkpoint follows at least this many records.
pub const CHECKPOINT_EVERY: u64 = 1000;
/// A checkpoint follows the first record written this long after the last checkpoint.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(60);
/// The signing key's file in `<BEIGE_HOME>/keys`.
pub const KEY_FILE: &str = "audit_ed25519";
/// The public key's file in `<BEIGE_HOME>/keys` (base64 of the 32 key bytes).
pub const PUBKEY_FILE: &str = "audit_ed25519.pub";
/// The head file beside the log (`<log>.head` is not used: rotation would move it).
pub const HEAD_FILE: &str = "audit.head";

const B64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Why the chain's key or head could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// A key or head file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The key file does not hold a key.
    #[error("{}: {message}", path.display())]
    BadKey {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
}

/// `v` in canonical form: object keys sorted by their UTF-16 code units (RFC 8785; for
/// the ASCII keys of audit records the same as byte order), no whitespace, strings and
/// integers as serde_json writes them.
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The `hash` of a record (given without its `hash` field).
pub fn record_hash(record_without_hash: &Value) -> String {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    h.update(canonical(record_without_hash).as_bytes());
    B64URL.encode(h.finalize())
}

/// The `prev` of a chain's genesis record: a hash of the installation id.
pub fn genesis_prev(installation: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"beige-audit-genesis\0");
    h.update(installation.as_bytes());
    B64URL.encode(h.finalize())
}

/// The origin line of this installation's checkpoints.
pub fn origin(installation: &str) -> String {
    format!("beige.audit/{installation}")
}

/// The gateway's audit signing key.
pub struct SigningKey {
    pair: ring::signature::Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &B64.encode(self.public()))
            .finish()
    }
}

impl SigningKey {
    /// The key in `keys_dir/audit_ed25519`, made (0600, with the public key beside it)
    /// when there is none.
    pub fn load_or_create(keys_dir: &Path) -> Result<Self, ChainError> {
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
        let path = keys_dir.join(KEY_FILE);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ChainError::Io { path, source }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(keys_dir)
            .map_err(io(keys_dir))?;
        if !path.exists() {
            let rng = ring::rand::SystemRandom::new();
            let doc = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| {
                ChainError::BadKey {
                    path: path.clone(),
                    message: "the system's random source failed making a key".into(),
                }
            })?;
            let tmp = keys_dir.join(format!("{KEY_FILE}.tmp-{}", std::process::id()));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io(&tmp))?;
            f.write_all(format!("{}\n", B64.encode(doc.as_ref())).as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(io(&tmp))?;
            // Another gateway of this home may have been first; then its key is the one.
            if std::fs::hard_link(&tmp, &path).is_err() && !path.exists() {
                let _ = std::fs::remove_file(&tmp);
                return Err(ChainError::BadKey {
                    path,
                    message: "could not create the key file".into(),
                });
            }
            let _ = std::fs::remove_file(&tmp);
        }
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        let pair = B64
            .decode(text.trim())
            .ok()
            .and_then(|der| ring::signature::Ed25519KeyPair::from_pkcs8(&der).ok())
            .ok_or_else(|| ChainError::BadKey {
                path: path.clone(),
                message: "not an Ed25519 key (base64 PKCS#8). Move it away to make a new one; \
                          checkpoints signed with it then verify only with its old public key"
                    .into(),
            })?;
        let key = Self { pair };
        let pub_path = keys_dir.join(PUBKEY_FILE);
        let want = format!("{}\n", B64.encode(key.public()));
        if std::fs::read_to_string(&pub_path).ok().as_deref() != Some(want.as_str()) {
            std::fs::write(&pub_path, want).map_err(io(&pub_path))?;
        }
        Ok(key)
    }

    /// The 32 bytes of the public key.
    pub fn public(&self) -> [u8; 32] {
        use ring::signature::KeyPair as _;
        let mut out = [0u8; 32];
        out.copy_from_slice(self.pair.public_key().as_ref());
        out
    }

    /// The signed note of a checkpoint at (`seq`, `head`).
    pub fn checkpoint_note(&self, origin: &str, seq: u64, head: &str, time: &str) -> String {
        let body = note_body(origin, seq, head, time);
        let sig = self.pair.sign(body.as_bytes());
        let mut blob = key_id(origin, &self.public()).to_vec();
        blob.extend_from_slice(sig.as_ref());
        format!("{body}\n\u{2014} {origin} {}\n", B64.encode(blob))
    }
}

fn note_body(origin: &str, seq: u64, head: &str, time: &str) -> String {
    format!("{origin}\n{seq}\n{head}\ntime {time}\n")
}

/// The C2SP key id: the first 4 bytes of SHA-256(name ‖ "\n" ‖ 0x01 ‖ key).
fn key_id(name: &str, public: &[u8; 32]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n\x01");
    h.update(public);
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// What a checkpoint's note says, once its signature checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Note {
    seq: u64,
    head: String,
}

/// Check a checkpoint's note against `public`; `Err` says what is wrong.
fn open_note(note: &str, public: Option<&[u8; 32]>) -> Result<Note, String> {
    let (body, sigs) = note
        .split_once("\n\n")
        .ok_or("the checkpoint's note has no signature")?;
    let body = format!("{body}\n");
    let mut lines = body.lines();
    let origin = lines.next().unwrap_or_default().to_string();
    let seq = lines
        .next()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or("the checkpoint's note has no seq")?;
    let head = lines
        .next()
        .filter(|h| !h.is_empty())
        .ok_or("the checkpoint's note has no head hash")?
        .to_string();
    if let Some(public) = public {
        let want_id = key_id(&origin, public);
        let good = sigs.lines().any(|line| {
            let Some(rest) = line.strip_prefix("\u{2014} ") else {
                return false;
            };
            let Some((name, sig)) = rest.split_once(' ') else {
                return false;
            };
            let Ok(blob) = B64.decode(sig) else {
                return false;
            };
            name == origin
                && blob.len() == 68
                && blob[..4] == want_id
                && ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
                    .verify(body.as_bytes(), &blob[4..])
                    .is_ok()
        });
        if !good {
            return Err("its signature does not verify with the audit public key".into());
        }
    }
    Ok(Note { seq, head })
}

/// The last record the writer wrote: where the next one continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Its `seq`.
    pub seq: u64,
    /// Its `hash`.
    pub hash: String,
}

impl Head {
    /// The head in `path`, when the file holds one.
    pub fn read(path: &Path) -> Option<Head> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut parts = text.split_whitespace();
        let seq = parts.next()?.parse().ok()?;
        let hash = parts.next()?.to_string();
        Some(Head { seq, hash })
    }
}

/// The writer's side of the chain, owned by [`super::JsonlAudit`] under its lock.
#[derive(Debug)]
pub(crate) struct ChainWriter {
    key: SigningKey,
    installation: String,
    head_path: PathBuf,
    head_file: Option<std::fs::File>,
    /// The length the head file was last written (and cut) to.
    head_len: Option<usize>,
    /// `None` until the log's tail was read.
    head: Option<Head>,
    since_checkpoint: u64,
    last_checkpoint: Instant,
}

/// The `type`s of the records the chain's writer makes itself.
pub const CHAIN_TYPES: [&str; 4] = ["lifecycle", "checkpoint", "rotate", "recovery"];

/// Whether a log line's record is one the chain's writer made (not a call or event of
/// an agent): readers that count calls skip these.
pub fn is_chain_record(v: &Value) -> bool {
    v.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| CHAIN_TYPES.contains(&t))
}

/// A record the writer makes itself (`lifecycle`, `checkpoint`, `rotate`, `recovery`).
fn own_record(kind: &str, tool: &str, args: Vec<String>) -> Value {
    serde_json::json!({
        "ts": super::now_ts(),
        "agent": "",
        "phase": "finished",
        "type": kind,
        "tool": tool,
        "args": args,
        "decision": "allowed",
        "target": "gateway",
    })
}

impl ChainWriter {
    /// A writer that signs with `key` and keeps its head in `head_path`.
    pub(crate) fn new(key: SigningKey, installation: String, head_path: PathBuf) -> Self {
        Self {
            key,
            installation,
            head_path,
            head_file: None,
            head_len: None,
            head: None,
            since_checkpoint: 0,
            last_checkpoint: Instant::now(),
        }
    }

    /// The lines to append for `record` (a redacted record as JSON): the record itself,
    /// preceded on the first call by whatever the chain needs first (a genesis and its
    /// checkpoint, or a recovery record), and followed by a checkpoint when one is due.
    /// Returns all the lines, and the record's own line (without its newline).
    pub(crate) fn lines_for(
        &mut self,
        log: &Path,
        record: Value,
    ) -> std::io::Result<(String, String)> {
        let mut out = String::new();
        if self.head.is_none() {
            self.resume(log, &mut out)?;
        }
        let own = self.push(&mut out, record);
        if self.since_checkpoint >= CHECKPOINT_EVERY
            || self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL
        {
            self.push_checkpoint(&mut out);
        }
        Ok((out, own))
    }

    /// The lines that close a file before it is rotated (a checkpoint), when the chain
    /// has begun.
    pub(crate) fn closing_lines(&mut self) -> String {
        let mut out = String::new();
        if self.head.is_some() && self.since_checkpoint > 0 {
            self.push_checkpoint(&mut out);
        }
        out
    }

    /// The line that opens the file after a rotation.
    pub(crate) fn opening_lines(&mut self) -> String {
        let mut out = String::new();
        if self.head.is_some() {
            self.push(&mut out, own_record("rotate", "rotate", Vec::new()));
        }
        out
    }

    /// Record that `lines` reached the file: the head file follows.
    pub(crate) fn committed(&mut self) {
        let Some(head) = &self.head else { return };
        let text = format!("{:020} {}\n", head.seq, head.hash);
        // The text has the same length every time (a zero-padded number and a digest of
        // fixed size), so the file is cut to it only when it is opened, not on every
        // record (a truncate costs the file system a journal entry).
        let mut opened = false;
        if self.head_file.is_none() {
            self.head_file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&self.head_path)
                .ok();
            opened = true;
        }
        let written = self.head_file.as_ref().map(|f| {
            f.write_all_at(text.as_bytes(), 0).and_then(|()| {
                let cut = opened || self.head_len != Some(text.len());
                if cut {
                    f.set_len(text.len() as u64)?;
                }
                Ok(())
            })
        });
        self.head_len = matches!(written, Some(Ok(()))).then_some(text.len());
        if !matches!(written, Some(Ok(()))) {
            tracing::warn!(path = %self.head_path.display(), "could not update the audit head file; verification will not notice a cut-short log");
            self.head_file = None;
        }
    }

    /// The writer forgets what it wrote last (the lines did not reach the file): the
    /// next record re-reads the tail.
    pub(crate) fn forget(&mut self) {
        self.head = None;
    }

    /// Chain `record` onto `out`; returns its line.
    fn push(&mut self, out: &mut String, record: Value) -> String {
        let Value::Object(mut map) = record else {
            return String::new();
        };
        let (seq, prev) = match &self.head {
            Some(h) => (h.seq + 1, h.hash.clone()),
            None => (0, genesis_prev(&self.installation)),
        };
        map.remove("hash");
        map.insert("seq".into(), Value::from(seq));
        map.insert("prev".into(), Value::String(prev));
        let mut v = Value::Object(map);
        let hash = record_hash(&v);
        if let Value::Object(m) = &mut v {
            m.insert("hash".into(), Value::String(hash.clone()));
        }
        let line = canonical(&v);
        out.push_str(&line);
        out.push('\n');
        self.head = Some(Head { seq, hash });
        self.since_checkpoint += 1;
        line
    }

    fn push_checkpoint(&mut self, out: &mut String) {
        let Some(head) = self.head.clone() else {
            return;
        };
        let origin = origin(&self.installation);
        let note = self
            .key
            .checkpoint_note(&origin, head.seq, &head.hash, &super::now_ts());
        let mut r = own_record("checkpoint", "checkpoint", Vec::new());
        if let Value::Object(m) = &mut r {
            m.insert("note".into(), Value::String(note));
        }
        self.push(out, r);
        self.since_checkpoint = 0;
        self.last_checkpoint = Instant::now();
    }

    /// Read where the log ends: its last record, or start a chain.
    fn resume(&mut self, log: &Path, out: &mut String) -> std::io::Result<()> {
        let mut recovery = None;
        if let Some(torn) = cut_torn_tail(log)? {
            recovery = Some(torn);
        }
        let last = last_chained(log).or_else(|| last_chained(&super::numbered(log, 1)));
        match last {
            Some(head) => {
                self.head = Some(head);
                let stored = Head::read(&self.head_path);
                if let Some(stored) =
                    stored.filter(|s| s.seq > self.head.as_ref().map_or(0, |h| h.seq))
                {
                    let from = self.head.as_ref().map_or(0, |h| h.seq + 1);
                    self.push(
                        out,
                        own_record(
                            "recovery",
                            "recovery.missing",
                            vec![format!("from={from}"), format!("to={}", stored.seq)],
                        ),
                    );
                }
            }
            None => {
                self.push(
                    out,
                    own_record(
                        "lifecycle",
                        "lifecycle.genesis",
                        vec![format!("installation={}", self.installation)],
                    ),
                );
                self.push_checkpoint(out);
            }
        }
        if let Some((path, len, sha)) = recovery {
            self.push(
                out,
                own_record(
                    "recovery",
                    "recovery.torn",
                    vec![
                        format!("file={}", path.display()),
                        format!("bytes={len}"),
                        format!("sha256={sha}"),
                    ],
                ),
            );
        }
        Ok(())
    }
}

/// When `log` ends in a partial line, move it to `<log>.torn-<time>` and cut the file
/// back to its last whole line: `(moved to, length, sha256 hex)`.
fn cut_torn_tail(log: &Path) -> std::io::Result<Option<(PathBuf, u64, String)>> {
    let mut f = match std::fs::OpenOptions::new().read(true).write(true).open(log) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    // Look back far enough for any record (they are bounded well below this).
    let window = len.min(1 << 20);
    f.seek(SeekFrom::Start(len - window))?;
    let mut tail = Vec::with_capacity(window as usize);
    f.read_to_end(&mut tail)?;
    if tail.last() == Some(&b'\n') {
        return Ok(None);
    }
    let keep = match tail.iter().rposition(|b| *b == b'\n') {
        Some(i) => len - window + i as u64 + 1,
        None if window == len => 0,
        // A line longer than the window: leave the file as it is.
        None => return Ok(None),
    };
    let torn = &tail[(keep - (len - window)) as usize..];
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".torn-{stamp}"));
    let dest = PathBuf::from(name);
    std::fs::write(&dest, torn)?;
    f.set_len(keep)?;
    Ok(Some((
        dest,
        torn.len() as u64,
        hex::encode(Sha256::digest(torn)),
    )))
}

/// The head of the last chained record in `path`, if any.
fn last_chained(path: &Path) -> Option<Head> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().rev().find_map(|line| {
        let v: Value = serde_json::from_str(line).ok()?;
        Some(Head {
            seq: v.get("seq")?.as_u64()?,
            hash: v.get("hash")?.as_str()?.to_string(),
        })
    })
}

/// Where a bad line is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BadLine {
    /// The file, as given.
    pub file: String,
    /// Its line number (from 1), or `None` for the end of the log.
    pub line: Option<usize>,
    /// The record's `seq`, when it has one.
    pub seq: Option<u64>,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for BadLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}", self.file)?,
            None => write!(f, "{}:end", self.file)?,
        }
        if let Some(s) = self.seq {
            write!(f, " (seq {s})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `true` when no line was bad.
    pub ok: bool,
    /// The first bad line.
    pub first_bad: Option<BadLine>,
    /// The `seq` of the first and last chained record checked.
    pub range: Option<(u64, u64)>,
    /// Records checked.
    pub records: u64,
    /// Signed checkpoints that verified.
    pub checkpoints: u64,
    /// What was not checked, or is worth knowing.
    pub warnings: Vec<String>,
}

/// The files of the log at `current` in `seq` order: `.N` … `.1`, then `current`.
pub fn log_files(current: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<(u32, PathBuf)> = Vec::new();
    if let (Some(dir), Some(name)) = (current.parent(), current.file_name()) {
        let prefix = format!("{}.", name.to_string_lossy());
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.filter_map(Result::ok) {
                let file_name = e.file_name();
                let Some(n) = file_name
                    .to_str()
                    .and_then(|s| s.strip_prefix(&prefix))
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                rotated.push((n, e.path()));
            }
        }
    }
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut out: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    if current.exists() {
        out.push(current.to_path_buf());
    }
    out
}

/// Check `files` (in `seq` order) as one chain. `public`: the audit public key, without
/// which signatures are not checked (a warning says so). `stored`: the head the gateway
/// recorded, to tell a log cut short. Stops at the first bad line.
pub fn verify(files: &[PathBuf], public: Option<&[u8; 32]>, stored: Option<&Head>) -> Report {
    let mut report = Report::default();
    if public.is_none() {
        report
            .warnings
            .push("no public key given: checkpoint signatures were not checked".into());
    }
    let mut prev: Option<(u64, String)> = None;
    // The genesis (or first record of history that rotated out) waits for a checkpoint.
    let mut awaiting_first_checkpoint = false;
    let mut last_file = String::new();
    for path in files {
        let name = path.display().to_string();
        last_file.clone_from(&name);
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) => {
                report.first_bad = Some(BadLine {
                    file: name,
                    line: None,
                    seq: None,
                    reason: format!("cannot be read: {e}"),
                });
                return report;
            }
        };
        let bad = |line: usize, seq: Option<u64>, reason: String| BadLine {
            file: name.clone(),
            line: Some(line),
            seq,
            reason,
        };
        let mut lines = text.split(|b| *b == b'\n').peekable();
        let mut n = 0usize;
        while let Some(raw) = lines.next() {
            n += 1;
            if raw.is_empty() && lines.peek().is_none() {
                break;
            }
            let Ok(line) = std::str::from_utf8(raw) else {
                report.first_bad = Some(bad(
                    n,
                    None,
                    "not UTF-8 text, the record was changed".into(),
                ));
                return report;
            };
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                report.first_bad = Some(bad(
                    n,
                    None,
                    "not a JSON record, the line was changed or cut".into(),
                ));
                return report;
            };
            let Some(hash) = v.get("hash").and_then(Value::as_str).map(str::to_string) else {
                if prev.is_none() {
                    continue; // written before the chain began
                }
                report.first_bad = Some(bad(
                    n,
                    None,
                    "a record without a hash inside the chain: inserted or rewritten".into(),
                ));
                return report;
            };
            let seq = v.get("seq").and_then(Value::as_u64);
            if canonical(&v) != line {
                report.first_bad = Some(bad(
                    n,
                    seq,
                    "not in canonical form, the record was rewritten".into(),
                ));
                return report;
            }
            let mut without = v.clone();
            if let Value::Object(m) = &mut without {
                m.remove("hash");
            }
            if record_hash(&without) != hash {
                report.first_bad =
                    Some(bad(n, seq, "hash mismatch, the record was changed".into()));
                return report;
            }
            let Some(seq) = seq else {
                report.first_bad = Some(bad(n, None, "a record without a seq".into()));
                return report;
            };
            let this_prev = v.get("prev").and_then(Value::as_str).unwrap_or_default();
            let tool = v.get("tool").and_then(Value::as_str).unwrap_or_default();
            match &prev {
                None => {
                    if tool == "lifecycle.genesis" && seq == 0 {
                        awaiting_first_checkpoint = true;
                    } else {
                        report.warnings.push(format!(
                            "history before seq {seq} rotated out (or was removed): it cannot be checked"
                        ));
                    }
                    report.range = Some((seq, seq));
                }
                Some((pseq, phash)) => {
                    if seq > pseq + 1 {
                        let k = seq - pseq - 1;
                        report.first_bad = Some(bad(
                            n,
                            Some(seq),
                            format!(
                                "seq {seq} follows {pseq}, {k} record{} deleted before this line",
                                if k == 1 { "" } else { "s" }
                            ),
                        ));
                        return report;
                    }
                    if seq <= *pseq {
                        report.first_bad = Some(bad(
                            n,
                            Some(seq),
                            format!("seq {seq} after {pseq}, records out of order"),
                        ));
                        return report;
                    }
                    if this_prev != phash {
                        report.first_bad = Some(bad(
                            n,
                            Some(seq),
                            format!(
                                "prev does not match the record before it (line {})",
                                n.saturating_sub(1)
                            ),
                        ));
                        return report;
                    }
                    if let Some(r) = &mut report.range {
                        r.1 = seq;
                    }
                }
            }
            if v.get("type").and_then(Value::as_str) == Some("checkpoint") {
                let note = v.get("note").and_then(Value::as_str).unwrap_or_default();
                match open_note(note, public) {
                    Err(why) => {
                        report.first_bad =
                            Some(bad(n, Some(seq), format!("checkpoint at line {n}: {why}")));
                        return report;
                    }
                    Ok(note) => {
                        let matches = prev
                            .as_ref()
                            .is_some_and(|(ps, ph)| *ps == note.seq && *ph == note.head);
                        if !matches {
                            report.first_bad = Some(bad(
                                n,
                                Some(seq),
                                format!(
                                    "checkpoint at line {n} does not match the recomputed head"
                                ),
                            ));
                            return report;
                        }
                        if public.is_some() {
                            report.checkpoints += 1;
                        }
                        awaiting_first_checkpoint = false;
                    }
                }
            } else if awaiting_first_checkpoint && tool != "lifecycle.genesis" {
                report.first_bad = Some(bad(
                    n,
                    Some(seq),
                    "the chain's genesis is not followed by a signed checkpoint: the log was replaced".into(),
                ));
                return report;
            }
            report.records += 1;
            prev = Some((seq, hash));
        }
    }
    if let Some(stored) = stored {
        match &prev {
            Some((seq, _)) if *seq < stored.seq => {
                report.first_bad = Some(BadLine {
                    file: last_file,
                    line: None,
                    seq: Some(*seq),
                    reason: format!(
                        "last seq {seq}, the gateway wrote up to {}: the log was cut short",
                        stored.seq
                    ),
                });
                return report;
            }
            Some((seq, hash)) if *seq == stored.seq && *hash != stored.hash => {
                report.first_bad = Some(BadLine {
                    file: last_file,
                    line: None,
                    seq: Some(*seq),
                    reason: "the last record is not the one the gateway wrote last".into(),
                });
                return report;
            }
            None if stored.seq > 0 => {
                report.first_bad = Some(BadLine {
                    file: last_file,
                    line: None,
                    seq: None,
                    reason: format!(
                        "no chained record, the gateway wrote up to seq {}",
                        stored.seq
                    ),
                });
                return report;
            }
            _ => {}
        }
    } else {
        report.warnings.push(
            "no stored head given: a log cut short after its last checkpoint would not show".into(),
        );
    }
    if report.checkpoints == 0 && public.is_some() && prev.is_some() {
        report
            .warnings
            .push("no signed checkpoint was checked".into());
    }
    report.ok = true;
    report
}

/// Parse a public key file's text (base64 of 32 bytes).
pub fn parse_public_key(text: &str) -> Option<[u8; 32]> {
    let bytes = B64.decode(text.trim()).ok()?;
    <[u8; 32]>::try_from(bytes.as_slice()).ok()
}

/// A short human summary of a report.
pub fn summary(report: &Report) -> String {
    let mut s = String::new();
    match &report.first_bad {
        Some(bad) => {
            let _ = writeln!(s, "TAMPERED: {bad}");
        }
        None => {
            let range = report
                .range
                .map(|(a, b)| format!("seq {a}–{b}"))
                .unwrap_or_else(|| "no chained records".into());
            let _ = writeln!(
                s,
                "ok: {} records ({range}), {} signed checkpoints verified",
                report.records, report.checkpoints
            );
        }
    }
    for w in &report.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;
