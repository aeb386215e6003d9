//! [`ReloadableGateway`]: the `Gateway` the HTTP channel holds in the daemon. It
//! delegates every call to the current [`LocalGateway`] and lets an in-place restart
//! swap that gateway without the channel noticing.
//!
//! A call takes the current gateway under a read lock and releases the lock before it
//! runs, so long prompts never block a restart; a restart holds the write lock while
//! the old gateway stops and the new one starts, so calls arriving meanwhile wait and
//! then reach the new gateway.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use beige_core::agent::router::ModelHealth;
use beige_core::gateway::{AgentInfo, AllowedModel, SandboxStatus};
use beige_core::hooks::HookName;
use beige_core::llm::Message;
use beige_core::store::{SessionRecord, SessionSettings, SettingsPatch};
use beige_core::tools::{CoreToolCall, ToolContext, ToolOutput};
use beige_core::{
    Admin, AgentEventStream, Gateway, GatewayError, LocalGateway, PromptRequest, Sessions,
};
use tokio::sync::{RwLock, RwLockWriteGuard};

/// A gateway that can be replaced while channels use it.
#[derive(Debug)]
pub struct ReloadableGateway {
    current: RwLock<Arc<LocalGateway>>,
}

impl ReloadableGateway {
    pub fn new(gateway: LocalGateway) -> Self {
        Self {
            current: RwLock::new(Arc::new(gateway)),
        }
    }

    /// The gateway serving now.
    pub async fn current(&self) -> Arc<LocalGateway> {
        self.current.read().await.clone()
    }

    /// Exclusive access for a swap: calls wait until the guard is dropped.
    pub async fn lock(&self) -> RwLockWriteGuard<'_, Arc<LocalGateway>> {
        self.current.write().await
    }
}

#[async_trait]
impl Gateway for ReloadableGateway {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        self.current().await.agents().await
    }

    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        self.current().await.call_tool(agent, call, ctx).await
    }

    async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
        self.current().await.prompt(request).await
    }

    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
        self.current().await.cancel(agent, session_key).await
    }
}

#[async_trait]
impl Sessions for ReloadableGateway {
    async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
        self.current().await.sessions(agent).await
    }

    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.current().await.new_session(agent, session_key).await
    }

    async fn resume_session(
        &self,
        agent: &str,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.current()
            .await
            .resume_session(agent, session_key, session_id)
            .await
    }

    async fn session_messages(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, GatewayError> {
        self.current()
            .await
            .session_messages(agent, session_id)
            .await
    }

    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
        self.current().await.settings(session_key).await
    }

    async fn update_settings(
        &self,
        agent: &str,
        session_key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError> {
        self.current()
            .await
            .update_settings(agent, session_key, patch)
            .await
    }
}

#[async_trait]
impl Admin for ReloadableGateway {
    async fn health(&self) -> Result<HashMap<String, ModelHealth>, GatewayError> {
        self.current().await.health().await
    }

    async fn models(&self, agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
        self.current().await.models(agent).await
    }

    async fn config_summary(&self) -> Result<serde_json::Value, GatewayError> {
        self.current().await.config_summary().await
    }

    async fn run_hook(
        &self,
        agent: &str,
        hook: HookName,
        event: serde_json::Value,
    ) -> Result<serde_json::Value, GatewayError> {
        self.current().await.run_hook(agent, hook, event).await
    }

    async fn sandbox_status(&self, agent: &str) -> Result<SandboxStatus, GatewayError> {
        self.current().await.sandbox_status(agent).await
    }

    async fn disk_status(&self) -> Result<Option<beige_core::disk::DiskStatus>, GatewayError> {
        self.current().await.disk_status().await
    }
}
