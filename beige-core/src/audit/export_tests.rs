#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::audit::chain::{log_files, SigningKey, HEAD_FILE};
use crate::audit::{AuditRecord, AuditSink, JsonlAudit};

const EXEC: &str = "x0123456789abcdef0123456789abcdef";
const HASH: &str = "n4bQgYhMfWWaL-qgxVrQFaO_TxsrC4Is0V1sFbDwCgg";

fn entry(v: Value) -> LogEntry {
    LogEntry::parse(Path::new("audit.jsonl"), 1, v.to_string()).unwrap()
}

fn base(kind: &str, tool: &str, phase: &str, decision: &str) -> Value {
    json!({"ts": "2026-11-30T04:38:49.598+01:00", "agent": "assistant", "phase": phase,
           "type": kind, "tool": tool, "args": [], "decision": decision, "target": "gateway",
           "seq": 7, "prev": "p", "hash": HASH})
}

fn with(mut v: Value, extra: Value) -> Value {
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn ocsf(v: Value) -> Value {
    serde_json::to_value(ocsf_event(&entry(v))).unwrap()
}

#[test]
fn each_kind_of_record_gets_its_class() {
    let cases: Vec<(Value, u64, u64)> = vec![
        (base("tool", "kv", "finished", "allowed"), 6003, 99),
        (base("core_tool", "read", "finished", "allowed"), 6003, 2),
        (base("core_tool", "write", "started", "allowed"), 6003, 3),
        (base("spawn", "spawn", "started", "allowed"), 6003, 99),
        (base("core_tool", "exec", "started", "allowed"), 1007, 1),
        (base("core_tool", "exec", "finished", "allowed"), 1007, 2),
        (base("tool", "git", "finished", "denied"), 2004, 1),
        (base("core_tool", "exec", "finished", "denied"), 2004, 1),
        (
            base("security", "security.link_reject", "finished", "denied"),
            2004,
            1,
        ),
        (
            base(
                "security",
                "security.egress_placeholder_misuse",
                "finished",
                "denied",
            ),
            2004,
            1,
        ),
        (
            with(
                base("egress", "egress.connect", "started", "allowed"),
                json!({"egress": {"host": "api.example.test", "port": 443, "mode": "tunnel"}}),
            ),
            4001,
            1,
        ),
        (
            with(
                base("egress", "egress.connect", "finished", "allowed"),
                json!({"egress": {"host": "h", "port": 80, "mode": "http", "bytesUp": 1, "bytesDown": 2}}),
            ),
            4001,
            2,
        ),
        (
            with(
                base("egress", "egress.connect", "finished", "allowed"),
                json!({"egress": {"host": "h", "port": 443, "mode": "tunnel"}, "error": "reset"}),
            ),
            4001,
            4,
        ),
        (
            with(
                base("egress", "egress.connect", "started", "allowed"),
                json!({"egress": {"host": "h", "port": 443, "mode": "inspect"}}),
            ),
            4002,
            1,
        ),
        (
            with(
                base("egress", "egress.request", "finished", "allowed"),
                json!({"egress": {"host": "h", "port": 443, "mode": "inspect", "method": "POST",
                                  "path": "/v1/x", "status": 201}}),
            ),
            4002,
            6,
        ),
        (
            with(
                base("egress", "egress.connect", "finished", "denied"),
                json!({"egress": {"host": "evil.test", "port": 443, "reason": "no_rule"}}),
            ),
            2004,
            1,
        ),
        (
            base("lifecycle", "lifecycle.genesis", "finished", "allowed"),
            6002,
            99,
        ),
        (
            base("lifecycle", "lifecycle.start", "finished", "allowed"),
            6002,
            3,
        ),
        (
            base("lifecycle", "lifecycle.stop", "finished", "allowed"),
            6002,
            4,
        ),
        (
            base("config_change", "config.reload", "finished", "allowed"),
            5019,
            1,
        ),
        (base("auth", "auth.login", "finished", "allowed"), 3002, 1),
        (base("auth", "auth.logout", "finished", "allowed"), 3002, 2),
        (base("auth", "auth.login", "finished", "denied"), 3002, 1),
        (
            base("checkpoint", "checkpoint", "finished", "allowed"),
            0,
            99,
        ),
        (base("rotate", "rotate", "finished", "allowed"), 0, 99),
        (
            base("recovery", "recovery.torn", "finished", "allowed"),
            0,
            99,
        ),
        (
            base("budget", "budget.session.tokens", "warning", "allowed"),
            0,
            99,
        ),
        (base("schedule", "nightly", "claimed", "allowed"), 0, 99),
        (base("approval", "kv", "finished", "allowed"), 0, 99),
    ];
    for (record, class, activity) in cases {
        let e = ocsf(record.clone());
        assert_eq!(e["class_uid"], class, "{record}");
        assert_eq!(e["activity_id"], activity, "{record}");
        assert_eq!(e["category_uid"], class / 1000, "{record}");
        assert_eq!(e["type_uid"], class * 100 + activity, "{record}");
        assert_eq!(e["metadata"]["uid"], HASH);
        assert_eq!(e["metadata"]["version"], "1.3.0");
        assert_eq!(e["metadata"]["product"]["name"], "beige");
        assert_eq!(e["metadata"]["product"]["vendor_name"], "beige");
        assert_eq!(e["metadata"]["sequence"], 7);
    }
}

#[test]
fn time_is_epoch_milliseconds_and_the_offset_is_kept() {
    let e = ocsf(base("tool", "kv", "finished", "allowed"));
    // 04:38:49.598 at +01:00 is 03:38:49.598 UTC.
    assert_eq!(e["time"], 1_796_009_929_598_i64);
    assert_eq!(e["timezone_offset"], 60);
    assert_eq!(
        e["metadata"]["original_time"],
        "2026-11-30T04:38:49.598+01:00"
    );
    let utc = ocsf(with(
        base("tool", "kv", "finished", "allowed"),
        json!({"ts": "2026-11-30T03:38:49.598+00:00"}),
    ));
    assert_eq!(utc["time"], e["time"]);
}

#[test]
fn a_tool_call_maps_its_fields_and_keeps_the_rest_unmapped() {
    let e = ocsf(with(
        base("tool", "kv", "finished", "allowed"),
        json!({"session": "telegram:42", "channel": "telegram", "args": ["get", "user:7"],
               "durationMs": 20, "exitCode": 3, "outputBytes": 6, "exec": EXEC,
               "attribution": "session-id", "principal": "ada", "model": "m/x"}),
    ));
    assert_eq!(e["api"]["operation"], "kv");
    assert_eq!(e["api"]["service"]["name"], "gateway");
    assert_eq!(e["src_endpoint"]["name"], "telegram");
    assert_eq!(e["actor"]["user"]["name"], "ada");
    assert_eq!(e["actor"]["app_name"], "assistant");
    assert_eq!(e["actor"]["session"]["uid"], "telegram:42");
    assert_eq!(e["duration"], 20);
    assert_eq!(e["status_code"], "3");
    assert_eq!(e["status_id"], 2, "a non-zero exit code is a failure");
    assert_eq!(e["action_id"], 1);
    assert_eq!(e["severity_id"], 2);
    let unmapped = e["unmapped"].as_object().unwrap();
    let keys: BTreeSet<&str> = unmapped.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "args",
            "attribution",
            "exec",
            "model",
            "outputBytes",
            "phase",
            "prev",
            "type"
        ])
    );
    assert_eq!(unmapped["args"], json!(["get", "user:7"]));
}

#[test]
fn exec_is_a_process_and_a_denial_a_finding() {
    let e = ocsf(with(
        base("core_tool", "exec", "started", "allowed"),
        json!({"args": ["kv set plan draft; kv get plan"], "exec": EXEC, "target": "sandbox"}),
    ));
    assert_eq!(e["process"]["cmd_line"], "kv set plan draft; kv get plan");
    assert_eq!(e["process"]["uid"], EXEC);
    assert_eq!(e["status"], "Success");
    assert!(e["unmapped"].get("args").is_none());

    let d = ocsf(with(
        base("tool", "git", "finished", "denied"),
        json!({"error": "Permission denied: tool 'git' is not allowed for agent 'assistant'",
               "args": ["status"], "argsBytes": 6, "argsSha256": "ab"}),
    ));
    assert_eq!(d["finding_info"]["uid"], HASH);
    assert_eq!(
        d["finding_info"]["title"],
        "tool call 'git' of agent 'assistant' denied"
    );
    assert_eq!(d["finding_info"]["types"], json!(["tool"]));
    assert_eq!(d["status_id"], 1, "a finding's status is New");
    assert_eq!(d["action_id"], 2);
    assert_eq!(d["action"], "Denied");
    assert_eq!(d["severity_id"], 3);
    assert_eq!(
        d["message"],
        "Permission denied: tool 'git' is not allowed for agent 'assistant'"
    );
    assert_eq!(d["unmapped"]["argsSha256"], "ab");

    let s = ocsf(base(
        "security",
        "security.link_reject",
        "finished",
        "denied",
    ));
    assert_eq!(s["severity_id"], 4);
    assert_eq!(s["finding_info"]["title"], "security.link_reject");
    // Without a hash (an unchained log) the finding's uid is the line's SHA-256.
    let mut unchained = base("security", "security.link_reject", "finished", "denied");
    unchained.as_object_mut().unwrap().remove("hash");
    let raw = unchained.to_string();
    let u = ocsf(unchained);
    assert!(u["metadata"].get("uid").is_none());
    assert_eq!(
        u["finding_info"]["uid"],
        hex::encode(sha2::Sha256::digest(raw.as_bytes()))
    );
}

#[test]
fn egress_maps_endpoints_traffic_and_http() {
    let n = ocsf(with(
        base("egress", "egress.connect", "finished", "allowed"),
        json!({"egress": {"id": "c1", "entry": "proxy", "host": "api.example.test", "port": 443,
                          "ip": "192.0.2.7", "mode": "tunnel", "rule": "r1", "policyVersion": 3,
                          "bytesUp": 10, "bytesDown": 20}, "durationMs": 5}),
    ));
    assert_eq!(
        n["dst_endpoint"],
        json!({"hostname": "api.example.test", "ip": "192.0.2.7", "port": 443})
    );
    assert_eq!(n["src_endpoint"], json!({"name": "assistant"}));
    assert_eq!(n["traffic"], json!({"bytes_out": 10, "bytes_in": 20}));
    assert_eq!(n["connection_info"]["uid"], "c1");
    assert_eq!(n["connection_info"]["direction_id"], 2);
    assert_eq!(
        n["unmapped"]["egress"],
        json!({"entry": "proxy", "mode": "tunnel", "rule": "r1", "policyVersion": 3})
    );
    let h = ocsf(with(
        base("egress", "egress.request", "finished", "allowed"),
        json!({"egress": {"id": "c2", "seq": 1, "host": "api.example.test", "port": 443,
                          "mode": "inspect", "method": "GET", "path": "/repos?x=1", "status": 200,
                          "ms": 4, "substituted": true, "scrubbed": false}}),
    ));
    assert_eq!(h["http_request"]["http_method"], "GET");
    assert_eq!(
        h["http_request"]["url"],
        json!({"scheme": "https", "hostname": "api.example.test", "port": 443, "path": "/repos?x=1"})
    );
    assert_eq!(h["http_response"]["code"], 200);
    assert_eq!(h["type_uid"], 400_203);
    assert_eq!(h["unmapped"]["egress"]["substituted"], true);
}

#[test]
fn chain_records_keep_their_fields_and_lifecycle_names_the_app() {
    let c = ocsf(with(
        base("checkpoint", "checkpoint", "finished", "allowed"),
        json!({"agent": "", "note": "beige.audit/x\n9\nh\n"}),
    ));
    assert_eq!(c["class_uid"], 0);
    assert_eq!(c["activity_name"], "checkpoint");
    assert_eq!(c["unmapped"]["note"], "beige.audit/x\n9\nh\n");
    assert!(c.get("actor").is_none());
    let l = ocsf(with(
        base("lifecycle", "lifecycle.genesis", "finished", "allowed"),
        json!({"agent": "", "args": ["installation=cafe"]}),
    ));
    assert_eq!(l["app"], json!({"name": "beige", "vendor_name": "beige"}));
    assert_eq!(l["activity_name"], "Genesis");
    assert_eq!(l["unmapped"]["args"], json!(["installation=cafe"]));
    let a = ocsf(with(
        base("auth", "auth.login", "finished", "denied"),
        json!({"agent": "", "principal": "ada", "via": "token:t1"}),
    ));
    assert_eq!(a["user"]["name"], "ada");
    assert_eq!(a["status_id"], 2);
    assert_eq!(a["unmapped"]["via"], "token:t1");
}

/// Every string an event carries comes from the record, except fixed labels.
#[test]
fn no_value_is_added_that_the_record_did_not_have() {
    fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            Value::Array(a) => a.iter().for_each(|x| leaves(prefix, x, out)),
            Value::Object(o) => o
                .iter()
                .for_each(|(k, x)| leaves(&format!("{prefix}.{k}"), x, out)),
            _ => {}
        }
    }
    let labels = [
        ".class_name",
        ".category_name",
        ".activity_name",
        ".type_name",
        ".severity",
        ".status",
        ".action",
        ".status_code",
        ".metadata.version",
        ".metadata.product.name",
        ".metadata.product.vendor_name",
        ".app.name",
        ".app.vendor_name",
        ".device.name",
        ".connection_info.direction",
        ".http_request.url.scheme",
        ".http_request.http_method",
        ".finding_info.title",
        ".api.service.name",
        ".src_endpoint.name",
    ];
    let record = with(
        base("tool", "kv", "finished", "denied"),
        json!({"args": ["set", "token", "***"], "error": "nope", "session": "s:1",
               "channel": "api", "principal": "ada"}),
    );
    let mut record_strings = Vec::new();
    leaves("", &record, &mut record_strings);
    for v in [
        record.clone(),
        with(record.clone(), json!({"decision": "allowed"})),
    ] {
        let mut out = Vec::new();
        leaves("", &ocsf(v), &mut out);
        for (path, s) in out {
            if labels.contains(&path.as_str()) {
                continue;
            }
            assert!(
                record_strings.iter().any(|(_, r)| r == &s),
                "{path} = {s:?} is not in the record"
            );
        }
    }
}

#[test]
fn otlp_records_carry_time_severity_event_name_attributes_and_trace_ids() {
    let r = otlp_log_record(&entry(with(
        base("tool", "kv", "finished", "denied"),
        json!({"traceId": "4BF92F3577B34DA6A3CE929D0E0E4736", "spanId": "00f067aa0ba902b7",
               "args": ["get", "x"], "durationMs": 0, "error": "no"}),
    )));
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["timeUnixNano"], "1796009929598000000");
    assert_eq!(v["severityNumber"], 13);
    assert_eq!(v["severityText"], "WARN");
    assert_eq!(v["eventName"], "beige.tool");
    assert_eq!(v["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(v["spanId"], "00f067aa0ba902b7");
    assert_eq!(v["body"]["stringValue"], "assistant/kv finished denied: no");
    let attrs = v["attributes"].as_array().unwrap();
    let attr = |k: &str| {
        attrs
            .iter()
            .find(|a| a["key"] == k)
            .map(|a| a["value"].clone())
    };
    assert_eq!(
        attr("event.name").unwrap(),
        json!({"stringValue": "beige.tool"})
    );
    assert_eq!(
        attr("beige.agent").unwrap(),
        json!({"stringValue": "assistant"})
    );
    assert_eq!(attr("beige.seq").unwrap(), json!({"intValue": "7"}));
    assert_eq!(attr("beige.hash").unwrap(), json!({"stringValue": HASH}));
    assert_eq!(
        attr("beige.args").unwrap(),
        json!({"arrayValue": {"values": [{"stringValue": "get"}, {"stringValue": "x"}]}})
    );
    assert!(attr("beige.ts").is_none());
    assert!(attr("beige.traceId").is_none());
    // A malformed trace id stays an attribute.
    let bad = otlp_log_record(&entry(with(
        base("tool", "kv", "finished", "allowed"),
        json!({"traceId": "nothex"}),
    )));
    assert!(bad.trace_id.is_none());
    assert!(bad.attributes.iter().any(|a| a.key == "beige.traceId"));
}

#[test]
fn otlp_batches_have_the_request_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let lines: Vec<String> = (0..5)
        .map(|i| with(base("tool", "kv", "finished", "allowed"), json!({"seq": i})).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let mut ex = Exporter::new(vec![path], Format::Otlp, Filter::default()).batch_size(2);
    let chunks: Vec<Chunk> = ex
        .by_ref()
        .map(|p| match p.unwrap() {
            Piece::Chunk(c) => c,
            Piece::Skipped(s) => panic!("{s}"),
        })
        .collect();
    assert_eq!(
        chunks.iter().map(|c| c.records).collect::<Vec<_>>(),
        [2, 2, 1]
    );
    let v: Value = serde_json::from_str(&chunks[0].text).unwrap();
    let rl = &v["resourceLogs"][0];
    assert_eq!(
        rl["resource"]["attributes"][0],
        json!({"key": "service.name", "value": {"stringValue": "beige"}})
    );
    assert_eq!(rl["scopeLogs"][0]["scope"]["name"], "beige.audit");
    assert_eq!(
        rl["scopeLogs"][0]["logRecords"].as_array().unwrap().len(),
        2
    );
    assert_eq!(ex.summary().exported, 5);
}

#[test]
fn torn_lines_are_skipped_and_named_and_the_filter_applies() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("audit.jsonl.1");
    let cur = dir.path().join("audit.jsonl");
    let rec = |agent: &str, ts: &str| {
        with(
            base("tool", "kv", "finished", "allowed"),
            json!({"agent": agent, "ts": ts}),
        )
        .to_string()
    };
    std::fs::write(
        &old,
        format!(
            "{}\n{}\n\n",
            rec("a", "2026-01-01T00:00:00.000+00:00"),
            rec("b", "2026-01-02T00:00:00.000+00:00")
        ),
    )
    .unwrap();
    let mut bytes = format!(
        "{}\nnot json\n{}\n",
        rec("a", "2026-01-03T00:00:00.000+00:00"),
        with(
            base("tool", "kv", "finished", "allowed"),
            json!({"ts": "yesterday"})
        )
    )
    .into_bytes();
    bytes.extend_from_slice(b"\xff\xfe\n");
    bytes.extend_from_slice(rec("a", "2026-01-04T00:00:00.000+00:00").as_bytes());
    bytes.truncate(bytes.len() - 10); // a torn last line
    std::fs::write(&cur, bytes).unwrap();

    let files = vec![old.clone(), cur.clone()];
    let mut ex = Exporter::new(files.clone(), Format::Jsonl, Filter::default());
    let pieces: Vec<Piece> = ex.by_ref().map(Result::unwrap).collect();
    let skipped: Vec<String> = pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Skipped(s) => Some(s.to_string()),
            Piece::Chunk(_) => None,
        })
        .collect();
    assert_eq!(skipped.len(), 4, "{skipped:?}");
    assert!(
        skipped[0].starts_with(&format!("{}:2: not JSON", cur.display())),
        "{skipped:?}"
    );
    assert!(skipped[1].contains(":3: its ts 'yesterday' is not an RFC 3339 time"));
    assert!(skipped[2].contains(":4: not UTF-8"));
    assert!(skipped[3].contains(":5: not JSON"));
    assert_eq!(
        ex.summary(),
        Summary {
            exported: 3,
            skipped: 4,
            filtered: 0
        }
    );
    let lines: Vec<String> = pieces
        .into_iter()
        .filter_map(|p| match p {
            Piece::Chunk(c) => Some(c.text),
            Piece::Skipped(_) => None,
        })
        .collect();
    assert_eq!(
        lines[0],
        rec("a", "2026-01-01T00:00:00.000+00:00"),
        "oldest first, as stored"
    );

    let filter = Filter {
        since: Some(DateTime::parse_from_rfc3339("2026-01-02T00:00:00Z").unwrap()),
        agent: Some("a".into()),
    };
    let mut ex = Exporter::new(files, Format::Jsonl, filter);
    let kept: Vec<Piece> = ex
        .by_ref()
        .map(Result::unwrap)
        .filter(|p| matches!(p, Piece::Chunk(_)))
        .collect();
    assert_eq!(
        kept,
        [Piece::Chunk(Chunk {
            text: rec("a", "2026-01-03T00:00:00.000+00:00"),
            records: 1
        })]
    );
    assert_eq!(ex.summary().filtered, 2);

    let mut missing = Exporter::new(
        vec![dir.path().join("nope")],
        Format::Jsonl,
        Filter::default(),
    );
    let err = missing.next().unwrap().unwrap_err().to_string();
    assert!(
        err.contains("cannot read the audit log file") && err.contains("nope"),
        "{err}"
    );
}

#[test]
fn since_takes_a_time_or_a_duration() {
    let now = DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let at = |s: &str| parse_since(s, now).unwrap().to_rfc3339();
    assert_eq!(at("2026-11-30T09:00:00+01:00"), "2026-11-30T09:00:00+01:00");
    assert_eq!(at("24h"), "2026-11-29T12:00:00+00:00");
    assert_eq!(at("7d"), "2026-11-23T12:00:00+00:00");
    assert_eq!(at("30m"), "2026-11-30T11:30:00+00:00");
    for bad in ["yesterday", "7w", "2026-11-30", ""] {
        let e = parse_since(bad, now).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("--since '{bad}' is not a time")),
            "{e}"
        );
        assert!(e.contains("24h"), "{e}");
    }
}

#[test]
fn the_endpoint_gets_v1_logs_when_it_has_no_path() {
    let url = |s: &str| otlp_logs_url(s).map(|u| u.to_string());
    assert_eq!(
        url("http://127.0.0.1:4318").unwrap(),
        "http://127.0.0.1:4318/v1/logs"
    );
    assert_eq!(
        url("https://otel.example.test/").unwrap(),
        "https://otel.example.test/v1/logs"
    );
    assert_eq!(
        url("http://127.0.0.1:4318/custom/logs").unwrap(),
        "http://127.0.0.1:4318/custom/logs"
    );
    let e = url("ftp://127.0.0.1/").unwrap_err().to_string();
    assert!(e.contains("'ftp://127.0.0.1/' uses ftp://"), "{e}");
    let e = url("127.0.0.1:4318").unwrap_err().to_string();
    assert!(e.contains("http:// or https://"), "{e}");
}

// -------------------------------------------------------------------------------------
// OCSF validation against the vendored (hand-written) schemas

fn schema(name: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ocsf")
        .join(name);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    jsonschema::validator_for(&v).unwrap()
}

fn class_schema(class: u64) -> &'static str {
    match class {
        0 => "base_event_class.json",
        1007 => "process_activity.json",
        2004 => "detection_finding.json",
        3002 => "authentication.json",
        4001 => "network_activity.json",
        4002 => "http_activity.json",
        5019 => "device_config_state_change.json",
        6002 => "application_lifecycle.json",
        6003 => "api_activity.json",
        other => panic!("no schema for class {other}"),
    }
}

/// A log written by the gateway's own writer (chained: genesis, checkpoint, hashes), with
/// every kind of record it writes, plus lines of types later versions add.
async fn realistic_log(dir: &Path) -> Vec<PathBuf> {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let key = SigningKey::load_or_create(&dir.join("keys")).unwrap();
    let audit = JsonlAudit::new(
        logs.join("audit.jsonl"),
        0,
        5,
        vec!["supersecret-token".into()],
    )
    .chained(key, "cafebabecafebabe", logs.join(HEAD_FILE));
    let s = "api:assistant:default";
    let records = [
        json!({"phase": "started", "type": "core_tool", "tool": "exec", "args": ["kv get plan"],
               "decision": "allowed", "target": "sandbox", "session": s, "channel": "api",
               "model": "anthropic/claude", "exec": EXEC}),
        json!({"phase": "started", "type": "tool", "tool": "kv", "args": ["get", "plan"],
               "decision": "allowed", "target": "gateway", "session": s, "channel": "api",
               "exec": EXEC, "attribution": "session-id"}),
        json!({"phase": "finished", "type": "tool", "tool": "kv", "args": ["set", "k", "supersecret-token"],
               "decision": "allowed", "target": "gateway", "durationMs": 2, "exitCode": 0,
               "outputBytes": 6}),
        json!({"phase": "finished", "type": "core_tool", "tool": "exec", "args": ["kv get plan"],
               "decision": "allowed", "target": "sandbox", "session": s, "channel": "api",
               "durationMs": 108, "exitCode": 0, "outputBytes": 18, "exec": EXEC}),
        json!({"phase": "finished", "type": "core_tool", "tool": "read", "args": ["/workspace/a"],
               "decision": "allowed", "target": "sandbox", "durationMs": 1, "exitCode": 1,
               "error": "no such file"}),
        json!({"phase": "finished", "type": "tool", "tool": "git", "args": ["status"],
               "decision": "denied", "target": "gateway", "durationMs": 0,
               "error": "Permission denied: tool 'git' is not allowed for agent 'assistant'"}),
        json!({"phase": "finished", "type": "security", "tool": "security.link_reject",
               "args": ["pid=42"], "decision": "denied", "target": "gateway"}),
        json!({"phase": "finished", "type": "security", "tool": "security.audit_throttle_lifted",
               "args": ["refused=3"], "decision": "allowed", "target": "gateway",
               "error": "agent 'assistant' is within its audit budget again"}),
        json!({"phase": "started", "type": "egress", "tool": "egress.connect",
               "args": ["api.example.test:443"], "decision": "allowed",
               "egress": {"id": "e1", "entry": "proxy", "host": "api.example.test", "port": 443,
                          "ip": "192.0.2.7", "mode": "tunnel", "rule": "0", "policyVersion": 1}}),
        json!({"phase": "finished", "type": "egress", "tool": "egress.connect",
               "args": ["api.example.test:443"], "decision": "allowed", "durationMs": 30,
               "egress": {"id": "e1", "entry": "proxy", "host": "api.example.test", "port": 443,
                          "ip": "192.0.2.7", "mode": "tunnel", "rule": "0", "policyVersion": 1,
                          "bytesUp": 100, "bytesDown": 2000}}),
        json!({"phase": "started", "type": "egress", "tool": "egress.connect",
               "args": ["gh.example.test:443"], "decision": "allowed",
               "egress": {"id": "e2", "entry": "proxy", "host": "gh.example.test", "port": 443,
                          "mode": "inspect", "policyVersion": 1}}),
        json!({"phase": "finished", "type": "egress", "tool": "egress.request",
               "args": ["GET gh.example.test:443/user"], "decision": "allowed", "durationMs": 12,
               "egress": {"id": "e2", "seq": 1, "method": "GET", "path": "/user", "status": 200,
                          "ms": 12, "substituted": true, "scrubbed": false,
                          "host": "gh.example.test", "port": 443, "mode": "inspect"}}),
        json!({"phase": "finished", "type": "egress", "tool": "egress.connect",
               "args": ["evil.test:443"], "decision": "denied", "durationMs": 0,
               "error": "no rule allows this host",
               "egress": {"id": "e3", "entry": "proxy", "host": "evil.test", "port": 443,
                          "policyVersion": 1, "reason": "no_rule"}}),
        json!({"phase": "started", "type": "spawn", "tool": "spawn", "args": [],
               "decision": "allowed", "session": s,
               "spawn": {"child": {"agent": "r", "session": "spawn:x"}, "depth": 1}}),
        json!({"phase": "warning", "type": "budget", "tool": "budget.session.tokens",
               "args": ["scope=session"], "decision": "allowed"}),
        json!({"phase": "claimed", "type": "schedule", "tool": "nightly", "args": ["run=1"],
               "decision": "allowed"}),
    ];
    for r in records {
        let mut v = with(
            r,
            json!({"ts": crate::audit::now_ts(), "agent": "assistant"}),
        );
        if v.get("target").is_none() {
            v["target"] = json!("gateway");
        }
        let mut record: AuditRecord = serde_json::from_value(v).unwrap();
        record.bound();
        audit.record(&record).await.unwrap();
    }
    // Types later versions write, appended as lines.
    let extra = [
        json!({"ts": "2026-11-30T04:00:00.000+00:00", "agent": "", "phase": "finished",
               "type": "lifecycle", "tool": "lifecycle.start", "args": [], "decision": "allowed"}),
        json!({"ts": "2026-11-30T04:00:01.000+00:00", "agent": "", "phase": "finished",
               "type": "auth", "tool": "auth.login", "args": [], "decision": "denied",
               "principal": "ada", "via": "token:t1", "error": "bad token"}),
        json!({"ts": "2026-11-30T04:00:02.000+00:00", "agent": "", "phase": "finished",
               "type": "config_change", "tool": "config.reload", "args": ["digest=ab"],
               "decision": "allowed", "principal": "owner"}),
        json!({"ts": "2026-11-30T04:00:03.000+00:00", "agent": "assistant", "phase": "finished",
               "type": "auth", "tool": "auth.token_change", "args": [], "decision": "allowed"}),
    ];
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(logs.join("audit.jsonl"))
        .unwrap();
    for e in extra {
        use std::io::Write as _;
        writeln!(f, "{e}").unwrap();
    }
    log_files(&logs.join("audit.jsonl"))
}

#[tokio::test]
async fn every_event_of_a_realistic_log_validates_against_the_ocsf_subsets() {
    let dir = tempfile::tempdir().unwrap();
    let files = realistic_log(dir.path()).await;
    let base_schema = schema("base_event.json");
    let mut classes = BTreeSet::new();
    let mut n = 0;
    for piece in Exporter::new(files, Format::Ocsf, Filter::default()) {
        let Piece::Chunk(c) = piece.unwrap() else {
            panic!("a line was skipped")
        };
        assert!(!c.text.contains("supersecret-token"), "{}", c.text);
        let v: Value = serde_json::from_str(&c.text).unwrap();
        let class = v["class_uid"].as_u64().unwrap();
        let activity = v["activity_id"].as_u64().unwrap();
        assert_eq!(
            v["type_uid"].as_u64().unwrap(),
            class * 100 + activity,
            "{v}"
        );
        for validator in [&base_schema, &schema(class_schema(class))] {
            let errors: Vec<String> = validator
                .iter_errors(&v)
                .map(|e| format!("{} at {}", e, e.instance_path()))
                .collect();
            assert!(errors.is_empty(), "{errors:?}\n{v:#}");
        }
        classes.insert(class);
        n += 1;
    }
    assert_eq!(
        classes,
        BTreeSet::from([0, 1007, 2004, 3002, 4001, 4002, 5019, 6002, 6003])
    );
    // genesis + checkpoint + 16 records + 4 appended.
    assert_eq!(n, 22);
}

#[test]
fn a_schema_catches_a_missing_required_object() {
    let mut v = ocsf(base("tool", "kv", "finished", "allowed"));
    assert!(schema("api_activity.json").is_valid(&v));
    v.as_object_mut().unwrap().remove("api");
    assert!(!schema("api_activity.json").is_valid(&v));
    let mut v = ocsf(base("tool", "kv", "finished", "allowed"));
    v["metadata"]["version"] = json!("1.0.0");
    assert!(!schema("base_event.json").is_valid(&v));
}
