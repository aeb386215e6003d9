//! `update(&mut App, Msg) -> Vec<Effect>`: all of the TUI's behaviour, without a terminal
//! and without the gateway.
//!
//! A [`Msg`] is something that happened — a key, a paste, a mouse scroll, a tick, an
//! event of the running prompt, the answer to a request. An [`Effect`] is something the
//! runtime must do — send a prompt, cancel it, load sessions, resume one, switch agents,
//! reconnect, quit — and whose outcome comes back as another `Msg`. Tests drive this
//! function directly.

use std::time::{Duration, Instant};

use beige_client::approvals::{Approval, ApprovalDecision, ApprovalStatus, Scope};
use beige_client::events::{hint_for, AgentEvent};
use beige_client::llm::{ErrorKind, Message};
use beige_client::session::{SessionRecord, SessionSettings};
use beige_client::{AgentInfo, AllowedModel};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseEventKind};

use crate::app::{
    session_key, tool_status, App, ApprovalCell, Cell, Connection, Modal, Running, ToolCell,
    ToolStatus,
};
use crate::commands::{self, Command};

/// Live output kept for a running tool (its tail): the final result replaces it.
const LIVE_OUTPUT_MAX: usize = 64 * 1024;

/// A second Ctrl+C within this time quits.
pub const DOUBLE_CTRL_C: Duration = Duration::from_secs(2);

/// Ticks between connection checks while idle (at the runtime's 100 ms tick: 5 s).
pub const PROBE_EVERY_TICKS: u64 = 50;

/// Lines one mouse-wheel step scrolls.
pub const WHEEL_LINES: usize = 3;

/// A failed request, as `update` needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    /// The gateway could not be reached (connection refused, reset, timed out).
    pub unreachable: bool,
    /// The HTTP status the gateway answered with, when it answered.
    pub status: Option<u16>,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            unreachable: false,
            status: None,
        }
    }
}

/// Which `/resume` target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeTarget {
    /// 1-based position in the session list (newest first).
    Index(usize),
    Id(String),
}

/// Which setting a `SettingsChanged` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingChange {
    Model,
    Verbose,
}

/// Everything needed to show an agent: its settings, models and current session.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentLoad {
    pub agent: String,
    pub settings: SessionSettings,
    pub models: Vec<AllowedModel>,
    /// The current session of the agent's TUI key, if there is one.
    pub session: Option<SessionRecord>,
    pub messages: Vec<Message>,
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    Key(KeyEvent),
    Paste(String),
    Mouse(MouseEventKind),
    Resize(u16, u16),
    Tick,
    /// An event of prompt `id`.
    Event {
        id: u64,
        event: AgentEvent,
    },
    /// The event stream of prompt `id` ended.
    PromptClosed {
        id: u64,
    },
    /// Prompt `id` could not be sent.
    PromptFailed {
        id: u64,
        failure: Failure,
    },
    AgentLoaded(Box<AgentLoad>),
    SessionsLoaded(Vec<SessionRecord>),
    Resumed {
        record: SessionRecord,
        messages: Vec<Message>,
    },
    SessionCreated(SessionRecord),
    SettingsChanged {
        settings: SessionSettings,
        change: SettingChange,
    },
    /// The answer to `Effect::Cancel`: whether a prompt was running.
    Cancelled {
        was_running: bool,
    },
    /// The gateway answered (a connection check or a reconnect attempt succeeded).
    Connected {
        agents: Vec<AgentInfo>,
    },
    /// A reconnect attempt failed; the runtime keeps trying.
    ReconnectFailed {
        attempt: u32,
        error: String,
    },
    /// The gateway took a decision on an approval request: the request as it is now.
    ApprovalAnswered(Approval),
    /// A decision on approval request `id` was refused or did not arrive.
    ApprovalFailed {
        id: String,
        failure: Failure,
    },
    /// A request failed; `action` says what was tried ("load the sessions").
    Failed {
        action: String,
        failure: Failure,
    },
}

/// Something the runtime must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    SendPrompt {
        id: u64,
        agent: String,
        session_key: String,
        message: String,
    },
    Cancel {
        agent: String,
        session_key: String,
    },
    /// Load an agent's settings, models and current session → `AgentLoaded`.
    LoadAgent {
        agent: String,
    },
    LoadSessions {
        agent: String,
    },
    Resume {
        agent: String,
        session_key: String,
        target: ResumeTarget,
    },
    NewSession {
        agent: String,
        session_key: String,
    },
    /// `None` clears the override.
    SetModel {
        agent: String,
        session_key: String,
        model: Option<String>,
    },
    SetVerbose {
        agent: String,
        session_key: String,
        on: bool,
    },
    /// Send a human's decision on approval request `id` → `ApprovalAnswered` or
    /// `ApprovalFailed`.
    DecideApproval {
        id: String,
        decision: ApprovalDecision,
    },
    /// Check that the gateway answers → `Connected` or `Failed` (unreachable).
    Probe,
    /// Retry with backoff until the gateway answers → `ReconnectFailed`…, `Connected`.
    Reconnect,
    Quit,
}

/// Apply `msg` to `app`; return what the runtime must do.
pub fn update(app: &mut App, msg: Msg) -> Vec<Effect> {
    match msg {
        Msg::Key(key) => on_key(app, key),
        Msg::Paste(text) => {
            if app.modal.is_none() {
                app.composer.insert_str(&text);
                app.history.reset();
            }
            Vec::new()
        }
        Msg::Mouse(kind) => {
            match kind {
                MouseEventKind::ScrollUp => scroll_up(app, WHEEL_LINES),
                MouseEventKind::ScrollDown => scroll_down(app, WHEEL_LINES),
                _ => {}
            }
            Vec::new()
        }
        Msg::Resize(w, h) => {
            app.size = (w, h);
            clamp_scroll(app);
            Vec::new()
        }
        Msg::Tick => {
            app.tick += 1;
            if app.tick.is_multiple_of(PROBE_EVERY_TICKS) && app.is_connected() && !app.is_running()
            {
                vec![Effect::Probe]
            } else {
                Vec::new()
            }
        }
        Msg::Event { id, event } => {
            if app.running.as_ref().is_some_and(|r| r.id == id) && on_event(app, event) {
                // The prompt failed: maybe because the gateway went away.
                return vec![Effect::Probe];
            }
            Vec::new()
        }
        Msg::PromptClosed { id } => {
            if app.running.as_ref().is_some_and(|r| r.id == id) {
                finish_prompt(app);
                app.error(
                    "Connection lost",
                    "The answer stopped before it finished: the connection to the gateway was interrupted.",
                    Some("The gateway may have restarted; the TUI checks the connection and reconnects by itself. Send the message again when it is back.".into()),
                );
                return vec![Effect::Probe];
            }
            Vec::new()
        }
        Msg::PromptFailed { id, failure } => {
            let Some(running) = app.running.clone().filter(|r| r.id == id) else {
                return Vec::new();
            };
            finish_prompt(app);
            if failure.unreachable {
                if app.composer.is_empty() {
                    app.composer.set_text(&running.message);
                }
                app.error(
                    "Not sent",
                    format!("The gateway at {} is unreachable.", app.url),
                    Some("The TUI reconnects by itself; your message is back in the input — press Enter to send it again once the status line says connected.".into()),
                );
                return go_reconnecting(app, &failure.message);
            }
            let (title, hint) = request_error(app, "send the message", &failure);
            app.error(title, failure.message, hint);
            Vec::new()
        }
        Msg::AgentLoaded(load) => {
            on_agent_loaded(app, *load);
            Vec::new()
        }
        Msg::SessionsLoaded(list) => {
            app.sessions = list.clone();
            if list.is_empty() {
                app.info(format!("No saved sessions for agent '{}' yet.", app.agent));
            } else {
                let selected = app
                    .session
                    .as_ref()
                    .and_then(|s| list.iter().position(|r| r.id == s.id))
                    .unwrap_or(0);
                app.modal = Some(Modal::Sessions { list, selected });
            }
            Vec::new()
        }
        Msg::Resumed { record, messages } => {
            app.modal = None;
            let title = record.title.clone().unwrap_or_else(|| "untitled".into());
            let note = format!(
                "Resumed session {} — {} ({} messages).",
                short_id(&record.id),
                title,
                record.message_count
            );
            app.load_session(Some(record), &messages);
            app.info(note);
            Vec::new()
        }
        Msg::SessionCreated(record) => {
            let note = format!(
                "New session {} started. The previous one is kept: /sessions lists it.",
                short_id(&record.id)
            );
            app.load_session(Some(record), &[]);
            app.info(note);
            Vec::new()
        }
        Msg::SettingsChanged { settings, change } => {
            app.model_override = settings.model_override.clone();
            app.verbose = settings.verbose.unwrap_or(false);
            match change {
                SettingChange::Model => {
                    app.fallback = None;
                    app.info(match &settings.model_override {
                        Some(m) => format!("Model for this session: {m}."),
                        None => format!("Model back to the agent's default: {}.", app.model()),
                    });
                }
                SettingChange::Verbose => app.info(if app.verbose {
                    "Verbose on: the model's thinking is shown."
                } else {
                    "Verbose off."
                }),
            }
            Vec::new()
        }
        Msg::Cancelled { was_running } => {
            if !was_running && app.running.as_ref().is_some_and(|r| r.cancelling) {
                app.notice = Some("the gateway had nothing running to cancel".into());
            }
            Vec::new()
        }
        Msg::Connected { agents } => {
            if !agents.is_empty() {
                app.agents = agents;
            }
            if let Connection::Reconnecting { .. } = app.connection {
                app.connection = Connection::Connected;
                app.info(format!("Reconnected to the gateway at {}.", app.url));
            }
            Vec::new()
        }
        Msg::ReconnectFailed { attempt, error } => {
            app.connection = Connection::Reconnecting { attempt, error };
            Vec::new()
        }
        Msg::ApprovalAnswered(approval) => {
            let follow = app.scroll == 0;
            upsert_approval(app, approval);
            if follow {
                app.scroll = 0;
            }
            Vec::new()
        }
        Msg::ApprovalFailed { id, failure } => {
            if let Some(card) = app.approval_mut(&id) {
                card.sending = None;
                // Decided elsewhere (or expired) meanwhile: the refusal says nothing new.
                if card.approval.status == ApprovalStatus::Pending {
                    card.error = Some(approval_error(&failure));
                }
            }
            if failure.unreachable {
                return go_reconnecting(app, &failure.message);
            }
            Vec::new()
        }
        Msg::Failed { action, failure } => {
            if failure.unreachable {
                return go_reconnecting(app, &failure.message);
            }
            let (title, hint) = request_error(app, &action, &failure);
            app.error(title, failure.message, hint);
            Vec::new()
        }
    }
}

/// Enter the reconnecting state (once) and ask the runtime to retry.
fn go_reconnecting(app: &mut App, error: &str) -> Vec<Effect> {
    if app.connection != Connection::Connected {
        return Vec::new();
    }
    app.connection = Connection::Reconnecting {
        attempt: 0,
        error: error.to_string(),
    };
    app.info(format!(
        "Gateway unreachable at {} — reconnecting…",
        app.url
    ));
    vec![Effect::Reconnect]
}

/// A title and hint for a failed request.
fn request_error(app: &App, action: &str, f: &Failure) -> (String, Option<String>) {
    match f.status {
        Some(401) => (
            "Not authorised".into(),
            Some("The gateway refused the API token. The TUI reads <BEIGE_HOME>/gateway.token; run it with the same BEIGE_HOME as the gateway.".into()),
        ),
        Some(403) if action == "set the model" => (
            "Model not allowed".into(),
            Some(format!(
                "Models allowed for '{}': {}.",
                app.agent,
                app.allowed_models().join(", ")
            )),
        ),
        Some(409) => (
            "Session busy".into(),
            Some("Another prompt is running in this session (maybe from another window). Wait for it, or /cancel it.".into()),
        ),
        _ => (format!("Could not {action}"), None),
    }
}

fn on_agent_loaded(app: &mut App, load: AgentLoad) {
    let switched = load.agent != app.agent;
    if switched {
        app.agent = load.agent.clone();
        app.session_key = session_key(&load.agent);
        app.modal = None;
    }
    app.models = load.models;
    app.model_override = load.settings.model_override.clone();
    app.verbose = load.settings.verbose.unwrap_or(false);
    let count = load.messages.len();
    app.load_session(load.session, &load.messages);
    if switched {
        app.info(format!(
            "Switched to agent '{}' (model {}).",
            app.agent,
            app.model()
        ));
    } else if count > 0 {
        if let Some(s) = &app.session {
            let note = format!(
                "Continuing session {} ({} messages). /new starts a fresh one, /sessions lists the others.",
                short_id(&s.id),
                s.message_count
            );
            app.info(note);
        }
    }
}

/// The first characters of a session id.
pub fn short_id(id: &str) -> String {
    id.chars().take(10).collect()
}

/// Show `approval` in its card (a new card when there is none yet); a decision in
/// flight for it is over.
fn upsert_approval(app: &mut App, approval: Approval) {
    match app.approval_mut(&approval.id) {
        Some(card) => {
            if approval.status != ApprovalStatus::Pending {
                card.sending = None;
                card.error = None;
            }
            card.approval = approval;
        }
        None => {
            stop_streaming_text(app);
            app.cells
                .push(Cell::Approval(Box::new(ApprovalCell::new(approval))));
        }
    }
}

/// What a failed decision shows on its card.
fn approval_error(f: &Failure) -> String {
    let what = match f.status {
        Some(403) => "not allowed to decide this request",
        Some(404) => "the gateway no longer knows this request",
        Some(409) => "the gateway refused the decision (already decided, or another call)",
        _ if f.unreachable => "the gateway is unreachable",
        _ => "the decision failed",
    };
    format!("{what}: {}", f.message)
}

/// The decision an approval key stands for, and how the card says it is being sent.
pub fn approval_key(c: char) -> Option<(ApprovalDecision, &'static str)> {
    Some(match c {
        'y' => (ApprovalDecision::approve(Scope::Once), "approve once"),
        's' => (
            ApprovalDecision::approve(Scope::Session),
            "approve for the session",
        ),
        'h' => (
            ApprovalDecision {
                duration_seconds: Some(3600),
                ..ApprovalDecision::approve(Scope::Duration)
            },
            "approve for 1 h",
        ),
        'a' => (ApprovalDecision::approve(Scope::Always), "approve always"),
        'n' => (ApprovalDecision::deny(None), "deny"),
        _ => return None,
    })
}

/// An approval key on an empty composer: decide the oldest answerable card.
fn decide(app: &mut App, c: char) -> Option<Vec<Effect>> {
    let (decision, label) = approval_key(c)?;
    let index = app.approval_target()?;
    let Some(Cell::Approval(card)) = app.cells.get_mut(index) else {
        return None;
    };
    card.sending = Some(label.to_string());
    card.error = None;
    let id = card.approval.id.clone();
    let decision = decision.with_digest(card.approval.call_digest.clone());
    Some(vec![Effect::DecideApproval { id, decision }])
}

fn finish_prompt(app: &mut App) {
    app.running = None;
    for cell in &mut app.cells {
        match cell {
            Cell::Assistant { streaming, .. } => *streaming = false,
            Cell::Tool(t) if t.status == ToolStatus::Running => t.status = ToolStatus::Interrupted,
            Cell::Approval(a) if a.approval.status == ApprovalStatus::Pending => a.closed = true,
            _ => {}
        }
    }
}

fn stop_streaming_text(app: &mut App) {
    if let Some(Cell::Assistant { streaming, .. }) = app.cells.last_mut() {
        *streaming = false;
    }
}

/// Title of a prompt error by kind.
pub fn error_title(kind: Option<ErrorKind>) -> &'static str {
    match kind {
        Some(ErrorKind::RateLimit) => "Rate limited",
        Some(ErrorKind::Overloaded) => "Provider overloaded",
        Some(ErrorKind::ContextOverflow) => "Conversation too long",
        Some(ErrorKind::Auth) => "Provider refused the API key",
        Some(ErrorKind::Timeout) => "Model timed out",
        Some(ErrorKind::InvalidRequest) => "Request rejected",
        _ => "Error",
    }
}

/// Apply one event of the running prompt; `true` when it failed (check the connection).
fn on_event(app: &mut App, event: AgentEvent) -> bool {
    // New output follows the bottom unless the user scrolled up.
    let follow = app.scroll == 0;
    let mut failed = false;
    match event {
        AgentEvent::TurnStarted { model, .. } => {
            app.fallback = (!model.is_empty() && model != app.model()).then_some(model);
        }
        AgentEvent::TextDelta { text } => {
            if let Some(r) = &mut app.running {
                r.got_text = true;
            }
            match app.cells.last_mut() {
                Some(Cell::Assistant {
                    text: t,
                    streaming: true,
                }) => t.push_str(&text),
                _ => app.cells.push(Cell::Assistant {
                    text,
                    streaming: true,
                }),
            }
        }
        AgentEvent::ThinkingDelta { text } => match app.cells.last_mut() {
            Some(Cell::Thinking { text: t }) => t.push_str(&text),
            _ => {
                stop_streaming_text(app);
                app.cells.push(Cell::Thinking { text });
            }
        },
        AgentEvent::ToolCallStarted { id, name, args } => {
            stop_streaming_text(app);
            if let Some(r) = &mut app.running {
                r.tool = Some(name.clone());
            }
            app.cells.push(Cell::Tool(ToolCell {
                id,
                name,
                args,
                status: ToolStatus::Running,
                output: String::new(),
                duration_ms: None,
                expanded: false,
            }));
        }
        AgentEvent::ToolOutput { id, text, .. } => {
            let running = app.cells.iter_mut().rev().find_map(|c| match c {
                Cell::Tool(t) if t.id == id && t.status == ToolStatus::Running => Some(t),
                _ => None,
            });
            if let Some(t) = running {
                t.output.push_str(&text);
                if t.output.len() > LIVE_OUTPUT_MAX {
                    let mut cut = t.output.len() - LIVE_OUTPUT_MAX;
                    while !t.output.is_char_boundary(cut) {
                        cut += 1;
                    }
                    t.output.drain(..cut);
                }
            }
        }
        AgentEvent::ToolCallFinished {
            id,
            name,
            output,
            is_error,
            duration_ms,
        } => {
            if let Some(r) = &mut app.running {
                r.tool = None;
            }
            let status = tool_status(is_error, &output);
            let existing = app.cells.iter_mut().rev().find_map(|c| match c {
                Cell::Tool(t) if t.id == id => Some(t),
                _ => None,
            });
            match existing {
                Some(t) => {
                    t.status = status;
                    t.output = output;
                    t.duration_ms = Some(duration_ms);
                }
                None => app.cells.push(Cell::Tool(ToolCell {
                    id,
                    name,
                    args: serde_json::Value::Null,
                    status,
                    output,
                    duration_ms: Some(duration_ms),
                    expanded: false,
                })),
            }
        }
        AgentEvent::ApprovalRequest { approval } | AgentEvent::ApprovalDecided { approval } => {
            upsert_approval(app, approval);
        }
        AgentEvent::ModelSwitched { from, to, reason } => {
            stop_streaming_text(app);
            app.fallback = (to != app.model()).then(|| to.clone());
            app.cells
                .push(Cell::Info(format!("Fallback: {from} → {to} ({reason}).")));
        }
        AgentEvent::Blocked { reason } => {
            finish_prompt(app);
            app.cells.push(Cell::Error(crate::app::ErrorCell {
                title: "Blocked".into(),
                message: reason,
                hint: Some("A prePrompt hook of the gateway stopped this message before it reached the model.".into()),
            }));
        }
        AgentEvent::Compacted {
            summarized_messages,
        } => {
            app.cells.push(Cell::Info(format!(
                "Compacted {summarized_messages} older messages into a summary."
            )));
        }
        AgentEvent::Usage { usage, cost, .. } => {
            app.tokens.add(&usage);
            app.cost += cost;
        }
        AgentEvent::Done {
            response,
            session_id,
            ..
        } => {
            let got_text = app.running.as_ref().is_some_and(|r| r.got_text);
            finish_prompt(app);
            if !got_text && !response.trim().is_empty() {
                app.cells.push(Cell::Assistant {
                    text: response,
                    streaming: false,
                });
            }
            match &mut app.session {
                Some(s) if s.id == session_id => {}
                _ => {
                    app.session = Some(SessionRecord {
                        id: session_id,
                        agent: app.agent.clone(),
                        key: app.session_key.clone(),
                        parent_id: None,
                        title: None,
                        model: Some(app.model()),
                        created: 0,
                        updated: 0,
                        message_count: 0,
                        usage: app.tokens,
                    })
                }
            }
        }
        AgentEvent::Error {
            message,
            kind,
            hint,
        } => {
            let cancelling = app.running.as_ref().is_some_and(|r| r.cancelling);
            finish_prompt(app);
            if message == "cancelled" || (cancelling && message.contains("cancel")) {
                app.cells.push(Cell::Info("Cancelled.".into()));
            } else {
                failed = true;
                let hint = hint.or_else(|| kind.and_then(hint_for).map(str::to_string));
                let title = if message.starts_with("lost the connection") {
                    "Connection lost"
                } else {
                    error_title(kind)
                };
                app.cells.push(Cell::Error(crate::app::ErrorCell {
                    title: title.into(),
                    message,
                    hint,
                }));
            }
        }
        _ => {}
    }
    if follow {
        app.scroll = 0;
    }
    failed
}

fn is_press(key: &KeyEvent) -> bool {
    key.kind != KeyEventKind::Release
}

fn on_key(app: &mut App, key: KeyEvent) -> Vec<Effect> {
    if !is_press(&key) {
        return Vec::new();
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('C')) {
        return ctrl_c(app, Instant::now());
    }
    app.notice = None;
    if app.modal.is_some() {
        return modal_key(app, key);
    }
    let alt = key.modifiers.contains(KeyModifiers::ALT);
    let shift = key.modifiers.contains(KeyModifiers::SHIFT);
    // y/s/h/a/n answer the oldest pending approval card — only on an empty composer, so
    // a message being typed is never cut short, and the key never reaches the composer.
    if let KeyCode::Char(c) = key.code {
        if !ctrl && !alt && app.composer.is_empty() {
            if let Some(effects) = decide(app, c) {
                return effects;
            }
        }
    }
    match key.code {
        KeyCode::Enter if shift || alt || ctrl => {
            app.composer.newline();
            app.history.reset();
        }
        KeyCode::Enter => return submit(app),
        KeyCode::Char('j') if ctrl => app.composer.newline(),
        KeyCode::Char('d') if ctrl => {
            if app.composer.is_empty() {
                return quit(app);
            }
            app.composer.delete();
        }
        KeyCode::Char('w') if ctrl => app.composer.delete_word(),
        KeyCode::Char('u') if ctrl => app.composer.clear(),
        KeyCode::Char('a') if ctrl => app.composer.home(),
        KeyCode::Char('e') if ctrl => app.composer.end(),
        KeyCode::Char('l') if ctrl => app.scroll = 0,
        KeyCode::Char(_) if ctrl => {}
        KeyCode::Char(c) => {
            app.composer.insert_char(c);
            app.history.reset();
        }
        KeyCode::Backspace if alt || ctrl => app.composer.delete_word(),
        KeyCode::Backspace => app.composer.backspace(),
        KeyCode::Delete => app.composer.delete(),
        KeyCode::Left => app.composer.left(),
        KeyCode::Right => app.composer.right(),
        KeyCode::Home if ctrl => scroll_up(app, usize::MAX / 2),
        KeyCode::End if ctrl => app.scroll = 0,
        KeyCode::Home => app.composer.home(),
        KeyCode::End => app.composer.end(),
        KeyCode::Up if shift => scroll_up(app, 1),
        KeyCode::Down if shift => scroll_down(app, 1),
        KeyCode::Up => {
            if app.composer.is_multiline() {
                app.composer.up();
            } else {
                let current = app.composer.text();
                if let Some(prev) = app.history.older(&current).map(str::to_string) {
                    app.composer.set_text(&prev);
                }
            }
        }
        KeyCode::Down => {
            if app.composer.is_multiline() {
                app.composer.down();
            } else if let Some(next) = app.history.newer() {
                app.composer.set_text(&next);
            }
        }
        KeyCode::PageUp => scroll_up(app, app.page().saturating_sub(2).max(1)),
        KeyCode::PageDown => scroll_down(app, app.page().saturating_sub(2).max(1)),
        KeyCode::Tab => toggle_last(app),
        KeyCode::BackTab => toggle_all(app),
        KeyCode::Esc => {
            if !app.composer.is_empty() {
                app.composer.clear();
                app.history.reset();
            } else {
                app.scroll = 0;
            }
        }
        _ => {}
    }
    Vec::new()
}

/// A key while a modal is open: the modal gets every key, and none reaches the
/// composer. No printable character closes a modal — otherwise typing `/quit` into the
/// help would close it on the `q` and leave `uit` in the input.
fn modal_key(app: &mut App, key: KeyEvent) -> Vec<Effect> {
    let Some(modal) = &mut app.modal else {
        return Vec::new();
    };
    match modal {
        Modal::Help { .. } => {
            if matches!(key.code, KeyCode::Esc | KeyCode::Enter) {
                app.modal = None;
            }
        }
        Modal::Sessions { list, selected } => match key.code {
            KeyCode::Esc => app.modal = None,
            KeyCode::Up | KeyCode::Char('k') => *selected = selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => {
                *selected = (*selected + 1).min(list.len().saturating_sub(1))
            }
            KeyCode::Enter => {
                if let Some(r) = list.get(*selected) {
                    let id = r.id.clone();
                    return resume(app, ResumeTarget::Id(id));
                }
            }
            KeyCode::Char(c) if c.is_ascii_digit() && c != '0' => {
                let n = usize::from(c as u8 - b'0');
                if n <= list.len() {
                    return resume(app, ResumeTarget::Index(n));
                }
            }
            _ => {}
        },
    }
    Vec::new()
}

/// Ctrl+C at `now`: cancel the running prompt, else clear the input; a second press
/// within [`DOUBLE_CTRL_C`] quits.
pub fn ctrl_c(app: &mut App, now: Instant) -> Vec<Effect> {
    let double = app
        .last_ctrl_c
        .is_some_and(|t| now.saturating_duration_since(t) < DOUBLE_CTRL_C);
    if double {
        return quit(app);
    }
    app.last_ctrl_c = Some(now);
    if app.modal.is_some() {
        app.modal = None;
        app.notice = Some("press Ctrl+C again to quit".into());
        return Vec::new();
    }
    if let Some(r) = &mut app.running {
        if !r.cancelling {
            r.cancelling = true;
            app.notice = Some("cancelling… press Ctrl+C again to quit".into());
            return vec![Effect::Cancel {
                agent: app.agent.clone(),
                session_key: app.session_key.clone(),
            }];
        }
        app.notice = Some("still cancelling… press Ctrl+C again to quit".into());
        return Vec::new();
    }
    if !app.composer.is_empty() {
        app.composer.clear();
        app.history.reset();
        app.notice = Some("input cleared — press Ctrl+C again to quit".into());
    } else {
        app.notice = Some("press Ctrl+C again to quit (or Ctrl+D)".into());
    }
    Vec::new()
}

fn quit(app: &mut App) -> Vec<Effect> {
    app.should_quit = true;
    let mut effects = Vec::new();
    if app.running.is_some() {
        effects.push(Effect::Cancel {
            agent: app.agent.clone(),
            session_key: app.session_key.clone(),
        });
    }
    effects.push(Effect::Quit);
    effects
}

fn submit(app: &mut App) -> Vec<Effect> {
    let text = app.composer.text();
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Vec::new();
    }
    if let Some(cmd) = commands::parse(trimmed) {
        let line = trimmed.to_string();
        app.history.push(&line);
        app.composer.clear();
        return command(app, cmd);
    }
    let message = match trimmed.strip_prefix("//") {
        Some(rest) => format!("/{rest}"),
        None => trimmed.to_string(),
    };
    if !app.is_connected() {
        app.notice =
            Some("the gateway is unreachable — reconnecting; your message stays here".into());
        return Vec::new();
    }
    if app.is_running() {
        app.notice = Some("an answer is still streaming — wait for it, or Ctrl+C to cancel".into());
        return Vec::new();
    }
    app.history.push(trimmed);
    app.composer.clear();
    app.push(Cell::User(message.clone()));
    let id = app.next_prompt_id;
    app.next_prompt_id += 1;
    app.running = Some(Running {
        id,
        message: message.clone(),
        cancelling: false,
        got_text: false,
        tool: None,
    });
    vec![Effect::SendPrompt {
        id,
        agent: app.agent.clone(),
        session_key: app.session_key.clone(),
        message,
    }]
}

fn busy(app: &mut App, what: &str) -> bool {
    if app.is_running() {
        app.notice = Some(format!(
            "an answer is still streaming — cancel it (Ctrl+C) before {what}"
        ));
        true
    } else {
        false
    }
}

fn resume(app: &mut App, target: ResumeTarget) -> Vec<Effect> {
    if busy(app, "resuming a session") {
        return Vec::new();
    }
    vec![Effect::Resume {
        agent: app.agent.clone(),
        session_key: app.session_key.clone(),
        target,
    }]
}

/// Run a slash command.
pub fn command(app: &mut App, cmd: Command) -> Vec<Effect> {
    match cmd {
        Command::Help => app.modal = Some(Modal::Help { notice: None }),
        Command::Unknown(name) => {
            app.modal = Some(Modal::Help {
                notice: Some(format!("unknown command {name}")),
            })
        }
        Command::New => {
            if !busy(app, "starting a new session") {
                return vec![Effect::NewSession {
                    agent: app.agent.clone(),
                    session_key: app.session_key.clone(),
                }];
            }
        }
        Command::Sessions | Command::Resume(None) => {
            return vec![Effect::LoadSessions {
                agent: app.agent.clone(),
            }]
        }
        Command::Resume(Some(arg)) => {
            let target = match arg.parse::<usize>() {
                Ok(n) if n >= 1 => ResumeTarget::Index(n),
                Ok(_) => {
                    app.notice = Some("sessions are numbered from 1 — see /sessions".into());
                    return Vec::new();
                }
                Err(_) => ResumeTarget::Id(arg),
            };
            return resume(app, target);
        }
        Command::Agent(None) => {
            let list: Vec<String> = app
                .agents
                .iter()
                .map(|a| {
                    if a.name == app.agent {
                        format!("{} (current, {})", a.name, a.model)
                    } else {
                        format!("{} ({})", a.name, a.model)
                    }
                })
                .collect();
            app.info(format!("Agents: {}. Switch with /agent <name>.", list.join(", ")));
        }
        Command::Agent(Some(name)) => {
            if name == app.agent {
                app.info(format!("Already talking to '{name}'."));
            } else if !app.agents.iter().any(|a| a.name == name) {
                let known: Vec<&str> = app.agents.iter().map(|a| a.name.as_str()).collect();
                app.error(
                    "Unknown agent",
                    format!("There is no agent '{name}'."),
                    Some(format!("Available agents: {}.", known.join(", "))),
                );
            } else if !busy(app, "switching agents") {
                return vec![Effect::LoadAgent { agent: name }];
            }
        }
        Command::Model(None) => {
            let current = app.fallback.clone().unwrap_or_else(|| app.model());
            let list: Vec<String> = app
                .allowed_models()
                .into_iter()
                .map(|m| if m == current { format!("{m} (current)") } else { m })
                .collect();
            app.info(format!(
                "Models for '{}': {}. Set one with /model <provider/model>; /model default clears it.",
                app.agent,
                list.join(", ")
            ));
        }
        Command::Model(Some(m)) => {
            let model = match m.as_str() {
                "default" | "reset" => None,
                _ if !m.contains('/') => {
                    app.error(
                        "Model not allowed",
                        format!("'{m}' is not of the form provider/model."),
                        Some(format!(
                            "Models allowed for '{}': {}.",
                            app.agent,
                            app.allowed_models().join(", ")
                        )),
                    );
                    return Vec::new();
                }
                _ => Some(m),
            };
            return vec![Effect::SetModel {
                agent: app.agent.clone(),
                session_key: app.session_key.clone(),
                model,
            }];
        }
        Command::Verbose(arg) => match arg.as_deref() {
            Some("on") | Some("off") => {
                return vec![Effect::SetVerbose {
                    agent: app.agent.clone(),
                    session_key: app.session_key.clone(),
                    on: arg.as_deref() == Some("on"),
                }]
            }
            _ => {
                let state = if app.verbose { "on" } else { "off" };
                app.info(format!("Verbose is {state}. Usage: /verbose on|off (or /v on|off)."));
            }
        },
        Command::Cancel => {
            if let Some(r) = &mut app.running {
                if !r.cancelling {
                    r.cancelling = true;
                    app.notice = Some("cancelling…".into());
                    return vec![Effect::Cancel {
                        agent: app.agent.clone(),
                        session_key: app.session_key.clone(),
                    }];
                }
            } else {
                app.notice = Some("nothing is running".into());
            }
        }
        Command::Clear => {
            app.cells.clear();
            app.scroll = 0;
        }
        Command::Compact => app.info(
            "/compact is not available in this version: the gateway compacts long sessions by itself. /new starts a fresh session.",
        ),
        Command::Quit => return quit(app),
    }
    Vec::new()
}

fn toggle_last(app: &mut App) {
    for cell in app.cells.iter_mut().rev() {
        if let Cell::Tool(t) = cell {
            t.expanded = !t.expanded;
            return;
        }
    }
    app.notice = Some("no tool call to expand yet".into());
}

fn toggle_all(app: &mut App) {
    let any_collapsed = app
        .cells
        .iter()
        .any(|c| matches!(c, Cell::Tool(t) if !t.expanded));
    for cell in &mut app.cells {
        if let Cell::Tool(t) = cell {
            t.expanded = any_collapsed;
        }
    }
}

fn max_scroll(app: &App) -> usize {
    let lines = crate::render::transcript_lines(app, app.size.0).len();
    lines.saturating_sub(crate::render::transcript_height(app, app.size))
}

fn clamp_scroll(app: &mut App) {
    app.scroll = app.scroll.min(max_scroll(app));
}

fn scroll_up(app: &mut App, n: usize) {
    app.scroll = app.scroll.saturating_add(n).min(max_scroll(app));
}

fn scroll_down(app: &mut App, n: usize) {
    app.scroll = app.scroll.saturating_sub(n);
}
