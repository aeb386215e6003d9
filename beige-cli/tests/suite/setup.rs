//! `beige setup`: what it creates, with which modes, and that a second run changes
//! nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::TestEnv;
use crate::assert_redacted_snapshot;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Every path under `root` with its mtime and (for files) contents.
fn state(root: &Path) -> BTreeMap<PathBuf, (SystemTime, u32, Option<Vec<u8>>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::metadata(&p).unwrap();
        let contents = if meta.is_dir() {
            for entry in std::fs::read_dir(&p).unwrap() {
                stack.push(entry.unwrap().path());
            }
            None
        } else {
            Some(std::fs::read(&p).unwrap())
        };
        out.insert(
            p,
            (
                meta.modified().unwrap(),
                meta.permissions().mode(),
                contents,
            ),
        );
    }
    out
}

#[test]
fn setup_creates_home_config_and_token_with_tight_modes() {
    let env = TestEnv::new();
    let run = env.run(&["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stderr, "");
    assert_redacted_snapshot!(env, run.stdout);

    let home = env.home();
    assert_eq!(mode(&home), 0o700);
    for dir in ["agents", "run", "plugins", "logs"] {
        assert!(home.join(dir).is_dir(), "{dir}");
        assert_eq!(mode(&home.join(dir)), 0o700, "{dir}");
    }
    assert_eq!(mode(&home.join("config.json5")), 0o600);
    assert_eq!(mode(&home.join("gateway.token")), 0o600);
    let token = std::fs::read_to_string(home.join("gateway.token")).unwrap();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));

    // The default config is commented JSON5 and loads without any API key set.
    let config = std::fs::read_to_string(home.join("config.json5")).unwrap();
    assert!(config.starts_with("// beige configuration"));
    assert!(config.contains("beige plugins install"));
    let run = env.run(&["config", "validate"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_redacted_snapshot!(env, run.stdout);
}

#[test]
fn second_setup_changes_nothing_and_says_so() {
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let before = state(&env.home());
    let run = env.run(&["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(state(&env.home()), before);
    assert_redacted_snapshot!(env, run.stdout);
}

#[test]
fn setup_keeps_existing_files_and_tightens_loose_modes() {
    let env = TestEnv::new();
    let home = env.home();
    std::fs::create_dir_all(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(home.join("gateway.token"), "my-own-token").unwrap();
    std::fs::set_permissions(
        home.join("gateway.token"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::write(home.join("config.json5"), "{ mine: true }").unwrap();

    let run = env.run(&["setup"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_redacted_snapshot!(env, run.stdout);
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&home.join("gateway.token")), 0o600);
    assert_eq!(
        std::fs::read_to_string(home.join("gateway.token")).unwrap(),
        "my-own-token"
    );
    assert_eq!(
        std::fs::read_to_string(home.join("config.json5")).unwrap(),
        "{ mine: true }"
    );
}

#[test]
fn validate_without_a_config_runs_setup_first() {
    let env = TestEnv::new();
    let run = env.run(&["config", "validate"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(env.home().join("config.json5").is_file());
    assert!(env.home().join("gateway.token").is_file());
    assert_redacted_snapshot!(
        env,
        format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr)
    );
}
