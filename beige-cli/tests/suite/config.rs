//! `beige config validate` / `schema`, and the help texts.

use std::path::Path;

use super::{original_config, TestEnv};
use crate::assert_redacted_snapshot;

/// Validate a broken fixture: exit 1, nothing on stdout, one line on stderr.
fn broken(name: &str) -> (TestEnv, String) {
    let env = TestEnv::new();
    let path = env.fixture(&format!("broken/{name}.json5"));
    let run = env.run(&["config", "validate", path.to_str().unwrap()]);
    assert_eq!(run.code, Some(1), "{name}: {}", run.stderr);
    assert_eq!(run.stdout, "", "{name}");
    assert_eq!(run.stderr.lines().count(), 1, "{name}: {}", run.stderr);
    assert!(run.stderr.starts_with("error: "), "{name}: {}", run.stderr);
    (env, run.stderr)
}

#[test]
fn missing_agents() {
    let (env, stderr) = broken("missing-agents");
    assert_redacted_snapshot!(env, stderr);
}

#[test]
fn unknown_provider() {
    let (env, stderr) = broken("unknown-provider");
    assert_redacted_snapshot!(env, stderr);
}

#[test]
fn unset_variable() {
    let (env, stderr) = broken("unset-variable");
    assert_redacted_snapshot!(env, stderr);
}

#[test]
fn bad_agent_name() {
    let (env, stderr) = broken("bad-agent-name");
    assert_redacted_snapshot!(env, stderr);
}

#[test]
fn root_in_extra_mounts() {
    let (env, stderr) = broken("mount-root");
    assert_redacted_snapshot!(env, stderr);
}

#[test]
fn bad_memory_limit() {
    let (env, stderr) = broken("bad-memory-limit");
    assert_redacted_snapshot!(env, stderr);
}

#[test]
fn syntax_error() {
    let (env, stderr) = broken("syntax-error");
    assert_redacted_snapshot!(env, stderr);
}

#[test]
fn missing_file() {
    let env = TestEnv::new();
    let run = env.run(&["-c", "nope.json5", "config", "validate"]);
    assert_eq!(run.code, Some(1));
    assert_redacted_snapshot!(env, run.stderr);
}

#[test]
fn minimal_original_config_is_valid() {
    let env = TestEnv::new().with_var("ANTHROPIC_API_KEY", "sk-test");
    let path = original_config("minimal.json5");
    let run = env.run(&["config", "validate", path.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stderr, "");
    assert!(
        run.stdout
            .ends_with("minimal.json5 is valid: 1 agent (bot), 1 provider\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn full_original_config_is_valid() {
    let env = TestEnv::new().with_var("ANTHROPIC_API_KEY", "sk-test");
    let skill = env.dir().join("skills/code-review");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(skill.join("skill.json"), r#"{"name":"code-review"}"#).unwrap();
    let mut text = std::fs::read_to_string(original_config("full.json5")).unwrap();
    // The config mounts /srv/projects; create it when we may, else mount a temp folder.
    if let Err(e) = std::fs::create_dir_all("/srv/projects") {
        eprintln!("cannot create /srv/projects ({e}); mounting a temp folder instead");
        let projects = env.dir().join("projects");
        std::fs::create_dir_all(&projects).unwrap();
        text = text.replace(
            "\"/srv/projects\"",
            &format!("{:?}", projects.display().to_string()),
        );
    }
    let path = env.dir().join("config.json5");
    std::fs::write(&path, text).unwrap();

    let run = env.run(&["--config", path.to_str().unwrap(), "config", "validate"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stderr, "");
    assert_redacted_snapshot!(env, run.stdout);
}

#[test]
fn unknown_keys_are_warnings() {
    let env = TestEnv::new();
    let path = env.fixture("unknown-keys.json5");
    let run = env.run(&["config", "validate", path.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_redacted_snapshot!(
        env,
        format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr)
    );
}

#[test]
fn schema_is_the_committed_one() {
    let env = TestEnv::new();
    let run = env.run(&["config", "schema"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.schema.json");
    assert_eq!(
        run.stdout,
        std::fs::read_to_string(committed).unwrap(),
        "regenerate with `cargo run -p beige-cli -- config schema > config.schema.json`"
    );
}

#[test]
fn help_texts() {
    let env = TestEnv::new();
    let cases = [
        ("help_beige", &["--help"][..]),
        ("help_setup", &["setup", "--help"]),
        ("help_config", &["config", "--help"]),
        ("help_config_validate", &["config", "validate", "--help"]),
    ];
    for (name, args) in cases {
        let run = env.run(args);
        assert_eq!(run.code, Some(0), "{args:?}");
        insta::assert_snapshot!(name, run.stdout, &args.join(" "));
    }
    // A bare group prints its help and succeeds, like `--help`.
    assert_eq!(env.run(&[]).stdout, env.run(&["--help"]).stdout);
    assert_eq!(env.run(&["config"]).code, Some(0));
    assert!(env.run(&["config"]).stdout.contains("validate"));
}

#[test]
fn version_flag() {
    let env = TestEnv::new();
    for flag in ["-v", "--version"] {
        let run = env.run(&[flag]);
        assert_eq!(run.code, Some(0));
        assert_eq!(run.stdout, format!("beige {}\n", env!("CARGO_PKG_VERSION")));
    }
}
