//! `beige audit verify` and `beige audit pubkey` on a home whose log the gateway's own
//! writer made: intact, then changed, cut short, and checked with a foreign key.

use beige_core::audit::chain::{SigningKey, HEAD_FILE};
use beige_core::audit::{AuditDecision, AuditRecord, AuditSink, JsonlAudit};

use super::TestEnv;

/// A home whose `logs/audit.jsonl` holds a chain of `n` records (plus genesis and its
/// checkpoint), written as the gateway writes it.
fn home_with_log(n: usize) -> TestEnv {
    let env = TestEnv::new();
    let logs = env.home().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let key = SigningKey::load_or_create(&env.home().join("keys")).unwrap();
    let audit = JsonlAudit::new(logs.join("audit.jsonl"), 0, 5, Vec::new()).chained(
        key,
        "cafebabecafebabe",
        logs.join(HEAD_FILE),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        for i in 0..n {
            let r = AuditRecord::security(
                "intern",
                "t.e",
                vec![format!("n={i}")],
                AuditDecision::Allowed,
            );
            audit.record(&r).await.unwrap();
        }
    });
    env
}

fn log_path(env: &TestEnv) -> std::path::PathBuf {
    env.home().join("logs/audit.jsonl")
}

#[test]
fn an_intact_log_verifies_and_the_pubkey_is_printed() {
    let env = home_with_log(8);
    let run = env.run(&["audit", "verify"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .starts_with("ok: 10 records (seq 0–9), 1 signed checkpoints verified"),
        "{}",
        run.stdout
    );
    let json = env.run(&["audit", "verify", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["records"], 10);
    let key = env.run(&["audit", "pubkey"]);
    assert_eq!(key.code, Some(0));
    assert_eq!(key.stdout.trim().len(), 44, "{}", key.stdout);
}

#[test]
fn a_changed_record_is_named_with_exit_1() {
    let env = home_with_log(8);
    let path = log_path(&env);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("n=3", "n=7", 1)).unwrap();
    let run = env.run(&["audit", "verify"]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("audit.jsonl:6 (seq 5): hash mismatch, the record was changed"),
        "{}",
        run.stdout
    );
    let json = env.run(&["audit", "verify", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["firstBad"]["line"], 6);
    assert_eq!(v["firstBad"]["seq"], 5);
}

#[test]
fn a_log_cut_short_fails_against_the_stored_head() {
    let env = home_with_log(8);
    let path = log_path(&env);
    let text = std::fs::read_to_string(&path).unwrap();
    let kept: Vec<&str> = text.lines().take(7).collect();
    std::fs::write(&path, format!("{}\n", kept.join("\n"))).unwrap();
    let run = env.run(&["audit", "verify"]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("last seq 6, the gateway wrote up to 9"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_foreign_public_key_fails_the_checkpoint_and_a_bad_key_file_is_usage() {
    let env = home_with_log(3);
    let other = tempfile::tempdir().unwrap();
    SigningKey::load_or_create(other.path()).unwrap();
    let foreign = other.path().join("audit_ed25519.pub");
    let run = env.run(&["audit", "verify", "--pubkey", foreign.to_str().unwrap()]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("signature does not verify"),
        "{}",
        run.stdout
    );
    std::fs::write(env.dir().join("junk.pub"), "not a key").unwrap();
    let run = env.run(&["audit", "verify", "--pubkey", "junk.pub"]);
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("is not an audit public key"),
        "{}",
        run.stderr
    );
}
