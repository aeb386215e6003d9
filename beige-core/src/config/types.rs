//! The typed configuration, field for field as in the original's `config.json5`, plus
//! beige's additions (each documented in `docs/configuration.md` with its default).
//!
//! These are plain serde values. After [`super::Config::load`] returns, every path field
//! is absolute (relative paths were resolved against the config file's folder, `~`
//! expanded) and every value has passed validation.
//!
//! A doc comment on a type, field or variant here becomes its description in
//! `config.schema.json`. Items that have none there carry a `//` comment and
//! `#[allow(missing_docs)]` instead, so that the schema stays as it is.

use std::path::PathBuf;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::size::{ByteSize, FreeSpace};

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// LLM providers, by the name agents refer to them with.
    pub llm: LlmConfig,
    /// Plugins, in load order.
    #[serde(default)]
    pub plugins: IndexMap<String, PluginEntry>,
    /// Standalone skills: folders mounted read-only at `/skills/<name>/`.
    #[serde(default)]
    pub skills: IndexMap<String, SkillEntry>,
    /// Agents, each with its own sandbox.
    pub agents: IndexMap<String, AgentConfig>,
    /// The gateway process: HTTP bind, logs.
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// Settings shared by every sandbox (new in beige).
    #[serde(default)]
    pub sandbox: GlobalSandboxConfig,
    /// Egress defaults and rules shared by every agent with egress (new in beige);
    /// enables nothing by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::config::EgressConfig>,
    /// How approvals wait and whom they notify (new in beige).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<crate::approvals::ApprovalsConfig>,
    /// New in beige: limits on model tokens and cost per session, turn and agent-day,
    /// and on tool calls per exec; `agents.<a>.budgets` overrides them key by key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<crate::budget::BudgetsConfig>,
    /// New in beige: prompts and execs that fire once (`at`) or on a cron expression in
    /// a time zone, each instant exactly once, by name (the name is the schedule's id).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub schedules: IndexMap<String, beige_client::schedules::ScheduleSpec>,
    /// New in beige: what the gateway tells monitoring about itself (metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetryConfig>,
    /// New in beige: MCP servers whose tools become CLIs in the sandboxes of the agents
    /// whose `tools` name them (`spec/mcp.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<super::mcp::McpConfig>,
    /// New in beige: the people of a shared gateway, with roles per agent and their
    /// channel identities (`spec/people.md`). Without it, the gateway's token is the
    /// owner and channel users are members of their chats' agents.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub users: super::users::UsersConfig,
    /// New in beige: where the gateway keeps its state. Without it, SQLite in
    /// `BEIGE_HOME`; with `url`, a PostgreSQL database (`spec/scale.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<super::store::StoreConfig>,
    /// New in beige: how this gateway shares `store.url` with other gateways (a hot
    /// standby, the lease time to live; `spec/scale.md` §3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<super::store::ClusterConfig>,
}

/// `telemetry`: what the gateway reports to monitoring.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Prometheus metrics at `GET /metrics` on the API's port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// OpenTelemetry traces over OTLP/HTTP (off unless `traces: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpConfig>,
}

/// `telemetry.otlp`: where the gateway sends its spans. Only this turns export on;
/// `OTEL_EXPORTER_OTLP_*` variables are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318`; spans go to
    /// `<endpoint>/v1/traces` as protobuf.
    pub endpoint: String,
    /// Headers sent with every export (e.g. `authorization`); values are secrets,
    /// `${VAR}` expands, and they are redacted wherever the config is shown.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
    /// Export traces (default false).
    #[serde(default)]
    pub traces: bool,
    /// The share of turns traced, 0.0–1.0 (default 1.0).
    #[serde(default = "one")]
    pub sample_ratio: f64,
    /// Content that spans leave out unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<OtlpCapture>,
}

fn one() -> f64 {
    1.0
}

/// `telemetry.otlp.capture`: content put into spans (redacted like the audit log, cut
/// at 4 KiB). Both default to false.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OtlpCapture {
    /// The prompt's text on the turn's root span (`beige.prompt`).
    #[serde(default)]
    pub prompts: bool,
    /// A tool call's arguments on its span (`beige.tool.args`).
    #[serde(default)]
    pub tool_args: bool,
}

/// `telemetry.metrics`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` on the API's port, behind the API token (default false).
    #[serde(default)]
    pub enabled: bool,
    /// Also serve `GET /metrics`, without a token, on this loopback address
    /// (`127.0.0.1:9464`, `[::1]:9464` or `localhost:9464`; port 0 picks a free one). Any
    /// other address is refused. Independent of `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

impl Config {
    /// Whether `GET /metrics` is served.
    pub fn metrics_enabled(&self) -> bool {
        self.telemetry
            .as_ref()
            .and_then(|t| t.metrics.as_ref())
            .is_some_and(|m| m.enabled)
    }

    /// `telemetry.metrics.listen`, as written.
    pub fn metrics_listen(&self) -> Option<&str> {
        self.telemetry
            .as_ref()
            .and_then(|t| t.metrics.as_ref())
            .and_then(|m| m.listen.as_deref())
    }
}

// `llm`: the LLM providers.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LlmConfig {
    // `llm.providers`: each provider by the name agents use in `model.provider`.
    pub providers: IndexMap<String, ProviderConfig>,
}

/// The wire format a provider speaks.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ProviderApi {
    // Anthropic's Messages API (`llm::anthropic`).
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
    // OpenAI's Chat Completions API and the servers compatible with it
    // (`llm::openai_completions`).
    #[serde(rename = "openai-completions")]
    OpenAiCompletions,
    // OpenAI's Responses API (`llm::openai_responses`).
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    // Google's Generative Language API, Gemini (`llm::google`).
    #[serde(rename = "google-generative-ai")]
    GoogleGenerativeAi,
}

// `llm.providers.<name>`: one provider.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConfig {
    /// Secret; never logged, never enters a sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    // The API's base URL (proxies, local servers, compatible APIs); default: the
    // provider's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Defaults by provider name (`anthropic`, `openai`, `google`); required otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<ProviderApi>,
    /// Concurrent model calls to this provider; `-1` is unlimited.
    #[serde(default = "default_concurrency")]
    pub concurrency: i64,
    /// New in beige: extra HTTP headers sent with every request.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
    /// New in beige: model metadata overrides by model id (`contextWindow`,
    /// `maxOutputTokens`, `images`, `reasoning`, `costInput`, `costOutput`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub models: IndexMap<String, serde_json::Value>,
}

fn default_concurrency() -> i64 {
    -1
}

// `plugins.<name>`: one plugin.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginEntry {
    /// The plugin's folder; relative to the config file's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Plugin configuration, passed to the plugin (and deep-merged with each agent's
    /// `pluginConfigs` entry per call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
    /// Where the plugin was installed from (written by `beige plugins install`).
    #[serde(default, rename = "_source", skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// New in beige: for an external plugin, the most its `kv.*` data may take in the
    /// gateway's store, all scopes together (keys, values and 64 bytes per entry);
    /// default 256 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_store_bytes: Option<ByteSize>,
}

// `skills.<name>`: one standalone skill.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillEntry {
    /// The skill's folder; relative to the config file's folder.
    pub path: PathBuf,
}

/// A model reference: `{provider, model, thinkingLevel?, compactionThreshold?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelRef {
    // A key of `llm.providers`.
    #[allow(missing_docs)]
    pub provider: String,
    // The provider's model id, e.g. `claude-sonnet-4-6`.
    #[allow(missing_docs)]
    pub model: String,
    // Reasoning effort; default `off`.
    #[allow(missing_docs)]
    #[serde(default)]
    pub thinking_level: ThinkingLevel,
    /// Compact the session when its context reaches this many tokens (≥ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub compaction_threshold: Option<u64>,
}

pub use beige_client::llm::ThinkingLevel;

// `agents.<name>`: one agent.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentConfig {
    // The primary model.
    pub model: ModelRef,
    /// Tried in order when the primary model fails.
    #[serde(default)]
    pub fallback_models: Vec<ModelRef>,
    /// Plugin tools this agent may call (the four core tools are always present).
    pub tools: Vec<String>,
    // Skills mounted for this agent: keys of the top-level `skills`, or skills that
    // plugins register.
    #[serde(default)]
    pub skills: Vec<String>,
    /// Per-agent plugin config, deep-merged over `plugins.<name>.config` per call.
    #[serde(default)]
    pub plugin_configs: IndexMap<String, serde_json::Value>,
    /// New in beige: per-agent MCP server settings, deep-merged over
    /// `mcp.servers.<name>` (like `pluginConfigs`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub mcp_configs: IndexMap<String, serde_json::Value>,
    /// Host folder mounted at `/workspace`; default `<BEIGE_HOME>/agents/<name>/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_dir: Option<PathBuf>,
    // The agent's container.
    #[serde(default)]
    pub sandbox: AgentSandboxConfig,
    /// New in beige: tools taken away from this agent, core tools included
    /// (e.g. `["exec"]`); wins over `tools`.
    #[serde(default)]
    pub deny_tools: Vec<String>,
    /// Upper bound on model turns per prompt (new in beige).
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// New in beige: network access through the gateway, only to what the rules allow;
    /// turns egress on for this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::config::AgentEgressConfig>,
    /// New in beige: this agent's budgets, each key overriding the top-level `budgets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<crate::budget::BudgetsConfig>,
    /// New in beige: rules as data — which calls of granted tools are allowed, need
    /// approval or are refused, and the standing grants that lift an ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::policy::AgentPolicy>,
}

fn default_max_turns() -> u32 {
    50
}

/// Sandbox network mode. `host` is refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
    /// Docker's default bridge: open egress (the original's behaviour).
    Bridge,
}

pub use beige_client::status::LinkMode;

// `agents.<name>.sandbox`: the agent's container.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSandboxConfig {
    // The container image, never pulled implicitly; default `DEFAULT_IMAGE`.
    #[serde(default = "default_image")]
    pub image: String,
    /// Memory limit (swap capped to the same): number, optional `k/m/g`, optional `b`.
    #[serde(default = "default_memory_limit")]
    pub memory_limit: String,
    /// `{"/host/path": "/container/path[:ro]"}`.
    #[serde(default)]
    pub extra_mounts: IndexMap<String, String>,
    /// Visible to the agent; never put secrets here.
    #[serde(default)]
    pub extra_env: IndexMap<String, String>,
    /// New in beige: `none` (default) or `bridge`.
    #[serde(default)]
    pub network: NetworkMode,
    /// New in beige: `uid:gid` or `root`; default: the owner of the workspace
    /// (`1000:1000` when the gateway runs as root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// New in beige: maximum number of processes.
    #[serde(default = "default_pids_limit")]
    pub pids_limit: i64,
    /// New in beige: CPU quota, e.g. `1.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// New in beige: read-only root file system with a tmpfs `/tmp`.
    #[serde(default)]
    pub read_only_root: bool,
    /// New in beige: capabilities added back (all are dropped by default).
    #[serde(default)]
    pub cap_add: Vec<String>,
    /// New in beige: upper bound for `exec`'s `timeout`, in seconds.
    #[serde(default = "default_max_exec_timeout")]
    pub max_exec_timeout: u64,
    /// New in beige: cap on `exec` output kept for the model, in bytes.
    #[serde(default = "default_exec_output_limit")]
    pub exec_output_limit: u64,
    /// New in beige: how core tools reach the sandbox — `unix` (default), `attach` or
    /// `off` (`docker exec` every time). Sandboxes running as `root` always use `off`.
    #[serde(default)]
    pub link: LinkMode,
    /// New in beige: size limit of the container's root file system (Docker's
    /// `--storage-opt size`); only some storage drivers support it. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_limit: Option<ByteSize>,
    /// New in beige: spare containers kept ready for this agent (0, the default: none;
    /// at most 4). Each is created from exactly the agent's container spec and started,
    /// its PID 1 connected but idle; when the agent's container has to be created again
    /// (it died, or was gone at a restart) a spare is renamed to it and answers its
    /// first operation within milliseconds. Costs one idle container (PID 1 only) per
    /// spare.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warm_pool: u8,
}

/// Most spare containers `sandbox.warmPool` may ask for.
pub const MAX_WARM_POOL: u8 = 4;

fn is_zero(n: &u8) -> bool {
    *n == 0
}

impl Default for AgentSandboxConfig {
    fn default() -> Self {
        Self {
            image: default_image(),
            memory_limit: default_memory_limit(),
            extra_mounts: IndexMap::new(),
            extra_env: IndexMap::new(),
            network: NetworkMode::None,
            user: None,
            pids_limit: default_pids_limit(),
            cpus: None,
            read_only_root: false,
            cap_add: Vec::new(),
            max_exec_timeout: default_max_exec_timeout(),
            exec_output_limit: default_exec_output_limit(),
            link: LinkMode::Unix,
            disk_limit: None,
            warm_pool: 0,
        }
    }
}

/// The default sandbox image, built from `sandbox/Dockerfile` when missing.
pub const DEFAULT_IMAGE: &str = "beige-sandbox:latest";

fn default_image() -> String {
    DEFAULT_IMAGE.to_string()
}
fn default_memory_limit() -> String {
    "3g".to_string()
}
fn default_pids_limit() -> i64 {
    512
}
fn default_max_exec_timeout() -> u64 {
    3600
}
fn default_exec_output_limit() -> u64 {
    beige_protocol::op::DEFAULT_EXEC_MAX_OUTPUT_BYTES
}

/// Settings for all sandboxes (new in beige).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GlobalSandboxConfig {
    /// Path of the static `beige-shim` binary; default: `BEIGE_SHIM`, else next to the
    /// gateway's executable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim: Option<PathBuf>,
    /// Base image used when the gateway builds `beige-sandbox:*` itself (build argument
    /// `BASE`; default `debian:bookworm-slim`). Lets offline hosts build from a local base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_image: Option<String>,
}

// `gateway`: the gateway process.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfig {
    // The HTTP API's bind address; default `127.0.0.1`.
    #[serde(default = "default_host")]
    pub host: String,
    // The HTTP API's port; default `7433`.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Gateway log file; default `<BEIGE_HOME>/logs/gateway.log`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_file: Option<PathBuf>,
    // Rotation of `audit.jsonl` and the gateway log.
    #[serde(default)]
    pub log: LogConfig,
    /// New in beige: how the audit log is kept — each agent's budget, retention, age.
    #[serde(default)]
    pub audit: AuditConfig,
    /// New in beige: require the bearer token on the HTTP API (default true).
    #[serde(default = "default_true")]
    pub auth: bool,
    /// New in beige: keep containers when the gateway stops cleanly.
    #[serde(default)]
    pub keep_sandboxes: bool,
    /// New in beige: free space kept on the filesystems of `BEIGE_HOME` and the agents'
    /// workspaces; below it agents are paused. Bytes, a size (`"512m"`), a percentage
    /// (`"2%"`) or `0` (off); default `"512m"`.
    #[serde(default)]
    pub min_free_space: FreeSpace,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            host: default_host(),
            port: default_port(),
            log_file: None,
            log: LogConfig::default(),
            audit: AuditConfig::default(),
            auth: true,
            keep_sandboxes: false,
            min_free_space: FreeSpace::default(),
        }
    }
}

fn default_host() -> String {
    "127.0.0.1".to_string()
}
fn default_port() -> u16 {
    7433
}
fn default_true() -> bool {
    true
}

// `gateway.log`: when `audit.jsonl` and the gateway log rotate, and how many rotated
// files are kept.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogConfig {
    /// Rotate `audit.jsonl` and `gateway.log` at this size.
    #[serde(default = "default_max_size")]
    pub max_size_bytes: u64,
    /// Rotated files kept.
    #[serde(default = "default_max_files")]
    pub max_files: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            max_size_bytes: default_max_size(),
            max_files: default_max_files(),
        }
    }
}

fn default_max_size() -> u64 {
    10 * 1024 * 1024
}
fn default_max_files() -> u32 {
    5
}

/// New in beige: what keeps the audit log whole when a sandbox floods it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditConfig {
    /// Bytes of audit records one agent may cause per minute (bursts up to a minute's
    /// worth); beyond it the agent's tool calls are refused until it is within budget
    /// again. `0`: no budget.
    #[serde(default = "default_audit_budget")]
    pub budget_bytes_per_minute: u64,
    /// Rotated audit files holding records younger than this many days are never
    /// deleted, even beyond `gateway.log.maxFiles` (more files are kept, with a warning).
    /// `0`: `maxFiles` alone decides.
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
    /// Also rotate `audit.jsonl` once it was begun this many hours ago. `0`: by size only.
    #[serde(default)]
    pub rotate_after_hours: u32,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            budget_bytes_per_minute: default_audit_budget(),
            retention_days: default_retention_days(),
            rotate_after_hours: 0,
        }
    }
}

fn default_audit_budget() -> u64 {
    1024 * 1024
}
fn default_retention_days() -> u32 {
    7
}

/// The uid:gid the agent's processes run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SandboxUser {
    /// uid 0.
    Root,
    /// Any other user.
    Id {
        /// The user id.
        uid: u32,
        /// The group id.
        gid: u32,
    },
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
