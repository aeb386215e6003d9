//! The gateway seams as an implementer sees them: a small gateway of its own that
//! implements only the four required methods of `Gateway`, the `Sessions` methods and an
//! empty `Admin`, used through `Arc`/`Box` forwarding, as `Arc<dyn GatewayFull>` and behind
//! the real HTTP API router. No Docker: nothing here runs a sandbox.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use beige_core::api::tools::{ContentBlock, CoreToolCall, ToolContext, ToolOutput};
use beige_core::channel::http::{router, ApiState};
use beige_core::llm::Message;
use beige_core::store::{SessionRecord, SessionSettings, SettingsPatch};
use beige_core::AgentInfo;
use beige_core::{
    Admin, AgentEventStream, Gateway, GatewayError, GatewayFull, PromptRequest, Sessions,
};
use tower::ServiceExt;

/// A gateway with one agent, `echo`, whose `exec` answers with the command it got.
#[derive(Debug, Default)]
struct EchoGateway {
    calls: Mutex<Vec<String>>,
}

#[async_trait]
impl Gateway for EchoGateway {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        Ok(vec![AgentInfo {
            name: "echo".into(),
            model: "none/none".into(),
            fallback_models: vec![],
            tools: vec![],
            skills: vec![],
            workspace_dir: "/nowhere".into(),
            tool_context: String::new(),
            skill_context: String::new(),
        }])
    }

    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        _ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        let CoreToolCall::Exec(p) = call else {
            return Ok(ToolOutput::error("only exec"));
        };
        self.calls
            .lock()
            .unwrap()
            .push(format!("{agent}: {}", p.command));
        Ok(ToolOutput::text(format!("ran {}", p.command)))
    }

    async fn prompt(&self, _request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
        Err(GatewayError::Unsupported { what: "prompt" })
    }

    async fn cancel(&self, _agent: &str, _session_key: &str) -> Result<bool, GatewayError> {
        Ok(false)
    }
}

#[async_trait]
impl Sessions for EchoGateway {
    async fn sessions(&self, _agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
        Ok(vec![])
    }
    async fn new_session(&self, agent: &str, _key: &str) -> Result<SessionRecord, GatewayError> {
        Err(GatewayError::UnknownSession {
            agent: agent.into(),
            session: "new".into(),
        })
    }
    async fn resume_session(
        &self,
        agent: &str,
        _key: &str,
        id: &str,
    ) -> Result<SessionRecord, GatewayError> {
        Err(GatewayError::UnknownSession {
            agent: agent.into(),
            session: id.into(),
        })
    }
    async fn session_messages(
        &self,
        _agent: &str,
        _id: &str,
    ) -> Result<Vec<Message>, GatewayError> {
        Ok(vec![])
    }
    async fn settings(&self, _key: &str) -> Result<SessionSettings, GatewayError> {
        Ok(SessionSettings::default())
    }
    async fn update_settings(
        &self,
        _agent: &str,
        _key: &str,
        _patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError> {
        Ok(SessionSettings::default())
    }
}

/// Nothing of administration: every method keeps its default.
#[async_trait]
impl Admin for EchoGateway {}

fn text(out: &ToolOutput) -> String {
    out.content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn defaulted_methods_and_forwarding_work_for_a_gateway_of_ones_own() {
    let gw = Arc::new(EchoGateway::default());
    // The defaulted `agent` and `exec` are built on the required four.
    assert_eq!(gw.agent("echo").await.unwrap().name, "echo");
    match gw.agent("other").await.unwrap_err() {
        GatewayError::UnknownAgent { agent, known } => {
            assert_eq!((agent.as_str(), known.as_str()), ("other", "echo"));
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(text(&gw.exec("echo", "true").await.unwrap()), "ran true");
    // Through `Arc`, `Box` and a trait object, the same gateway answers.
    let full: Arc<dyn GatewayFull> = gw.clone();
    let boxed: Box<dyn GatewayFull> = Box::new(gw.clone());
    assert_eq!(text(&full.exec("echo", "one").await.unwrap()), "ran one");
    assert_eq!(text(&boxed.exec("echo", "two").await.unwrap()), "ran two");
    let only_gateway: Arc<dyn Gateway> = Arc::new(full.clone());
    assert_eq!(only_gateway.agents().await.unwrap().len(), 1);
    assert_eq!(
        *gw.calls.lock().unwrap(),
        ["echo: true", "echo: one", "echo: two"]
    );
    // Administration left at its defaults says so, by name.
    for e in [
        full.health().await.map(|_| ()).unwrap_err(),
        full.models("echo").await.map(|_| ()).unwrap_err(),
        full.config_summary().await.map(|_| ()).unwrap_err(),
        full.sandbox_status("echo").await.map(|_| ()).unwrap_err(),
    ] {
        assert!(matches!(e, GatewayError::Unsupported { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("this gateway does not support "),
            "{e}"
        );
    }
    assert!(full.disk_status().await.unwrap().is_none());
    assert!(full.sessions("echo").await.unwrap().is_empty());
}

#[tokio::test]
async fn the_http_api_serves_a_gateway_of_ones_own_and_answers_501_for_what_it_lacks() {
    let gw: Arc<dyn GatewayFull> = Arc::new(EchoGateway::default());
    let app = router(ApiState::new(gw, Some("t0ken".into())));
    let get = |path: &str| {
        Request::builder()
            .uri(path)
            .header(header::HOST, "localhost:7433")
            .header(header::AUTHORIZATION, "Bearer t0ken")
            .body(Body::empty())
            .unwrap()
    };
    let agents = app.clone().oneshot(get("/api/agents")).await.unwrap();
    assert_eq!(agents.status(), StatusCode::OK);
    let body = axum::body::to_bytes(agents.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&body).contains("\"echo\""));
    let models = app.oneshot(get("/api/health/models")).await.unwrap();
    assert_eq!(models.status(), StatusCode::NOT_IMPLEMENTED);
    let body = axum::body::to_bytes(models.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&body).contains("does not support health"),
        "{}",
        String::from_utf8_lossy(&body)
    );
}
