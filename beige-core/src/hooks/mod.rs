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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrePromptEvent {
    pub message: String,
    pub session_key: String,
    pub agent_name: String,
    pub channel: String,
}

/// `message` replaces the prompt for later handlers and the model; `block` stops it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrePromptResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default)]
    pub block: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostResponseEvent {
    pub response: String,
    pub session_key: String,
    pub agent_name: String,
    pub channel: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostResponseResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    #[serde(default)]
    pub block: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreToolExecEvent {
    pub tool_name: String,
    pub args: Vec<String>,
    pub session_key: String,
    pub agent_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreToolExecResult {
    pub allow: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl PreToolExecResult {
    pub fn allow() -> Self {
        Self {
            allow: true,
            reason: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostToolExecEvent {
    pub tool_name: String,
    pub args: Vec<String>,
    pub result: ToolResult,
    pub session_key: String,
    pub agent_name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostToolExecResult {
    /// Replaces the result for later handlers and the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEvent {
    pub session_key: String,
    pub agent_name: String,
    pub channel: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelSwitchedEvent {
    pub session_key: String,
    pub agent_name: String,
    pub channel: String,
    pub previous_model: String,
    pub new_model: String,
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

    async fn pre_prompt(&self, _e: &PrePromptEvent) -> Result<PrePromptResult, HookError> {
        Ok(PrePromptResult::default())
    }
    async fn post_response(&self, _e: &PostResponseEvent) -> Result<PostResponseResult, HookError> {
        Ok(PostResponseResult::default())
    }
    async fn pre_tool_exec(&self, _e: &PreToolExecEvent) -> Result<PreToolExecResult, HookError> {
        Ok(PreToolExecResult::allow())
    }
    async fn post_tool_exec(
        &self,
        _e: &PostToolExecEvent,
    ) -> Result<PostToolExecResult, HookError> {
        Ok(PostToolExecResult::default())
    }
    async fn session_created(&self, _e: &SessionEvent) -> Result<(), HookError> {
        Ok(())
    }
    async fn session_disposed(&self, _e: &SessionEvent) -> Result<(), HookError> {
        Ok(())
    }
    async fn model_switched(&self, _e: &ModelSwitchedEvent) -> Result<(), HookError> {
        Ok(())
    }
    async fn gateway_started(&self) -> Result<(), HookError> {
        Ok(())
    }
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
    Continue(String),
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

    pub async fn model_switched(&self, event: &ModelSwitchedEvent) {
        for h in self.for_hook(HookName::ModelSwitched) {
            if let Err(e) =
                limited(h, HookName::ModelSwitched, h.handler.model_switched(event)).await
            {
                tracing::warn!(error = %e, "modelSwitched hook failed");
            }
        }
    }

    pub async fn gateway_started(&self) {
        for h in self.for_hook(HookName::GatewayStarted) {
            if let Err(e) = limited(h, HookName::GatewayStarted, h.handler.gateway_started()).await
            {
                tracing::warn!(error = %e, "gatewayStarted hook failed");
            }
        }
    }

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
