//! Egress under load, across a gateway restart and a policy reload, and where a brokered
//! secret must never show up: real clients in a Debian sandbox with no network, through
//! PID 1's proxy and the link, to a TLS upstream on `127.0.0.1`.
//!
//! Loopback only: the test resolver maps `api.example.test` (and `inject.example.test`)
//! to `11.0.0.1`, and the test dialer ([`super::egress_support::TestDialer`]) maps
//! `11.0.0.1:443` to the upstream's loopback port and refuses every other address.
//!
//! [`assert_secret_absent`] is the reusable check of issue 15's "no configured secret
//! appears in any container's inspect output, `/proc/*/environ`, image layer, or the
//! audit log"; `secret_checks_find_a_planted_copy` proves each of its probes reads real
//! bytes by planting the secret where it looks.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use beige_core::config::Config;
use beige_core::{Admin, GatewayBuilder, LocalGateway};
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::egress_support::*;
use super::support::{DockerEnv, TestHome};
use crate::docker_or_skip;

fn resolver() -> TestResolver {
    let ip: IpAddr = PUBLIC_IP.parse().unwrap();
    TestResolver(HashMap::from([(API, Ok(vec![ip])), (INJECT, Ok(vec![ip]))]))
}

/// A gateway on `t`'s home with the test resolver, and a test dialer to `upstream`.
async fn gateway(
    t: &TestHome,
    env: &DockerEnv,
    config: Config,
    upstream: SocketAddr,
) -> (LocalGateway, Arc<TestDialer>) {
    let dialer = Arc::new(TestDialer {
        upstream,
        unexpected: Mutex::new(Vec::new()),
    });
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(t.docker().await))
        .egress_resolver(Arc::new(resolver()))
        .egress_dialer(dialer.clone())
        .build()
        .await
        .unwrap();
    (gw, dialer)
}

/// An agent on the Debian image whose egress allows `API` (or nothing, without rules).
fn agent(rules: Value) -> Value {
    json!({
        "sandbox": {"image": IMAGE, "memoryLimit": "256m"},
        "egress": {"rules": rules},
    })
}

fn api_rule() -> Value {
    json!([{"id": "api", "hosts": [API]}])
}

fn workspace(gw: &LocalGateway, agent: &str) -> PathBuf {
    gw.config().agent_workspace(gw.home(), agent)
}

/// Start `curl` in the background of `agent`'s sandbox (in its own session, so it
/// outlives the exec and the gateway that ran it; the exec waits until it runs): `url` into `/workspace/<name>.bin`,
/// its exit code into `/workspace/<name>.rc` when it ends.
async fn background_download(gw: &LocalGateway, agent: &str, url: &str, name: &str) {
    let out = exec_as(
        gw,
        agent,
        &format!(
            "setsid sh -c 'curl -sS --max-time 50 --cacert /workspace/ca.pem -o /workspace/{name}.bin {url} 2>/workspace/{name}.err; echo $? > /workspace/{name}.rc' </dev/null >/dev/null 2>&1 & for i in $(seq 100); do [ -e /workspace/{name}.err ] && break; sleep 0.1; done; echo started"
        ),
        10,
    )
    .await;
    assert!(out.contains("started"), "{out}");
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// The `egress.connect` records once every connection that `started` has `finished`
/// too (a stream's `finished` is written as its relay winds down, which may be just
/// after the client has its answer), waiting at most 10 s.
async fn settled_records(t: &TestHome) -> Vec<Value> {
    let settled = |records: &[Value]| {
        let started = records.iter().filter(|r| r["phase"] == "started").count();
        let finished_allowed = records
            .iter()
            .filter(|r| r["phase"] == "finished" && r["decision"] == "allowed")
            .count();
        started == finished_allowed
    };
    let mut records = egress_records(t);
    for _ in 0..200 {
        if settled(&records) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        records = egress_records(t);
    }
    records
}

/// The ids of `records` (of `egress.connect`) in order of first appearance.
fn ids(records: &[&Value]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in records {
        let id = r["egress"]["id"].as_str().unwrap_or_default().to_string();
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

// 1. No starvation.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_streams_of_one_agent_do_not_starve_another_agent() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    if !debian_image(&t).await {
        return;
    }
    let up = held_upstream().await;
    let mut config = t.config(&env, &[("a", agent(api_rule())), ("b", agent(api_rule()))]);
    config.gateway.keep_sandboxes = false;
    let (gw, dialer) = gateway(&t, &env, config, up.addr).await;
    for a in ["a", "b"] {
        std::fs::write(workspace(&gw, a).join("ca.pem"), &up.ca_pem).unwrap();
    }

    // Agent A: one curl, 200 transfers at once, each its own CONNECT tunnel, each held
    // open by the upstream until the test releases them.
    const N: usize = 200;
    let urls: String = (0..N).map(|i| format!(" https://{API}/hold/{i}")).collect();
    let a_cmd = format!(
        "curl -sS --no-progress-meter -Z --parallel-immediate --parallel-max {N} --max-time 50 --cacert /workspace/ca.pem -w 'code=%{{http_code}}\\n' {urls} 2>&1 | sort | uniq -c; echo \"rc=$?\""
    );
    let gw_a = gw.clone();
    let a = tokio::spawn(async move { exec_as(&gw_a, "a", &a_cmd, 60).await });
    let all_held = wait_until(Duration::from_secs(40), || up.holding.load(SeqCst) == N).await;
    assert!(
        all_held,
        "agent a's {N} connections did not all reach the upstream: {} held",
        up.holding.load(SeqCst)
    );

    // Agent B, while A's 200 are open: a core tool and its own egress both complete.
    let core = exec_as(&gw, "b", "echo core-tool-ok", 20).await;
    assert!(core.contains("core-tool-ok"), "{core}");
    let b_curl = exec_as(
        &gw,
        "b",
        &format!(
            "curl -sS --max-time 20 --cacert /workspace/ca.pem https://{API}/ ; echo \"rc=$?\""
        ),
        30,
    )
    .await;
    assert!(b_curl.contains("hello from the upstream"), "{b_curl}");
    assert!(b_curl.contains("rc=0"), "{b_curl}");
    // ... and they did while every one of A's connections was still open.
    assert_eq!(
        up.holding.load(SeqCst),
        N,
        "agent b completed only after some of a's connections ended"
    );

    // Released, all of A's transfers complete: the default cap (256) admits 200.
    up.release();
    let a_out = a.await.unwrap();
    assert!(
        a_out.contains(&format!("{N} code=200")),
        "not every transfer of agent a got its 200: {a_out}"
    );
    assert!(a_out.contains(&format!("{N} held")), "{a_out}");
    assert!(!a_out.contains("too_many_streams"), "{a_out}");
    assert!(!a_out.contains("[beige] egress:"), "{a_out}");

    // Audit: 200 allowed connections of A, each `started` and `finished` once.
    let records = settled_records(&t).await;
    let of_a: Vec<&Value> = records.iter().filter(|r| r["agent"] == "a").collect();
    let a_ids = ids(&of_a);
    assert_eq!(a_ids.len(), N, "{of_a:?}");
    for id in &a_ids {
        let phases: Vec<&str> = of_a
            .iter()
            .filter(|r| r["egress"]["id"] == id.as_str())
            .map(|r| r["phase"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(phases, ["started", "finished"], "{id}");
    }
    assert!(of_a.iter().all(|r| r["decision"] == "allowed"), "{of_a:?}");
    assert!(dialer.unexpected.lock().unwrap().is_empty());
    gw.shutdown().await.unwrap();
}

// 2. A gateway restart mid-download.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_restart_mid_download_ends_the_stream_and_new_streams_work() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    if !debian_image(&t).await {
        return;
    }
    let up = held_upstream().await;
    let mut config = t.config(&env, &[("net", agent(api_rule()))]);
    config.gateway.keep_sandboxes = true;
    // The first gateway runs on a runtime of its own, as in a process of its own:
    // dropping the runtime ends its tasks and closes its sockets, as the process's exit
    // does.
    let process = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (home, installation, shim, first) = (
        t.home.clone(),
        t.installation.to_string(),
        env.shim.clone(),
        config.clone(),
    );
    let addr = up.addr;
    let gw = process
        .spawn(async move {
            let docker = beige_core::sandbox::docker::DockerSandbox::connect(&installation)
                .await
                .unwrap()
                .with_legacy_home(&home);
            let dialer = Arc::new(TestDialer {
                upstream: addr,
                unexpected: Mutex::new(Vec::new()),
            });
            GatewayBuilder::new(first, home)
                .shim(&shim)
                .sandbox(Arc::new(docker))
                .egress_resolver(Arc::new(resolver()))
                .egress_dialer(dialer)
                .build()
                .await
                .unwrap()
        })
        .await
        .unwrap();
    let ws = workspace(&gw, "net");
    std::fs::write(ws.join("ca.pem"), &up.ca_pem).unwrap();

    // 20 MiB: the upstream sends half, then waits (never released here).
    const BIG: u64 = 20 * 1024 * 1024;
    let url = format!("https://{API}/big/{BIG}");
    let g = gw.clone();
    process
        .spawn(async move { background_download(&g, "net", &url, "big").await })
        .await
        .unwrap();
    let midway = wait_until(Duration::from_secs(30), || {
        file_len(&ws.join("big.bin")) >= BIG / 4
    })
    .await;
    assert!(
        midway,
        "the download did not get going: {} bytes sent, {} written; curl: {:?} {:?}; {:?}",
        up.sent.load(SeqCst),
        file_len(&ws.join("big.bin")),
        std::fs::read_to_string(ws.join("big.rc")),
        std::fs::read_to_string(ws.join("big.err")),
        egress_records(&t)
    );
    let before = egress_records(&t);
    let old_ids = ids(&records_for(&before, API, 443));
    assert_eq!(old_ids.len(), 1, "{before:?}");

    // The gateway stops, keeping the container, and its process exits.
    process
        .spawn(async move { gw.shutdown().await })
        .await
        .unwrap()
        .unwrap();
    tokio::task::spawn_blocking(move || process.shutdown_timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    // curl in the sandbox ends, with a transfer error and a partial file.
    let ended = wait_until(Duration::from_secs(20), || ws.join("big.rc").exists()).await;
    assert!(
        ended,
        "curl is still running {} s after the gateway exited ({} bytes written; the upstream connection is {})",
        20,
        file_len(&ws.join("big.bin")),
        if up.open.load(SeqCst) > 0 { "still open" } else { "closed" }
    );
    let rc = std::fs::read_to_string(ws.join("big.rc")).unwrap();
    assert_ne!(rc.trim(), "0", "{rc}");
    let partial = file_len(&ws.join("big.bin"));
    assert!(partial < BIG, "{partial}");
    // The upstream's side of the old stream is gone too.
    assert!(
        wait_until(Duration::from_secs(10), || up.open.load(SeqCst) == 0).await,
        "the old stream's upstream connection is still open"
    );

    // A new gateway on the same home adopts the sandbox; a fresh connection works.
    let (gw, dialer) = gateway(&t, &env, config, up.addr).await;
    assert_eq!(
        gw.reconcile_report().reattached,
        ["net".to_string()],
        "{:?}",
        gw.reconcile_report()
    );
    let fresh = exec_as(
        &gw,
        "net",
        &format!(
            "curl -sS --max-time 20 --cacert /workspace/ca.pem https://{API}/ ; echo \"rc=$?\""
        ),
        30,
    )
    .await;
    assert!(fresh.contains("hello from the upstream"), "{fresh}");
    assert!(fresh.contains("rc=0"), "{fresh}");
    assert!(dialer.unexpected.lock().unwrap().is_empty());

    // Audit: the old stream has one `started` and at most one `finished`; the fresh one
    // both (its `finished` may be written just after curl has its answer).
    wait_until(Duration::from_secs(10), || {
        let r = egress_records(&t);
        let finished = records_for(&r, API, 443)
            .iter()
            .filter(|r| r["phase"] == "finished" && r["egress"]["id"] != old_ids[0].as_str())
            .count();
        finished == 1
    })
    .await;
    let records = egress_records(&t);
    let api = records_for(&records, API, 443);
    let all = ids(&api);
    assert_eq!(all.len(), 2, "{api:?}");
    let phases = |id: &str| -> Vec<String> {
        api.iter()
            .filter(|r| r["egress"]["id"] == id)
            .map(|r| r["phase"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let old = phases(&old_ids[0]);
    assert!(
        old == ["started"] || old == ["started", "finished"],
        "the old stream's records: {old:?}"
    );
    assert_eq!(phases(&all[1]), ["started", "finished"]);
    gw.stop(false).await.unwrap();
}

/// The same restart, but in process: `LocalGateway::shutdown` (keeping the sandboxes)
/// on a gateway whose runtime lives on, as an embedder's does. Its egress streams end
/// with it: the final stop cancels them (a reload, which stops the old engine the same
/// way otherwise, does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_shutdown_ends_the_gateways_egress_streams() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    if !debian_image(&t).await {
        return;
    }
    let up = held_upstream().await;
    let mut config = t.config(&env, &[("net", agent(api_rule()))]);
    config.gateway.keep_sandboxes = true;
    let (gw, _) = gateway(&t, &env, config, up.addr).await;
    let ws = workspace(&gw, "net");
    std::fs::write(ws.join("ca.pem"), &up.ca_pem).unwrap();
    const BIG: u64 = 20 * 1024 * 1024;
    background_download(&gw, "net", &format!("https://{API}/big/{BIG}"), "big").await;
    assert!(
        wait_until(Duration::from_secs(30), || {
            file_len(&ws.join("big.bin")) >= BIG / 4
        })
        .await
    );
    gw.shutdown().await.unwrap();
    let ended = wait_until(Duration::from_secs(20), || ws.join("big.rc").exists()).await;
    let open = up.open.load(SeqCst);
    up.release();
    assert!(
        ended,
        "curl still runs 20 s after the gateway stopped (the upstream connection is {})",
        if open > 0 { "open" } else { "closed" }
    );
    // (The container goes with `t`.)
}

// 3. A policy reload mid-stream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_mid_stream_leaves_the_old_stream_on_its_snapshot() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    if !debian_image(&t).await {
        return;
    }
    let up = held_upstream().await;
    let mut config = t.config(&env, &[("net", agent(api_rule()))]);
    config.gateway.keep_sandboxes = false;
    let (gw, dialer) = gateway(&t, &env, config, up.addr).await;
    let ws = workspace(&gw, "net");
    std::fs::write(ws.join("ca.pem"), &up.ca_pem).unwrap();

    // 8 MiB under rule set N: half now, the rest once released.
    const SIZE: u64 = 8 * 1024 * 1024;
    background_download(&gw, "net", &format!("https://{API}/big/{SIZE}"), "dl").await;
    let midway = wait_until(Duration::from_secs(30), || up.sent.load(SeqCst) >= SIZE / 2).await;
    assert!(midway, "the download did not get going");
    let n = {
        let records = egress_records(&t);
        let started = records_for(&records, API, 443);
        assert_eq!(started.len(), 1, "{started:?}");
        assert_eq!(started[0]["phase"], "started");
        started[0]["egress"]["policyVersion"].as_u64().unwrap()
    };

    // Rule set N+1: egress on, nothing allowed.
    let mut next = t.config(&env, &[("net", agent(json!([])))]);
    next.gateway.keep_sandboxes = false;
    let outcome = gw.reload(next).await;
    assert!(outcome.ok, "{outcome}");
    assert_eq!(
        gw.reconcile_report().reattached,
        ["net".to_string()],
        "a rule change must not recreate the container: {:?}",
        gw.reconcile_report()
    );

    // A new connection is refused by the new rules...
    let refused = exec_as(
        &gw,
        "net",
        &format!(
            "curl -sS -v --max-time 20 --cacert /workspace/ca.pem https://{API}/ 2>&1 | grep -i -e x-beige-egress -e 'HTTP/1.1 403'; true"
        ),
        30,
    )
    .await;
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("x-beige-egress: denied; reason=no_rule"),
        "{refused}"
    );
    // ... while the old one is still open, and finishes intact.
    assert!(!ws.join("dl.rc").exists(), "the old download ended early");
    assert_eq!(
        up.open.load(SeqCst),
        1,
        "the old stream's upstream connection"
    );
    up.release();
    let done = wait_until(Duration::from_secs(30), || ws.join("dl.rc").exists()).await;
    assert!(done, "the old download did not finish");
    let rc = std::fs::read_to_string(ws.join("dl.rc")).unwrap();
    let err = std::fs::read_to_string(ws.join("dl.err")).unwrap_or_default();
    assert_eq!(rc.trim(), "0", "curl: {err}");
    assert_eq!(file_len(&ws.join("dl.bin")), SIZE);

    // Audit: the old stream on version N from start to finish, the refusal on a newer
    // version.
    let records = settled_records(&t).await;
    let api = records_for(&records, API, 443);
    let all = ids(&api);
    assert_eq!(all.len(), 2, "{api:?}");
    let of = |id: &str| -> Vec<&Value> {
        api.iter()
            .filter(|r| r["egress"]["id"] == id)
            .copied()
            .collect()
    };
    let old = of(&all[0]);
    assert_eq!(old.len(), 2, "{old:?}");
    assert_eq!(old[1]["phase"], "finished", "{old:?}");
    assert_eq!(old[1]["decision"], "allowed", "{old:?}");
    assert!(
        old[1]["egress"]["bytesDown"].as_u64().unwrap() >= SIZE,
        "{old:?}"
    );
    for r in &old {
        assert_eq!(r["egress"]["policyVersion"], n, "{r}");
    }
    let refusal = of(&all[1]);
    assert_eq!(refusal.len(), 1, "{refusal:?}");
    assert_eq!(refusal[0]["decision"], "denied");
    assert_eq!(refusal[0]["egress"]["reason"], "no_rule");
    let n1 = refusal[0]["egress"]["policyVersion"].as_u64().unwrap();
    assert!(
        n1 > n,
        "the reloaded rules' version {n1} is not newer than {n}"
    );
    assert!(dialer.unexpected.lock().unwrap().is_empty());
    gw.shutdown().await.unwrap();
}

// 4. Where a configured secret must never appear.

/// Where any of `secrets` was found among the places a sandbox's secrets could leak
/// to: the container's inspect output, the environment of every process in it (see
/// [`found_in_environ`]), the container's filesystem (its `docker export`: the image's
/// layers with the container's changes), and every file under `dirs` (a home: its audit
/// log, logs, keys, run files and workspaces). Each finding names the place and the
/// index of the secret in `secrets` (never the secret). Empty when none is anywhere.
pub(crate) async fn secret_findings(
    docker: &bollard::Docker,
    container: &str,
    dirs: &[&Path],
    secrets: &[&str],
) -> Vec<String> {
    let mut found = Vec::new();
    for (i, secret) in secrets.iter().enumerate() {
        if found_in_inspect(docker, container, secret).await {
            found.push(format!("docker inspect {container} (secret #{i})"));
        }
        let (environ, read) = found_in_environ(docker, container, secret).await;
        assert!(read >= 1, "no /proc/*/environ file was read in {container}");
        found.extend(environ.into_iter().map(|f| format!("{f} (secret #{i})")));
        for dir in dirs {
            found.extend(
                found_in_files(dir, secret)
                    .into_iter()
                    .map(|f| format!("{f} (secret #{i})")),
            );
        }
    }
    // One pass over the export for all of them.
    for i in found_in_export(docker, container, secrets).await {
        found.push(format!("docker export {container} (secret #{i})"));
    }
    found
}

/// Panics, naming every place, when any of `secrets` is found in any of the places of
/// [`secret_findings`]. For a credential, pass its secret and the forms it may travel in
/// (its base64, a `Basic` pair).
pub(crate) async fn assert_secret_absent(
    docker: &bollard::Docker,
    container: &str,
    dirs: &[&Path],
    secrets: &[&str],
) {
    let found = secret_findings(docker, container, dirs, secrets).await;
    assert!(found.is_empty(), "a secret was found in: {found:?}");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(hay, needle).is_some()
}

async fn found_in_inspect(docker: &bollard::Docker, container: &str, needle: &str) -> bool {
    let info = docker
        .inspect_container(
            container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let text = serde_json::to_string(&info).unwrap();
    assert!(text.contains(container), "an empty inspect output");
    text.contains(needle)
}

/// The `/proc/<pid>/environ` files holding `needle`, and how many were read. They are
/// read twice: inside the container through a Docker exec as each uid that `docker top`
/// lists (root without `CAP_SYS_PTRACE` may not read another uid's), and from the
/// Docker host by the host pids `docker top` gives (which also reaches non-dumpable
/// processes, such as PID 1 after it has dropped privileges). Every process listed must
/// have been read from the host.
async fn found_in_environ(
    docker: &bollard::Docker,
    container: &str,
    needle: &str,
) -> (Vec<String>, usize) {
    let top = docker
        .top_processes(
            container,
            Some(bollard::query_parameters::TopOptions {
                ps_args: "-eo pid,uid,args".into(),
            }),
        )
        .await
        .unwrap();
    let listed = top.processes.unwrap_or_default();
    let mut found = Vec::new();
    let mut read = 0;

    // From the host, by host pid.
    for p in &listed {
        let pid = &p[0];
        match std::fs::read(format!("/proc/{pid}/environ")) {
            Ok(env) => {
                read += 1;
                if contains(&env, needle.as_bytes()) {
                    found.push(format!(
                        "/proc/{pid}/environ (host pid) of {container}: {p:?}"
                    ));
                }
            }
            // A process that ended meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot read the environment of {p:?} in {container}: {e}"),
        }
    }
    assert!(read > 0, "no process of {container} could be read");

    // Inside the container, as each uid: one line per process, its pid and its
    // environment hex-encoded (NULs and all).
    let mut uids: Vec<String> = listed.iter().filter_map(|p| p.get(1).cloned()).collect();
    uids.sort();
    uids.dedup();
    let script = r#"for d in /proc/[0-9]*; do if [ -r "$d/environ" ]; then printf '%s ' "${d#/proc/}"; od -An -v -tx1 "$d/environ" | tr -d ' \n'; echo; fi; done"#;
    let hex: String = needle.bytes().map(|b| format!("{b:02x}")).collect();
    let mut inside: HashMap<String, String> = HashMap::new();
    for uid in &uids {
        let out = exec_in(docker, container, uid, &["sh", "-c", script]).await;
        for line in out.lines() {
            if let Some((pid, env)) = line.split_once(' ') {
                if !env.is_empty() {
                    inside.insert(pid.to_string(), env.to_string());
                }
            }
        }
    }
    assert!(!inside.is_empty(), "no environment read inside {container}");
    for (pid, env) in &inside {
        // Byte-aligned: an even offset in the hex text.
        if env.match_indices(&hex).any(|(i, _)| i % 2 == 0) {
            found.push(format!("/proc/{pid}/environ in {container}"));
        }
    }
    found.sort();
    (found, read)
}

/// Run `cmd` in `container` as root; its standard output.
async fn root_exec(docker: &bollard::Docker, container: &str, cmd: &[&str]) -> String {
    exec_in(docker, container, "0", cmd).await
}

/// Run `cmd` in `container` as `user` through a Docker exec; its standard output.
async fn exec_in(docker: &bollard::Docker, container: &str, user: &str, cmd: &[&str]) -> String {
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                user: Some(user),
                cmd: Some(cmd.to_vec()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                detach: false,
                ..Default::default()
            }),
        )
        .await
        .unwrap()
    else {
        panic!("the exec started detached");
    };
    let mut stdout = Vec::new();
    while let Some(chunk) = output.next().await {
        if let bollard::container::LogOutput::StdOut { message } = chunk.unwrap() {
            stdout.extend_from_slice(&message);
        }
    }
    String::from_utf8_lossy(&stdout).into_owned()
}

/// The indexes of the `needles` that the container's filesystem (as `docker export`
/// streams it) holds.
async fn found_in_export(
    docker: &bollard::Docker,
    container: &str,
    needles: &[&str],
) -> Vec<usize> {
    let keep = needles.iter().map(|n| n.len()).max().unwrap_or(1).max(1) - 1;
    let mut found = vec![false; needles.len()];
    let mut stream = docker.export_container(container);
    // The last `keep` bytes seen, for a match across a chunk boundary.
    let mut window: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        total += chunk.len();
        window.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        for (i, n) in needles.iter().enumerate() {
            found[i] |= contains(&window, n.as_bytes()) || contains(&chunk, n.as_bytes());
        }
        window.extend_from_slice(&chunk[chunk.len().min(keep)..]);
        if window.len() > keep {
            window.drain(..window.len() - keep);
        }
    }
    assert!(total > 1024 * 1024, "an export of only {total} bytes");
    (0..needles.len()).filter(|&i| found[i]).collect()
}

/// Every file under `dir` (recursively, not following links) holding `needle`.
fn found_in_files(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                stack.push(e.path());
            } else if kind.is_file() {
                if let Ok(bytes) = std::fs::read(e.path()) {
                    if contains(&bytes, needle.as_bytes()) {
                        found.push(e.path().display().to_string());
                    }
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_secret_is_in_no_container_byte_audit_line_or_log() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    if !debian_image(&t).await {
        return;
    }
    let upstream = tls_upstream(t.dir.path().join("no-repo")).await;
    let mut config = t.config(
        &env,
        &[(
            "net",
            json!({
                "sandbox": {"image": IMAGE, "memoryLimit": "256m"},
                "egress": {"rules": [{"id": "inject", "hosts": [INJECT]}], "credentials": ["tok"]},
            }),
        )],
    );
    let roots = t.home.root().join("upstream-ca.pem");
    std::fs::write(&roots, &upstream.ca_pem).unwrap();
    config.egress = Some(
        serde_json::from_value(json!({
            "credentials": {"tok": {
                "secret": SECRET, "hosts": [INJECT],
                "inject": {"header": "Authorization", "format": "Bearer {}"},
            }},
            "tls": {"extraRoots": [roots.to_string_lossy()]},
        }))
        .unwrap(),
    );
    config.gateway.keep_sandboxes = false;
    let (gw, dialer) = gateway(&t, &env, config, upstream.addr).await;
    let ws = workspace(&gw, "net");
    let ca = std::fs::read_to_string(t.home.root().join("keys/egress-ca.pem")).unwrap();
    std::fs::write(ws.join("beige-ca.pem"), ca).unwrap();

    // A brokered request: the upstream got the secret, the client saw it masked.
    let injected = exec_as(
        &gw,
        "net",
        &format!(
            "curl -sS --max-time 20 --cacert /workspace/beige-ca.pem -H 'Authorization: Bearer sk-fake' https://{INJECT}/v1/x ; echo \"rc=$?\""
        ),
        30,
    )
    .await;
    assert!(injected.contains("rc=0"), "{injected}");
    assert!(
        injected.contains(&format!(
            "authorization: Bearer {}",
            "*".repeat(SECRET.len())
        )),
        "{injected}"
    );
    let heads = upstream.heads.lock().unwrap().clone();
    assert!(
        heads
            .iter()
            .any(|h| h.contains(&format!("authorization: Bearer {SECRET}"))),
        "the secret was not brokered: {heads:?}"
    );
    assert!(!request_records(&t).is_empty());

    // An agent process that lives while the environments are read.
    let bg = exec_as(
        &gw,
        "net",
        "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $! > /tmp/sleep.pid; echo started",
        10,
    )
    .await;
    assert!(bg.contains("started"), "{bg}");

    let container = gw.sandbox_status("net").await.unwrap().container;
    let docker = t.docker().await;
    // The whole home: the audit log, the gateway's logs, keys, run files, workspaces.
    let home = t.home.root();
    assert!(t.home.audit_log_path().starts_with(home));
    assert!(std::fs::read_to_string(t.home.audit_log_path())
        .unwrap()
        .contains("egress.request"));
    // The secret, raw and in base64; and the provider's key, which never reaches the
    // sandbox either (it is in no file of the home: the config is not written there).
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    assert_secret_absent(
        docker.client(),
        &container,
        &[home],
        &[SECRET, &b64, "sk-test-secret-never-in-sandbox"],
    )
    .await;
    assert!(dialer.unexpected.lock().unwrap().is_empty());
    // (Its sleeper ends now, so the removal of the container does not wait for it.)
    exec_as(&gw, "net", "kill $(cat /tmp/sleep.pid)", 10).await;
    gw.shutdown().await.unwrap();
}

/// Each probe of [`secret_findings`] finds a copy of the secret planted where it looks,
/// and not before: they read real bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_checks_find_a_planted_copy() {
    let _env = docker_or_skip!();
    let t = TestHome::new();
    if !debian_image(&t).await {
        return;
    }
    let docker = t.docker().await;
    let client = docker.client();
    let run = |env: Option<&str>| {
        let mut cmd = std::process::Command::new("docker");
        cmd.args(["run", "-d", "--network", "none", "--label"])
            .arg(format!("io.beige.installation={}", t.installation));
        if let Some(e) = env {
            cmd.args(["-e", e]);
        }
        let out = cmd.args([IMAGE, "sleep", "120"]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };

    // A clean scratch container: found nowhere.
    let clean = run(None);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::write(dir.path().join("logs/audit.jsonl"), "{\"tool\":\"x\"}\n").unwrap();
    let none = secret_findings(client, &clean, &[dir.path()], &[SECRET]).await;
    assert!(none.is_empty(), "{none:?}");

    // Planted in a file of the container: the export finds it (and only it).
    let planted = root_exec(
        client,
        &clean,
        &[
            "sh",
            "-c",
            "printf 'before %s after' \"$0\" > /root/planted && echo ok",
            SECRET,
        ],
    )
    .await;
    assert!(planted.contains("ok"), "{planted}");
    let found = secret_findings(client, &clean, &[dir.path()], &[SECRET]).await;
    assert_eq!(found, [format!("docker export {clean} (secret #0)")]);

    // Planted in a process's environment (not PID 1's): `/proc/<pid>/environ` finds it.
    let other = run(None);
    let mut cmd = std::process::Command::new("docker");
    let out = cmd
        .args(["exec", "-d", "-u", "1000", "-e"])
        .arg(format!("PLANTED={SECRET}"))
        .args([&other, "sleep", "120"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let found = secret_findings(client, &other, &[], &[SECRET]).await;
    // Both readers see it: from the host and inside the container.
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found
            .iter()
            .any(|f| f.contains("(host pid)") && f.contains("sleep 120")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|f| f.contains("/environ in ")),
        "{found:?}"
    );

    // In the container's config: inspect finds it (and PID 1's environment).
    let configured = run(Some(&format!("PLANTED={SECRET}")));
    let found = secret_findings(client, &configured, &[], &[SECRET]).await;
    assert!(
        found.contains(&format!("docker inspect {configured} (secret #0)")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|f| f.starts_with("/proc/1/environ")),
        "{found:?}"
    );

    // In a file under a directory (an audit line, deep down): found, by path.
    std::fs::write(
        dir.path().join("logs/audit.jsonl"),
        format!("{{\"tool\":\"x\"}}\n{{\"error\":\"Bearer {SECRET}\"}}\n"),
    )
    .unwrap();
    let found = found_in_files(dir.path(), SECRET);
    assert_eq!(
        found,
        [dir.path().join("logs/audit.jsonl").display().to_string()]
    );
}
