//! The agent's container on the real Docker engine: hardening as seen by `docker
//! inspect`, reconcile on restart, recreation after the container died.

use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext, ToolOutput};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::{Admin, Gateway, LocalGateway};
use serde_json::json;

use super::support::TestHome;
use crate::docker_or_skip;

pub async fn exec(gw: &LocalGateway, agent: &str, command: &str) -> ToolOutput {
    gw.call_tool(
        agent,
        CoreToolCall::Exec(ExecParams {
            command: command.into(),
            timeout: Some(30),
        }),
        ToolContext::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn container_is_hardened() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let extra_dir = t.dir.path().join("data");
    std::fs::create_dir_all(&extra_dir).unwrap();
    let config = t.config(
        &env,
        &[(
            "hardy",
            json!({"sandbox": {
                "extraEnv": {"GREETING": "hello"},
                "extraMounts": {extra_dir.to_str().unwrap(): "/data:ro"},
            }}),
        )],
    );
    let (gw, docker) = t.gateway_and_docker(&env, config).await;
    let spec = &docker.container_spec("hardy").await.unwrap();
    let info = docker
        .client()
        .inspect_container(
            &spec.name,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let hc = info.host_config.unwrap();
    let cfg = info.config.unwrap();

    assert_eq!(hc.network_mode.as_deref(), Some("none"));
    // The container runs as root holding only what PID 1 needs to start the agent's
    // processes; those run as 1000:1000 with nothing (checked from inside below).
    assert_eq!(cfg.user.as_deref(), Some("0:0"));
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        hc.cap_add.unwrap_or_default(),
        ["SETUID", "SETGID", "KILL", "SETPCAP"]
    );
    assert!(hc
        .security_opt
        .unwrap_or_default()
        .iter()
        .any(|o| o.starts_with("no-new-privileges")));
    assert_eq!(hc.memory, Some(256 * 1024 * 1024));
    assert_eq!(hc.memory_swap, hc.memory);
    assert_eq!(hc.pids_limit, Some(128));
    assert_eq!(hc.privileged, Some(false));

    let labels = cfg.labels.unwrap();
    assert_eq!(
        labels.get("io.beige.agent").map(String::as_str),
        Some("hardy")
    );
    assert_eq!(
        labels.get("io.beige.installation").map(String::as_str),
        Some(t.installation.as_str())
    );
    assert_eq!(labels.get("io.beige.home"), None);
    assert_eq!(
        labels.get("io.beige.spec").map(String::as_str),
        Some(spec.spec_label())
    );
    assert_eq!(spec.name, format!("beige-hardy-{}", t.installation.short()));

    // Mounts: the workspace is writable, everything the gateway owns is read-only.
    let mounts = info.mounts.unwrap();
    let rw = |dest: &str| {
        mounts
            .iter()
            .find(|m| m.destination.as_deref() == Some(dest))
            .unwrap_or_else(|| panic!("no mount at {dest}"))
            .rw
    };
    assert_eq!(rw("/workspace"), Some(true));
    assert_eq!(rw("/tools/bin"), Some(false));
    assert_eq!(rw("/beige/run"), Some(false));
    assert_eq!(rw("/beige/shim"), Some(false));
    assert_eq!(rw("/data"), Some(false));
    assert_eq!(mounts.len(), 5);

    // The environment is built from scratch: nothing of the gateway's comes in.
    let env_list = cfg.env.unwrap();
    assert!(env_list.iter().any(|e| e == "GREETING=hello"));
    assert!(
        env_list.iter().all(|e| e.starts_with("PATH=")
            || e.starts_with("HOME=")
            || e.starts_with("GREETING=")),
        "{env_list:?}"
    );
    let inside = exec(
        &gw,
        "hardy",
        "cat /proc/1/environ | tr '\\0' '\\n'; echo; env; id -u; id -g",
    )
    .await;
    let text = inside.joined_text();
    assert!(!inside.is_error, "{text}");
    assert!(!text.contains("CARGO_MANIFEST_DIR"), "{text}");
    assert!(!text.contains("sk-test-secret"), "{text}");
    assert!(text.contains("GREETING=hello"));
    assert!(text.contains("\n1000\n1000"), "{text}");

    // No privilege inside: writing outside /workspace and the read-only mounts fails,
    // and the agent's process holds no capability in any set.
    let out = exec(&gw, "hardy", "touch /tools/bin/x 2>&1; touch /beige/run/x 2>&1; touch /data/x 2>&1; touch /etc/x 2>&1; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status").await;
    let text = out.joined_text();
    assert!(text.matches("Read-only file system").count() >= 3, "{text}");
    assert!(text.contains("touch: /etc/x: Permission denied"), "{text}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            text.contains(&format!("{set}:\t0000000000000000")),
            "{set} not empty: {text}"
        );
    }
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(text.contains("Seccomp:\t2"), "{text}");

    gw.shutdown().await.unwrap();
    assert!(t.containers().await.is_empty());
}

#[tokio::test]
async fn network_none_has_only_loopback() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = t.gateway(&env, t.config(&env, &[("net", json!({}))])).await;
    let out = exec(&gw, "net", "ls /sys/class/net").await;
    assert_eq!(out.joined_text().trim(), "Exit code: 0\nlo");
    gw.shutdown().await.unwrap();
}

#[tokio::test]
async fn restart_reattaches_recreates_and_removes_orphans() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let two = t.config(&env, &[("keep", json!({})), ("gone", json!({}))]);
    let gw = t.gateway(&env, two.clone()).await;
    assert_eq!(gw.reconcile_report().created.len(), 2);
    let out = exec(&gw, "keep", "echo alive > /tmp/marker && echo ok").await;
    assert!(!out.is_error, "{}", out.joined_text());
    drop(gw); // a gateway restart without removing containers

    // Same config: reattached, /tmp survives.
    let gw = t.gateway(&env, two.clone()).await;
    assert_eq!(
        gw.reconcile_report().reattached.len(),
        2,
        "{:?}",
        gw.reconcile_report()
    );
    assert!(gw.reconcile_report().created.is_empty());
    assert!(exec(&gw, "keep", "cat /tmp/marker")
        .await
        .joined_text()
        .contains("alive"));
    drop(gw);

    // Changed memoryLimit for `keep`, `gone` removed from the config.
    let changed = t.config(
        &env,
        &[("keep", json!({"sandbox": {"memoryLimit": "300m"}}))],
    );
    let gw = t.gateway(&env, changed).await;
    let report = gw.reconcile_report().clone();
    assert_eq!(report.created, vec!["keep".to_string()]);
    assert_eq!(report.removed_orphans, vec!["gone".to_string()]);
    let out = exec(&gw, "keep", "cat /tmp/marker").await;
    assert!(
        out.is_error,
        "a recreated container must not keep /tmp: {}",
        out.joined_text()
    );
    let agents: Vec<String> = t.containers().await.into_iter().map(|(a, _)| a).collect();
    assert_eq!(agents, vec!["keep".to_string()]);
    gw.shutdown().await.unwrap();
    assert!(t.containers().await.is_empty());
}

#[tokio::test]
async fn dead_container_is_recreated_on_next_call() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let gw = t
        .gateway(&env, t.config(&env, &[("phoenix", json!({}))]))
        .await;
    std::fs::write(
        t.home.default_workspace("phoenix").join("kept.txt"),
        "still here",
    )
    .unwrap();
    let docker = DockerSandbox::connect("x").await.unwrap();
    docker
        .client()
        .kill_container(
            &gw.sandbox_status("phoenix").await.unwrap().container,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    let out = exec(&gw, "phoenix", "cat kept.txt").await;
    let text = out.joined_text();
    assert!(text.contains("sandbox was restarted"), "{text}");
    assert!(text.contains("exit code 137"), "{text}");
    assert!(text.contains("still here"), "{text}");
    assert!(!out.is_error);
    // The next call runs normally, without the notice.
    let out = exec(&gw, "phoenix", "echo fine").await;
    assert_eq!(out.joined_text(), "Exit code: 0\nfine");
    gw.shutdown().await.unwrap();
}

/// The gateway builds the default image itself from the bundled Dockerfile. Offline
/// here, so it builds from the local Debian base made by `scripts/setup-docker
/// --debian-base` (always made in CI).
#[tokio::test]
async fn default_image_builds_from_local_debian_base() {
    let _env = docker_or_skip!();
    let base = "beige-test-debian:bookworm";
    let docker = DockerSandbox::connect("x").await.unwrap();
    if docker.client().inspect_image(base).await.is_err() {
        if super::support::required() {
            panic!("{base} missing: scripts/setup-docker --debian-base builds it");
        }
        eprintln!("SKIPPED (not in CI): {base} missing; run scripts/setup-docker --debian-base");
        return;
    }
    let tag = format!("beige-sandbox:test-{}", std::process::id());
    let docker = docker.with_build_base(Some(base.to_string()));
    docker.build_default_image(&tag).await.unwrap();
    let image = docker.client().inspect_image(&tag).await.unwrap();
    let config = image.config.unwrap();
    assert_eq!(config.working_dir.as_deref(), Some("/workspace"));
    assert!(config
        .env
        .unwrap()
        .iter()
        .any(|e| e.starts_with("PATH=/tools/bin:")));
    assert_eq!(
        config
            .labels
            .unwrap()
            .get("io.beige.image")
            .map(String::as_str),
        Some("default")
    );
    docker
        .client()
        .remove_image(
            &tag,
            None::<bollard::query_parameters::RemoveImageOptions>,
            None,
        )
        .await
        .unwrap();
}

/// `sandbox.warmPool`: a spare is created from exactly the agent's spec (the same
/// hardening, mounts and spec hash as `docker inspect` shows; only the name differs), its
/// PID 1 is held without being refused, and when the agent's container dies the next
/// call takes the spare — renamed to the agent's container — over the link at once; the
/// pool fills again, and a clean stop removes the spares too.
#[tokio::test]
async fn warm_pool_spare_has_the_agents_spec_and_replaces_a_dead_container() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let config = t.config(&env, &[("spry", json!({"sandbox": {"warmPool": 1}}))]);
    let (gw, docker) = t.gateway_and_docker(&env, config).await;
    let spec = docker.container_spec("spry").await.unwrap();
    let ready = |docker: DockerSandbox| async move {
        for _ in 0..400 {
            if docker.warm_spares("spry").await == 1 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("no spare became ready in 20 s");
    };
    ready(docker.clone()).await;

    // Two containers of the agent: its own and the spare, with the same spec.
    let ids = t.containers().await;
    assert_eq!(ids.len(), 2, "{ids:?}");
    let inspect = |name: String| {
        let docker = docker.clone();
        async move {
            docker
                .client()
                .inspect_container(
                    &name,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
                .unwrap()
        }
    };
    let main = inspect(spec.name.clone()).await;
    let spare_id = ids
        .iter()
        .map(|(_, id)| id.clone())
        .find(|id| Some(id) != main.id.as_ref())
        .unwrap();
    let spare = inspect(spare_id.clone()).await;
    assert!(spare
        .name
        .as_deref()
        .unwrap()
        .starts_with(&format!("/{}-warm-", spec.name)));
    let (mhc, shc) = (main.host_config.unwrap(), spare.host_config.unwrap());
    assert_eq!(shc.cap_drop, mhc.cap_drop);
    assert_eq!(shc.cap_add, mhc.cap_add);
    assert_eq!(shc.security_opt, mhc.security_opt);
    assert_eq!(shc.binds, mhc.binds);
    assert_eq!(shc.memory, mhc.memory);
    assert_eq!(shc.pids_limit, mhc.pids_limit);
    assert_eq!(shc.network_mode, mhc.network_mode);
    assert_eq!(shc.readonly_rootfs, mhc.readonly_rootfs);
    let (mcfg, scfg) = (main.config.unwrap(), spare.config.unwrap());
    assert_eq!(scfg.labels, mcfg.labels);
    assert_eq!(scfg.entrypoint, mcfg.entrypoint);
    assert_eq!(scfg.env, mcfg.env);
    assert_eq!(scfg.user, mcfg.user);
    // The spare's PID 1 dialled the agent's control socket: held, not refused.
    assert_eq!(docker.link_hub().status_of("spry").rejected_peers, 0);

    docker
        .client()
        .kill_container(
            &spec.name,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    // The link noticed the death before the next call: that call goes to the engine
    // once and to the spare, never first through a `docker exec` into the dead one.
    for _ in 0..400 {
        if !docker.link_hub().is_connected("spry") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!docker.link_hub().is_connected("spry"));
    let out = exec(&gw, "spry", "echo from the spare").await;
    let text = out.joined_text();
    assert!(text.contains("sandbox was restarted"), "{text}");
    assert!(text.contains("from the spare"), "{text}");
    // The agent's container is now the spare, renamed, and its link is up.
    assert_eq!(inspect(spec.name.clone()).await.id, Some(spare_id.clone()));
    let status = docker.link_hub().status_of("spry");
    assert!(status.connected);
    assert_eq!(status.rejected_peers, 0);
    assert_eq!(status.ops_fallback, 0, "{status:?}");
    // The pool fills again.
    ready(docker.clone()).await;
    gw.shutdown().await.unwrap();
    assert!(t.containers().await.is_empty());
}
