//! The agent loop: one prompt on one session, from the channel's message to `Done`.
//!
//! `prePrompt` hooks → load the session → system prompt → routed, streamed model call →
//! each tool call through the guarded path → repeat until the model stops or `maxTurns`
//! → `postResponse` hooks → persist the whole exchange in one transaction → `Done`.
//! One prompt runs at a time per session key; sessions run in parallel. Cancellation
//! drops the model stream and kills a running `exec`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::trace::{FutureExt as _, TraceContextExt as _};
use opentelemetry::KeyValue;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::history::{estimate_tokens, push_alternating, Context};
use super::{GatewayError, Inner};
use crate::agent::events::{hint_for, AgentEvent};
use crate::agent::prompt::{self, PromptSession, PromptSkill, PromptTool};
use crate::agent::router::{model_key, RouteError};
use crate::budget::{BudgetExhausted, Limits, Scope, Used};
use crate::config::ModelRef;
use crate::hooks::{
    ModelSwitchedEvent, PostResponseEvent, PrePromptEvent, PromptDecision, ResponseDecision,
    SessionEvent,
};
use crate::llm::{catalog, Block, ErrorKind, Message, ModelRequest, Role, ToolResultPart, Usage};
use crate::store::{LedgerEntry, LedgerFilter, NewMessage, NewSession, SessionRecord, UsageTotals};
use crate::telemetry::names;
use crate::tools::{ContentBlock, CoreToolCall, ToolContext, ToolOutput};

pub(crate) use beige_client::PromptRequest;

/// A tool result block for the model.
fn result_block(id: &str, out: &ToolOutput) -> Block {
    Block::ToolResult {
        tool_use_id: id.to_string(),
        content: out
            .content
            .iter()
            .map(|c| match c {
                ContentBlock::Text { text } => ToolResultPart::Text { text: text.clone() },
                ContentBlock::Image { data, mime_type } => ToolResultPart::Image {
                    data: data.clone(),
                    mime_type: mime_type.clone(),
                },
            })
            .collect(),
        is_error: out.is_error,
    }
}

struct Run<'a> {
    inner: &'a Arc<Inner>,
    req: PromptRequest,
    events: UnboundedSender<AgentEvent>,
    cancel: CancellationToken,
    /// How the run ended, for the metrics (`OUTCOME_*`).
    outcome: Arc<std::sync::atomic::AtomicU8>,
    /// The turn's root span, once the session is known; ended by `run_prompt`.
    span: Arc<std::sync::OnceLock<opentelemetry::Context>>,
}

/// `beige.decision` of a finished call.
pub(crate) fn decision_word(out: &ToolOutput) -> &'static str {
    match out.outcome() {
        beige_client::tools::ToolOutcome::Denied => "denied",
        beige_client::tools::ToolOutcome::Failed => "failed",
        _ => "ran",
    }
}

/// How a principal reads on a span.
fn principal_label(p: &beige_client::Principal) -> String {
    match p {
        beige_client::Principal::Unverified => "unverified".into(),
        beige_client::Principal::Sandbox => "sandbox".into(),
        beige_client::Principal::User { channel, id } => format!("user:{channel}:{id}"),
        beige_client::Principal::ApiToken => "api_token".into(),
        beige_client::Principal::Embedder => "embedder".into(),
        _ => "other".into(),
    }
}

impl Inner {
    /// The models the agent may use, override first.
    pub(crate) fn candidates(&self, agent: &str, override_key: Option<&str>) -> Vec<ModelRef> {
        let Some(a) = self.config.agents.get(agent) else {
            return Vec::new();
        };
        let mut list: Vec<ModelRef> = Vec::new();
        let allowed: Vec<&ModelRef> = std::iter::once(&a.model)
            .chain(a.fallback_models.iter())
            .collect();
        if let Some(o) = override_key {
            if let Some(m) = allowed.iter().find(|m| model_key(m) == o) {
                list.push((*m).clone());
            }
        }
        for m in allowed {
            if !list.iter().any(|x| model_key(x) == model_key(m)) {
                list.push(m.clone());
            }
        }
        list
    }

    /// The current session of a key, created when there is none.
    pub(crate) async fn session_for(
        &self,
        agent: &str,
        key: &str,
        channel: &str,
    ) -> Result<SessionRecord, GatewayError> {
        if let Some(s) = self.store.current_session(key).await? {
            if s.agent == agent {
                return Ok(s);
            }
        }
        let model = self.config.agents.get(agent).map(|a| model_key(&a.model));
        let s = self
            .store
            .create_session(NewSession {
                agent: agent.to_string(),
                key: key.to_string(),
                parent_id: None,
                model,
            })
            .await?;
        self.hooks()
            .session_created(&SessionEvent {
                session_key: key.to_string(),
                agent_name: agent.to_string(),
                channel: channel.to_string(),
            })
            .await;
        Ok(s)
    }

    /// The tools described to `agent`'s model; for a sub-agent only those of `only`
    /// (its rights: a tool its parent lacks is left out).
    async fn prompt_tools(
        &self,
        agent: &str,
        only: Option<&std::collections::BTreeSet<String>>,
    ) -> Vec<PromptTool> {
        let Some(a) = self.config.agents.get(agent) else {
            return Vec::new();
        };
        let mut tools = Vec::new();
        for t in &a.tools {
            #[cfg(feature = "mcp")]
            if self.is_mcp_server(t.split_once('.').map_or(t.as_str(), |(s, _)| s))
                || t.starts_with('!')
            {
                continue;
            }
            if only.is_some_and(|o| !o.contains(t)) {
                continue;
            }
            // A tool the policy does not expose is not described to the model either.
            if !self.policy.exposes(agent, t).await {
                continue;
            }
            if let Some(r) = self.registry.tool(t) {
                tools.push(PromptTool {
                    name: r.tool.name().to_string(),
                    description: r.tool.description().to_string(),
                    commands: r.tool.commands(),
                    docs: true,
                });
            }
        }
        // A sub-agent gets no MCP server (they are not among its parent's rights yet).
        #[cfg(feature = "mcp")]
        if only.is_none() {
            tools.extend(self.mcp_prompt_tools(agent).await);
        }
        tools
    }

    fn prompt_skills(&self, agent: &str) -> Vec<PromptSkill> {
        let Some(a) = self.config.agents.get(agent) else {
            return Vec::new();
        };
        a.skills
            .iter()
            .filter_map(|s| {
                let def = self.skills.get(s)?;
                Some(PromptSkill {
                    name: s.clone(),
                    description: def.description.clone(),
                    context: None,
                })
            })
            .collect()
    }

    /// The tools block of an agent's system prompt.
    pub(crate) async fn tool_context(&self, agent: &str) -> String {
        prompt::tool_context(&self.prompt_tools(agent, None).await)
    }

    /// The skills block of an agent's system prompt.
    pub(crate) fn skill_context(&self, agent: &str) -> String {
        prompt::skill_context(&self.prompt_skills(agent))
    }

    /// The system prompt for an agent and session. The workspace's `AGENTS.md` is read
    /// off the runtime's threads, beneath a handle on the workspace (see `fsutil`).
    /// `only`: a sub-agent's tools (the intersection with its parent's); `key` is the
    /// session's: a schedule run's session describes only the schedule's tools.
    pub(crate) async fn system_prompt_in(
        &self,
        agent: &str,
        session: &PromptSession,
        only: Option<&std::collections::BTreeSet<String>>,
        key: Option<&str>,
    ) -> String {
        let mut tools = self.prompt_tools(agent, only).await;
        if let Some(key) = key {
            tools.retain(|t| crate::schedule::narrow::allows(key, &t.name));
        }
        let skills = self.prompt_skills(agent);
        let workspace = self.config.agent_workspace(&self.home, agent);
        let agents_md = tokio::task::spawn_blocking(move || prompt::read_agents_md(&workspace))
            .await
            .ok()
            .flatten();
        prompt::assemble(agent, &tools, &skills, session, agents_md.as_deref())
    }

    /// Run one prompt to its end, sending events. Never panics; every failure becomes an
    /// `Error` event.
    pub(crate) async fn run_prompt(
        self: &Arc<Self>,
        req: PromptRequest,
        events: UnboundedSender<AgentEvent>,
        cancel: CancellationToken,
    ) {
        let started = std::time::Instant::now();
        let agent = req.agent.clone();
        let channel = req.channel();
        let outcome = Arc::new(std::sync::atomic::AtomicU8::new(OUTCOME_NONE));
        let span = Arc::new(std::sync::OnceLock::new());
        let run = Run {
            inner: self,
            req,
            events: events.clone(),
            cancel,
            outcome: outcome.clone(),
            span: span.clone(),
        };
        let result = run.go().await;
        if let Err(e) = &result {
            let _ = events.send(AgentEvent::Error {
                message: e.to_string(),
                kind: None,
                hint: None,
            });
        }
        let outcome = match outcome.load(std::sync::atomic::Ordering::Relaxed) {
            OUTCOME_DONE if result.is_ok() => crate::metrics::PromptOutcome::Done,
            OUTCOME_BLOCKED => crate::metrics::PromptOutcome::Blocked,
            OUTCOME_CANCELLED => crate::metrics::PromptOutcome::Cancelled,
            _ => crate::metrics::PromptOutcome::Failed,
        };
        self.metrics
            .prompt(&agent, &channel, outcome, started.elapsed());
        if let Some(cx) = span.get() {
            crate::telemetry::end(
                cx,
                vec![opentelemetry::KeyValue::new(
                    names::OUTCOME,
                    outcome.as_str(),
                )],
            );
        }
    }

    /// Summarise the older part of a session's context into one message.
    pub(crate) async fn compact_session(
        &self,
        session: &SessionRecord,
        candidates: &[ModelRef],
        events: &UnboundedSender<AgentEvent>,
        cancel: &CancellationToken,
    ) -> Result<Option<usize>, GatewayError> {
        let stored = self.store.messages(&session.id, false).await?;
        // Keep the last user text message and everything after it verbatim.
        let keep_from = stored
            .iter()
            .rposition(|m| {
                m.message.role == Role::User
                    && !m.summary
                    && m.message
                        .content
                        .iter()
                        .any(|b| matches!(b, Block::Text { .. }))
            })
            .unwrap_or(stored.len());
        if keep_from == 0 {
            return Ok(None);
        }
        let older = &stored[..keep_from];
        // Only a previous summary before the kept part: nothing new to summarise.
        let Some(upto) = older.iter().filter(|m| !m.summary).map(|m| m.seq).max() else {
            return Ok(None);
        };
        let transcript = older
            .iter()
            .map(|m| {
                let who = match m.message.role {
                    Role::User => "User",
                    Role::Assistant => "Assistant",
                };
                let body: Vec<String> = m
                    .message
                    .content
                    .iter()
                    .map(|b| match b {
                        Block::Text { text } => text.clone(),
                        Block::ToolUse { name, input, .. } => format!("[called {name} {input}]"),
                        Block::ToolResult {
                            content, is_error, ..
                        } => {
                            let text: String = content
                                .iter()
                                .map(|p| match p {
                                    ToolResultPart::Text { text } => {
                                        text.chars().take(2000).collect::<String>()
                                    }
                                    ToolResultPart::Image { .. } => "[image]".into(),
                                })
                                .collect();
                            format!(
                                "[tool result{}: {text}]",
                                if *is_error { " (error)" } else { "" }
                            )
                        }
                        Block::Image { .. } => "[image]".into(),
                        Block::Thinking { .. } => String::new(),
                    })
                    .filter(|s| !s.is_empty())
                    .collect();
                format!("{who}: {}", body.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n\n");
        let request = |m: &ModelRef| {
            let info = catalog::lookup(&m.model, self.model_overrides(m));
            ModelRequest {
                model: m.model.clone(),
                system: "You summarise conversations between a user and an AI agent that works in a sandbox. Keep facts, decisions, file names, commands that worked, open tasks and the user's preferences. Be concise.".into(),
                messages: vec![Message::user_text(format!(
                    "Summarise this earlier part of our conversation so that you can continue the work from the summary alone:\n\n{transcript}"
                ))]
                .into(),
                tools: Vec::new(),
                max_tokens: info.max_output_tokens.min(4096),
                thinking: crate::config::ThinkingLevel::Off,
                reasoning: false,
            }
        };
        let (silent, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut failures = HashMap::new();
        let routed = self
            .router
            .call(candidates, &mut failures, request, &silent, cancel)
            .await
            .map_err(|e| GatewayError::Compaction { source: e.into() })?;
        self.record_model_call(session, None, &routed.model, &routed.response.usage)
            .await?;
        let summary_text = Message {
            role: Role::Assistant,
            content: routed.response.content,
        }
        .text();
        let summary = Message::user_text(format!(
            "[Summary of the earlier conversation]\n{summary_text}"
        ));
        self.store.compact(&session.id, upto, summary).await?;
        let _ = events.send(AgentEvent::Compacted {
            summarized_messages: older.len(),
        });
        Ok(Some(older.len()))
    }

    pub(crate) fn model_overrides(&self, m: &ModelRef) -> Option<&serde_json::Value> {
        self.config
            .llm
            .providers
            .get(&m.provider)
            .and_then(|p| p.models.get(&m.model))
    }

    /// Write one model call to the cost ledger, priced from the catalogue and config;
    /// returns its totals.
    async fn record_model_call(
        &self,
        session: &SessionRecord,
        turn_id: Option<&str>,
        model: &ModelRef,
        usage: &Usage,
    ) -> Result<UsageTotals, GatewayError> {
        let (entry, totals) = self.price_model_call(session, turn_id, model, usage);
        self.ledger.record_usage(entry).await?;
        Ok(totals)
    }

    /// One model call priced from the catalogue and config and counted in the metrics:
    /// its ledger row (not written yet) and its totals.
    fn price_model_call(
        &self,
        session: &SessionRecord,
        turn_id: Option<&str>,
        model: &ModelRef,
        usage: &Usage,
    ) -> (LedgerEntry, UsageTotals) {
        let info = catalog::lookup(&model.model, self.model_overrides(model));
        let cost_micros = info.cost_micros(usage);
        let entry = LedgerEntry {
            ts: crate::store::now_ms(),
            agent: session.agent.clone(),
            session_id: Some(session.id.clone()),
            session_key: Some(session.key.clone()),
            turn_id: turn_id.map(str::to_string),
            model: model_key(model),
            usage: *usage,
            cost_micros,
            unpriced: !info.priced,
            // A sub-agent spends its parent's money: the parent's totals include it.
            parent_session_id: session.parent_id.clone(),
        };
        self.metrics
            .model_call(&session.agent, &model_key(model), usage, cost_micros);
        let totals = UsageTotals {
            calls: 1,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            cost_micros,
            unpriced_calls: u64::from(!info.priced),
        };
        (entry, totals)
    }

    /// What the budgets of `limits` have used: this turn's calls, and the session's and
    /// the agent's day from the ledger (read only when a limit needs them).
    async fn budget_use(
        &self,
        limits: &Limits,
        session: &SessionRecord,
        turn: UsageTotals,
        started: Instant,
    ) -> Result<Used, GatewayError> {
        // A turn that spawned sub-agents spends their money too.
        let turn = self.turn_totals(&session.id, turn).await?;
        let (needs_session, needs_day) = limits.needs_ledger();
        let session_totals = if needs_session {
            // The session's sub-agents spend its money too.
            self.ledger
                .usage_totals(LedgerFilter {
                    session_id: Some(session.id.clone()),
                    with_children: true,
                    ..LedgerFilter::default()
                })
                .await?
        } else {
            UsageTotals::default()
        };
        let day = if needs_day {
            self.ledger
                .usage_totals(LedgerFilter {
                    agent: Some(session.agent.clone()),
                    since_ms: Some(crate::budget::day_start_ms(crate::store::now_ms())),
                    ..LedgerFilter::default()
                })
                .await?
        } else {
            UsageTotals::default()
        };
        Ok(Used {
            session: session_totals,
            turn,
            turn_wall: started.elapsed(),
            day,
        })
    }

    /// Write a `type: "budget"` audit record; a sink that fails is logged (the turn
    /// ends or warns either way).
    async fn audit_budget(&self, record: crate::audit::AuditRecord) {
        if let Err(e) = self.audit.record(&record).await {
            tracing::warn!(error = %e, agent = %record.agent, "could not audit a budget event");
        }
    }
}

/// A model the agent may use has no price while a `costUsd` limit counts it.
fn unpriced_under_cost_limit(
    inner: &Inner,
    limits: &Limits,
    candidates: &[ModelRef],
) -> Option<String> {
    if !limits.has_cost_limit()
        || limits.unknown_model_price == crate::budget::UnknownModelPrice::Uncounted
    {
        return None;
    }
    candidates
        .iter()
        .find(|m| !catalog::lookup(&m.model, inner.model_overrides(m)).priced)
        .map(|m| {
            format!(
                "Model {} has no price, and a costUsd budget applies. Set llm.providers.{}.models.{}.cost, or budgets.unknownModelPrice: \"uncounted\".",
                model_key(m),
                m.provider,
                m.model
            )
        })
}

/// How a run ended, as its last telling event said (for the metrics).
const OUTCOME_NONE: u8 = 0;
const OUTCOME_DONE: u8 = 1;
const OUTCOME_BLOCKED: u8 = 2;
const OUTCOME_FAILED: u8 = 3;
const OUTCOME_CANCELLED: u8 = 4;

impl Run<'_> {
    fn send(&self, e: AgentEvent) {
        let outcome = match &e {
            AgentEvent::Done { .. } => Some(OUTCOME_DONE),
            AgentEvent::Blocked { .. } => Some(OUTCOME_BLOCKED),
            AgentEvent::Error { message, .. } if message.starts_with("cancelled") => {
                Some(OUTCOME_CANCELLED)
            }
            AgentEvent::Error { .. } => Some(OUTCOME_FAILED),
            _ => None,
        };
        if let Some(o) = outcome {
            self.outcome.store(o, std::sync::atomic::Ordering::Relaxed);
        }
        let _ = self.events.send(e);
    }

    async fn go(self) -> Result<(), GatewayError> {
        let inner = self.inner;
        let agent_name = self.req.agent.clone();
        let agent = inner.agent(&agent_name)?.clone();
        let key = self.req.session_key.clone();
        let channel = self.req.channel();

        // One prompt at a time per session key.
        let lock = inner.session_lock(&key);
        let _guard = if self.req.wait {
            match lock.clone().try_lock_owned() {
                Ok(g) => g,
                Err(_) => {
                    // Another prompt holds the session: counted while this one waits.
                    let _waiting = inner.metrics.session_waiting(&agent_name);
                    tokio::select! {
                        g = lock.lock_owned() => g,
                        _ = self.cancel.cancelled() => {
                            self.send(AgentEvent::Error { message: "cancelled while waiting for the session".into(), kind: None, hint: None });
                            return Ok(());
                        }
                    }
                }
            }
        } else {
            match lock.try_lock_owned() {
                Ok(g) => g,
                Err(_) => {
                    self.send(AgentEvent::Error {
                        message: format!("session '{key}' is busy with another prompt"),
                        kind: None,
                        hint: Some("Wait for the running prompt to finish, or cancel it.".into()),
                    });
                    return Ok(());
                }
            }
        };

        // A keyed prompt that completed before is answered from the store, once the
        // session is ours (a retry racing its first attempt waits for it here).
        let keyed = match &self.req.idempotency_key {
            Some(k) => {
                let sha = request_sha256(&self.req.message);
                if let Some(a) = inner.store.prompt_answer(&agent_name, &key, k).await? {
                    if a.request_sha256 != sha {
                        self.send(AgentEvent::Error {
                            message: format!(
                                "Idempotency-Key '{k}' was sent with another message to session '{key}' within the last day"
                            ),
                            kind: Some(ErrorKind::IdempotencyConflict),
                            hint: beige_client::events::hint_for(ErrorKind::IdempotencyConflict)
                                .map(str::to_string),
                        });
                    } else {
                        self.send(AgentEvent::Done {
                            response: a.response,
                            session_id: a.session_id,
                            usage: a.usage,
                        });
                    }
                    return Ok(());
                }
                Some((k.clone(), sha))
            }
            None => None,
        };

        // A sender that answers approvals makes the run (and its scripts) attended.
        let attended = self.req.approvals == beige_client::approvals::ApprovalMode::Stream;
        let _attending = attended.then(|| inner.attend(&key));
        let mut approval_events = inner.approvals().subscribe();

        let message = match inner
            .hooks()
            .pre_prompt(PrePromptEvent {
                message: self.req.message.clone(),
                session_key: key.clone(),
                agent_name: agent_name.clone(),
                channel: channel.clone(),
            })
            .await
        {
            PromptDecision::Continue(m) => m,
            PromptDecision::Blocked(reason) => {
                self.send(AgentEvent::Blocked { reason });
                return Ok(());
            }
        };

        let session = inner.session_for(&agent_name, &key, &channel).await?;
        inner.register_prompt_session(&self.req);
        // One root span per turn; the session's random id, never its key.
        let turn_cx = {
            let mut attributes = vec![
                KeyValue::new(names::OPERATION, names::SPAN_TURN),
                KeyValue::new(names::AGENT_NAME, agent_name.clone()),
                KeyValue::new(names::CONVERSATION_ID, session.id.clone()),
                KeyValue::new(names::CHANNEL, channel.clone()),
                KeyValue::new(names::PRINCIPAL, principal_label(&self.req.principal)),
            ];
            attributes.extend(inner.traces.prompt_attribute(&message));
            inner
                .traces
                .root(format!("{} {agent_name}", names::SPAN_TURN), attributes)
        };
        let _ = self.span.set(turn_cx.clone());
        // A sub-agent's session: its rights narrow the tools and add its ancestors'
        // budgets.
        let child = inner.child_of(&session).await?;
        let settings = inner.store.get_settings(&key).await?;
        let candidates = inner.candidates(&agent_name, settings.model_override.as_deref());
        let limits = Limits::for_agent(&inner.config, &agent_name);
        let turn_id = format!("t{:016x}", rand::random::<u64>());
        let started = Instant::now();
        // Sub-agents spawned in this turn spend what is left of its budgets.
        let _turn = inner.turn_started(&session.id);
        let mut turn_used = UsageTotals::default();
        let mut turn_warned = std::collections::HashSet::new();
        if let Some(text) = unpriced_under_cost_limit(inner, &limits, &candidates) {
            self.send(AgentEvent::Error {
                message: text,
                kind: Some(ErrorKind::BudgetExhausted),
                hint: None,
            });
            return Ok(());
        }
        let system = inner
            .system_prompt_in(
                &agent_name,
                &PromptSession {
                    channel: channel.clone(),
                    chat_id: self.req.chat_id.clone(),
                    thread_id: self.req.thread_id.clone(),
                    speaker: match inner.person_of(self.req.principal.clone()) {
                        crate::policy::Principal::Person { name, via } => {
                            Some(format!("{name}, via {via}"))
                        }
                        _ => None,
                    },
                },
                child.as_ref().map(|c| &c.rights.tools),
                Some(&self.req.session_key),
            )
            .await;

        // The session's context: kept in memory between prompts while the store's
        // revision says it is current (`history`), read from the store otherwise.
        let mut history = inner.history.load(&*inner.store, &session.id).await?;
        let user = Message::user_text(message);
        let mut exchange: Vec<NewMessage> = vec![NewMessage::plain(user.clone())];
        let mut failures = HashMap::new();
        let mut total = Usage::default();
        let mut switched_once = false;
        let mut last_model: Option<String>;
        let mut compacted = false;
        let tool_specs = crate::tools::definitions();
        let final_text: String;
        let mut turn: u32 = 0;

        // Compact before the first call when the context is over the threshold.
        if let Some(first) = candidates.first() {
            let info = catalog::lookup(&first.model, inner.model_overrides(first));
            let threshold = first
                .compaction_threshold
                .unwrap_or(info.context_window.saturating_sub(16_384).max(1));
            if history.tokens + estimate_tokens([&user]) > threshold
                && inner
                    .compact_session(&session, &candidates, &self.events, &self.cancel)
                    .await?
                    .is_some()
            {
                compacted = true;
                history = inner.history.load(&*inner.store, &session.id).await?;
            }
        }

        loop {
            if turn >= agent.max_turns {
                let text = format!(
                    "Stopped after {} model turns (agents.{agent_name}.maxTurns) before the model finished. Ask it to continue, or raise maxTurns.",
                    agent.max_turns
                );
                self.persist(&session, &history, exchange, Some(&text))
                    .await?;
                self.send(AgentEvent::Error {
                    message: text,
                    kind: None,
                    hint: None,
                });
                return Ok(());
            }
            if limits.any_model_limit() {
                let used = inner
                    .budget_use(&limits, &session, turn_used, started)
                    .await?;
                if let Some(exhausted) = limits.exhausted(&agent_name, &used) {
                    self.end_on_budget(&session, &history, exchange, &turn_id, exhausted)
                        .await?;
                    return Ok(());
                }
            }
            if let Some(child) = &child {
                if let Some(exhausted) = inner.lineage_budget_exhausted(child).await? {
                    self.end_on_budget(&session, &history, exchange, &turn_id, exhausted)
                        .await?;
                    return Ok(());
                }
            }
            turn += 1;
            // The history is shared, not copied: this turn's request is it plus the
            // exchange so far.
            let mut context = history.messages.clone();
            for m in &exchange {
                push_alternating(&mut context, m.message.clone());
            }
            self.send(AgentEvent::TurnStarted {
                turn,
                model: candidates.first().map(model_key).unwrap_or_default(),
            });
            let build = |m: &ModelRef| {
                let info = catalog::lookup(&m.model, inner.model_overrides(m));
                ModelRequest {
                    model: m.model.clone(),
                    system: system.clone(),
                    messages: context.clone(),
                    tools: tool_specs.clone(),
                    max_tokens: info.max_output_tokens.min(32_000),
                    thinking: m.thinking_level,
                    reasoning: info.reasoning,
                }
            };
            let chat_cx = {
                let first = candidates.first();
                let model = first.map(|m| m.model.clone()).unwrap_or_default();
                let mut attributes = vec![
                    KeyValue::new(names::OPERATION, names::SPAN_CHAT),
                    KeyValue::new(names::REQUEST_MODEL, model.clone()),
                ];
                if let Some(m) = first {
                    attributes.push(KeyValue::new(names::PROVIDER, m.provider.clone()));
                }
                inner.traces.client(
                    &turn_cx,
                    format!("{} {model}", names::SPAN_CHAT),
                    attributes,
                )
            };
            let routed = inner
                .router
                .call(
                    &candidates,
                    &mut failures,
                    build,
                    &self.events,
                    &self.cancel,
                )
                .await;
            match &routed {
                Ok(r) => {
                    let u = &r.response.usage;
                    let span = chat_cx.span();
                    if span.span_context().is_valid() {
                        span.update_name(format!("{} {}", names::SPAN_CHAT, r.model.model));
                    }
                    crate::telemetry::end(
                        &chat_cx,
                        vec![
                            KeyValue::new(names::REQUEST_MODEL, r.model.model.clone()),
                            KeyValue::new(names::PROVIDER, r.model.provider.clone()),
                            KeyValue::new(names::INPUT_TOKENS, u.input_tokens as i64),
                            KeyValue::new(names::OUTPUT_TOKENS, u.output_tokens as i64),
                            KeyValue::new(names::CACHE_READ_TOKENS, u.cache_read_tokens as i64),
                            KeyValue::new(names::CACHE_WRITE_TOKENS, u.cache_write_tokens as i64),
                        ],
                    );
                }
                // The provider's error text stays out of the span (it may quote the
                // request); the kind says enough.
                Err(e) => {
                    let kind = match e {
                        RouteError::Cancelled => "cancelled",
                        RouteError::ContextOverflow(_) => "context_overflow",
                        _ => "model_call_failed",
                    };
                    chat_cx
                        .span()
                        .set_status(opentelemetry::trace::Status::error(kind));
                    crate::telemetry::end(&chat_cx, vec![]);
                }
            }
            let routed = match routed {
                Ok(r) => r,
                Err(RouteError::Cancelled) => {
                    self.persist(
                        &session,
                        &history,
                        exchange,
                        Some("[cancelled by the user]"),
                    )
                    .await?;
                    self.send(AgentEvent::Error {
                        message: "cancelled".into(),
                        kind: None,
                        hint: None,
                    });
                    return Ok(());
                }
                Err(RouteError::ContextOverflow(e)) if !compacted => {
                    tracing::warn!(error = %e, "context overflow; compacting and retrying once");
                    compacted = true;
                    if inner
                        .compact_session(&session, &candidates, &self.events, &self.cancel)
                        .await?
                        .is_some()
                    {
                        history = inner.history.load(&*inner.store, &session.id).await?;
                    }
                    turn -= 1;
                    continue;
                }
                Err(e) => {
                    let kind = match &e {
                        RouteError::AllFailed { kind, .. } => Some(*kind),
                        RouteError::ContextOverflow(_) => Some(ErrorKind::ContextOverflow),
                        RouteError::Interrupted { error } => Some(error.kind()),
                        _ => None,
                    };
                    // Keep the user's message, closed with a note, so history stays whole.
                    let note = format!("[no answer: {e}]");
                    self.persist(&session, &history, exchange, Some(&note))
                        .await?;
                    self.send(AgentEvent::Error {
                        message: e.to_string(),
                        kind,
                        hint: kind.and_then(hint_for).map(str::to_string),
                    });
                    return Ok(());
                }
            };
            let used = model_key(&routed.model);
            let primary = model_key(&agent.model);
            // A session override answering instead of the primary is a switch too.
            let switch = match &routed.switched {
                Some(reason) => Some((
                    candidates.first().map(model_key).unwrap_or_default(),
                    reason.clone(),
                )),
                None if used != primary => Some((primary, "user_override".to_string())),
                None => None,
            };
            if let (Some((from, reason)), false) = (switch, switched_once) {
                switched_once = true;
                self.send(AgentEvent::ModelSwitched {
                    from: from.clone(),
                    to: used.clone(),
                    reason: reason.clone(),
                });
                inner
                    .hooks()
                    .model_switched(&ModelSwitchedEvent {
                        session_key: key.clone(),
                        agent_name: agent_name.clone(),
                        channel: channel.clone(),
                        previous_model: from,
                        new_model: used.clone(),
                        reason,
                    })
                    .await;
            }
            last_model = Some(used.clone());
            let info = catalog::lookup(&routed.model.model, inner.model_overrides(&routed.model));
            let usage = routed.response.usage;
            total.add(&usage);
            let (entry, call) =
                inner.price_model_call(&session, Some(&turn_id), &routed.model, &usage);
            turn_used.add(&call);
            let asks_for_tools = routed
                .response
                .content
                .iter()
                .any(|b| matches!(b, Block::ToolUse { .. }));
            // The call's ledger row. When tools run next, in a session with no budget to
            // check (its own or a parent's), it is written while they run and waited for
            // once they are done (nothing reads the ledger in between): its commit is off
            // the turn's path.
            let ledger_write = if asks_for_tools && !limits.any_model_limit() && child.is_none() {
                let ledger = inner.ledger.clone();
                Some(tokio::spawn(
                    async move { ledger.record_usage(entry).await },
                ))
            } else {
                inner.ledger.record_usage(entry).await?;
                None
            };
            if limits.any_model_limit() {
                let used = inner
                    .budget_use(&limits, &session, turn_used, started)
                    .await?;
                self.warn_budgets(&limits, &used, &session, &turn_id, &mut turn_warned)
                    .await;
            }
            self.send(AgentEvent::Usage {
                model: used.clone(),
                usage,
                cost: info.cost(&usage),
            });
            let assistant = Message {
                role: Role::Assistant,
                content: routed.response.content,
            };
            let calls: Vec<(String, String, serde_json::Value)> = assistant
                .tool_uses()
                .into_iter()
                .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
                .collect();
            let text = assistant.text();
            exchange.push(NewMessage {
                message: assistant,
                model: Some(used.clone()),
                usage: Some(usage),
            });
            if calls.is_empty() {
                final_text = text;
                break;
            }
            let mut results = Vec::with_capacity(calls.len());
            for (id, name, input) in calls {
                if self.cancel.is_cancelled() {
                    results.push(result_block(
                        &id,
                        &ToolOutput::error("cancelled by the user before it ran"),
                    ));
                    continue;
                }
                self.send(AgentEvent::ToolCallStarted {
                    id: id.clone(),
                    name: name.clone(),
                    args: input.clone(),
                });
                // The model names the tool: a name that is not one of the core tools
                // (the model's own invention) does not go into a span.
                let span_tool = if tool_specs.iter().any(|t| t.name == name) {
                    name.as_str()
                } else {
                    "other"
                };
                let tool_cx = inner.traces.child(
                    &turn_cx,
                    format!("{} {span_tool}", names::SPAN_TOOL),
                    vec![
                        KeyValue::new(names::OPERATION, names::SPAN_TOOL),
                        KeyValue::new(names::TOOL_NAME, span_tool.to_string()),
                        KeyValue::new(names::TOOL_CALL_ID, id.clone()),
                        KeyValue::new(names::TOOL_KIND, "core"),
                    ],
                );
                let started = Instant::now();
                let out = match CoreToolCall::parse(&name, input) {
                    Err(e) => ToolOutput::error(e.message),
                    Ok(call) => {
                        let ctx = ToolContext {
                            session_key: Some(key.clone()),
                            channel: Some(channel.clone()),
                            chat_id: self.req.chat_id.clone(),
                            thread_id: self.req.thread_id.clone(),
                            model: Some(used.clone()),
                            model_accepts_images: info.images,
                            // The model acts for whoever sent the prompt.
                            principal: self.req.principal.clone(),
                            attended,
                        };
                        let (sink, mut chunks) = tokio::sync::mpsc::unbounded_channel();
                        let run = inner
                            .call_core_cancellable(
                                &agent_name,
                                call,
                                ctx,
                                Some(&self.cancel),
                                Some(sink),
                            )
                            .with_context(tool_cx.clone());
                        tokio::pin!(run);
                        let mut live = LiveOutput::default();
                        let mut approvals_open = true;
                        let result = loop {
                            tokio::select! {
                                Some(chunk) = chunks.recv() => {
                                    if let Some(e) = live.event(&id, chunk) {
                                        self.send(e);
                                    }
                                }
                                ev = approval_events.recv(), if approvals_open => match ev {
                                    Ok(ev) if ev.session() == key => {
                                        if let Some(e) = approval_event(ev) {
                                            self.send(e);
                                        }
                                    }
                                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                                    Err(tokio::sync::broadcast::error::RecvError::Closed) => approvals_open = false,
                                },
                                result = &mut run => break result,
                            }
                        };
                        // Pieces that arrived with the result come before its end.
                        while let Ok(chunk) = chunks.try_recv() {
                            if let Some(e) = live.event(&id, chunk) {
                                self.send(e);
                            }
                        }
                        match result {
                            Ok(out) => out,
                            Err(e) => ToolOutput::error(format!("Error: {e}")),
                        }
                    }
                };
                // A call refused before the guarded path (bad arguments) says so too.
                crate::telemetry::end(
                    &tool_cx,
                    vec![KeyValue::new(names::DECISION, decision_word(&out))],
                );
                self.send(AgentEvent::ToolCallFinished {
                    id: id.clone(),
                    name: name.clone(),
                    output: out.joined_text(),
                    is_error: out.is_error,
                    duration_ms: started.elapsed().as_millis() as u64,
                });
                results.push(result_block(&id, &out));
            }
            exchange.push(NewMessage::plain(Message {
                role: Role::User,
                content: results,
            }));
            if let Some(write) = ledger_write {
                write.await.map_err(|e| GatewayError::Store {
                    source: Box::new(e),
                })??;
            }
            if self.cancel.is_cancelled() {
                self.persist(
                    &session,
                    &history,
                    exchange,
                    Some("[cancelled by the user]"),
                )
                .await?;
                self.send(AgentEvent::Error {
                    message: "cancelled".into(),
                    kind: None,
                    hint: None,
                });
                return Ok(());
            }
        }

        let response = match inner
            .hooks()
            .post_response(PostResponseEvent {
                response: final_text,
                session_key: key.clone(),
                agent_name: agent_name.clone(),
                channel: channel.clone(),
            })
            .await
        {
            ResponseDecision::Continue(r) => r,
            ResponseDecision::Blocked => String::new(),
        };
        let answer = keyed.map(|(key, request_sha256)| crate::store::PromptAnswer {
            agent: agent_name.clone(),
            session_key: self.req.session_key.clone(),
            key,
            request_sha256,
            session_id: session.id.clone(),
            response: response.clone(),
            usage: total,
            // The store stamps the time it writes the answer.
            created: 0,
        });
        self.persist_with(&session, &history, exchange, None, answer)
            .await?;
        if let Some(last) = last_model.as_deref() {
            if session.model.as_deref() != Some(last) {
                inner.store.set_session_model(&session.id, last).await?;
            }
        }
        self.send(AgentEvent::Done {
            response,
            session_id: session.id.clone(),
            usage: total,
        });
        Ok(())
    }

    /// End the turn before the next model call: the exchange is kept, closed with the
    /// message, an audit record says which budget, and the channel gets an `error` of
    /// kind `budget_exhausted`.
    async fn end_on_budget(
        &self,
        session: &SessionRecord,
        history: &Context,
        exchange: Vec<NewMessage>,
        turn_id: &str,
        exhausted: BudgetExhausted,
    ) -> Result<(), GatewayError> {
        let text = exhausted.message();
        tracing::info!(agent = %exhausted.agent, session = %session.key, "{text}");
        self.persist(session, history, exchange, Some(&text))
            .await?;
        self.inner
            .audit_budget(crate::audit::AuditRecord::budget(
                crate::audit::Phase::Exhausted,
                &exhausted.agent,
                Some(&session.key),
                &crate::audit::BudgetFacts {
                    scope: exhausted.scope.as_str(),
                    key: exhausted.key.as_str(),
                    limit: exhausted.limit,
                    used: exhausted.used,
                    session_id: Some(&session.id),
                    turn: Some(turn_id),
                },
                Some(text.clone()),
            ))
            .await;
        self.send(AgentEvent::Error {
            message: text,
            kind: Some(ErrorKind::BudgetExhausted),
            hint: Some(exhausted.hint()),
        });
        Ok(())
    }

    /// Send a `budget_warning` for each budget at 80 % or more, once per scope and
    /// period (the turn, the session, the agent's UTC day), and audit it.
    async fn warn_budgets(
        &self,
        limits: &Limits,
        used: &Used,
        session: &SessionRecord,
        turn_id: &str,
        turn_warned: &mut std::collections::HashSet<&'static str>,
    ) {
        for w in limits.warnings(used) {
            let first = match w.scope {
                Scope::Turn => turn_warned.insert(w.key.as_str()),
                Scope::Session => self
                    .inner
                    .warned
                    .first(&format!("session:{}", session.id), w.key),
                Scope::AgentDay => self.inner.warned.first(
                    &format!(
                        "day:{}:{}",
                        session.agent,
                        crate::budget::day_of(crate::store::now_ms())
                    ),
                    w.key,
                ),
                Scope::Exec | Scope::Spawn => false,
            };
            if !first {
                continue;
            }
            self.send(AgentEvent::BudgetWarning {
                scope: w.scope.as_str().to_string(),
                key: w.key.as_str().to_string(),
                used: w.used,
                limit: w.limit,
                pct: w.pct,
            });
            self.inner
                .audit_budget(crate::audit::AuditRecord::budget(
                    crate::audit::Phase::Warning,
                    &session.agent,
                    Some(&session.key),
                    &crate::audit::BudgetFacts {
                        scope: w.scope.as_str(),
                        key: w.key.as_str(),
                        limit: w.limit,
                        used: w.used,
                        session_id: Some(&session.id),
                        turn: Some(turn_id),
                    },
                    None,
                ))
                .await;
        }
    }

    /// Store the exchange in one transaction; `note` closes an unfinished one. The
    /// session's context grown by it is kept for the next prompt.
    async fn persist(
        &self,
        session: &SessionRecord,
        history: &Context,
        exchange: Vec<NewMessage>,
        note: Option<&str>,
    ) -> Result<(), GatewayError> {
        self.persist_with(session, history, exchange, note, None)
            .await
    }

    /// [`persist`](Self::persist), storing a keyed prompt's `answer` in the exchange's
    /// transaction.
    async fn persist_with(
        &self,
        session: &SessionRecord,
        history: &Context,
        mut exchange: Vec<NewMessage>,
        note: Option<&str>,
        answer: Option<crate::store::PromptAnswer>,
    ) -> Result<(), GatewayError> {
        if let Some(note) = note {
            // Every tool call needs a result before the next message.
            if let Some(last) = exchange.last() {
                if last.message.role == Role::Assistant {
                    let pending: Vec<Block> = last
                        .message
                        .tool_uses()
                        .into_iter()
                        .map(|(id, _, _)| result_block(id, &ToolOutput::error(note)))
                        .collect();
                    if !pending.is_empty() {
                        exchange.push(NewMessage::plain(Message {
                            role: Role::User,
                            content: pending,
                        }));
                    }
                }
            }
            exchange.push(NewMessage::plain(Message::assistant_text(note)));
        }
        let next = history.appended(exchange.iter().map(|m| &m.message));
        let empty = exchange.is_empty();
        // With a shared store the turn commits only under this gateway's lease of the
        // agent: a gateway that lost it cannot write, even before it notices.
        let fence = self
            .inner
            .leases
            .as_ref()
            .and_then(|l| l.fence_of(&session.agent));
        let store = &self.inner.store;
        match (answer, fence) {
            (Some(answer), fence) => {
                store
                    .append_answered_turn(&session.id, exchange, fence.as_ref(), answer)
                    .await?
            }
            (None, Some(fence)) => {
                store
                    .append_turn_fenced(&session.id, exchange, &fence)
                    .await?
            }
            (None, None) => store.append_turn(&session.id, exchange).await?,
        };
        if !empty {
            self.inner.history.keep(&session.id, next);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternation_merges_same_roles() {
        let mut m = crate::llm::Messages::new();
        for message in [
            Message::user_text("a"),
            Message::user_text("b"),
            Message::assistant_text("c"),
        ] {
            push_alternating(&mut m, message);
        }
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].content.len(), 2);
    }

    #[test]
    fn channel_from_key() {
        assert_eq!(
            PromptRequest::new("a", "telegram:42:7", "hi").channel(),
            "telegram"
        );
        let mut r = PromptRequest::new("a", "x", "hi");
        r.channel = Some("api".into());
        assert_eq!(r.channel(), "api");
    }
}

/// SHA-256 (hex) of a keyed prompt's message: what tells a retry from a new request.
fn request_sha256(message: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(message.as_bytes()))
}

/// The prompt-stream event of a broker event about this prompt's session.
fn approval_event(ev: beige_client::approvals::ApprovalEvent) -> Option<AgentEvent> {
    use beige_client::approvals::ApprovalEvent as E;
    match ev {
        E::ApprovalRequest { approval } => Some(AgentEvent::ApprovalRequest { approval }),
        E::ApprovalDecided { approval } => Some(AgentEvent::ApprovalDecided { approval }),
        E::UnattendedDenied { .. } => None,
    }
}

/// Turns live output pieces into [`AgentEvent::ToolOutput`] text, holding back the
/// start of a UTF-8 character split between two pieces.
#[derive(Debug, Default)]
struct LiveOutput {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl LiveOutput {
    fn event(&mut self, id: &str, chunk: crate::sandbox::OutputChunk) -> Option<AgentEvent> {
        use crate::sandbox::OutputStream;
        let held = match chunk.stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        held.extend_from_slice(&chunk.bytes);
        let cut = utf8_prefix_len(held);
        if cut == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&held[..cut]).into_owned();
        held.drain(..cut);
        Some(AgentEvent::ToolOutput {
            id: id.to_string(),
            stream: chunk.stream,
            text,
        })
    }
}

/// How much of `bytes` can be decoded now: all of it, except an incomplete UTF-8
/// sequence at the very end (at most 3 bytes), which waits for the next piece.
fn utf8_prefix_len(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        // Invalid bytes (not just cut short): decode everything lossily.
        Err(_) => bytes.len(),
    }
}

#[cfg(test)]
mod live_output_tests {
    use super::*;
    use crate::sandbox::{OutputChunk, OutputStream};

    #[test]
    fn a_character_split_between_pieces_arrives_whole() {
        let mut live = LiveOutput::default();
        let bytes = "héllo ✓".as_bytes();
        let (a, b) = bytes.split_at(2); // "h" and the first byte of "é"
        let first = live.event(
            "t1",
            OutputChunk {
                stream: OutputStream::Stdout,
                bytes: a.to_vec(),
            },
        );
        assert_eq!(
            first,
            Some(AgentEvent::ToolOutput {
                id: "t1".into(),
                stream: OutputStream::Stdout,
                text: "h".into()
            })
        );
        let second = live.event(
            "t1",
            OutputChunk {
                stream: OutputStream::Stdout,
                bytes: b.to_vec(),
            },
        );
        assert_eq!(
            second,
            Some(AgentEvent::ToolOutput {
                id: "t1".into(),
                stream: OutputStream::Stdout,
                text: "éllo ✓".into()
            })
        );
        // Invalid bytes are not held back forever.
        let bad = live.event(
            "t1",
            OutputChunk {
                stream: OutputStream::Stderr,
                bytes: vec![0xff, b'x'],
            },
        );
        assert_eq!(
            bad,
            Some(AgentEvent::ToolOutput {
                id: "t1".into(),
                stream: OutputStream::Stderr,
                text: "\u{fffd}x".into()
            })
        );
        assert_eq!(utf8_prefix_len(&[0xe2, 0x9c]), 0);
    }
}
