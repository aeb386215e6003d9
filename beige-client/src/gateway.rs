//! The [`Gateway`] trait — the single entry point every channel and embedder uses — with
//! [`Sessions`] and [`Admin`], their union [`GatewayFull`], the forwarding
//! implementations for `Arc<G>` and `Box<G>`, the [`AgentEventStream`] of a prompt, and
//! the records the traits return ([`AgentInfo`], [`AllowedModel`]).
//!
//! beige-core implements the traits in process (`LocalGateway`), this crate over HTTP
//! (`RemoteGateway`, feature `remote`) and in memory (`testing::FakeGateway`, feature
//! `test-util`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::approvals::{Approval, ApprovalDecision};
use crate::auth::{AuthEvent, Caller, MintedToken, NewToken, TokenInfo};
use crate::error::GatewayError;
use crate::events::AgentEvent;
use crate::hooks::HookName;
use crate::llm::{Message, ModelInfo, ThinkingLevel};
use crate::principal::Principal;
use crate::prompt::PromptRequest;
use crate::schedules::{ScheduleAuthor, ScheduleRun, ScheduleSpec, ScheduleView};
use crate::session::{SessionRecord, SessionSettings, SettingsPatch};
use crate::status::{DiskStatus, ModelHealth, SandboxStatus};
use crate::tools::{AgentToolCall, CoreToolCall, ExecParams, ToolContext, ToolOutput};
use crate::usage::{UsageQuery, UsageReport};

/// What a channel may know about an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    /// The agent's name.
    pub name: String,
    /// `provider/model`.
    pub model: String,
    /// The fallback models, `provider/model`, in order.
    pub fallback_models: Vec<String>,
    /// The plugin tools the agent may call.
    pub tools: Vec<String>,
    /// The agent's skills.
    pub skills: Vec<String>,
    /// The host folder mounted at `/workspace`.
    pub workspace_dir: PathBuf,
    /// The `## Available Tools` block of the system prompt.
    pub tool_context: String,
    /// The `## Available Skills` block of the system prompt.
    pub skill_context: String,
}

/// A model an agent may use, with its catalogue data.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedModel {
    /// The provider's name in the config.
    pub provider: String,
    /// The provider's model id.
    pub model: String,
    /// `primary` or `fallback`.
    pub role: String,
    /// The thinking level configured for it.
    pub thinking_level: ThinkingLevel,
    /// Catalogue data: context window, limits, prices.
    #[serde(flatten)]
    pub info: ModelInfo,
    /// Present while the model cools down or after failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<ModelHealth>,
}

/// What channels and embedders talk to: the agents, a prompt and its events, a core tool
/// call, cancellation. Sessions and administration are the separate traits [`Sessions`]
/// and [`Admin`]; [`GatewayFull`] is all three. Implemented in process by beige-core's
/// `LocalGateway`, over HTTP by `RemoteGateway`; `Arc<G>` and `Box<G>` forward.
#[async_trait]
pub trait Gateway: Send + Sync {
    /// The configured agents, in config order.
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError>;

    /// Run one core tool (`read`, `write`, `patch`, `exec`) in an agent's sandbox, through
    /// the same guarded path the model's calls take (policy, hooks, audit).
    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError>;

    /// Send a message to an agent's session and stream what happens. Dropping the stream
    /// cancels the prompt.
    async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError>;

    /// Cancel the running prompt of a session key; `false` when none was running.
    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError>;

    /// One agent by name; by default looked up in [`Gateway::agents`].
    async fn agent(&self, name: &str) -> Result<AgentInfo, GatewayError> {
        let agents = self.agents().await?;
        let known = agents
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        agents
            .iter()
            .find(|a| a.name == name)
            .cloned()
            .ok_or_else(|| GatewayError::UnknownAgent {
                agent: name.to_string(),
                known,
            })
    }

    /// Run a shell command in an agent's sandbox (the core `exec` tool, default time
    /// limit), through the guarded path.
    async fn exec(&self, agent: &str, command: &str) -> Result<ToolOutput, GatewayError> {
        self.call_tool(
            agent,
            CoreToolCall::Exec(ExecParams {
                command: command.to_string(),
                timeout: None,
            }),
            ToolContext::default(),
        )
        .await
    }
}

/// A plugin tool an agent may use, as an outside client sees it
/// ([`Admin::agent_tools`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AgentTool {
    /// The tool's name (its launcher in `/tools/bin`).
    pub name: String,
    /// The tool's one-line description.
    pub description: String,
    /// Its usage lines (e.g. `kv get <key>`).
    pub commands: Vec<String>,
}

impl AgentTool {
    /// A tool with its description and usage lines.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        commands: Vec<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            commands,
        }
    }
}

/// An MCP server an agent has, with its tools (`beige mcp list`, `GET
/// /api/agents/{name}/mcp`; [`Admin::mcp_servers`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct McpServerView {
    /// The server's name: its command, `/tools/bin/<server>`.
    pub server: String,
    /// `sandbox` (a stdio server run in the agent's sandbox) or `remote` (a URL).
    pub kind: String,
    /// The server's tools, allowed or not, in its order; empty when it did not answer.
    pub tools: Vec<McpToolView>,
    /// Why the server could not list its tools, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One tool of an [`McpServerView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct McpToolView {
    /// The server's name for the tool.
    pub name: String,
    /// Its subcommand (`<server> <command>`).
    pub command: String,
    /// Whether the agent's patterns allow it.
    pub allowed: bool,
    /// The first line of the server's description (its text, not beige's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl McpServerView {
    /// A server and its tools.
    pub fn new(
        server: impl Into<String>,
        kind: impl Into<String>,
        tools: Vec<McpToolView>,
        error: Option<String>,
    ) -> Self {
        Self {
            server: server.into(),
            kind: kind.into(),
            tools,
            error,
        }
    }
}

impl McpToolView {
    /// A tool of a server.
    pub fn new(
        name: impl Into<String>,
        command: impl Into<String>,
        allowed: bool,
        description: Option<String>,
    ) -> Self {
        Self {
            name: name.into(),
            command: command.into(),
            allowed,
            description,
        }
    }
}

/// The sessions of an agent and their settings (`/api/agents/{name}/sessions`, the TUI's
/// session list, Telegram's `/new` and `/resume`).
#[async_trait]
pub trait Sessions: Send + Sync {
    /// The agent's sessions, newest first.
    async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError>;

    /// Start a new session for a key (the old one stays for `resume_session`).
    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError>;

    /// Make an existing session the current one of a key.
    async fn resume_session(
        &self,
        agent: &str,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, GatewayError>;

    /// The messages of a session (the model's context, summaries included).
    async fn session_messages(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, GatewayError>;

    /// Settings of a session key.
    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError>;

    /// Change settings of a session key; a model override must be one of the agent's.
    async fn update_settings(
        &self,
        agent: &str,
        session_key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError>;
}

/// Administration: model health and catalogue, the configuration summary, hooks a
/// channel may trigger, sandbox and disk status. Every method has a default that answers
/// [`GatewayError::Unsupported`] (HTTP 501), so a small gateway implements none of them.
#[async_trait]
pub trait Admin: Send + Sync {
    /// Health of every model that has failed or cooled down.
    async fn health(&self) -> Result<HashMap<String, ModelHealth>, GatewayError> {
        Err(GatewayError::Unsupported { what: "health" })
    }

    /// The models an agent may use (primary first), with catalogue data and health.
    async fn models(&self, _agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
        Err(GatewayError::Unsupported { what: "models" })
    }

    /// Agents and providers without secrets (`GET /api/config`).
    async fn config_summary(&self) -> Result<serde_json::Value, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "config_summary",
        })
    }

    /// Run one of the hooks channels may trigger (`prePrompt`, `postResponse`,
    /// `sessionCreated`, `sessionDisposed`) with a JSON event; returns the hook result
    /// as JSON (`{}` for observers).
    async fn run_hook(
        &self,
        _agent: &str,
        _hook: HookName,
        _event: serde_json::Value,
    ) -> Result<serde_json::Value, GatewayError> {
        Err(GatewayError::Unsupported { what: "run_hook" })
    }

    /// The agent's container and the health of its shim link, with one live keepalive
    /// round trip when the link is up.
    async fn sandbox_status(&self, _agent: &str) -> Result<SandboxStatus, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "sandbox_status",
        })
    }

    /// Free space of the filesystems the gateway and its agents write to, and the agents
    /// the free-space guard pauses; `None` when this gateway has no guard to report.
    async fn disk_status(&self) -> Result<Option<DiskStatus>, GatewayError> {
        Ok(None)
    }

    /// Approval requests the gateway keeps (pending ones and recently settled ones),
    /// newest first; only `agent`'s when given.
    async fn approvals(&self, _agent: Option<&str>) -> Result<Vec<Approval>, GatewayError> {
        Err(GatewayError::Unsupported { what: "approvals" })
    }

    /// Every approval step from now on: requests, decisions, unattended denials.
    async fn approval_events(&self) -> Result<ApprovalEventStream, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "approval_events",
        })
    }

    /// Decide approval request `id` as `approver` (an in-process channel passes the
    /// principal it saw; over HTTP the gateway takes the caller's token instead).
    async fn decide_approval(
        &self,
        _id: &str,
        _decision: ApprovalDecision,
        _approver: Principal,
    ) -> Result<Approval, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "decide_approval",
        })
    }

    /// Totals of the cost ledger (one row per model call), filtered and grouped as
    /// `query` says.
    async fn usage(&self, _query: UsageQuery) -> Result<UsageReport, GatewayError> {
        Err(GatewayError::Unsupported { what: "usage" })
    }

    /// Create a schedule (validated like a config entry: the agent exists, `tools` are
    /// its own, the cron and zone parse); `author` says whose it is.
    async fn add_schedule(
        &self,
        _spec: ScheduleSpec,
        _author: ScheduleAuthor,
    ) -> Result<ScheduleView, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "add_schedule",
        })
    }

    /// Every schedule (of `agent` only, when given), by id.
    async fn schedules(&self, _agent: Option<&str>) -> Result<Vec<ScheduleView>, GatewayError> {
        Err(GatewayError::Unsupported { what: "schedules" })
    }

    /// One schedule; [`GatewayError::UnknownSchedule`] when there is none.
    async fn schedule(&self, _id: &str) -> Result<ScheduleView, GatewayError> {
        Err(GatewayError::Unsupported { what: "schedule" })
    }

    /// Stop a schedule from firing until it is resumed (config schedules too).
    async fn pause_schedule(&self, _id: &str) -> Result<ScheduleView, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "pause_schedule",
        })
    }

    /// Let a paused schedule fire again, from the next instant after now.
    async fn resume_schedule(&self, _id: &str) -> Result<ScheduleView, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "resume_schedule",
        })
    }

    /// Cancel a schedule for good (its history is kept); a config schedule can only be
    /// paused — remove it from the config instead.
    async fn cancel_schedule(&self, _id: &str) -> Result<ScheduleView, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "cancel_schedule",
        })
    }

    /// The latest `limit` runs of a schedule, newest first.
    async fn schedule_history(
        &self,
        _id: &str,
        _limit: usize,
    ) -> Result<Vec<ScheduleRun>, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "schedule_history",
        })
    }

    /// Fire a schedule now, once, outside its timetable; returns the claimed run (it runs
    /// in the background; read it back with [`schedule_history`](Self::schedule_history)).
    async fn run_schedule_now(&self, _id: &str) -> Result<ScheduleRun, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "run_schedule_now",
        })
    }

    /// The gateway's metrics in the Prometheus (OpenMetrics) text format, what
    /// `GET /metrics` answers.
    async fn metrics(&self) -> Result<String, GatewayError> {
        Err(GatewayError::Unsupported { what: "metrics" })
    }

    /// The plugin tools `agent` may use (configured, registered, exposed by the
    /// policy), in config order: what an outside client (the MCP server) lists.
    async fn agent_tools(&self, _agent: &str) -> Result<Vec<AgentTool>, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "agent_tools",
        })
    }

    /// The MCP servers `agent` has and their tools (each server started when it is not
    /// running, so its list is current).
    async fn mcp_servers(&self, _agent: &str) -> Result<Vec<McpServerView>, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "mcp_servers",
        })
    }

    /// Run one of `agent`'s tools for an outside client through the guarded path
    /// (policy, approvals, hooks, audit), as `ctx.principal`; `via` names the client's
    /// connection in the audit record (`mcp:<token id>`). When `cancel` fires while a
    /// core `exec` runs, its processes are killed in the sandbox.
    async fn call_agent_tool(
        &self,
        _agent: &str,
        _call: AgentToolCall,
        _ctx: ToolContext,
        _via: &str,
        _cancel: CancellationToken,
    ) -> Result<ToolOutput, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "call_agent_tool",
        })
    }

    /// Who presents `token` (a personal `bgt_…` token or the gateway's own): the caller
    /// with their roles narrowed by the token's scope, or `None` when it is unknown,
    /// revoked or expired. A failed attempt is audited (`type: "auth"`).
    async fn authenticate(&self, _token: &str) -> Result<Option<Caller>, GatewayError> {
        Ok(None)
    }

    /// Write an `auth` audit record for a channel (a refusal at its edge, a console
    /// login). Failing to write it is logged, never an error of the request.
    async fn audit_auth(&self, _event: AuthEvent) {}

    /// Make a personal API token; its secret is in the answer and nowhere else.
    async fn create_token(&self, _new: NewToken) -> Result<MintedToken, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "create_token",
        })
    }

    /// The personal tokens (of one user, or all), newest first, without secrets.
    async fn tokens(&self, _user: Option<&str>) -> Result<Vec<TokenInfo>, GatewayError> {
        Err(GatewayError::Unsupported { what: "tokens" })
    }

    /// Revoke a token by id: it stops working at once.
    async fn revoke_token(&self, _id: &str) -> Result<TokenInfo, GatewayError> {
        Err(GatewayError::Unsupported {
            what: "revoke_token",
        })
    }
}

/// The approval steps of a gateway, as they happen ([`Admin::approval_events`]).
pub type ApprovalEventStream =
    futures_util::stream::BoxStream<'static, crate::approvals::ApprovalEvent>;

/// Everything a gateway offers: [`Gateway`], [`Sessions`] and [`Admin`]. Implemented for
/// every type that implements the three. (To pass an `Arc<dyn GatewayFull>` where an
/// `Arc<dyn Gateway>` is wanted, wrap it once more: `Arc::new(full)`.)
pub trait GatewayFull: Gateway + Sessions + Admin {}

impl<T: Gateway + Sessions + Admin + ?Sized> GatewayFull for T {}

/// `Arc<G>` and `Box<G>` are gateways when `G` is: one forwarding implementation
/// per trait, so wrappers need no 15-method forwarder.
macro_rules! forward_gateway {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<G: Gateway + ?Sized> Gateway for $ptr {
            async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
                (**self).agents().await
            }
            async fn call_tool(
                &self,
                agent: &str,
                call: CoreToolCall,
                ctx: ToolContext,
            ) -> Result<ToolOutput, GatewayError> {
                (**self).call_tool(agent, call, ctx).await
            }
            async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
                (**self).prompt(request).await
            }
            async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
                (**self).cancel(agent, session_key).await
            }
            async fn agent(&self, name: &str) -> Result<AgentInfo, GatewayError> {
                (**self).agent(name).await
            }
            async fn exec(&self, agent: &str, command: &str) -> Result<ToolOutput, GatewayError> {
                (**self).exec(agent, command).await
            }
        }

        #[async_trait]
        impl<G: Sessions + ?Sized> Sessions for $ptr {
            async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
                (**self).sessions(agent).await
            }
            async fn new_session(&self, agent: &str, session_key: &str) -> Result<SessionRecord, GatewayError> {
                (**self).new_session(agent, session_key).await
            }
            async fn resume_session(
                &self,
                agent: &str,
                session_key: &str,
                session_id: &str,
            ) -> Result<SessionRecord, GatewayError> {
                (**self).resume_session(agent, session_key, session_id).await
            }
            async fn session_messages(&self, agent: &str, session_id: &str) -> Result<Vec<Message>, GatewayError> {
                (**self).session_messages(agent, session_id).await
            }
            async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
                (**self).settings(session_key).await
            }
            async fn update_settings(
                &self,
                agent: &str,
                session_key: &str,
                patch: SettingsPatch,
            ) -> Result<SessionSettings, GatewayError> {
                (**self).update_settings(agent, session_key, patch).await
            }
        }

        #[async_trait]
        impl<G: Admin + ?Sized> Admin for $ptr {
            async fn health(&self) -> Result<HashMap<String, ModelHealth>, GatewayError> {
                (**self).health().await
            }
            async fn models(&self, agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
                (**self).models(agent).await
            }
            async fn config_summary(&self) -> Result<serde_json::Value, GatewayError> {
                (**self).config_summary().await
            }
            async fn run_hook(
                &self,
                agent: &str,
                hook: HookName,
                event: serde_json::Value,
            ) -> Result<serde_json::Value, GatewayError> {
                (**self).run_hook(agent, hook, event).await
            }
            async fn sandbox_status(&self, agent: &str) -> Result<SandboxStatus, GatewayError> {
                (**self).sandbox_status(agent).await
            }
            async fn disk_status(&self) -> Result<Option<DiskStatus>, GatewayError> {
                (**self).disk_status().await
            }
            async fn approvals(&self, agent: Option<&str>) -> Result<Vec<Approval>, GatewayError> {
                (**self).approvals(agent).await
            }
            async fn approval_events(&self) -> Result<ApprovalEventStream, GatewayError> {
                (**self).approval_events().await
            }
            async fn decide_approval(
                &self,
                id: &str,
                decision: ApprovalDecision,
                approver: Principal,
            ) -> Result<Approval, GatewayError> {
                (**self).decide_approval(id, decision, approver).await
            }
            async fn usage(&self, query: UsageQuery) -> Result<UsageReport, GatewayError> {
                (**self).usage(query).await
            }
            async fn add_schedule(
                &self,
                spec: ScheduleSpec,
                author: ScheduleAuthor,
            ) -> Result<ScheduleView, GatewayError> {
                (**self).add_schedule(spec, author).await
            }
            async fn schedules(&self, agent: Option<&str>) -> Result<Vec<ScheduleView>, GatewayError> {
                (**self).schedules(agent).await
            }
            async fn schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
                (**self).schedule(id).await
            }
            async fn pause_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
                (**self).pause_schedule(id).await
            }
            async fn resume_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
                (**self).resume_schedule(id).await
            }
            async fn cancel_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
                (**self).cancel_schedule(id).await
            }
            async fn schedule_history(
                &self,
                id: &str,
                limit: usize,
            ) -> Result<Vec<ScheduleRun>, GatewayError> {
                (**self).schedule_history(id, limit).await
            }
            async fn run_schedule_now(&self, id: &str) -> Result<ScheduleRun, GatewayError> {
                (**self).run_schedule_now(id).await
            }
            async fn metrics(&self) -> Result<String, GatewayError> {
                (**self).metrics().await
            }
            async fn agent_tools(&self, agent: &str) -> Result<Vec<AgentTool>, GatewayError> {
                (**self).agent_tools(agent).await
            }
            async fn mcp_servers(
                &self,
                agent: &str,
            ) -> Result<Vec<McpServerView>, GatewayError> {
                (**self).mcp_servers(agent).await
            }
            async fn call_agent_tool(
                &self,
                agent: &str,
                call: AgentToolCall,
                ctx: ToolContext,
                via: &str,
                cancel: CancellationToken,
            ) -> Result<ToolOutput, GatewayError> {
                (**self).call_agent_tool(agent, call, ctx, via, cancel).await
            }
            async fn authenticate(&self, token: &str) -> Result<Option<Caller>, GatewayError> {
                (**self).authenticate(token).await
            }
            async fn audit_auth(&self, event: AuthEvent) {
                (**self).audit_auth(event).await
            }
            async fn create_token(&self, new: NewToken) -> Result<MintedToken, GatewayError> {
                (**self).create_token(new).await
            }
            async fn tokens(&self, user: Option<&str>) -> Result<Vec<TokenInfo>, GatewayError> {
                (**self).tokens(user).await
            }
            async fn revoke_token(&self, id: &str) -> Result<TokenInfo, GatewayError> {
                (**self).revoke_token(id).await
            }
        }
    )*};
}

forward_gateway!(Arc<G>, Box<G>);

/// The events of one prompt. Dropping it cancels the prompt.
pub struct AgentEventStream {
    rx: tokio::sync::mpsc::UnboundedReceiver<AgentEvent>,
    cancel: CancellationToken,
}

impl AgentEventStream {
    /// A stream fed by `rx`; `cancel` fires when the stream is dropped.
    pub fn new(
        rx: tokio::sync::mpsc::UnboundedReceiver<AgentEvent>,
        cancel: CancellationToken,
    ) -> Self {
        Self { rx, cancel }
    }

    /// Wait for the whole prompt and return its events.
    pub async fn collect_all(mut self) -> Vec<AgentEvent> {
        let mut out = Vec::new();
        while let Some(e) = self.rx.recv().await {
            out.push(e);
        }
        out
    }
}

impl std::fmt::Debug for AgentEventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentEventStream")
    }
}

impl futures_util::Stream for AgentEventStream {
    type Item = AgentEvent;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<AgentEvent>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for AgentEventStream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
