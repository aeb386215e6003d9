//! The fake gateway of these tests: beige-client's `testing::FakeGateway` (agents and
//! sessions in memory, prompts answered from scripts, every call that matters recorded)
//! and the builders of its records.

pub use beige_client::testing::{agent, model, session, FakeGateway};

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_client::approvals::{Approval, ApprovalDecision, ApprovalStatus};
use beige_client::session::{SessionRecord, SessionSettings, SettingsPatch};
use beige_client::{
    Admin, AgentEventStream, AgentInfo, AllowedModel, CoreToolCall, Gateway, GatewayError, Message,
    Principal, PromptRequest, Sessions, ToolContext, ToolOutput,
};

/// [`FakeGateway`] plus approvals: the requests it knows, and every decision sent to it
/// (id, decision, approver). A decision on a known request answers it as the gateway
/// would (approved or denied by `api-token`); `refuse` makes every decision fail instead.
#[derive(Debug, Default)]
pub struct ApprovingGateway {
    pub inner: Arc<FakeGateway>,
    pub approvals: Mutex<Vec<Approval>>,
    pub decisions: Mutex<Vec<(String, ApprovalDecision, Principal)>>,
    /// When set, every decision fails with this HTTP status and text.
    pub refuse: Mutex<Option<(u16, String)>>,
}

impl ApprovingGateway {
    pub fn new(inner: Arc<FakeGateway>) -> Self {
        Self {
            inner,
            ..Self::default()
        }
    }
}

#[async_trait]
impl Gateway for ApprovingGateway {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        self.inner.agents().await
    }
    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        self.inner.call_tool(agent, call, ctx).await
    }
    async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
        self.inner.prompt(request).await
    }
    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
        self.inner.cancel(agent, session_key).await
    }
}

#[async_trait]
impl Sessions for ApprovingGateway {
    async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
        self.inner.sessions(agent).await
    }
    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.inner.new_session(agent, session_key).await
    }
    async fn resume_session(
        &self,
        agent: &str,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.inner
            .resume_session(agent, session_key, session_id)
            .await
    }
    async fn session_messages(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, GatewayError> {
        self.inner.session_messages(agent, session_id).await
    }
    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
        self.inner.settings(session_key).await
    }
    async fn update_settings(
        &self,
        agent: &str,
        session_key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError> {
        self.inner.update_settings(agent, session_key, patch).await
    }
}

#[async_trait]
impl Admin for ApprovingGateway {
    async fn models(&self, agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
        self.inner.models(agent).await
    }

    async fn decide_approval(
        &self,
        id: &str,
        decision: ApprovalDecision,
        approver: Principal,
    ) -> Result<Approval, GatewayError> {
        self.decisions
            .lock()
            .unwrap()
            .push((id.to_string(), decision.clone(), approver));
        if let Some((status, message)) = self.refuse.lock().unwrap().clone() {
            return Err(GatewayError::Remote { status, message });
        }
        let mut approvals = self.approvals.lock().unwrap();
        let Some(a) = approvals.iter_mut().find(|a| a.id == id) else {
            return Err(GatewayError::Remote {
                status: 404,
                message: format!("no approval request '{id}'"),
            });
        };
        a.status = match decision.decision {
            beige_client::approvals::Verdict::Approve => ApprovalStatus::Approved,
            beige_client::approvals::Verdict::Deny => ApprovalStatus::Denied,
        };
        a.scope = Some(decision.scope);
        a.decided_by = Some("api-token".into());
        a.decision_reason = decision.reason;
        Ok(a.clone())
    }
}

/// A pending request of `assistant` to run `git push origin main` in `/workspace/repo`.
pub fn approval(id: &str) -> Approval {
    Approval {
        id: id.into(),
        agent: "assistant".into(),
        session: "s_00000000000000aa".into(),
        exec: None,
        tool: "exec".into(),
        args: vec!["git".into(), "push".into(), "origin".into(), "main".into()],
        cwd: Some("/workspace/repo".into()),
        rule: Some("exec git push *".into()),
        justification: Some("pushing publishes the branch to everyone".into()),
        reason: "rule 'exec git push *' asks for approval".into(),
        call_digest: format!("digest-of-{id}"),
        status: ApprovalStatus::Pending,
        requested_at: "2025-01-02T10:00:00Z".into(),
        expires_at: "2025-01-02T10:05:00Z".into(),
        decided_by: None,
        scope: None,
        decision_reason: None,
        joined: 0,
        kind: Default::default(),
        attempts: None,
    }
}
