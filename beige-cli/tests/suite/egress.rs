//! `beige egress test` (alias `check`): the dry run of an agent's egress rules. Every
//! run here uses `--no-resolve` or an IP literal, so the binary never looks a name up.

use super::{Run, TestEnv};

const CONFIG: &str = r#"{
  llm: { providers: { anthropic: {} } },
  egress: { rules: [{ id: "pypi", hosts: ["pypi.org", "files.pythonhosted.org"] }] },
  agents: {
    intern: {
      model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [],
      egress: { rules: [
        { id: "gh", hosts: ["api.github.com"], methods: ["GET"], paths: ["/repos/acme/**"] },
        { id: "docs", hosts: ["docs.example.com"], ports: [80], paths: ["/pub/**"] },
        { id: "ssh", hosts: ["github.com"], ports: [22] },
        { id: "nexus", hosts: ["nexus.corp.example"], allowPrivate: ["10.1.2.3/32"] },
        { id: "lab", hosts: ["ip:192.168.0.0/16"] },
        { id: "no-gist", hosts: ["gist.github.com"], action: "deny" },
      ] },
    },
    sealed: { model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [] },
    open: {
      model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [],
      sandbox: { network: "bridge" },
    },
  },
}"#;

fn env() -> TestEnv {
    let env = TestEnv::new();
    std::fs::write(env.dir().join("config.json5"), CONFIG).unwrap();
    env
}

/// `beige -c config.json5 egress test ARGS…`.
fn test(env: &TestEnv, args: &[&str]) -> Run {
    let mut all = vec!["-c", "config.json5", "egress", "test"];
    all.extend_from_slice(args);
    env.run(&all)
}

fn refused(run: &Run, reason: &str) {
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains(&format!("✗ refused: {reason} (")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains(&format!("X-Beige-Egress: denied; reason={reason}; id=")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.ends_with("→ refused\n"), "{}", run.stdout);
}

#[test]
fn egress_test_allows_a_host_a_rule_names() {
    let env = env();
    let run = test(
        &env,
        &[
            "intern",
            "https://pypi.org/simple/requests/",
            "--no-resolve",
        ],
    );
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stderr, "");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "agent 'intern' → pypi.org:443 (https: a CONNECT tunnel)"
    );
    assert_eq!(lines[1], "✓ allowed by rule 'pypi' (mode tunnel)");
    assert!(
        lines[2].contains("its bytes are tunnelled, not read"),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].starts_with("• not resolved (--no-resolve)"),
        "{}",
        lines[3]
    );
    assert_eq!(lines.last(), Some(&"→ allowed"));

    // `check` is the same command; a bare host:port is a CONNECT.
    let run = env.run(&[
        "-c",
        "config.json5",
        "egress",
        "check",
        "intern",
        "github.com:22",
        "--no-resolve",
    ]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("✓ allowed by rule 'ssh' (mode tunnel)"),
        "{}",
        run.stdout
    );

    // The allowPrivate ranges are named, since the gateway would still classify.
    let run = test(&env, &["intern", "nexus.corp.example", "--no-resolve"]);
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert!(
        run.stdout.contains("outside allowPrivate [10.1.2.3/32]"),
        "{}",
        run.stdout
    );
}

#[test]
fn egress_test_checks_method_and_path_of_plain_http_only() {
    let env = env();
    let run = test(
        &env,
        &[
            "intern",
            "http://docs.example.com/pub/a.txt?x=1",
            "--no-resolve",
        ],
    );
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .starts_with("agent 'intern' → docs.example.com:80 (plain http: GET /pub/a.txt)\n"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("✓ allowed by rule 'docs' (mode http)"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("inspect mode"), "{}", run.stdout);

    let run = test(
        &env,
        &["intern", "http://docs.example.com/private", "--no-resolve"],
    );
    refused(&run, "path_not_allowed");
    assert!(run.stdout.contains("  rule: 'docs'"), "{}", run.stdout);

    // Over https the rule's methods and paths are kept by inspecting the connection.
    let run = test(
        &env,
        &["intern", "https://api.github.com/gists", "--no-resolve"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert!(
        run.stdout.contains("✓ allowed by rule 'gh' (mode inspect)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("checks each request's method and path"),
        "{}",
        run.stdout
    );

    let run = test(
        &env,
        &[
            "intern",
            "-X",
            "post",
            "http://docs.example.com/pub/a",
            "--no-resolve",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert!(
        run.stdout.contains("(plain http: POST /pub/a)"),
        "{}",
        run.stdout
    );
}

#[test]
fn egress_test_no_rule() {
    let env = env();
    let run = test(
        &env,
        &["intern", "https://api.openai.com/v1/models", "--no-resolve"],
    );
    refused(&run, "no_rule");
    assert!(
        run.stdout
            .contains("✗ refused: no_rule (no rule allows it)"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("  rule: none ("), "{}", run.stdout);
    assert!(
        run.stdout.contains(
            "beige: egress to api.openai.com:443 refused for agent 'intern': no rule allows it"
        ),
        "{}",
        run.stdout
    );
}

#[test]
fn egress_test_denied_by_rule() {
    let env = env();
    let run = test(
        &env,
        &["intern", "https://gist.github.com/", "--no-resolve"],
    );
    refused(&run, "denied_by_rule");
    assert!(
        run.stdout.contains("  rule: 'no-gist' (the deny rule)"),
        "{}",
        run.stdout
    );
}

#[test]
fn egress_test_port_not_allowed() {
    let env = env();
    let run = test(&env, &["intern", "https://pypi.org:8443/", "--no-resolve"]);
    refused(&run, "port_not_allowed");
    assert!(
        run.stdout.contains(
            "  rule: 'pypi' (it allows the host on port(s) 443; add 8443 to its `ports` to allow this one)"
        ),
        "{}",
        run.stdout
    );
    // Plain http is port 80, which must be listed too.
    let run = test(&env, &["intern", "http://pypi.org/simple/", "--no-resolve"]);
    refused(&run, "port_not_allowed");
}

#[test]
fn egress_test_ip_literal() {
    let env = env();
    let run = test(&env, &["intern", "https://1.2.3.4/", "--no-resolve"]);
    refused(&run, "ip_literal");
    assert!(run.stdout.contains("`ip:` rules"), "{}", run.stdout);
    // An address an `ip:` rule allows is classified as it is, without any lookup:
    // private space needs allowPrivate.
    let run = test(&env, &["intern", "https://192.168.1.10/"]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("✓ allowed by rule 'lab' (mode tunnel)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("addresses (the address itself):"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(
            "  ✗ 192.168.1.10 (private): refused: private_address (no allowPrivate covers it)"
        ),
        "{}",
        run.stdout
    );
    assert!(run.stdout.ends_with("→ refused\n"), "{}", run.stdout);
}

#[test]
fn egress_test_of_an_agent_without_egress() {
    let env = env();
    let run = test(&env, &["sealed", "https://pypi.org/", "--no-resolve"]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert_eq!(
        run.stderr,
        "✗ agent 'sealed' has no egress: every connection from its sandbox is refused (add agents.sealed.egress)\n"
    );
    // Docker's bridge is open egress: allowed, but not by beige.
    let run = test(&env, &["open", "https://pypi.org/", "--no-resolve"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("⚠ agent 'open' has sandbox.network \"bridge\": open egress, not controlled by beige (no rules, no audit)"), "{}", run.stdout);
}

#[test]
fn egress_test_usage_errors_exit_2() {
    let env = env();
    let run = test(&env, &["nobody", "https://pypi.org/", "--no-resolve"]);
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "error: no agent 'nobody' in the config; the agents are: intern, sealed, open\n"
    );
    for url in [
        "ftp://pypi.org/",
        "pypi.org/simple",
        "https://pypi.org:0/",
        "https://u@pypi.org/",
    ] {
        let run = test(&env, &["intern", url, "--no-resolve"]);
        assert_eq!(run.code, Some(2), "{url}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.starts_with("error: "), "{url}: {}", run.stderr);
    }
    let run = env.run(&[
        "-c",
        "missing.json5",
        "egress",
        "test",
        "intern",
        "pypi.org",
        "--no-resolve",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("no config at"), "{}", run.stderr);
    std::fs::write(
        env.dir().join("broken.json5"),
        CONFIG.replace("methods: [\"GET\"]", "methods: [\"get\"]"),
    )
    .unwrap();
    let run = env.run(&[
        "-c",
        "broken.json5",
        "egress",
        "test",
        "intern",
        "pypi.org",
        "--no-resolve",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("agents.intern.egress.rules[0].methods[0]"),
        "{}",
        run.stderr
    );
    // A field of the spec that beige does not support yet is refused, not ignored.
    std::fs::write(
        env.dir().join("unsupported.json5"),
        CONFIG.replace(
            "egress: { rules: [{ id: \"pypi\"",
            "egress: { defaultMode: \"inspect\", rules: [{ id: \"pypi\"",
        ),
    )
    .unwrap();
    let run = env.run(&[
        "-c",
        "unsupported.json5",
        "egress",
        "test",
        "intern",
        "pypi.org",
        "--no-resolve",
    ]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("defaultMode"), "{}", run.stderr);
    // A missing argument is clap's usage error, also 2.
    assert_eq!(env.run(&["egress", "test", "intern"]).code, Some(2));
}
