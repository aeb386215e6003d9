//! A fake [`Gateway`]: agents and sessions in memory, prompts answered from scripts,
//! every call that matters recorded (prompts, cancels, resumes, settings).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use beige_core::agent::events::AgentEvent;
use beige_core::agent::router::ModelHealth;
use beige_core::config::{LinkMode, ThinkingLevel};
use beige_core::gateway::{
    Admin, AgentEventStream, AgentInfo, AllowedModel, Gateway, GatewayError, PromptRequest,
    SandboxStatus, Sessions,
};
use beige_core::hooks::HookName;
use beige_core::llm::catalog::ModelInfo;
use beige_core::llm::{Message, Usage};
use beige_core::sandbox::LinkStatus;
use beige_core::store::{SessionRecord, SessionSettings, SettingsPatch};
use beige_core::tools::{CoreToolCall, ToolContext, ToolOutput};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio_util::sync::CancellationToken;

pub fn agent(name: &str, model: &str, fallbacks: &[&str]) -> AgentInfo {
    AgentInfo {
        name: name.into(),
        model: model.into(),
        fallback_models: fallbacks.iter().map(|s| s.to_string()).collect(),
        tools: vec!["kv".into()],
        skills: Vec::new(),
        workspace_dir: PathBuf::from("/tmp/ws"),
        tool_context: String::new(),
        skill_context: String::new(),
    }
}

pub fn model(key: &str, role: &str) -> AllowedModel {
    let (provider, model) = key.split_once('/').unwrap();
    AllowedModel {
        provider: provider.into(),
        model: model.into(),
        role: role.into(),
        thinking_level: ThinkingLevel::Off,
        info: ModelInfo {
            id: model.into(),
            context_window: 200_000,
            max_output_tokens: 8192,
            images: true,
            reasoning: false,
            cost_input: 3.0,
            cost_output: 15.0,
        },
        health: None,
    }
}

pub fn session(
    id: &str,
    agent: &str,
    key: &str,
    title: Option<&str>,
    created: i64,
    count: u64,
) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        agent: agent.into(),
        key: key.into(),
        parent_id: None,
        title: title.map(str::to_string),
        model: Some("anthropic/claude-sonnet-4-5".into()),
        created,
        updated: created,
        message_count: count,
        usage: Usage {
            input_tokens: 1200,
            output_tokens: 340,
            ..Usage::default()
        },
    }
}

/// How a scripted prompt answers.
#[derive(Debug, Clone)]
pub struct Script {
    pub events: Vec<AgentEvent>,
    /// Keep the stream open after the events (until `cancel`).
    pub hold: bool,
}

#[derive(Debug, Default)]
pub struct FakeGateway {
    pub agents: Mutex<Vec<AgentInfo>>,
    pub models: Mutex<HashMap<String, Vec<AllowedModel>>>,
    pub sessions: Mutex<HashMap<String, Vec<SessionRecord>>>,
    pub messages: Mutex<HashMap<String, Vec<Message>>>,
    pub settings: Mutex<HashMap<String, SessionSettings>>,
    pub scripts: Mutex<VecDeque<Script>>,
    pub prompts: Mutex<Vec<PromptRequest>>,
    pub cancels: Mutex<Vec<(String, String)>>,
    pub resumed: Mutex<Vec<(String, String, String)>>,
    pub created: Mutex<Vec<(String, String)>>,
    pub open: Mutex<Option<UnboundedSender<AgentEvent>>>,
    pub down: AtomicBool,
}

impl FakeGateway {
    /// Two agents (`assistant` with a fallback model, `coder`), no sessions.
    pub fn new() -> Self {
        let g = FakeGateway::default();
        *g.agents.lock().unwrap() = vec![
            agent(
                "assistant",
                "anthropic/claude-sonnet-4-5",
                &["openai/gpt-4o"],
            ),
            agent("coder", "openai/gpt-4o", &[]),
        ];
        g.models.lock().unwrap().insert(
            "assistant".into(),
            vec![
                model("anthropic/claude-sonnet-4-5", "primary"),
                model("openai/gpt-4o", "fallback"),
            ],
        );
        g.models
            .lock()
            .unwrap()
            .insert("coder".into(), vec![model("openai/gpt-4o", "primary")]);
        g
    }

    pub fn script(&self, events: Vec<AgentEvent>, hold: bool) {
        self.scripts
            .lock()
            .unwrap()
            .push_back(Script { events, hold });
    }

    pub fn add_session(&self, record: SessionRecord, messages: Vec<Message>) {
        self.messages
            .lock()
            .unwrap()
            .insert(record.id.clone(), messages);
        let mut s = self.sessions.lock().unwrap();
        let list = s.entry(record.agent.clone()).or_default();
        list.push(record);
        list.sort_by_key(|s| std::cmp::Reverse(s.created));
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), GatewayError> {
        if self.down.load(Ordering::SeqCst) {
            Err(GatewayError::Unreachable {
                url: "http://127.0.0.1:7433".into(),
                message: "connection refused".into(),
            })
        } else {
            Ok(())
        }
    }

    fn unknown_agent(&self, agent: &str) -> Result<(), GatewayError> {
        let agents = self.agents.lock().unwrap();
        if agents.iter().any(|a| a.name == agent) {
            Ok(())
        } else {
            Err(GatewayError::UnknownAgent {
                agent: agent.into(),
                known: agents
                    .iter()
                    .map(|a| a.name.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }
    }
}

#[async_trait]
impl Gateway for FakeGateway {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        self.check()?;
        Ok(self.agents.lock().unwrap().clone())
    }

    async fn call_tool(
        &self,
        _agent: &str,
        _call: CoreToolCall,
        _ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        self.check()?;
        Ok(ToolOutput::text("ok"))
    }

    async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
        self.check()?;
        self.unknown_agent(&request.agent)?;
        self.prompts.lock().unwrap().push(request);
        let script = self.scripts.lock().unwrap().pop_front().unwrap_or(Script {
            events: vec![AgentEvent::Done {
                response: String::new(),
                session_id: "s_0000000000000001".into(),
                usage: Usage::default(),
            }],
            hold: false,
        });
        let (tx, rx) = unbounded_channel();
        for e in script.events {
            tx.send(e).unwrap();
        }
        if script.hold {
            *self.open.lock().unwrap() = Some(tx);
        }
        Ok(AgentEventStream::new(rx, CancellationToken::new()))
    }

    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
        self.check()?;
        self.cancels
            .lock()
            .unwrap()
            .push((agent.into(), session_key.into()));
        match self.open.lock().unwrap().take() {
            Some(tx) => {
                let _ = tx.send(AgentEvent::Error {
                    message: "cancelled".into(),
                    kind: None,
                    hint: None,
                });
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl Sessions for FakeGateway {
    async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
        self.check()?;
        self.unknown_agent(agent)?;
        Ok(self
            .sessions
            .lock()
            .unwrap()
            .get(agent)
            .cloned()
            .unwrap_or_default())
    }

    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.check()?;
        self.created
            .lock()
            .unwrap()
            .push((agent.into(), session_key.into()));
        let n = self.created.lock().unwrap().len();
        let record = session(
            &format!("s_new{n:013}"),
            agent,
            session_key,
            None,
            2_000_000_000_000 + n as i64,
            0,
        );
        let record = SessionRecord {
            usage: Usage::default(),
            ..record
        };
        self.add_session(record.clone(), Vec::new());
        Ok(record)
    }

    async fn resume_session(
        &self,
        agent: &str,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.check()?;
        self.resumed
            .lock()
            .unwrap()
            .push((agent.into(), session_key.into(), session_id.into()));
        self.sessions
            .lock()
            .unwrap()
            .get(agent)
            .and_then(|l| l.iter().find(|s| s.id == session_id).cloned())
            .ok_or_else(|| GatewayError::UnknownSession {
                agent: agent.into(),
                session: session_id.into(),
            })
    }

    async fn session_messages(
        &self,
        _agent: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, GatewayError> {
        self.check()?;
        Ok(self
            .messages
            .lock()
            .unwrap()
            .get(session_id)
            .cloned()
            .unwrap_or_default())
    }

    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
        self.check()?;
        Ok(self
            .settings
            .lock()
            .unwrap()
            .get(session_key)
            .cloned()
            .unwrap_or_default())
    }

    async fn update_settings(
        &self,
        agent: &str,
        session_key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError> {
        self.check()?;
        if let Some(Some(m)) = &patch.model_override {
            let allowed: Vec<String> = self.models.lock().unwrap()[agent]
                .iter()
                .map(|m| format!("{}/{}", m.provider, m.model))
                .collect();
            if !allowed.contains(m) {
                return Err(GatewayError::ModelNotAllowed {
                    agent: agent.into(),
                    requested: m.clone(),
                    allowed: allowed.join(", "),
                });
            }
        }
        let mut all = self.settings.lock().unwrap();
        let s = all.entry(session_key.to_string()).or_default();
        if let Some(v) = patch.verbose {
            s.verbose = v;
        }
        if let Some(v) = patch.streaming {
            s.streaming = v;
        }
        if let Some(v) = patch.model_override {
            s.model_override = v;
        }
        Ok(s.clone())
    }
}

#[async_trait]
impl Admin for FakeGateway {
    async fn health(&self) -> Result<HashMap<String, ModelHealth>, GatewayError> {
        self.check()?;
        Ok(HashMap::new())
    }

    async fn models(&self, agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
        self.check()?;
        self.unknown_agent(agent)?;
        Ok(self
            .models
            .lock()
            .unwrap()
            .get(agent)
            .cloned()
            .unwrap_or_default())
    }

    async fn config_summary(&self) -> Result<serde_json::Value, GatewayError> {
        self.check()?;
        Ok(serde_json::json!({}))
    }

    async fn run_hook(
        &self,
        _agent: &str,
        _hook: HookName,
        _event: serde_json::Value,
    ) -> Result<serde_json::Value, GatewayError> {
        self.check()?;
        Ok(serde_json::json!({}))
    }

    /// A healthy link over the Unix carrier.
    async fn sandbox_status(&self, agent: &str) -> Result<SandboxStatus, GatewayError> {
        self.check()?;
        self.unknown_agent(agent)?;
        Ok(SandboxStatus {
            agent: agent.into(),
            container: format!("beige-fake-{agent}"),
            link_mode: LinkMode::Unix,
            // Through JSON: the carrier type lives in beige-protocol, no dependency here.
            link: Some(
                serde_json::from_value::<LinkStatus>(serde_json::json!({
                    "agent": agent,
                    "connected": true,
                    "carrier": "unix",
                    "bootId": "fake-boot",
                    "connectedSecs": 60,
                    "lastPingUs": 150,
                    "connects": 1,
                    "opsLink": 3,
                }))
                .unwrap(),
            ),
            ping_us: Some(150),
        })
    }
}
