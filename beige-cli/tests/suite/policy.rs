//! `beige policy check` and `beige policy list`: an agent's rules, decided offline.

use super::{Run, TestEnv};

const CONFIG: &str = r#"{
  llm: { providers: { anthropic: {} } },
  agents: {
    intern: {
      model: { provider: "anthropic", model: "claude-sonnet-4-6" },
      tools: ["gh"],
      policy: {
        rules: [
          { id: "no-force", tool: "exec", pattern: ["git", "push", ["-f", "--force"]], decision: "deny",
            justification: "force-push rewrites shared history",
            match: ["git push -f origin main"], notMatch: ["git push origin main"] },
          { id: "push", tool: "exec", pattern: ["git", ["push", "tag"]], decision: "ask",
            justification: "publishes work outside the sandbox", match: ["git push origin main"] },
          { tool: "write", path: ".github/workflows/**", decision: "ask" },
          { tool: "gh", pattern: ["pr", "merge"], decision: "ask" },
          { tool: "gh", pattern: ["repo", "delete"], decision: "deny" },
        ],
        grants: [
          { tool: "gh", pattern: ["pr", "merge", "41"], exact: true, grantedBy: "ops1" },
        ],
      },
    },
    plain: { model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [] },
  },
}"#;

fn env() -> TestEnv {
    let env = TestEnv::new();
    std::fs::write(env.dir().join("config.json5"), CONFIG).unwrap();
    env
}

/// `beige -c config.json5 policy ARGS…`.
fn policy(env: &TestEnv, args: &[&str]) -> Run {
    let mut all = vec!["-c", "config.json5", "policy"];
    all.extend_from_slice(args);
    env.run(&all)
}

#[test]
fn policy_check_prints_verdict_reason_rules_and_grant() {
    let env = env();
    let cases: &[(&str, &[&str], i32)] = &[
        (
            "policy_check_deny",
            &["check", "intern", "--", "exec", "git push -f origin"],
            1,
        ),
        (
            "policy_check_ask",
            &[
                "check",
                "intern",
                "--",
                "exec",
                "cd x && git push origin main",
            ],
            2,
        ),
        (
            "policy_check_allow",
            &["check", "intern", "--", "exec", "ls", "-la"],
            0,
        ),
        (
            "policy_check_plugin_ask",
            &["check", "intern", "--", "gh", "pr", "merge", "42"],
            2,
        ),
        (
            "policy_check_plugin_granted",
            &["check", "intern", "--", "gh", "pr", "merge", "41"],
            0,
        ),
        (
            "policy_check_write",
            &["check", "intern", "--", "write", ".github/workflows/ci.yml"],
            2,
        ),
        (
            "policy_check_no_policy",
            &["check", "plain", "--", "exec", "git push -f"],
            0,
        ),
    ];
    for (name, args, want) in cases {
        let run = policy(&env, args);
        assert_eq!(
            run.code,
            Some(*want),
            "{args:?}: {}{}",
            run.stdout,
            run.stderr
        );
        assert_eq!(run.stderr, "", "{args:?}");
        insta::assert_snapshot!(*name, run.stdout, &args.join(" "));
    }
}

#[test]
fn policy_check_json_is_one_object() {
    let env = env();
    let run = policy(
        &env,
        &[
            "check",
            "intern",
            "--json",
            "--",
            "exec",
            "git push -f origin",
        ],
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["verdict"], "deny");
    assert_eq!(v["rule"], "no-force");
    assert_eq!(v["justification"], "force-push rewrites shared history");
    assert_eq!(v["args"], serde_json::json!(["git push -f origin"]));
    let rules: Vec<&str> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["no-force", "push"]);
    insta::assert_snapshot!("policy_check_json", run.stdout);
    let run = policy(
        &env,
        &["check", "intern", "--json", "--", "gh", "pr", "merge", "41"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["grant"]["grantedBy"], "ops1");
    assert_eq!(v["grant"]["id"], "g0");
}

#[test]
fn policy_list_prints_rules_and_grants() {
    let env = env();
    let run = policy(&env, &["list", "intern"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    insta::assert_snapshot!("policy_list", run.stdout);
    let run = policy(&env, &["list", "plain"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("no policy"), "{}", run.stdout);
    let run = policy(&env, &["list", "intern", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["policy"]["rules"][0]["id"], "no-force");
}

#[test]
fn policy_check_refuses_unknown_agents_and_broken_configs() {
    let env = env();
    let run = policy(&env, &["check", "nobody", "--", "exec", "ls"]);
    assert_eq!(run.code, Some(4));
    assert!(run.stderr.contains("no agent 'nobody'"), "{}", run.stderr);
    std::fs::write(
        env.dir().join("config.json5"),
        CONFIG.replace(
            "notMatch: [\"git push origin main\"]",
            "notMatch: [\"git push --force\"]",
        ),
    )
    .unwrap();
    let run = policy(&env, &["check", "intern", "--", "exec", "ls"]);
    assert_eq!(run.code, Some(78));
    assert!(
        run.stderr
            .contains("rule 'no-force': the notMatch example \"git push --force\" matches it"),
        "{}",
        run.stderr
    );
}
