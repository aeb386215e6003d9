//! Hooks: the nine extension points of the original, run in plugin config order.
//!
//! Owns the event and result types, the [`HookHandler`] trait plugins implement, and
//! [`HookRunner`], which chains handlers: a rewrite is seen by the next handler, the first
//! block/deny wins, every handler has a time limit (5 s by default), and a failing or
//! timed-out `prePrompt`/`preToolExec` handler **blocks** (fail closed) with a reason
//! naming it. Failing observer hooks are logged and skipped. Tool hooks fire for core
//! tools too; the caller decides where each hook fires, not this module.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::vocab::ToolResult;

/// A registered hook handler and the plugin that owns it.
#[derive(Debug, Clone)]
pub struct RegisteredHooks {
    /// The plugin that registered it.
    pub plugin: String,
    /// The handler.
    pub handler: Arc<dyn HookHandler>,
}

/// Default time limit for one hook handler.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(5);

pub use beige_client::hooks::HookName;

/// What `prePrompt` handlers see: a user's message on its way to the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrePromptEvent {
    /// The user's message, as rewritten by earlier handlers.
    pub message: String,
    /// The session key the prompt runs on, e.g. `telegram:42` or `api:assistant:default`.
    pub session_key: String,
    /// The agent the prompt is for.
    pub agent_name: String,
    /// The channel it came from (`telegram`, `api`, `cli`, …): the first segment of the
    /// session key unless the caller said otherwise.
    pub channel: String,
}

/// `message` replaces the prompt for later handlers and the model; `block` stops it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrePromptResult {
    /// The rewritten message; `None` leaves it as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Stop the prompt: nothing is stored and the model is not called.
    #[serde(default)]
    pub block: bool,
    /// Why it was blocked, sent back to the channel; without one the reason names the
    /// plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What `postResponse` handlers see: the model's final answer, before the exchange is
/// stored and `Done` is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostResponseEvent {
    /// The model's final text, as rewritten by earlier handlers.
    pub response: String,
    /// The session key the prompt ran on.
    pub session_key: String,
    /// The agent that answered.
    pub agent_name: String,
    /// The channel the prompt came from.
    pub channel: String,
}

/// `response` replaces the final text for later handlers and the `done` event; `block`
/// empties it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostResponseResult {
    /// The rewritten answer; `None` leaves it as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Suppress the answer: the `done` event's response is empty (the stored history
    /// keeps the model's text).
    #[serde(default)]
    pub block: bool,
}

/// What `preToolExec` handlers see: a tool call that policy allowed, before it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreToolExecEvent {
    /// `read`, `write`, `patch`, `exec`, or a plugin tool's name.
    pub tool_name: String,
    /// The call's arguments as in the audit log: `[path]` for `read`/`patch`,
    /// `[path, "(N bytes)"]` for `write`, `[command]` for `exec`, a plugin tool's argv.
    pub args: Vec<String>,
    /// The session key of the call; empty for a core-tool call made without a session.
    pub session_key: String,
    /// The agent making the call.
    pub agent_name: String,
}

/// Whether a `preToolExec` handler lets the call run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreToolExecResult {
    /// `false` denies the call; later handlers are not asked.
    pub allow: bool,
    /// Why it was denied, given to the caller as the tool error and audited; without one
    /// the reason names the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl PreToolExecResult {
    /// Let the call run (no reason).
    pub fn allow() -> Self {
        Self {
            allow: true,
            reason: None,
        }
    }
}

/// What `postToolExec` handlers see: a tool call that ran, and its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostToolExecEvent {
    /// `read`, `write`, `patch`, `exec`, or a plugin tool's name.
    pub tool_name: String,
    /// The call's arguments, as in [`PreToolExecEvent::args`].
    pub args: Vec<String>,
    /// The result, as replaced by earlier handlers. For a core tool: the text the model
    /// would read, exit code `0`, or `1` for an error result.
    pub result: ToolResult,
    /// The session key of the call; empty for a core-tool call made without a session.
    pub session_key: String,
    /// The agent that made the call.
    pub agent_name: String,
}

/// What a `postToolExec` handler answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostToolExecResult {
    /// Replaces the result for later handlers and the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResult>,
}

/// What `sessionCreated` and `sessionDisposed` handlers see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEvent {
    /// The session key whose current session was created or disposed of.
    pub session_key: String,
    /// The agent the session belongs to.
    pub agent_name: String,
    /// The channel of the session key.
    pub channel: String,
}

/// What `modelSwitched` handlers see: a model call of a prompt was answered by another
/// candidate than the first (at most once per prompt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelSwitchedEvent {
    /// The session key the prompt runs on.
    pub session_key: String,
    /// The agent whose model switched.
    pub agent_name: String,
    /// The channel the prompt came from.
    pub channel: String,
    /// The prompt's first candidate, as `provider/model` (the session's model override
    /// when set, else the primary).
    pub previous_model: String,
    /// The candidate that answered, as `provider/model`.
    pub new_model: String,
    /// Why: `fallback_rate_limit`, `fallback_timeout` or `fallback_error`.
    pub reason: String,
}

/// A hook handler failed; the message is logged or becomes the block reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// Implemented by plugins that hook into the gateway. Override the hooks you need and
/// list them in [`HookHandler::hooks`]; the defaults pass everything through.
#[async_trait]
pub trait HookHandler: Send + Sync + std::fmt::Debug {
    /// The hooks this handler implements (others are never called).
    fn hooks(&self) -> Vec<HookName>;

    /// Per-handler time limit.
    fn timeout(&self) -> Duration {
        DEFAULT_HOOK_TIMEOUT
    }

    /// `prePrompt`: rewrite or block a message before the model sees it. An `Err`
    /// blocks the prompt.
    async fn pre_prompt(&self, _e: &PrePromptEvent) -> Result<PrePromptResult, HookError> {
        Ok(PrePromptResult::default())
    }
    /// `postResponse`: rewrite or suppress the model's final answer. An `Err` is logged
    /// and skipped.
    async fn post_response(&self, _e: &PostResponseEvent) -> Result<PostResponseResult, HookError> {
        Ok(PostResponseResult::default())
    }
    /// `preToolExec`: allow or deny a tool call policy allowed. An `Err` denies it.
    async fn pre_tool_exec(&self, _e: &PreToolExecEvent) -> Result<PreToolExecResult, HookError> {
        Ok(PreToolExecResult::allow())
    }
    /// `postToolExec`: replace a tool call's result. An `Err` is logged and skipped.
    async fn post_tool_exec(
        &self,
        _e: &PostToolExecEvent,
    ) -> Result<PostToolExecResult, HookError> {
        Ok(PostToolExecResult::default())
    }
    /// `sessionCreated`: a new current session was started for a session key.
    async fn session_created(&self, _e: &SessionEvent) -> Result<(), HookError> {
        Ok(())
    }
    /// `sessionDisposed`: a session key's current session was replaced by a new one.
    async fn session_disposed(&self, _e: &SessionEvent) -> Result<(), HookError> {
        Ok(())
    }
    /// `modelSwitched`: a prompt was answered by a fallback model.
    async fn model_switched(&self, _e: &ModelSwitchedEvent) -> Result<(), HookError> {
        Ok(())
    }
    /// `gatewayStarted`: the gateway was built and every plugin started.
    async fn gateway_started(&self) -> Result<(), HookError> {
        Ok(())
    }
    /// `gatewayShutdown`: the gateway is shutting down; running prompts were cancelled
    /// and plugins are not stopped yet.
    async fn gateway_shutdown(&self) -> Result<(), HookError> {
        Ok(())
    }
}

/// The outcome of `prePrompt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptDecision {
    /// Go on with this (possibly rewritten) message.
    Continue(String),
    /// Stop; the reason goes back to the channel.
    Blocked(String),
}

/// The outcome of `postResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseDecision {
    /// Send this (possibly rewritten) answer.
    Continue(String),
    /// A handler suppressed the answer; the `done` event's response is empty.
    Blocked,
}

/// Runs the registered handlers of each hook, in plugin config order.
#[derive(Debug, Clone, Default)]
pub struct HookRunner {
    handlers: Arc<Vec<RegisteredHooks>>,
}

/// Run `fut` under the handler's time limit, turning a timeout into a [`HookError`].
async fn limited<T>(
    h: &RegisteredHooks,
    hook: HookName,
    fut: impl std::future::Future<Output = Result<T, HookError>>,
) -> Result<T, HookError> {
    let limit = h.handler.timeout();
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(|e| {
            HookError(format!(
                "{} hook of plugin '{}' failed: {e}",
                hook.as_str(),
                h.plugin
            ))
        }),
        Err(_) => Err(HookError(format!(
            "{} hook of plugin '{}' did not answer within {} ms",
            hook.as_str(),
            h.plugin,
            limit.as_millis()
        ))),
    }
}

impl HookRunner {
    /// A runner over these handlers, run in the order given (plugin config order).
    pub fn new(handlers: Vec<RegisteredHooks>) -> Self {
        Self {
            handlers: Arc::new(handlers),
        }
    }

    fn for_hook(&self, hook: HookName) -> impl Iterator<Item = &RegisteredHooks> {
        self.handlers
            .iter()
            .filter(move |h| h.handler.hooks().contains(&hook))
    }

    /// Whether any handler implements `hook`.
    pub fn has(&self, hook: HookName) -> bool {
        self.for_hook(hook).next().is_some()
    }

    /// `prePrompt`: each handler sees the previous one's message; the first block wins;
    /// a failing handler blocks.
    pub async fn pre_prompt(&self, mut event: PrePromptEvent) -> PromptDecision {
        for h in self.for_hook(HookName::PrePrompt) {
            match limited(h, HookName::PrePrompt, h.handler.pre_prompt(&event)).await {
                Ok(r) if r.block => {
                    return PromptDecision::Blocked(r.reason.unwrap_or_else(|| {
                        format!(
                            "Message blocked by the prePrompt hook of plugin '{}'.",
                            h.plugin
                        )
                    }))
                }
                Ok(r) => {
                    if let Some(m) = r.message {
                        event.message = m;
                    }
                }
                Err(e) => {
                    return PromptDecision::Blocked(format!(
                        "{e} (blocked: prePrompt hooks fail closed)"
                    ))
                }
            }
        }
        PromptDecision::Continue(event.message)
    }

    /// `postResponse`: chained like `prePrompt`; a failing handler is logged and skipped.
    pub async fn post_response(&self, mut event: PostResponseEvent) -> ResponseDecision {
        for h in self.for_hook(HookName::PostResponse) {
            match limited(h, HookName::PostResponse, h.handler.post_response(&event)).await {
                Ok(r) if r.block => return ResponseDecision::Blocked,
                Ok(r) => {
                    if let Some(resp) = r.response {
                        event.response = resp;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "postResponse hook skipped"),
            }
        }
        ResponseDecision::Continue(event.response)
    }

    /// `preToolExec`: the first deny wins; a failing handler denies. `Err` carries the
    /// reason given to the caller.
    pub async fn pre_tool_exec(&self, event: &PreToolExecEvent) -> Result<(), String> {
        for h in self.for_hook(HookName::PreToolExec) {
            match limited(h, HookName::PreToolExec, h.handler.pre_tool_exec(event)).await {
                Ok(r) if !r.allow => {
                    return Err(r.reason.unwrap_or_else(|| {
                        format!("Tool call '{}' denied by hook.", event.tool_name)
                    }))
                }
                Ok(_) => {}
                Err(e) => return Err(format!("{e} (denied: preToolExec hooks fail closed)")),
            }
        }
        Ok(())
    }

    /// `postToolExec`: each handler may replace the result; failures are logged.
    pub async fn post_tool_exec(&self, mut event: PostToolExecEvent) -> ToolResult {
        for h in self.for_hook(HookName::PostToolExec) {
            match limited(h, HookName::PostToolExec, h.handler.post_tool_exec(&event)).await {
                Ok(PostToolExecResult { result: Some(r) }) => event.result = r,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "postToolExec hook skipped"),
            }
        }
        event.result
    }

    /// `sessionCreated`: tells each handler of the hook in turn; failures are logged.
    pub async fn session_created(&self, event: &SessionEvent) {
        for h in self.for_hook(HookName::SessionCreated) {
            if let Err(e) = limited(
                h,
                HookName::SessionCreated,
                h.handler.session_created(event),
            )
            .await
            {
                tracing::warn!(error = %e, "sessionCreated hook failed");
            }
        }
    }

    /// `sessionDisposed`: tells each handler of the hook in turn; failures are logged.
    pub async fn session_disposed(&self, event: &SessionEvent) {
        for h in self.for_hook(HookName::SessionDisposed) {
            if let Err(e) = limited(
                h,
                HookName::SessionDisposed,
                h.handler.session_disposed(event),
            )
            .await
            {
                tracing::warn!(error = %e, "sessionDisposed hook failed");
            }
        }
    }

    /// `modelSwitched`: tells each handler of the hook in turn; failures are logged.
    pub async fn model_switched(&self, event: &ModelSwitchedEvent) {
        for h in self.for_hook(HookName::ModelSwitched) {
            if let Err(e) =
                limited(h, HookName::ModelSwitched, h.handler.model_switched(event)).await
            {
                tracing::warn!(error = %e, "modelSwitched hook failed");
            }
        }
    }

    /// `gatewayStarted`: tells each handler of the hook in turn; failures are logged.
    pub async fn gateway_started(&self) {
        for h in self.for_hook(HookName::GatewayStarted) {
            if let Err(e) = limited(h, HookName::GatewayStarted, h.handler.gateway_started()).await
            {
                tracing::warn!(error = %e, "gatewayStarted hook failed");
            }
        }
    }

    /// `gatewayShutdown`: tells each handler of the hook in turn; failures are logged.
    pub async fn gateway_shutdown(&self) {
        for h in self.for_hook(HookName::GatewayShutdown) {
            if let Err(e) =
                limited(h, HookName::GatewayShutdown, h.handler.gateway_shutdown()).await
            {
                tracing::warn!(error = %e, "gatewayShutdown hook failed");
            }
        }
    }
}
