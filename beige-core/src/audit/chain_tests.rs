//! The chain against every kind of tampering, and across rotations and restarts.

use super::*;
use crate::audit::{AuditDecision, AuditRecord, AuditSink, JsonlAudit};

const INSTALL: &str = "0123456789abcdef";

struct Log {
    dir: tempfile::TempDir,
    public: [u8; 32],
}

impl Log {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = SigningKey::load_or_create(&dir.path().join("keys")).unwrap();
        let public = key.public();
        Self { dir, public }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }

    fn head_path(&self) -> PathBuf {
        self.dir.path().join(HEAD_FILE)
    }

    /// A writer as the gateway makes it (rotating at `max_size` bytes).
    fn writer(&self, max_size: u64) -> JsonlAudit {
        let key = SigningKey::load_or_create(&self.dir.path().join("keys")).unwrap();
        JsonlAudit::new(self.path(), max_size, 10, vec!["sekrit-value".into()]).chained(
            key,
            INSTALL,
            self.head_path(),
        )
    }

    async fn write(&self, audit: &JsonlAudit, n: usize) {
        for i in 0..n {
            let r = AuditRecord::security(
                "intern",
                "test.event",
                vec![format!("n={i}"), "sekrit-value".into()],
                AuditDecision::Allowed,
            );
            audit.record(&r).await.unwrap();
        }
    }

    fn verify(&self) -> Report {
        verify(
            &log_files(&self.path()),
            Some(&self.public),
            Head::read(&self.head_path()).as_ref(),
        )
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path())
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn set_lines(&self, lines: &[String]) {
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(self.path(), text).unwrap();
    }
}

fn bad(report: &Report) -> &BadLine {
    report
        .first_bad
        .as_ref()
        .unwrap_or_else(|| panic!("tampering went unnoticed: {report:?}"))
}

#[tokio::test]
async fn an_untouched_log_verifies_and_secrets_stay_redacted() {
    let log = Log::new();
    let audit = log.writer(0);
    log.write(&audit, 20).await;
    let r = log.verify();
    assert!(r.ok, "{r:?}");
    // genesis, its checkpoint, and the 20 records.
    assert_eq!(r.records, 22);
    assert_eq!(r.checkpoints, 1);
    assert_eq!(r.range, Some((0, 21)));
    let text = std::fs::read_to_string(log.path()).unwrap();
    assert!(!text.contains("sekrit-value"));
    assert!(text.contains("***"));
    // Every line is canonical and carries its chain fields.
    for line in log.lines() {
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(canonical(&v), line);
        assert!(v.get("hash").is_some() && v.get("prev").is_some() && v.get("seq").is_some());
    }
    assert_eq!(Head::read(&log.head_path()).unwrap().seq, 21);
}

#[tokio::test]
async fn one_changed_byte_is_a_hash_mismatch_on_its_line() {
    let log = Log::new();
    log.write(&log.writer(0), 10).await;
    let mut lines = log.lines();
    lines[6] = lines[6].replace("n=4", "n=5");
    log.set_lines(&lines);
    let r = log.verify();
    let b = bad(&r);
    assert_eq!(b.line, Some(7));
    assert!(b.reason.contains("hash mismatch"), "{b}");
    assert_eq!(b.seq, Some(6));
}

#[tokio::test]
async fn a_deleted_record_is_named() {
    let log = Log::new();
    log.write(&log.writer(0), 10).await;
    let mut lines = log.lines();
    lines.remove(5);
    log.set_lines(&lines);
    let b = bad(&log.verify()).clone();
    assert_eq!(b.line, Some(6));
    assert!(
        b.reason.contains("seq 6 follows 4, 1 record deleted"),
        "{b}"
    );
}

#[tokio::test]
async fn swapped_records_are_out_of_order() {
    let log = Log::new();
    log.write(&log.writer(0), 10).await;
    let mut lines = log.lines();
    lines.swap(4, 5);
    log.set_lines(&lines);
    let b = bad(&log.verify()).clone();
    assert_eq!(b.line, Some(5));
    assert!(
        b.reason.contains("follows") || b.reason.contains("out of order"),
        "{b}"
    );
}

#[tokio::test]
async fn an_inserted_copy_is_out_of_order() {
    let log = Log::new();
    log.write(&log.writer(0), 10).await;
    let mut lines = log.lines();
    let copy = lines[3].clone();
    lines.insert(6, copy);
    log.set_lines(&lines);
    let b = bad(&log.verify()).clone();
    assert_eq!(b.line, Some(7));
    assert!(b.reason.contains("out of order"), "{b}");
}

#[tokio::test]
async fn a_truncated_tail_is_caught_by_the_stored_head() {
    let log = Log::new();
    log.write(&log.writer(0), 10).await;
    let mut lines = log.lines();
    lines.truncate(lines.len() - 3);
    log.set_lines(&lines);
    let b = bad(&log.verify()).clone();
    assert_eq!(b.line, None);
    assert!(
        b.reason.contains("last seq 8, the gateway wrote up to 11"),
        "{b}"
    );
    // Without the head the cut is not visible, and the report says it could not be.
    let r = verify(&log_files(&log.path()), Some(&log.public), None);
    assert!(
        r.ok && r.warnings.iter().any(|w| w.contains("stored head")),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_rewritten_non_canonical_line_is_refused() {
    let log = Log::new();
    log.write(&log.writer(0), 5).await;
    let mut lines = log.lines();
    let v: Value = serde_json::from_str(&lines[3]).unwrap();
    lines[3] = serde_json::to_string_pretty(&v).unwrap().replace('\n', "");
    log.set_lines(&lines);
    let b = bad(&log.verify()).clone();
    assert_eq!(b.line, Some(4));
    assert!(b.reason.contains("canonical"), "{b}");
}

/// Re-hash every record from `from` on, as a forger without the key would.
fn rehash(lines: &mut [String], from: usize) {
    let mut prev: Option<String> = None;
    for (i, line) in lines.iter_mut().enumerate() {
        let mut v: Value = serde_json::from_str(line).unwrap();
        if i >= from {
            let m = v.as_object_mut().unwrap();
            m.remove("hash");
            if let Some(p) = &prev {
                m.insert("prev".into(), Value::String(p.clone()));
            }
            m.insert("seq".into(), Value::from(i as u64));
            let h = record_hash(&v);
            v.as_object_mut()
                .unwrap()
                .insert("hash".into(), Value::String(h));
            *line = canonical(&v);
        }
        prev = Some(v["hash"].as_str().unwrap().to_string());
    }
}

#[tokio::test]
async fn an_edit_with_every_later_hash_recomputed_fails_at_the_checkpoint() {
    let log = Log::new();
    let audit = log.writer(0);
    log.write(&audit, 5).await;
    // A checkpoint after record 6 (rotation closes the file with one; force it here).
    {
        let mut state = audit.state.lock().unwrap();
        let c = state.chain.as_mut().unwrap();
        let closing = c.closing_lines();
        crate::audit::append_to(&log.path(), closing.as_bytes()).unwrap();
        c.committed();
    }
    log.write(&audit, 2).await;
    let mut lines = log.lines();
    let cp = lines
        .iter()
        .rposition(|l| l.contains("\"type\":\"checkpoint\""))
        .unwrap();
    assert_eq!(cp, 7);
    lines[4] = lines[4].replace("n=2", "n=9");
    rehash(&mut lines, 4);
    log.set_lines(&lines);
    let b = bad(&log.verify()).clone();
    assert_eq!(b.line, Some(cp + 1));
    assert!(
        b.reason.contains("does not match the recomputed head"),
        "{b}"
    );
}

#[tokio::test]
async fn a_whole_forged_file_without_the_key_is_refused() {
    let log = Log::new();
    log.write(&log.writer(0), 5).await;
    // The forger writes a log of their own, with a key of their own, and the head file.
    let forger = Log::new();
    let fake = forger.writer(0);
    forger.write(&fake, 3).await;
    std::fs::copy(forger.path(), log.path()).unwrap();
    std::fs::copy(forger.head_path(), log.head_path()).unwrap();
    let b = bad(&log.verify()).clone();
    assert_eq!(b.line, Some(2));
    assert!(b.reason.contains("signature"), "{b}");
    // Dropping the checkpoint does not help.
    let mut lines = forger.lines();
    lines.remove(1);
    rehash(&mut lines, 1);
    log.set_lines(&lines);
    let b = bad(&log.verify()).clone();
    assert!(
        b.reason.contains("not followed by a signed checkpoint"),
        "{b}"
    );
}

#[tokio::test]
async fn three_rotations_and_a_restart_keep_one_chain() {
    let log = Log::new();
    {
        let audit = log.writer(2_000);
        log.write(&audit, 20).await;
    }
    // A restart: a new writer continues from the tail.
    let audit = log.writer(2_000);
    log.write(&audit, 20).await;
    let files = log_files(&log.path());
    assert!(files.len() >= 4, "expected three rotations: {files:?}");
    let r = log.verify();
    assert!(r.ok, "{r:?}");
    // The genesis's checkpoint, and one closing each rotated file.
    assert_eq!(r.checkpoints as usize, files.len(), "{r:?}");
    // Each rotated file opens with `rotate` and the old file ends with a checkpoint.
    for f in &files[1..] {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.lines().next().unwrap().contains("\"tool\":\"rotate\""),
            "{f:?}"
        );
    }
    for f in &files[..files.len() - 1] {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.lines()
                .last()
                .unwrap()
                .contains("\"type\":\"checkpoint\""),
            "{f:?}"
        );
    }
    // Deleting the middle file breaks the chain at the next file's first line.
    std::fs::remove_file(&files[1]).unwrap();
    let b = bad(&log.verify()).clone();
    assert!(b.reason.contains("deleted"), "{b}");
}

#[tokio::test]
async fn a_torn_last_line_is_moved_aside_and_recorded() {
    let log = Log::new();
    log.write(&log.writer(0), 3).await;
    let mut text = std::fs::read(log.path()).unwrap();
    text.extend_from_slice(b"{\"ts\":\"half a rec");
    std::fs::write(log.path(), &text).unwrap();
    log.write(&log.writer(0), 1).await;
    let r = log.verify();
    assert!(r.ok, "{r:?}");
    let lines = log.lines();
    let rec = lines
        .iter()
        .find(|l| l.contains("recovery.torn"))
        .expect("a recovery record");
    assert!(rec.contains("bytes=17"), "{rec}");
    let torn: Vec<_> = std::fs::read_dir(log.dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".torn-"))
        .collect();
    assert_eq!(torn.len(), 1);
    assert_eq!(
        std::fs::read(torn[0].path()).unwrap(),
        b"{\"ts\":\"half a rec".to_vec()
    );
}

#[test]
fn canonical_sorts_keys_and_drops_whitespace() {
    let v: Value =
        serde_json::from_str(r#"{ "b": [1, {"z": null, "a": "x\n"}], "a": true }"#).unwrap();
    assert_eq!(canonical(&v), r#"{"a":true,"b":[1,{"a":"x\n","z":null}]}"#);
}

#[test]
fn the_key_file_is_private_and_stable() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let a = SigningKey::load_or_create(dir.path()).unwrap().public();
    let b = SigningKey::load_or_create(dir.path()).unwrap().public();
    assert_eq!(a, b);
    let mode = std::fs::metadata(dir.path().join(KEY_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let public = std::fs::read_to_string(dir.path().join(PUBKEY_FILE)).unwrap();
    assert_eq!(parse_public_key(&public), Some(a));
}
