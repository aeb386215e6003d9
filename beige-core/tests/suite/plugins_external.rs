//! Plugins for the `beige` binary: the Python example plugin (an external plugin over
//! JSON-RPC) in a real sandbox and behind the agent loop, supervision (crash → restart,
//! a plugin that never answers), the git command-tool example and the `configSchema`
//! check at startup. The installer (`beige plugins install|update|remove`) lives in
//! beige-cli and is tested there.
//!
//! Until the gateway builds plugins from `config.plugins` itself, these tests make them
//! with `plugin::load` and hand them over with `GatewayBuilder::plugin`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use beige_core::config::Config;
use beige_core::plugin::external::{ExternalPlugin, PluginStatus};
use beige_core::plugin::Plugin;
use beige_core::plugin::{load_plugin_dir, load_plugins};
use beige_core::AgentEvent;
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway, PromptRequest};
use beige_protocol::socket::{ToolRequest, ToolResponse};
use beige_testkit::anthropic::text_response;
use beige_testkit::llm::FakeLlmServer;
use serde_json::json;

use super::sandbox_docker::exec;
use super::support::TestHome;
use crate::docker_or_skip;
use beige_core::testing::MemorySandbox;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/plugins")
        .canonicalize()
        .unwrap()
}

fn audit(home: &BeigeHome) -> Vec<serde_json::Value> {
    std::fs::read_to_string(home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| !beige_core::audit::chain::is_chain_record(v))
        .collect()
}

/// A config for one agent `a` using `providers` and `plugins`, made from JSON.
fn config(
    providers: serde_json::Value,
    plugins: serde_json::Value,
    agent: serde_json::Value,
) -> Config {
    let mut a = json!({
        "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
        "tools": [],
        "sandbox": {"image": super::support::test_image(), "memoryLimit": "256m"},
    });
    if let (Some(o), serde_json::Value::Object(extra)) = (a.as_object_mut(), agent) {
        o.extend(extra);
    }
    serde_json::from_value(json!({
        "llm": {"providers": providers},
        "plugins": plugins,
        "agents": {"a": a},
    }))
    .unwrap()
}

fn anthropic() -> serde_json::Value {
    json!({"anthropic": {"apiKey": "sk-ant-test-0123456789"}})
}

/// A gateway on the labelled `MemorySandbox` with `plugins` handed over explicitly.
async fn fake_gateway(
    home: &BeigeHome,
    config: Config,
    plugins: Vec<Arc<dyn Plugin>>,
) -> Option<LocalGateway> {
    let mut b = GatewayBuilder::new(config, home.clone()).sandbox(Arc::new(MemorySandbox::new()));
    for p in plugins {
        b = b.plugin(p);
    }
    Some(b.build().await.unwrap())
}

async fn call(gw: &LocalGateway, tool: &str, args: &[&str], cwd: Option<&str>) -> ToolResponse {
    let mut request = ToolRequest::new(tool, args.iter().map(|s| s.to_string()).collect());
    request.cwd = cwd.map(str::to_string);
    gw.handle_tool_request("a", request).await
}

fn text(r: &ToolResponse) -> String {
    r.output.clone().or(r.error.clone()).unwrap_or_default()
}

/// The notes example, loaded straight from `examples/plugins/python-notes`.
fn notes_config(agent: serde_json::Value) -> Config {
    config(
        anthropic(),
        json!({"notes": {"path": examples().join("python-notes"), "config": {"maxNotes": 100, "label": "base"}}}),
        agent,
    )
}

async fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---- the Python example in a real sandbox ----

#[tokio::test]
async fn python_notes_plugin_is_a_command_in_a_real_sandbox() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    std::fs::create_dir_all(t.home.root()).unwrap();
    let config_path = t.home.config_path();
    // Where `beige plugins install <examples>/python-notes` puts it, with the entry it
    // writes.
    let source = examples().join("python-notes");
    let plugin_dir = t.home.plugins_dir().join("notes");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    for file in std::fs::read_dir(&source).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), plugin_dir.join(file.file_name())).unwrap();
    }
    std::fs::write(
        &config_path,
        format!(
            r#"// A test config.
{{
  llm: {{ providers: {{ anthropic: {{ apiKey: "sk-test-secret-never-in-sandbox" }} }} }},
  plugins: {{
    notes: {{ path: "{}", _source: "{}", config: {{ maxNotes: 100 }} }},
  }},
  agents: {{
    a: {{
      model: {{ provider: "anthropic", model: "claude-sonnet-4-6" }},
      tools: ["notes"],
      sandbox: {{ image: "{}", memoryLimit: "256m", pidsLimit: 128 }},
    }},
  }},
}}
"#,
            plugin_dir.display(),
            source.display(),
            env.image
        ),
    )
    .unwrap();
    // The agent's override is added by hand afterwards.
    let text = std::fs::read_to_string(&config_path).unwrap().replace(
        "tools: [\"notes\"],",
        "tools: [\"notes\"],\n      pluginConfigs: { notes: { label: \"a's notes\" } },",
    );
    std::fs::write(&config_path, text).unwrap();
    let loaded = Config::load(&config_path, &t.home).unwrap();
    let plugins = load_plugins(&loaded.config, &t.home).unwrap();
    assert_eq!(
        plugins.package_dirs["notes"],
        t.home.plugins_dir().join("notes")
    );
    let docker = t.docker().await;
    let mut b = GatewayBuilder::new(loaded.config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker));
    for p in plugins.plugins {
        b = b.plugin(p);
    }
    let gw = b.build().await.unwrap();

    let out = exec(
        &gw,
        "a",
        "ls /tools/bin; for i in $(seq 1 20); do /tools/bin/notes add \"note $i\" || exit 9; done; notes list | wc -l; notes list | tail -n 1",
    )
    .await;
    let out_text = out.joined_text();
    assert!(!out.is_error, "{out_text}");
    assert!(out_text.starts_with("Exit code: 0\n"), "{out_text}");
    let lines: Vec<&str> = out_text.lines().skip(1).collect();
    assert_eq!(lines[0], "notes", "{out_text}");
    let merged = r#"{"label": "a's notes", "maxNotes": 100}"#;
    for (i, line) in lines.iter().enumerate().take(21).skip(1) {
        assert_eq!(
            *line,
            format!("added note {i} [agent=a session=socket:a channel=socket config={merged}]"),
            "{out_text}"
        );
    }
    assert_eq!(lines[21].trim(), "21", "label + 20 notes: {out_text}");
    assert_eq!(lines[22], "20. note 20");

    let records = audit(&t.home);
    let notes: Vec<_> = records.iter().filter(|r| r["tool"] == "notes").collect();
    assert_eq!(notes.len(), 2 * 22, "{records:#?}");
    for pair in notes.chunks(2) {
        assert_eq!(pair[0]["phase"], "started");
        assert_eq!(pair[1]["phase"], "finished");
        assert_eq!(pair[0]["agent"], "a");
        assert_eq!(pair[0]["session"], "socket:a");
        assert_eq!(pair[1]["exitCode"], 0);
    }
    assert_eq!(notes[0]["args"], json!(["add", "note 1"]));
    gw.shutdown().await.unwrap();
}

// ---- the prePrompt hook behind the agent loop ----

#[tokio::test]
async fn python_pre_prompt_hook_rewrites_and_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let server = FakeLlmServer::start().await;
    server.push(text_response("Blue."));
    let c = config(
        json!({"anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": server.url()}}),
        json!({"notes": {"path": examples().join("python-notes")}}),
        json!({}),
    );
    let notes = load_plugin_dir("notes", &examples().join("python-notes"), &c).unwrap();
    let Some(gw) = fake_gateway(&home, c, vec![notes]).await else {
        return;
    };
    let ask = |m: &'static str| {
        let gw = gw.clone();
        async move {
            gw.prompt(PromptRequest::new("a", "api:a:default", m))
                .await
                .unwrap()
                .collect_all()
                .await
        }
    };
    let events = ask("Which colour is the sky?").await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::Done { response, .. } if response == "Blue.")),
        "{events:#?}"
    );
    let sent = &server.requests()[0].body["messages"][0]["content"][0]["text"];
    assert_eq!(sent, "Which color is the sky?");

    let events = ask("Tell me the forbidden thing").await;
    let reason = events.iter().find_map(|e| match e {
        AgentEvent::Blocked { reason } => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(
        reason.as_deref(),
        Some("The notes plugin blocked this message: it mentions something forbidden."),
        "{events:#?}"
    );
    assert_eq!(
        server.request_count(),
        1,
        "a blocked prompt never reaches the model"
    );
    gw.shutdown().await.unwrap();
}

// ---- supervision ----

#[tokio::test]
async fn a_killed_plugin_fails_clearly_restarts_and_works_again() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let c = notes_config(json!({"tools": ["notes"]}));
    let notes = Arc::new(ExternalPlugin::from_dir(&examples().join("python-notes")).unwrap());
    let Some(gw) = fake_gateway(&home, c, vec![notes.clone()]).await else {
        return;
    };
    let r = call(&gw, "notes", &["add", "before the crash"], None).await;
    assert_eq!(r.exit_code, 0, "{}", text(&r));
    let pid = notes.pid().unwrap();

    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for("the exit to be noticed", Duration::from_secs(5), || {
        matches!(notes.status(), PluginStatus::Restarting { .. })
    })
    .await;
    let r = call(&gw, "notes", &["list"], None).await;
    assert_eq!(r.exit_code, 1);
    assert_eq!(
        text(&r),
        "tool 'notes' failed: plugin 'notes' is restarting after it exited (killed by signal 9); try again in a moment"
    );

    wait_for(
        "the restart",
        Duration::from_secs(10),
        || matches!(notes.status(), PluginStatus::Running { pid: Some(p) } if p != pid),
    )
    .await;
    let r = call(&gw, "notes", &["list"], None).await;
    assert_eq!(r.exit_code, 0, "{}", text(&r));
    assert_eq!(
        text(&r),
        "base\n1. before the crash\n",
        "the data lives in the gateway's store"
    );

    let new_pid = notes.pid().unwrap();
    gw.shutdown().await.unwrap();
    assert_eq!(notes.status(), PluginStatus::Stopped);
    assert!(notes.pid().is_none());
    assert!(
        !Path::new(&format!("/proc/{new_pid}")).exists(),
        "the plugin process ended with the gateway"
    );
}

#[tokio::test]
async fn a_plugin_that_never_answers_times_out_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("sleepy");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::write(
        plugin_dir.join("plugin.json"),
        r#"{"name": "sleepy", "run": {"command": "python3", "args": ["-u", "sleepy.py"]}, "timeout": 1}"#,
    )
    .unwrap();
    // Answers initialize, then reads calls and never answers them.
    std::fs::write(
        plugin_dir.join("sleepy.py"),
        r#"import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": [{"name": "sleepy", "description": "never answers"}]}}), flush=True)
    print("got " + m.get("method", "?"), file=sys.stderr, flush=True)
"#,
    )
    .unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let c = config(
        anthropic(),
        json!({"sleepy": {"path": plugin_dir}}),
        json!({"tools": ["sleepy"]}),
    );
    let sleepy = load_plugin_dir("sleepy", &plugin_dir, &c).unwrap();
    let Some(gw) = fake_gateway(&home, c, vec![sleepy]).await else {
        return;
    };
    let started = Instant::now();
    let r = call(&gw, "sleepy", &["please"], None).await;
    let took = started.elapsed();
    assert_eq!(r.exit_code, 1);
    assert_eq!(
        text(&r),
        "tool 'sleepy' failed: plugin 'sleepy' did not answer tool.call within 1 s"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let finished = audit(&home)
        .into_iter()
        .find(|r| r["tool"] == "sleepy" && r["phase"] == "finished")
        .unwrap();
    assert!(finished["error"]
        .as_str()
        .unwrap()
        .contains("did not answer"));
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_plugin_that_cannot_start_stops_the_gateway_start() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let plugin_dir = dir.path().join("crashy");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::write(
        plugin_dir.join("plugin.json"),
        r#"{"name": "crashy", "run": {"command": "python3", "args": ["-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]}}"#,
    )
    .unwrap();
    let c = config(
        anthropic(),
        json!({"crashy": {"path": plugin_dir}}),
        json!({}),
    );
    let plugin = load_plugin_dir("crashy", &plugin_dir, &c).unwrap();
    let e = GatewayBuilder::new(c, home)
        .sandbox(Arc::new(MemorySandbox::new()))
        .plugin(plugin)
        .build()
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "plugin 'crashy': exited (exit code 3) while handling initialize (its stderr is in the gateway log)"
    );
    let missing = plugin_dir.join("plugin.json");
    std::fs::write(
        &missing,
        r#"{"name": "crashy", "run": {"command": "./nope"}}"#,
    )
    .unwrap();
    let c = config(
        anthropic(),
        json!({"crashy": {"path": plugin_dir}}),
        json!({}),
    );
    let plugin = load_plugin_dir("crashy", &plugin_dir, &c).unwrap();
    let e = GatewayBuilder::new(c, BeigeHome::new(dir.path().join("home")))
        .sandbox(Arc::new(MemorySandbox::new()))
        .plugin(plugin)
        .build()
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("plugin 'crashy': could not be started ("),
        "{e}"
    );
}

// ---- command tools ----

#[tokio::test]
async fn command_tool_runs_in_the_callers_cwd_and_refusals_name_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let plugin_dir = dir.path().join("lister");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::write(
        plugin_dir.join("plugin.json"),
        r#"{"name": "ls", "tools": {"ls": {"command": "ls", "args": ["-1"],
            "allow": ["*"], "deny": ["** /* **", "** ..* **", "-R *"]}}}"#,
    )
    .unwrap();
    let c = config(
        anthropic(),
        json!({"ls": {"path": plugin_dir}}),
        json!({"tools": ["ls"]}),
    );
    let ls = load_plugin_dir("ls", &plugin_dir, &c).unwrap();
    let workspace = c.agent_workspace(&home, "a");
    let Some(gw) = fake_gateway(&home, c, vec![ls]).await else {
        return;
    };
    std::fs::create_dir_all(workspace.join("repo/sub")).unwrap();
    std::fs::write(workspace.join("repo/hello.txt"), "hi\n").unwrap();

    let r = call(&gw, "ls", &[], Some("repo")).await;
    assert_eq!(r.exit_code, 0, "{}", text(&r));
    assert_eq!(text(&r), "hello.txt\nsub\n");
    let r = call(&gw, "ls", &["-R", "."], Some("repo")).await;
    assert_eq!(r.exit_code, 1);
    assert_eq!(text(&r), "ls: \"-R .\" refused by rule deny \"-R *\"\n");
    let r = call(&gw, "ls", &["/etc"], Some("repo")).await;
    assert_eq!(text(&r), "ls: \"/etc\" refused by rule deny \"** /* **\"\n");
    // A cwd that does not exist, that leaves the workspace, or that is a link out of it.
    let r = call(&gw, "ls", &[], Some("nowhere")).await;
    assert_eq!(
        text(&r),
        "ls: the working directory nowhere does not exist in the workspace\n"
    );
    let r = call(&gw, "ls", &[], Some("../..")).await;
    assert_eq!(r.exit_code, 1);
    assert!(text(&r).contains("invalid cwd"), "{}", text(&r));
    std::os::unix::fs::symlink("/etc", workspace.join("etc")).unwrap();
    let r = call(&gw, "ls", &[], Some("etc")).await;
    assert_eq!(r.exit_code, 1);
    assert!(text(&r).contains("symbolic link"), "{}", text(&r));
    assert!(!text(&r).contains("passwd"), "{}", text(&r));

    let finished: Vec<_> = audit(&home)
        .into_iter()
        .filter(|r| r["tool"] == "ls" && r["phase"] == "finished")
        .collect();
    assert_eq!(finished.len(), 6);
    assert_eq!(finished[0]["exitCode"], 0);
    assert_eq!(finished[1]["exitCode"], 1);
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_operator_note_example_writes_one_line_and_reads_nothing_of_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let notes = dir.path().join("notes.txt");
    // This test runs in its own process (nextest), so setting a variable is harmless.
    std::env::set_var("BEIGE_OPERATOR_NOTES", &notes);
    let example = examples().join("operator-note");
    let c = config(
        anthropic(),
        json!({"operator-note": {"path": example}}),
        json!({"tools": ["operator-note"]}),
    );
    let tool = load_plugin_dir("operator-note", &example, &c).unwrap();
    let Some(gw) = fake_gateway(&home, c, vec![tool]).await else {
        return;
    };
    let r = call(&gw, "operator-note", &["please", "add\nnumpy"], None).await;
    assert_eq!(r.exit_code, 0, "{}", text(&r));
    assert_eq!(text(&r), "noted for the operator\n");
    let written = std::fs::read_to_string(&notes).unwrap();
    assert_eq!(written.lines().count(), 1, "{written}");
    assert!(
        written.trim_end().ends_with("\tplease add numpy"),
        "{written}"
    );
    let r = call(&gw, "operator-note", &[], None).await;
    assert_eq!(r.exit_code, 2, "{}", text(&r));
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_command_tool_gets_only_the_declared_environment() {
    // This test runs in its own process (nextest), so setting variables is harmless.
    std::env::set_var("BEIGE_TEST_GATEWAY_ONLY", "must-not-leak");
    std::env::set_var("BEIGE_TEST_DECLARED_SOURCE", "declared-value");
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("envdump");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::write(
        plugin_dir.join("plugin.json"),
        r#"{"name": "envdump", "tools": {"envdump": {"command": "env", "allow": [""],
            "env": {"DECLARED": "${BEIGE_TEST_DECLARED_SOURCE}"}}}}"#,
    )
    .unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let c = config(
        anthropic(),
        json!({"envdump": {"path": plugin_dir}}),
        json!({"tools": ["envdump"]}),
    );
    let plugin = load_plugin_dir("envdump", &plugin_dir, &c).unwrap();
    let Some(gw) = fake_gateway(&home, c, vec![plugin]).await else {
        return;
    };
    let r = call(&gw, "envdump", &[], None).await;
    assert_eq!(r.exit_code, 0, "{}", text(&r));
    let mut names: Vec<String> = text(&r)
        .lines()
        .map(|l| l.split('=').next().unwrap_or_default().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["DECLARED", "PATH"], "{}", text(&r));
    assert!(text(&r).contains("DECLARED=declared-value\n"));
    assert!(std::env::var("CARGO_MANIFEST_DIR").is_ok() || std::env::var("HOME").is_ok());
    assert!(!text(&r).contains("must-not-leak"));
    // Any argument is refused: the only allow rule is the empty command line.
    let r = call(&gw, "envdump", &["sh", "-c", "id"], None).await;
    assert_eq!(r.exit_code, 1);
    gw.shutdown().await.unwrap();
}

// ---- configSchema at startup ----

#[tokio::test]
async fn a_config_that_violates_the_plugins_schema_fails_startup_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let plugin_dir = dir.path().join("weather");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::write(
        plugin_dir.join("plugin.json"),
        r#"{"name": "weather", "run": {"command": "false"},
            "configSchema": {"type": "object", "required": ["units"],
                             "properties": {"units": {"enum": ["metric", "imperial"]}}}}"#,
    )
    .unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let with = |config: serde_json::Value, agent: serde_json::Value| {
        config_for_weather(&plugin_dir, config, agent)
    };
    let err = |c: &Config| load_plugins(c, &home).unwrap_err().to_string();
    assert_eq!(
        err(&with(json!({"units": "kelvin"}), json!({}))),
        r#"plugin 'weather': invalid config: plugins.weather.config.units: must be one of "metric", "imperial" (found "kelvin")"#
    );
    assert_eq!(
        err(&with(json!({}), json!({}))),
        "plugin 'weather': invalid config: plugins.weather.config.units: is required"
    );
    assert_eq!(
        err(&with(
            json!({"units": "metric"}),
            json!({"pluginConfigs": {"weather": {"units": "x"}}})
        )),
        r#"plugin 'weather': invalid config: agents.a.pluginConfigs.weather.units: must be one of "metric", "imperial" (found "x") (in the agent's config merged over plugins.weather.config)"#
    );
    assert!(load_plugins(&with(json!({"units": "metric"}), json!({})), &home).is_ok());

    // Handed to the gateway directly, the plugin checks its config when it registers,
    // before its process is started.
    let bad = with(json!({"units": "kelvin"}), json!({}));
    let plugin = Arc::new(ExternalPlugin::from_dir(&plugin_dir).unwrap());
    let e = GatewayBuilder::new(bad, home.clone())
        .sandbox(Arc::new(MemorySandbox::new()))
        .plugin(plugin.clone())
        .build()
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("plugins.weather.config.units: must be one of"),
        "{e}"
    );
    assert_eq!(plugin.status(), PluginStatus::NotStarted);
}

fn config_for_weather(
    dir: &Path,
    plugin_config: serde_json::Value,
    agent: serde_json::Value,
) -> Config {
    config(
        anthropic(),
        json!({"weather": {"path": dir, "config": plugin_config}}),
        agent,
    )
}

#[test]
fn entries_without_a_path_are_reported_clearly() {
    let home = BeigeHome::new("/nonexistent/beige-home");
    let c = config(anthropic(), json!({"kv": {}, "telegram": {}}), json!({}));
    assert!(load_plugins(&c, &home).unwrap().plugins.is_empty());
    let c = config(
        anthropic(),
        json!({"telegram": {"path": "/old/ts/telegram", "_source": "npm:@matthias-hausberger/beige-toolkit"}}),
        json!({}),
    );
    assert!(load_plugins(&c, &home).unwrap().plugins.is_empty());
    let c = config(anthropic(), json!({"wether": {}}), json!({}));
    let e = load_plugins(&c, &home).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "plugin 'wether': has no `path` and is not a built-in plugin (built-in: kv, telegram, sessions)"
        ),
        "{e}"
    );
    let c = config(
        anthropic(),
        json!({"notes": {"_source": "github:o/r"}}),
        json!({}),
    );
    let e = load_plugins(&c, &home).unwrap_err().to_string();
    assert!(e.contains("not installed yet"), "{e}");
    let c = config(
        anthropic(),
        json!({"other": {"path": examples().join("python-notes")}}),
        json!({}),
    );
    let e = load_plugins(&c, &home).unwrap_err().to_string();
    assert!(
        e.contains("names the plugin 'notes', but the config lists it as 'other'"),
        "{e}"
    );
}
