//! The Docker backend's tool endpoint: one [`SocketServer`] per agent on
//! `run/<agent>/gateway.sock` (mounted at `/beige/run/` in its container), where the
//! `/tools/bin/<tool>` launchers send their calls. The agent is the socket's, never a
//! request's, and the calling exec is the one the host's `/proc` view of the peer
//! leads to (the host's [`crate::ident::ExecRegistry`]); every call, refusal and bound
//! reached goes to the [`SandboxHost`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use beige_protocol::socket::{ToolRequest, ToolResponse};

use crate::home::BeigeHome;
use crate::ident::Attribution;
use crate::sandbox::{SandboxError, SandboxHost, SandboxSpec, SecurityEvent};
use crate::socket::{DescriptorBudget, Limit, SocketLimits, SocketServer, ToolRequestHandler};

/// The running endpoints, by agent.
#[derive(Debug, Default)]
pub(super) struct Endpoints {
    servers: Mutex<HashMap<String, SocketServer>>,
}

impl Endpoints {
    /// Serve every agent of `specs` (replacing what was served before) within `limits`,
    /// shared out by [`socket_bounds`].
    pub(super) fn start(
        &self,
        home: &BeigeHome,
        specs: &[SandboxSpec],
        limits: SocketLimits,
        host: Arc<dyn SandboxHost>,
    ) -> Result<(), SandboxError> {
        // The old servers go first: dropping one unlinks its path, which the new one
        // binds.
        self.stop();
        let execs = host.exec_registry();
        let handler: Arc<dyn ToolRequestHandler> = Arc::new(ToHost(host));
        let (limits, descriptors) = socket_bounds(limits, specs.len());
        let mut started = HashMap::new();
        for spec in specs {
            let path = home.socket_path(&spec.agent);
            let server = SocketServer::start(
                &spec.agent,
                &path,
                handler.clone(),
                limits,
                descriptors.clone(),
                execs.clone(),
            )
            .map_err(|source| SandboxError::ToolEndpoint { path, source })?;
            started.insert(spec.agent.clone(), server);
        }
        *self.servers.lock().unwrap_or_else(PoisonError::into_inner) = started;
        Ok(())
    }

    /// Stop serving (the socket files are removed).
    pub(super) fn stop(&self) {
        self.servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// Raise the descriptor limit, take the process's socket budget (the limit minus the
/// reserve) and give each agent at most an equal share of it, so that one agent's
/// connections can never starve another's.
fn socket_bounds(limits: SocketLimits, agents: usize) -> (SocketLimits, Arc<DescriptorBudget>) {
    let nofile = match crate::socket::raise_nofile_limit() {
        Ok(l) => l,
        Err(e) => {
            let l = crate::socket::nofile_limit();
            tracing::warn!(error = %e, limit = %l, "could not raise the descriptor limit (ulimit -n) to its hard limit");
            l
        }
    };
    let descriptors = DescriptorBudget::process(limits.fd_reserve);
    let share = (descriptors.max() / agents.max(1)).saturating_sub(1).max(1);
    let limits = SocketLimits {
        max_connections: limits.max_connections.min(share),
        ..limits
    };
    tracing::info!(
        limit = %nofile,
        sockets = descriptors.max(),
        per_agent = limits.max_connections,
        "descriptors: the tool sockets use at most {} of the limit, {} connections per agent",
        descriptors.max(),
        limits.max_connections
    );
    (limits, descriptors)
}

/// A socket's requests, refusals and bounds, passed to the host.
struct ToHost(Arc<dyn SandboxHost>);

#[async_trait]
impl ToolRequestHandler for ToHost {
    async fn handle(
        &self,
        agent: &str,
        caller: &Attribution,
        request: ToolRequest,
    ) -> ToolResponse {
        self.0.tool_call(agent, caller, request).await
    }

    async fn rejected(&self, agent: &str, tool: Option<&str>, error: &str, raw: &[u8]) {
        self.0.rejected(agent, tool, error, raw).await;
    }

    async fn limit_reached(&self, agent: &str, limit: Limit, message: &str) {
        self.0
            .security_event(SecurityEvent::ToolEndpointLimit {
                agent: agent.to_string(),
                limit: limit.as_str().to_string(),
                message: message.to_string(),
            })
            .await;
    }
}
