//! `beige users add|remove|list`: the config's `users` section edited in place through
//! the built binary — the owner's comments and layout elsewhere stay, a change that would
//! make the config invalid writes nothing, and the list shows what the gateway will use.

use super::TestEnv;

const CONFIG: &str = r#"// the team's gateway
{
  llm: { providers: { anthropic: {} } }, // keys come from the environment
  agents: {
    intern: { model: { provider: "anthropic", model: "claude-sonnet-4-6" }, tools: [] },
  },
}
"#;

fn env() -> TestEnv {
    let env = TestEnv::new();
    std::fs::write(env.dir().join("config.json5"), CONFIG).unwrap();
    env
}

fn text(env: &TestEnv) -> String {
    std::fs::read_to_string(env.dir().join("config.json5")).unwrap()
}

#[test]
fn users_are_added_changed_and_removed_keeping_the_rest_of_the_file() {
    let env = env();
    let c = ["-c", "config.json5", "users"];
    let run = |args: &[&str]| env.run(&[&c[..], args].concat());

    let added = run(&[
        "add",
        "ops1",
        "--role",
        "intern=operator",
        "--role",
        "*=viewer",
        "--telegram",
        "123456789",
    ]);
    assert_eq!(added.code, Some(0), "{}", added.stderr);
    assert!(
        added.stdout.contains("added user 'ops1'"),
        "{}",
        added.stdout
    );
    let after = text(&env);
    assert!(after.starts_with("// the team's gateway\n{"), "{after}");
    assert!(
        after.contains("// keys come from the environment"),
        "{after}"
    );
    let listed = run(&["list"]);
    assert_eq!(listed.code, Some(0), "{}", listed.stderr);
    assert_eq!(
        listed.stdout,
        "ops1  intern=operator *=viewer  telegram:123456789\n"
    );

    // A second user goes beside the first; changing one replaces its entry only.
    assert_eq!(run(&["add", "sec", "--role", "*=viewer"]).code, Some(0));
    let changed = run(&["add", "ops1", "--role", "intern=member"]);
    assert!(
        changed.stdout.contains("changed user 'ops1'"),
        "{}",
        changed.stdout
    );
    let listed = run(&["list", "--json"]);
    let users: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(
        users["ops1"]["roles"],
        serde_json::json!({"intern": "member"})
    );
    assert_eq!(users["sec"]["roles"], serde_json::json!({"*": "viewer"}));

    // Invalid changes write nothing and say why.
    let before = text(&env);
    let owner_on_agent = run(&["add", "boss", "--role", "intern=owner"]);
    assert_eq!(owner_on_agent.code, Some(78), "{}", owner_on_agent.stderr);
    assert!(
        owner_on_agent.stderr.contains("nothing was written"),
        "{}",
        owner_on_agent.stderr
    );
    assert!(
        owner_on_agent.stderr.contains("owner"),
        "{}",
        owner_on_agent.stderr
    );
    let unknown_agent = run(&["add", "x", "--role", "nope=member"]);
    assert_eq!(unknown_agent.code, Some(78), "{}", unknown_agent.stderr);
    let bad_role = run(&["add", "x", "--role", "intern=admin"]);
    assert_eq!(bad_role.code, Some(2), "{}", bad_role.stderr);
    assert!(
        bad_role
            .stderr
            .contains("viewer, member, operator or owner"),
        "{}",
        bad_role.stderr
    );
    let bad_name = run(&["add", "Bad Name", "--role", "intern=member"]);
    assert_eq!(bad_name.code, Some(78), "{}", bad_name.stderr);
    assert_eq!(
        text(&env),
        before,
        "a refused change leaves the file as it was"
    );

    assert_eq!(run(&["remove", "ops1"]).code, Some(0));
    let ghost = run(&["remove", "ghost"]);
    assert_eq!(ghost.code, Some(1));
    assert!(ghost.stderr.contains("no user 'ghost'"), "{}", ghost.stderr);
    assert_eq!(run(&["list"]).stdout, "sec  *=viewer\n");
    assert!(text(&env).contains("// keys come from the environment"));
}
