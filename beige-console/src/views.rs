//! The pages and fragments as plain values ([`askama`] templates in `templates/`,
//! HTML-escaped by default). Handlers build these from the gateway's answers; this
//! module decides nothing and calls nothing.

use askama::Template;
use beige_core::api::approvals::{Approval, ApprovalStatus};
use beige_core::api::auth::{Action, Caller};

use crate::assets::ASSETS;

/// What every page shares: title, who is logged in, the CSRF token for htmx, the assets.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The page's title.
    pub title: String,
    /// The user's name; `None` on the login page.
    pub user: Option<String>,
    /// The session's CSRF token (empty on the login page).
    pub csrf: String,
    /// Which navigation entry is the current page (`agents`, `approvals`, …).
    pub nav: &'static str,
    /// `/console/assets/htmx.<hash>.js`.
    pub htmx: String,
    /// The SSE extension's URL.
    pub sse: String,
    /// `console.js`'s URL.
    pub js: String,
    /// `console.css`'s URL.
    pub css: String,
    /// The icon's URL.
    pub icon: String,
}

impl Layout {
    /// A page's layout for `user` (or the login page when `None`).
    pub fn new(
        title: impl Into<String>,
        nav: &'static str,
        user: Option<&Caller>,
        csrf: &str,
    ) -> Self {
        Self {
            title: title.into(),
            user: user.map(|c| c.user.clone()),
            csrf: csrf.to_string(),
            nav,
            htmx: ASSETS.htmx.url(),
            sse: ASSETS.sse.url(),
            js: ASSETS.js.url(),
            css: ASSETS.css.url(),
            icon: ASSETS.icon.url(),
        }
    }

    /// The `hx-headers` of `<body>`: htmx sends the CSRF token with every request.
    pub fn hx_headers(&self) -> String {
        serde_json::json!({ "X-CSRF-Token": self.csrf }).to_string()
    }

    /// `aria-current="page"` for the current entry.
    pub fn current(&self, nav: &str) -> &'static str {
        if self.nav == nav {
            "page"
        } else {
            "false"
        }
    }
}

/// An error page (standalone: it is also shown before a layout exists).
#[derive(Debug, Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    /// The HTTP status.
    pub status: u16,
    /// Its reason phrase.
    pub title: String,
    /// What went wrong, for a person.
    pub message: String,
}

/// `GET /console/login`.
#[derive(Debug, Template)]
#[template(path = "login.html")]
pub struct LoginPage {
    /// The layout.
    pub l: Layout,
    /// The pre-session token (also in the double-submit cookie).
    pub login_csrf: String,
    /// Why the last attempt failed.
    pub error: Option<String>,
}

/// One agent on the Agents page.
#[derive(Debug, Clone)]
pub struct AgentCard {
    /// Its name.
    pub name: String,
    /// `provider/model`.
    pub model: String,
    /// Fallback models, joined.
    pub fallbacks: String,
    /// The sandbox's state in words.
    pub sandbox: String,
    /// Pending approvals.
    pub pending: usize,
    /// The caller's role on it.
    pub role: String,
    /// The caller's default session there, when they may prompt.
    pub chat_key: Option<String>,
}

/// `GET /console`.
#[derive(Debug, Template)]
#[template(path = "agents.html")]
pub struct AgentsPage {
    /// The layout.
    pub l: Layout,
    /// The agents the caller sees.
    pub agents: Vec<AgentCard>,
}

/// One entry of a transcript.
#[derive(Debug, Clone)]
pub enum Entry {
    /// The user's words.
    User(String),
    /// The model's words.
    Assistant(String),
    /// A tool call with its result.
    Tool(ToolCell),
}

/// A tool call as shown: the call, then exit code, duration and output once it ended.
#[derive(Debug, Clone, Template)]
#[template(path = "tool_cell.html")]
pub struct ToolCell {
    /// The element id (`tool-<hash>`).
    pub dom_id: String,
    /// The call as one line (`exec echo hi`).
    pub call: String,
    /// Still running.
    pub running: bool,
    /// `exit 0` when the output names an exit code.
    pub exit: Option<String>,
    /// `12 ms`, when known.
    pub duration: Option<String>,
    /// The output (the result's text without its `Exit code:` line).
    pub output: String,
    /// The call failed or was refused.
    pub is_error: bool,
    /// Sent out of band, replacing the running cell.
    pub oob: bool,
}

/// `GET /console/agents/{a}/sessions/{key}`.
#[derive(Debug, Template)]
#[template(path = "chat.html")]
pub struct ChatPage {
    /// The layout.
    pub l: Layout,
    /// The agent.
    pub agent: String,
    /// The session key.
    pub key: String,
    /// The transcript so far.
    pub entries: Vec<Entry>,
    /// The running turn's live view, when a turn runs.
    pub live: Option<LiveTurn>,
    /// Whether the caller may prompt here.
    pub may_prompt: bool,
}

/// A running turn's live view: connects to its event stream.
#[derive(Debug, Clone, Template)]
#[template(path = "live_turn.html")]
pub struct LiveTurn {
    /// The turn's id.
    pub id: String,
    /// The agent.
    pub agent: String,
    /// The session key.
    pub key: String,
    /// The session's CSRF token (for the Cancel form).
    pub csrf: String,
    /// The user's message that started it, when shown with it.
    pub message: Option<String>,
}

/// A piece of text of the running turn.
#[derive(Debug, Template)]
#[template(source = r#"<span class="delta">{{ text }}</span>"#, ext = "html")]
pub struct Delta {
    /// The text.
    pub text: String,
}

/// Output of a running tool, appended to its cell.
#[derive(Debug, Template)]
#[template(
    source = r#"<span hx-swap-oob="beforeend:#{{ dom_id }}-out">{{ text }}</span>"#,
    ext = "html"
)]
pub struct OutputChunk {
    /// The cell's id.
    pub dom_id: String,
    /// The new output.
    pub text: String,
}

/// The running turn's status line (out of band).
#[derive(Debug, Template)]
#[template(path = "turn_status.html")]
pub struct TurnStatus {
    /// The turn's id.
    pub id: String,
    /// `running`, `done` or `failed`.
    pub state: &'static str,
    /// The words.
    pub text: String,
}

/// An approval request as a card, with the buttons the caller's role allows.
#[derive(Debug, Clone, Template)]
#[template(path = "approval_card.html")]
pub struct ApprovalCard {
    /// The request's id.
    pub id: String,
    /// The element id.
    pub dom_id: String,
    /// The agent.
    pub agent: String,
    /// The session key.
    pub session: String,
    /// The exact call.
    pub call: String,
    /// The exec behind it.
    pub exec: Option<String>,
    /// The rule that asked.
    pub rule: Option<String>,
    /// Why the rule asks.
    pub justification: Option<String>,
    /// The policy's reason.
    pub reason: String,
    /// `pending`, `approved`, …
    pub status: String,
    /// Whether it waits for a decision.
    pub pending: bool,
    /// Who decided.
    pub decided_by: Option<String>,
    /// When it expires.
    pub expires_at: String,
    /// The call's digest (what the decision quotes).
    pub digest: String,
    /// The session's CSRF token (for the forms).
    pub csrf: String,
    /// Buttons allowed: approve once.
    pub can_once: bool,
    /// Approve for the session.
    pub can_session: bool,
    /// Sent out of band (replacing the card where it is).
    pub oob: bool,
}

impl ApprovalCard {
    /// The card of `a` for `caller`.
    pub fn new(a: &Approval, caller: &Caller, csrf: &str) -> Self {
        let pending = a.status == ApprovalStatus::Pending;
        let any = caller.may(Action::ApproveAny, &a.agent).is_ok();
        let own = caller.may(Action::ApproveOwn, &a.agent).is_ok()
            && caller.owns_session(&a.agent, &a.session);
        Self {
            id: a.id.clone(),
            dom_id: format!("approval-{}", crate::dom_id(&a.id)),
            agent: a.agent.clone(),
            session: a.session.clone(),
            call: a.call_line(),
            exec: a.exec.clone(),
            rule: a.rule.clone(),
            justification: a.justification.clone(),
            reason: a.reason.clone(),
            status: serde_json::to_value(a.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{:?}", a.status).to_lowercase()),
            pending,
            decided_by: a.decided_by.clone(),
            expires_at: a.expires_at.clone(),
            digest: a.call_digest.clone(),
            csrf: csrf.to_string(),
            can_once: pending && (any || own),
            can_session: pending && any,
            oob: false,
        }
    }
}

/// The approvals list (the page's live part).
#[derive(Debug, Template)]
#[template(path = "approval_list.html")]
pub struct ApprovalList {
    /// Pending first, then recently settled.
    pub cards: Vec<ApprovalCard>,
}

/// `GET /console/approvals`.
#[derive(Debug, Template)]
#[template(path = "approvals.html")]
pub struct ApprovalsPage {
    /// The layout.
    pub l: Layout,
    /// The list.
    pub list: ApprovalList,
}

/// One audit record as a row.
#[derive(Debug, Clone)]
pub struct AuditRow {
    /// `ts`.
    pub time: String,
    /// The agent.
    pub agent: String,
    /// `type`.
    pub kind: String,
    /// The tool.
    pub tool: String,
    /// `allowed`, `denied` or empty.
    pub decision: String,
    /// `phase`.
    pub phase: String,
    /// Who.
    pub principal: String,
    /// The arguments, joined.
    pub args: String,
    /// The record as JSON.
    pub json: String,
}

/// Rows of the audit table (also a follow update).
#[derive(Debug, Template)]
#[template(path = "audit_rows.html")]
pub struct AuditRows {
    /// Newest first.
    pub rows: Vec<AuditRow>,
}

/// The audit filters, as in the URL.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct AuditQuery {
    /// Only this agent.
    #[serde(default)]
    pub agent: String,
    /// Only this tool.
    #[serde(default)]
    pub tool: String,
    /// `allowed` or `denied`.
    #[serde(default)]
    pub decision: String,
    /// Only this principal.
    #[serde(default)]
    pub principal: String,
    /// Append new rows live.
    #[serde(default)]
    pub follow: String,
}

impl AuditQuery {
    /// Whether follow mode is on.
    pub fn following(&self) -> bool {
        matches!(self.follow.as_str(), "1" | "on" | "true")
    }

    /// The filters as a query string (for the follow stream).
    pub fn query_string(&self) -> String {
        let pairs = [
            ("agent", &self.agent),
            ("tool", &self.tool),
            ("decision", &self.decision),
            ("principal", &self.principal),
        ];
        pairs
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}", crate::url_encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// `GET /console/audit`.
#[derive(Debug, Template)]
#[template(path = "audit.html")]
pub struct AuditPage {
    /// The layout.
    pub l: Layout,
    /// The filters.
    pub q: AuditQuery,
    /// Agents the caller may filter by.
    pub agents: Vec<String>,
    /// The rows.
    pub rows: AuditRows,
}

/// One session on the Sessions page.
#[derive(Debug, Clone)]
pub struct SessionRow {
    /// The key.
    pub key: String,
    /// The id.
    pub id: String,
    /// The title.
    pub title: String,
    /// The model.
    pub model: String,
    /// Last update.
    pub updated: String,
    /// Messages.
    pub messages: u64,
    /// Tokens (input + output).
    pub tokens: u64,
}

/// `GET /console/agents/{a}/sessions`.
#[derive(Debug, Template)]
#[template(path = "sessions.html")]
pub struct SessionsPage {
    /// The layout.
    pub l: Layout,
    /// The agent.
    pub agent: String,
    /// The sessions, newest first.
    pub sessions: Vec<SessionRow>,
    /// The caller's default key, when they may prompt.
    pub own_key: Option<String>,
}

/// One row of the usage table.
#[derive(Debug, Clone)]
pub struct UsageLine {
    /// The group.
    pub key: String,
    /// Model calls.
    pub calls: u64,
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cost, formatted.
    pub cost: String,
}

/// `GET /console/usage`.
#[derive(Debug, Template)]
#[template(path = "usage.html")]
pub struct UsagePage {
    /// The layout.
    pub l: Layout,
    /// Per agent.
    pub rows: Vec<UsageLine>,
}
