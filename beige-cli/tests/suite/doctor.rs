//! `beige doctor`: each broken piece is named with its fix, and the exit code says
//! whether anything failed.

use super::TestEnv;

/// Run doctor with extra environment; returns (exit code, stdout).
fn doctor(env: &TestEnv, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["doctor"];
    all.extend_from_slice(args);
    let run = env.run(&all);
    (run.code, run.stdout, run.stderr)
}

/// The `✗` line containing `needle` and the fix printed under it.
fn failure<'a>(stdout: &'a str, needle: &str) -> (&'a str, &'a str) {
    let lines: Vec<&str> = stdout.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.starts_with('✗') && l.contains(needle))
        .unwrap_or_else(|| panic!("no failed check about {needle:?} in:\n{stdout}"));
    let fix = lines.get(i + 1).copied().unwrap_or_default();
    assert!(
        fix.trim_start().starts_with("fix: "),
        "no fix under {:?}:\n{stdout}",
        lines[i]
    );
    (lines[i], fix)
}

#[test]
fn doctor_names_an_unreachable_docker_engine_and_the_fix() {
    let env = TestEnv::new().with_var("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let (code, stdout, stderr) = doctor(&env, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stderr.contains("check(s) failed"), "{stderr}");
    let (line, fix) = failure(&stdout, "Docker engine");
    assert!(line.contains("not reachable"), "{line}");
    assert!(fix.contains("scripts/setup-docker"), "{fix}");
    assert!(
        stdout.contains("DOCKER_HOST is set to unix:///nonexistent/docker.sock"),
        "{stdout}"
    );
    // The rest still gets checked.
    assert!(stdout.contains("✓ BEIGE_HOME"), "{stdout}");
    assert!(stdout.contains("✓ API token"), "{stdout}");
    assert!(stdout.contains("✓ config"), "{stdout}");
}

#[test]
fn doctor_names_a_dynamically_linked_shim_and_the_fix() {
    let env = TestEnv::new().with_var("BEIGE_SHIM", "/bin/sh");
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let (code, stdout, _) = doctor(&env, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    let (line, fix) = failure(&stdout, "shim");
    assert!(line.contains("/bin/sh"), "{line}");
    assert!(line.contains("dynamically linked"), "{line}");
    assert!(fix.contains("scripts/build-shim"), "{fix}");
}

#[test]
fn doctor_names_a_config_error() {
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    std::fs::write(
        env.home().join("config.json5"),
        "{ llm: { providers: {} }, agents: { bot: { model: { provider: 'nope', model: 'x' }, tools: [] } } }",
    )
    .unwrap();
    let (code, stdout, _) = doctor(&env, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    let (line, fix) = failure(&stdout, "the config does not load");
    assert!(line.contains("agents.bot.model.provider"), "{line}");
    assert!(fix.contains("beige config validate"), "{fix}");
}

#[test]
fn doctor_names_a_missing_home_and_loose_modes() {
    let env = TestEnv::new();
    let (code, stdout, _) = doctor(&env, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    let (_, fix) = failure(&stdout, "does not exist");
    assert!(fix.contains("beige setup"), "{fix}");
    assert!(!env.home().exists(), "doctor must not create anything");

    use std::os::unix::fs::PermissionsExt;
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let token = env.home().join("gateway.token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, stdout, _) = doctor(&env, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    let (line, fix) = failure(&stdout, "API token");
    assert!(line.contains("0644"), "{line}");
    assert!(fix.contains("chmod 600"), "{fix}");
}

#[test]
fn doctor_shows_an_agents_prompt() {
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    std::fs::write(
        env.home().join("config.json5"),
        "{ llm: { providers: { anthropic: {} } }, plugins: { kv: {} }, agents: { bot: { model: { provider: 'anthropic', model: 'claude-sonnet-4-6' }, tools: ['kv'] } } }",
    )
    .unwrap();
    let (_, stdout, _) = doctor(&env, &["--agent", "bot"]);
    assert!(
        stdout.contains("✓ system prompt of agent 'bot'"),
        "{stdout}"
    );
    assert!(stdout.contains("│ ## Available Tools"), "{stdout}");
    assert!(stdout.contains("│   kv get <key>"), "{stdout}");
    let (code, stdout, _) = doctor(&env, &["--agent", "nobody"]);
    assert_eq!(code, Some(1));
    let (_, fix) = failure(&stdout, "no agent 'nobody'");
    assert!(fix.contains("bot"), "{fix}");
}

/// A stand-in for a running gateway on loopback: `/api/health`, `/api/agents` and
/// `/api/agents/{name}/sandbox` with canned answers, the bearer token checked like the
/// real one. Serves until the test process ends.
fn fake_gateway(token: String, sandboxes: Vec<serde_json::Value>) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let head = String::from_utf8_lossy(&buf).to_string();
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            let authorized = head.lines().any(|l| {
                l.to_ascii_lowercase().starts_with("authorization:")
                    && l.trim_end().ends_with(&format!("Bearer {token}"))
            });
            let agents: Vec<&str> = sandboxes
                .iter()
                .map(|s| s["agent"].as_str().unwrap())
                .collect();
            let (status, body) = if path == "/api/health" {
                (
                    "200 OK",
                    serde_json::json!({"status": "ok", "version": "9.9.9", "agents": agents.len()}),
                )
            } else if !authorized {
                (
                    "401 Unauthorized",
                    serde_json::json!({"error": "Missing or invalid token"}),
                )
            } else if path == "/api/agents" {
                let list: Vec<_> = agents
                    .iter()
                    .map(|a| serde_json::json!({"name": a, "model": "anthropic/claude-sonnet-4-6"}))
                    .collect();
                ("200 OK", serde_json::json!({ "agents": list }))
            } else if let Some(s) = sandboxes
                .iter()
                .find(|s| path == format!("/api/agents/{}/sandbox", s["agent"].as_str().unwrap()))
            {
                if s["oldGateway"] == true {
                    // A gateway from before the route.
                    ("404 Not Found", serde_json::json!({"error": "Not found"}))
                } else {
                    ("200 OK", s.clone())
                }
            } else {
                ("404 Not Found", serde_json::json!({"error": "Not found"}))
            };
            let body = body.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// A home whose config points at `port` (no Docker, so doctor stays quick).
fn env_with_gateway_port(port: u16) -> TestEnv {
    let env = TestEnv::new().with_var("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    assert_eq!(env.run(&["setup"]).code, Some(0));
    std::fs::write(
        env.home().join("config.json5"),
        format!(
            "{{ gateway: {{ port: {port} }}, llm: {{ providers: {{ anthropic: {{}} }} }}, agents: {{ bot: {{ model: {{ provider: 'anthropic', model: 'claude-sonnet-4-6' }}, tools: [] }} }} }}"
        ),
    )
    .unwrap();
    env
}

/// The line starting with `mark` that contains `needle`.
fn line<'a>(stdout: &'a str, mark: char, needle: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(mark) && l.contains(needle))
        .unwrap_or_else(|| panic!("no {mark} line about {needle:?} in:\n{stdout}"))
}

#[test]
fn doctor_reports_each_agents_shim_link_from_the_running_gateway() {
    let sandboxes = vec![
        serde_json::json!({
            "agent": "up", "container": "beige-x-up", "linkMode": "unix",
            "link": {"agent": "up", "connected": true, "carrier": "unix", "bootId": "b1",
                     "connectedSecs": 60, "lastPingUs": 180, "connects": 1, "rejectedPeers": 0,
                     "opsLink": 42, "opsFallback": 1, "duplicatesDropped": 0},
            "pingUs": 210,
        }),
        serde_json::json!({
            "agent": "down", "container": "beige-x-down", "linkMode": "attach",
            "link": {"agent": "down", "connected": false, "connects": 2, "rejectedPeers": 1,
                     "opsLink": 5, "opsFallback": 3, "duplicatesDropped": 0},
            "pingUs": null,
        }),
        serde_json::json!({
            "agent": "root", "container": "beige-x-root", "linkMode": "off",
            "link": null, "pingUs": null,
        }),
    ];
    // The token the fake expects is written into the home after setup.
    let token = "doctor-test-token-0123456789";
    let port = fake_gateway(token.to_string(), sandboxes);
    let env = env_with_gateway_port(port);
    std::fs::write(env.home().join("gateway.token"), token).unwrap();

    let (code, stdout, _) = doctor(&env, &[]);
    // Docker is unreachable on purpose; a link down or off is not a failure.
    assert_eq!(code, Some(1), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with('✗')).count(),
        1,
        "only Docker fails:\n{stdout}"
    );
    assert!(
        stdout.contains("used by a running beige gateway (version 9.9.9)"),
        "{stdout}"
    );
    assert_eq!(
        line(&stdout, '✓', "agent 'up'"),
        "✓ agent 'up': link (unix): up over unix, ping 0.21 ms, 42 ops over the link, 1 via docker exec"
    );
    let down = line(&stdout, '⚠', "agent 'down': link down");
    assert!(down.contains("(attach)"), "{down}");
    assert!(
        down.contains("core tools fall back to docker exec (slower)"),
        "{down}"
    );
    assert!(down.contains("beige gateway logs"), "{down}");
    assert!(
        down.contains("5 ops over the link, 3 via docker exec"),
        "{down}"
    );
    let refused = line(&stdout, '⚠', "agent 'down': 1 peer(s) were refused");
    assert!(refused.contains("beige audit tail"), "{refused}");
    assert_eq!(
        line(&stdout, '•', "agent 'root'"),
        "• agent 'root': link off (sandbox.link = \"off\" or a root sandbox): core tools use docker exec"
    );

    // A token the gateway refuses is a failure with a fix.
    std::fs::write(env.home().join("gateway.token"), "not-the-token").unwrap();
    let (code, stdout, _) = doctor(&env, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    let (line, fix) = failure(&stdout, "refused the token");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(fix.contains("beige gateway restart"), "{fix}");
}

#[test]
fn doctor_says_the_link_check_needs_a_running_gateway() {
    let port = super::free_port();
    let env = env_with_gateway_port(port);
    let (_, stdout, _) = doctor(&env, &[]);
    let note = line(&stdout, '•', "shim links not checked");
    assert!(note.contains("needs a running gateway"), "{note}");
    assert!(note.contains("beige gateway start"), "{note}");
    assert!(!stdout.contains("link ("), "{stdout}");
}

#[test]
fn doctor_notes_a_gateway_that_does_not_report_links() {
    let sandboxes = vec![serde_json::json!({"agent": "a", "oldGateway": true})];
    let token = "doctor-test-token-abcdef";
    let port = fake_gateway(token.to_string(), sandboxes);
    let env = env_with_gateway_port(port);
    std::fs::write(env.home().join("gateway.token"), token).unwrap();
    let (_, stdout, _) = doctor(&env, &[]);
    let note = line(&stdout, '•', "shim links not checked");
    assert!(note.contains("version 9.9.9"), "{note}");
    assert!(note.contains("beige gateway restart"), "{note}");
    assert!(!stdout.contains("⚠"), "{stdout}");
}

#[test]
fn doctor_reports_the_descriptor_limit_and_free_space() {
    let env = env_with_gateway_port(super::free_port());
    let (_, stdout, _) = doctor(&env, &[]);
    let fds = stdout
        .lines()
        .find(|l| l.contains("descriptor limit here: soft "))
        .unwrap_or_else(|| panic!("no descriptor limit in:\n{stdout}"));
    assert!(fds.contains(", hard "), "{fds}");
    let disk = line(&stdout, '✓', "free space on the filesystem of");
    assert!(disk.contains(&env.home().display().to_string()), "{disk}");
    assert!(
        disk.contains("(BEIGE_HOME, the workspace of agent 'bot')"),
        "{disk}"
    );
    assert!(
        disk.contains("the gateway pauses agents below 512.0 MiB (gateway.minFreeSpace)"),
        "{disk}"
    );
}

#[test]
fn doctor_warns_when_free_space_is_below_the_threshold() {
    let env = env_with_gateway_port(super::free_port());
    let config = env.home().join("config.json5");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("gateway: {", "gateway: { minFreeSpace: '99.9%',");
    std::fs::write(&config, text).unwrap();
    let (_, stdout, _) = doctor(&env, &[]);
    let warning = line(&stdout, '⚠', "free space on the filesystem of");
    assert!(warning.contains("below the threshold"), "{warning}");
    assert!(
        warning.contains("99.9% (gateway.minFreeSpace)"),
        "{warning}"
    );
    assert!(warning.contains("lower gateway.minFreeSpace"), "{warning}");
    // A warning, not a failure.
    assert!(!stdout.contains("✗ free space"), "{stdout}");

    // Off: no threshold to warn about.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("minFreeSpace: '99.9%'", "minFreeSpace: 0");
    std::fs::write(&config, text).unwrap();
    let (_, stdout, _) = doctor(&env, &[]);
    let ok = line(&stdout, '✓', "free space on the filesystem of");
    assert!(ok.contains("the free-space guard is off"), "{ok}");
}

#[test]
fn doctor_reads_the_descriptor_limit_of_the_running_gateway() {
    let env = env_with_gateway_port(super::free_port());
    // A stand-in whose command line looks like the daemon's, with a low soft limit.
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            "ulimit -Sn 900 && read line",
            "sh",
            "gateway",
            "--foreground",
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(env.home().join("gateway.pid"), format!("{}\n", child.id())).unwrap();
    // Give the shell the moment it needs to lower its own limit.
    let limits = format!("/proc/{}/limits", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !std::fs::read_to_string(&limits)
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Max open files") && l.split_whitespace().nth(3) == Some("900"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the limit was not lowered"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (_, stdout, _) = doctor(&env, &[]);
    child.kill().unwrap();
    child.wait().unwrap();
    let warning = line(
        &stdout,
        '⚠',
        &format!(
            "descriptor limit of the running gateway (pid {}): soft 900",
            child.id()
        ),
    );
    assert!(warning.contains("LimitNOFILE"), "{warning}");
}

#[test]
fn doctor_reports_each_agents_egress_posture() {
    let env = env_with_gateway_port(super::free_port());
    std::fs::write(
        env.home().join("config.json5"),
        r#"{
  llm: { providers: { anthropic: {} } },
  egress: { rules: [{ id: "pypi", hosts: ["pypi.org", "files.pythonhosted.org"] }] },
  agents: {
    sealed: { model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [] },
    net: {
      model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [],
      egress: { rules: [
        { id: "nexus", hosts: ["nexus.corp.example"], allowPrivate: ["10.1.2.3/32"] },
        { id: "gh", hosts: ["api.github.com"], methods: ["GET"] },
        { id: "no-gist", hosts: ["gist.github.com"], action: "deny" },
      ] },
    },
    open: {
      model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [],
      sandbox: { network: "bridge" },
    },
  },
}"#,
    )
    .unwrap();
    let (_, stdout, _) = doctor(&env, &[]);
    assert_eq!(
        line(&stdout, '•', "agent 'sealed': egress"),
        "• agent 'sealed': egress: none (no egress: sealed; add agents.sealed.egress to allow hosts)"
    );
    assert_eq!(
        line(&stdout, '✓', "agent 'net': egress"),
        "✓ agent 'net': egress: through the gateway: 4 rules (hosts: pypi.org, files.pythonhosted.org, nexus.corp.example, api.github.com)"
    );
    let open = line(&stdout, '⚠', "agent 'open': egress");
    assert!(
        open.contains("open egress, not controlled by beige (no rules, no audit)"),
        "{open}"
    );
    let private = line(&stdout, '⚠', "egress rule 'nexus'");
    assert!(private.contains("agents.net.egress.rules"), "{private}");
    assert!(private.contains("allowPrivate [10.1.2.3/32]"), "{private}");
    let inspect = line(&stdout, '⚠', "egress rule 'gh'");
    assert!(inspect.contains("is inspected"), "{inspect}");
    assert!(inspect.contains("egress CA"), "{inspect}");
    // Warnings, not failures.
    assert!(!stdout.contains("✗ agent"), "{stdout}");
    assert!(!stdout.contains("✗ egress"), "{stdout}");
}

/// `store.url`: doctor names the database (without its password) and whether it can be
/// used — a reachable server with no beige tables yet is fine, an empty socket directory
/// is a failure with the fix; it changes nothing in the database.
#[test]
fn doctor_checks_the_postgresql_store_and_names_it_without_the_password() {
    let with_store = |env: &TestEnv, url: &str| {
        let path = env.home().join("config.json5");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replacen('{', &format!("{{ store: {{ url: {url:?} }},"), 1);
        std::fs::write(&path, text).unwrap();
    };
    // Nothing listens in an empty directory: refused on this machine, no network.
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let empty = env.dir().join("no-server");
    std::fs::create_dir_all(&empty).unwrap();
    with_store(
        &env,
        &format!(
            "postgres://beige:s3cret@localhost/beige?host={}",
            empty.display()
        ),
    );
    let (code, stdout, _) = doctor(&env, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    let (line, fix) = failure(&stdout, "store");
    assert!(line.contains("beige:***@localhost"), "{line}");
    assert!(!stdout.contains("s3cret"), "{stdout}");
    assert!(fix.contains("store.url"), "{fix}");

    let Some(url) = beige_testkit::postgres::url() else {
        return;
    };
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    with_store(&env, &url);
    let (_, stdout, _) = doctor(&env, &[]);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with('✓') && l.contains("is reachable")),
        "{stdout}"
    );
}
