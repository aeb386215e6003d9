//! A hostile workspace (issue 13, attacks 1, 2, 3 and 7): everything here is done from
//! inside a real sandbox, as the agent, against the real Docker engine, with the gateway
//! using the workspace the way it does in production — the per-prompt read of
//! `AGENTS.md`, the seeding of `AGENTS.md` at start, command tools run in a caller's
//! working directory. The model is a fake provider server speaking the Anthropic wire
//! format on loopback; what it receives is what would leave the host.
//!
//! Each test asserts that nothing of the host (canary files, the gateway's environment,
//! its API token) reaches the model or the sandbox, that nothing outside the workspace is
//! written, and that the gateway keeps answering.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext, ToolOutput};
use beige_core::config::Config;
use beige_core::Admin as _;
use beige_core::AgentEvent;
use beige_core::{Gateway, LocalGateway, PromptRequest};
use beige_testkit::anthropic::text_response;
use beige_testkit::llm::FakeLlmServer;
use serde_json::json;

use super::sandbox_docker::exec;
use super::support::{DockerEnv, TestHome};
use crate::docker_or_skip;

/// Set in the gateway's environment at run time (each test is its own process under
/// nextest); `/proc/self/environ` shows only the start-up environment, which is why
/// `assert_nothing_of_the_host_in` also looks for a variable from that.
const ENV_CANARY: &str = "BEIGE_HOSTILE_ENV_CANARY=env-canary-7f3a9c";
const TOKEN_CANARY: &str = "token-canary-51d0e2";
const FILE_CANARY: &str = "host-file-canary-c4b8";

fn config(env: &DockerEnv, server: &FakeLlmServer, agent: serde_json::Value) -> Config {
    let mut a = json!({
        "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
        "tools": [],
        "sandbox": {"image": env.image, "memoryLimit": "256m", "pidsLimit": 128},
    });
    if let (Some(o), serde_json::Value::Object(extra)) = (a.as_object_mut(), agent) {
        o.extend(extra);
    }
    serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-hostile-0123456789", "baseUrl": server.url()}}},
        "agents": {"a": a},
    }))
    .unwrap()
}

async fn gateway(t: &TestHome, env: &DockerEnv, config: Config) -> LocalGateway {
    t.gateway(env, config).await
}

/// `exec` with a longer time limit than `sandbox_docker::exec`'s 30 s.
async fn exec_long(gw: &LocalGateway, command: String, timeout: u64) -> ToolOutput {
    gw.call_tool(
        "a",
        CoreToolCall::Exec(ExecParams {
            command,
            timeout: Some(timeout),
        }),
        ToolContext::default(),
    )
    .await
    .unwrap()
}

/// Host files the workspace must never reach: a canary file beside the home, the API
/// token in the home, and the gateway's environment.
fn plant_host_canaries(t: &TestHome) -> PathBuf {
    let (k, v) = ENV_CANARY.split_once('=').unwrap();
    std::env::set_var(k, v);
    std::fs::create_dir_all(t.home.root()).unwrap();
    std::fs::write(t.home.root().join("gateway.token"), TOKEN_CANARY).unwrap();
    let canary = t.dir.path().join("bashrc");
    std::fs::write(&canary, FILE_CANARY).unwrap();
    canary
}

/// Run one prompt to its end (bounded, so a gateway that hangs fails the test).
async fn prompt(gw: &LocalGateway, text: &str) -> Vec<AgentEvent> {
    tokio::time::timeout(Duration::from_secs(60), async {
        gw.prompt(PromptRequest::new("a", "api:a:default", text))
            .await
            .unwrap()
            .collect_all()
            .await
    })
    .await
    .expect("the prompt did not finish: the gateway is stuck on the workspace")
}

fn assert_nothing_of_the_host_in(what: &str, text: &str) {
    let env_value = ENV_CANARY.split_once('=').unwrap().1;
    // `CARGO_MANIFEST_DIR=` is in the environment the test process (the gateway) was
    // started with, so in its /proc/self/environ; the canary set at run time is not.
    for secret in [
        env_value,
        TOKEN_CANARY,
        FILE_CANARY,
        "sk-ant-hostile",
        "CARGO_MANIFEST_DIR=",
    ] {
        assert!(
            !text.contains(secret),
            "{what} contains {secret:?}: {}",
            &text[..text.len().min(2000)]
        );
    }
}

#[tokio::test]
async fn agents_md_links_fifos_and_giants_never_reach_the_model() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let canary = plant_host_canaries(&t);
    let server = FakeLlmServer::start().await;
    let gw = gateway(&t, &env, config(&env, &server, json!({}))).await;
    let token = t.home.root().join("gateway.token");
    let ws = gw.config().agent_workspace(&t.home, "a");

    // What an attacker inside plants, one after the other: links to the gateway's
    // environment, its token, a host file, a host directory, a dangling link, a FIFO and
    // a 20 MB file, each named AGENTS.md (the host path of the workspace is in
    // /proc/self/mountinfo; the test knows it anyway).
    let plants = [
        "ln -sf /proc/self/environ AGENTS.md".to_string(),
        format!("ln -sf {} AGENTS.md", token.display()),
        format!("ln -sf {} AGENTS.md", canary.display()),
        format!("ln -sf {} AGENTS.md", canary.parent().unwrap().display()),
        "ln -sf /nonexistent/file AGENTS.md".to_string(),
        "mkfifo AGENTS.md".to_string(),
        "dd if=/dev/zero bs=1048576 count=20 2>/dev/null | tr '\\0' x > AGENTS.md".to_string(),
    ];
    for plant in &plants {
        let out = exec(
            &gw,
            "a",
            &format!("cd /workspace && rm -rf AGENTS.md && {plant} && ls -la AGENTS.md"),
        )
        .await;
        assert!(!out.is_error, "{plant}: {}", out.joined_text());
        server.push(text_response("ok"));
        let started = Instant::now();
        let events = prompt(&gw, "hello").await;
        assert!(
            events.iter().any(|e| matches!(e, AgentEvent::Done { .. })),
            "{plant}: {events:?}"
        );
        let request = server.last_request().unwrap();
        let body = request.body.to_string();
        assert_nothing_of_the_host_in(plant, &body);
        assert!(
            body.len() < 200 * 1024,
            "{plant}: a {}-byte request",
            body.len()
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{plant}: {:?}",
            started.elapsed()
        );
    }
    // The giant is capped with a note, not dropped.
    let body = server.last_request().unwrap().body.to_string();
    assert!(
        body.contains("only the first 65536 are shown"),
        "{}",
        &body[..500]
    );
    // And a plain AGENTS.md still works.
    exec(
        &gw,
        "a",
        "cd /workspace && rm -f AGENTS.md && echo 'use tabs, not spaces' > AGENTS.md",
    )
    .await;
    server.push(text_response("ok"));
    prompt(&gw, "hello").await;
    assert!(server
        .last_request()
        .unwrap()
        .body
        .to_string()
        .contains("use tabs, not spaces"));
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), FILE_CANARY);
    assert!(ws.join("AGENTS.md").is_file());
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn seeding_agents_md_at_restart_never_writes_through_a_planted_link() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let canary = plant_host_canaries(&t);
    let created = t.dir.path().join("created-by-gateway");
    let server = FakeLlmServer::start().await;
    let gw = gateway(&t, &env, config(&env, &server, json!({}))).await;
    // The old temporary name, and every other name nearby, made links to host files.
    let cmd = format!(
        "cd /workspace && rm -f AGENTS.md && ln -s {c} .AGENTS.md.beige-tmp && ln -s {c} .AGENTS.md.tmp && ln -s {n} AGENTS.md.new && ls -la",
        c = canary.display(),
        n = created.display()
    );
    let out = exec(&gw, "a", &cmd).await;
    assert!(!out.is_error, "{}", out.joined_text());
    gw.stop(true).await.unwrap();
    // `beige gateway restart`: a new gateway on the same home seeds AGENTS.md again.
    let gw = gateway(&t, &env, config(&env, &server, json!({}))).await;
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), FILE_CANARY);
    assert!(!created.exists());
    let ws = gw.config().agent_workspace(&t.home, "a");
    let seeded = std::fs::symlink_metadata(ws.join("AGENTS.md")).unwrap();
    assert!(seeded.is_file(), "{seeded:?}");
    // A dangling link named AGENTS.md is left alone, and nothing is created at its target.
    let out = exec(
        &gw,
        "a",
        &format!(
            "cd /workspace && rm -f AGENTS.md && ln -s {} AGENTS.md",
            created.display()
        ),
    )
    .await;
    assert!(!out.is_error, "{}", out.joined_text());
    gw.stop(true).await.unwrap();
    let gw = gateway(&t, &env, config(&env, &server, json!({}))).await;
    assert!(!created.exists());
    assert!(std::fs::symlink_metadata(ws.join("AGENTS.md"))
        .unwrap()
        .file_type()
        .is_symlink());
    gw.shutdown().await.unwrap();
}

/// A command-tool plugin folder: `ls -1` in the caller's working directory.
fn lister(dir: &Path) -> PathBuf {
    let p = dir.join("lister");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(
        p.join("plugin.json"),
        r#"{"name": "lister", "tools": {"lister": {"command": "ls", "args": ["-1a"], "allow": [""]}}}"#,
    )
    .unwrap();
    p
}

#[tokio::test]
async fn a_command_tools_working_directory_cannot_be_swapped_for_a_link() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let outside = t.dir.path().join("outside-repo");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("HOST-ONLY-FILE"), FILE_CANARY).unwrap();
    let server = FakeLlmServer::start().await;
    let mut config = config(&env, &server, json!({"tools": ["lister"]}));
    config.plugins =
        serde_json::from_value(json!({"lister": {"path": lister(t.dir.path())}})).unwrap();
    let gw = gateway(&t, &env, config).await;
    // Inside: one process swaps /workspace/d between a real folder and a link to a host
    // folder (a path only the host resolves) as fast as it can, while another calls the
    // tool 300 times from inside d.
    let script = format!(
        r#"cd /workspace && mkdir -p d && touch d/inside-file
( end=$(( $(date +%s) + 60 )); while [ $(date +%s) -lt $end ]; do mv d d.real; ln -s {o} d; rm d; mv d.real d; done ) &
swapper=$!
hits=0; ok=0; refused=0
for i in $(seq 300); do
  out=$(cd /workspace/d 2>/dev/null && lister 2>&1)
  case "$out" in
    *HOST-ONLY-FILE*) hits=$((hits+1));;
    *inside-file*) ok=$((ok+1));;
    *) refused=$((refused+1));;
  esac
done
kill $swapper; wait $swapper 2>/dev/null
mv d.real d 2>/dev/null; true
echo "hits=$hits ok=$ok refused=$refused""#,
        o = outside.display()
    );
    let out = exec_long(&gw, script, 120).await;
    let text = out.joined_text();
    assert!(text.contains("hits=0 "), "{text}");
    let ok: u32 = text
        .split("ok=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(ok > 0, "the tool never ran in the real folder: {text}");
    // The gateway and the sandbox can still talk.
    let out = exec(&gw, "a", "echo alive").await;
    assert!(out.joined_text().contains("alive"));
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn no_shipped_example_runs_a_program_the_workspace_configures() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let marker = t.dir.path().join("host-command-ran");
    let server = FakeLlmServer::start().await;
    // Every example plugin that declares command tools, with every usage line it documents.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/plugins");
    let mut plugins = serde_json::Map::new();
    let mut calls: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(&examples).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(dir.join("plugin.json")) else {
            continue;
        };
        let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
        let Some(tools) = manifest["tools"].as_object() else {
            continue;
        };
        plugins.insert(
            manifest["name"].as_str().unwrap().to_string(),
            json!({"path": dir}),
        );
        for (name, tool) in tools {
            let usages: Vec<String> = tool["commands"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .filter_map(|u| u.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            calls.push(name.clone());
            calls.extend(usages.into_iter().map(|u| u.replace(['<', '>'], "")));
        }
    }
    assert!(
        !calls.is_empty(),
        "no command-tool examples found in {}",
        examples.display()
    );
    std::env::set_var("BEIGE_OPERATOR_NOTES", t.dir.path().join("notes.txt"));
    let tools: Vec<String> = plugins.keys().cloned().collect();
    // A root sandbox: the files the agent writes belong to the gateway's user (root here),
    // as they do for an ordinary gateway user in the docker group — so programs such as
    // git, which refuse repositories of other users, do not refuse this one.
    let mut config = config(
        &env,
        &server,
        json!({"tools": tools, "sandbox": {"image": env.image, "memoryLimit": "256m", "user": "root"}}),
    );
    config.plugins = serde_json::from_value(serde_json::Value::Object(plugins)).unwrap();
    let gw = gateway(&t, &env, config).await;
    // A repository with one commit (made here: the busybox sandbox has no git; the agent
    // could as well have written these files itself) ...
    let ws = gw.config().agent_workspace(&t.home, "a");
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(&ws)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(ws.join("f.txt"), "one\n").unwrap();
    git(&["add", "f.txt"]);
    git(&["commit", "-qm", "init"]);
    // ... whose config and attributes the agent then rewrites from inside, naming a
    // program for git (and for anything else that reads its working directory) to run.
    let plant = format!(
        r#"cd /workspace && echo two >> f.txt && mkdir -p .git/info && printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch {m}\n\thooksPath = .\n[diff "x"]\n\tcommand = touch {m}\n[filter "x"]\n\tclean = touch {m}\n' >> .git/config
echo '* diff=x filter=x' > .gitattributes; cp .gitattributes .git/info/attributes
printf 'all:\n\ttouch {m}\n' > Makefile; printf '{{"scripts":{{"preinstall":"touch {m}"}}}}' > package.json
echo ok"#,
        m = marker.display()
    );
    let out = exec(&gw, "a", &plant).await;
    assert!(!out.is_error, "{}", out.joined_text());
    for call in &calls {
        let out = exec(&gw, "a", &format!("cd /workspace && {call}; echo rc=$?")).await;
        assert!(
            out.joined_text().contains("rc="),
            "{call}: {}",
            out.joined_text()
        );
    }
    assert!(
        !marker.exists(),
        "a host command ran from the workspace's config"
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_hostile_workspace_in_a_loop_of_swaps_reaches_nothing_and_stalls_nothing() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let canary = plant_host_canaries(&t);
    let outside = t.dir.path().join("outside-dir");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("HOST-ONLY-FILE"), FILE_CANARY).unwrap();
    let server = FakeLlmServer::start().await;
    let mut config = config(&env, &server, json!({"tools": ["lister"]}));
    config.plugins =
        serde_json::from_value(json!({"lister": {"path": lister(t.dir.path())}})).unwrap();
    let gw = Arc::new(gateway(&t, &env, config).await);
    let ws = gw.config().agent_workspace(&t.home, "a");
    let listing = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing(t.dir.path());

    // Device nodes cannot be made inside (no CAP_MKNOD), nor sockets by busybox: the
    // host makes them, as root, for the agent to link wherever it likes.
    for (name, major, minor) in [("dev-null", "1", "3"), ("dev-zero", "1", "5")] {
        let _ = std::process::Command::new("mknod")
            .args(["-m", "666"])
            .arg(ws.join(name))
            .args(["c", major, minor])
            .status();
    }
    let _listener = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    std::fs::set_permissions(
        ws.join("sock"),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    // Inside: every path the gateway touches (AGENTS.md, its old temporary name, a
    // command tool's working directory) cycles through links to files, folders,
    // /proc/self/*, dangling targets, FIFOs, sockets, devices and a huge file.
    let swapper = format!(
        r#"cd /workspace && dd if=/dev/zero bs=1048576 count=8 2>/dev/null | tr '\0' x > huge
end=$(( $(date +%s) + 40 ))
while [ $(date +%s) -lt $end ]; do
  for t in /proc/self/environ /proc/self/mem /proc/1/root/etc/passwd {c} {o} {tok} /nonexistent fifo sock dev-null dev-zero huge dir; do
    rm -rf AGENTS.md .AGENTS.md.beige-tmp d
    case $t in
      fifo) mkfifo AGENTS.md; mkfifo d;;
      sock|dev-null|dev-zero) ln $t AGENTS.md; ln $t d;;
      huge) ln huge AGENTS.md;;
      dir) mkdir AGENTS.md d; touch d/inside-file;;
      *) ln -s $t AGENTS.md; ln -s $t .AGENTS.md.beige-tmp; ln -s $t d;;
    esac
  done
done
echo swapped"#,
        c = canary.display(),
        o = outside.display(),
        tok = t.home.root().join("gateway.token").display()
    );
    let gw2 = gw.clone();
    let swapping = tokio::spawn(async move { exec_long(&gw2, swapper, 90).await });
    // Meanwhile: prompts (AGENTS.md read), tool calls from inside (working directory),
    // and the gateway's own answers, each bounded in time.
    let mut prompts = 0;
    let deadline = Instant::now() + Duration::from_secs(35);
    while Instant::now() < deadline {
        server.push(text_response("ok"));
        let started = Instant::now();
        let events = prompt(&gw, "hello").await;
        assert!(
            events.iter().any(|e| matches!(e, AgentEvent::Done { .. })),
            "{events:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "a prompt took {:?}",
            started.elapsed()
        );
        prompts += 1;
        let out = exec(
            &gw,
            "a",
            "cd /workspace/d 2>/dev/null && lister 2>&1; echo rc=$?",
        )
        .await;
        assert_nothing_of_the_host_in("a tool's output", &out.joined_text());
        assert!(
            !out.joined_text().contains("HOST-ONLY-FILE"),
            "{}",
            out.joined_text()
        );
        let health = tokio::time::timeout(Duration::from_secs(5), gw.health()).await;
        assert!(health.is_ok(), "health did not answer");
    }
    let swapped = swapping.await.unwrap();
    assert!(
        swapped.joined_text().contains("swapped"),
        "{}",
        swapped.joined_text()
    );
    assert!(prompts >= 3, "only {prompts} prompts in 35 s");
    for request in server.requests() {
        let body = request.body.to_string();
        assert_nothing_of_the_host_in("a model request", &body);
        assert!(body.len() < 200 * 1024, "a {}-byte request", body.len());
    }
    // Nothing outside the workspace was written or created.
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), FILE_CANARY);
    assert_eq!(
        std::fs::read_to_string(t.home.root().join("gateway.token")).unwrap(),
        TOKEN_CANARY
    );
    assert_eq!(before, listing(t.dir.path()));
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    Arc::try_unwrap(gw).ok().unwrap().shutdown().await.unwrap();
}
