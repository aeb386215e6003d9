//! Who owns a container, and what a recreated container mounts, on the real Docker
//! engine (issue 13, attacks 9 and 11):
//!
//! - two installations whose `BEIGE_HOME` has the same path (two machines or dev
//!   containers sharing one engine) neither remove nor adopt each other's sandboxes:
//!   containers are named and labelled by the random installation id;
//! - containers made before installation ids are migrated only when their `/workspace`
//!   is this installation's, and left alone otherwise;
//! - an `extraMounts` source replaced by a symlink after the first start is refused
//!   when the container is recreated after it died, and sources inside agent-writable
//!   trees are refused before anything starts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext};
use beige_core::config::Config;
use beige_core::home::InstallationId;
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::{Admin, BeigeHome, Gateway, GatewayBuilder, LocalGateway};
use serde_json::json;

use super::sandbox_docker::exec;
use super::support::{containers_labelled, remove_labelled, DockerEnv, TestHome};
use crate::docker_or_skip;

/// Removes the containers of the given labels when dropped (also after a panic).
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for label in &self.0 {
            remove_labelled(label);
        }
    }
}

async fn gateway_for(
    env: &DockerEnv,
    home: &BeigeHome,
    installation: &InstallationId,
    config: Config,
) -> Result<LocalGateway, beige_core::GatewayError> {
    let docker = DockerSandbox::connect(installation.as_str())
        .await
        .unwrap()
        .with_legacy_home(home);
    GatewayBuilder::new(config, home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker))
        .build()
        .await
}

async fn inspect(name_or_id: &str) -> Option<bollard::models::ContainerInspectResponse> {
    let docker = DockerSandbox::connect("probe").await.unwrap();
    docker
        .client()
        .inspect_container(
            name_or_id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .ok()
}

async fn running(name_or_id: &str) -> bool {
    inspect(name_or_id)
        .await
        .and_then(|i| i.state)
        .and_then(|s| s.running)
        .unwrap_or(false)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Attack 9: installation B, whose `BEIGE_HOME` has the same path as A's, starts with
/// an agent of the same name while A's sandboxes run: it creates its own, removes none
/// of A's as orphans and adopts none; when it stops, A's are still there, and A finds
/// them again.
#[tokio::test]
async fn same_home_path_other_installation_neither_removes_nor_adopts() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let path = t.home.root().to_path_buf();
    let a_id = t.installation.clone();
    let config_a = t.config(&env, &[("same", json!({})), ("onlya", json!({}))]);
    let gw = t.gateway(&env, config_a.clone()).await;
    assert_eq!(
        sorted(gw.reconcile_report().created.clone()),
        ["onlya", "same"]
    );
    let out = exec(&gw, "same", "echo from-a > /tmp/who && echo ok").await;
    assert!(!out.is_error, "{}", out.joined_text());
    let a_containers = sorted(t.containers().await.into_iter().map(|(_, id)| id).collect());
    assert_eq!(a_containers.len(), 2);
    drop(gw); // A keeps running its sandboxes (like a gateway on another machine)

    // B: the same path on "another machine" (A's folder moved aside), its own id.
    let a_dir = t.dir.path().join("home-of-a");
    std::fs::rename(&path, &a_dir).unwrap();
    let home_b = BeigeHome::new(&path);
    assert_eq!(home_b, t.home, "the same BEIGE_HOME path");
    assert_eq!(home_b.hash(), t.home.hash());
    let (b_id, created) = home_b.ensure_installation_id().unwrap();
    assert!(created);
    assert_ne!(b_id, a_id);
    let _cleanup = Cleanup(vec![format!("io.beige.installation={b_id}")]);
    let config_b = t.config(&env, &[("same", json!({})), ("onlyb", json!({}))]);
    let gw_b = gateway_for(&env, &home_b, &b_id, config_b).await.unwrap();
    let report = gw_b.reconcile_report().clone();
    assert_eq!(
        sorted(report.created.clone()),
        ["onlyb", "same"],
        "{report:?}"
    );
    assert!(
        report.reattached.is_empty(),
        "adopted A's sandbox: {report:?}"
    );
    assert!(
        report.removed_orphans.is_empty(),
        "removed A's sandbox: {report:?}"
    );
    for id in &a_containers {
        assert!(running(id).await, "A's container {id} was touched by B");
    }
    let b_name = &gw_b.sandbox_status("same").await.unwrap().container;
    assert_eq!(b_name, &format!("beige-same-{}", b_id.short()));
    let b_container = inspect(b_name).await.and_then(|i| i.id).unwrap();
    assert!(!a_containers.contains(&b_container));
    // B's `same` is its own container: A's /tmp is not there.
    let out = exec(&gw_b, "same", "cat /tmp/who").await;
    assert!(
        out.is_error,
        "B runs in A's container: {}",
        out.joined_text()
    );
    gw_b.shutdown().await.unwrap();
    assert!(
        containers_labelled(&format!("io.beige.installation={b_id}"))
            .await
            .is_empty()
    );
    for id in &a_containers {
        assert!(running(id).await, "B's shutdown removed A's container {id}");
    }

    // Back to A: it reattaches both of its sandboxes.
    std::fs::rename(&path, t.dir.path().join("home-of-b")).unwrap();
    std::fs::rename(&a_dir, &path).unwrap();
    let gw = t.gateway(&env, config_a).await;
    let report = gw.reconcile_report().clone();
    assert_eq!(
        sorted(report.reattached.clone()),
        ["onlya", "same"],
        "{report:?}"
    );
    assert!(report.created.is_empty() && report.removed_orphans.is_empty());
    let out = exec(&gw, "same", "cat /tmp/who").await;
    assert!(
        out.joined_text().contains("from-a"),
        "{}",
        out.joined_text()
    );
    gw.shutdown().await.unwrap();
    assert!(t.containers().await.is_empty());
}

/// A container as beige made them before installation ids: named and labelled with
/// the home's path hash, `/workspace` bound from `workspace`.
async fn legacy_container(env: &DockerEnv, home: &BeigeHome, agent: &str, workspace: &Path) {
    std::fs::create_dir_all(workspace).unwrap();
    let docker = DockerSandbox::connect("probe").await.unwrap();
    let name = format!("beige-{agent}-{}", home.hash());
    let labels = HashMap::from([
        ("io.beige.agent".to_string(), agent.to_string()),
        ("io.beige.home".to_string(), home.hash()),
        ("io.beige.spec".to_string(), "0000000000000000".to_string()),
    ]);
    docker
        .client()
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            bollard::models::ContainerCreateBody {
                image: Some(env.image.clone()),
                entrypoint: Some(vec!["sleep".into(), "300".into()]),
                labels: Some(labels),
                host_config: Some(bollard::models::HostConfig {
                    binds: Some(vec![format!("{}:/workspace:rw", workspace.display())]),
                    network_mode: Some("none".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    docker
        .client()
        .start_container(
            &name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .unwrap();
}

/// The upgrade: a container from before installation ids is recreated under the id
/// when its `/workspace` is this installation's (its files survive), removed as an
/// orphan when its agent is gone, and left alone when its workspace is elsewhere — even
/// with the same path hash and the same agent name.
#[tokio::test]
async fn legacy_sandboxes_are_migrated_only_when_their_workspace_is_ours() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let _cleanup = Cleanup(vec![format!("io.beige.home={}", t.home.hash())]);
    let ws = t.home.default_workspace("mig");
    legacy_container(&env, &t.home, "mig", &ws).await;
    std::fs::write(ws.join("kept.txt"), "from before the upgrade").unwrap();
    legacy_container(&env, &t.home, "gone", &t.home.default_workspace("gone")).await;
    // Another installation's, with the same home path hash: its workspace is not ours.
    let foreign: PathBuf = t.dir.path().join("elsewhere/agents/keep/workspace");
    legacy_container(&env, &t.home, "keep", &foreign).await;
    let foreign_name = format!("beige-keep-{}", t.home.hash());
    let foreign_id = inspect(&foreign_name).await.unwrap().id.unwrap();

    let config = t.config(&env, &[("mig", json!({})), ("keep", json!({}))]);
    let gw = t.gateway(&env, config).await;
    let report = gw.reconcile_report().clone();
    assert_eq!(
        sorted(report.created.clone()),
        ["keep", "mig"],
        "{report:?}"
    );
    assert_eq!(report.removed_orphans, ["gone"], "{report:?}");
    assert!(inspect(&format!("beige-mig-{}", t.home.hash()))
        .await
        .is_none());
    assert!(inspect(&format!("beige-gone-{}", t.home.hash()))
        .await
        .is_none());
    assert!(
        running(&foreign_id).await,
        "another installation's legacy container was touched"
    );
    let out = exec(&gw, "mig", "cat kept.txt").await;
    assert!(
        out.joined_text().contains("from before the upgrade"),
        "{}",
        out.joined_text()
    );
    let ours = sorted(t.containers().await.into_iter().map(|(a, _)| a).collect());
    assert_eq!(ours, ["keep", "mig"]);
    gw.shutdown().await.unwrap();
    assert!(running(&foreign_id).await);
}

async fn call(gw: &LocalGateway, agent: &str, command: &str) -> (bool, String) {
    match gw
        .call_tool(
            agent,
            CoreToolCall::Exec(ExecParams {
                command: command.into(),
                timeout: Some(30),
            }),
            ToolContext::default(),
        )
        .await
    {
        Ok(out) => (out.is_error, out.joined_text()),
        Err(e) => (true, e.to_string()),
    }
}

/// Attack 11, from the host: after the first start the mount source is replaced by a
/// symlink to a folder holding a secret; when the container has died, it is not
/// recreated with that symlink's target — the call fails saying what changed — and
/// once the folder is back, the sandbox comes back.
#[tokio::test]
async fn mount_source_swapped_for_a_symlink_is_refused_on_recreation() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let data = t.dir.path().join("data");
    let secret = t.dir.path().join("secret");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(data.join("public.txt"), "public").unwrap();
    std::fs::write(secret.join("public.txt"), "SECRET-OF-THE-HOST").unwrap();
    let config = t.config(
        &env,
        &[(
            "mnt",
            json!({"sandbox": {"extraMounts": {data.to_str().unwrap(): "/data:ro"}}}),
        )],
    );
    let gw = t.gateway(&env, config).await;
    let (failed, text) = call(&gw, "mnt", "cat /data/public.txt").await;
    assert!(!failed && text.contains("public"), "{text}");

    let original = t.dir.path().join("data.orig");
    std::fs::rename(&data, &original).unwrap();
    std::os::unix::fs::symlink(&secret, &data).unwrap();
    let name = gw.sandbox_status("mnt").await.unwrap().container;
    let docker = DockerSandbox::connect("probe").await.unwrap();
    docker
        .client()
        .kill_container(
            &name,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();

    let (failed, text) = call(&gw, "mnt", "cat /data/public.txt").await;
    assert!(failed, "the call ran: {text}");
    assert!(!text.contains("SECRET-OF-THE-HOST"), "{text}");
    assert!(text.contains("extraMounts"), "{text}");
    assert!(text.contains(&data.display().to_string()), "{text}");
    assert!(text.contains("now resolves to"), "{text}");
    // No container mounts the symlink's target.
    for (_, id) in t.containers().await {
        let mounts = inspect(&id)
            .await
            .and_then(|i| i.mounts)
            .unwrap_or_default();
        assert!(
            !mounts
                .iter()
                .any(|m| m.source.as_deref().map(Path::new) == Some(secret.as_path())),
            "a container mounts {}",
            secret.display()
        );
        assert!(!running(&id).await);
    }

    // The folder restored: the next call recreates the sandbox.
    std::fs::remove_file(&data).unwrap();
    std::fs::rename(&original, &data).unwrap();
    let (failed, text) = call(&gw, "mnt", "cat /data/public.txt").await;
    assert!(!failed, "{text}");
    assert!(
        text.contains("sandbox was restarted") && text.contains("public"),
        "{text}"
    );
    gw.shutdown().await.unwrap();
}

/// Attack 11, from inside: a mount source inside an agent-writable tree (its own
/// workspace, another agent's `workspaceDir`, a folder another agent mounts read-write)
/// could be swapped for a symlink by an agent. The config loader refuses it, and so
/// does the gateway given such a config without the loader, before any container
/// exists.
#[tokio::test]
async fn mount_sources_inside_agent_writable_trees_are_refused() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let ws = t.home.default_workspace("a");
    let other_ws = t.dir.path().join("ws-b");
    let shared = t.dir.path().join("shared");
    for d in [ws.join("pub"), other_ws.join("pub"), shared.join("sub")] {
        std::fs::create_dir_all(d).unwrap();
    }
    let s = |p: &Path| p.display().to_string();
    let cases = [
        (
            json!({"sandbox": {"extraMounts": {s(&ws.join("pub")): "/pub:ro"}}}),
            json!({}),
        ),
        (
            json!({"sandbox": {"extraMounts": {s(&other_ws.join("pub")): "/pub:ro"}}}),
            json!({"workspaceDir": s(&other_ws)}),
        ),
        (
            json!({"sandbox": {"extraMounts": {s(&shared.join("sub")): "/sub:ro"}}}),
            json!({"sandbox": {"extraMounts": {s(&shared): "/shared"}}}),
        ),
    ];
    for (a, b) in cases {
        let config = t.config(&env, &[("a", a.clone()), ("b", b.clone())]);
        // The loader, from a file.
        let file = t.dir.path().join("config.json5");
        std::fs::write(&file, serde_json::to_string(&config_json(&config)).unwrap()).unwrap();
        let e = Config::load(&file, &t.home).unwrap_err().to_string();
        assert!(
            e.contains("extraMounts") && e.contains("symlink"),
            "{a} / {b}: {e}"
        );
        // The gateway, given the config directly.
        let e = match gateway_for(&env, &t.home, &t.installation, config).await {
            Ok(gw) => {
                gw.shutdown().await.unwrap();
                panic!("{a} / {b} started");
            }
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("extraMounts") && e.contains("symlink"),
            "{a} / {b}: {e}"
        );
        assert!(t.containers().await.is_empty(), "{a} / {b}");
    }
}

/// The config as JSON, for writing it to a file.
fn config_json(config: &Config) -> serde_json::Value {
    let agents: serde_json::Map<String, serde_json::Value> = config
        .agents
        .iter()
        .map(|(name, a)| {
            let mut agent = json!({
                "model": {"provider": a.model.provider, "model": a.model.model},
                "tools": a.tools,
                "sandbox": {
                    "image": a.sandbox.image,
                    "extraMounts": a.sandbox.extra_mounts,
                },
            });
            if let Some(dir) = &a.workspace_dir {
                agent["workspaceDir"] = json!(dir);
            }
            (name.clone(), agent)
        })
        .collect();
    json!({
        "llm": {"providers": {"anthropic": {"apiKey": "k"}}},
        "agents": agents,
    })
}
