//! The installer on real files: in-place config edits, conflicts, `--force`, list, remove,
//! update from a git repository and install at gateway start, with the example plugins of
//! `examples/plugins` as sources (moved here from beige-core's suite with the installer).

use std::path::{Path, PathBuf};
use std::process::Command;

use beige_core::config::Config;
use beige_core::plugin::load_plugins;
use beige_core::BeigeHome;
use serde_json::json;

use crate::install::{self, InstallError, PluginKind};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/plugins")
        .canonicalize()
        .unwrap()
}

const USER_CONFIG: &str = r#"// My beige config: comments and formatting must survive installs.
{
  llm: {
    providers: {
      anthropic: { apiKey: "${ANTHROPIC_API_KEY:-}" }, // the key comes from the environment
    },
  },

  /* Plugins: the built-in key-value store, and whatever gets installed. */
  plugins: {
    kv: { config: { maxKeys: 500 } }, // built in
  },

  agents: {
    a: {
      model: { provider: "anthropic", model: "claude-sonnet-4-6" },
      tools: ["kv", 'notes'], // notes arrives with the install below
    },
  },
}
"#;

struct Installer {
    dir: tempfile::TempDir,
    home: BeigeHome,
    config: PathBuf,
}

impl Installer {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let config = home.config_path();
        std::fs::write(&config, text).unwrap();
        Self { dir, home, config }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.config).unwrap()
    }

    fn redact(&self, s: &str) -> String {
        s.replace(&self.home.root().display().to_string(), "[HOME]")
            .replace(&self.dir.path().display().to_string(), "[TMP]")
            .replace(&examples().display().to_string(), "[EXAMPLES]")
    }
}

#[test]
fn install_edits_the_config_in_place_and_conflicts_stop_before_anything_is_copied() {
    let t = Installer::new(USER_CONFIG);
    let source = examples().join("python-notes").display().to_string();
    let report = install::install(&t.config, &t.home, &source, false).unwrap();
    assert_eq!(report.installed.len(), 1);
    let installed = &report.installed[0];
    assert_eq!(installed.name, "notes");
    assert_eq!(installed.dir, t.home.plugins_dir().join("notes"));
    assert!(installed.dir.join("plugin.py").is_file());
    insta::assert_snapshot!("config_after_install", t.redact(&t.text()));
    // The file still loads, and the plugin with it.
    let loaded = Config::load(&t.config, &t.home).unwrap();
    assert_eq!(
        loaded.config.plugins["notes"].config,
        Some(json!({"maxNotes": 100}))
    );
    load_plugins(&loaded.config, &t.home).unwrap();

    // Twice without --force: refused, and nothing was touched.
    std::fs::write(installed.dir.join("MARKER"), "mine").unwrap();
    let before = t.text();
    let err = install::install(&t.config, &t.home, &source, false).unwrap_err();
    assert!(matches!(err, InstallError::Conflicts { .. }));
    assert_eq!(
        t.redact(&err.to_string()),
        "Plugin name conflicts detected:\n  - 'notes' is already in [HOME]/config.json5 (plugins.notes)\n  - 'notes': the folder [HOME]/plugins/notes already exists\nUse --force to override."
    );
    assert_eq!(t.text(), before);
    assert!(installed.dir.join("MARKER").exists());
    let leftovers: Vec<_> = std::fs::read_dir(t.home.plugins_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(leftovers, ["notes"], "no staging folders are left behind");

    // --force replaces the files and keeps the user's config of the plugin.
    std::fs::write(&t.config, before.replace("maxNotes: 100", "maxNotes: 5")).unwrap();
    install::install(&t.config, &t.home, &source, true).unwrap();
    assert!(!installed.dir.join("MARKER").exists());
    assert!(installed.dir.join("plugin.py").is_file());
    assert_eq!(t.text(), before.replace("maxNotes: 100", "maxNotes: 5"));

    // list
    let listed = install::list(&t.config).unwrap();
    let names: Vec<(&str, &PluginKind)> =
        listed.iter().map(|l| (l.name.as_str(), &l.kind)).collect();
    assert_eq!(
        names,
        [
            ("kv", &PluginKind::BuiltIn),
            ("notes", &PluginKind::External)
        ]
    );
    assert_eq!(listed[1].source.as_deref(), Some(source.as_str()));
    assert!(listed[1].has_config);

    // remove: files and entry go, the file is byte for byte what it was, and the agent
    // that still lists the tool is pointed out.
    let removal = install::remove(&t.config, &t.home, "notes").unwrap();
    assert!(removal.removed_entry);
    assert_eq!(
        removal.deleted_dir.as_deref(),
        Some(installed.dir.as_path())
    );
    assert!(!installed.dir.exists());
    assert_eq!(t.text(), USER_CONFIG);
    assert_eq!(
        removal.warnings,
        ["agent 'a' still lists tool 'notes' in agents.a.tools; remove it there, or the gateway will not start"]
    );
    assert!(matches!(
        install::remove(&t.config, &t.home, "notes"),
        Err(InstallError::NotInstalled { .. })
    ));
}

#[test]
fn a_config_without_plugins_gets_the_section_and_npm_sources_are_explained() {
    let t = Installer::new("{\n  agents: {},\n}\n");
    let example = examples().join("operator-note").display().to_string();
    install::install(&t.config, &t.home, &example, false).unwrap();
    assert_eq!(
        t.redact(&t.text()),
        "{\n  agents: {},\n  plugins: {\n    \"operator-note\": {\n      path: \"[HOME]/plugins/operator-note\",\n      _source: \"[EXAMPLES]/operator-note\",\n    },\n  },\n}\n"
    );
    let err =
        install::install(&t.config, &t.home, "npm:@someone/beige-weather", false).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("npm package of the original beige"), "{msg}");
    assert!(msg.contains("docs/external-plugins.md"), "{msg}");
    let err = install::install(&t.config, &t.home, "beige-weather", false).unwrap_err();
    assert!(
        err.to_string()
            .contains("npm packages of the original cannot run"),
        "{err}"
    );
}

/// A git repository holding the notes example; returns its path.
fn notes_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    let plugin = repo.join("notes");
    std::fs::create_dir_all(&plugin).unwrap();
    for f in ["plugin.json", "plugin.py", "SKILL.md"] {
        std::fs::copy(examples().join("python-notes").join(f), plugin.join(f)).unwrap();
    }
    // A second folder that is not a plugin: discovery skips it.
    std::fs::create_dir_all(repo.join("docs")).unwrap();
    std::fs::write(repo.join("docs/index.md"), "docs\n").unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    commit(&repo, "first")
}

fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn commit(repo: &Path, message: &str) -> PathBuf {
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", message]);
    repo.to_path_buf()
}

fn set_description(repo: &Path, description: &str) {
    let path = repo.join("notes/plugin.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["description"] = json!(description);
    std::fs::write(&path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
}

fn installed_description(home: &BeigeHome) -> String {
    let text = std::fs::read_to_string(home.plugins_dir().join("notes/plugin.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["description"].as_str().unwrap().to_string()
}

#[test]
fn update_from_a_git_source_picks_up_a_new_commit() {
    let t = Installer::new(USER_CONFIG);
    let repo = notes_repo(t.dir.path());
    let first = git(&repo, &["rev-parse", "HEAD"]);
    let url = format!("git+file://{}", repo.display());
    let report = install::install(&t.config, &t.home, &url, false).unwrap();
    assert_eq!(report.installed[0].commit.as_deref(), Some(first.as_str()));
    assert!(
        t.text().contains(&format!("_source: \"{url}#{first}\"")),
        "{}",
        t.text()
    );
    assert!(!t.home.plugins_dir().join("notes/.git").exists());

    set_description(&repo, "notes, second edition");
    commit(&repo, "second");
    let second = git(&repo, &["rev-parse", "HEAD"]);
    let report = install::update(&t.config, &t.home, Some("notes")).unwrap();
    assert_eq!(report.updated.len(), 1);
    assert_eq!(report.updated[0].commit.as_deref(), Some(second.as_str()));
    assert_eq!(installed_description(&t.home), "notes, second edition");
    assert!(t.text().contains(&format!("_source: \"{url}#{second}\"")));
    assert!(!t.text().contains(&first));

    // `update` without a name: every plugin with a source; the built-in kv is left alone.
    set_description(&repo, "third");
    commit(&repo, "third");
    let report = install::update(&t.config, &t.home, None).unwrap();
    assert_eq!(report.updated.len(), 1, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(installed_description(&t.home), "third");

    // A plugin without _source cannot be updated.
    assert!(matches!(
        install::update(&t.config, &t.home, Some("kv")),
        Err(InstallError::NoSource { .. })
    ));
}

#[test]
fn a_plugin_with_a_source_and_no_files_is_installed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let repo = notes_repo(dir.path());
    let pinned = git(&repo, &["rev-parse", "HEAD"]);
    set_description(&repo, "a later commit");
    commit(&repo, "later");
    let t = Installer::new(&format!(
        r#"{{
  llm: {{ providers: {{ anthropic: {{}} }} }},
  plugins: {{
    // pinned to the first commit
    notes: {{ _source: "git+file://{}#{pinned}", config: {{ maxNotes: 7 }} }},
    telegram: {{ _source: "npm:@matthias-hausberger/beige-toolkit", config: {{ token: "1:x" }} }},
  }},
  agents: {{ a: {{ model: {{ provider: "anthropic", model: "m" }}, tools: ["notes"] }} }},
}}
"#,
        repo.display()
    ));
    let installed = install::ensure_installed(&t.config, &t.home).unwrap();
    assert_eq!(installed.len(), 1);
    assert_eq!(installed[0].name, "notes");
    assert_eq!(installed_description(&t.home), "Notes per agent, kept in the gateway's store — an external plugin in Python (standard library only).");
    assert!(
        t.text().contains("notes: { _source: \"git+file://"),
        "{}",
        t.text()
    );
    assert!(t.text().contains(&format!(
        "path: \"{}\"",
        t.home.plugins_dir().join("notes").display()
    )));
    assert!(t.text().contains("// pinned to the first commit"));
    // Now the config loads with the plugin in it, and a second start installs nothing.
    let loaded = Config::load(&t.config, &t.home).unwrap();
    load_plugins(&loaded.config, &t.home).unwrap();
    assert!(install::ensure_installed(&t.config, &t.home)
        .unwrap()
        .is_empty());
}
