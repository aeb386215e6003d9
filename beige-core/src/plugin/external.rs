//! External plugins: a folder with a `plugin.json` whose `run` names a program that the
//! gateway starts and talks to with JSON-RPC 2.0 over its stdin/stdout, one message per
//! line, in both directions. Any language works; `docs/external-plugins.md` is the
//! protocol reference and `examples/plugins/python-notes/` a complete plugin.
//!
//! Owns the plugin process and its supervision: the environment it starts with (built
//! from scratch: `PATH`, `HOME`, `LANG` and only the variables the manifest declares),
//! the `initialize` handshake (10 s) from which its tools, hooks and skills are
//! registered, per-call time limits (tool calls 120 s or the manifest's `timeout`;
//! hooks the hook runner's limit), restarts with backoff (0.5 s, 1 s, 2 s … at most 30 s)
//! while calls fail at once with a clear error, its stderr in the gateway log line by
//! line, and the requests a plugin may make of the gateway (`log`, `kv.*`). It does not
//! decide whether a call may run (policy), record it (audit), or merge configs (the
//! registry hands every call its merged config).
//!
//! Methods, gateway → plugin: `initialize {config, dataDir, gatewayVersion}` →
//! `{tools, hooks, skills}`; `tool.call {tool, args, stdin?, cwd?, workspace, session,
//! config}` → `{output, exitCode}`; `hook.<name> {event}` → the hook's result;
//! `shutdown`. Plugin → gateway: `log {level, message}`; `kv.get {key, scope?}`,
//! `kv.set {key, value, scope?}`, `kv.del {key, scope?}`, `kv.list {prefix?, scope?}`
//! (plugin data in the gateway's store, under the plugin's name, at most
//! `plugins.<name>.maxStoreBytes` of it, default [`DEFAULT_MAX_STORE_BYTES`]); `prompt` and
//! `channel.send` are answered with an error: they are not available in this build.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, oneshot, watch};

use super::command::kill_group;
use super::manifest::{check_schema, Manifest};
use super::process::{base_path, process_env};
use super::{
    Plugin, PluginContext, PluginError, Registrar, SkillDef, Tool, ToolCall, ToolError, ToolResult,
};
use crate::hooks::{
    HookError, HookHandler, HookName, ModelSwitchedEvent, PostResponseEvent, PostResponseResult,
    PostToolExecEvent, PostToolExecResult, PrePromptEvent, PrePromptResult, PreToolExecEvent,
    PreToolExecResult, SessionEvent, DEFAULT_HOOK_TIMEOUT,
};
use crate::store::{KvLimits, KvWrite, PluginData};

/// Time limit of the `initialize` handshake.
pub const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time limit of a `tool.call` (the manifest's `timeout` overrides it).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `shutdown` and the exit after it may take before the process group is killed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The first restart delay; it doubles per failed attempt up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest restart delay.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A process that ran this long before exiting restarts with the first delay again.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// The longest line accepted from a plugin (16 MiB); longer lines are dropped.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// The scope of `kv.*` requests that name none.
pub const DEFAULT_KV_SCOPE: &str = "global";
/// What a plugin's `kv.*` data may take unless `plugins.<name>.maxStoreBytes` says
/// otherwise, all scopes together (256 MiB).
pub const DEFAULT_MAX_STORE_BYTES: u64 = 256 * 1024 * 1024;
/// Bytes counted per entry on top of its key and value, for the row it takes.
pub const STORE_ENTRY_OVERHEAD: u64 = 64;

/// JSON-RPC error codes the gateway answers plugin requests with.
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
/// `kv.set` beyond `plugins.<name>.maxStoreBytes` (a server error in JSON-RPC's range).
const STORE_FULL: i64 = -32001;

/// Why a call to a plugin process failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ExternalError {
    /// The plugin's process could not be started.
    #[error("plugin '{plugin}' could not be started ({command}): {message}")]
    Spawn {
        /// The plugin's name.
        plugin: String,
        /// The program and its arguments, as it was started.
        command: String,
        /// Why it could not be started.
        message: String,
    },
    /// The plugin exited and is being restarted.
    #[error("plugin '{plugin}' is restarting after it exited ({status}); try again in a moment")]
    Restarting {
        /// The plugin's name.
        plugin: String,
        /// How the process ended (`exit code 1`, `killed by signal 9`, …), and why
        /// restarting it failed if an attempt did.
        status: String,
    },
    /// The plugin was stopped.
    #[error("plugin '{plugin}' is not running (it was stopped)")]
    NotRunning {
        /// The plugin's name.
        plugin: String,
    },
    /// The plugin exited while handling a call.
    #[error("plugin '{plugin}' exited ({status}) while handling {method}{}", exit_hint(.method))]
    Exited {
        /// The plugin's name.
        plugin: String,
        /// The JSON-RPC method called (`initialize`, `tool.call`, `hook.<name>`, …).
        method: String,
        /// How the process ended (`exit code 1`, `killed by signal 9`, `its input
        /// closed`, …).
        status: String,
    },
    /// The plugin did not answer in time.
    #[error("plugin '{plugin}' did not answer {method} within {} s", fmt_secs(.limit))]
    Timeout {
        /// The plugin's name.
        plugin: String,
        /// The JSON-RPC method called (`initialize`, `tool.call`, `hook.<name>`, …).
        method: String,
        /// The time limit the call had.
        limit: Duration,
    },
    /// The plugin answered with a JSON-RPC error.
    #[error("plugin '{plugin}' answered {method} with an error: {message} (code {code})")]
    Remote {
        /// The plugin's name.
        plugin: String,
        /// The JSON-RPC method called (`initialize`, `tool.call`, `hook.<name>`, …).
        method: String,
        /// The JSON-RPC error's `code`.
        code: i64,
        /// The JSON-RPC error's `message`.
        message: String,
    },
    /// The plugin answered with something unexpected.
    #[error("plugin '{plugin}' answered {method} with something unexpected: {message}")]
    Protocol {
        /// The plugin's name.
        plugin: String,
        /// The JSON-RPC method called (`initialize`, `tool.call`, `hook.<name>`, …).
        method: String,
        /// What was wrong with the answer.
        message: String,
    },
}

/// What happens after an exit: calls restart the plugin; a failed start is explained by
/// its stderr.
fn exit_hint(method: &str) -> &'static str {
    match method {
        "initialize" => " (its stderr is in the gateway log)",
        "shutdown" => "",
        _ => "; it is being restarted",
    }
}

fn fmt_secs(d: &Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

/// Where an external plugin's process is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginStatus {
    /// Not registered yet.
    NotStarted,
    /// Starting (the `initialize` handshake runs).
    Starting,
    /// Up and answering calls.
    Running {
        /// The process id, when the OS reported one.
        pid: Option<u32>,
    },
    /// It exited and is restarted after a delay; `reason` says how it ended.
    Restarting {
        /// How the process ended (`exit code 1`, `killed by signal 9`, …), and why
        /// restarting it failed if an attempt did.
        reason: String,
    },
    /// Stopped by the gateway.
    Stopped,
}

/// An external plugin: a supervised child process speaking JSON-RPC over stdio.
#[derive(Debug)]
pub struct ExternalPlugin {
    shared: Arc<Shared>,
    manifest: Manifest,
}

impl ExternalPlugin {
    /// The plugin in `dir` described by `manifest` (which must have `run`). Declared
    /// variables are resolved from `env` now (`${VAR}` without default that is not set
    /// is an error naming it). Nothing starts until the gateway registers the plugin.
    pub fn new(
        dir: &Path,
        manifest: Manifest,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, PluginError> {
        let fail = |message: String| PluginError::Failed {
            plugin: manifest.name.clone(),
            message,
        };
        let Some(run) = &manifest.run else {
            return Err(fail(
                "plugin.json has no 'run' (the command that starts an external plugin)".into(),
            ));
        };
        if run.command.trim().is_empty() {
            return Err(fail("plugin.json: run.command is empty".into()));
        }
        let dir = dir.canonicalize().map_err(|e| {
            fail(format!(
                "cannot use the plugin folder {}: {e}",
                dir.display()
            ))
        })?;
        let program = if run.command.contains('/') && !Path::new(&run.command).is_absolute() {
            dir.join(&run.command)
        } else {
            PathBuf::from(&run.command)
        };
        let mut vars = vec![("PATH".to_string(), base_path())];
        for name in ["HOME", "LANG"] {
            if let Some(v) = env(name) {
                vars.push((name.to_string(), v));
            }
        }
        if let Some(decl) = &manifest.env {
            for (k, v) in decl
                .resolve(env)
                .map_err(|e| fail(format!("plugin.json: {e}")))?
            {
                vars.retain(|(name, _)| *name != k);
                vars.push((k, v));
            }
        }
        let call_timeout = match manifest.timeout {
            None => DEFAULT_CALL_TIMEOUT,
            Some(s) => positive_secs(s).ok_or_else(|| {
                fail(format!(
                    "plugin.json: timeout must be a positive number of seconds, not {s}"
                ))
            })?,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                name: manifest.name.clone(),
                dir,
                program,
                args: run.args.clone(),
                env: vars,
                call_timeout,
                start: Mutex::new(None),
                registered: Mutex::new((Vec::new(), Vec::new())),
                state: Mutex::new(State::NotStarted),
                next_id: AtomicU64::new(1),
                generation: AtomicU64::new(0),
                attempt: AtomicU32::new(0),
                stopping: AtomicBool::new(false),
                store_limit: AtomicU64::new(DEFAULT_MAX_STORE_BYTES),
            }),
            manifest,
        })
    }

    /// Bound what the plugin may keep in the gateway's store through `kv.set` (keys,
    /// values and [`STORE_ENTRY_OVERHEAD`] per entry, all scopes together).
    pub fn with_store_limit(self, bytes: u64) -> Self {
        self.shared.store_limit.store(bytes, Ordering::SeqCst);
        self
    }

    /// Read `<dir>/plugin.json` and make the plugin, with the gateway's environment.
    pub fn from_dir(dir: &Path) -> Result<Self, PluginError> {
        let manifest = super::manifest::read_manifest(dir).map_err(|e| PluginError::Failed {
            plugin: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            message: e.to_string(),
        })?;
        Self::new(dir, manifest, &process_env)
    }

    /// The plugin's `plugin.json`, as read.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The process id of the running plugin process (for diagnostics and tests).
    pub fn pid(&self) -> Option<u32> {
        match &*lock(&self.shared.state) {
            State::Running(conn) => conn.pid,
            _ => None,
        }
    }

    /// Where the plugin's process is now: not started, starting, running, restarting
    /// or stopped.
    pub fn status(&self) -> PluginStatus {
        match &*lock(&self.shared.state) {
            State::NotStarted => PluginStatus::NotStarted,
            State::Starting { .. } => PluginStatus::Starting,
            State::Running(conn) => PluginStatus::Running { pid: conn.pid },
            State::Restarting { status } => PluginStatus::Restarting {
                reason: status.clone(),
            },
            State::Stopped => PluginStatus::Stopped,
        }
    }
}

#[async_trait]
impl Plugin for ExternalPlugin {
    fn name(&self) -> &str {
        &self.shared.name
    }

    async fn register(&self, ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        let name = self.shared.name.clone();
        let fail = |message: String| PluginError::Failed {
            plugin: name.clone(),
            message,
        };
        if let Some(schema) = &self.manifest.config_schema {
            check_schema(schema, &ctx.config, &format!("plugins.{name}.config"))
                .map_err(|e| fail(format!("invalid config: {e}")))?;
        }
        // Registered again (an in-place restart): start a fresh process.
        stop_process(&self.shared).await;
        self.shared.stopping.store(false, Ordering::SeqCst);
        self.shared.attempt.store(0, Ordering::SeqCst);
        *lock(&self.shared.start) = Some(StartInfo {
            params: json!({
                "config": ctx.config,
                "dataDir": ctx.data_dir,
                "gatewayVersion": env!("CARGO_PKG_VERSION"),
            }),
            store: ctx.store.clone(),
        });
        let init = match start(&self.shared, None).await {
            Ok(init) => init,
            Err(e) => {
                *lock(&self.shared.state) = State::Stopped;
                let text = e.to_string();
                let prefix = format!("plugin '{name}' ");
                return Err(fail(
                    text.strip_prefix(&prefix).unwrap_or(&text).to_string(),
                ));
            }
        };
        if let Err(e) = self.register_init(&init, reg) {
            stop_process(&self.shared).await;
            return Err(e);
        }
        *lock(&self.shared.registered) = init.names();
        tracing::info!(
            plugin = %name,
            tools = init.tools.len(),
            hooks = init.hooks.len(),
            skills = init.skills.len(),
            "external plugin started"
        );
        Ok(())
    }

    async fn stop(&self) -> Result<(), PluginError> {
        stop_process(&self.shared).await;
        Ok(())
    }
}

impl ExternalPlugin {
    fn register_init(&self, init: &InitResult, reg: &mut Registrar) -> Result<(), PluginError> {
        let name = &self.shared.name;
        let fail = |message: String| PluginError::Failed {
            plugin: name.clone(),
            message,
        };
        for t in &init.tools {
            let timeout = match t.timeout {
                None => self.shared.call_timeout,
                Some(s) => positive_secs(s).ok_or_else(|| {
                    fail(format!(
                        "initialize: tool '{}' has timeout {s}; it must be a positive number of seconds",
                        t.name
                    ))
                })?,
            };
            reg.tool(Arc::new(ExternalTool {
                shared: self.shared.clone(),
                name: t.name.clone(),
                description: t.description.clone(),
                commands: t.commands.clone(),
                timeout,
            }))?;
        }
        let mut hooks = Vec::new();
        for h in &init.hooks {
            let hook = HookName::parse(h).ok_or_else(|| {
                fail(format!(
                    "initialize: unknown hook '{h}'; hooks are {}",
                    HookName::ALL.map(|h| h.as_str()).join(", ")
                ))
            })?;
            if !hooks.contains(&hook) {
                hooks.push(hook);
            }
        }
        if !hooks.is_empty() {
            reg.hooks(Arc::new(ExternalHooks {
                shared: self.shared.clone(),
                hooks,
            }));
        }
        for s in &init.skills {
            let path = crate::fsutil::safe_join(&self.shared.dir, &s.path).map_err(|e| {
                fail(format!(
                    "initialize: skill '{}': its path must be inside the plugin folder: {e}",
                    s.name
                ))
            })?;
            reg.skill(SkillDef {
                name: s.name.clone(),
                path,
                description: s.description.clone(),
            });
        }
        Ok(())
    }
}

// ---- what initialize answers ----

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitResult {
    #[serde(default)]
    tools: Vec<InitTool>,
    #[serde(default)]
    hooks: Vec<String>,
    #[serde(default)]
    skills: Vec<InitSkill>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitTool {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    commands: Vec<String>,
    /// Seconds; overrides the manifest's `timeout` for this tool.
    #[serde(default)]
    timeout: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
struct InitSkill {
    name: String,
    path: String,
    #[serde(default)]
    description: String,
}

impl InitResult {
    /// Tool names and hook names, sorted, to compare a restart with the first start.
    fn names(&self) -> (Vec<String>, Vec<String>) {
        let mut tools: Vec<String> = self.tools.iter().map(|t| t.name.clone()).collect();
        let mut hooks = self.hooks.clone();
        tools.sort();
        hooks.sort();
        (tools, hooks)
    }
}

fn positive_secs(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0 && s <= 86_400.0).then(|| Duration::from_secs_f64(s))
}

// ---- the tool and the hooks ----

#[derive(Debug)]
struct ExternalTool {
    shared: Arc<Shared>,
    name: String,
    description: String,
    commands: Vec<String>,
    timeout: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallResult {
    #[serde(default)]
    output: String,
    #[serde(default)]
    exit_code: i32,
}

#[async_trait]
impl Tool for ExternalTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn commands(&self) -> Vec<String> {
        self.commands.clone()
    }

    /// A little longer than the plugin's own limit, so that its clearer message wins.
    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout + Duration::from_secs(2))
    }

    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        let mut params = json!({
            "tool": call.tool,
            "args": call.args,
            "session": call.session,
            "config": call.config,
            "workspace": call.workspace,
        });
        if let Some(stdin) = &call.stdin {
            params["stdin"] = json!(base64::engine::general_purpose::STANDARD.encode(stdin));
        }
        if let Some(cwd) = &call.cwd {
            params["cwd"] = json!(cwd);
        }
        let value = request(&self.shared, "tool.call", params, self.timeout)
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        let result: CallResult = serde_json::from_value(value).map_err(|e| {
            ToolError::Failed(
                ExternalError::Protocol {
                    plugin: self.shared.name.clone(),
                    method: "tool.call".into(),
                    message: format!("expected {{output, exitCode}}: {e}"),
                }
                .to_string(),
            )
        })?;
        Ok(ToolResult {
            output: result.output,
            exit_code: result.exit_code,
        })
    }
}

#[derive(Debug)]
struct ExternalHooks {
    shared: Arc<Shared>,
    hooks: Vec<HookName>,
}

impl ExternalHooks {
    /// Call `hook.<name>` with `event`; the runner enforces [`HookHandler::timeout`], the
    /// margin here only keeps the request from outliving it.
    async fn call<E: serde::Serialize, R: serde::de::DeserializeOwned + Default>(
        &self,
        hook: HookName,
        event: &E,
    ) -> Result<R, HookError> {
        let method = format!("hook.{}", hook.as_str());
        let value = request(
            &self.shared,
            &method,
            json!({ "event": event }),
            self.timeout() + Duration::from_secs(1),
        )
        .await
        .map_err(|e| HookError(e.to_string()))?;
        if value.is_null() {
            return Ok(R::default());
        }
        serde_json::from_value(value).map_err(|e| {
            HookError(
                ExternalError::Protocol {
                    plugin: self.shared.name.clone(),
                    method,
                    message: e.to_string(),
                }
                .to_string(),
            )
        })
    }
}

#[async_trait]
impl HookHandler for ExternalHooks {
    fn hooks(&self) -> Vec<HookName> {
        self.hooks.clone()
    }

    fn timeout(&self) -> Duration {
        DEFAULT_HOOK_TIMEOUT
    }

    async fn pre_prompt(&self, e: &PrePromptEvent) -> Result<PrePromptResult, HookError> {
        self.call(HookName::PrePrompt, e).await
    }

    async fn post_response(&self, e: &PostResponseEvent) -> Result<PostResponseResult, HookError> {
        self.call(HookName::PostResponse, e).await
    }

    async fn pre_tool_exec(&self, e: &PreToolExecEvent) -> Result<PreToolExecResult, HookError> {
        let r: Option<PreToolExecResult> = self.call(HookName::PreToolExec, e).await?;
        Ok(r.unwrap_or_else(PreToolExecResult::allow))
    }

    async fn post_tool_exec(&self, e: &PostToolExecEvent) -> Result<PostToolExecResult, HookError> {
        self.call(HookName::PostToolExec, e).await
    }

    async fn session_created(&self, e: &SessionEvent) -> Result<(), HookError> {
        self.call::<_, Value>(HookName::SessionCreated, e)
            .await
            .map(drop)
    }

    async fn session_disposed(&self, e: &SessionEvent) -> Result<(), HookError> {
        self.call::<_, Value>(HookName::SessionDisposed, e)
            .await
            .map(drop)
    }

    async fn model_switched(&self, e: &ModelSwitchedEvent) -> Result<(), HookError> {
        self.call::<_, Value>(HookName::ModelSwitched, e)
            .await
            .map(drop)
    }

    async fn gateway_started(&self) -> Result<(), HookError> {
        self.call::<_, Value>(HookName::GatewayStarted, &json!({}))
            .await
            .map(drop)
    }

    async fn gateway_shutdown(&self) -> Result<(), HookError> {
        self.call::<_, Value>(HookName::GatewayShutdown, &json!({}))
            .await
            .map(drop)
    }
}

// ---- the supervised process ----

/// Everything about one plugin that outlives its processes.
#[derive(Debug)]
struct Shared {
    name: String,
    dir: PathBuf,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    call_timeout: Duration,
    start: Mutex<Option<StartInfo>>,
    /// What the first `initialize` registered: tool names and hook names.
    registered: Mutex<(Vec<String>, Vec<String>)>,
    state: Mutex<State>,
    next_id: AtomicU64,
    generation: AtomicU64,
    /// Failed restarts in a row (the backoff exponent).
    attempt: AtomicU32,
    stopping: AtomicBool,
    /// The most the plugin's `kv.*` data may take (see [`DEFAULT_MAX_STORE_BYTES`]).
    store_limit: AtomicU64,
}

/// What every (re)start needs: the `initialize` params and the store for `kv.*`.
#[derive(Debug, Clone)]
struct StartInfo {
    params: Value,
    store: Arc<dyn PluginData>,
}

#[derive(Debug)]
enum State {
    NotStarted,
    Starting { last_exit: Option<String> },
    Running(Conn),
    Restarting { status: String },
    Stopped,
}

type Reply = Result<Value, (i64, String)>;
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// One running process: where to write, who waits for answers, how it ended.
#[derive(Debug, Clone)]
struct Conn {
    generation: u64,
    pid: Option<u32>,
    out: mpsc::UnboundedSender<Out>,
    pending: Pending,
    /// `Some(status)` once the process has exited.
    exit: Arc<watch::Sender<Option<String>>>,
}

#[derive(Debug)]
enum Out {
    Line(String),
    Close,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Shared {
    fn drop(&mut self) {
        let state = std::mem::replace(
            self.state.get_mut().unwrap_or_else(|e| e.into_inner()),
            State::Stopped,
        );
        if let State::Running(conn) = state {
            if let (Some(pid), None) = (conn.pid, conn.exit.borrow().as_ref()) {
                kill_group(pid, libc::SIGKILL);
            }
        }
    }
}

/// Start a process and run `initialize`; on success it is the running one.
async fn start(
    shared: &Arc<Shared>,
    last_exit: Option<String>,
) -> Result<InitResult, ExternalError> {
    let Some(info) = lock(&shared.start).clone() else {
        return Err(ExternalError::NotRunning {
            plugin: shared.name.clone(),
        });
    };
    *lock(&shared.state) = State::Starting { last_exit };
    let conn = spawn(shared, info.store.clone())?;
    let outcome = request_on(shared, &conn, "initialize", info.params, INITIALIZE_TIMEOUT)
        .await
        .and_then(|v| {
            serde_json::from_value::<InitResult>(if v.is_null() { json!({}) } else { v }).map_err(
                |e| ExternalError::Protocol {
                    plugin: shared.name.clone(),
                    method: "initialize".into(),
                    message: format!("expected {{tools, hooks, skills}}: {e}"),
                },
            )
        });
    match outcome {
        Ok(init) => {
            // Installed under the lock, after checking that the process has not exited
            // yet: the waiter publishes an exit before it looks at the state, so an exit
            // is either seen here or restarts the process itself.
            let outcome = {
                let mut state = lock(&shared.state);
                let exited = conn.exit.borrow().clone();
                if shared.stopping.load(Ordering::SeqCst) {
                    Err(ExternalError::NotRunning {
                        plugin: shared.name.clone(),
                    })
                } else if let Some(status) = exited {
                    Err(ExternalError::Exited {
                        plugin: shared.name.clone(),
                        method: "initialize".into(),
                        status,
                    })
                } else {
                    *state = State::Running(conn.clone());
                    Ok(())
                }
            };
            match outcome {
                Ok(()) => Ok(init),
                Err(e) => {
                    terminate(&conn).await;
                    Err(e)
                }
            }
        }
        Err(e) => {
            terminate(&conn).await;
            Err(e)
        }
    }
}

/// Spawn the process and the tasks that serve its pipes and wait for its exit.
fn spawn(shared: &Arc<Shared>, store: Arc<dyn PluginData>) -> Result<Conn, ExternalError> {
    let mut cmd = tokio::process::Command::new(&shared.program);
    cmd.args(&shared.args)
        .current_dir(&shared.dir)
        .env_clear()
        .envs(shared.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let spawn_err = |message: String| ExternalError::Spawn {
        plugin: shared.name.clone(),
        command: std::iter::once(shared.program.display().to_string())
            .chain(shared.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" "),
        message,
    };
    let mut child = cmd.spawn().map_err(|e| spawn_err(e.to_string()))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(spawn_err("its pipes could not be set up".into()));
    };
    let generation = shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
    let (tx, rx) = mpsc::unbounded_channel();
    let conn = Conn {
        generation,
        pid: child.id(),
        out: tx,
        pending: Arc::new(Mutex::new(HashMap::new())),
        exit: Arc::new(watch::channel(None).0),
    };
    tokio::spawn(write_lines(stdin, rx));
    tokio::spawn(read_stdout(
        shared.name.clone(),
        stdout,
        conn.clone(),
        store,
        shared.store_limit.load(Ordering::SeqCst),
    ));
    tokio::spawn(log_stderr(shared.name.clone(), stderr));
    tokio::spawn(wait_exit(Arc::downgrade(shared), child, conn.clone()));
    Ok(conn)
}

/// Send a request to the running process.
async fn request(
    shared: &Arc<Shared>,
    method: &str,
    params: Value,
    limit: Duration,
) -> Result<Value, ExternalError> {
    let conn = match &*lock(&shared.state) {
        State::Running(conn) => conn.clone(),
        State::Restarting { status }
        | State::Starting {
            last_exit: Some(status),
        } => {
            return Err(ExternalError::Restarting {
                plugin: shared.name.clone(),
                status: status.clone(),
            })
        }
        _ => {
            return Err(ExternalError::NotRunning {
                plugin: shared.name.clone(),
            })
        }
    };
    request_on(shared, &conn, method, params, limit).await
}

/// Removes a request's waiter when the caller stops waiting (time limit, cancellation).
struct PendingGuard {
    pending: Pending,
    id: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        lock(&self.pending).remove(&self.id);
    }
}

async fn request_on(
    shared: &Shared,
    conn: &Conn,
    method: &str,
    params: Value,
    limit: Duration,
) -> Result<Value, ExternalError> {
    let exited = |status: String| ExternalError::Exited {
        plugin: shared.name.clone(),
        method: method.to_string(),
        status,
    };
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = oneshot::channel();
    lock(&conn.pending).insert(id, tx);
    let _guard = PendingGuard {
        pending: conn.pending.clone(),
        id,
    };
    // The exit is published before waiters are failed, so this check and that drain
    // together never miss a request.
    if let Some(status) = conn.exit.borrow().clone() {
        return Err(exited(status));
    }
    let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
    if conn.out.send(Out::Line(line)).is_err() {
        return Err(exited(exit_status(conn)));
    }
    match tokio::time::timeout(limit, rx).await {
        Err(_) => Err(ExternalError::Timeout {
            plugin: shared.name.clone(),
            method: method.to_string(),
            limit,
        }),
        Ok(Err(_)) => Err(exited(exit_status(conn))),
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err((code, message)))) if code == EXITED_CODE => Err(exited(message)),
        Ok(Ok(Err((code, message)))) => Err(ExternalError::Remote {
            plugin: shared.name.clone(),
            method: method.to_string(),
            code,
            message,
        }),
    }
}

/// Internal marker: the waiter failed the request because the process exited.
const EXITED_CODE: i64 = i64::MIN;

fn exit_status(conn: &Conn) -> String {
    conn.exit
        .borrow()
        .clone()
        .unwrap_or_else(|| "its input closed".to_string())
}

/// Ask the process to stop, then close its input; kill the group if it lingers.
async fn terminate(conn: &Conn) {
    let mut exited = conn.exit.subscribe();
    let _ = conn.out.send(Out::Close);
    let exited_in_time = tokio::time::timeout(SHUTDOWN_GRACE, exited.wait_for(Option::is_some))
        .await
        .is_ok();
    if !exited_in_time {
        if let Some(pid) = conn.pid {
            if conn.exit.borrow().is_none() {
                kill_group(pid, libc::SIGKILL);
            }
        }
        let _ =
            tokio::time::timeout(Duration::from_secs(2), exited.wait_for(Option::is_some)).await;
    }
}

/// Stop the running process (if any) for good: `shutdown`, EOF, then SIGKILL.
async fn stop_process(shared: &Arc<Shared>) {
    shared.stopping.store(true, Ordering::SeqCst);
    let previous = std::mem::replace(&mut *lock(&shared.state), State::Stopped);
    if let State::Running(conn) = previous {
        if let Err(e) = request_on(shared, &conn, "shutdown", json!({}), SHUTDOWN_GRACE).await {
            tracing::debug!(plugin = %shared.name, error = %e, "plugin did not answer shutdown");
        }
        terminate(&conn).await;
        tracing::info!(plugin = %shared.name, "external plugin stopped");
    }
}

fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX))
        .min(MAX_BACKOFF)
}

/// Wait for the process to exit; fail its pending requests and, unless it was being
/// stopped, restart it with backoff.
async fn wait_exit(shared: Weak<Shared>, mut child: Child, conn: Conn) {
    let started = Instant::now();
    let status = match child.wait().await {
        Ok(s) => describe_exit(s),
        Err(e) => format!("could not be waited for: {e}"),
    };
    conn.exit.send_replace(Some(status.clone()));
    let waiters: Vec<_> = lock(&conn.pending).drain().collect();
    for (_, tx) in waiters {
        let _ = tx.send(Err((EXITED_CODE, status.clone())));
    }
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let restart = {
        let mut state = lock(&shared.state);
        match &*state {
            State::Running(c)
                if c.generation == conn.generation && !shared.stopping.load(Ordering::SeqCst) =>
            {
                *state = State::Restarting {
                    status: status.clone(),
                };
                true
            }
            _ => false,
        }
    };
    if restart {
        if started.elapsed() >= HEALTHY_AFTER {
            shared.attempt.store(0, Ordering::SeqCst);
        }
        let delay = backoff(shared.attempt.load(Ordering::SeqCst));
        tracing::warn!(
            plugin = %shared.name,
            status = %status,
            "external plugin exited; restarting in {} s",
            fmt_secs(&delay)
        );
        tokio::spawn(restart_loop(Arc::downgrade(&shared), status));
    }
}

async fn restart_loop(shared: Weak<Shared>, mut status: String) {
    loop {
        let delay = match shared.upgrade() {
            Some(s) => backoff(s.attempt.fetch_add(1, Ordering::SeqCst)),
            None => return,
        };
        tokio::time::sleep(delay).await;
        let Some(s) = shared.upgrade() else {
            return;
        };
        if s.stopping.load(Ordering::SeqCst) {
            return;
        }
        match start(&s, Some(status.clone())).await {
            Ok(init) => {
                tracing::info!(plugin = %s.name, "external plugin restarted");
                if init.names() != *lock(&s.registered) {
                    tracing::warn!(
                        plugin = %s.name,
                        "the restarted plugin names other tools or hooks than at startup; the startup ones stay registered until the gateway restarts"
                    );
                }
                return;
            }
            Err(e) => {
                if s.stopping.load(Ordering::SeqCst) {
                    return;
                }
                status = format!("{status}; restarting failed: {e}");
                tracing::warn!(plugin = %s.name, error = %e, "external plugin could not be restarted");
                *lock(&s.state) = State::Restarting {
                    status: status.clone(),
                };
            }
        }
    }
}

fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => s.to_string(),
    }
}

async fn write_lines(mut stdin: ChildStdin, mut rx: mpsc::UnboundedReceiver<Out>) {
    while let Some(out) = rx.recv().await {
        let Out::Line(line) = out else {
            break;
        };
        let written = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await
        };
        if written.await.is_err() {
            break;
        }
    }
}

/// One line of a child's output.
enum Line {
    Text(Vec<u8>),
    /// Longer than the limit; its content was dropped.
    TooLong(usize),
}

/// Read up to `\n` (excluded) without holding more than `max` bytes; `None` at EOF.
async fn read_line_limited<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<Line>> {
    let mut buf = Vec::new();
    let mut total = 0usize;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match total {
                0 => None,
                n if n > max => Some(Line::TooLong(n)),
                _ => Some(Line::Text(buf)),
            });
        }
        let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        total += part.len();
        if total <= max {
            buf.extend_from_slice(part);
        } else {
            buf = Vec::new();
        }
        let used = done.unwrap_or(part.len());
        r.consume(used);
        if done.is_some() {
            return Ok(Some(if total > max {
                Line::TooLong(total)
            } else {
                Line::Text(buf)
            }));
        }
    }
}

async fn log_stderr(name: String, stderr: tokio::process::ChildStderr) {
    let mut r = BufReader::new(stderr);
    while let Ok(Some(line)) = read_line_limited(&mut r, 64 * 1024).await {
        match line {
            Line::Text(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let text = text.trim_end_matches('\r');
                tracing::warn!(target: "beige::plugin", plugin = %name, "[{name}] {text}");
            }
            Line::TooLong(n) => {
                tracing::warn!(target: "beige::plugin", plugin = %name, "[{name}] ({n} bytes on one stderr line, not shown)");
            }
        }
    }
}

/// Serve the process's stdout: answers to our requests, its requests and notifications.
async fn read_stdout(
    name: String,
    stdout: tokio::process::ChildStdout,
    conn: Conn,
    store: Arc<dyn PluginData>,
    store_limit: u64,
) {
    let mut r = BufReader::new(stdout);
    loop {
        let line = match read_line_limited(&mut r, MAX_LINE_BYTES).await {
            Ok(Some(Line::Text(line))) => line,
            Ok(Some(Line::TooLong(n))) => {
                tracing::warn!(plugin = %name, "plugin sent a {n}-byte line (limit {MAX_LINE_BYTES}); dropped");
                continue;
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(plugin = %name, error = %e, "reading the plugin's stdout failed");
                return;
            }
        };
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                let shown: String = text.chars().take(200).collect();
                tracing::warn!(
                    plugin = %name,
                    "plugin wrote a line to stdout that is not a JSON-RPC message (stdout carries only the protocol; write logs to stderr): {shown}"
                );
                continue;
            }
        };
        if let Some(method) = msg.get("method").and_then(Value::as_str) {
            let method = method.to_string();
            let params = msg.get("params").cloned().unwrap_or(Value::Null);
            match msg.get("id").filter(|id| !id.is_null()).cloned() {
                Some(id) => {
                    let (name, out, store) = (name.clone(), conn.out.clone(), store.clone());
                    tokio::spawn(async move {
                        let reply = match serve(&name, store.as_ref(), store_limit, &method, params)
                            .await
                        {
                            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                            Err((code, message)) => json!({"jsonrpc": "2.0", "id": id,
                                "error": {"code": code, "message": message}}),
                        };
                        let _ = out.send(Out::Line(reply.to_string()));
                    });
                }
                None => {
                    if let Err((_, message)) =
                        serve(&name, store.as_ref(), store_limit, &method, params).await
                    {
                        tracing::warn!(plugin = %name, "notification {method}: {message}");
                    }
                }
            }
            continue;
        }
        let Some(id) = msg.get("id").and_then(Value::as_u64) else {
            tracing::warn!(plugin = %name, "plugin sent a message with neither a method nor a known id: {msg}");
            continue;
        };
        let reply = match msg.get("error") {
            Some(err) if !err.is_null() => Err((
                err.get("code")
                    .and_then(Value::as_i64)
                    .unwrap_or(INTERNAL_ERROR),
                err.get("message")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| err.to_string()),
            )),
            _ => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
        };
        let waiter = lock(&conn.pending).remove(&id);
        match waiter {
            Some(tx) => {
                let _ = tx.send(reply);
            }
            None => {
                tracing::debug!(plugin = %name, id, "answer to a request nobody waits for (it timed out)")
            }
        }
    }
}

/// Answer a request (or take a notification) from the plugin.
async fn serve(
    name: &str,
    store: &dyn PluginData,
    store_limit: u64,
    method: &str,
    params: Value,
) -> Reply {
    let bad = |m: String| Err((INVALID_PARAMS, format!("{method}: {m}")));
    let str_param = |key: &str| params.get(key).and_then(Value::as_str).map(str::to_string);
    let scope = match params.get("scope") {
        None | Some(Value::Null) => DEFAULT_KV_SCOPE.to_string(),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => s.clone(),
        Some(_) => return bad("scope must be a non-empty string of at most 256 bytes".into()),
    };
    let key = || match str_param("key") {
        Some(k) if !k.is_empty() && k.len() <= super::kv::MAX_KEY_BYTES => Ok(k),
        _ => Err((
            INVALID_PARAMS,
            format!(
                "{method}: 'key' must be a non-empty string of at most {} bytes",
                super::kv::MAX_KEY_BYTES
            ),
        )),
    };
    let store_err = |e: crate::store::StoreError| (INTERNAL_ERROR, format!("{method}: {e}"));
    match method {
        "log" => {
            let message = str_param("message").unwrap_or_else(|| params.to_string());
            match str_param("level").as_deref() {
                Some("error") => tracing::error!(plugin = %name, "[{name}] {message}"),
                Some("warn" | "warning") => tracing::warn!(plugin = %name, "[{name}] {message}"),
                Some("debug") => tracing::debug!(plugin = %name, "[{name}] {message}"),
                Some("trace") => tracing::trace!(plugin = %name, "[{name}] {message}"),
                _ => tracing::info!(plugin = %name, "[{name}] {message}"),
            }
            Ok(Value::Null)
        }
        "kv.get" => {
            let key = key()?;
            let stored = store.kv_get(name, &scope, &key).await.map_err(store_err)?;
            Ok(stored
                .map(|s| serde_json::from_str(&s).unwrap_or(Value::String(s)))
                .unwrap_or(Value::Null))
        }
        "kv.set" => {
            let key = key()?;
            let Some(value) = params.get("value") else {
                return bad("'value' is missing (use kv.del to delete)".into());
            };
            let text = value.to_string();
            if text.len() > super::kv::MAX_VALUE_BYTES {
                return bad(format!(
                    "the value is {} bytes as JSON; at most {} are stored",
                    text.len(),
                    super::kv::MAX_VALUE_BYTES
                ));
            }
            let limits = KvLimits {
                max_entries: None,
                max_bytes: Some(store_limit),
                entry_overhead: STORE_ENTRY_OVERHEAD,
                whole_plugin: true,
            };
            match store
                .kv_set_within(name, &scope, &key, &text, limits)
                .await
                .map_err(store_err)?
            {
                KvWrite::Stored => Ok(Value::Null),
                KvWrite::TooManyEntries { .. } | KvWrite::TooManyBytes { .. } => {
                    let used = store
                        .kv_usage(name, None)
                        .await
                        .map(|u| u.bytes + u.entries * STORE_ENTRY_OVERHEAD)
                        .unwrap_or(0);
                    Err((
                        STORE_FULL,
                        format!(
                            "{method}: plugin '{name}' uses {} of its {} in the gateway's store \
                             (keys, values and {STORE_ENTRY_OVERHEAD} bytes per entry, all scopes); \
                             nothing was stored — delete keys (kv.del) or raise \
                             plugins.{name}.maxStoreBytes",
                            crate::disk::fmt_bytes(used),
                            crate::disk::fmt_bytes(store_limit)
                        ),
                    ))
                }
            }
        }
        "kv.del" => {
            let key = key()?;
            let existed = store.kv_del(name, &scope, &key).await.map_err(store_err)?;
            Ok(json!(existed))
        }
        "kv.list" => {
            let prefix = str_param("prefix").unwrap_or_default();
            let keys = store
                .kv_list(name, &scope, &prefix)
                .await
                .map_err(store_err)?;
            Ok(json!(keys))
        }
        "prompt" | "channel.send" => Err((
            METHOD_NOT_FOUND,
            format!("'{method}' is not available in this build of beige: plugins cannot start prompts or send channel messages yet"),
        )),
        other => Err((
            METHOD_NOT_FOUND,
            format!("unknown method '{other}'; the gateway answers log, kv.get, kv.set, kv.del and kv.list"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_thirty_seconds() {
        let delays: Vec<u64> = (0..9).map(|a| backoff(a).as_millis() as u64).collect();
        assert_eq!(
            delays,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[tokio::test]
    #[cfg(feature = "sqlite")]
    async fn kv_set_is_bounded_over_all_scopes_of_the_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path().join("beige.db")).unwrap();
        // Each entry: key (1) + value as JSON ("x…", 12) + 64 = 77 bytes.
        let set =
            |scope: &str, key: &str| json!({"key": key, "value": "x".repeat(10), "scope": scope});
        assert_eq!(
            serve("notes", &store, 200, "kv.set", set("a", "k")).await,
            Ok(Value::Null)
        );
        assert_eq!(
            serve("notes", &store, 200, "kv.set", set("b", "k")).await,
            Ok(Value::Null)
        );
        let (code, message) = serve("notes", &store, 200, "kv.set", set("c", "k"))
            .await
            .unwrap_err();
        assert_eq!(code, STORE_FULL);
        assert_eq!(
            message,
            "kv.set: plugin 'notes' uses 154 B of its 200 B in the gateway's store (keys, values and 64 bytes per entry, all scopes); nothing was stored — delete keys (kv.del) or raise plugins.notes.maxStoreBytes"
        );
        assert_eq!(
            serve(
                "notes",
                &store,
                200,
                "kv.get",
                json!({"key": "k", "scope": "c"})
            )
            .await,
            Ok(Value::Null)
        );
        // Another plugin has its own allowance; overwriting in place still works.
        assert_eq!(
            serve("other", &store, 200, "kv.set", set("c", "k")).await,
            Ok(Value::Null)
        );
        assert_eq!(
            serve("notes", &store, 200, "kv.set", set("a", "k")).await,
            Ok(Value::Null)
        );
    }

    #[tokio::test]
    async fn lines_are_limited() {
        let data: &[u8] = b"short\nthis line is too long\nok";
        let mut r = BufReader::with_capacity(4, data);
        let mut got = Vec::new();
        while let Some(line) = read_line_limited(&mut r, 8).await.unwrap() {
            got.push(match line {
                Line::Text(t) => String::from_utf8(t).unwrap(),
                Line::TooLong(n) => format!("<{n}>"),
            });
        }
        assert_eq!(got, ["short", "<21>", "ok"]);
    }
}
