//! Per-exec identity on the real Docker engine: every plugin call from a script is
//! attributed by the kernel's view of the calling process to the exec it runs in — not
//! by what the request says — and processes an exec leaves behind lose tool access
//! when it ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext, ToolOutput};
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway};
use serde_json::{json, Value};

use super::support::{DockerEnv, TestHome};
use crate::docker_or_skip;

const DEBIAN: &str = super::egress_support::IMAGE;

async fn start(t: &TestHome, env: &DockerEnv, image: Option<&str>) -> LocalGateway {
    let mut agent = json!({"tools": ["kv"]});
    if let Some(image) = image {
        agent["sandbox"] = json!({"image": image, "memoryLimit": "256m", "pidsLimit": 128});
    }
    let mut config = t.config(env, &[("id", agent)]);
    config.plugins = serde_json::from_value(json!({"kv": {"config": {"maxKeys": 10000}}})).unwrap();
    GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .build()
        .await
        .unwrap()
}

/// Runs `command` as the model would, in session `api:<session>`.
async fn exec_in(gw: &LocalGateway, session: &str, command: &str) -> ToolOutput {
    let ctx = ToolContext {
        session_key: Some(format!("api:{session}")),
        channel: Some("api".into()),
        ..Default::default()
    };
    let call = CoreToolCall::Exec(ExecParams {
        command: command.into(),
        timeout: Some(60),
    });
    gw.call_tool("id", call, ctx).await.unwrap()
}

fn audit(home: &BeigeHome) -> Vec<Value> {
    std::fs::read_to_string(home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| !beige_core::audit::chain::is_chain_record(v))
        .collect()
}

/// The exec id of the (finished) `exec` record whose command contains `marker`.
fn exec_id_of(records: &[Value], marker: &str) -> String {
    records
        .iter()
        .find(|r| {
            r["tool"] == "exec"
                && r["phase"] == "finished"
                && r["args"][0].as_str().is_some_and(|a| a.contains(marker))
        })
        .and_then(|r| r["exec"].as_str())
        .unwrap_or_else(|| panic!("no exec record for {marker}"))
        .to_string()
}

/// Waits up to 20 s for the file the sandbox writes at `rel` in the workspace.
async fn wait_for_file(t: &TestHome, rel: &str) -> String {
    let path = t.home.default_workspace("id").join(rel);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            if text.contains("rc=") {
                return text;
            }
        }
        assert!(Instant::now() < until, "{rel} was never written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn two_concurrent_execs_calling_kv_are_each_attributed_to_their_own_exec() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env, None).await;
    let script = |name: &str| {
        format!(
            ": mark={name}; for i in $(seq 1 100); do kv set {name}:$i v >/dev/null || exit 1; done; echo id=$BEIGE_EXEC_ID"
        )
    };
    let (alpha, beta) = (script("alpha"), script("beta"));
    let (a, b) = tokio::join!(exec_in(&gw, "one", &alpha), exec_in(&gw, "two", &beta));
    assert!(!a.is_error, "{}", a.joined_text());
    assert!(!b.is_error, "{}", b.joined_text());
    let records = audit(&t.home);
    let ids = [
        ("alpha", exec_id_of(&records, "mark=alpha"), "api:one"),
        ("beta", exec_id_of(&records, "mark=beta"), "api:two"),
    ];
    assert_ne!(ids[0].1, ids[1].1);
    // The exec's own environment carries the id its records name.
    assert!(a.joined_text().contains(&format!("id={}", ids[0].1)));
    assert!(b.joined_text().contains(&format!("id={}", ids[1].1)));

    let kv: Vec<&Value> = records
        .iter()
        .filter(|r| r["tool"] == "kv" && r["phase"] == "finished")
        .collect();
    assert_eq!(kv.len(), 200);
    let mut per_exec: HashMap<&str, usize> = HashMap::new();
    for r in &kv {
        let key = r["args"][1].as_str().unwrap();
        let (name, exec, session) = ids
            .iter()
            .find(|(name, _, _)| key.starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("unexpected key in {r}"));
        assert_eq!(r["exec"].as_str(), Some(exec.as_str()), "{name}: {r}");
        assert_eq!(r["attribution"], "session-id", "{r}");
        assert_eq!(r["session"].as_str(), Some(*session), "{r}");
        assert_eq!(r["decision"], "allowed", "{r}");
        *per_exec.entry(exec.as_str()).or_default() += 1;
    }
    assert_eq!(per_exec.get(ids[0].1.as_str()), Some(&100));
    assert_eq!(per_exec.get(ids[1].1.as_str()), Some(&100));
}

#[tokio::test]
async fn a_forged_exec_id_and_session_are_refused_and_attributed_to_the_real_exec() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env, None).await;
    let victim = exec_in(
        &gw,
        "victim",
        ": mark=victim; echo $BEIGE_EXEC_ID > /workspace/victim.id",
    );
    let forger = async {
        // Wait until the victim's id is there, then claim it and its session.
        exec_in(
            &gw,
            "forger",
            ": mark=forger; while [ ! -s /workspace/victim.id ]; do sleep 0.05; done; \
             BEIGE_EXEC_ID=$(cat /workspace/victim.id) BEIGE_SESSION_KEY=api:victim kv set stolen 1; \
             echo rc=$?; kv set own 1; echo own=$?",
        )
        .await
    };
    let (v, f) = tokio::join!(victim, forger);
    assert!(!v.is_error, "{}", v.joined_text());
    let text = f.joined_text();
    assert!(text.contains("exec_id_mismatch"), "{text}");
    assert!(text.contains("rc=1"), "{text}");
    assert!(text.contains("own=0"), "{text}");

    let records = audit(&t.home);
    let forger_id = exec_id_of(&records, "mark=forger");
    let victim_id = exec_id_of(&records, "mark=victim");
    let mismatch: Vec<&Value> = records
        .iter()
        .filter(|r| r["tool"] == "security.exec_id_mismatch")
        .collect();
    assert_eq!(mismatch.len(), 1, "{records:?}");
    let m = mismatch[0];
    assert_eq!(m["decision"], "denied");
    assert_eq!(m["exec"].as_str(), Some(forger_id.as_str()), "{m}");
    assert_eq!(m["attribution"], "session-id");
    assert_eq!(
        m["session"], "api:forger",
        "the forged session key is ignored"
    );
    assert!(
        m["args"]
            .as_array()
            .unwrap()
            .contains(&json!(format!("claimed={victim_id}"))),
        "{m}"
    );
    // Nothing ran as the victim; the forger's honest call ran as itself.
    assert!(!records
        .iter()
        .any(|r| r["tool"] == "kv" && r["args"][1] == "stolen"));
    let own = records
        .iter()
        .find(|r| r["tool"] == "kv" && r["phase"] == "finished" && r["args"][1] == "own")
        .unwrap();
    assert_eq!(own["exec"].as_str(), Some(forger_id.as_str()));
    assert_eq!(own["session"], "api:forger");
}

#[tokio::test]
async fn a_daemon_left_in_the_session_loses_tool_access_when_its_exec_ends() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    if !super::egress_support::debian_image(&t).await {
        return;
    }
    let gw = start(&t, &env, Some(DEBIAN)).await;
    // A process that leaves the exec's process group (so it survives the group's
    // SIGKILL) but not its session, and calls kv after the exec has ended; and one that
    // leaves the session too (`setsid`) and is re-parented, whose call is unbound.
    // The exec waits until both have left its process group, so that the group's
    // SIGKILL cannot catch them half-way.
    let daemon = r#": mark=daemons; cat > /workspace/d.py <<'PY'
import os, subprocess, sys, time
key, flag = sys.argv[1], sys.argv[2]
if os.fork():
    os._exit(0)
if key == "late":
    os.setpgid(0, 0)
else:
    os.setsid()
open(flag, "w").close()
time.sleep(2)
r = subprocess.run(["kv", "set", key, "1"], capture_output=True, text=True)
open("/workspace/%s.out" % key, "w").write(r.stdout + r.stderr + "rc=%d\n" % r.returncode)
PY
python3 /workspace/d.py late /workspace/late.flag </dev/null >/dev/null 2>&1 &
python3 /workspace/d.py unbound /workspace/unbound.flag </dev/null >/dev/null 2>&1 &
while [ ! -e /workspace/late.flag ] || [ ! -e /workspace/unbound.flag ]; do sleep 0.05; done
kv set early 1; echo early=$?"#;
    let out = exec_in(&gw, "bg", daemon).await;
    let text = out.joined_text();
    assert!(text.contains("early=0"), "{text}");

    let late = wait_for_file(&t, "late.out").await;
    assert!(
        late.contains("exec_finished") && late.contains("rc=1"),
        "{late}"
    );
    let unbound = wait_for_file(&t, "unbound.out").await;
    assert!(unbound.contains("rc=0"), "{unbound}");

    let records = audit(&t.home);
    let exec = exec_id_of(&records, "mark=daemons");
    let kv = |key: &str| {
        records
            .iter()
            .find(|r| r["tool"] == "kv" && r["phase"] == "finished" && r["args"][1] == key)
            .unwrap_or_else(|| panic!("no record of kv set {key}"))
            .clone()
    };
    let early = kv("early");
    assert_eq!(early["exec"].as_str(), Some(exec.as_str()));
    assert_eq!(early["decision"], "allowed");
    let late = kv("late");
    assert_eq!(late["decision"], "denied", "{late}");
    assert_eq!(late["exec"].as_str(), Some(exec.as_str()), "{late}");
    assert_eq!(late["attribution"], "session-id");
    assert!(
        late["error"].as_str().unwrap().starts_with("exec_finished"),
        "{late}"
    );
    // Left the session and was re-parented to PID 1: no exec, so the rule from before
    // per-exec identity applies (the known session its environment names).
    let unbound = kv("unbound");
    assert_eq!(unbound["attribution"], "unbound", "{unbound}");
    assert!(unbound.get("exec").is_none(), "{unbound}");
    assert_eq!(unbound["decision"], "allowed");
    assert_eq!(unbound["session"], "api:bg");
}

/// Host pids of the processes whose command line is exactly `argv` (NUL-separated).
fn host_pids_with_cmdline(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// `(container pid, starttime)` of the host process `pid`.
fn proc_key(pid: u32) -> (u32, u64, u32) {
    let stat =
        beige_protocol::procfs::parse_stat(&std::fs::read(format!("/proc/{pid}/stat")).unwrap())
            .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = beige_protocol::procfs::ns_ids(&status, "NSpid").unwrap();
    (*nspid.last().unwrap(), stat.starttime, stat.sid)
}

/// p50/p99 in µs of `n` runs of `f`.
fn measure(n: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut samples: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    (samples[n / 2], samples[n * 99 / 100])
}

/// The cost of attributing one new connection, against real processes of a container:
/// the first member of an exec's session, a further member of a session already seen
/// (the usual case: every launcher is a new process), one that left the session (found
/// by ancestry), and a cache hit. Run with `--run-ignored ignored-only`; prints the figures.
#[tokio::test]
#[ignore = "a measurement: run with --run-ignored ignored-only"]
async fn attribution_of_a_new_connection_costs_well_under_100_us() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = start(&t, &env, None).await;
    let running = exec_in(
        &gw,
        "cost",
        ": mark=cost; sleep 9.3141 & setsid sleep 9.3142 & sleep 9.3143; wait",
    );
    let measured = async {
        let until = Instant::now() + Duration::from_secs(5);
        let (member, left, sibling) = loop {
            let (m, l, s) = (
                host_pids_with_cmdline(&["sleep", "9.3141"]),
                host_pids_with_cmdline(&["sleep", "9.3142"]),
                host_pids_with_cmdline(&["sleep", "9.3143"]),
            );
            if let ([m], [l], [s]) = (m.as_slice(), l.as_slice(), s.as_slice()) {
                break (*m, *l, *s);
            }
            assert!(Instant::now() < until, "the sleeps never showed up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (_, _, leader_host) = proc_key(member);
        let (root_pid, root_start, _) = proc_key(leader_host);
        let fresh = || {
            let r = beige_core::ident::ExecRegistry::new();
            r.register(
                "id",
                &beige_core::ident::ExecId::new("xroot"),
                Default::default(),
                "sleep",
            );
            assert!(r.started("id", "xroot", root_pid, root_start));
            r
        };
        let mut out = Vec::new();
        for (name, pid, method) in [
            (
                "session-id",
                member,
                beige_core::ident::AttributionMethod::SessionId,
            ),
            (
                "ancestry",
                left,
                beige_core::ident::AttributionMethod::Ancestry,
            ),
        ] {
            let mut regs: Vec<_> = (0..2000).map(|_| fresh()).collect();
            let (p50, p99) = measure(2000, || {
                let r = regs.pop().unwrap();
                let a = r.attribute_now("id", pid);
                assert_eq!(a.method, method, "{name}");
            });
            out.push((name, p50, p99));
        }
        // A new process of a session whose root another caller already led to.
        let mut regs: Vec<_> = (0..2000)
            .map(|_| {
                let r = fresh();
                assert!(r.attribute_now("id", sibling).exec.is_some());
                r
            })
            .collect();
        let (p50, p99) = measure(2000, || {
            let r = regs.pop().unwrap();
            assert!(r.attribute_now("id", member).exec.is_some());
        });
        out.push(("same-session", p50, p99));
        let cached = fresh();
        cached.attribute_now("id", member);
        let (p50, p99) = measure(2000, || {
            assert!(cached.attribute_now("id", member).exec.is_some());
        });
        out.push(("cached", p50, p99));
        out
    };
    let (_, figures) = tokio::join!(running, measured);
    for (name, p50, p99) in &figures {
        eprintln!("BENCH attribution_{name} median={p50:.1} p99={p99:.1} unit=us");
    }
    for (name, _, p99) in &figures {
        // Loose: a debug build on a busy machine; the target (100 µs) is for release.
        assert!(*p99 < 10_000.0, "{name}: p99 {p99:.1} µs");
    }
}
