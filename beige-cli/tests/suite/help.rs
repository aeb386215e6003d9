//! Help texts of every command (snapshots), completions and the TUI placeholder.

use super::TestEnv;

#[test]
fn help_of_every_command() {
    let env = TestEnv::new();
    let cases: &[(&str, &[&str])] = &[
        ("help_gateway", &["gateway", "--help"]),
        ("help_gateway_start", &["gateway", "start", "--help"]),
        ("help_gateway_stop", &["gateway", "stop", "--help"]),
        ("help_gateway_restart", &["gateway", "restart", "--help"]),
        ("help_gateway_status", &["gateway", "status", "--help"]),
        ("help_gateway_logs", &["gateway", "logs", "--help"]),
        ("help_run", &["run", "--help"]),
        ("help_exec", &["exec", "--help"]),
        ("help_sessions", &["sessions", "--help"]),
        ("help_audit", &["audit", "--help"]),
        ("help_audit_tail", &["audit", "tail", "--help"]),
        ("help_doctor", &["doctor", "--help"]),
        ("help_egress", &["egress", "--help"]),
        ("help_egress_test", &["egress", "test", "--help"]),
        ("help_policy", &["policy", "--help"]),
        ("help_policy_check", &["policy", "check", "--help"]),
        ("help_policy_list", &["policy", "list", "--help"]),
        ("help_audit_verify", &["audit", "verify", "--help"]),
        ("help_audit_export", &["audit", "export", "--help"]),
        ("help_mcp", &["mcp", "--help"]),
        ("help_mcp_serve", &["mcp", "serve", "--help"]),
        ("help_mcp_list", &["mcp", "list", "--help"]),
        ("help_users", &["users", "--help"]),
        ("help_users_list", &["users", "list", "--help"]),
        ("help_users_add", &["users", "add", "--help"]),
        (
            "help_users_token_create",
            &["users", "token", "create", "--help"],
        ),
        ("help_demo", &["demo", "--help"]),
        ("help_tui", &["tui", "--help"]),
        ("help_completions", &["completions", "--help"]),
    ];
    for (name, args) in cases {
        let run = env.run(args);
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        insta::assert_snapshot!(*name, run.stdout, &args.join(" "));
    }
    for group in ["gateway", "audit", "egress", "policy", "mcp", "users"] {
        let run = env.run(&[group]);
        assert_eq!(run.code, Some(0));
        assert_eq!(run.stdout, env.run(&[group, "--help"]).stdout);
    }
}

#[test]
fn completions_for_each_shell() {
    let env = TestEnv::new();
    for shell in ["bash", "zsh", "fish"] {
        let run = env.run(&["completions", shell]);
        assert_eq!(run.code, Some(0), "{shell}: {}", run.stderr);
        assert!(run.stdout.contains("gateway"), "{shell}");
    }
    let run = env.run(&["completions", "tcsh"]);
    assert_eq!(run.code, Some(2));
}

#[test]
fn tui_without_a_gateway_says_how_to_start_it() {
    let env = TestEnv::new();
    // Nothing listens on this port.
    let run = env.run(&["tui", "-g", "http://127.0.0.1:9"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(all.contains("beige gateway start"), "{all}");
}
