//! Plugins and plugin tools: the [`Plugin`] and [`Tool`] traits, the registrar plugins
//! register through, and the registry the gateway routes calls with.
//!
//! Owns naming rules (a tool is named after its plugin, or `<plugin>.<name>`), uniqueness
//! of tools, hooks and skills, per-call config merging (the agent's `pluginConfigs` deep
//! merged over the plugin's `config`) and start/stop order (config order, reverse on
//! stop). It does not decide whether a call may run (policy) and does not record it
//! (audit). Plugins never see LLM keys or other plugins' configuration: a plugin gets
//! only its own config.

pub mod command;
pub mod external;
pub mod kv;
pub(crate) mod load;
mod manifest;
mod process;
pub mod registry;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use registry::{merge_config, PluginRegistry, Registrar};

// What the plugin installer (`beige plugins install|update|remove`, in beige-cli) reads of
// a plugin folder: the manifest file, its name rules, the built-in names it must not take,
// the npm source of the original's toolkit, and joining a relative path beneath a root.
pub use crate::fsutil::{safe_join, Beneath, Capped, HostPathError, PathError, DEFAULT_READ_CAP};
pub use load::{
    check_plugin_configs, load_plugin_dir, load_plugins, plugins_from_config, read_manifest,
    valid_plugin_name, LoadedPlugins, Manifest, ManifestError, BUILTIN, MANIFEST_FILE,
    TOOLKIT_NPM_SOURCE,
};

/// The session a tool call belongs to, as far as the gateway could verify it: the agent
/// from the socket, the key only when the agent owns it, and channel, chat and thread
/// from the gateway's own record of the session — never from the request's payload, so
/// a tool may use them as a destination.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// Always the agent the call came from (from the socket, never the payload).
    pub agent: String,
    /// `socket:<agent>` when the caller named no valid session.
    pub key: String,
    /// `socket` when the caller named no valid session.
    pub channel: String,
    /// The chat on that channel the session's prompts come from (a Telegram chat id,
    /// …); `None` when the channel has no chats or the caller named no valid session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    /// The thread or forum topic within that chat, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// One invocation of a plugin tool.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// The tool called: `<plugin>` or `<plugin>.<sub>`, always one this plugin registered.
    pub tool: String,
    /// The arguments the script passed after the tool's name, as given.
    pub args: Vec<String>,
    /// Data piped into the tool in the sandbox, if any.
    pub stdin: Option<Vec<u8>>,
    /// The caller's working directory relative to the workspace (validated: it stays
    /// inside). Open it on the host beneath a handle on the workspace with
    /// [`crate::fsutil::Beneath`], never by path.
    pub cwd: Option<String>,
    /// The agent's workspace on the host.
    pub workspace: PathBuf,
    /// The session the call belongs to, as the gateway verified it.
    pub session: SessionInfo,
    /// The plugin's config deep-merged with the agent's `pluginConfigs` entry.
    pub config: serde_json::Value,
    /// The exec the caller belongs to, as the kernel attributed it (never what the
    /// request claims); `None` for a caller outside every exec, and for calls the
    /// gateway makes itself.
    pub exec: Option<String>,
}

pub use crate::hooks::RegisteredHooks;
pub use crate::vocab::ToolResult;

/// A failure inside a tool handler (as opposed to a result with a non-zero exit code).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The handler failed, with its message.
    #[error("{0}")]
    Failed(String),
    /// An I/O error in the handler.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// A plugin tool: runs on the host, called from the sandbox as `/tools/bin/<name>`.
#[async_trait]
pub trait Tool: Send + Sync + std::fmt::Debug {
    /// `<plugin>` or `<plugin>.<sub>`.
    fn name(&self) -> &str;
    /// One line for the system prompt and `--help`.
    fn description(&self) -> &str;
    /// Usage lines, e.g. `kv get <key>`.
    fn commands(&self) -> Vec<String> {
        Vec::new()
    }
    /// Handler time limit; the socket server's default (120 s) when `None`.
    fn timeout(&self) -> Option<std::time::Duration> {
        None
    }
    /// Handle one call. A result with a non-zero exit code is an ordinary answer; `Err`
    /// is a failure of the handler, which the caller sees as exit code 1 and the audit
    /// log records as an error.
    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError>;
}

/// A skill: a read-only folder mounted at `/skills/<name>/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillDef {
    /// The skill's name, its folder under `/skills/`.
    pub name: String,
    /// The folder on the host that is mounted, read-only.
    pub path: PathBuf,
    /// One line for the system prompt; when a plugin leaves it empty, the one in the
    /// folder's `skill.json` is used.
    pub description: String,
}

/// What a plugin gets when it registers.
#[derive(Debug, Clone)]
pub struct PluginContext {
    /// The plugin's own `plugins.<name>.config` (no other plugin's, no LLM keys).
    pub config: serde_json::Value,
    /// `<BEIGE_HOME>/data/<plugin>/`, created before `register`.
    pub data_dir: PathBuf,
    /// The plugin data of the gateway's store (`<BEIGE_HOME>/beige.db`): key-value pairs
    /// scoped by plugin name and a scope (usually the calling agent). A plugin uses its
    /// own name as `plugin` and never another plugin's. Only this part of the store:
    /// plugins cannot read sessions.
    pub store: Arc<dyn crate::store::PluginData>,
    /// Where the plugin's docs (`SKILL.md`, `README.md`) live, mounted at
    /// `/tools/packages/<tool>/` for each of its tools; `None` for none.
    pub package_dir: Option<PathBuf>,
    /// The channel state of the store (offsets, outbox), for the tools of the built-in
    /// channels only (the `telegram` tool queues in the channel's outbox): never visible
    /// outside beige-core.
    #[cfg_attr(not(feature = "telegram"), allow(dead_code))]
    pub(crate) channel_state: Arc<dyn crate::store::ChannelState>,
}

/// A plugin: registers tools, hooks and skills; may start and stop background work.
#[async_trait]
pub trait Plugin: Send + Sync + std::fmt::Debug {
    /// The plugin's name: its key under `plugins` in the config, and the name (or
    /// prefix) of every tool it registers.
    fn name(&self) -> &str;

    /// Register tools, hooks and skills. Called once, in config order.
    async fn register(&self, ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError>;

    /// Called after the gateway is up, in config order.
    async fn start(&self) -> Result<(), PluginError> {
        Ok(())
    }

    /// Called on shutdown, in reverse config order. Errors are logged.
    async fn stop(&self) -> Result<(), PluginError> {
        Ok(())
    }
}

/// Registration and lifecycle errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// A tool's name does not belong to its plugin.
    #[error("plugin '{plugin}' cannot register tool '{tool}': tool names must be '{plugin}' or start with '{plugin}.'")]
    ToolName {
        /// The plugin that tried to register the tool.
        plugin: String,
        /// The name it tried.
        tool: String,
    },
    /// Two plugins register the same tool.
    #[error("tool '{tool}' is registered twice (by plugin '{first}' and by plugin '{second}')")]
    DuplicateTool {
        /// The tool's name.
        tool: String,
        /// The plugin that registered it first.
        first: String,
        /// The plugin that tried to register it again.
        second: String,
    },
    /// Two plugins register the same skill.
    #[error("skill '{skill}' is registered twice (by '{first}' and by '{second}')")]
    DuplicateSkill {
        /// The skill's name.
        skill: String,
        /// The plugin that registered it first.
        first: String,
        /// The plugin that tried to register it again.
        second: String,
    },
    /// The config lists a plugin that does not exist.
    #[error("plugin '{plugin}' is listed in the config but no such plugin exists (built-in plugins: {builtin}); give it a `path` or install it with `beige plugins install`")]
    Unknown {
        /// The name under `plugins` in the config.
        plugin: String,
        /// The built-in plugins of this build, comma-separated.
        builtin: String,
    },
    /// The plugin failed, with its message.
    #[error("plugin '{plugin}': {message}")]
    Failed {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        message: String,
    },
}

/// A registered tool and the plugin that owns it.
#[derive(Debug, Clone)]
pub struct RegisteredTool {
    /// The name of the plugin that registered the tool.
    pub plugin: String,
    /// The tool, called when a script in the sandbox runs `/tools/bin/<name>`.
    pub tool: Arc<dyn Tool>,
    /// The plugin's docs folder, mounted at `/tools/packages/<tool>/`; `None` when the
    /// plugin has none.
    pub package_dir: Option<PathBuf>,
}
