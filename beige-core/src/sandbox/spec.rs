//! The sandbox spec: what an agent's sandbox must be, as a plain, portable value.
//!
//! [`SandboxSpec::for_agent`] is a function from configuration to spec — image, user,
//! workspace, shared folders, mounts, environment, limits, network, capabilities,
//! labels — so the security decisions it encodes can be printed, compared and reviewed
//! without a backend (it reads the file system only to resolve `extraMounts` sources to
//! their canonical paths, which are what a backend gets). It carries no mechanics of a
//! backend: the Docker backend translates it into its container body (name, the shim and
//! `run/<agent>` mounts, capability sets, `security_opt`, the link mode), after
//! [`SandboxSpec::recheck_mounts`] has checked those sources again. Nothing from the
//! gateway's own environment ever enters a spec.

use std::collections::BTreeMap;
use std::path::PathBuf;

use indexmap::IndexMap;
use serde::Serialize;

use crate::config::{AgentConfig, NetworkMode, WritableTrees};
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
/// The agent's working directory inside the sandbox.
pub const WORKSPACE: &str = "/workspace";

pub use crate::config::SandboxUser;

/// One bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// The source on the gateway's host: its canonical path, when it exists.
    pub host: PathBuf,
    /// Where the sandbox sees it (an absolute path inside the sandbox).
    pub container: String,
    /// Mounted read-only; otherwise read-write.
    pub read_only: bool,
}

impl Mount {
    pub(crate) fn new(
        host: impl Into<PathBuf>,
        container: impl Into<String>,
        read_only: bool,
    ) -> Self {
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

/// What a [`Share`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ShareKind {
    /// A plugin tool's package folder, at `/tools/packages/<tool>/`.
    ToolPackage,
    /// A skill folder, at `/skills/<name>/`.
    Skill,
}

/// A folder of the gateway the sandbox sees read-only: a tool's package or a skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Share {
    /// Whether it is a tool's package or a skill.
    pub kind: ShareKind,
    /// The tool's or the skill's name.
    pub name: String,
    /// The folder on the gateway's host.
    pub source: PathBuf,
    /// Where the sandbox sees it.
    pub target: String,
}

/// What the sandbox may use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Limits {
    /// Memory, swap included (`sandbox.memoryLimit`).
    pub memory_bytes: u64,
    /// Processes (`sandbox.pidsLimit`).
    pub pids: i64,
    /// CPU quota (`sandbox.cpus`); `None`: no quota.
    pub cpus: Option<f64>,
    /// Size of the root file system (`sandbox.diskLimit`); `None`: no limit.
    pub disk_bytes: Option<u64>,
}

/// Everything the spec is computed from, already resolved (paths absolute, user known).
#[derive(Debug, Clone)]
pub struct SpecInput<'a> {
    /// The gateway's `BEIGE_HOME`, which no extra mount may expose.
    pub home: &'a BeigeHome,
    /// The installation the sandbox belongs to (its label).
    pub installation: &'a InstallationId,
    /// Every host folder some agent can write (all workspaces, read-write extra
    /// mounts): no extra mount may come from inside one.
    pub writable: &'a WritableTrees,
    /// The agent's name.
    pub agent: &'a str,
    /// The agent's config; its `sandbox` section is what the spec is made of.
    pub config: &'a AgentConfig,
    /// The host folder the sandbox sees at `/workspace`.
    pub workspace: PathBuf,
    /// Who the agent's processes run as, resolved (`sandbox.user`).
    pub user: SandboxUser,
    /// The plugin tools the agent can launch from `/tools/bin/`.
    pub tools: Vec<String>,
    /// `(tool name, plugin folder)` shared at `/tools/packages/<tool>/`.
    pub tool_packages: Vec<(String, PathBuf)>,
    /// `(skill name, folder)` shared at `/skills/<name>/`.
    pub skills: Vec<(String, PathBuf)>,
}

/// The sandbox a gateway wants for one agent, whatever runs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SandboxSpec {
    /// The agent the sandbox is for.
    pub agent: String,
    /// The image reference the sandbox runs (`sandbox.image`).
    pub image: String,
    /// Who the agent's processes run as.
    pub user: SandboxUser,
    /// The host folder seen at [`WORKSPACE`], read-write.
    pub workspace: PathBuf,
    /// Tool packages, then skills, read-only.
    pub shares: Vec<Share>,
    /// `sandbox.extraMounts`, checked, with their sources resolved (config order).
    pub extra_mounts: Vec<Mount>,
    /// The plugin tools the agent can launch (exposed by policy), each at
    /// `/tools/bin/<tool>`.
    pub tools: Vec<String>,
    /// `sandbox.extraEnv`, in config order; a backend puts `PATH` ([`SANDBOX_PATH`]) and
    /// `HOME` before it.
    pub env: IndexMap<String, String>,
    /// Memory, processes, CPU and disk the sandbox may use.
    pub limits: Limits,
    /// The network the sandbox gets (`sandbox.network`).
    pub network: NetworkMode,
    /// A read-only root file system (with a writable `/tmp`).
    pub read_only_root: bool,
    /// Capabilities the agent's processes get beyond none (`sandbox.capAdd`; only for a
    /// `root` sandbox, whose processes keep capabilities).
    pub extra_capabilities: Vec<String>,
    /// [`LABEL_AGENT`] and [`LABEL_INSTALLATION`].
    pub labels: BTreeMap<String, String>,
    /// Egress through the gateway (`agents.<name>.egress`): PID 1's proxy and the proxy
    /// environment. `None`: the sandbox has no way out at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
    /// What the extra mounts were checked against, to check them again before every
    /// (re)creation of the sandbox.
    #[serde(skip)]
    recheck: Option<MountRecheck>,
}

/// What a sandbox with egress gets: PID 1's explicit proxy on the container's loopback,
/// and the environment that points clients at it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressSpec {
    /// The proxy's port on `127.0.0.1` (`egress.proxyPort`, default 3128).
    pub proxy_port: u16,
    /// PID 1 also answers DNS with synthetic addresses and takes connections to them
    /// on ports 80 and 443 (for clients that ignore the proxy variables).
    pub transparent: bool,
    /// The gateway's public egress CA (DER), which PID 1 installs in [`EGRESS_CA_DIR`]
    /// with a bundle that merges it into the image's roots, for inspect mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_der: Option<Vec<u8>>,
}

pub use beige_protocol::link::{EGRESS_CA_DIR, EGRESS_CA_ENV};

impl Default for EgressSpec {
    fn default() -> Self {
        Self {
            proxy_port: beige_protocol::link::EGRESS_PROXY_PORT,
            transparent: true,
            ca_der: None,
        }
    }
}

impl EgressSpec {
    /// The value of the shim's `--egress` flag.
    pub fn shim_flag(&self) -> String {
        use base64::Engine as _;
        let mut flag = if self.transparent {
            format!("proxy={},dns=synthetic,transparent=80+443", self.proxy_port)
        } else {
            format!("proxy={}", self.proxy_port)
        };
        if let Some(der) = &self.ca_der {
            flag.push_str(",ca=");
            flag.push_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(der));
        }
        flag
    }

    /// The environment of every process in the sandbox: the proxy variables (both
    /// cases, as clients read one or the other), what is never proxied, and Node's
    /// switch to honour them; with the CA, the variables that make clients trust it
    /// ([`EGRESS_CA_ENV`]).
    pub fn env(&self) -> Vec<(String, String)> {
        let proxy = format!("http://127.0.0.1:{}", self.proxy_port);
        let mut env = Vec::new();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            env.push((k.to_string(), proxy.clone()));
            env.push((k.to_ascii_lowercase(), proxy.clone()));
        }
        env.push(("grpc_proxy".into(), proxy));
        let no_proxy = "localhost,127.0.0.1,::1".to_string();
        env.push(("NO_PROXY".into(), no_proxy.clone()));
        env.push(("no_proxy".into(), no_proxy));
        env.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
        if self.ca_der.is_some() {
            for (k, file) in EGRESS_CA_ENV {
                env.push((k.to_string(), format!("{EGRESS_CA_DIR}/{file}")));
            }
        }
        env
    }
}

/// The inputs of the `extraMounts` check, kept in the spec.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MountRecheck {
    home: BeigeHome,
    workspace: PathBuf,
    writable: WritableTrees,
    /// `(host as configured, container as configured, index into the mounts checked)`.
    entries: Vec<(String, String, usize)>,
}

/// Why a spec cannot be built (the config validation catches these first; the spec
/// refuses them again so no code path can skip the check).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// `sandbox.memoryLimit` is not a size.
    #[error("agent '{agent}': invalid sandbox.memoryLimit \"{value}\" — use a number with an optional k/m/g unit, e.g. \"512m\" or \"3g\"")]
    MemoryLimit {
        /// The agent whose config it is.
        agent: String,
        /// The value as configured.
        value: String,
    },
    /// An `extraMounts` entry is refused.
    #[error(
        "agent '{agent}': sandbox.extraMounts entry {host} → {container} is refused: {reason}"
    )]
    Mount {
        /// The agent whose config it is.
        agent: String,
        /// The source, as configured.
        host: String,
        /// The target, as configured.
        container: String,
        /// Why it is refused.
        reason: String,
    },
}

impl SandboxSpec {
    /// Compute the spec of an agent's sandbox. Touches no backend; reads the file system
    /// only to resolve the `extraMounts` sources (see [`Self::recheck_mounts`]).
    pub fn for_agent(input: &SpecInput<'_>) -> Result<SandboxSpec, SpecError> {
        let cfg = &input.config.sandbox;
        let agent = input.agent;
        let memory_bytes =
            crate::config::parse_memory_limit(&cfg.memory_limit).ok_or_else(|| {
                SpecError::MemoryLimit {
                    agent: agent.to_string(),
                    value: cfg.memory_limit.clone(),
                }
            })?;

        let mut shares = Vec::new();
        for (tool, dir) in &input.tool_packages {
            shares.push(Share {
                kind: ShareKind::ToolPackage,
                name: tool.clone(),
                source: dir.clone(),
                target: format!("/tools/packages/{tool}"),
            });
        }
        for (skill, dir) in &input.skills {
            shares.push(Share {
                kind: ShareKind::Skill,
                name: skill.clone(),
                source: dir.clone(),
                target: format!("/skills/{skill}"),
            });
        }
        let mut recheck = MountRecheck {
            home: input.home.clone(),
            workspace: input.workspace.clone(),
            writable: input.writable.clone(),
            entries: Vec::new(),
        };
        let mut extra_mounts = Vec::new();
        for (host, target) in &cfg.extra_mounts {
            let checked = recheck.check(agent, host, target)?;
            recheck
                .entries
                .push((host.clone(), target.clone(), extra_mounts.len()));
            // The canonical path (when the source exists): a symlink on the way is
            // resolved now, under the checks, not later by the backend.
            extra_mounts.push(Mount::new(
                checked.host,
                checked.container,
                checked.read_only,
            ));
        }

        // `capAdd` only means something for a root agent (its processes keep
        // capabilities); for others the config loader warns that it is ignored.
        let extra_capabilities = match input.user {
            SandboxUser::Root => cfg.cap_add.clone(),
            SandboxUser::Id { .. } => Vec::new(),
        };

        let mut labels = BTreeMap::new();
        labels.insert(LABEL_AGENT.to_string(), agent.to_string());
        labels.insert(
            LABEL_INSTALLATION.to_string(),
            input.installation.to_string(),
        );

        Ok(SandboxSpec {
            agent: agent.to_string(),
            image: cfg.image.clone(),
            user: input.user,
            workspace: input.workspace.clone(),
            shares,
            extra_mounts,
            tools: input.tools.clone(),
            env: cfg.extra_env.clone(),
            limits: Limits {
                memory_bytes,
                pids: cfg.pids_limit,
                cpus: cfg.cpus,
                disk_bytes: cfg.disk_limit.map(|l| l.bytes()),
            },
            network: cfg.network,
            read_only_root: cfg.read_only_root,
            extra_capabilities,
            labels,
            egress: input.config.egress.as_ref().map(|_| EgressSpec::default()),
            recheck: Some(recheck),
        })
    }

    /// The installation the spec belongs to ([`LABEL_INSTALLATION`]).
    pub fn installation(&self) -> Option<&str> {
        self.labels.get(LABEL_INSTALLATION).map(String::as_str)
    }

    /// Check the `extraMounts` sources again, as they are now: each must still pass the
    /// refusal rules, exist, and resolve to the canonical path the spec was computed
    /// with (a folder on the way replaced by a symlink changes that). A backend calls
    /// this before every creation of the sandbox, including the recreation of one that
    /// died.
    pub fn recheck_mounts(&self) -> Result<(), SpecError> {
        match &self.recheck {
            Some(recheck) => recheck.run(&self.agent, &self.extra_mounts),
            None => Ok(()),
        }
    }

    /// The recheck of the extra mounts, for a backend that puts them at `offset` in a
    /// list of its own.
    #[cfg(feature = "docker")]
    pub(crate) fn recheck_at(&self, offset: usize) -> Option<MountRecheck> {
        self.recheck.as_ref().map(|r| MountRecheck {
            entries: r
                .entries
                .iter()
                .map(|(h, t, i)| (h.clone(), t.clone(), i + offset))
                .collect(),
            ..r.clone()
        })
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

    /// Every entry checked again against `mounts`, where it was put when the spec was
    /// computed.
    pub(crate) fn run(&self, agent: &str, mounts: &[Mount]) -> Result<(), SpecError> {
        for (host, target, index) in &self.entries {
            let refused = |reason: String| SpecError::Mount {
                agent: agent.to_string(),
                host: host.clone(),
                container: target.clone(),
                reason,
            };
            let now = self.check(agent, host, target)?;
            if std::fs::symlink_metadata(&now.host).is_err() {
                return Err(refused(
                    "the host path no longer exists (Docker would create an empty folder \
                     owned by root in its place); restore it, or remove the entry and run \
                     `beige gateway restart`"
                        .to_string(),
                ));
            }
            let was = mounts.get(*index).map(|m| m.host.as_path());
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;
    #[cfg(feature = "docker")]
    use crate::config::LinkMode;
    #[cfg(feature = "docker")]
    use crate::sandbox::docker::{BodyInput, ContainerSpec, LINK_CAPS, ROOT_CAP_DROP};

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

    /// The container the Docker backend makes of the spec, with the shim at
    /// `/opt/beige/beige-shim`.
    #[cfg(feature = "docker")]
    fn container(input: &SpecInput<'_>) -> Result<ContainerSpec, SpecError> {
        let spec = SandboxSpec::for_agent(input)?;
        Ok(ContainerSpec::from_spec(
            &spec,
            &BodyInput {
                shim: std::path::Path::new("/opt/beige/beige-shim"),
                launchers: input.home.launchers_dir(input.agent),
                run_dir: input.home.run_dir(input.agent),
                link: input.config.sandbox.link,
            },
        ))
    }

    fn input<'a>(home: &'a BeigeHome, cfg: &'a AgentConfig, user: SandboxUser) -> SpecInput<'a> {
        SpecInput {
            home,
            installation: installation(),
            writable: no_trees(),
            agent: "assistant",
            config: cfg,
            workspace: home.default_workspace("assistant"),
            user,
            tools: vec!["kv".into()],
            tool_packages: vec![("kv".into(), PathBuf::from("/opt/beige/plugins/kv"))],
            skills: vec![("review".into(), PathBuf::from("/opt/skills/review"))],
        }
    }

    #[test]
    #[cfg(feature = "docker")]
    fn default_spec_is_hardened() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"},
            "tools": ["kv"],
            "sandbox": {"extraEnv": {"NODE_ENV": "dev"}, "extraMounts": {"/srv/data": "/data:ro"}}
        }));
        let spec = container(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
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
    #[cfg(feature = "docker")]
    fn egress_installs_the_ca_only_when_the_gateway_gives_one() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"},
            "tools": [],
            "egress": {"rules": [{"id": "gh", "hosts": ["api.github.com"]}]}
        }));
        let input = input(&home, &cfg, SandboxUser::DEFAULT);
        let mut spec = SandboxSpec::for_agent(&input).unwrap();
        let body = BodyInput {
            shim: std::path::Path::new("/opt/beige/beige-shim"),
            launchers: home.launchers_dir("assistant"),
            run_dir: home.run_dir("assistant"),
            link: cfg.sandbox.link,
        };
        let without = ContainerSpec::from_spec(&spec, &body);
        assert!(!without.tmpfs.contains_key(EGRESS_CA_DIR));
        assert!(!without.env.iter().any(|e| e.starts_with("SSL_CERT_FILE=")));
        assert!(without.entrypoint.iter().all(|a| !a.contains("ca=")));

        spec.egress.as_mut().unwrap().ca_der = Some(vec![0x30, 0x82, 0x01, 0xff]);
        let with = ContainerSpec::from_spec(&spec, &body);
        let flag = with
            .entrypoint
            .iter()
            .skip_while(|a| *a != "--egress")
            .nth(1)
            .unwrap();
        assert_eq!(
            flag,
            "proxy=3128,dns=synthetic,transparent=80+443,ca=MIIB_w"
        );
        assert_eq!(
            with.tmpfs.get(EGRESS_CA_DIR).map(String::as_str),
            Some("rw,nosuid,nodev,noexec,size=8m,mode=0755")
        );
        for (k, file) in EGRESS_CA_ENV {
            let want = format!("{k}={EGRESS_CA_DIR}/{file}");
            assert!(with.env.contains(&want), "{want}: {:?}", with.env);
        }
        assert!(with
            .env
            .contains(&"NODE_EXTRA_CA_CERTS=/beige/ca/beige-ca.pem".to_string()));
        assert_ne!(
            with.hash(),
            without.hash(),
            "a new CA makes a new container"
        );
    }

    #[test]
    #[cfg(feature = "docker")]
    fn root_and_options() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"},
            "tools": [],
            "sandbox": {"memoryLimit": "512m", "network": "bridge", "cpus": 1.5,
                        "readOnlyRoot": true, "capAdd": ["NET_BIND_SERVICE"], "pidsLimit": 64}
        }));
        let spec = container(&input(&home, &cfg, SandboxUser::Root)).unwrap();
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
    #[cfg(feature = "docker")]
    fn attach_link_keeps_stdin_open_and_logs_nothing() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": [],
            "sandbox": {"link": "attach", "capAdd": ["SETUID", "NET_BIND_SERVICE"]}
        }));
        let spec = container(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(spec.link, LinkMode::Attach);
        assert!(spec.open_stdin);
        assert_eq!(spec.log_driver.as_deref(), Some("none"));
        assert_eq!(spec.entrypoint.last().map(String::as_str), Some("attach"));
        // capAdd widens nothing for a non-root agent (the loader warns).
        assert_eq!(spec.cap_add, LINK_CAPS.to_vec());
    }

    #[test]
    #[cfg(feature = "docker")]
    fn hash_tracks_changes() {
        let home = BeigeHome::new("/home/u/.beige");
        let mut cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": []
        }));
        let a = container(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        let b = container(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(a.spec_label(), b.spec_label());
        cfg.sandbox.memory_limit = "1g".into();
        let c = container(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_ne!(a.spec_label(), c.spec_label());
        // Another installation — even with the same BEIGE_HOME path — gets another name
        // and label.
        let other = InstallationId::generate();
        let d = container(&SpecInput {
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
            let err = SandboxSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT));
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
        let err = SandboxSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap_err();
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
    #[cfg(feature = "docker")]
    fn disk_limit_is_passed_only_when_set() {
        let home = BeigeHome::new("/home/u/.beige");
        let plain = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": []
        }));
        let spec = container(&input(&home, &plain, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(spec.disk_limit_bytes, None);
        let json = serde_json::to_value(&spec).unwrap();
        assert!(json.get("disk_limit_bytes").is_none(), "{json}");
        let limited = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"}, "tools": [],
            "sandbox": {"diskLimit": "10g"}
        }));
        let with = container(&input(&home, &limited, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(with.disk_limit_bytes, Some(10 << 30));
        // A different limit is a different container.
        assert_ne!(with.spec_label(), spec.spec_label());
    }

    /// The Docker body of a spec is what the gateway asked Docker for before specs were
    /// portable: same container JSON, same Engine API body, same `io.beige.spec` hash
    /// (fixtures written by the earlier code), so running containers are reattached.
    #[test]
    #[cfg(feature = "docker")]
    fn docker_bodies_and_hashes_are_unchanged() {
        let home = BeigeHome::new("/home/u/.beige");
        let cases: Vec<(&str, serde_json::Value, SandboxUser, &str)> = vec![
            (
                "default",
                serde_json::json!({
                    "model": {"provider": "anthropic", "model": "m"}, "tools": ["kv"],
                    "sandbox": {"extraEnv": {"NODE_ENV": "dev"}, "extraMounts": {"/srv/data": "/data:ro"}}
                }),
                SandboxUser::DEFAULT,
                include_str!("docker/testdata/default.json"),
            ),
            (
                "plain",
                serde_json::json!({
                    "model": {"provider": "anthropic", "model": "m"}, "tools": []
                }),
                SandboxUser::DEFAULT,
                include_str!("docker/testdata/plain.json"),
            ),
            (
                "root_options",
                serde_json::json!({
                    "model": {"provider": "anthropic", "model": "m"}, "tools": [],
                    "sandbox": {"memoryLimit": "512m", "network": "bridge", "cpus": 1.5,
                                "readOnlyRoot": true, "capAdd": ["NET_BIND_SERVICE"], "pidsLimit": 64}
                }),
                SandboxUser::Root,
                include_str!("docker/testdata/root_options.json"),
            ),
            (
                "attach",
                serde_json::json!({
                    "model": {"provider": "anthropic", "model": "m"}, "tools": [],
                    "sandbox": {"link": "attach", "capAdd": ["SETUID", "NET_BIND_SERVICE"]}
                }),
                SandboxUser::DEFAULT,
                include_str!("docker/testdata/attach.json"),
            ),
            (
                "off_disk_env",
                serde_json::json!({
                    "model": {"provider": "anthropic", "model": "m"}, "tools": [],
                    "sandbox": {"link": "off", "diskLimit": "10g", "image": "busybox:1",
                                "extraEnv": {"ZED": "1", "ALPHA": "2", "MID": "3"},
                                "extraMounts": {"/srv/b": "/b", "/srv/a": "/a:ro"},
                                "readOnlyRoot": true, "cpus": 0.25}
                }),
                SandboxUser::Id { uid: 1234, gid: 99 },
                include_str!("docker/testdata/off_disk_env.json"),
            ),
        ];
        for (name, json, user, fixture) in cases {
            let cfg = agent_config(json);
            let spec = container(&input(&home, &cfg, user)).unwrap();
            let want: serde_json::Value = serde_json::from_str(fixture).unwrap();
            assert_eq!(spec.name, want["name"], "{name}: container name");
            assert_eq!(spec.spec_label(), want["hash"], "{name}: io.beige.spec");
            assert_eq!(spec.hash(), want["hash"], "{name}: io.beige.spec");
            assert_eq!(
                serde_json::to_value(&spec).unwrap(),
                want["spec"],
                "{name}: container spec"
            );
            let body = crate::sandbox::docker::engine_body(&spec);
            assert_eq!(
                serde_json::to_value(&body).unwrap(),
                want["body"],
                "{name}: Engine API body"
            );
        }
    }

    /// The default agent's `io.beige.spec`, pinned: a change here recreates every
    /// running sandbox at the next start.
    #[test]
    #[cfg(feature = "docker")]
    fn default_spec_hash_is_pinned() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"},
            "tools": ["kv"],
            "sandbox": {"extraEnv": {"NODE_ENV": "dev"}, "extraMounts": {"/srv/data": "/data:ro"}}
        }));
        let spec = container(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        assert_eq!(spec.spec_label(), "b7c1ed1847ae8148");
    }

    #[test]
    fn the_portable_spec_carries_no_docker_mechanics() {
        let home = BeigeHome::new("/home/u/.beige");
        let cfg = agent_config(serde_json::json!({
            "model": {"provider": "anthropic", "model": "m"},
            "tools": ["kv"],
            "sandbox": {"extraEnv": {"B": "1", "A": "2"}, "extraMounts": {"/srv/data": "/data:ro"},
                        "capAdd": ["NET_BIND_SERVICE"], "memoryLimit": "1g", "diskLimit": "2g"}
        }));
        let spec = SandboxSpec::for_agent(&input(&home, &cfg, SandboxUser::DEFAULT)).unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        for docker in [
            "/beige/shim",
            "/beige/run",
            "launchers",
            "cap_drop",
            "security_opt",
            "link",
        ] {
            assert!(!json.contains(docker), "{docker} in {json}");
        }
        assert_eq!(spec.tools, ["kv"]);
        assert_eq!(
            spec.shares
                .iter()
                .map(|s| s.target.as_str())
                .collect::<Vec<_>>(),
            ["/tools/packages/kv", "/skills/review"]
        );
        assert_eq!(spec.extra_mounts, [Mount::new("/srv/data", "/data", true)]);
        // Config order, not sorted.
        assert_eq!(spec.env.keys().collect::<Vec<_>>(), ["B", "A"]);
        // capAdd is for root sandboxes only.
        assert!(spec.extra_capabilities.is_empty());
        assert_eq!(spec.limits.memory_bytes, 1 << 30);
        assert_eq!(spec.limits.disk_bytes, Some(2 << 30));
        assert_eq!(spec.installation(), Some(installation().as_str()));
        let root = SandboxSpec::for_agent(&input(&home, &cfg, SandboxUser::Root)).unwrap();
        assert_eq!(root.extra_capabilities, ["NET_BIND_SERVICE"]);
    }
}
