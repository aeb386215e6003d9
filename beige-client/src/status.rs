//! What [`Admin`](crate::Admin) reports: a model's [`ModelHealth`], an agent's
//! [`SandboxStatus`] (its container, [`LinkMode`] and [`LinkStatus`]) and the free space
//! of the gateway's filesystems ([`DiskStatus`]). beige-core re-exports them where it
//! keeps the rest of each subject (`agent::router`, `gateway`, `config`, `sandbox`,
//! `disk`).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use beige_protocol::link::Carrier;
use serde::{Deserialize, Serialize};

/// Health of one model, shared by every session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelHealth {
    /// Unix milliseconds until which the model is not used.
    pub cooldown_until: Option<u64>,
    /// Failures in a row since the last success.
    pub consecutive_failures: u32,
    /// The last failure's message.
    pub last_error: Option<String>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ModelHealth {
    /// Remaining cooldown, if cooling down.
    pub fn cooling(&self) -> Option<Duration> {
        let until = self.cooldown_until?;
        let now = now_ms();
        (until > now).then(|| Duration::from_millis(until - now))
    }
}

/// How an agent's sandbox is reached: its container and the health of the shim link to
/// its PID 1 (`GET /api/agents/{name}/sandbox`, `beige doctor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// The agent.
    pub agent: String,
    /// The container's name (empty for a backend without one).
    pub container: String,
    /// `sandbox.link` as the gateway applies it (`off` for `root` sandboxes and for
    /// backends without a link).
    pub link_mode: LinkMode,
    /// Health of the link; `None` when the mode is `off`.
    #[serde(default)]
    pub link: Option<LinkStatus>,
    /// One keepalive round trip measured for this answer, in microseconds; `None` when
    /// the link is down (or off).
    #[serde(default)]
    pub ping_us: Option<u64>,
}

impl SandboxStatus {
    /// The status of a sandbox without a link (and without a container name).
    pub fn unlinked(agent: &str) -> Self {
        Self {
            agent: agent.to_string(),
            container: String::new(),
            link_mode: LinkMode::Off,
            link: None,
            ping_us: None,
        }
    }
}

/// How the gateway runs core tools in the sandbox (new in beige).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum LinkMode {
    /// A persistent link that PID 1 dials to `run/<agent>/ctl.sock` (local engines).
    #[default]
    Unix,
    /// The link over the container's stdin/stdout through the engine API (remote
    /// engines; can be forced locally).
    Attach,
    /// No link: every core tool is a `docker exec`.
    Off,
}

impl LinkMode {
    /// The config value: `unix`, `attach` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkMode::Unix => "unix",
            LinkMode::Attach => "attach",
            LinkMode::Off => "off",
        }
    }
}

/// Health of one agent's link, for `beige doctor` and the HTTP API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkStatus {
    /// The agent.
    #[serde(default)]
    pub agent: String,
    /// Whether PID 1 is connected now.
    #[serde(default)]
    pub connected: bool,
    /// The carrier of the current connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<Carrier>,
    /// PID 1's boot id (changes when the container restarts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Seconds since the current connection was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected_secs: Option<u64>,
    /// Round trip of the last keepalive, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ping_us: Option<u64>,
    /// Connections made since the gateway started (1 when it never dropped).
    #[serde(default)]
    pub connects: u64,
    /// Peers refused on the control socket (each one audited).
    #[serde(default)]
    pub rejected_peers: u64,
    /// Operations run over the link.
    #[serde(default)]
    pub ops_link: u64,
    /// Operations run over the `docker exec` fallback.
    #[serde(default)]
    pub ops_fallback: u64,
    /// Results that arrived a second time after a reconnect and were dropped.
    #[serde(default)]
    pub duplicates_dropped: u64,
}

/// Space and inodes of one filesystem, as an unprivileged user may use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsSpace {
    /// Bytes free for an unprivileged user.
    pub free_bytes: u64,
    /// Size of the filesystem in bytes.
    pub total_bytes: u64,
    /// Inodes free for an unprivileged user.
    pub free_inodes: u64,
    /// `0` when the filesystem does not count inodes (btrfs, some network filesystems).
    pub total_inodes: u64,
}

/// The free-space guard's view, for the health answer and `beige doctor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    /// Some filesystem is below the threshold.
    pub low: bool,
    /// `gateway.minFreeSpace` as configured; `off` when the guard is off.
    pub min_free_space: String,
    /// Agents paused now.
    pub paused_agents: Vec<String>,
    /// The watched filesystems.
    pub filesystems: Vec<FsStatus>,
}

/// One watched filesystem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStatus {
    /// A path on the filesystem.
    pub path: PathBuf,
    /// What lives there (`BEIGE_HOME (store, audit log)`, `the workspace of agent 'a'`).
    pub what: Vec<String>,
    /// `None` when the filesystem could not be read (see `error`).
    pub space: Option<FsSpace>,
    /// The bytes `gateway.minFreeSpace` asks to keep free there.
    pub min_free_bytes: Option<u64>,
    /// Below the threshold now.
    pub low: bool,
    /// Why the filesystem could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
