//! The built-in `schedule` tool (platform.md §1.4): an agent makes schedules for itself
//! only, within the limits of `pluginConfigs.schedule`, and sees and changes its own
//! schedules only, whatever it writes into the request.
//!
//! The gateway runs whole, with the SQLite store and a `MemorySandbox` (no sandbox
//! behaviour matters here: the tool's calls take the socket's guarded path,
//! `LocalGateway::handle_tool_request`, and nothing fires — every cron is days away).

use std::sync::Arc;

use beige_core::api::Admin as _;
use beige_core::store::SqliteStore;
use beige_core::testing::MemorySandbox;
use beige_core::{BeigeHome, GatewayBuilder, LocalGateway};
use beige_protocol::socket::{ToolRequest, ToolResponse};
use serde_json::json;

struct Fixture {
    _dir: tempfile::TempDir,
    gw: LocalGateway,
}

async fn fixture(schedule_config: serde_json::Value) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let agent = json!({
        "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
        "tools": ["schedule"],
        "pluginConfigs": {"schedule": schedule_config},
    });
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789"}}},
        "plugins": {"schedule": {}},
        "agents": {"a": agent, "b": agent},
    }))
    .unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("beige.db")).unwrap());
    let gw = GatewayBuilder::new(config, BeigeHome::new(dir.path().join("home")))
        .sandbox(Arc::new(MemorySandbox::new()))
        .store(store)
        .build()
        .await
        .unwrap();
    Fixture { _dir: dir, gw }
}

async fn call(gw: &LocalGateway, agent: &str, args: &[&str]) -> (i64, String) {
    let r: ToolResponse = gw
        .handle_tool_request(
            agent,
            ToolRequest::new("schedule", args.iter().map(|s| s.to_string()).collect()),
        )
        .await;
    let v = serde_json::to_value(&r).unwrap();
    (
        v["exitCode"].as_i64().unwrap(),
        v["output"].as_str().unwrap_or_default().to_string(),
    )
}

/// The id in `SCHEDULE sch_… created: …`.
fn created_id(out: &str) -> String {
    let rest = out
        .strip_prefix("SCHEDULE ")
        .unwrap_or_else(|| panic!("{out}"));
    rest.split_whitespace().next().unwrap().to_string()
}

/// `schedule_tool_limits`: the 21st schedule, a `* * * * *` cron and a schedule for
/// another agent are refused, each naming its limit; a refused call stores nothing.
#[tokio::test]
async fn schedule_tool_limits() {
    let f = fixture(json!({})).await;
    let (code, out) = call(
        &f.gw,
        "a",
        &[
            "add",
            "--cron",
            "0 8 * * 1-5",
            "--tz",
            "Europe/Berlin",
            "--prompt",
            "Summarise yesterday.",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("created: cron \"0 8 * * 1-5\" Europe/Berlin, next ")
            && out.contains("prompts a (new session)")
            && out.contains("reports failures to the agent's owner"),
        "{out}"
    );
    let first = created_id(&out);
    assert!(first.starts_with("sch_"), "{first}");
    for i in 1..20 {
        let (code, out) = call(
            &f.gw,
            "a",
            &["add", "--cron", &format!("{i} 3 * * *"), "--exec", "true"],
        )
        .await;
        assert_eq!(code, 0, "schedule {i}: {out}");
    }
    let (code, out) = call(
        &f.gw,
        "a",
        &["add", "--cron", "30 4 * * *", "--exec", "true"],
    )
    .await;
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("20 schedules") && out.contains("maxSchedulesPerAgent 20"),
        "{out}"
    );
    // Cancelling one makes room again.
    let (code, out) = call(&f.gw, "a", &["cancel", &first]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = call(
        &f.gw,
        "a",
        &["add", "--cron", "30 4 * * *", "--exec", "true"],
    )
    .await;
    assert_eq!(code, 0, "{out}");

    // Tighter than minIntervalSeconds, and more fires a day than maxRunsPerDay.
    let g = fixture(json!({"minIntervalSeconds": 60, "maxRunsPerDay": 100})).await;
    let (code, out) = call(
        &f.gw,
        "b",
        &["add", "--cron", "* * * * *", "--exec", "true"],
    )
    .await;
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("'* * * * *'") && out.contains("minIntervalSeconds"),
        "{out}"
    );
    let (code, out) = call(
        &g.gw,
        "b",
        &["add", "--cron", "*/5 * * * *", "--exec", "true"],
    )
    .await;
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("288 times a day") && out.contains("maxRunsPerDay"),
        "{out}"
    );

    // Another agent: there is no way to name one.
    let (code, out) = call(
        &f.gw,
        "b",
        &[
            "add",
            "--agent",
            "a",
            "--cron",
            "0 9 * * *",
            "--exec",
            "true",
        ],
    )
    .await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("this agent only"), "{out}");
    let b_list = f.gw.schedules(Some("b")).await.unwrap();
    assert!(b_list.is_empty(), "{b_list:#?}");
    assert!(
        f.gw.schedules(Some("a"))
            .await
            .unwrap()
            .iter()
            .all(|v| v.owner == "agent:a" && v.created_by.contains("session:socket:a")),
        "every schedule is a's own, made from its call"
    );

    // allowExec: false refuses commands; a cron that does not parse names itself.
    let h = fixture(json!({"allowExec": false})).await;
    let (code, out) = call(
        &h.gw,
        "a",
        &["add", "--cron", "0 8 * * *", "--exec", "rm -rf /"],
    )
    .await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("allowExec"), "{out}");
    let (code, out) = call(
        &h.gw,
        "a",
        &["add", "--cron", "61 8 * * *", "--prompt", "x"],
    )
    .await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("61 8 * * *"), "{out}");
    // --deliver here needs a chat the call's session has; this one has none.
    let (code, out) = call(
        &h.gw,
        "a",
        &[
            "add",
            "--cron",
            "0 8 * * *",
            "--prompt",
            "x",
            "--deliver",
            "here",
        ],
    )
    .await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("--deliver here needs a chat"), "{out}");
    assert!(h.gw.schedules(None).await.unwrap().is_empty());
}

/// An agent sees and changes its own schedules only: another agent's id answers byte
/// for byte what a missing one answers, for every command.
#[tokio::test]
async fn schedule_tool_sees_own_schedules_only() {
    let f = fixture(json!({})).await;
    let (code, out) = call(
        &f.gw,
        "a",
        &[
            "add",
            "--at",
            "2031-01-01T08:00:00+01:00",
            "--prompt",
            "happy new year",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let id = created_id(&out);
    assert!(out.contains("once at 2031-01-01T08:00:00+01:00"), "{out}");

    let (code, list_a) = call(&f.gw, "a", &["list"]).await;
    assert_eq!(code, 0);
    assert!(
        list_a.contains(&id) && list_a.contains("active"),
        "{list_a}"
    );
    let (_, list_b) = call(&f.gw, "b", &["list"]).await;
    assert!(!list_b.contains(&id), "{list_b}");
    let (_, json_b) = call(&f.gw, "b", &["list", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&json_b).unwrap(),
        json!([])
    );

    for cmd in ["get", "history", "pause", "resume", "cancel", "test"] {
        let (code_b, theirs) = call(&f.gw, "b", &[cmd, &id]).await;
        let (code_m, missing) = call(&f.gw, "b", &[cmd, "sch_aaaaaaaaaa"]).await;
        assert_eq!((code_b, &theirs), (code_m, &missing), "{cmd}");
        assert_eq!(code_b, 1, "{cmd}: {theirs}");
        assert!(
            theirs.contains("no such schedule of this agent"),
            "{cmd}: {theirs}"
        );
    }
    // Still active: b's pause and cancel did nothing.
    assert_eq!(f.gw.schedule(&id).await.unwrap().state.as_str(), "active");

    let (code, out) = call(&f.gw, "a", &["pause", &id]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("now paused"), "{out}");
    let (code, out) = call(&f.gw, "a", &["get", &id, "--json"]).await;
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "paused");
    assert_eq!(v["owner"], "agent:a");
    let (code, out) = call(&f.gw, "a", &["history", &id]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("has not run yet"), "{out}");
}
