//! `beige plugins install|list|remove|update` on the real binary, with the example
//! plugins of `examples/plugins/`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::TestEnv;
use crate::assert_redacted_snapshot;

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/plugins")
        .join(name)
        .canonicalize()
        .unwrap()
        .display()
        .to_string()
}

fn config_path(env: &TestEnv) -> PathBuf {
    env.home().join("config.json5")
}

#[test]
fn install_list_remove() {
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let pristine = std::fs::read_to_string(config_path(&env)).unwrap();

    let notes = example("python-notes");
    let run = env.run(&["plugins", "install", &notes]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout.replace(&notes, "[NOTES]"),
        "Installing from: [NOTES]\nInstalled 1 plugin(s) and added to config.json5:\n  - notes: Notes per agent, kept in the gateway's store — an external plugin in Python (standard library only).\n\nNext: give agents the tools in their `tools` list (e.g. tools: [\"notes\"]) and restart the gateway (beige gateway restart).\nSettings go under plugins.notes.config in ".to_string()
            + &config_path(&env).display().to_string()
            + ".\n"
    );
    assert!(env.home().join("plugins/notes/plugin.py").is_file());
    // The config keeps its comments, its mode, and still validates.
    let edited = std::fs::read_to_string(config_path(&env)).unwrap();
    assert!(edited.starts_with(&pristine[..pristine.find("agents: {").unwrap()]));
    assert!(edited.contains("    notes: {\n"), "{edited}");
    let mode = std::fs::metadata(config_path(&env))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let run = env.run(&["config", "validate"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);

    // A second install without --force changes nothing.
    let run = env.run(&["plugins", "install", &notes]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.contains("Plugin name conflicts detected:")
            && run.stderr.contains("Use --force to override."),
        "{}",
        run.stderr
    );
    assert_eq!(std::fs::read_to_string(config_path(&env)).unwrap(), edited);
    let run = env.run(&["plugins", "install", "--force", &notes]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(config_path(&env)).unwrap(), edited);

    let run = env.run(&["plugins", "install", &example("operator-note")]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let run = env.run(&["plugins", "list"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let examples = Path::new(&notes).parent().unwrap().display().to_string();
    assert_redacted_snapshot!(env, run.stdout.replace(&examples, "[EXAMPLES]"));

    let run = env.run(&["plugins", "remove", "notes"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        "Removed plugin 'notes' from config.json5 and disk.\n"
    );
    assert!(!env.home().join("plugins/notes").exists());
    let run = env.run(&["plugins", "remove", "operator-note"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Back to the file setup wrote, byte for byte (the `plugins` section stays).
    let after = std::fs::read_to_string(config_path(&env)).unwrap();
    assert!(after.contains("  plugins: {\n  },\n"), "{after}");
    assert_eq!(after.replace("  plugins: {\n  },\n", ""), pristine);
    let run = env.run(&["plugins", "list"]);
    assert_eq!(
        run.stdout,
        "No plugins in config.json5.\nInstall one with: beige plugins install <source>  (beige plugins install --help)\n"
    );
    let run = env.run(&["plugins", "remove", "notes"]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.contains("Failed to remove: no plugin 'notes'"),
        "{}",
        run.stderr
    );
}

#[test]
fn remove_warns_about_agents_that_still_use_the_plugin() {
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let run = env.run(&["plugins", "install", &example("python-notes")]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let text = std::fs::read_to_string(config_path(&env))
        .unwrap()
        .replacen("tools: [],", "tools: [\"notes\"],", 1);
    std::fs::write(config_path(&env), text).unwrap();
    let run = env.run(&["plugins", "remove", "notes"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stderr,
        "warning: agent 'beige' still lists tool 'notes' in agents.beige.tools; remove it there, or the gateway will not start\n"
    );
}

#[test]
fn help_bad_sources_and_update_without_sources() {
    let env = TestEnv::new();
    let run = env.run(&["plugins"]);
    assert_eq!(run.code, Some(0));
    assert_eq!(run.stdout, env.run(&["plugins", "--help"]).stdout);
    assert!(run.stdout.contains("install"), "{}", run.stdout);
    let run = env.run(&["plugins", "install", "--help"]);
    assert!(run.stdout.contains("github:owner/repo[/path][#ref]"));

    assert_eq!(env.run(&["setup"]).code, Some(0));
    let run = env.run(&[
        "plugins",
        "install",
        "npm:@matthias-hausberger/beige-toolkit",
    ]);
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.starts_with("Failed to install: 'npm:@matthias-hausberger/beige-toolkit' is an npm package of the original beige"),
        "{}",
        run.stderr
    );
    let run = env.run(&["plugins", "install", "./does-not-exist"]);
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("is not a folder"), "{}", run.stderr);
    let run = env.run(&["plugins", "update"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "No plugins with a _source in config.json5.\n");
    let run = env.run(&["plugins", "update", "nothing"]);
    assert_eq!(run.code, Some(1));
}

/// `git` in the test (not through beige), with an identity for commits.
fn git(repo: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Attack 10: a ref that git reads as an option (`--upload-pack=CMD` runs CMD) is
/// refused before git runs or anything is saved — on the command line, and in a
/// `_source` planted in the config for `beige plugins update`.
#[test]
fn refs_that_git_would_read_as_options_never_run() {
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    let repo = env.dir().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let notes = Path::new(&example("python-notes")).to_path_buf();
    for entry in std::fs::read_dir(&notes).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), repo.join(entry.file_name())).unwrap();
        }
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "notes"]);
    let marker = env.dir().join("pwned");
    let evil = env.dir().join("evil");
    std::fs::write(
        &evil,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
    let url = format!("git+file://{}", repo.display());
    let pristine = std::fs::read_to_string(config_path(&env)).unwrap();

    for source in [
        format!("{url}#--upload-pack={}", evil.display()),
        format!("{url}?ref=--upload-pack={}", evil.display()),
        format!("{url}#-c"),
    ] {
        let run = env.run(&["plugins", "install", &source]);
        assert_eq!(run.code, Some(1), "{source}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr
                .contains("starts with '-', so git would read it as an option"),
            "{}",
            run.stderr
        );
        assert!(!marker.exists(), "{source} ran a command");
        assert_eq!(
            std::fs::read_to_string(config_path(&env)).unwrap(),
            pristine
        );
    }
    // Other transports than the allowed ones never run either.
    let run = env.run(&["plugins", "install", "git+ext::sh -c touch% /tmp/x"]);
    assert_eq!(run.code, Some(1));

    // A good install, then its recorded _source swapped for the attack.
    let run = env.run(&["plugins", "install", &url]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let text = std::fs::read_to_string(config_path(&env)).unwrap();
    let commit = git(&repo, &["rev-parse", "HEAD"]);
    let recorded = format!("{url}#{commit}");
    assert!(text.contains(&recorded), "{text}");
    let planted = text.replace(
        &recorded,
        &format!("{url}#--upload-pack={}", evil.display()),
    );
    std::fs::write(config_path(&env), &planted).unwrap();
    let run = env.run(&["plugins", "update", "notes"]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("starts with '-', so git would read it as an option"),
        "{}",
        run.stderr
    );
    let run = env.run(&["plugins", "update"]);
    assert!(
        format!("{}{}", run.stdout, run.stderr).contains("so git would read it as an option"),
        "{}{}",
        run.stdout,
        run.stderr
    );
    // The same through `?ref=`, which is what `update` follows.
    let planted = text.replace(
        &recorded,
        &format!("{url}?ref=--upload-pack={}#{commit}", evil.display()),
    );
    std::fs::write(config_path(&env), &planted).unwrap();
    let run = env.run(&["plugins", "update", "notes"]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(!marker.exists(), "a planted _source ran a command");
    // Nothing was rewritten: the planted entry is still what the user must fix.
    assert_eq!(std::fs::read_to_string(config_path(&env)).unwrap(), planted);
}
