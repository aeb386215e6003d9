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
