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

// ---------------------------------------------------------------------------------------
// `beige audit export`

/// A home whose log the gateway's writer made, rotated over several files, with tool
/// calls of two agents, a denial, a security event and egress.
fn home_with_varied_log() -> TestEnv {
    let env = TestEnv::new();
    let logs = env.home().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let key = SigningKey::load_or_create(&env.home().join("keys")).unwrap();
    // Small files: the log rotates several times.
    let audit = JsonlAudit::new(logs.join("audit.jsonl"), 1500, 10, Vec::new()).chained(
        key,
        "cafebabecafebabe",
        logs.join(HEAD_FILE),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let records = [
        serde_json::json!({"agent": "assistant", "phase": "started", "type": "core_tool", "tool": "exec",
            "args": ["kv get plan"], "decision": "allowed", "target": "sandbox", "session": "api:assistant:default",
            "channel": "api", "exec": "x0123456789abcdef0123456789abcdef"}),
        serde_json::json!({"agent": "assistant", "phase": "finished", "type": "tool", "tool": "kv",
            "args": ["get", "plan"], "decision": "allowed", "target": "gateway", "durationMs": 1,
            "exitCode": 0, "outputBytes": 5}),
        serde_json::json!({"agent": "intern", "phase": "finished", "type": "tool", "tool": "git",
            "args": ["status"], "decision": "denied", "target": "gateway", "durationMs": 0,
            "error": "Permission denied: tool 'git' is not allowed for agent 'intern'"}),
        serde_json::json!({"agent": "intern", "phase": "finished", "type": "security",
            "tool": "security.link_reject", "args": ["pid=9"], "decision": "denied", "target": "gateway"}),
        serde_json::json!({"agent": "assistant", "phase": "finished", "type": "egress", "tool": "egress.connect",
            "args": ["api.example.test:443"], "decision": "allowed", "durationMs": 20,
            "egress": {"id": "e1", "entry": "proxy", "host": "api.example.test", "port": 443,
                       "mode": "tunnel", "policyVersion": 1, "bytesUp": 10, "bytesDown": 20}}),
        serde_json::json!({"agent": "assistant", "phase": "finished", "type": "egress", "tool": "egress.request",
            "args": ["GET gh.example.test:443/user"], "decision": "allowed", "durationMs": 3,
            "egress": {"id": "e2", "seq": 1, "method": "GET", "path": "/user", "status": 200, "ms": 3,
                       "substituted": false, "scrubbed": false, "host": "gh.example.test", "port": 443,
                       "mode": "inspect"}}),
        serde_json::json!({"agent": "assistant", "phase": "finished", "type": "core_tool", "tool": "exec",
            "args": ["kv get plan"], "decision": "allowed", "target": "sandbox", "durationMs": 30,
            "exitCode": 0, "outputBytes": 5, "exec": "x0123456789abcdef0123456789abcdef"}),
    ];
    rt.block_on(async {
        for round in 0..3 {
            for r in &records {
                let mut v = r.clone();
                v["ts"] = serde_json::json!(beige_core::audit::now_ts());
                v["args"]
                    .as_array_mut()
                    .unwrap()
                    .push(format!("round={round}").into());
                let mut record: AuditRecord = serde_json::from_value(v).unwrap();
                record.bound();
                audit.record(&record).await.unwrap();
            }
        }
    });
    env
}

/// The log's lines, oldest file first.
fn stored_lines(env: &TestEnv) -> Vec<String> {
    beige_core::audit::chain::log_files(&log_path(env))
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn lines(s: &str) -> Vec<String> {
    s.lines().map(str::to_string).collect()
}

#[test]
fn export_jsonl_gives_the_stored_lines_oldest_first_and_filters() {
    let env = home_with_varied_log();
    assert!(
        env.home().join("logs/audit.jsonl.2").exists(),
        "the log should have rotated"
    );
    let stored = stored_lines(&env);
    let run = env.run(&["audit", "export", "--format", "jsonl"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(lines(&run.stdout), stored);
    assert!(
        run.stderr.contains(&format!(
            "{} records exported, 0 lines skipped",
            stored.len()
        )),
        "{}",
        run.stderr
    );
    // The export is the chain itself: seq runs without a gap across the files.
    let seqs: Vec<u64> = stored
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());

    let run = env.run(&["audit", "export", "--format", "jsonl", "--agent", "intern"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let interns = lines(&run.stdout);
    assert_eq!(interns.len(), 6, "{}", run.stdout);
    assert!(interns.iter().all(|l| l.contains(r#""agent":"intern""#)));

    // --since: everything is recent; a time after the last record keeps nothing.
    let run = env.run(&["audit", "export", "--format", "jsonl", "--since", "1h"]);
    assert_eq!(lines(&run.stdout), stored);
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let run = env.run(&["audit", "export", "--format", "jsonl", "--since", &later]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    assert!(run.stderr.contains("0 records exported"), "{}", run.stderr);

    let run = env.run(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--since",
        "yesterday",
    ]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("--since 'yesterday' is not a time") && run.stderr.contains("24h"),
        "{}",
        run.stderr
    );
}

#[test]
fn export_skips_a_torn_line_with_a_warning_and_writes_an_output_file() {
    let env = home_with_varied_log();
    let path = log_path(&env);
    let mut text = std::fs::read_to_string(&path).unwrap();
    let count = text.lines().count();
    text.push_str("{\"ts\":\"2026-11-30T03:38:4");
    std::fs::write(&path, text).unwrap();
    let out = env.dir().join("export.jsonl");
    let run = env.run(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr.contains(&format!(
            "warning: {}:{}: not JSON",
            path.display(),
            count + 1
        )),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("1 lines skipped"), "{}", run.stderr);
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(lines(&written).len(), stored_lines(&env).len() - 1);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&out).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The log itself is never the output.
    let run = env.run(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--output",
        path.to_str().unwrap(),
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("is one of the audit log's own files"));
}

fn ocsf_schema(name: &str) -> jsonschema::Validator {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../beige-core/tests/fixtures/ocsf")
        .join(name);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::validator_for(&v).unwrap()
}

#[test]
fn export_ocsf_lines_validate_against_the_schemas() {
    let env = home_with_varied_log();
    let run = env.run(&["audit", "export", "--format", "ocsf"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let stored = stored_lines(&env);
    let events = lines(&run.stdout);
    assert_eq!(events.len(), stored.len());
    let base = ocsf_schema("base_event.json");
    let mut classes = std::collections::BTreeSet::new();
    for (line, raw) in events.iter().zip(&stored) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let record: serde_json::Value = serde_json::from_str(raw).unwrap();
        let class = v["class_uid"].as_u64().unwrap();
        let file = match class {
            0 => "base_event_class.json",
            1007 => "process_activity.json",
            2004 => "detection_finding.json",
            4001 => "network_activity.json",
            4002 => "http_activity.json",
            6002 => "application_lifecycle.json",
            6003 => "api_activity.json",
            other => panic!("unexpected class {other}: {line}"),
        };
        for schema in [&base, &ocsf_schema(file)] {
            let errors: Vec<String> = schema.iter_errors(&v).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{errors:?}\n{line}");
        }
        assert_eq!(
            v["type_uid"].as_u64().unwrap(),
            class * 100 + v["activity_id"].as_u64().unwrap()
        );
        assert_eq!(v["metadata"]["uid"], record["hash"]);
        classes.insert(class);
    }
    assert_eq!(
        classes,
        std::collections::BTreeSet::from([0, 1007, 2004, 4001, 4002, 6002, 6003])
    );
}

#[test]
fn export_otlp_prints_export_logs_service_requests() {
    let env = home_with_varied_log();
    let run = env.run(&[
        "audit",
        "export",
        "--format",
        "otlp",
        "--agent",
        "assistant",
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let batches = lines(&run.stdout);
    assert_eq!(batches.len(), 1, "{}", run.stdout);
    let v: serde_json::Value = serde_json::from_str(&batches[0]).unwrap();
    let rl = &v["resourceLogs"][0];
    assert_eq!(
        rl["resource"]["attributes"][0],
        serde_json::json!({"key": "service.name", "value": {"stringValue": "beige"}})
    );
    let records = rl["scopeLogs"][0]["logRecords"].as_array().unwrap();
    assert_eq!(records.len(), 15);
    for r in records {
        let nanos: u128 = r["timeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(nanos > 1_700_000_000_000_000_000, "{r}");
        assert!(r["severityNumber"].as_u64().is_some());
        assert!(r["body"]["stringValue"]
            .as_str()
            .unwrap()
            .starts_with("assistant/"));
        let name = r["eventName"].as_str().unwrap();
        assert!(name.starts_with("beige."), "{name}");
        assert!(r["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["key"] == "event.name" && a["value"]["stringValue"] == name));
    }
    assert!(records.iter().any(|r| r["eventName"] == "beige.egress"));
}

/// What the collector received: each POST's path, content type and body.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>;

/// A collector on loopback: records each POST's path, content type and body, and answers
/// `status`.
fn collector(rt: &tokio::runtime::Runtime, status: u16) -> (std::net::SocketAddr, Seen) {
    use axum::extract::{Request, State};
    use axum::http::StatusCode;
    let seen: Seen = Default::default();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    async fn take(State((seen, status)): State<(Seen, u16)>, req: Request) -> (StatusCode, String) {
        let path = req.uri().path().to_string();
        let ctype = req
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = axum::body::to_bytes(req.into_body(), 64 << 20)
            .await
            .unwrap();
        seen.lock()
            .unwrap()
            .push((path, ctype, String::from_utf8(body.to_vec()).unwrap()));
        let code = StatusCode::from_u16(status).unwrap();
        let text = if code.is_success() {
            "{}"
        } else {
            "collector overloaded"
        };
        (code, text.to_string())
    }
    let app = axum::Router::new()
        .fallback(take)
        .with_state((seen.clone(), status));
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

#[test]
fn export_otlp_posts_batches_to_the_endpoint() {
    let env = home_with_varied_log();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (addr, seen) = collector(&rt, 200);
    let url = format!("http://{addr}");
    let run = env.run(&["audit", "export", "--format", "otlp", "--endpoint", &url]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (path, ctype, body) = &seen[0];
    assert_eq!(path, "/v1/logs");
    assert_eq!(ctype, "application/json");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let n = v["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(n, stored_lines(&env).len());
    assert!(
        run.stderr.contains(&format!("{n} records exported"))
            && run.stderr.contains(&format!("sent to {url}/v1/logs")),
        "{}",
        run.stderr
    );
}

#[test]
fn export_otlp_fails_when_the_endpoint_answers_503() {
    let env = home_with_varied_log();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (addr, _seen) = collector(&rt, 503);
    let url = format!("http://{addr}/v1/logs");
    let run = env.run(&["audit", "export", "--format", "otlp", "--endpoint", &url]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "the OTLP endpoint {url} answered HTTP 503 Service Unavailable: collector overloaded"
        )),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("0 records exported"), "{}", run.stderr);

    let run = env.run(&["audit", "export", "--format", "jsonl", "--endpoint", &url]);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("use it with --format otlp"),
        "{}",
        run.stderr
    );
    let run = env.run(&[
        "audit",
        "export",
        "--format",
        "otlp",
        "--endpoint",
        "ftp://127.0.0.1/",
    ]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("uses ftp://"), "{}", run.stderr);
}

#[test]
fn export_without_a_log_says_so() {
    let env = TestEnv::new();
    let run = env.run(&["audit", "export", "--format", "ocsf"]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("no audit log at"), "{}", run.stderr);
}
