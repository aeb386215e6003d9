//! Helpers shared by the CLI tests: a temp folder per test holding `BEIGE_HOME`
//! (`home/`), the user's home (`user/`) and any config files, and a way to run the real
//! binary there with a clean environment.

mod config;
mod setup;

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct TestEnv {
    dir: tempfile::TempDir,
    vars: Vec<(String, String)>,
}

/// What a run of `beige` produced.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl TestEnv {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("user")).unwrap();
        Self {
            dir,
            vars: Vec::new(),
        }
    }

    /// Also set `name` in the environment of every run.
    pub fn with_var(mut self, name: &str, value: &str) -> Self {
        self.vars.push((name.into(), value.into()));
        self
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `BEIGE_HOME` (not created until setup runs).
    pub fn home(&self) -> PathBuf {
        self.dir().join("home")
    }

    /// Copy a fixture into the temp folder; returns its new path.
    pub fn fixture(&self, name: &str) -> PathBuf {
        let from = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let to = self.dir().join(Path::new(name).file_name().unwrap());
        std::fs::copy(&from, &to).unwrap();
        to
    }

    pub fn run(&self, args: &[&str]) -> Run {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_beige"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir().join("user"))
            .env("BEIGE_HOME", self.home())
            .current_dir(self.dir());
        for (k, v) in &self.vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        Run {
            code: out.status.code(),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    }

    /// insta filters: `BEIGE_HOME` → `[HOME]`, the rest of the temp folder → `[TMP]`.
    pub fn filters(&self) -> Vec<(String, &'static str)> {
        vec![
            (regex_escape(&self.home().display().to_string()), "[HOME]"),
            (regex_escape(&self.dir().display().to_string()), "[TMP]"),
        ]
    }
}

/// Snapshot `$value` with the temp paths of `$env` redacted.
#[macro_export]
macro_rules! assert_redacted_snapshot {
    ($env:expr, $value:expr) => {{
        let filters = $env.filters();
        let filters: Vec<(&str, &str)> = filters.iter().map(|(a, b)| (a.as_str(), *b)).collect();
        insta::with_settings!({ filters => filters }, {
            insta::assert_snapshot!($value);
        });
    }};
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The original's example configs (fixtures copied from the shared reference).
pub fn original_config(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../beige-core/tests/fixtures/original-configs")
        .join(name)
}
