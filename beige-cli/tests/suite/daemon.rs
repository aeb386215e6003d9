//! The gateway daemon end to end, through the built binary: `setup` → `gateway start` →
//! `status` → `run` against a fake provider → `exec` → `gateway restart` (the session
//! survives) → failures of `run` → `gateway stop` → nothing left behind. Plus a restart
//! with a broken config, and the commands' answers when no gateway runs.
//!
//! Docker tests skip outside CI with a printed reason when the engine, the test image
//! or the static shim is missing.

use std::path::Path;

use beige_core::home::BeigeHome;
use beige_testkit::anthropic::{error_reply, text_response};
use beige_testkit::llm::FakeLlmServer;
use serde_json::Value;

use super::{containers_of, free_port, Run, TestEnv};
use crate::docker_or_skip;

/// Run the binary from an async test.
pub(super) fn beige(env: &TestEnv, args: &[&str]) -> Run {
    tokio::task::block_in_place(|| env.run(args))
}

/// Stops the daemon of a test home when dropped (also when the test panicked) and
/// removes its containers.
pub(super) struct DaemonGuard<'a>(pub(super) &'a TestEnv);

impl Drop for DaemonGuard<'_> {
    fn drop(&mut self) {
        if self.0.home().join("gateway.pid").exists() {
            let _ = self.0.run(&["gateway", "stop"]);
        }
        let Ok(Some(id)) = BeigeHome::new(self.0.home()).read_installation_id() else {
            return;
        };
        if let Ok(out) = std::process::Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=io.beige.installation={id}"),
            ])
            .output()
        {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(&ids)
                    .output();
            }
        }
    }
}

/// The installation id `beige setup` made in the test home.
fn installation_of(env: &TestEnv) -> beige_core::home::InstallationId {
    BeigeHome::new(env.home())
        .read_installation_id()
        .unwrap()
        .expect("beige setup makes installation.id")
}

fn write_config(home: &Path, provider_url: &str, port: u16, image: &str) {
    let config = format!(
        r#"// written by the daemon test
{{
  llm: {{ providers: {{ anthropic: {{ apiKey: "sk-test-daemon", baseUrl: "{provider_url}" }} }} }},
  plugins: {{ kv: {{}} }},
  agents: {{
    a1: {{
      model: {{ provider: "anthropic", model: "claude-sonnet-4-6" }},
      tools: ["kv"],
      sandbox: {{ image: "{image}", memoryLimit: "256m", pidsLimit: 128 }},
    }},
  }},
  gateway: {{ host: "127.0.0.1", port: {port} }},
}}
"#
    );
    std::fs::write(home.join("config.json5"), config).unwrap();
}

/// Every text of a Messages request body, in order.
fn texts(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        match &m["content"] {
            Value::String(s) => out.push(s.clone()),
            Value::Array(blocks) => {
                for b in blocks {
                    if let Some(t) = b["text"].as_str() {
                        out.push(t.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn daemon_round_trip() {
    let docker = docker_or_skip!();
    let fake = FakeLlmServer::start().await;
    fake.push(text_response("Hello from the fake model."));
    fake.push(text_response("Yes: you said hi."));
    let env = TestEnv::new();
    let _guard = DaemonGuard(&env);
    let run = beige(&env, &["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let port = free_port();
    write_config(&env.home(), &fake.url(), port, &docker.image);

    let run = beige(&env, &["gateway", "start", "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("Gateway running (PID"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!("http://127.0.0.1:{port}")),
        "{}",
        run.stdout
    );
    // The pid file is the original's: the pid and a newline, so that
    // `kill "$(cat gateway.pid)"` works; the URL is kept beside it.
    let pid_text = std::fs::read_to_string(env.home().join("gateway.pid")).unwrap();
    let digits = pid_text.strip_suffix('\n').unwrap_or_default();
    assert!(
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
        "gateway.pid holds {pid_text:?}"
    );
    assert_eq!(
        std::fs::read_to_string(env.home().join("run/gateway.url")).unwrap(),
        format!("http://127.0.0.1:{port}\n")
    );

    // A second start sees the running daemon.
    let run = beige(&env, &["gateway", "start"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("already running"), "{}", run.stdout);

    let run = beige(&env, &["gateway", "status"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.starts_with("Gateway: running"), "{}", run.stdout);
    assert!(
        run.stdout.contains("a1: anthropic/claude-sonnet-4-6"),
        "{}",
        run.stdout
    );

    let run = beige(&env, &["run", "a1", "hi", "--session", "cli:a1:test"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "Hello from the fake model.\n");
    let first = fake.last_request().unwrap();
    assert_eq!(first.header("x-api-key"), Some("sk-test-daemon"));

    let run = beige(&env, &["exec", "a1", "--", "ls", "/workspace"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("AGENTS.md"), "{}", run.stdout);
    let run = beige(
        &env,
        &["exec", "a1", "--", "kv set k v && kv get k && exit 7"],
    );
    assert_eq!(run.code, Some(7), "{}", run.stderr);
    assert_eq!(run.stdout, "v\n");

    let run = beige(&env, &["gateway", "restart"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("restarted"), "{}", run.stdout);
    assert!(run.stdout.contains("reattached"), "{}", run.stdout);

    // The same session key continues the same conversation after the restart.
    let run = beige(
        &env,
        &["run", "a1", "do you remember?", "--session", "cli:a1:test"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "Yes: you said hi.\n");
    let seen = texts(&fake.last_request().unwrap().body);
    assert_eq!(
        seen,
        vec!["hi", "Hello from the fake model.", "do you remember?"],
        "{seen:?}"
    );

    let run = beige(&env, &["sessions", "a1"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("cli:a1:test"), "{}", run.stdout);

    let run = beige(&env, &["run", "nobody", "hi"]);
    assert_eq!(run.code, Some(4), "{}", run.stderr);
    assert!(run.stderr.contains("no agent 'nobody'"), "{}", run.stderr);
    assert!(run.stderr.contains("Known agents: a1"), "{}", run.stderr);

    fake.push(error_reply(
        401,
        "authentication_error",
        "invalid x-api-key",
    ));
    let run = beige(&env, &["run", "a1", "hi"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("hint: The provider rejected the API key"),
        "{}",
        run.stderr
    );

    fake.push(error_reply(429, "rate_limit_error", "slow down").header("retry-after", "30"));
    let run = beige(&env, &["run", "a1", "hi"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("hint: The model's provider is rate-limiting"),
        "{}",
        run.stderr
    );

    let run = beige(&env, &["gateway", "stop"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("Gateway stopped."), "{}", run.stdout);

    let run = beige(&env, &["gateway", "status"]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(
        run.stdout
            .contains("not running — start it with `beige gateway start`"),
        "{}",
        run.stdout
    );
    assert!(!env.home().join("gateway.pid").exists());
    assert_eq!(
        containers_of(installation_of(&env).as_str()).await,
        Vec::<String>::new()
    );

    let run = beige(&env, &["run", "a1", "hi"]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(
        run.stderr.contains("start it with `beige gateway start`"),
        "{}",
        run.stderr
    );

    let log = std::fs::read_to_string(env.home().join("logs/gateway.log")).unwrap();
    assert!(
        !log.contains("sk-test-daemon"),
        "the API key leaked into the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_with_a_broken_config_keeps_serving() {
    let docker = docker_or_skip!();
    let env = TestEnv::new();
    let _guard = DaemonGuard(&env);
    assert_eq!(beige(&env, &["setup"]).code, Some(0));
    write_config(
        &env.home(),
        "http://127.0.0.1:9",
        free_port(),
        &docker.image,
    );
    let run = beige(&env, &["gateway", "start", "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);

    let config = env.home().join("config.json5");
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        good.replace("memoryLimit: \"256m\"", "memoryLimit: \"lots\""),
    )
    .unwrap();
    let run = beige(&env, &["gateway", "restart"]);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("the gateway keeps running with its previous config"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("agents.a1.sandbox.memoryLimit"),
        "{}",
        run.stderr
    );

    // Still serving, with the old config.
    let run = beige(&env, &["exec", "a1", "--", "echo", "still here"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "still here\n");
    assert_eq!(beige(&env, &["gateway", "status"]).code, Some(0));

    // A tool the build cannot resolve fails after the load: the old config comes back.
    std::fs::write(&config, good.replace("tools: [\"kv\"]", "tools: [\"kvv\"]")).unwrap();
    let run = beige(&env, &["gateway", "restart"]);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("unknown tool 'kvv'"), "{}", run.stderr);
    let run = beige(&env, &["exec", "a1", "--", "kv set a 1 && kv get a"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "1\n");

    let run = beige(&env, &["gateway", "stop"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!env.home().join("gateway.pid").exists());
}

#[test]
fn commands_say_when_no_gateway_runs() {
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let url = format!("http://127.0.0.1:{}", free_port());

    let run = env.run(&["-g", &url, "run", "assistant", "hello"]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        format!("the gateway is not running (nothing answers at {url}) — start it with `beige gateway start`\n")
    );
    let run = env.run(&["-g", &url, "exec", "assistant", "--", "ls"]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    let run = env.run(&["-g", &url, "gateway", "restart"]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);

    let run = env.run(&["-g", &url, "gateway", "status"]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        "Gateway: stopped\nnot running — start it with `beige gateway start`\n"
    );

    let run = env.run(&["gateway", "stop"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("not running"), "{}", run.stdout);

    // A pid file of a process that is gone is stale: stop and status say so and clean up.
    std::fs::write(env.home().join("gateway.pid"), "999999999\n").unwrap();
    let run = env.run(&["-g", &url, "gateway", "status"]);
    assert_eq!(run.code, Some(3), "{}", run.stderr);
    assert!(run.stdout.contains("stale pid file"), "{}", run.stdout);
    let run = env.run(&["gateway", "stop"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout.contains("removed the stale pid file"),
        "{}",
        run.stdout
    );
    assert!(!env.home().join("gateway.pid").exists());

    let run = env.run(&["gateway", "logs"]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("no gateway log"), "{}", run.stderr);
}

#[test]
fn usage_errors_exit_2() {
    let env = TestEnv::new();
    let run = env.run(&["run", "assistant"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let run = env.run(&["exec", "assistant"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let run = env.run(&["gateway", "start", "--timeout", "-3"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
}

/// Whether the process `pid` is gone (or a zombie nobody reaped yet).
fn process_gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .map(|rest| rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
    }
}

/// The audit lines the restarted gateway wrote for results of a previous one.
fn recovered_records(home: &Path) -> Vec<Value> {
    std::fs::read_to_string(home.join("logs/audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["args"][0] == "recovered-after-restart")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_killed_mid_exec_gets_the_result_once_after_restart() {
    let docker = docker_or_skip!();
    let fake = FakeLlmServer::start().await;
    let env = TestEnv::new();
    let _guard = DaemonGuard(&env);
    let run = beige(&env, &["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    write_config(&env.home(), &fake.url(), free_port(), &docker.image);
    let run = beige(&env, &["gateway", "start", "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);

    // A 5 s exec that prints, through the daemon; the daemon is SIGKILLed 1.5 s in.
    let mut client = env
        .command(&[
            "exec",
            "a1",
            "--",
            "for i in 1 2 3 4 5; do echo line$i; sleep 1; done",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let pid = std::fs::read_to_string(env.home().join("gateway.pid")).unwrap();
    let pid = pid.lines().next().unwrap().trim().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    for _ in 0..100 {
        if process_gone(&pid) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(process_gone(&pid), "the daemon survived SIGKILL");
    let _ = tokio::task::block_in_place(|| client.wait());
    // Let the command finish while no gateway runs: its result waits in PID 1.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(recovered_records(&env.home()).is_empty());

    let run = beige(&env, &["gateway", "start", "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let mut records = Vec::new();
    for _ in 0..100 {
        records = recovered_records(&env.home());
        if !records.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert_eq!(r["tool"], "exec");
    assert_eq!(r["agent"], "a1");
    assert_eq!(r["exitCode"], 0, "{r}");
    assert_eq!(r["outputBytes"], 30, "line1..line5: {r}");
    // The restarted gateway reattached the same container and its link is up: the
    // result is not delivered again, and a new exec goes over the link.
    let run = beige(&env, &["exec", "a1", "--", "echo", "after"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("after"), "{}", run.stdout);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(recovered_records(&env.home()).len(), 1);
    let run = beige(&env, &["gateway", "stop"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

/// `gateway.log` is rotated by size while the daemon runs (not only at start), keeping
/// `gateway.log.maxFiles` files and the original layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_daemon_rotates_its_log_by_size_while_it_runs() {
    let docker = docker_or_skip!();
    let env = TestEnv::new();
    let _guard = DaemonGuard(&env);
    assert_eq!(beige(&env, &["setup"]).code, Some(0));
    let port = free_port();
    write_config(&env.home(), "http://127.0.0.1:9", port, &docker.image);
    let config = env.home().join("config.json5");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace(
            &format!("gateway: {{ host: \"127.0.0.1\", port: {port} }}"),
            &format!("gateway: {{ host: \"127.0.0.1\", port: {port}, log: {{ maxSizeBytes: 4000, maxFiles: 2 }} }}"),
        ),
    )
    .unwrap();
    let run = beige(&env, &["gateway", "start", "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    // Every call leaves audit lines in the gateway log: far more than 3 × 4000 bytes.
    let run = beige(
        &env,
        &[
            "exec",
            "a1",
            "--",
            "for i in $(seq 1 60); do kv set key$i value$i; done; echo ok",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let logs = env.home().join("logs");
    let log = logs.join("gateway.log");
    let current = std::fs::read_to_string(&log).unwrap();
    assert!(current.len() <= 4000, "{} bytes", current.len());
    assert!(current.contains("kv set key"), "{current}");
    for old in ["gateway.log.1", "gateway.log.2"] {
        let text = std::fs::read_to_string(logs.join(old)).unwrap();
        assert!(text.len() <= 4000, "{old}: {} bytes", text.len());
        assert!(text.ends_with('\n'), "{old} ends mid-line");
    }
    assert!(!logs.join("gateway.log.3").exists());
    // The daemon still answers and logs to the current file.
    let run = beige(&env, &["exec", "a1", "--", "kv get key60"]);
    assert_eq!(run.stdout, "value60\n", "{}", run.stderr);
    let run = beige(&env, &["gateway", "stop"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let last = std::fs::read_to_string(&log).unwrap();
    assert!(
        last.contains("kv get key60") || last.contains("stopp"),
        "{last}"
    );
}
