//! The container spec: everything the gateway asks Docker for, as a plain value.
//!
//! [`ContainerSpec::for_agent`] is a function from configuration to spec — image,
//! mounts, environment, user, limits, network, capabilities, labels — so the security
//! decisions it encodes can be printed, hashed, snapshot-tested and reviewed without a
//! daemon (it reads the file system only to resolve `extraMounts` sources to their
//! canonical paths, which are what Docker gets). The Docker backend only translates it
//! into the Engine API body, after [`ContainerSpec::recheck_mounts`] has checked those
//! sources again. Nothing from the gateway's own environment ever enters a spec.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::{AgentConfig, LinkMode, NetworkMode, WritableTrees};
use crate::home::{BeigeHome, InstallationId};

/// Label carrying the agent name.
pub const LABEL_AGENT: &str = "io.beige.agent";
/// Label carrying the [`InstallationId`] of the owning installation.
pub const LABEL_INSTALLATION: &str = "io.beige.installation";
/// Label of containers made before installation ids: the path hash of their
/// `BEIGE_HOME` ([`BeigeHome::hash`]). New containers do not carry it; it is only read,
/// to migrate such containers.
pub const LABEL_HOME: &str = "io.beige.home";
/// Label carrying the hash of the spec the container was created from.
pub const LABEL_SPEC: &str = "io.beige.spec";

/// Where the shim is mounted inside every container.
pub const SHIM_PATH: &str = "/beige/shim";
/// The `PATH` of every sandbox: plugin tools first.
pub const SANDBOX_PATH: &str =
    "/tools/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The agent's working directory inside the container.
pub const WORKSPACE: &str = "/workspace";

/// The uid:gid the agent's processes run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SandboxUser {
    Root,
    Id { uid: u32, gid: u32 },
}

impl SandboxUser {
    /// The user used when the gateway runs as root and the workspace is root's.
    pub const DEFAULT: SandboxUser = SandboxUser::Id {
        uid: 1000,
        gid: 1000,
    };

    /// Docker's `User` field.
    pub fn docker(&self) -> String {
        match self {
            SandboxUser::Root => "0:0".to_string(),
            SandboxUser::Id { uid, gid } => format!("{uid}:{gid}"),
        }
    }

    /// Parse the config's `sandbox.user` (`root` or `uid:gid`).
    pub fn parse(s: &str) -> Option<SandboxUser> {
        if s == "root" {
            return Some(SandboxUser::Root);
        }
        let (u, g) = s.split_once(':')?;
        let uid = u.parse().ok()?;
        let gid = g.parse().ok()?;
        if uid == 0 {
            Some(SandboxUser::Root)
        } else {
            Some(SandboxUser::Id { uid, gid })
        }
    }
}

/// One bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

impl Mount {
    fn new(host: impl Into<PathBuf>, container: impl Into<String>, read_only: bool) -> Self {
        Self {
            host: host.into(),
            container: container.into(),
            read_only,
        }
    }

    /// Docker's bind string `host:container[:ro]`.
    pub fn bind(&self) -> String {
        format!(
            "{}:{}:{}",
            self.host.display(),
            self.container,
            if self.read_only { "ro" } else { "rw" }
        )
    }
}

/// Everything the spec is computed from, already resolved (paths absolute, user known).
#[derive(Debug, Clone)]
pub struct SpecInput<'a> {
    pub home: &'a BeigeHome,
    /// The installation the container belongs to (its label and name).
    pub installation: &'a InstallationId,
    /// Every host folder some agent can write (all workspaces, read-write extra
    /// mounts): no extra mount may come from inside one.
    pub writable: &'a WritableTrees,
    pub agent: &'a str,
    pub config: &'a AgentConfig,
    /// The host folder mounted at `/workspace`.
    pub workspace: PathBuf,
    /// The static shim on the host.
    pub shim: PathBuf,
    pub user: SandboxUser,
    /// `(tool name, plugin folder)` mounted at `/tools/packages/<tool>/`.
    pub tool_packages: Vec<(String, PathBuf)>,
    /// `(skill name, folder)` mounted at `/skills/<name>/`.
    pub skills: Vec<(String, PathBuf)>,
}

/// The container a gateway wants for one agent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerSpec {
    pub agent: String,
    pub name: String,
    pub hostname: String,
    pub image: String,
    pub entrypoint: Vec<String>,
    pub user: String,
    pub working_dir: String,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    /// `none` or `bridge`.
    pub network: String,
    pub cap_drop: Vec<String>,
    pub cap_add: Vec<String>,
    pub security_opt: Vec<String>,
    pub memory_bytes: i64,
    /// Equal to `memory_bytes`: no swap beyond the memory limit.
    pub memory_swap_bytes: i64,
    pub pids_limit: i64,
    pub nano_cpus: Option<i64>,
    pub read_only_root: bool,
    pub tmpfs: BTreeMap<String, String>,
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

/// The inputs of the `extraMounts` check, kept in the spec.
#[derive(Debug, Clone, PartialEq)]
struct MountRecheck {
    home: BeigeHome,
    workspace: PathBuf,
    writable: WritableTrees,
    /// `(host as configured, container as configured, index into mounts)`.
    entries: Vec<(String, String, usize)>,
}

/// The only capabilities a non-root sandbox's container keeps, all for PID 1: SETUID
/// and SETGID to become the agent, SETPCAP to empty its children's bounding sets,
/// KILL to signal the agent's processes. No agent process holds any of them.
pub const LINK_CAPS: [&str; 4] = ["SETUID", "SETGID", "KILL", "SETPCAP"];

/// Capabilities removed from Docker's default set when the sandbox runs as root.
pub const ROOT_CAP_DROP: [&str; 5] = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SYS_CHROOT"];

/// Why a spec cannot be built (the config validation catches these first; the spec
/// refuses them again so no code path can skip the check).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("agent '{agent}': invalid sandbox.memoryLimit \"{value}\" — use a number with an optional k/m/g unit, e.g. \"512m\" or \"3g\"")]
    MemoryLimit { agent: String, value: String },
    #[error(
        "agent '{agent}': sandbox.extraMounts entry {host} → {container} is refused: {reason}"
    )]
    Mount {
        agent: String,
        host: String,
        container: String,
        reason: String,
    },
}

impl ContainerSpec {
    /// Compute the spec of an agent's container. Touches no Docker; reads the file
    /// system only to resolve the `extraMounts` sources (see [`Self::recheck_mounts`]).
    pub fn for_agent(input: &SpecInput<'_>) -> Result<ContainerSpec, SpecError> {
        let cfg = &input.config.sandbox;
        let agent = input.agent;
        let memory = crate::config::parse_memory_limit(&cfg.memory_limit).ok_or_else(|| {
            SpecError::MemoryLimit {
                agent: agent.to_string(),
                value: cfg.memory_limit.clone(),
            }
        })?;
        let memory = i64::try_from(memory).unwrap_or(i64::MAX);

        let mut mounts = vec![
            Mount::new(&input.workspace, WORKSPACE, false),
            Mount::new(input.home.launchers_dir(agent), "/tools/bin", true),
            Mount::new(input.home.run_dir(agent), "/beige/run", true),
            Mount::new(&input.shim, SHIM_PATH, true),
        ];
        for (tool, dir) in &input.tool_packages {
            mounts.push(Mount::new(dir, format!("/tools/packages/{tool}"), true));
        }
        for (skill, dir) in &input.skills {
            mounts.push(Mount::new(dir, format!("/skills/{skill}"), true));
        }
        let mut recheck = MountRecheck {
            home: input.home.clone(),
            workspace: input.workspace.clone(),
            writable: input.writable.clone(),
            entries: Vec::new(),
        };
        for (host, target) in &cfg.extra_mounts {
            let checked = recheck.check(agent, host, target)?;
            recheck
                .entries
                .push((host.clone(), target.clone(), mounts.len()));
            // The canonical path (when the source exists): a symlink on the way is
            // resolved now, under the checks, not later by Docker.
            mounts.push(Mount::new(
                checked.host,
                checked.container,
                checked.read_only,
            ));
        }

        // A non-root agent: the container runs as root with only LINK_CAPS, PID 1 (the
        // shim) drops every process it starts to the agent's uid with empty capability
        // sets, no_new_privs and a seccomp filter; so does `op --drop` on the
        // `docker exec` path. A root agent keeps the plain root container.
        let (cap_drop, mut cap_add, agent_user, link) = match input.user {
            SandboxUser::Root => (
                ROOT_CAP_DROP.iter().map(|c| c.to_string()).collect(),
                Vec::new(),
                None,
                LinkMode::Off,
            ),
            SandboxUser::Id { .. } => (
                vec!["ALL".to_string()],
                LINK_CAPS.iter().map(|c| c.to_string()).collect(),
                Some(input.user.docker()),
                cfg.link,
            ),
        };
        // `capAdd` only means something for a root agent (its processes keep
        // capabilities); for others the config loader warns that it is ignored.
        if input.user == SandboxUser::Root {
            cap_add.extend(cfg.cap_add.iter().cloned());
        }
        let mut entrypoint = vec![SHIM_PATH.to_string(), "init".to_string()];
        if let Some(user) = &agent_user {
            entrypoint.extend([
                "--agent-user".to_string(),
                user.clone(),
                "--link".to_string(),
                link.as_str().to_string(),
            ]);
        }
        let attach = link == LinkMode::Attach;

        let home_env = match input.user {
            SandboxUser::Root => "/root",
            SandboxUser::Id { .. } => WORKSPACE,
        };
        let mut env = vec![format!("PATH={SANDBOX_PATH}"), format!("HOME={home_env}")];
        env.extend(cfg.extra_env.iter().map(|(k, v)| format!("{k}={v}")));

        let mut tmpfs = BTreeMap::new();
        if cfg.read_only_root {
            tmpfs.insert("/tmp".to_string(), "rw,nosuid,nodev,size=256m".to_string());
        }

        let mut labels = BTreeMap::new();
        labels.insert(LABEL_AGENT.to_string(), agent.to_string());
        labels.insert(
            LABEL_INSTALLATION.to_string(),
            input.installation.to_string(),
        );

        let mut spec = ContainerSpec {
            agent: agent.to_string(),
            name: container_name(agent, input.installation),
            hostname: format!("beige-{agent}"),
            image: cfg.image.clone(),
            entrypoint,
            user: SandboxUser::Root.docker(),
            working_dir: WORKSPACE.to_string(),
            env,
            labels,
            mounts,
            network: match cfg.network {
                NetworkMode::None => "none".to_string(),
                NetworkMode::Bridge => "bridge".to_string(),
            },
            cap_drop,
            cap_add,
            security_opt: vec!["no-new-privileges:true".to_string()],
            memory_bytes: memory,
            memory_swap_bytes: memory,
            pids_limit: cfg.pids_limit,
            nano_cpus: cfg.cpus.map(|c| (c * 1e9).round() as i64),
            read_only_root: cfg.read_only_root,
            tmpfs,
            agent_user,
            link,
            open_stdin: attach,
            log_driver: attach.then(|| "none".to_string()),
            disk_limit_bytes: cfg.disk_limit.map(|l| l.bytes()),
            recheck: Some(recheck),
        };
        let hash = spec.hash();
        spec.labels.insert(LABEL_SPEC.to_string(), hash);
        Ok(spec)
    }

    /// Hash of everything in the spec except the spec label itself: equal hashes mean a
    /// running container can be reattached.
    pub fn hash(&self) -> String {
        let mut copy = self.clone();
        copy.labels.remove(LABEL_SPEC);
        let json = serde_json::to_vec(&copy).unwrap_or_default();
        hex::encode(&Sha256::digest(&json)[..8])
    }

    /// Check the `extraMounts` sources again, as they are now: each must still pass the
    /// refusal rules, exist, and resolve to the canonical path the spec was computed
    /// with (a folder on the way replaced by a symlink changes that). The Docker
    /// backend calls this before every creation of the container, including the
    /// recreation of one that died.
    pub fn recheck_mounts(&self) -> Result<(), SpecError> {
        let Some(recheck) = &self.recheck else {
            return Ok(());
        };
        for (host, target, index) in &recheck.entries {
            let refused = |reason: String| SpecError::Mount {
                agent: self.agent.clone(),
                host: host.clone(),
                container: target.clone(),
                reason,
            };
            let now = recheck.check(&self.agent, host, target)?;
            if std::fs::symlink_metadata(&now.host).is_err() {
                return Err(refused(
                    "the host path no longer exists (Docker would create an empty folder \
                     owned by root in its place); restore it, or remove the entry and run \
                     `beige gateway restart`"
                        .to_string(),
                ));
            }
            let was = self.mounts.get(*index).map(|m| m.host.as_path());
            if was != Some(now.host.as_path()) {
                return Err(refused(format!(
                    "it now resolves to {}, not {} as when the sandbox was first set up: a \
                     folder on its path was replaced (perhaps by a symlink), so the sandbox \
                     is not recreated with it. Check the path; if the new location is \
                     intended, run `beige gateway restart` to accept it",
                    now.host.display(),
                    was.map(|p| p.display().to_string()).unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// The hash recorded in the spec's labels.
    pub fn spec_label(&self) -> &str {
        self.labels
            .get(LABEL_SPEC)
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// `beige-<agent>-<first 12 digits of the installation id>`.
pub fn container_name(agent: &str, installation: &InstallationId) -> String {
    format!("beige-{agent}-{}", installation.short())
}

impl MountRecheck {
    /// One entry through [`crate::config::check_extra_mount`], as a [`SpecError`].
    fn check(
        &self,
        agent: &str,
        host: &str,
        target: &str,
    ) -> Result<crate::config::MountTarget, SpecError> {
        crate::config::check_extra_mount(
            &self.home,
            &self.workspace,
            &self.writable,
            std::path::Path::new(host),
            target,
        )
        .map_err(|reason| SpecError::Mount {
            agent: agent.to_string(),
            host: host.to_string(),
            container: target.to_string(),
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;

    fn agent_config(json: serde_json::Value) -> AgentConfig {
        serde_json::from_value(json).unwrap()
    }

    /// A fixed id, so that the snapshot is stable.
    fn installation() -> &'static InstallationId {
        static ID: std::sync::OnceLock<InstallationId> = std::sync::OnceLock::new();
        ID.get_or_init(|| InstallationId::parse("0123456789abcdef0123456789abcdef").unwrap())
    }

    fn no_trees() -> &'static WritableTrees {
        static TREES: std::sync::OnceLock<WritableTrees> = std::sync::OnceLock::new();
        TREES.get_or_init(WritableTrees::default)
    }

    fn input<'a>(home: &'a BeigeHome, cfg: &'a AgentConfig, user: SandboxUser) -> SpecInput<'a> {
        SpecInput {
            home,
            installation: installation(),
            writable: no_trees(),
            agent: "assistant",
            config: cfg,
            workspace: home.default_workspace("assistant"),
            shim: PathBuf::from("/opt/beige/beige-shim"),
            user,
            tool_packages: vec![("kv".into(), PathBuf::from("/opt/beige/plugins/kv"))],
            skills: vec![("review".into(), PathBuf::from("/opt/skills/review"))],
        }
    }

    #[test]
    fn default_spec_is_hardened() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"},
            "tools": ["kv"],
            "sandbox": {"extraEnv": {"NODE_ENV": "dev"}, "extraMounts": {"/srv/data": "/data:ro"}}
        }));
        let spec = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(spec.network, "none");
        assert_eq!(spec.cap_drop, vec!["ALL"]);
        assert_eq!(spec.cap_add, LINK_CAPS.to_vec());
        assert_eq!(spec.user, "0:0");
        assert_eq!(spec.agent_user.as_deref(), Some("1000:1000"));
        assert_eq!(spec.link, LinkMode::Unix);
        assert_eq!(
            spec.entrypoint,
            [
                "/beige/shim",
                "init",
                "--agent-user",
                "1000:1000",
                "--link",
                "unix"
            ]
        );
        assert!(!spec.open_stdin);
        assert_eq!(spec.memory_bytes, 3 * 1024 * 1024 * 1024);
        assert_eq!(spec.memory_swap_bytes, spec.memory_bytes);
        assert_eq!(spec.pids_limit, 512);
        assert!(spec
            .security_opt
            .iter()
            .any(|s| s.starts_with("no-new-privileges")));
        insta::assert_json_snapshot!("default_spec", spec);
    }

    #[test]
    fn root_and_options() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"},
            "tools": [],
            "sandbox": {"memoryLimit": "512m", "network": "bridge", "cpus": 1.5,
                        "readOnlyRoot": true, "capAdd": ["NET_BIND_SERVICE"], "pidsLimit": 64}
        }));
        let spec = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::Root)).unwrap();
        assert_eq!(spec.user, "0:0");
        assert_eq!(spec.cap_drop, ROOT_CAP_DROP.to_vec());
        assert_eq!(spec.cap_add, vec!["NET_BIND_SERVICE"]);
        assert_eq!(spec.nano_cpus, Some(1_500_000_000));
        assert_eq!(spec.memory_bytes, 512 * 1024 * 1024);
        assert!(spec.tmpfs.contains_key("/tmp"));
        assert_eq!(spec.network, "bridge");
        assert_eq!(spec.pids_limit, 64);
        assert_eq!(spec.agent_user, None);
        assert_eq!(spec.link, LinkMode::Off);
        assert_eq!(spec.entrypoint, ["/beige/shim", "init"]);
    }

    #[test]
    fn attach_link_keeps_stdin_open_and_logs_nothing() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": [],
            "sandbox": {"link": "attach", "capAdd": ["SETUID", "NET_BIND_SERVICE"]}
        }));
        let spec = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(spec.link, LinkMode::Attach);
        assert!(spec.open_stdin);
        assert_eq!(spec.log_driver.as_deref(), Some("none"));
        assert_eq!(spec.entrypoint.last().map(String::as_str), Some("attach"));
        // capAdd widens nothing for a non-root agent (the loader warns).
        assert_eq!(spec.cap_add, LINK_CAPS.to_vec());
    }

    #[test]
    fn hash_tracks_changes() {
        let home = BeigeHome::new("/home/u/.beige");
        let mut cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": []
        }));
        let a = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        let b = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(a.spec_label(), b.spec_label());
        cfg.sandbox.memory_limit = "1g".into();
        let c = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_ne!(a.spec_label(), c.spec_label());
        // Another installation — even with the same BEIGE_HOME path — gets another name
        // and label.
        let other = InstallationId::generate();
        let d = ContainerSpec::for_agent(&SpecInput {
            installation: &other,
            ..input(&home, &cfg, SandboxUser::DEFAULT)
        })
        .unwrap();
        assert_ne!(c.name, d.name);
        assert_eq!(d.name, format!("beige-assistant-{}", other.short()));
        assert_eq!(
            d.labels.get(LABEL_INSTALLATION).map(String::as_str),
            Some(other.as_str())
        );
        assert!(!d.labels.contains_key(LABEL_HOME));
    }

    #[test]
    fn dangerous_mounts_refused() {
        let home = BeigeHome::new("/home/u/.beige");
        for (host, target) in [
            ("/", "/host"),
            ("/var/run/docker.sock", "/var/run/docker.sock"),
            ("/home/u/.beige", "/h"),
            ("/srv/x", "/workspace/x"),
        ] {
            let cfg = agent_config(serde_json::json!({
                "model": {"provider": "anthropic", "model": "m"}, "tools": [],
                "sandbox": {"extraMounts": {host: target}}
            }));
            let err = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT));
            assert!(
                matches!(err, Err(SpecError::Mount { .. })),
                "{host} → {target} accepted"
            );
        }
    }

    #[test]
    fn bad_memory_limit_refused() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": [],
            "sandbox": {"memoryLimit": "lots"}
        }));
        let err = ContainerSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap_err();
        assert!(err.to_string().contains("\"lots\""));
    }

    #[test]
    fn user_parse() {
        assert_eq!(SandboxUser::parse("root"), Some(SandboxUser::Root));
        assert_eq!(
            SandboxUser::parse("1001:100"),
            Some(SandboxUser::Id {
                uid: 1001,
                gid: 100
            })
        );
        assert_eq!(SandboxUser::parse("0:0"), Some(SandboxUser::Root));
        assert_eq!(SandboxUser::parse("bob"), None);
    }

    #[test]
    fn disk_limit_is_passed_only_when_set() {
        let home = BeigeHome::new("/home/u/.beige");
        let plain = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": []
        }));
        let spec = ContainerSpec::for_agent(&input(&home, &plain, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(spec.disk_limit_bytes, None);
        let json = serde_json::to_value(&spec).unwrap();
        assert!(json.get("disk_limit_bytes").is_none(), "{json}");
        let limited = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": [],
            "sandbox": {"diskLimit": "10g"}
        }));
        let with = ContainerSpec::for_agent(&input(&home, &limited, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(with.disk_limit_bytes, Some(10 << 30));
        // A different limit is a different container.
        assert_ne!(with.spec_label(), spec.spec_label());
    }
}
