//! Test support: a temporary `BEIGE_HOME`, the busybox test image, the static shim and
//! clean-up of every container a test created.
//!
//! Docker tests need an engine, the image `beige-test-busybox:latest` (built by
//! `scripts/setup-docker`) and a static shim (`BEIGE_SHIM`, built by `scripts/build-shim`).
//! When any is missing they are skipped with a printed reason — except in CI
//! (`CI=true` or `BEIGE_REQUIRE_DOCKER=1`), where a missing piece fails the test.

use std::path::PathBuf;
use std::sync::Arc;

use beige_core::config::Config;
use beige_core::home::InstallationId;
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::{BeigeHome, GatewayBuilder, LocalGateway};

pub fn required() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
        || std::env::var("BEIGE_REQUIRE_DOCKER")
            .map(|v| v == "1")
            .unwrap_or(false)
}

pub fn test_image() -> String {
    std::env::var("BEIGE_TEST_IMAGE").unwrap_or_else(|_| "beige-test-busybox:latest".into())
}

/// Everything a Docker test needs, or `None` (after printing why) when skipping.
pub struct DockerEnv {
    pub shim: PathBuf,
    pub image: String,
}

pub async fn docker_env() -> Option<DockerEnv> {
    let skip = |why: String| -> Option<DockerEnv> {
        if required() {
            panic!("Docker test cannot run in CI: {why}");
        }
        eprintln!("SKIPPED (not in CI): {why}");
        None
    };
    let shim = match std::env::var_os("BEIGE_SHIM") {
        Some(p) => PathBuf::from(p),
        None => {
            let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/shim/beige-shim");
            if !p.exists() {
                return skip("no static shim: run scripts/build-shim or set BEIGE_SHIM".into());
            }
            p
        }
    };
    let docker = match DockerSandbox::connect("probe").await {
        Ok(d) => d,
        Err(e) => return skip(format!("no Docker engine: {e}")),
    };
    let image = test_image();
    if docker.client().inspect_image(&image).await.is_err() {
        return skip(format!(
            "test image {image} missing: run scripts/setup-docker"
        ));
    }
    Some(DockerEnv { shim, image })
}

/// A temporary home whose containers are removed when it is dropped.
pub struct TestHome {
    pub dir: tempfile::TempDir,
    pub home: BeigeHome,
    /// Its installation id (made here, as `beige setup` does).
    pub installation: InstallationId,
}

impl TestHome {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let (installation, _) = home.ensure_installation_id().unwrap();
        Self {
            dir,
            home,
            installation,
        }
    }

    /// A Docker sandbox for this home's installation, as the gateway makes one.
    pub async fn docker(&self) -> DockerSandbox {
        DockerSandbox::connect(self.installation.as_str())
            .await
            .unwrap()
            .with_legacy_home(&self.home)
    }

    /// A config with the given agents (JSON objects merged over a default agent).
    pub fn config(&self, env: &DockerEnv, agents: &[(&str, serde_json::Value)]) -> Config {
        let mut map = serde_json::Map::new();
        for (name, extra) in agents {
            let mut agent = serde_json::json!({
                "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                "tools": [],
                "sandbox": {"image": env.image, "memoryLimit": "256m", "pidsLimit": 128},
            });
            merge(&mut agent, extra);
            map.insert(name.to_string(), agent);
        }
        serde_json::from_value(serde_json::json!({
            "llm": {"providers": {"anthropic": {"apiKey": "sk-test-secret-never-in-sandbox"}}},
            "agents": map,
        }))
        .unwrap()
    }

    pub async fn gateway(&self, env: &DockerEnv, config: Config) -> LocalGateway {
        self.gateway_and_docker(env, config).await.0
    }

    /// [`TestHome::gateway`] and (a handle on) its Docker sandbox.
    pub async fn gateway_and_docker(
        &self,
        env: &DockerEnv,
        config: Config,
    ) -> (LocalGateway, DockerSandbox) {
        let docker = self.docker().await;
        let gw = GatewayBuilder::new(config, self.home.clone())
            .shim(&env.shim)
            .sandbox(Arc::new(docker.clone()))
            .build()
            .await
            .unwrap();
        (gw, docker)
    }

    /// `(agent, container id)` of this installation's containers, from the engine.
    pub async fn containers(&self) -> Vec<(String, String)> {
        containers_labelled(&format!("io.beige.installation={}", self.installation)).await
    }
}

/// `(agent, container id)` of the containers carrying `label` (`key=value`).
pub async fn containers_labelled(label: &str) -> Vec<(String, String)> {
    let docker = DockerSandbox::connect("probe").await.unwrap();
    let filters = std::collections::HashMap::from([("label".to_string(), vec![label.to_string()])]);
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
        .map(|c| {
            let labels = c.labels.unwrap_or_default();
            (
                labels.get("io.beige.agent").cloned().unwrap_or_default(),
                c.id.unwrap_or_default(),
            )
        })
        .collect()
}

impl Drop for TestHome {
    fn drop(&mut self) {
        // Remove this installation's containers even when the test panicked.
        remove_labelled(&format!("io.beige.installation={}", self.installation));
    }
}

/// Remove every container carrying `label` (`key=value`), with the `docker` CLI (for
/// clean-up in `Drop`, where there is no runtime).
pub fn remove_labelled(label: &str) {
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label={label}")])
        .output();
    if let Ok(out) = out {
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = std::process::Command::new("docker")
                .arg("rm")
                .arg("-f")
                .args(&ids)
                .output();
        }
    }
}

fn merge(base: &mut serde_json::Value, extra: &serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e.clone(),
    }
}

/// Skip the calling test when Docker pieces are missing outside CI.
#[macro_export]
macro_rules! docker_or_skip {
    () => {
        match $crate::suite::support::docker_env().await {
            Some(env) => env,
            None => return,
        }
    };
}

/// A database of its own on the test PostgreSQL server (`BEIGE_TEST_POSTGRES_URL`, started
/// by `scripts/setup-postgres`), dropped with the value. `None` (after printing why) when
/// there is no server, unless `BEIGE_REQUIRE_POSTGRES=1`, which fails the test.
pub struct TempDatabase {
    pub url: String,
    name: String,
    admin: String,
}

impl TempDatabase {
    pub async fn new() -> Option<Self> {
        use sqlx::{Connection as _, Executor as _};
        let admin = beige_testkit::postgres::url()?;
        let name = format!("beige_it_{:016x}", rand::random::<u64>());
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("connect to the test PostgreSQL server");
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("create a test database");
        let url = beige_testkit::postgres::with_database(&admin, &name);
        Some(Self { url, name, admin })
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        let (name, admin) = (self.name.clone(), self.admin.clone());
        let _ = std::thread::spawn(move || {
            use sqlx::{Connection as _, Executor as _};
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&admin).await.ok()?;
                conn.execute(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .await
                .ok()
            })
        })
        .join();
    }
}
