//! The Docker translation of a [`SandboxSpec`]: the container (name, the shim and
//! `run/<agent>` mounts, capability sets, `security_opt`, `"uid:gid"`, the link mode) as
//! a plain [`ContainerSpec`], and the Engine API body made from it.
//!
//! A [`ContainerSpec`] serialises exactly as it did when the gateway computed it from
//! config itself, so the `io.beige.spec` hash of an unchanged agent stays the same and its
//! running container is reattached across versions.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use bollard::models::{ContainerCreateBody, HostConfig};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::{LinkMode, NetworkMode};
use crate::home::InstallationId;
use crate::sandbox::spec::{
    Mount, MountRecheck, SandboxSpec, SandboxUser, SpecError, LABEL_INSTALLATION, LABEL_SPEC,
    SANDBOX_PATH, SHIM_PATH, WORKSPACE,
};

/// The only capabilities a non-root sandbox's container keeps, all for PID 1: SETUID
/// and SETGID to become the agent, SETPCAP to empty its children's bounding sets,
/// KILL to signal the agent's processes. No agent process holds any of them.
pub const LINK_CAPS: [&str; 4] = ["SETUID", "SETGID", "KILL", "SETPCAP"];

/// Capabilities removed from Docker's default set when the sandbox runs as root.
pub const ROOT_CAP_DROP: [&str; 5] = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SYS_CHROOT"];

/// What the Docker backend adds to a [`SandboxSpec`] for one agent.
#[derive(Debug, Clone)]
pub struct BodyInput<'a> {
    /// The static shim on the host, mounted at [`SHIM_PATH`].
    pub shim: &'a Path,
    /// The agent's launcher folder on the host, mounted at `/tools/bin`.
    pub launchers: PathBuf,
    /// The agent's `run/<agent>` folder on the host (its tool socket and the link's
    /// control socket), mounted at `/beige/run`.
    pub run_dir: PathBuf,
    /// `sandbox.link` of the agent (a `root` sandbox has none whatever it says).
    pub link: LinkMode,
}

/// The container a gateway wants for one agent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerSpec {
    /// The agent the container is for.
    pub agent: String,
    /// The container name, `beige-<agent>-<first 12 digits of the installation id>`.
    pub name: String,
    /// The hostname inside the container, `beige-<agent>`.
    pub hostname: String,
    /// The image reference ([`SandboxSpec::image`]).
    pub image: String,
    /// The shim's `init` at [`SHIM_PATH`], with the agent's user and link mode for a
    /// non-root sandbox.
    pub entrypoint: Vec<String>,
    /// The user the container itself runs as: always root (`0:0`); the agent's own
    /// user is [`agent_user`](Self::agent_user).
    pub user: String,
    /// The working directory, [`WORKSPACE`].
    pub working_dir: String,
    /// `KEY=value` pairs: `PATH` and `HOME` first, then `sandbox.extraEnv` in config
    /// order.
    pub env: Vec<String>,
    /// The spec's labels plus [`LABEL_SPEC`], the hash of this spec.
    pub labels: BTreeMap<String, String>,
    /// Bind mounts: the workspace, the launchers, `run/<agent>`, the shim, the shares,
    /// then the extra mounts.
    pub mounts: Vec<Mount>,
    /// `none` or `bridge`.
    pub network: String,
    /// Capabilities dropped: `ALL` for a non-root sandbox, [`ROOT_CAP_DROP`] for root.
    pub cap_drop: Vec<String>,
    /// Capabilities added: [`LINK_CAPS`] for a non-root sandbox, `sandbox.capAdd` for
    /// root.
    pub cap_add: Vec<String>,
    /// Docker's `security_opt` (`no-new-privileges:true`).
    pub security_opt: Vec<String>,
    /// Memory limit in bytes, swap included (`sandbox.memoryLimit`).
    pub memory_bytes: i64,
    /// Equal to `memory_bytes`: no swap beyond the memory limit.
    pub memory_swap_bytes: i64,
    /// Most processes the container may run (`sandbox.pidsLimit`).
    pub pids_limit: i64,
    /// CPU quota in billionths of a CPU (`sandbox.cpus`); `None`: no quota.
    pub nano_cpus: Option<i64>,
    /// A read-only root file system (`sandbox.readOnlyRoot`).
    pub read_only_root: bool,
    /// tmpfs mounts and their options: a writable `/tmp` when the root is read-only,
    /// else none.
    pub tmpfs: BTreeMap<String, String>,
    /// Name servers of the container (`127.0.0.1`, PID 1's DNS stub, with transparent
    /// egress); empty: the engine's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<String>,
    /// Namespaced sysctls (with transparent egress, the low ports PID 1 binds without
    /// `NET_BIND_SERVICE`); empty: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
    /// `uid:gid` the agent's processes run as when the container itself runs as root
    /// with only the capabilities PID 1 needs ([`LINK_CAPS`]); PID 1 and every `op`
    /// drop to it. `None` for `root` sandboxes.
    pub agent_user: Option<String>,
    /// How core tools reach the sandbox (`off` for `root` sandboxes).
    pub link: LinkMode,
    /// Keep stdin open and log nothing (the attach carrier).
    pub open_stdin: bool,
    /// Docker log driver; `none` for the attach carrier (its stdout is the link).
    pub log_driver: Option<String>,
    /// Size limit of the container's root file system in bytes (`sandbox.diskLimit`,
    /// Docker's `StorageOpt size`). Unset: no limit, and the spec (and its hash) is
    /// what it was before the key existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_limit_bytes: Option<u64>,
    /// What the extra mounts were checked against, to check them again before every
    /// (re)creation of the container.
    #[serde(skip)]
    recheck: Option<MountRecheck>,
}

impl ContainerSpec {
    /// The container of `spec`: pure, touches no Docker.
    pub fn from_spec(spec: &SandboxSpec, docker: &BodyInput<'_>) -> ContainerSpec {
        let agent = spec.agent.as_str();
        let memory = i64::try_from(spec.limits.memory_bytes).unwrap_or(i64::MAX);

        let mut mounts = vec![
            Mount::new(&spec.workspace, WORKSPACE, false),
            Mount::new(&docker.launchers, "/tools/bin", true),
            Mount::new(&docker.run_dir, "/beige/run", true),
            Mount::new(docker.shim, SHIM_PATH, true),
        ];
        for share in &spec.shares {
            mounts.push(Mount::new(&share.source, share.target.clone(), true));
        }
        let recheck = spec.recheck_at(mounts.len());
        mounts.extend(spec.extra_mounts.iter().cloned());

        // A non-root agent: the container runs as root with only LINK_CAPS, PID 1 (the
        // shim) drops every process it starts to the agent's uid with empty capability
        // sets, no_new_privs and a seccomp filter; so does `op --drop` on the
        // `docker exec` path. A root agent keeps the plain root container.
        let (cap_drop, cap_add, agent_user, link) = match spec.user {
            SandboxUser::Root => (
                ROOT_CAP_DROP.iter().map(|c| c.to_string()).collect(),
                spec.extra_capabilities.clone(),
                None,
                LinkMode::Off,
            ),
            SandboxUser::Id { .. } => (
                vec!["ALL".to_string()],
                LINK_CAPS.iter().map(|c| c.to_string()).collect(),
                Some(spec.user.docker()),
                docker.link,
            ),
        };
        let mut entrypoint = vec![SHIM_PATH.to_string(), "init".to_string()];
        if let Some(user) = &agent_user {
            entrypoint.extend([
                "--agent-user".to_string(),
                user.clone(),
                "--link".to_string(),
                link.as_str().to_string(),
            ]);
        }
        // Egress only for a sandbox with the link (config validation refuses the rest).
        let egress = spec.egress.as_ref().filter(|_| agent_user.is_some());
        let mut dns = Vec::new();
        let mut sysctls = BTreeMap::new();
        if let Some(egress) = egress {
            entrypoint.extend(["--egress".to_string(), egress.shim_flag()]);
            if egress.transparent {
                dns.push("127.0.0.1".to_string());
                sysctls.insert(
                    "net.ipv4.ip_unprivileged_port_start".to_string(),
                    "0".to_string(),
                );
            }
        }
        let attach = link == LinkMode::Attach;

        let home_env = match spec.user {
            SandboxUser::Root => "/root",
            SandboxUser::Id { .. } => WORKSPACE,
        };
        let mut env = vec![format!("PATH={SANDBOX_PATH}"), format!("HOME={home_env}")];
        env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
        if let Some(egress) = egress {
            env.extend(egress.env().into_iter().map(|(k, v)| format!("{k}={v}")));
        }

        let mut tmpfs = BTreeMap::new();
        if spec.read_only_root {
            tmpfs.insert("/tmp".to_string(), "rw,nosuid,nodev,size=256m".to_string());
        }
        if egress.is_some_and(|e| e.ca_der.is_some()) {
            // Root's (PID 1 writes the CA there at boot); agents only read it.
            tmpfs.insert(
                crate::sandbox::spec::EGRESS_CA_DIR.to_string(),
                "rw,nosuid,nodev,noexec,size=8m,mode=0755".to_string(),
            );
        }

        let installation = spec.installation().unwrap_or_default();
        let short = installation
            .get(..InstallationId::SHORT)
            .unwrap_or(installation);
        let mut container = ContainerSpec {
            agent: agent.to_string(),
            name: format!("beige-{agent}-{short}"),
            hostname: format!("beige-{agent}"),
            image: spec.image.clone(),
            entrypoint,
            user: SandboxUser::Root.docker(),
            working_dir: WORKSPACE.to_string(),
            env,
            labels: spec.labels.clone(),
            mounts,
            network: match spec.network {
                NetworkMode::None => "none".to_string(),
                NetworkMode::Bridge => "bridge".to_string(),
            },
            cap_drop,
            cap_add,
            security_opt: vec!["no-new-privileges:true".to_string()],
            memory_bytes: memory,
            memory_swap_bytes: memory,
            pids_limit: spec.limits.pids,
            nano_cpus: spec.limits.cpus.map(|c| (c * 1e9).round() as i64),
            read_only_root: spec.read_only_root,
            tmpfs,
            dns,
            sysctls,
            agent_user,
            link,
            open_stdin: attach,
            log_driver: attach.then(|| "none".to_string()),
            disk_limit_bytes: spec.limits.disk_bytes,
            recheck,
        };
        let hash = container.hash();
        container.labels.insert(LABEL_SPEC.to_string(), hash);
        container
    }

    /// Hash of everything in the spec except the spec label itself: equal hashes mean a
    /// running container can be reattached.
    pub fn hash(&self) -> String {
        let mut copy = self.clone();
        copy.labels.remove(LABEL_SPEC);
        let json = serde_json::to_vec(&copy).unwrap_or_default();
        hex::encode(&Sha256::digest(&json)[..8])
    }

    /// [`SandboxSpec::recheck_mounts`], against this container's mounts. The Docker
    /// backend calls this before every creation of the container, including the
    /// recreation of one that died.
    pub fn recheck_mounts(&self) -> Result<(), SpecError> {
        match &self.recheck {
            Some(recheck) => recheck.run(&self.agent, &self.mounts),
            None => Ok(()),
        }
    }

    /// The hash recorded in the spec's labels.
    pub fn spec_label(&self) -> &str {
        self.labels
            .get(LABEL_SPEC)
            .map(String::as_str)
            .unwrap_or("")
    }

    /// The installation the container belongs to ([`LABEL_INSTALLATION`]).
    pub fn installation(&self) -> Option<&str> {
        self.labels.get(LABEL_INSTALLATION).map(String::as_str)
    }
}

/// The Engine API body for a spec.
pub fn engine_body(spec: &ContainerSpec) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        hostname: Some(spec.hostname.clone()),
        user: Some(spec.user.clone()),
        working_dir: Some(spec.working_dir.clone()),
        entrypoint: Some(spec.entrypoint.clone()),
        cmd: Some(Vec::new()),
        env: Some(spec.env.clone()),
        labels: Some(spec.labels.clone().into_iter().collect()),
        network_disabled: None,
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        tty: Some(false),
        // The attach carrier: PID 1's stdin stays open across attaches, and its stdout
        // (the link) is not logged.
        open_stdin: Some(spec.open_stdin),
        stdin_once: Some(false),
        host_config: Some(HostConfig {
            binds: Some(spec.mounts.iter().map(|m| m.bind()).collect()),
            network_mode: Some(spec.network.clone()),
            cap_drop: Some(spec.cap_drop.clone()),
            cap_add: if spec.cap_add.is_empty() {
                None
            } else {
                Some(spec.cap_add.clone())
            },
            security_opt: Some(spec.security_opt.clone()),
            memory: Some(spec.memory_bytes),
            memory_swap: Some(spec.memory_swap_bytes),
            pids_limit: Some(spec.pids_limit),
            nano_cpus: spec.nano_cpus,
            readonly_rootfs: Some(spec.read_only_root),
            tmpfs: if spec.tmpfs.is_empty() {
                None
            } else {
                Some(spec.tmpfs.clone().into_iter().collect())
            },
            dns: (!spec.dns.is_empty()).then(|| spec.dns.clone()),
            dns_search: (!spec.dns.is_empty()).then(Vec::new),
            sysctls: (!spec.sysctls.is_empty()).then(|| spec.sysctls.clone().into_iter().collect()),
            init: Some(false),
            log_config: spec.log_driver.as_ref().map(|driver| {
                bollard::models::HostConfigLogConfig {
                    typ: Some(driver.clone()),
                    config: None,
                }
            }),
            storage_opt: spec
                .disk_limit_bytes
                .map(|b| HashMap::from([("size".to_string(), b.to_string())])),
            ..Default::default()
        }),
        ..Default::default()
    }
}
