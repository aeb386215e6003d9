//! Attack 8 of issue 13: a sandbox fills the disks the gateway depends on. From inside a
//! real sandbox, a script floods `kv` (the store must refuse beyond the agent's limit and
//! keep what was there) and fills its workspace (the gateway must pause the agent with a
//! clear error, tell the owner, and resume by itself once space returns). A last test
//! injects low free space through the probe seam, for machines that cannot mount a
//! tmpfs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use beige_core::api::tools::ToolOutput;
use beige_core::channel::http::{router, ApiState};
use beige_core::disk::{FsSpace, Probe};
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::LlmProvider;
use beige_core::store::{KvUsage, PluginData, SqliteStore};
use beige_core::Admin as _;
use beige_core::{BeigeHome, Gateway, GatewayBuilder, GatewayError, LocalGateway, PromptRequest};
use beige_protocol::socket::ToolRequest;
use serde_json::json;
use tower::ServiceExt;

use super::sandbox_docker::exec;
use super::support::TestHome;
use crate::docker_or_skip;
use beige_core::testing::MemorySandbox;

const TOKEN: &str = "disk-test-token-0123456789";

fn audit(home: &BeigeHome) -> Vec<serde_json::Value> {
    std::fs::read_to_string(home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| !beige_core::audit::chain::is_chain_record(v))
        .collect()
}

#[tokio::test]
async fn a_script_flooding_kv_is_refused_beyond_the_agents_limit_and_earlier_data_survives() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let mut config = t.config(
        &env,
        &[
            ("hostile", json!({"tools": ["kv"]})),
            ("neighbour", json!({"tools": ["kv"]})),
        ],
    );
    // 128 KiB per agent, keys and values counted.
    config.plugins =
        serde_json::from_value(json!({"kv": {"config": {"maxBytes": "128k"}}})).unwrap();
    let gw = t.gateway(&env, config).await;

    // Earlier data, then four parallel writers that set 4 KB values until refused.
    let script = r#"
        kv set keep precious || exit 9
        v=$(printf '%4000s' | tr ' ' x)
        for w in 1 2 3 4; do
          ( i=0; while kv set "w$w-$i" "$v" 2>/tmp/err$w; do i=$((i+1)); done
            echo "writer $w stored $i"; cat /tmp/err$w ) &
        done
        wait
        echo "keep=$(kv get keep)"
        kv set one-more "$v"; echo "rc=$?"
    "#;
    let out = exec(&gw, "hostile", script).await;
    let text = out.joined_text();
    assert!(!out.is_error, "{text}");
    assert_eq!(text.matches("writer ").count(), 4, "{text}");
    assert!(
        text.contains("kv: agent 'hostile' uses ")
            && text.contains("of 128.0 KiB (keys and values)")
            && text
                .contains("nothing was stored — delete keys or raise plugins.kv.config.maxBytes"),
        "{text}"
    );
    assert!(text.contains("keep=precious"), "{text}");
    assert!(text.contains("rc=1"), "{text}");
    let stored: u64 = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("writer ")?
                .split_whitespace()
                .nth(2)?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(
        (28..=32).contains(&stored),
        "{stored} values of 4 KB stored:\n{text}"
    );

    // Another agent has its own allowance.
    let out = exec(
        &gw,
        "neighbour",
        "kv set mine \"$(printf '%4000s' | tr ' ' y)\" && kv list",
    )
    .await;
    assert_eq!(out.joined_text(), "Exit code: 0\nmine");
    // Every refusal went through the guarded path and was audited.
    let records = audit(&t.home);
    let refused = records
        .iter()
        .filter(|r| r["tool"] == "kv" && r["phase"] == "finished" && r["exitCode"] == 1)
        .count();
    assert!(refused >= 5, "{refused} refused kv calls audited");
    gw.shutdown().await.unwrap();

    // The store never went over the limit, whatever the concurrency.
    let store = SqliteStore::open(t.home.db_path()).unwrap();
    let KvUsage { entries, bytes } = store.kv_usage("kv", Some("hostile")).await.unwrap();
    assert!(bytes <= 128 * 1024, "{bytes} bytes in {entries} entries");
    assert_eq!(entries, stored + 1);
    assert_eq!(
        store
            .kv_get("kv", "hostile", "keep")
            .await
            .unwrap()
            .as_deref(),
        Some("precious")
    );
}

/// A tmpfs of `size` mounted at a new folder, unmounted on drop; `None` (after saying
/// why) when this process may not mount.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(parent: &Path, size: &str) -> Option<Self> {
        let path = parent.join("small-disk");
        std::fs::create_dir_all(&path).unwrap();
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=1777"),
                "tmpfs",
            ])
            .arg(&path)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self { path }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .output();
    }
}

/// Run `command` in `agent`'s sandbox until `done` says yes (at most 15 s).
async fn exec_until(
    gw: &LocalGateway,
    agent: &str,
    command: &str,
    done: impl Fn(&ToolOutput) -> bool,
) -> ToolOutput {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = exec(gw, agent, command).await;
        if done(&out) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "no change after 15 s: {}",
            out.joined_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_sandbox_filling_its_workspace_pauses_the_agent_and_work_resumes_when_space_returns() {
    let env = docker_or_skip!();
    let outer = tempfile::tempdir().unwrap();
    let Some(disk) = Tmpfs::mount(outer.path(), "8m") else {
        return;
    };
    let t = TestHome::new();
    let mut config = serde_json::to_value(t.config(
        &env,
        &[
            (
                "filler",
                json!({"tools": ["kv"], "workspaceDir": disk.path}),
            ),
            ("bystander", json!({"tools": ["kv"]})),
        ],
    ))
    .unwrap();
    config["plugins"] = json!({"kv": {}});
    config["gateway"] = json!({"minFreeSpace": "4m"});
    let model = ScriptedProvider::new("anthropic").then_text("back to work");
    let docker = t.docker().await;
    let gw = GatewayBuilder::new(serde_json::from_value(config).unwrap(), t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker))
        .provider(Arc::new(model) as Arc<dyn LlmProvider>)
        .build()
        .await
        .unwrap();
    assert!(!gw.disk_status().await.unwrap().unwrap().low);

    // The agent fills its workspace: 5 of 8 MiB, leaving less than the 4 MiB kept free.
    let out = exec(
        &gw,
        "filler",
        "dd if=/dev/zero of=/workspace/big bs=1M count=5 2>&1; echo done",
    )
    .await;
    assert!(out.joined_text().contains("done"), "{}", out.joined_text());

    // Its next calls are refused with a message that says what, where and what to do.
    let refused = exec_until(&gw, "filler", "echo hi", |o| o.is_error).await;
    let text = refused.joined_text();
    let mount = disk.path.display().to_string();
    for part in [
        "disk space is low: the filesystem of ",
        mount.as_str(),
        "(the workspace of agent 'filler')",
        "below gateway.minFreeSpace (4.0 MiB)",
        "Agent 'filler' is paused",
        "lower gateway.minFreeSpace",
        "resumes by itself",
    ] {
        assert!(text.contains(part), "{part:?} missing in: {text}");
    }
    assert!(!text.contains("hi\n"), "the call ran: {text}");
    // A plugin call on the agent's socket too, and a prompt.
    let r = gw
        .handle_tool_request("filler", ToolRequest::new("kv", vec!["list".into()]))
        .await;
    assert!(
        !r.success
            && r.error
                .as_deref()
                .unwrap_or("")
                .contains("disk space is low"),
        "{r:?}"
    );
    match gw
        .prompt(PromptRequest::new("filler", "api:filler:default", "hello"))
        .await
    {
        Err(GatewayError::DiskLow { source: low }) => {
            assert!(
                low.to_string().contains("Agent 'filler' is paused"),
                "{low}"
            )
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a prompt was accepted while the disk is low"),
    }
    // The other agent, on another filesystem, keeps working.
    let out = exec(&gw, "bystander", "kv set k v && kv get k").await;
    assert_eq!(out.joined_text(), "Exit code: 0\nv");

    // The owner is told: health, and one audit record for the episode.
    let status = gw.disk_status().await.unwrap().unwrap();
    assert!(status.low);
    assert_eq!(status.paused_agents, ["filler"]);
    let low_fs: Vec<_> = status.filesystems.iter().filter(|f| f.low).collect();
    assert_eq!(low_fs.len(), 1, "{status:?}");
    assert_eq!(low_fs[0].path, disk.path);
    let records = audit(&t.home);
    let low: Vec<_> = records
        .iter()
        .filter(|r| r["tool"] == "security.disk_low")
        .collect();
    assert_eq!(low.len(), 1, "{records:?}");
    assert_eq!(low[0]["agent"], "filler");
    assert_eq!(low[0]["type"], "security");
    assert_eq!(low[0]["decision"], "denied");
    // Refusals are counted, not written one by one.
    assert!(
        !records
            .iter()
            .any(|r| r["agent"] == "filler" && r["tool"] == "exec" && r["decision"] == "denied"),
        "{records:?}"
    );

    // Space returns (the owner deletes the file): work resumes without a restart.
    std::fs::remove_file(disk.path.join("big")).unwrap();
    let out = exec_until(&gw, "filler", "echo hi", |o| !o.is_error).await;
    assert_eq!(out.joined_text(), "Exit code: 0\nhi");
    let events = gw
        .prompt(PromptRequest::new("filler", "api:filler:default", "hello"))
        .await
        .unwrap()
        .collect_all()
        .await;
    assert!(format!("{events:?}").contains("back to work"), "{events:?}");
    assert!(!gw.disk_status().await.unwrap().unwrap().low);
    let records = audit(&t.home);
    let ok: Vec<_> = records
        .iter()
        .filter(|r| r["tool"] == "security.disk_ok")
        .collect();
    assert_eq!(ok.len(), 1, "{records:?}");
    assert_eq!(ok[0]["agent"], "filler");
    let refused: u64 = ok[0]["args"][0]
        .as_str()
        .and_then(|a| a.strip_prefix("refused="))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(refused >= 3, "{:?}", ok[0]);
    gw.shutdown().await.unwrap();
    drop(t);
    drop(disk);
}

#[tokio::test]
async fn low_space_on_the_home_filesystem_pauses_every_agent_until_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let free = Arc::new(AtomicU64::new(10 << 30));
    let probe = {
        let free = free.clone();
        Probe::new(move |_: &Path| {
            Ok(FsSpace {
                free_bytes: free.load(Ordering::SeqCst),
                total_bytes: 100 << 30,
                free_inodes: 1 << 20,
                total_inodes: 1 << 20,
            })
        })
    };
    let agent = json!({"model": {"provider": "anthropic", "model": "m"}, "tools": []});
    let config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {}}},
        "agents": {"a": agent, "b": agent},
        "gateway": {"minFreeSpace": "2%"},
    }))
    .unwrap();
    let gw = Arc::new(
        GatewayBuilder::new(config, home.clone())
            .sandbox(Arc::new(MemorySandbox::new()))
            .free_space_probe(probe)
            .build()
            .await
            .unwrap(),
    );
    assert!(!exec(&gw, "a", "true").await.is_error);
    let health = |token: Option<&'static str>| {
        let app = router(ApiState::new(gw.clone(), Some(TOKEN.to_string())));
        async move {
            let mut req = Request::builder()
                .uri("/api/health")
                .header(header::HOST, "localhost:7433");
            if let Some(t) = token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        }
    };
    let ok = health(None).await;
    assert_eq!(ok["status"], "ok");
    assert!(ok.get("disk").is_none(), "{ok}");

    free.store(1 << 30, Ordering::SeqCst); // 1% of 100 GiB
    let out = exec_until(&gw, "b", "true", |o| o.is_error).await;
    let text = out.joined_text();
    assert!(
        text.contains("(BEIGE_HOME with the store, the audit log, the gateway log, the workspaces of agents 'a', 'b')")
            && text.contains("has 1.0 GiB free of 100.0 GiB, below gateway.minFreeSpace (2%)"),
        "{text}"
    );
    assert!(exec(&gw, "a", "true").await.is_error);
    let status = gw.disk_status().await.unwrap().unwrap();
    assert_eq!(status.paused_agents, ["a", "b"]);
    assert_eq!(status.min_free_space, "2%");
    // The health answer says so: details only to a token holder.
    let anonymous = health(None).await;
    assert_eq!(anonymous["status"], "degraded");
    assert_eq!(anonymous["disk"], json!({"low": true}));
    let owner = health(Some(TOKEN)).await;
    assert_eq!(owner["disk"]["pausedAgents"], json!(["a", "b"]));
    assert_eq!(owner["disk"]["filesystems"][0]["low"], true);
    assert_eq!(
        owner["disk"]["filesystems"][0]["space"]["freeBytes"],
        json!(1u64 << 30)
    );
    // A prompt is refused with 503 and the reason.
    let app = router(ApiState::new(gw.clone(), Some(TOKEN.to_string())));
    let resp = app
        .oneshot(
            Request::builder()
                .method("POST")
                .uri("/api/agents/a/prompt")
                .header(header::HOST, "localhost:7433")
                .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(json!({"message": "hi"}).to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("disk space is low"),
        "{body}"
    );
    let records = audit(&home);
    assert_eq!(
        records
            .iter()
            .filter(|r| r["tool"] == "security.disk_low")
            .count(),
        2
    );

    free.store(10 << 30, Ordering::SeqCst);
    exec_until(&gw, "a", "true", |o| !o.is_error).await;
    assert!(!exec(&gw, "b", "true").await.is_error);
    assert!(!gw.disk_status().await.unwrap().unwrap().low);
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_root_disk_limit_is_kept_or_refused_with_what_to_do() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let config = t.config(
        &env,
        &[("bounded", json!({"sandbox": {"diskLimit": "1g"}}))],
    );
    assert_eq!(
        config.agents["bounded"]
            .sandbox
            .disk_limit
            .map(|l| l.bytes()),
        Some(1 << 30)
    );
    let built = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .build()
        .await;
    match built {
        // A storage driver that keeps size limits (overlay2 on xfs with pquota, …): the
        // root file system of the sandbox is that big.
        Ok(gw) => {
            let out = exec(&gw, "bounded", "df -k / | tail -1").await;
            let text = out.joined_text();
            let kib: u64 = text
                .lines()
                .last()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
                .unwrap_or(u64::MAX);
            assert!(kib <= 1100 * 1024, "{text}");
            gw.shutdown().await.unwrap();
        }
        // Any other driver: the engine's refusal, explained.
        Err(e) => {
            let text = e.to_string();
            for part in [
                "agent 'bounded': the Docker engine refused sandbox.diskLimit (1.0 GiB)",
                "overlay2 on an xfs filesystem mounted with the pquota option",
                "Remove sandbox.diskLimit",
            ] {
                assert!(text.contains(part), "{part:?} missing in: {text}");
            }
        }
    }
}
