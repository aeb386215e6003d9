//! The shim link on the real Docker engine: what an agent's process can and cannot do
//! to PID 1 and to its siblings (`link.md` §2.5, run as the agent from inside the
//! sandbox), and how the link behaves when things die: PID 1 killed, an escaped daemon
//! after a timeout, a flood of output.

use std::time::Duration;

use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext, ToolOutput};
use beige_core::audit::AuditRecord;
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::sandbox::Transport;
use beige_core::{Gateway, GatewayBuilder, LocalGateway};
use serde_json::json;

use super::support::TestHome;
use crate::docker_or_skip;

/// An image with python3 for the syscall probes (built by `scripts/setup-docker
/// --debian-base`, which CI runs).
const PROBE_IMAGE: &str = "beige-test-debian:bookworm";

async fn exec_t(gw: &LocalGateway, agent: &str, command: &str, timeout: u64) -> ToolOutput {
    gw.call_tool(
        agent,
        CoreToolCall::Exec(ExecParams {
            command: command.into(),
            timeout: Some(timeout),
        }),
        ToolContext::default(),
    )
    .await
    .unwrap()
}

async fn gateway_with(
    t: &TestHome,
    env: &super::support::DockerEnv,
    config: beige_core::config::Config,
) -> (LocalGateway, DockerSandbox) {
    let docker = t.docker().await;
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(std::sync::Arc::new(docker.clone()))
        .build()
        .await
        .unwrap();
    (gw, docker)
}

async fn probe_image_present(docker: &DockerSandbox) -> bool {
    if docker.client().inspect_image(PROBE_IMAGE).await.is_ok() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{PROBE_IMAGE} missing in CI: scripts/setup-docker --debian-base builds it");
    }
    eprintln!("SKIPPED (not in CI): {PROBE_IMAGE} missing; run scripts/setup-docker --debian-base");
    false
}

fn audit_records(t: &TestHome) -> Vec<AuditRecord> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Python run as the agent: every probe prints `name: errno-name` (or `ok`).
const PROBES: &str = r#"
import ctypes, errno, os, socket, struct, json, time, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def res(r):
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
def opener(path):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
for f in ["environ", "fd", "mem", "maps"]:
    print("proc1-" + f + ":", opener("/proc/1/" + f))
sib = subprocess.Popen(["sleep", "30"])
time.sleep(0.1)
print("ptrace-attach:", res(libc.syscall(101, 16, sib.pid, 0, 0)))
print("ptrace-traceme:", res(libc.syscall(101, 0, 0, 0, 0)))
print("process_vm_readv:", res(libc.syscall(310, sib.pid, 0, 0, 0, 0, 0)))
pidfd = libc.syscall(434, sib.pid, 0)
print("pidfd_open:", "ok" if pidfd >= 0 else res(pidfd))
print("pidfd_getfd:", res(libc.syscall(438, pidfd, 0, 0)))
sib.kill()
for sig in ["TERM", "9"]:
    r = subprocess.run(["kill", "-" + sig, "1"], capture_output=True)
    print("kill-" + sig + ":", r.returncode)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("/beige/run/ctl.sock")
    hello = json.dumps({"t": "shim_hello", "role": "control", "boot_id": "fake", "version": "x", "carrier": "unix", "pending": []}).encode()
    s.sendall(b"BGL1" + struct.pack(">II", len(hello), 0) + hello)
    s.settimeout(5)
    got = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    print("ctl:", "refused" if b'"refused"' in got else ("hello" if b"gateway_hello" in got else repr(got)))
except OSError as e:
    print("ctl: connect", errno.errorcode[e.errno])
"#;

#[tokio::test]
async fn the_agent_cannot_reach_pid_1_or_its_siblings() {
    let env = docker_or_skip!();
    let probe = DockerSandbox::connect("probe").await.unwrap();
    if !probe_image_present(&probe).await {
        return;
    }
    let t = TestHome::new();
    let config = t.config(
        &env,
        &[("probe", json!({"sandbox": {"image": PROBE_IMAGE}}))],
    );
    let (gw, docker) = gateway_with(&t, &env, config).await;
    assert!(
        docker
            .link_hub()
            .wait_connected("probe", Duration::from_secs(5))
            .await
    );
    let boot = docker.link_hub().status_of("probe").boot_id;

    std::fs::write(t.home.default_workspace("probe").join("probes.py"), PROBES).unwrap();
    let out = exec_t(&gw, "probe", "python3 probes.py 2>&1", 60).await;
    let text = out.joined_text();
    assert_eq!(out.transport, Some(Transport::LINK_UNIX), "{text}");
    for expected in [
        "proc1-environ: EACCES",
        "proc1-fd: EACCES",
        "proc1-mem: EACCES",
        "proc1-maps: EACCES",
        "ptrace-attach: EPERM",
        "ptrace-traceme: EPERM",
        "process_vm_readv: EPERM",
        "pidfd_open: ok",
        "pidfd_getfd: EPERM",
        "ctl: refused",
    ] {
        assert!(text.contains(expected), "expected `{expected}` in:\n{text}");
    }
    // `kill` fails (exit code 1) and PID 1 is unchanged: same boot, link still up.
    assert!(text.contains("kill-TERM: 1"), "{text}");
    assert!(text.contains("kill-9: 1"), "{text}");
    let after = exec_t(&gw, "probe", "echo alive", 10).await;
    assert!(after.joined_text().contains("alive"));
    assert_eq!(after.transport, Some(Transport::LINK_UNIX));
    let status = docker.link_hub().status_of("probe");
    assert_eq!(status.boot_id, boot, "PID 1 restarted");
    assert_eq!(status.connects, 1, "the link dropped: {status:?}");
    assert!(status.rejected_peers >= 1, "{status:?}");

    // The refused peer is in the audit log, with the agent's uid.
    let rejects: Vec<AuditRecord> = audit_records(&t)
        .into_iter()
        .filter(|r| r.tool == "security.link_reject")
        .collect();
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert!(
        rejects[0].args.contains(&"uid=1000".to_string()),
        "{rejects:?}"
    );
    assert_eq!(rejects[0].agent, "probe");
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn escaped_daemon_is_a_survivor_and_a_flood_is_capped_in_the_sandbox() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let config = t.config(&env, &[("tough", json!({}))]);
    let (gw, docker) = gateway_with(&t, &env, config).await;
    assert!(
        docker
            .link_hub()
            .wait_connected("tough", Duration::from_secs(5))
            .await
    );

    let out = exec_t(
        &gw,
        "tough",
        "setsid sleep 300 >/dev/null 2>&1 </dev/null & sleep 30",
        1,
    )
    .await;
    let text = out.joined_text();
    assert!(out.is_error, "{text}");
    assert!(text.contains("timed out after 1 s"), "{text}");
    assert!(text.contains("still running: pid "), "{text}");
    assert!(text.contains("`sleep 300`"), "{text}");
    assert_eq!(out.transport, Some(Transport::LINK_UNIX));
    let ps = exec_t(&gw, "tough", "ps -o pid,args | grep -c '[s]leep 300'", 10).await;
    assert!(ps.joined_text().contains('1'), "{}", ps.joined_text());

    // 1 GiB of output: the cap applies inside the sandbox, so the gateway never holds it.
    let before = rss_kib();
    let out = exec_t(
        &gw,
        "tough",
        "head -c 1073741824 /dev/zero | tr '\\0' a",
        120,
    )
    .await;
    let text = out.joined_text();
    let grown_mib = rss_kib().saturating_sub(before) / 1024;
    assert!(
        text.len() < 200 * 1024,
        "{} bytes reached the model",
        text.len()
    );
    assert!(
        text.contains("bytes omitted"),
        "{}",
        &text[..text.len().min(400)]
    );
    assert!(grown_mib < 64, "gateway memory grew by {grown_mib} MiB");
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn killed_pid_1_is_recreated_with_the_reason_and_the_link_returns() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let config = t.config(&env, &[("phoenix", json!({}))]);
    let (gw, docker) = gateway_with(&t, &env, config).await;
    let hub = docker.link_hub();
    assert!(hub.wait_connected("phoenix", Duration::from_secs(5)).await);
    let boot = hub.status_of("phoenix").boot_id;
    let name = docker.container_spec("phoenix").await.unwrap().name;
    docker
        .client()
        .kill_container(
            &name,
            Some(bollard::query_parameters::KillContainerOptions {
                signal: "SIGKILL".into(),
            }),
        )
        .await
        .unwrap();
    // The link notices PID 1 is gone.
    for _ in 0..100 {
        if !hub.is_connected("phoenix") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = exec_t(&gw, "phoenix", "echo back", 30).await;
    let text = out.joined_text();
    assert!(text.contains("The sandbox was restarted before this call because its container had stopped (exit code 137)"), "{text}");
    assert!(text.contains("back"), "{text}");
    let next = exec_t(&gw, "phoenix", "echo again", 30).await;
    assert_eq!(
        next.transport,
        Some(Transport::LINK_UNIX),
        "{}",
        next.joined_text()
    );
    assert_ne!(hub.status_of("phoenix").boot_id, boot);
    gw.shutdown().await.unwrap();
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// A scripted model (labelled as such: not a real model) that runs one `exec` and then
/// answers.
fn one_exec_model(command: &'static str) -> beige_core::llm::scripted::ScriptedProvider {
    use beige_core::llm::Block;
    beige_core::llm::scripted::ScriptedProvider::new("scripted")
        .then(move |_| {
            Ok(vec![Block::ToolUse {
                id: "t1".into(),
                name: "exec".into(),
                input: json!({ "command": command }),
            }])
        })
        .then(|_| {
            Ok(vec![Block::Text {
                text: "[scripted] done".into(),
            }])
        })
}

#[tokio::test]
async fn exec_output_streams_to_the_prompt_while_it_runs() {
    use beige_core::sandbox::OutputStream;
    use beige_core::AgentEvent;
    let env = docker_or_skip!();
    let t = TestHome::new();
    let mut config = t.config(
        &env,
        &[(
            "live",
            json!({"model": {"provider": "scripted", "model": "scripted"}}),
        )],
    );
    config.llm.providers =
        serde_json::from_value(json!({"scripted": {"api": "anthropic-messages"}})).unwrap();
    let docker = t.docker().await;
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(std::sync::Arc::new(docker.clone()))
        .provider(std::sync::Arc::new(one_exec_model(
            "echo one; sleep 1; echo two >&2; sleep 1; echo three",
        )))
        .build()
        .await
        .unwrap();
    assert!(
        docker
            .link_hub()
            .wait_connected("live", Duration::from_secs(5))
            .await
    );

    let mut stream = gw
        .prompt(beige_core::PromptRequest::new("live", "api:live:1", "go"))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    use futures_util::StreamExt as _;
    while let Some(e) = stream.next().await {
        seen.push((started.elapsed(), e));
    }
    let live: Vec<(Duration, OutputStream, String)> = seen
        .iter()
        .filter_map(|(at, e)| match e {
            AgentEvent::ToolOutput { id, stream, text } if id == "t1" => {
                Some((*at, *stream, text.clone()))
            }
            _ => None,
        })
        .collect();
    let finished_at = seen
        .iter()
        .find_map(|(at, e)| matches!(e, AgentEvent::ToolCallFinished { .. }).then_some(*at))
        .expect("the tool call finished");
    let text_of = |s: OutputStream| -> String {
        live.iter()
            .filter(|(_, st, _)| *st == s)
            .map(|(_, _, t)| t.as_str())
            .collect()
    };
    assert_eq!(text_of(OutputStream::Stdout), "one\nthree\n", "{seen:?}");
    assert_eq!(text_of(OutputStream::Stderr), "two\n", "{seen:?}");
    // "one" arrived while the command still had two seconds to run.
    let first = live.first().expect("live output").0;
    assert!(
        finished_at.saturating_sub(first) >= Duration::from_millis(1500),
        "first output at {first:?}, finished at {finished_at:?}"
    );
    // And the result the model sees is complete as before.
    let output = seen
        .iter()
        .find_map(|(_, e)| match e {
            AgentEvent::ToolCallFinished { output, .. } => Some(output.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(output, "Exit code: 0\none\nthree\ntwo");
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_root_sandbox_has_no_link_and_runs_through_docker_exec() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let config = t.config(&env, &[("boss", json!({"sandbox": {"user": "root"}}))]);
    let (gw, docker) = gateway_with(&t, &env, config).await;
    let out = exec_t(&gw, "boss", "id -u; grep CapEff /proc/self/status", 10).await;
    let text = out.joined_text();
    assert_eq!(out.transport, Some(Transport::DOCKER_EXEC), "{text}");
    assert!(text.contains("\n0\n"), "{text}");
    // Root keeps Docker's default set minus the dropped ones: not empty.
    assert!(!text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(!docker.link_hub().is_connected("boss"));
    assert!(!t.home.run_dir("boss").join("ctl.sock").exists());
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_agent_killing_all_its_processes_does_not_break_the_next_call() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let config = t.config(&env, &[("wild", json!({}))]);
    let (gw, docker) = gateway_with(&t, &env, config).await;
    assert!(
        docker
            .link_hub()
            .wait_connected("wild", Duration::from_secs(5))
            .await
    );
    // Every process of the agent's uid, this command itself included, and PID 1's
    // waiting child for the next op: forked when the quick call ended, while the
    // first one still sleeps.
    let (_, quick) = tokio::join!(
        exec_t(&gw, "wild", "sleep 1; kill -9 -1", 10),
        exec_t(&gw, "wild", "true", 10)
    );
    assert_eq!(quick.joined_text(), "Exit code: 0");
    for _ in 0..3 {
        let out = exec_t(&gw, "wild", "echo fine", 10).await;
        assert_eq!(out.joined_text(), "Exit code: 0\nfine", "{out:?}");
        assert_eq!(out.transport, Some(Transport::LINK_UNIX));
    }
    gw.shutdown().await.unwrap();
}

/// `sandbox_status` on Docker: the container's name, the link mode as applied (`off`
/// for a root sandbox whatever the config says), the health of a link that is up with a
/// keepalive measured for the answer, and no link for `off`.
#[tokio::test]
async fn sandbox_status_reports_each_link_mode_of_the_docker_backend() {
    use beige_core::config::LinkMode;
    use beige_core::Admin;
    let env = docker_or_skip!();
    let t = TestHome::new();
    let config = t.config(
        &env,
        &[
            ("u", json!({})),
            ("at", json!({"sandbox": {"link": "attach"}})),
            ("no", json!({"sandbox": {"link": "off"}})),
            ("r", json!({"sandbox": {"user": "root", "link": "attach"}})),
        ],
    );
    let (gw, docker) = gateway_with(&t, &env, config).await;
    for (agent, mode) in [("u", LinkMode::Unix), ("at", LinkMode::Attach)] {
        assert!(
            docker
                .link_hub()
                .wait_connected(agent, Duration::from_secs(5))
                .await,
            "{agent}"
        );
        let s = gw.sandbox_status(agent).await.unwrap();
        assert_eq!(s.agent, agent);
        assert_eq!(
            s.container,
            format!("beige-{agent}-{}", t.installation.short())
        );
        assert_eq!(s.link_mode, mode);
        let link = s.link.unwrap();
        assert!(link.connected, "{link:?}");
        assert!(s.ping_us.is_some(), "no keepalive measured for {agent}");
    }
    for agent in ["no", "r"] {
        let s = gw.sandbox_status(agent).await.unwrap();
        assert_eq!(
            (s.link_mode, s.link, s.ping_us),
            (LinkMode::Off, None, None),
            "{agent}"
        );
        assert_eq!(
            s.container,
            docker.container_spec(agent).await.unwrap().name
        );
    }
    gw.shutdown().await.unwrap();
}
