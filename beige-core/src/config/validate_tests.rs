use super::*;
use crate::config::LoadedConfig;

const FILE: &str = "/etc/beige/config.json5";
const HOME: &str = "/var/lib/beige-test-home";

fn env(name: &str) -> Option<String> {
    (name == "HOME").then(|| "/home/u".to_string())
}

fn load_in(home: &BeigeHome, text: &str) -> Result<LoadedConfig, ConfigError> {
    Config::from_str_with_env(text, Path::new(FILE), home, env)
}

fn load(text: &str) -> Result<LoadedConfig, ConfigError> {
    load_in(&BeigeHome::new(HOME), text)
}

/// A config with providers `anthropic` and `openai`, plugin `kv`, and one agent
/// `name` whose body is the model line plus `extra`.
fn with_agent(name: &str, extra: &str) -> String {
    format!(
        r#"{{
              llm: {{ providers: {{ anthropic: {{ apiKey: "k" }}, openai: {{}} }} }},
              plugins: {{ kv: {{}} }},
              agents: {{
                "{name}": {{
                  model: {{ provider: "anthropic", model: "claude-sonnet-4-6" }},
                  tools: [],
                  {extra}
                }},
              }},
            }}"#
    )
}

fn err(text: &str) -> String {
    match load(text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn agent_name_rule() {
    for ok in ["a", "0", "intern", "my-agent_2", &"a".repeat(63)] {
        assert!(is_valid_agent_name(ok), "{ok}");
    }
    for bad in [
        "",
        "Intern",
        "-a",
        "_a",
        "bad name",
        "a.b",
        "a/b",
        "é",
        &"a".repeat(64),
    ] {
        assert!(!is_valid_agent_name(bad), "{bad}");
    }
    assert_eq!(suggest_agent_name("Intern"), "intern");
    assert_eq!(suggest_agent_name("bad name"), "bad-name");
    assert_eq!(suggest_agent_name("--My  Agent!"), "my-agent");
    assert_eq!(suggest_agent_name("!!!"), "agent");
    insta::assert_snapshot!(err(&with_agent("Intern", "")));
    insta::assert_snapshot!(err(&with_agent("bad name", "")));
}

#[test]
fn agents_must_exist_and_be_non_empty() {
    insta::assert_snapshot!(err(r#"{ llm: { providers: { anthropic: {} } } }"#));
    insta::assert_snapshot!(err(
        r#"{ llm: { providers: { anthropic: {} } }, agents: {} }"#
    ));
}

#[test]
fn did_you_mean_finds_typos_only() {
    let known = ["anthropic", "openai", "git", "kv"];
    assert_eq!(did_you_mean("antropic", known), Some("anthropic"));
    assert_eq!(did_you_mean("Anthropic", known), Some("anthropic"));
    assert_eq!(did_you_mean("gti", known), Some("git"));
    assert_eq!(did_you_mean("opnai", known), Some("openai"));
    assert_eq!(did_you_mean("google", known), None);
    assert_eq!(did_you_mean("x", []), None);
}

#[test]
fn model_providers_must_be_configured() {
    let text = with_agent("a", "").replace("provider: \"anthropic\"", "provider: \"antropic\"");
    insta::assert_snapshot!(err(&text));
    let text = with_agent(
        "a",
        r#"fallbackModels: [{ provider: "openai", model: "gpt-4o" }, { provider: "zai", model: "glm" }],"#,
    );
    insta::assert_snapshot!(err(&text));
}

#[test]
fn model_needs_provider_and_model() {
    let text = with_agent("a", "").replace("model: \"claude-sonnet-4-6\"", "model: \"\"");
    insta::assert_snapshot!(err(&text));
}

#[test]
fn unknown_provider_names_need_an_api() {
    let text = with_agent("a", "").replace("openai: {}", "zai: { baseUrl: \"https://x\" }");
    insta::assert_snapshot!(err(&text));
    let text = with_agent("a", "").replace("openai: {}", "zai: { api: \"openai-completions\" }");
    assert!(load(&text).is_ok());
}

#[test]
fn plugin_configs_must_name_configured_plugins() {
    insta::assert_snapshot!(err(&with_agent("a", "pluginConfigs: { kb: { x: 1 } },")));
    assert!(load(&with_agent("a", "pluginConfigs: { kv: { x: 1 } },")).is_ok());
}

#[test]
fn skills_must_be_configured() {
    insta::assert_snapshot!(err(&with_agent("a", r#"skills: ["code-review"],"#)));
    let text = with_agent("a", "").replace(
        "plugins:",
        "skills: { review: { path: \"/nonexistent/skill\" } }, plugins:",
    );
    insta::assert_snapshot!(err(&text));
}

#[test]
fn validate_skills_accepts_plugin_skills() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = load(&with_agent("a", "")).unwrap();
    let mut config = loaded.config;
    config.agents["a"].skills.push("from-plugin".into());
    let file = dir.path().join("c.json5");
    assert!(validate_skills(&config, &file, &["from-plugin"]).is_ok());
    assert!(validate_skills(&config, &file, &[]).is_err());
}

#[test]
fn compaction_threshold_at_least_one() {
    let text = with_agent("a", "").replace(
        "claude-sonnet-4-6\"",
        "claude-sonnet-4-6\", compactionThreshold: 0",
    );
    insta::assert_snapshot!(err(&text));
    let text = with_agent("a", "").replace(
        "claude-sonnet-4-6\"",
        "claude-sonnet-4-6\", compactionThreshold: -5",
    );
    insta::assert_snapshot!(err(&text));
}

#[test]
fn memory_limit_grammar() {
    let gib = 1024 * 1024 * 1024;
    assert_eq!(parse_memory_limit("3g"), Some(3 * gib));
    assert_eq!(parse_memory_limit("3G"), Some(3 * gib));
    assert_eq!(parse_memory_limit("3gb"), Some(3 * gib));
    assert_eq!(parse_memory_limit(" 3 GB "), Some(3 * gib));
    assert_eq!(parse_memory_limit("512m"), Some(512 * 1024 * 1024));
    assert_eq!(parse_memory_limit("1.5k"), Some(1536));
    assert_eq!(parse_memory_limit("1.0001k"), Some(1024));
    assert_eq!(parse_memory_limit("100"), Some(100));
    assert_eq!(parse_memory_limit("100b"), Some(100));
    assert_eq!(parse_memory_limit("100B"), Some(100));
    for bad in [
        "",
        "g",
        "0",
        "0.1",
        "-1g",
        "1.g",
        ".5g",
        "1.2.3",
        "3t",
        "3 gig",
        "1e9",
        "3bb",
        "1b g",
        "99999999999999999999g",
    ] {
        assert_eq!(parse_memory_limit(bad), None, "{bad:?}");
    }
    insta::assert_snapshot!(err(&with_agent(
        "a",
        r#"sandbox: { memoryLimit: "lots" },"#
    )));
}

#[test]
fn sandbox_limits() {
    assert!(err(&with_agent("a", "maxTurns: 0,")).contains("maxTurns must be at least 1"));
    insta::assert_snapshot!(err(&with_agent("a", "sandbox: { pidsLimit: 0 },")));
    insta::assert_snapshot!(err(&with_agent("a", "sandbox: { cpus: 0 },")));
    assert!(err(&with_agent("a", "sandbox: { cpus: -1.5 },"))
        .contains("cpus must be a positive number"));
    assert!(load(&with_agent("a", "sandbox: { cpus: 1.5, pidsLimit: 64 },")).is_ok());
    assert!(err(&with_agent("a", "sandbox: { warmPool: 5 },"))
        .contains("warmPool must be at most 4 (got 5"));
    assert!(load(&with_agent("a", "sandbox: { warmPool: 4 },")).is_ok());
}

#[test]
fn gateway_port_range() {
    let text = with_agent("a", "").replace("plugins:", "gateway: { port: 0 }, plugins:");
    insta::assert_snapshot!(err(&text));
    let text = with_agent("a", "").replace("plugins:", "gateway: { port: 70000 }, plugins:");
    assert!(err(&text).contains("invalid port 70000"));
    let text = with_agent("a", "").replace("plugins:", "gateway: { port: \"7433\" }, plugins:");
    assert!(err(&text).contains(r#"invalid port "7433""#));
}

#[test]
fn network_modes() {
    insta::assert_snapshot!(err(&with_agent("a", r#"sandbox: { network: "host" },"#)));
    insta::assert_snapshot!(err(&with_agent("a", r#"sandbox: { network: "brige" },"#)));
    let loaded = load(&with_agent("a", r#"sandbox: { network: "bridge" },"#)).unwrap();
    assert_eq!(
        loaded.config.agents["a"].sandbox.network,
        crate::config::NetworkMode::Bridge
    );
}

#[test]
fn sandbox_user() {
    for ok in ["root", "1000:1000", "0:0"] {
        assert!(
            load(&with_agent("a", &format!("sandbox: {{ user: \"{ok}\" }},"))).is_ok(),
            "{ok}"
        );
    }
    for bad in [
        "1000",
        "alice",
        "1000:",
        ":1000",
        "+1:2",
        "1:99999999999",
        "root:root",
    ] {
        assert!(
            err(&with_agent(
                "a",
                &format!("sandbox: {{ user: \"{bad}\" }},")
            ))
            .contains("invalid user"),
            "{bad}"
        );
    }
    insta::assert_snapshot!(err(&with_agent("a", r#"sandbox: { user: "alice" },"#)));
}

#[test]
fn tools_are_checked_against_registered_ones() {
    let loaded =
        load(&with_agent("a", "").replace("tools: []", r#"tools: ["kv", "gti"]"#)).unwrap();
    let file = Path::new(FILE);
    assert!(validate_tools(&loaded.config, file, &["git", "kv", "gti"]).is_ok());
    let e = validate_tools(&loaded.config, file, &["git", "kv"]).unwrap_err();
    insta::assert_snapshot!(e.to_string());
    let e = validate_tools(&loaded.config, file, &[]).unwrap_err();
    insta::assert_snapshot!(e.to_string());
}

fn mount_err(home: &BeigeHome, host: &str, container: &str) -> String {
    let ws = home.default_workspace("a");
    check_extra_mount(
        home,
        &ws,
        &WritableTrees::default(),
        Path::new(host),
        container,
    )
    .unwrap_err()
}

#[test]
fn mount_refusals_host_side() {
    let home = BeigeHome::new(HOME);
    let cases = [
        ("/", "/host"),
        ("/var/run/docker.sock", "/var/run/docker.sock"),
        ("/run/docker.sock", "/d"),
        ("/home/u/.docker/run/docker.sock", "/d"),
        ("/var/run", "/d"),
        ("/run", "/d"),
        ("/var", "/d"),
        (HOME, "/h"),
        ("/var/lib/beige-test-home/gateway.token", "/t"),
        ("/var/lib/beige-test-home/agents/b/workspace", "/b"),
        ("/var/lib/beige-test-home/agents/a", "/a"),
        ("/var/lib", "/lib"),
        ("relative/path", "/r"),
        ("/a/../../etc", "/e"),
    ];
    let out: Vec<String> = cases
        .iter()
        .map(|(host, container)| {
            format!(
                "{host} -> {container}: {}",
                mount_err(&home, host, container)
            )
        })
        .collect();
    insta::assert_snapshot!(out.join("\n"));
}

#[test]
fn mount_refusals_container_side() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(HOME);
    let host = dir.path().to_str().unwrap();
    let cases = [
        "data",
        "/",
        "/workspace",
        "/workspace/sub",
        "/tools/bin",
        "/skills",
        "/beige:ro",
        "/a/../workspace",
        "/x:z",
        "/x:ro:ro",
    ];
    let out: Vec<String> = cases
        .iter()
        .map(|c| format!("{c}: {}", mount_err(&home, host, c)))
        .collect();
    insta::assert_snapshot!(out.join("\n"));
}

#[test]
fn mounts_that_are_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let ws = home.default_workspace("a");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();

    let none = WritableTrees::default();
    let m = check_extra_mount(&home, &ws, &none, &data, "/data:ro").unwrap();
    assert_eq!(
        m,
        MountTarget {
            host: data.clone(),
            container: "/data".into(),
            read_only: true
        }
    );
    let m = check_extra_mount(&home, &ws, &none, &data, "/srv/./data/").unwrap();
    assert_eq!((m.container.as_str(), m.read_only), ("/srv/data", false));
    assert!(
        !check_extra_mount(&home, &ws, &none, &data, "/workspaces:rw")
            .unwrap()
            .read_only
    );
    // A symlink to an allowed folder: Docker gets the folder itself.
    let link = dir.path().join("data-link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let m = check_extra_mount(&home, &ws, &none, &link, "/data").unwrap();
    assert_eq!(m.host, data.canonicalize().unwrap());
}

#[test]
fn mounts_from_agent_writable_trees_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let ws = home.default_workspace("a");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    let none = WritableTrees::default();
    // Not even inside the agent's own workspace: it could swap `sub` for a symlink.
    let e = check_extra_mount(&home, &ws, &none, &ws.join("sub"), "/sub").unwrap_err();
    assert!(e.contains("inside the workspace of this agent"), "{e}");
    // A workspace elsewhere (workspaceDir), and a read-write mount of another agent.
    let elsewhere = dir.path().join("projects/b");
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(elsewhere.join("src")).unwrap();
    std::fs::create_dir_all(shared.join("inner")).unwrap();
    let mut trees = WritableTrees::default();
    trees.push(WritableTree {
        agent: "b".into(),
        path: elsewhere.clone(),
        kind: WritableKind::Workspace,
    });
    trees.push(WritableTree {
        agent: "b".into(),
        path: shared.clone(),
        kind: WritableKind::Mount {
            container: "/shared".into(),
        },
    });
    let own = dir.path().join("own-ws");
    std::fs::create_dir_all(own.join("x")).unwrap();
    let cases = [
        (elsewhere.clone(), "that is the workspace of agent 'b'"),
        (
            elsewhere.join("src"),
            "that is inside the workspace of agent 'b'",
        ),
        (
            shared.join("inner"),
            "which agent 'b' mounts read-write at /shared",
        ),
        (own.join("x"), "inside the workspace of this agent"),
    ];
    for (host, expected) in cases {
        let e = check_extra_mount(&home, &own, &trees, &host, "/m:ro").unwrap_err();
        assert!(e.contains(expected), "{}: {e}", host.display());
        assert!(e.contains("symlink"), "{e}");
    }
    // Through a symlink from outside: the resolved path is what counts.
    let link = dir.path().join("innocent");
    std::os::unix::fs::symlink(elsewhere.join("src"), &link).unwrap();
    let e = check_extra_mount(&home, &own, &trees, &link, "/m").unwrap_err();
    assert!(e.contains("workspace of agent 'b'"), "{e}");
    // The shared folder itself may be mounted by several agents.
    assert!(check_extra_mount(&home, &own, &trees, &shared, "/shared").is_ok());
}

#[test]
fn config_refuses_mounts_inside_workspaces_and_writable_mounts() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let file = dir.path().join("config.json5");
    std::fs::create_dir_all(dir.path().join("ws-b/data")).unwrap();
    std::fs::create_dir_all(dir.path().join("shared/sub")).unwrap();
    std::fs::create_dir_all(home.default_workspace("a").join("data")).unwrap();
    let load = |a: &str, b: &str| {
        let text = format!(
            r#"{{ llm: {{ providers: {{ anthropic: {{ apiKey: "k" }} }} }},
                agents: {{
                  a: {{ model: {{ provider: "anthropic", model: "m" }}, tools: [], {a} }},
                  b: {{ model: {{ provider: "anthropic", model: "m" }}, tools: [], {b} }},
                }} }}"#
        );
        Config::from_str_with_env(&text, &file, &home, |_| None)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let ws_b = r#"workspaceDir: "./ws-b""#;
    let cases = [
        // Inside another agent's configured workspace.
        (
            r#"sandbox: { extraMounts: { "./ws-b/data": "/data:ro" } }"#,
            ws_b,
            "workspace of agent 'b'",
        ),
        // Inside its own workspace.
        (
            &*format!(
                r#"sandbox: {{ extraMounts: {{ "{}": "/data:ro" }} }}"#,
                home.default_workspace("a").join("data").display()
            ),
            "",
            "inside the workspace of agent 'a'",
        ),
        // Inside a folder another agent mounts read-write.
        (
            r#"sandbox: { extraMounts: { "./shared/sub": "/sub:ro" } }"#,
            r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
            "which agent 'b' mounts read-write at /shared",
        ),
        // A workspace inside a folder another agent mounts read-write.
        (
            r#"workspaceDir: "./shared/sub""#,
            r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
            "cannot use",
        ),
    ];
    for (a, b, expected) in cases {
        let e = load(a, b).unwrap_err();
        assert!(e.contains(expected), "{a} / {b}: {e}");
    }
    // Sharing: the same read-write folder for both, read-only elsewhere is fine.
    load(
        r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
        r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
    )
    .unwrap();
    load(
        r#"sandbox: { extraMounts: { "./shared/sub": "/sub:ro" } }"#,
        r#"sandbox: { extraMounts: { "./shared": "/shared:ro" } }"#,
    )
    .unwrap();
}

#[test]
fn mount_refusals_see_through_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    std::fs::create_dir_all(home.root()).unwrap();
    let link = dir.path().join("innocent");
    std::os::unix::fs::symlink(home.root(), &link).unwrap();
    let ws = home.default_workspace("a");
    let e = check_extra_mount(&home, &ws, &WritableTrees::default(), &link, "/x").unwrap_err();
    assert!(e.contains("that is BEIGE_HOME"), "{e}");
}

#[test]
fn mounts_in_config_resolve_relative_and_tilde_paths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    std::fs::create_dir_all(dir.path().join("user/notes")).unwrap();
    let file = dir.path().join("config.json5");
    let text = with_agent(
        "a",
        r#"sandbox: { extraMounts: { "./data": "/data:ro", "~/notes": "/notes" } },"#,
    );
    let home = BeigeHome::new(dir.path().join("home"));
    let user = dir.path().join("user");
    let env = |n: &str| (n == "HOME").then(|| user.display().to_string());
    let loaded = Config::from_str_with_env(&text, &file, &home, env).unwrap();
    let mounts: Vec<(&String, &String)> = loaded.config.agents["a"]
        .sandbox
        .extra_mounts
        .iter()
        .collect();
    let data = dir.path().join("data").display().to_string();
    let notes = user.join("notes").display().to_string();
    assert_eq!(
        mounts,
        [
            (&data, &"/data:ro".to_string()),
            (&notes, &"/notes".to_string())
        ]
    );
}

#[test]
fn mount_sources_must_exist_at_load() {
    let home = BeigeHome::new(HOME);
    let ws = home.default_workspace("a");
    // The pure check accepts it (the container spec may be computed before the folder
    // exists); loading the config does not.
    assert!(check_extra_mount(
        &home,
        &ws,
        &WritableTrees::default(),
        Path::new("/nonexistent/data"),
        "/data"
    )
    .is_ok());
    insta::assert_snapshot!(err(&with_agent(
        "a",
        r#"sandbox: { extraMounts: { "/nonexistent/data": "/data" } },"#
    )));
}

#[test]
fn mount_errors_in_config_name_the_entry() {
    insta::assert_snapshot!(err(&with_agent(
        "a",
        r#"sandbox: { extraMounts: { "/": "/host" } },"#
    )));
    insta::assert_snapshot!(err(&with_agent(
        "a",
        r#"sandbox: { extraMounts: { "/tmp": "/workspace/tmp" } },"#
    )));
}

#[test]
fn workspace_dir_may_not_expose_the_home() {
    insta::assert_snapshot!(err(&with_agent(
        "a",
        &format!(r#"workspaceDir: "{HOME}","#)
    )));
    assert!(err(&with_agent("a", r#"workspaceDir: "/","#)).contains("whole file system"));
    assert!(load(&with_agent(
        "a",
        &format!(r#"workspaceDir: "{HOME}/agents/a/ws","#)
    ))
    .is_ok());
    assert!(load(&with_agent("a", r#"workspaceDir: "/srv/a","#)).is_ok());
}

#[test]
fn budgets_refuse_unpriced_models_under_a_cost_limit_and_unknown_keys() {
    let local = r#"fallbackModels: [{ provider: "openai", model: "my-llama" }],
                  budgets: { session: { costUsd: 5 } },"#;
    let e = err(&with_agent("a", local));
    assert!(
        e.contains("llm.providers.openai.models.my-llama.cost"),
        "{e}"
    );
    let uncounted = r#"fallbackModels: [{ provider: "openai", model: "my-llama" }],
                  budgets: { session: { costUsd: 5 }, unknownModelPrice: "uncounted" },"#;
    assert!(load(&with_agent("a", uncounted)).is_ok());
    let tokens_only = r#"fallbackModels: [{ provider: "openai", model: "my-llama" }],
                  budgets: { session: { tokens: 5000 } },"#;
    assert!(
        load(&with_agent("a", tokens_only)).is_ok(),
        "no cost limit, no price needed"
    );
    let negative = r#"budgets: { turn: { costUsd: -1 } },"#;
    assert!(err(&with_agent("a", negative)).contains("agents.a.budgets.turn.costUsd"));
    let later = r#"budgets: { session: { costUsd: 5, onLimit: "ask" } },"#;
    assert!(err(&with_agent("a", later)).contains("onLimit"));
}

#[test]
fn policy_rules_are_checked_at_load() {
    // A failing `match` example fails the load, naming the rule, the example and what
    // it was read as.
    let text = with_agent(
        "intern",
        r#"policy: { rules: [
             { id: "no-force", tool: "exec", pattern: ["git", "push", ["-f", "--force"]],
               decision: "deny", match: ["git push origin -f"] },
           ] },"#,
    );
    let e = err(&text);
    assert!(e.contains("agents.intern.policy.rules[0].match[0]"), "{e}");
    assert!(
        e.contains(
            "rule 'no-force': the match example \"git push origin -f\" does not match it \
             (read as: git push origin -f)"
        ),
        "{e}"
    );
    // An unknown decision is refused where it is written.
    let text = with_agent(
        "intern",
        r#"policy: { rules: [{ tool: "exec", pattern: ["ls"], decision: "maybe" }] },"#,
    );
    let e = err(&text);
    assert!(e.contains("agents.intern.policy.rules[0].decision"), "{e}");
    // An allow rule for a plugin tool the agent lacks.
    let text = with_agent(
        "intern",
        r#"policy: { rules: [{ tool: "kv", pattern: ["get"], decision: "allow" }] },"#,
    );
    let e = err(&text);
    assert!(e.contains("agents.intern.policy.rules[0].decision"), "{e}");
    assert!(e.contains("rules never grant a tool"), "{e}");
    // A valid policy loads, with its defaults.
    let text = with_agent(
        "intern",
        r#"policy: { execDefault: "ask", rules: [
             { tool: "write", path: ".github/workflows/**", decision: "ask",
               match: [".github/workflows/ci.yml"], notMatch: ["src/main.rs"] },
           ] },"#,
    );
    let loaded = load(&text).unwrap();
    let policy = loaded.config.agents["intern"].policy.clone().unwrap();
    assert_eq!(policy.exec_default, crate::policy::RuleDecision::Ask);
    assert_eq!(policy.opaque_exec, crate::policy::RuleDecision::Ask);
    assert_eq!(policy.rule_id(0), "r0");
}

#[test]
fn the_metrics_listener_must_be_loopback() {
    let with_listen = |listen: &str| {
        with_agent("intern", "").replacen(
            "plugins:",
            &format!(r#"telemetry: {{ metrics: {{ listen: "{listen}" }} }}, plugins:"#),
            1,
        )
    };
    for ok in [
        "127.0.0.1:9464",
        "[::1]:9464",
        "localhost:9464",
        "127.0.0.1:0",
    ] {
        let loaded = load(&with_listen(ok)).unwrap();
        assert_eq!(loaded.config.metrics_listen(), Some(ok));
    }
    for (bad, why) in [
        ("0.0.0.0:9464", "not a loopback address"),
        ("10.1.2.3:9464", "not a loopback address"),
        ("[::]:9464", "not a loopback address"),
        ("metrics.example:9464", "only IP addresses and localhost"),
        ("127.0.0.1", "no port"),
        ("::1:9464", "in brackets"),
    ] {
        let e = err(&with_listen(bad));
        assert!(e.contains("telemetry.metrics.listen"), "{e}");
        assert!(e.contains(bad), "{e}");
        assert!(e.contains(why), "{bad}: {e}");
        assert!(e.contains("127.0.0.1:9464"), "says what to use: {e}");
    }
}

#[test]
fn store_url_must_be_postgresql_and_its_pool_readable() {
    let with_store = |store: &str| {
        with_agent("a", "").replacen(
            "plugins: { kv: {} },",
            &format!("plugins: {{ kv: {{}} }}, store: {store},"),
            1,
        )
    };
    let text = err(&with_store(r#"{ url: "mysql://db/beige" }"#));
    assert!(text.contains("store.url"), "{text}");
    assert!(text.contains("postgres://"), "{text}");
    let text = err(&with_store(
        r#"{ url: "postgres://db/beige", pool: { max: 0 } }"#,
    ));
    assert!(text.contains("store.pool.max"), "{text}");
    let text = err(&with_store(
        r#"{ url: "postgres://db/beige", pool: { statementTimeout: "soon" } }"#,
    ));
    assert!(text.contains("statementTimeout"), "{text}");
    let text = err(&with_store(
        r#"{ url: "postgres://db/beige", pasword: "x" }"#,
    ));
    assert!(text.contains("pasword"), "{text}");
    let loaded = load(&with_store(
        r#"{ url: "postgres://beige@db/beige?sslmode=verify-full", passwordFile: "pg.secret",
             pool: { max: 4, acquireTimeout: "2s", statementTimeout: 30 } }"#,
    ))
    .unwrap();
    let store = loaded.config.store.unwrap();
    assert_eq!(store.max_connections(), 4);
    assert_eq!(store.acquire_timeout(), std::time::Duration::from_secs(2));
    assert_eq!(
        store.statement_timeout(),
        std::time::Duration::from_secs(30)
    );
    assert_eq!(
        store.password_file.as_deref(),
        Some(Path::new("/etc/beige/pg.secret")),
        "resolved against the config file's folder"
    );
}

#[test]
fn a_cluster_needs_a_shared_store_and_a_lease_of_at_least_five_seconds() {
    let with = |extra: &str| {
        with_agent("a", "").replacen(
            "plugins: { kv: {} },",
            &format!("plugins: {{ kv: {{}} }}, {extra},"),
            1,
        )
    };
    let text = err(&with("cluster: { standby: true }"));
    assert!(text.contains("cluster"), "{text}");
    assert!(text.contains("store.url"), "{text}");
    let store = r#"store: { url: "postgres://db/beige" }"#;
    let text = err(&with(&format!(
        "{store}, cluster: {{ lease: {{ ttl: \"2s\" }} }}"
    )));
    assert!(text.contains("cluster.lease.ttl"), "{text}");
    assert!(text.contains("at least 5s"), "{text}");
    let text = err(&with(&format!(
        "{store}, cluster: {{ lease: {{ ttl: \"soon\" }} }}"
    )));
    assert!(text.contains("cluster.lease.ttl"), "{text}");
    let text = err(&with(&format!("{store}, cluster: {{ stanby: true }}")));
    assert!(text.contains("stanby"), "{text}");
    let loaded = load(&with(&format!(
        "{store}, cluster: {{ standby: true, lease: {{ ttl: \"7s\" }} }}"
    )))
    .unwrap();
    let cluster = loaded.config.cluster.unwrap();
    assert!(cluster.standby);
    assert_eq!(cluster.lease_ttl(), std::time::Duration::from_secs(7));
    let default = crate::config::store::ClusterConfig::default();
    assert!(!default.standby);
    assert_eq!(default.lease_ttl(), std::time::Duration::from_secs(15));
}
