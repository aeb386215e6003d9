//! The TUI's state: everything `render` draws and `update` changes — agents, the current
//! agent and session, the transcript cells, the composer and its history, scrolling, the
//! running prompt, token and cost totals, the connection state and the open modal.
//!
//! Nothing here talks to the gateway or the terminal.

use std::time::Instant;

use beige_client::approvals::{Approval, ApprovalStatus};
use beige_client::llm::{Block, Message, Role, ToolResultPart, Usage};
use beige_client::session::SessionRecord;
use beige_client::{AgentInfo, AllowedModel};

use crate::composer::{Composer, History};

/// The session key of an agent in the TUI.
pub fn session_key(agent: &str) -> String {
    format!("tui:{agent}:default")
}

/// How a tool call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStatus {
    Running,
    Ok,
    /// Ran and failed (non-zero exit code, tool error).
    Failed,
    /// Refused before it ran (policy or a `preToolExec` hook).
    Denied,
    /// The prompt ended (cancelled, failed) before the call finished.
    Interrupted,
}

/// One tool call in the transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCell {
    pub id: String,
    pub name: String,
    pub args: serde_json::Value,
    pub status: ToolStatus,
    pub output: String,
    pub duration_ms: Option<u64>,
    pub expanded: bool,
}

impl ToolCell {
    /// The exit code of an `exec` (from its `Exit code: N` first line).
    pub fn exit_code(&self) -> Option<i64> {
        self.output
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("Exit code: "))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    }

    /// The output without the `Exit code:` line.
    pub fn body(&self) -> &str {
        // While it runs, the output is live output of the command, all of it.
        if self.status != ToolStatus::Running && self.exit_code().is_some() {
            self.output.split_once('\n').map(|(_, b)| b).unwrap_or("")
        } else {
            &self.output
        }
    }
}

/// A problem shown as a friendly message with a hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCell {
    pub title: String,
    pub message: String,
    pub hint: Option<String>,
}

/// One approval request of the running prompt, as the gateway last described it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalCell {
    /// The request (its status, who decided, …) as the latest event or answer had it.
    pub approval: Approval,
    /// A decision was sent and its answer has not come back yet: what was sent
    /// (`approve once`, `deny`, …).
    pub sending: Option<String>,
    /// Why the last decision failed (the gateway's 403/409 text, unreachable, …).
    pub error: Option<String>,
    /// The prompt ended while the request was still pending here: nothing to answer.
    pub closed: bool,
}

impl ApprovalCell {
    pub fn new(approval: Approval) -> Self {
        Self {
            approval,
            sending: None,
            error: None,
            closed: false,
        }
    }

    /// Still waiting for this TUI's answer: pending, not being sent, prompt running.
    pub fn answerable(&self) -> bool {
        self.approval.status == ApprovalStatus::Pending && self.sending.is_none() && !self.closed
    }
}

/// One entry of the transcript.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    User(String),
    /// Markdown; `streaming` while text still arrives.
    Assistant {
        text: String,
        streaming: bool,
    },
    /// Model reasoning; shown (dimmed) only in verbose mode.
    Thinking {
        text: String,
    },
    Tool(ToolCell),
    /// A call waiting for (or given) a human's approval.
    Approval(Box<ApprovalCell>),
    Error(ErrorCell),
    /// A note from the TUI itself (new session, switched agent, …).
    Info(String),
}

/// The connection to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    Connected,
    /// Requests fail as unreachable; the runtime retries with backoff.
    Reconnecting {
        attempt: u32,
        error: String,
    },
}

/// The prompt currently streaming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: u64,
    pub message: String,
    /// Ctrl+C or /cancel was pressed; waiting for the gateway to stop.
    pub cancelling: bool,
    /// Assistant text arrived during this prompt.
    pub got_text: bool,
    /// A tool is running (its name).
    pub tool: Option<String>,
}

/// A view drawn over the transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Modal {
    Help {
        /// Shown above the help (e.g. `unknown command /foo`).
        notice: Option<String>,
    },
    Sessions {
        list: Vec<SessionRecord>,
        selected: usize,
    },
}

/// The whole state of the TUI.
#[derive(Debug, Clone)]
pub struct App {
    /// The gateway URL (for messages).
    pub url: String,
    pub agents: Vec<AgentInfo>,
    pub agent: String,
    pub session_key: String,
    /// The session the transcript shows, once known.
    pub session: Option<SessionRecord>,
    pub models: Vec<AllowedModel>,
    /// The session's model override (`/model`).
    pub model_override: Option<String>,
    /// The model answering instead of the configured one (after `ModelSwitched`).
    pub fallback: Option<String>,
    pub verbose: bool,
    pub cells: Vec<Cell>,
    pub composer: Composer,
    pub history: History,
    /// Lines scrolled up from the bottom (0 follows new output).
    pub scroll: usize,
    /// Terminal size (columns, rows), for paging.
    pub size: (u16, u16),
    pub running: Option<Running>,
    /// Tokens of the session (stored usage plus this run's `Usage` events).
    pub tokens: Usage,
    /// US dollars for the session.
    pub cost: f64,
    pub connection: Connection,
    pub modal: Option<Modal>,
    /// The last `/sessions` list (for `/resume <n>`).
    pub sessions: Vec<SessionRecord>,
    /// A one-line notice above the composer, cleared by the next key.
    pub notice: Option<String>,
    /// When Ctrl+C was last pressed (a second press within 2 s quits).
    pub last_ctrl_c: Option<Instant>,
    /// Ticks since start (spinner, periodic connection checks).
    pub tick: u64,
    /// Offset of local time from UTC in seconds (for session dates).
    pub utc_offset_secs: i32,
    pub should_quit: bool,
    pub next_prompt_id: u64,
}

impl App {
    /// A fresh state for `agent` (one of `agents`) on a terminal of `size`.
    pub fn new(
        url: impl Into<String>,
        agents: Vec<AgentInfo>,
        agent: &str,
        size: (u16, u16),
    ) -> Self {
        Self {
            url: url.into(),
            agents,
            agent: agent.to_string(),
            session_key: session_key(agent),
            session: None,
            models: Vec::new(),
            model_override: None,
            fallback: None,
            verbose: false,
            cells: Vec::new(),
            composer: Composer::default(),
            history: History::default(),
            scroll: 0,
            size,
            running: None,
            tokens: Usage::default(),
            cost: 0.0,
            connection: Connection::Connected,
            modal: None,
            sessions: Vec::new(),
            notice: None,
            last_ctrl_c: None,
            tick: 0,
            utc_offset_secs: 0,
            should_quit: false,
            next_prompt_id: 1,
        }
    }

    /// The current agent's info.
    pub fn agent_info(&self) -> Option<&AgentInfo> {
        self.agents.iter().find(|a| a.name == self.agent)
    }

    /// The model the session is configured to use (`provider/model`): the override, else
    /// the agent's primary.
    pub fn model(&self) -> String {
        self.model_override
            .clone()
            .or_else(|| self.agent_info().map(|a| a.model.clone()))
            .unwrap_or_default()
    }

    /// Every model the agent may use (`provider/model`), primary first.
    pub fn allowed_models(&self) -> Vec<String> {
        if !self.models.is_empty() {
            return self
                .models
                .iter()
                .map(|m| format!("{}/{}", m.provider, m.model))
                .collect();
        }
        self.agent_info()
            .map(|a| {
                std::iter::once(a.model.clone())
                    .chain(a.fallback_models.iter().cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    pub fn is_connected(&self) -> bool {
        self.connection == Connection::Connected
    }

    /// Add a cell and follow the output.
    pub fn push(&mut self, cell: Cell) {
        self.cells.push(cell);
        self.scroll = 0;
    }

    pub fn info(&mut self, text: impl Into<String>) {
        self.push(Cell::Info(text.into()));
    }

    pub fn error(
        &mut self,
        title: impl Into<String>,
        message: impl Into<String>,
        hint: Option<String>,
    ) {
        self.push(Cell::Error(ErrorCell {
            title: title.into(),
            message: message.into(),
            hint,
        }));
    }

    /// The index of the approval card the approval keys act on: the oldest answerable
    /// one.
    pub fn approval_target(&self) -> Option<usize> {
        self.cells
            .iter()
            .position(|c| matches!(c, Cell::Approval(a) if a.answerable()))
    }

    /// The approval card of request `id`.
    pub fn approval_mut(&mut self, id: &str) -> Option<&mut ApprovalCell> {
        self.cells.iter_mut().rev().find_map(|c| match c {
            Cell::Approval(a) if a.approval.id == id => Some(a.as_mut()),
            _ => None,
        })
    }

    /// Rows of the transcript area on the current terminal (for paging).
    pub fn page(&self) -> usize {
        usize::from(self.size.1).saturating_sub(4).max(1)
    }

    /// Cost of `usage` with the catalogue price of `model`, when the agent lists it.
    pub fn cost_of(&self, model: Option<&str>, usage: &Usage) -> f64 {
        let Some(model) = model else { return 0.0 };
        self.models
            .iter()
            .find(|m| format!("{}/{}", m.provider, m.model) == model)
            .map(|m| m.info.cost(usage))
            .unwrap_or(0.0)
    }

    /// Show a stored session: its messages become the transcript; tokens and cost start
    /// from its stored usage.
    pub fn load_session(&mut self, record: Option<SessionRecord>, messages: &[Message]) {
        self.cells = transcript(messages);
        self.scroll = 0;
        self.fallback = None;
        match &record {
            Some(r) => {
                self.tokens = r.usage;
                self.cost = self.cost_of(r.model.as_deref(), &r.usage);
            }
            None => {
                self.tokens = Usage::default();
                self.cost = 0.0;
            }
        }
        self.session = record;
    }
}

/// Cells for stored messages: user text, assistant text and thinking, and tool calls
/// joined with their results.
pub fn transcript(messages: &[Message]) -> Vec<Cell> {
    let mut cells: Vec<Cell> = Vec::new();
    for m in messages {
        for block in &m.content {
            match (m.role, block) {
                (Role::User, Block::Text { text }) => cells.push(Cell::User(text.clone())),
                (Role::Assistant, Block::Text { text }) if !text.trim().is_empty() => {
                    cells.push(Cell::Assistant {
                        text: text.clone(),
                        streaming: false,
                    })
                }
                (Role::Assistant, Block::Thinking { thinking, .. }) => cells.push(Cell::Thinking {
                    text: thinking.clone(),
                }),
                (_, Block::ToolUse { id, name, input }) => cells.push(Cell::Tool(ToolCell {
                    id: id.clone(),
                    name: name.clone(),
                    args: input.clone(),
                    status: ToolStatus::Interrupted,
                    output: String::new(),
                    duration_ms: None,
                    expanded: false,
                })),
                (
                    _,
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    },
                ) => {
                    let output = content
                        .iter()
                        .map(|p| match p {
                            ToolResultPart::Text { text } => text.as_str(),
                            ToolResultPart::Image { .. } => "[image]",
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    let cell = cells.iter_mut().rev().find_map(|c| match c {
                        Cell::Tool(t) if &t.id == tool_use_id => Some(t),
                        _ => None,
                    });
                    if let Some(t) = cell {
                        t.status = tool_status(*is_error, &output);
                        t.output = output;
                    }
                }
                (_, Block::Image { .. }) => cells.push(Cell::Info("[image]".into())),
                _ => {}
            }
        }
    }
    cells
}

/// Whether a finished call succeeded, failed or was refused.
pub fn tool_status(is_error: bool, output: &str) -> ToolStatus {
    if !is_error {
        ToolStatus::Ok
    } else if is_denial(output) {
        ToolStatus::Denied
    } else {
        ToolStatus::Failed
    }
}

/// The gateway's policy and `preToolExec` hooks refuse with these words.
pub fn is_denial(output: &str) -> bool {
    let o = output.trim_start();
    o.starts_with("Permission denied")
        || o.starts_with("Blocked")
        || o.starts_with("blocked")
        || o.starts_with("Denied")
        || o.starts_with("denied")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn transcript_pairs_tool_results() {
        let messages = vec![
            Message::user_text("list files"),
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::Text {
                        text: "Sure.".into(),
                    },
                    Block::ToolUse {
                        id: "t1".into(),
                        name: "exec".into(),
                        input: json!({"command": "ls"}),
                    },
                ],
            },
            Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: "t1".into(),
                    content: vec![ToolResultPart::Text {
                        text: "Exit code: 0\na\nb".into(),
                    }],
                    is_error: false,
                }],
            },
            Message::assistant_text("Two files."),
        ];
        let cells = transcript(&messages);
        assert_eq!(cells.len(), 4);
        match &cells[2] {
            Cell::Tool(t) => {
                assert_eq!(t.status, ToolStatus::Ok);
                assert_eq!(t.exit_code(), Some(0));
                assert_eq!(t.body(), "a\nb");
            }
            other => panic!("not a tool cell: {other:?}"),
        }
    }

    #[test]
    fn denials_are_recognised() {
        assert_eq!(
            tool_status(
                true,
                "Permission denied: tool 'git' is not allowed for agent 'a'"
            ),
            ToolStatus::Denied
        );
        assert_eq!(tool_status(true, "Exit code: 2\nboom"), ToolStatus::Failed);
        assert_eq!(tool_status(false, "Exit code: 0"), ToolStatus::Ok);
    }
}
