//! Tool calls of outside clients (the MCP server, `mcp::serve`): the plugin tools an
//! agent may use, and one call of a core or plugin tool through the guarded path with
//! the client's principal and connection (`via`) in the audit records.

use beige_client::{AgentTool, AgentToolCall};
use tokio_util::sync::CancellationToken;

use super::{CallMeta, Guarded, Inner, SessionOrigin, DEFAULT_TOOL_TIMEOUT};
use crate::audit::Target;
use crate::plugin::{SessionInfo, ToolCall, ToolResult};
use crate::policy::ToolKind;
use crate::tools::{ContentBlock, ToolContext, ToolOutcome, ToolOutput};
use crate::GatewayError;

pub(crate) use crate::principal::audit_name as principal_name;

impl Inner {
    /// The plugin tools `agent` may use: in its `tools`, registered, and exposed by the
    /// policy (what the system prompt describes to the model).
    pub(super) async fn outside_tools(&self, agent: &str) -> Result<Vec<AgentTool>, GatewayError> {
        let config = self.agent(agent)?;
        let mut tools = Vec::new();
        for name in &config.tools {
            let Some(registered) = self.registry.tool(name) else {
                continue;
            };
            if !self.policy.exposes(agent, name).await {
                continue;
            }
            tools.push(AgentTool::new(
                registered.tool.name(),
                registered.tool.description(),
                registered.tool.commands(),
            ));
        }
        Ok(tools)
    }

    /// One call of an outside client: a core tool (cancellable: `cancel` kills a
    /// running exec) or a plugin tool, as `ctx.principal`, recorded with `via`.
    pub(super) async fn call_agent_tool(
        &self,
        agent: &str,
        call: AgentToolCall,
        ctx: ToolContext,
        via: &str,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, GatewayError> {
        match call {
            AgentToolCall::Core(call) => {
                self.call_core_via(agent, call, ctx, Some(&cancel), None, Some(via.to_string()))
                    .await
            }
            AgentToolCall::Plugin { tool, args, stdin } => {
                // Dropped with the call: a plugin handler runs in the gateway.
                tokio::select! {
                    out = self.call_plugin_via(agent, tool, args, stdin, ctx, via) => out,
                    _ = cancel.cancelled() => Ok(ToolOutput::error(
                        "[beige] Cancelled by the client before the tool finished.",
                    )
                    .with_outcome(ToolOutcome::Failed)),
                }
            }
            _ => Err(GatewayError::Unsupported {
                what: "this kind of tool call",
            }),
        }
    }

    /// A plugin tool called by an outside client: policy, approvals, hooks and audit as
    /// for a script's call, in the client's session (never the sandbox's).
    async fn call_plugin_via(
        &self,
        agent: &str,
        tool: String,
        args: Vec<String>,
        stdin: Option<Vec<u8>>,
        ctx: ToolContext,
        via: &str,
    ) -> Result<ToolOutput, GatewayError> {
        self.agent(agent)?;
        let key = ctx
            .session_key
            .clone()
            .unwrap_or_else(|| format!("{}:{agent}", ctx.channel.as_deref().unwrap_or("api")));
        let channel = ctx
            .channel
            .clone()
            .unwrap_or_else(|| SessionOrigin::of_key(agent, &key).channel);
        self.record_session(
            &key,
            SessionOrigin {
                agent: agent.to_string(),
                channel: channel.clone(),
                chat_id: None,
                thread_id: None,
            },
            false,
        );
        let meta = CallMeta {
            agent,
            tool: &tool,
            kind: ToolKind::Plugin,
            args: args.clone(),
            session: Some(key.clone()),
            channel: Some(channel.clone()),
            via: Some(via.to_string()),
            model: None,
            principal: ctx.principal.clone(),
            target: Target::Gateway,
            unattended: (!ctx.attended)
                .then(|| super::unattended_origin(Some(&channel), Some(&key))),
            cwd: None,
            stdin_sha256: stdin
                .as_deref()
                .map(|b| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b))),
            exec: None,
            attribution: None,
        };
        let registered = self.registry.tool(&tool).cloned();
        let config = self.registry.call_config(&self.config, agent, &tool);
        let workspace = self.config.agent_workspace(&self.home, agent);
        let session = SessionInfo {
            agent: agent.to_string(),
            key: key.clone(),
            channel,
            chat_id: None,
            thread_id: None,
        };
        let name = tool.clone();
        let run = async move {
            let Some(registered) = registered else {
                return Ok(ToolResult::fail(format!("Unknown tool: {name}"), 1));
            };
            let limit = registered.tool.timeout().unwrap_or(DEFAULT_TOOL_TIMEOUT);
            let call = ToolCall {
                tool: name.clone(),
                args,
                stdin,
                cwd: None,
                workspace,
                session,
                config,
                exec: None,
            };
            match tokio::time::timeout(limit, registered.tool.call(call)).await {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(e)) => Err(format!("tool '{name}' failed: {e}")),
                Err(_) => Ok(ToolResult::fail(
                    format!(
                        "tool '{name}' did not finish within {} s and was stopped",
                        limit.as_secs()
                    ),
                    124,
                )),
            }
        };
        let guarded = self
            .guarded(
                meta,
                run,
                ToolResult::clone,
                |r: &ToolResult| (r.exit_code, r.output.len() as u64),
                |_, r| r,
            )
            .await?;
        Ok(match guarded {
            Guarded::Ran(mut result) => {
                super::truncate_output(&mut result.output);
                let failed = result.exit_code != 0;
                let mut text = result.output;
                if failed {
                    text.push_str(&format!("\n[exit code {}]", result.exit_code));
                }
                ToolOutput::new(vec![ContentBlock::Text { text }], failed)
                    .with_outcome(ToolOutcome::Ran)
            }
            Guarded::Denied(r) => ToolOutput::error(r.message).with_outcome(ToolOutcome::Denied),
            Guarded::Failed(message) => {
                ToolOutput::error(message).with_outcome(ToolOutcome::Failed)
            }
        })
    }
}
