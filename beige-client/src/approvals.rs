//! Approvals as clients see them: an [`Approval`] (one pending or settled question about
//! one exact call), the [`ApprovalDecision`] a human sends back, the [`ApprovalEvent`]s
//! that announce both, and the `ap:<id>:<o|s|h|a|d>` button codes channels put on
//! inline keyboards ([`ButtonCode`]).
//!
//! The gateway owns the lifecycle (beige-core's `approvals` module); these are the wire
//! shapes of `GET /api/approvals`, `POST /api/approvals/{id}/decision` and the
//! `approval_request` / `approval_decided` events of the SSE streams.

use serde::{Deserialize, Serialize};

/// Whether a prompt's sender answers approvals (`"approvals"` of a prompt request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Nobody answers: the run is unattended, and a call that needs approval is denied
    /// at once (with a report to the agent's owner). The default.
    #[default]
    None,
    /// The sender watches the prompt's event stream and answers `approval_request`
    /// events through the decision route (SSE clients, the TUI, Telegram).
    Stream,
}

/// What a request is about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalKind {
    /// A tool call a policy rule asks about (the default).
    #[default]
    Tool,
    /// An egress destination no rule allows (`egress.onUnknown: "ask"`): the call is
    /// `egress.connect <host>:<port> entry=<entry> mode=<mode>`, and an approval adds an
    /// exact host-and-port rule for the agent.
    Egress,
}

impl ApprovalKind {
    /// The name on the wire (`tool`, `egress`).
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Tool => "tool",
            ApprovalKind::Egress => "egress",
        }
    }

    /// Whether this is [`ApprovalKind::Tool`] (then the wire omits it).
    pub fn is_tool(&self) -> bool {
        *self == ApprovalKind::Tool
    }
}

/// How far an approval reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// This one call, once.
    Once,
    /// The same exact call for the rest of the session.
    Session,
    /// The same exact call for a while (`durationSeconds`).
    Duration,
    /// The same exact call from now on: a grant written to the agent's config.
    Always,
}

impl Scope {
    /// The name on the wire (`once`, `session`, `duration`, `always`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Once => "once",
            Scope::Session => "session",
            Scope::Duration => "duration",
            Scope::Always => "always",
        }
    }
}

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    /// Waiting for a human.
    Pending,
    /// Approved; a `once` approval waits for the call that uses it.
    Approved,
    /// Refused by a human.
    Denied,
    /// Nobody answered within `approvals.timeoutSeconds`, or a `once` approval was not
    /// used within `approvals.retryWindowSeconds`.
    Expired,
    /// A `once` approval that its call has used.
    Consumed,
}

impl ApprovalStatus {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Denied => "denied",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Consumed => "consumed",
        }
    }
}

/// One question about one exact call, and its answer once there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// 16 base32 characters (80 random bits).
    pub id: String,
    /// The agent that wants to make the call.
    pub agent: String,
    /// The session the call runs in.
    pub session: String,
    /// The exec that made the call, when a script in the sandbox made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// The tool (`exec`, `write`, `kv`, …).
    pub tool: String,
    /// Its arguments as the audit shows them.
    pub args: Vec<String>,
    /// The working directory under `/workspace`, when the call has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The rule that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why the rule asks, for the approver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub justification: Option<String>,
    /// The policy's reason.
    pub reason: String,
    /// SHA-256 (hex) of the canonical call: what a decision must quote.
    pub call_digest: String,
    /// Where it is in its life.
    pub status: ApprovalStatus,
    /// When it was asked (RFC 3339).
    pub requested_at: String,
    /// When a pending request expires (RFC 3339).
    pub expires_at: String,
    /// Who decided (`api-token`, `telegram:42`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// How far an approval reaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    /// The approver's words on a denial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    /// How many identical calls joined this request while it was pending.
    #[serde(default)]
    pub joined: u32,
    /// What the request is about (`tool` when absent).
    #[serde(default, skip_serializing_if = "ApprovalKind::is_tool")]
    pub kind: ApprovalKind,
    /// An egress request: how many connections to its host and port were refused
    /// while it was pending (the first included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
}

impl Approval {
    /// The call as one line for a prompt: `exec git push origin main`.
    pub fn call_line(&self) -> String {
        let mut line = self.tool.clone();
        for a in &self.args {
            line.push(' ');
            line.push_str(a);
        }
        line
    }
}

/// Approve or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Let the call run (within the scope).
    Approve,
    /// Refuse it.
    Deny,
}

/// A human's answer: the body of `POST /api/approvals/{id}/decision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    /// Approve or deny.
    pub decision: Verdict,
    /// How far an approval reaches (default `once`; ignored for a denial).
    #[serde(default = "once")]
    pub scope: Scope,
    /// For `scope: duration`: how long, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<u64>,
    /// The request's `callDigest`: a decision about another call is refused (HTTP 409).
    /// Required on the HTTP API; in-process channels bind by id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_digest: Option<String>,
    /// The approver's words, shown to the model on a denial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn once() -> Scope {
    Scope::Once
}

impl ApprovalDecision {
    /// Approve for `scope`.
    pub fn approve(scope: Scope) -> Self {
        Self {
            decision: Verdict::Approve,
            scope,
            duration_seconds: None,
            call_digest: None,
            reason: None,
        }
    }

    /// Deny, with the approver's words.
    pub fn deny(reason: Option<String>) -> Self {
        Self {
            decision: Verdict::Deny,
            scope: Scope::Once,
            duration_seconds: None,
            call_digest: None,
            reason,
        }
    }

    /// Quote the request's digest.
    pub fn with_digest(mut self, digest: impl Into<String>) -> Self {
        self.call_digest = Some(digest.into());
        self
    }
}

/// One place a request or an unattended denial is reported (`approvals.notify`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotifyTarget {
    /// The channel: `telegram`.
    pub channel: String,
    /// The chat to write to (Telegram: the chat id).
    pub chat_id: String,
}

/// What the approvals stream announces (`GET /api/approvals/events`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ApprovalEvent {
    /// A call waits for a human.
    ApprovalRequest {
        /// The request.
        approval: Approval,
    },
    /// A request was decided, expired or used.
    ApprovalDecided {
        /// The request as it is now.
        approval: Approval,
    },
    /// A call needed approval in a run nobody attends (a plain JSON prompt, a schedule,
    /// a sub-agent): it was denied at once; this is the report to the agent's owner.
    UnattendedDenied {
        /// The agent.
        agent: String,
        /// The session the call ran in.
        session: String,
        /// The call as one line.
        call: String,
        /// The rule that asked, when a rule did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        /// Why the run counts as unattended.
        origin: String,
        /// Where the report goes besides the event streams (`approvals.notify`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        notify: Vec<NotifyTarget>,
    },
}

impl ApprovalEvent {
    /// The agent the event concerns.
    pub fn agent(&self) -> &str {
        match self {
            ApprovalEvent::ApprovalRequest { approval }
            | ApprovalEvent::ApprovalDecided { approval } => &approval.agent,
            ApprovalEvent::UnattendedDenied { agent, .. } => agent,
        }
    }

    /// The session the event concerns.
    pub fn session(&self) -> &str {
        match self {
            ApprovalEvent::ApprovalRequest { approval }
            | ApprovalEvent::ApprovalDecided { approval } => &approval.session,
            ApprovalEvent::UnattendedDenied { session, .. } => session,
        }
    }
}

/// The answer a button stands for, as one letter of its `callback_data`
/// (`ap:<id>:<letter>`): `o` once, `s` session, `h` one hour, `a` always, `d` deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ButtonCode {
    /// Approve once.
    Once,
    /// Approve for the session.
    Session,
    /// Approve for one hour.
    Hour,
    /// Approve always.
    Always,
    /// Deny.
    Deny,
}

/// The prefix of approval buttons' callback data.
pub const BUTTON_PREFIX: &str = "ap:";

impl ButtonCode {
    /// Its letter.
    pub fn letter(self) -> char {
        match self {
            ButtonCode::Once => 'o',
            ButtonCode::Session => 's',
            ButtonCode::Hour => 'h',
            ButtonCode::Always => 'a',
            ButtonCode::Deny => 'd',
        }
    }

    /// The callback data of this button for approval `id`: `ap:<id>:<letter>`.
    pub fn callback_data(self, id: &str) -> String {
        format!("{BUTTON_PREFIX}{id}:{}", self.letter())
    }

    /// `(id, code)` of a button's callback data; `None` for anything else.
    pub fn parse(data: &str) -> Option<(&str, ButtonCode)> {
        let rest = data.strip_prefix(BUTTON_PREFIX)?;
        let (id, letter) = rest.rsplit_once(':')?;
        if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        let code = match letter {
            "o" => ButtonCode::Once,
            "s" => ButtonCode::Session,
            "h" => ButtonCode::Hour,
            "a" => ButtonCode::Always,
            "d" => ButtonCode::Deny,
            _ => return None,
        };
        Some((id, code))
    }

    /// The decision this button sends.
    pub fn decision(self) -> ApprovalDecision {
        match self {
            ButtonCode::Once => ApprovalDecision::approve(Scope::Once),
            ButtonCode::Session => ApprovalDecision::approve(Scope::Session),
            ButtonCode::Hour => ApprovalDecision {
                duration_seconds: Some(3600),
                ..ApprovalDecision::approve(Scope::Duration)
            },
            ButtonCode::Always => ApprovalDecision::approve(Scope::Always),
            ButtonCode::Deny => ApprovalDecision::deny(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn button_codes_round_trip_and_fit_telegram() {
        let id = "ABCDEFGHJKMNPQRS";
        for code in [
            ButtonCode::Once,
            ButtonCode::Session,
            ButtonCode::Hour,
            ButtonCode::Always,
            ButtonCode::Deny,
        ] {
            let data = code.callback_data(id);
            assert!(data.len() <= 64, "{data}");
            assert_eq!(ButtonCode::parse(&data), Some((id, code)));
        }
        assert_eq!(ButtonCode::parse("ap:ABC:x"), None);
        assert_eq!(ButtonCode::parse("ap::o"), None);
        assert_eq!(ButtonCode::parse("ap:A B:o"), None);
        assert_eq!(ButtonCode::parse("xx:ABC:o"), None);
        assert_eq!(ButtonCode::Hour.decision().duration_seconds, Some(3600));
        assert_eq!(ButtonCode::Deny.decision().decision, Verdict::Deny);
    }

    #[test]
    fn decisions_default_to_once() {
        let d: ApprovalDecision = serde_json::from_str(r#"{"decision":"approve"}"#).unwrap();
        assert_eq!(d.scope, Scope::Once);
        assert_eq!(d.call_digest, None);
        let e = serde_json::to_value(ApprovalEvent::UnattendedDenied {
            agent: "a".into(),
            session: "api:a:x".into(),
            call: "exec git push".into(),
            rule: Some("push".into()),
            origin: "plain JSON prompt".into(),
            notify: Vec::new(),
        })
        .unwrap();
        assert_eq!(e["type"], "unattended_denied");
    }
}
