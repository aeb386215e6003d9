//! Helpers shared by the CLI tests: a temp folder per test holding `BEIGE_HOME`
//! (`home/`), the user's home (`user/`) and any config files, and a way to run the real
//! binary there with a clean environment.

mod audit;
mod config;
mod daemon;
mod demo;
mod doctor;
mod egress;
mod help;
mod mcp_serve;
mod plugins;
mod policy;
mod schedules;
mod setup;
mod store;
mod tui_pty;
mod users;

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
        let out = self.command(args).output().unwrap();
        Run {
            code: out.status.code(),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    }

    /// The `beige` command `run` would run, to spawn it instead.
    pub fn command(&self, args: &[&str]) -> Command {
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
        for name in ["DOCKER_HOST", "BEIGE_SHIM", "BEIGE_TEST_IMAGE"] {
            if let Some(v) = std::env::var_os(name) {
                if !self.vars.iter().any(|(k, _)| k == name) {
                    cmd.env(name, v);
                }
            }
        }
        cmd
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

/// Whether a missing Docker piece must fail the test (CI) instead of skipping it.
pub fn docker_required() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
        || std::env::var("BEIGE_REQUIRE_DOCKER").is_ok_and(|v| v == "1")
}

/// What a Docker test needs: an engine, the test image and a static shim.
pub struct DockerEnv {
    pub image: String,
}

/// The Docker pieces, or `None` (after printing why) when the test must be skipped.
/// In CI a missing piece fails the test instead.
pub async fn docker_env() -> Option<DockerEnv> {
    let skip = |why: String| -> Option<DockerEnv> {
        if docker_required() {
            panic!("Docker test cannot run in CI: {why}");
        }
        eprintln!("SKIPPED (not in CI): {why}");
        None
    };
    let shim = match std::env::var_os("BEIGE_SHIM") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/shim/beige-shim"),
    };
    if let Err(e) = beige_core::sandbox::check_static(&shim) {
        return skip(format!(
            "no static shim ({e}): run scripts/build-shim or set BEIGE_SHIM"
        ));
    }
    let docker = match beige_core::sandbox::docker::DockerSandbox::connect("probe").await {
        Ok(d) => d,
        Err(e) => return skip(format!("no Docker engine: {e}")),
    };
    let image = std::env::var("BEIGE_TEST_IMAGE")
        .ok()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| "beige-test-busybox:latest".into());
    if docker.client().inspect_image(&image).await.is_err() {
        return skip(format!(
            "test image {image} missing: run scripts/setup-docker"
        ));
    }
    Some(DockerEnv { image })
}

/// Skip the calling async test when Docker pieces are missing outside CI.
#[macro_export]
macro_rules! docker_or_skip {
    () => {
        match $crate::suite::docker_env().await {
            Some(env) => env,
            None => return,
        }
    };
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Container ids carrying `io.beige.installation=<id>`.
pub async fn containers_of(installation: &str) -> Vec<String> {
    let docker = beige_core::sandbox::docker::DockerSandbox::connect("probe")
        .await
        .unwrap();
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec![format!("io.beige.installation={installation}")],
    )]);
    docker
        .client()
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}
