//! Test seams for clients of a gateway (feature `test-util`): [`FakeGateway`], a
//! [`GatewayFull`](crate::GatewayFull) with agents and sessions in memory, prompts
//! answered from scripts and every call that matters recorded (prompts, cancels,
//! resumes, settings), plus builders of the records it serves ([`agent`], [`model`],
//! [`session`]).
//!
//! Nothing here touches the network or the disk; beige-tui's tests drive its screens
//! with it.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use beige_protocol::link::Carrier;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio_util::sync::CancellationToken;

use crate::error::GatewayError;
use crate::events::AgentEvent;
use crate::gateway::{Admin, AgentEventStream, AgentInfo, AllowedModel, Gateway, Sessions};
use crate::hooks::HookName;
use crate::llm::{Message, ModelInfo, ThinkingLevel, Usage};
use crate::prompt::PromptRequest;
use crate::session::{SessionRecord, SessionSettings, SettingsPatch};
use crate::status::{LinkMode, LinkStatus, ModelHealth, SandboxStatus};
use crate::tools::{CoreToolCall, ToolContext, ToolOutput};

/// The value behind a lock, also when a panicking test poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An agent with the `kv` tool, no skills and `/tmp/ws` as its workspace.
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

/// A model (`provider/model`; a key without `/` is a model of provider `""`) with a
/// Sonnet-like catalogue entry (200k context, images, $3/$15), healthy.
pub fn model(key: &str, role: &str) -> AllowedModel {
    let (provider, model) = key.split_once('/').unwrap_or(("", key));
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
            cost_cache_read: 0.3,
            cost_cache_write: 3.75,
            priced: true,
        },
        health: None,
    }
}

/// A session on a Sonnet model, updated when it was created, with some usage.
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
    /// The events, sent at once.
    pub events: Vec<AgentEvent>,
    /// Keep the stream open after the events (until `cancel`).
    pub hold: bool,
}

/// A gateway in memory. Every field is open to tests: seed it, then read what the
/// client did.
#[derive(Debug, Default)]
pub struct FakeGateway {
    /// The agents, in order.
    pub agents: Mutex<Vec<AgentInfo>>,
    /// The models of each agent.
    pub models: Mutex<HashMap<String, Vec<AllowedModel>>>,
    /// The sessions of each agent, newest first.
    pub sessions: Mutex<HashMap<String, Vec<SessionRecord>>>,
    /// The messages of each session id.
    pub messages: Mutex<HashMap<String, Vec<Message>>>,
    /// The settings of each session key.
    pub settings: Mutex<HashMap<String, SessionSettings>>,
    /// How the next prompts answer; an empty `Done` when none is left.
    pub scripts: Mutex<VecDeque<Script>>,
    /// Every prompt sent.
    pub prompts: Mutex<Vec<PromptRequest>>,
    /// Every cancel: agent and session key.
    pub cancels: Mutex<Vec<(String, String)>>,
    /// Every resume: agent, session key and session id.
    pub resumed: Mutex<Vec<(String, String, String)>>,
    /// Every new session: agent and session key.
    pub created: Mutex<Vec<(String, String)>>,
    /// The stream of a held prompt, until it is cancelled.
    pub open: Mutex<Option<UnboundedSender<AgentEvent>>>,
    /// While set, every call fails as if the gateway were not running.
    pub down: AtomicBool,
}

impl FakeGateway {
    /// Two agents (`assistant` with a fallback model, `coder`), no sessions.
    pub fn new() -> Self {
        let g = FakeGateway::default();
        *lock(&g.agents) = vec![
            agent(
                "assistant",
                "anthropic/claude-sonnet-4-5",
                &["openai/gpt-4o"],
            ),
            agent("coder", "openai/gpt-4o", &[]),
        ];
        lock(&g.models).insert(
            "assistant".into(),
            vec![
                model("anthropic/claude-sonnet-4-5", "primary"),
                model("openai/gpt-4o", "fallback"),
            ],
        );
        lock(&g.models).insert("coder".into(), vec![model("openai/gpt-4o", "primary")]);
        g
    }

    /// Queue how the next prompt answers; with `hold`, its stream stays open after the
    /// events until the prompt is cancelled.
    pub fn script(&self, events: Vec<AgentEvent>, hold: bool) {
        lock(&self.scripts).push_back(Script { events, hold });
    }

    /// Add a session and its messages (sessions stay newest first).
    pub fn add_session(&self, record: SessionRecord, messages: Vec<Message>) {
        lock(&self.messages).insert(record.id.clone(), messages);
        let mut s = lock(&self.sessions);
        let list = s.entry(record.agent.clone()).or_default();
        list.push(record);
        list.sort_by_key(|s| std::cmp::Reverse(s.created));
    }

    /// Make every call fail with [`GatewayError::Unreachable`] (or stop doing so).
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
        let agents = lock(&self.agents);
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
        Ok(lock(&self.agents).clone())
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
        lock(&self.prompts).push(request);
        let script = lock(&self.scripts).pop_front().unwrap_or(Script {
            events: vec![AgentEvent::Done {
                response: String::new(),
                session_id: "s_0000000000000001".into(),
                usage: Usage::default(),
            }],
            hold: false,
        });
        let (tx, rx) = unbounded_channel();
        for e in script.events {
            // The receiver is right here: sending cannot fail.
            let _ = tx.send(e);
        }
        if script.hold {
            *lock(&self.open) = Some(tx);
        }
        Ok(AgentEventStream::new(rx, CancellationToken::new()))
    }

    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
        self.check()?;
        lock(&self.cancels).push((agent.into(), session_key.into()));
        match lock(&self.open).take() {
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
        Ok(lock(&self.sessions).get(agent).cloned().unwrap_or_default())
    }

    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.check()?;
        lock(&self.created).push((agent.into(), session_key.into()));
        let n = lock(&self.created).len();
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
        lock(&self.resumed).push((agent.into(), session_key.into(), session_id.into()));
        lock(&self.sessions)
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
        Ok(lock(&self.messages)
            .get(session_id)
            .cloned()
            .unwrap_or_default())
    }

    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
        self.check()?;
        Ok(lock(&self.settings)
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
            let allowed: Vec<String> = lock(&self.models)
                .get(agent)
                .into_iter()
                .flatten()
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
        let mut all = lock(&self.settings);
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
        Ok(lock(&self.models).get(agent).cloned().unwrap_or_default())
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
            link: Some(LinkStatus {
                agent: agent.into(),
                connected: true,
                carrier: Some(Carrier::Unix),
                boot_id: Some("fake-boot".into()),
                connected_secs: Some(60),
                last_ping_us: Some(150),
                connects: 1,
                ops_link: 3,
                ..LinkStatus::default()
            }),
            ping_us: Some(150),
        })
    }
}
