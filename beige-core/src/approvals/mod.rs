//! Approvals: the questions a policy's `Ask` raises, bound to the exact call, and the
//! humans' answers.
//!
//! Owns [`Approvals`], the gateway's broker: it creates a pending [`Approval`] for a call
//! (or joins an identical one already pending), holds the caller for a bounded time,
//! takes a decision from an approver who may make it ([`Approver`]; the agent, a plugin
//! and the gateway itself never may), expires what nobody answered, turns `session` and
//! `duration` approvals into live grants for that exact call, consumes a `once` approval
//! in the step that lets its call start, and announces every step on a broadcast stream
//! ([`ApprovalEvent`]) that the channels (HTTP SSE, TUI, Telegram) show. Every step is
//! audited (`type: "approval"`). Runs that nobody attends never wait here: the gateway
//! denies their asks before they reach the broker and reports them
//! ([`Approvals::report_unattended`]).
//!
//! A request is bound to SHA-256 of the canonical call `{agent, args, cwd, session_id,
//! stdin_sha256, tool}` ([`call_digest`]): another argument, working directory or session
//! is another call. The exec that made the call is recorded, not hashed, so a script that
//! re-runs the same call in a new exec of the same session finds its approval.

pub mod config;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use beige_client::approvals::{
    Approval, ApprovalDecision, ApprovalEvent, ApprovalKind, ApprovalStatus, Scope, Verdict,
};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, watch};

use crate::audit::{ApprovalAudit, AuditRecord, AuditSink};
use crate::policy::Principal;

pub use config::{ApprovalsConfig, NotifyTarget};

/// The call a request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFacts {
    /// The calling agent.
    pub agent: String,
    /// The session the call runs in.
    pub session: String,
    /// The exec that made it (a script's call).
    pub exec: Option<String>,
    /// The tool.
    pub tool: String,
    /// Its arguments, as the audit shows them.
    pub args: Vec<String>,
    /// Its working directory, when it has one.
    pub cwd: Option<String>,
    /// SHA-256 (hex) of the data piped into it.
    pub stdin_sha256: Option<String>,
    /// The rule that asked.
    pub rule: Option<String>,
    /// Why the rule asks.
    pub justification: Option<String>,
    /// The policy's reason.
    pub reason: String,
}

/// SHA-256 (hex) of the canonical JSON of the call: keys sorted, no whitespace.
pub fn call_digest(f: &CallFacts) -> String {
    let canonical = serde_json::json!({
        "agent": f.agent,
        "args": f.args,
        "cwd": f.cwd,
        "session_id": f.session,
        "stdin_sha256": f.stdin_sha256,
        "tool": f.tool,
    });
    // serde_json's map is ordered by key (no `preserve_order`), so this is canonical.
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

/// Who answers, and what they may decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approver {
    /// Who it is, as the channel saw the connection.
    pub principal: Principal,
    /// What they may decide.
    pub role: ApproverRole,
    /// The channel the decision came through (`api`, `telegram`, `tui`, `cli`).
    pub via: String,
}

/// What an approver may decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApproverRole {
    /// Any decision for any agent (the gateway token's holder).
    Owner,
    /// `once` approvals and denials, for sessions whose key starts with `sessions`
    /// (a Telegram user in their own chat: `telegram:<chat>`).
    Member {
        /// The session key prefix the member's chat owns.
        sessions: String,
    },
}

impl Approver {
    /// The gateway token's holder over the HTTP API (or the TUI and CLI, which use it).
    pub fn owner(via: impl Into<String>) -> Self {
        Self {
            principal: Principal::ApiToken,
            role: ApproverRole::Owner,
            via: via.into(),
        }
    }

    /// How the audit and the other channels name the approver.
    pub fn name(&self) -> String {
        principal_name(&self.principal)
    }
}

/// How the audit names a principal: `api-token`, `telegram:42`, `sandbox`, ….
pub fn principal_name(p: &Principal) -> String {
    match p {
        Principal::User { channel, id } => format!("{channel}:{id}"),
        Principal::ApiToken => "api-token".into(),
        Principal::Sandbox => "sandbox".into(),
        Principal::Embedder => "embedder".into(),
        Principal::Unverified => "unverified".into(),
        Principal::Person { name, .. } => name.clone(),
        _ => "unknown".into(),
    }
}

/// Why a decision was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// No request of that id (HTTP 404).
    #[error("no approval request '{0}'; list the pending ones with `beige approvals list`")]
    NotFound(String),
    /// The request is no longer pending (HTTP 409).
    #[error("approval {id} is already {status}{by}", status = .status.as_str(), by = .by.as_deref().map(|b| format!(" (by {b})")).unwrap_or_default())]
    Settled {
        /// The request.
        id: String,
        /// Its status.
        status: ApprovalStatus,
        /// Who settled it.
        by: Option<String>,
    },
    /// The decision quotes another call's digest (HTTP 409).
    #[error("approval {id} is about another call: the callDigest sent does not match; fetch the request again and check the call")]
    DigestMismatch {
        /// The request.
        id: String,
    },
    /// The approver may not take this decision (HTTP 403).
    #[error("{0}")]
    Forbidden(String),
    /// The decision itself is malformed (HTTP 400).
    #[error("{0}")]
    Invalid(String),
}

/// How an ask ended for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskOutcome {
    /// The call may run; `approval` is the request that let it.
    Approved {
        /// The request's id.
        approval: String,
        /// Who approved.
        by: String,
    },
    /// A human refused it.
    Denied {
        /// The request's id.
        approval: String,
        /// Who refused.
        by: String,
        /// Their words.
        reason: Option<String>,
    },
    /// Nobody answered in time; the request is gone.
    Expired {
        /// The request's id.
        approval: String,
    },
    /// Still waiting after the hold; the request stays open.
    Pending {
        /// The request.
        approval: Box<Approval>,
    },
    /// The session already has `maxPendingPerSession` requests waiting.
    TooMany {
        /// The limit.
        limit: usize,
    },
}

#[derive(Debug)]
struct Entry {
    view: Approval,
    expires: Instant,
    /// Set when a `once` approval was given: it lapses at this instant unless used.
    usable_until: Option<Instant>,
    status_tx: watch::Sender<ApprovalStatus>,
    created: Instant,
}

/// A live `session` or `duration` grant for one exact call.
#[derive(Debug, Clone)]
struct LiveGrant {
    digest: String,
    until: Option<Instant>,
    approval: String,
    by: String,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    grants: Vec<LiveGrant>,
    /// Counts every settling step (decision, expiry, use), so that what is derived from
    /// the decisions (egress rules) knows when to look again.
    generation: u64,
}

/// A settled request, as [`Approvals::settled`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The request as it is now (`approved`, `consumed` or `denied`).
    pub approval: Approval,
    /// When what it grants ends: a `duration` grant's end, an unused `once` approval's
    /// lapse; `None` for no end of its own.
    pub until: Option<Instant>,
}

/// The gateway's approvals broker (see the module docs).
#[derive(Debug)]
pub struct Approvals {
    config: Mutex<ApprovalsConfig>,
    state: Mutex<State>,
    events: broadcast::Sender<ApprovalEvent>,
    audit: Arc<dyn AuditSink>,
}

/// Settled requests are kept this long for `GET /api/approvals/{id}` and the footer.
const KEEP_SETTLED: Duration = Duration::from_secs(3600);
/// Most settled requests kept.
const MAX_SETTLED: usize = 1000;

/// A fresh request id: 16 base32 characters (80 random bits).
fn new_id() -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let bits = rand::random::<u128>();
    (0..16)
        .map(|i| ALPHABET[((bits >> (i * 5)) & 31) as usize] as char)
        .collect()
}

fn rfc3339_in(d: Duration) -> String {
    let at = chrono::Local::now() + chrono::Duration::from_std(d).unwrap_or_default();
    at.format("%Y-%m-%dT%H:%M:%S%.3f%:z").to_string()
}

impl Approvals {
    /// A broker with `config`'s bounds, auditing to `audit`.
    pub fn new(config: ApprovalsConfig, audit: Arc<dyn AuditSink>) -> Self {
        let (events, _) = broadcast::channel(256);
        Self {
            config: Mutex::new(config),
            state: Mutex::new(State::default()),
            events,
            audit,
        }
    }

    /// The bounds now.
    pub fn config(&self) -> ApprovalsConfig {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// New bounds (a config reload); requests already pending keep their expiry.
    pub fn set_config(&self, config: ApprovalsConfig) {
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
    }

    /// Every step from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ApprovalEvent> {
        self.events.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn announce(&self, event: ApprovalEvent) {
        // Nobody listening is fine: the request is still in `list`.
        let _ = self.events.send(event);
    }

    async fn audit(&self, view: &Approval, phase: &str, approver: Option<&Approver>) {
        let mut r = AuditRecord::security(
            &view.agent,
            &view.tool,
            view.args.clone(),
            match phase {
                "decided" if view.status == ApprovalStatus::Approved => {
                    crate::audit::AuditDecision::Allowed
                }
                "consumed" => crate::audit::AuditDecision::Allowed,
                _ => crate::audit::AuditDecision::Denied,
            },
        );
        r.kind = crate::audit::AuditType::Approval;
        r.session = Some(view.session.clone());
        r.approval = Some(ApprovalAudit {
            id: view.id.clone(),
            phase: phase.to_string(),
            call_digest: view.call_digest.clone(),
            rule: view.rule.clone(),
            scope: view.scope.map(|s| s.as_str().to_string()),
            approver: approver.map(Approver::name).or(view.decided_by.clone()),
            via: approver.map(|a| a.via.clone()),
            reason: view.decision_reason.clone(),
            exec: view.exec.clone(),
            cwd: view.cwd.clone(),
        });
        if let Err(e) = self.audit.record(&r).await {
            tracing::error!(error = %e, approval = %view.id, phase, "could not audit an approval step");
        }
    }

    /// Expire what is due; drop old settled entries and ended grants. Returns the
    /// requests that expired now.
    fn sweep(state: &mut State, now: Instant) -> Vec<Approval> {
        let mut expired = Vec::new();
        for e in state.entries.values_mut() {
            let lapsed = match e.view.status {
                ApprovalStatus::Pending => now >= e.expires,
                ApprovalStatus::Approved => {
                    e.view.scope == Some(Scope::Once) && e.usable_until.is_some_and(|u| now >= u)
                }
                _ => false,
            };
            if lapsed {
                e.view.status = ApprovalStatus::Expired;
                state.generation += 1;
                let _ = e.status_tx.send(ApprovalStatus::Expired);
                expired.push(e.view.clone());
            }
        }
        state.entries.retain(|_, e| {
            matches!(
                e.view.status,
                ApprovalStatus::Pending | ApprovalStatus::Approved
            ) || now.duration_since(e.created) < KEEP_SETTLED
        });
        if state.entries.len() > MAX_SETTLED {
            let mut settled: Vec<(Instant, String)> = state
                .entries
                .iter()
                .filter(|(_, e)| {
                    !matches!(
                        e.view.status,
                        ApprovalStatus::Pending | ApprovalStatus::Approved
                    )
                })
                .map(|(id, e)| (e.created, id.clone()))
                .collect();
            settled.sort();
            let excess = state.entries.len() - MAX_SETTLED;
            for (_, id) in settled.into_iter().take(excess) {
                state.entries.remove(&id);
            }
        }
        state.grants.retain(|g| g.until.is_none_or(|u| now < u));
        expired
    }

    async fn publish_expired(&self, expired: Vec<Approval>) {
        for view in expired {
            self.audit(&view, "expired", None).await;
            self.announce(ApprovalEvent::ApprovalDecided { approval: view });
        }
    }

    /// Whether a live grant or an unused `once` approval already covers the call; a
    /// `once` approval is consumed by this check.
    async fn covered(&self, digest: &str) -> Option<AskOutcome> {
        let (outcome, consumed, expired) =
            {
                let mut state = self.lock();
                let expired = Self::sweep(&mut state, Instant::now());
                let mut consumed = None;
                let mut outcome = state.grants.iter().find(|g| g.digest == digest).map(|g| {
                    AskOutcome::Approved {
                        approval: g.approval.clone(),
                        by: g.by.clone(),
                    }
                });
                if outcome.is_none() {
                    if let Some(e) = state.entries.values_mut().find(|e| {
                        e.view.call_digest == digest
                            && e.view.status == ApprovalStatus::Approved
                            && e.view.scope == Some(Scope::Once)
                    }) {
                        e.view.status = ApprovalStatus::Consumed;
                        let _ = e.status_tx.send(ApprovalStatus::Consumed);
                        outcome = Some(AskOutcome::Approved {
                            approval: e.view.id.clone(),
                            by: e.view.decided_by.clone().unwrap_or_default(),
                        });
                        consumed = Some(e.view.clone());
                    }
                    if consumed.is_some() {
                        state.generation += 1;
                    }
                }
                (outcome, consumed, expired)
            };
        self.publish_expired(expired).await;
        if let Some(view) = consumed {
            self.audit(&view, "consumed", None).await;
            self.announce(ApprovalEvent::ApprovalDecided { approval: view });
        }
        outcome
    }

    /// Ask about `call`: covered by a grant or an unused `once` approval → approved at
    /// once; else a new pending request (or the identical one already pending), and
    /// the caller holds up to `hold` for the answer.
    pub async fn ask(&self, call: CallFacts, hold: Duration) -> AskOutcome {
        self.ask_kind(call, ApprovalKind::Tool, hold).await
    }

    /// [`Approvals::ask`] for a request of `kind`. An egress request counts its
    /// `attempts` (1 when made; each identical call that joins it adds one).
    pub async fn ask_kind(
        &self,
        call: CallFacts,
        kind: ApprovalKind,
        hold: Duration,
    ) -> AskOutcome {
        let digest = call_digest(&call);
        if let Some(done) = self.covered(&digest).await {
            return done;
        }
        let (mut rx, created, id): (_, _, String) = {
            let mut state = self.lock();
            let joined = state
                .entries
                .values_mut()
                .find(|e| e.view.call_digest == digest && e.view.status == ApprovalStatus::Pending);
            match joined {
                Some(e) => {
                    e.view.joined += 1;
                    if let Some(n) = e.view.attempts.as_mut() {
                        *n = n.saturating_add(1);
                    }
                    (e.status_tx.subscribe(), None, e.view.id.clone())
                }
                None => {
                    let pending = state
                        .entries
                        .values()
                        .filter(|e| {
                            e.view.session == call.session
                                && e.view.status == ApprovalStatus::Pending
                        })
                        .count();
                    let config = self.config();
                    if pending >= config.max_pending_per_session {
                        return AskOutcome::TooMany {
                            limit: config.max_pending_per_session,
                        };
                    }
                    let id = new_id();
                    let timeout = config.timeout();
                    let view = Approval {
                        id: id.clone(),
                        agent: call.agent,
                        session: call.session,
                        exec: call.exec,
                        tool: call.tool,
                        args: call.args,
                        cwd: call.cwd,
                        rule: call.rule,
                        justification: call.justification,
                        reason: call.reason,
                        call_digest: digest.clone(),
                        status: ApprovalStatus::Pending,
                        requested_at: rfc3339_in(Duration::ZERO),
                        expires_at: rfc3339_in(timeout),
                        decided_by: None,
                        scope: None,
                        decision_reason: None,
                        joined: 0,
                        kind,
                        attempts: (kind == ApprovalKind::Egress).then_some(1),
                    };
                    let (status_tx, rx) = watch::channel(ApprovalStatus::Pending);
                    let now = Instant::now();
                    state.entries.insert(
                        id.clone(),
                        Entry {
                            view: view.clone(),
                            expires: now + timeout,
                            usable_until: None,
                            status_tx,
                            created: now,
                        },
                    );
                    (rx, Some(view), id)
                }
            }
        };
        if let Some(view) = created {
            self.audit(&view, "requested", None).await;
            self.announce(ApprovalEvent::ApprovalRequest { approval: view });
        }
        let deadline = {
            let state = self.lock();
            state
                .entries
                .get(&id)
                .map(|e| e.expires)
                .unwrap_or_else(Instant::now)
        };
        let hold_until = (Instant::now() + hold).min(deadline);
        loop {
            let status = *rx.borrow_and_update();
            match status {
                ApprovalStatus::Pending => {}
                ApprovalStatus::Approved | ApprovalStatus::Consumed => {
                    return self.after_approval(&id, &digest).await;
                }
                ApprovalStatus::Denied => {
                    let state = self.lock();
                    let view = state.entries.get(&id).map(|e| e.view.clone());
                    return AskOutcome::Denied {
                        approval: id.clone(),
                        by: view
                            .as_ref()
                            .and_then(|v| v.decided_by.clone())
                            .unwrap_or_default(),
                        reason: view.and_then(|v| v.decision_reason),
                    };
                }
                ApprovalStatus::Expired => return AskOutcome::Expired { approval: id },
            }
            let now = Instant::now();
            if now >= hold_until {
                if now >= deadline {
                    let expired = Self::sweep(&mut self.lock(), now);
                    self.publish_expired(expired).await;
                    return AskOutcome::Expired { approval: id };
                }
                let view = self.lock().entries.get(&id).map(|e| e.view.clone());
                return match view {
                    Some(approval) => AskOutcome::Pending {
                        approval: Box::new(approval),
                    },
                    None => AskOutcome::Expired { approval: id },
                };
            }
            if tokio::time::timeout(hold_until - now, rx.changed())
                .await
                .is_ok_and(|r| r.is_err())
            {
                // The entry is gone: treat as expired.
                return AskOutcome::Expired { approval: id };
            }
        }
    }

    /// The request was approved while this caller held: a grant covers the call, or
    /// this caller consumes the `once` approval (if another identical call took it
    /// first, this one asks again on its next try).
    async fn after_approval(&self, id: &str, digest: &str) -> AskOutcome {
        match self.covered(digest).await {
            Some(done) => done,
            None => {
                let state = self.lock();
                match state.entries.get(id) {
                    Some(e) => AskOutcome::Pending {
                        approval: Box::new(e.view.clone()),
                    },
                    None => AskOutcome::Expired {
                        approval: id.to_string(),
                    },
                }
            }
        }
    }

    /// A human's decision on request `id`. The first decision wins.
    pub async fn decide(
        &self,
        id: &str,
        decision: &ApprovalDecision,
        approver: &Approver,
    ) -> Result<Approval, DecideError> {
        let result = self.decide_locked(id, decision, approver);
        match &result {
            Ok((view, expired)) => {
                self.publish_expired(expired.clone()).await;
                self.audit(view, "decided", Some(approver)).await;
                self.announce(ApprovalEvent::ApprovalDecided {
                    approval: view.clone(),
                });
            }
            Err(e) => {
                let view = self.lock().entries.get(id).map(|e| e.view.clone());
                if let Some(mut view) = view {
                    view.decision_reason = Some(e.to_string());
                    self.audit(&view, "refused", Some(approver)).await;
                }
            }
        }
        result.map(|(v, _)| v)
    }

    fn decide_locked(
        &self,
        id: &str,
        d: &ApprovalDecision,
        approver: &Approver,
    ) -> Result<(Approval, Vec<Approval>), DecideError> {
        let now = Instant::now();
        let retry_window = self.config().retry_window();
        let mut state = self.lock();
        let expired = Self::sweep(&mut state, now);
        let Some(entry) = state.entries.get_mut(id) else {
            return Err(DecideError::NotFound(id.to_string()));
        };
        if entry.view.status != ApprovalStatus::Pending {
            return Err(DecideError::Settled {
                id: id.to_string(),
                status: entry.view.status,
                by: entry.view.decided_by.clone(),
            });
        }
        if let Some(digest) = &d.call_digest {
            if digest != &entry.view.call_digest {
                return Err(DecideError::DigestMismatch { id: id.to_string() });
            }
        }
        may_decide(approver, &entry.view, d)?;
        let until = match (d.decision, d.scope) {
            (Verdict::Approve, Scope::Duration) => match d.duration_seconds {
                Some(s) if s > 0 => Some(now + Duration::from_secs(s)),
                _ => {
                    return Err(DecideError::Invalid(
                        "scope 'duration' needs durationSeconds (1 or more)".into(),
                    ))
                }
            },
            _ => None,
        };
        entry.view.decided_by = Some(approver.name());
        entry.view.decision_reason = d.reason.clone();
        let status = match d.decision {
            Verdict::Deny => ApprovalStatus::Denied,
            Verdict::Approve => {
                entry.view.scope = Some(d.scope);
                if d.scope == Scope::Once {
                    entry.usable_until = Some(now + retry_window);
                }
                ApprovalStatus::Approved
            }
        };
        entry.view.status = status;
        let view = entry.view.clone();
        let tx = entry.status_tx.clone();
        state.generation += 1;
        if d.decision == Verdict::Approve && d.scope != Scope::Once {
            state.grants.push(LiveGrant {
                digest: view.call_digest.clone(),
                until,
                approval: view.id.clone(),
                by: approver.name(),
            });
        }
        drop(state);
        let _ = tx.send(status);
        Ok((view, expired))
    }

    /// Every request still kept, newest first; only `agent`'s when given.
    pub fn list(&self, agent: Option<&str>) -> Vec<Approval> {
        let mut state = self.lock();
        let _ = Self::sweep(&mut state, Instant::now());
        let mut out: Vec<(Instant, Approval)> = state
            .entries
            .values()
            .filter(|e| agent.is_none_or(|a| e.view.agent == a))
            .map(|e| (e.created, e.view.clone()))
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse(e.0));
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// One request.
    pub fn get(&self, id: &str) -> Option<Approval> {
        self.lock().entries.get(id).map(|e| e.view.clone())
    }

    /// How many settling steps (decisions, expiries, uses) there have been: it changes
    /// whenever [`Approvals::settled`] may answer differently.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The settled requests of kind `kind` of `agent` still kept: approved (a `once`
    /// approval not used yet, or a grant), used `once` approvals and denials, each with
    /// the end of what it grants. Settled requests are kept for an hour after they were
    /// asked; grants as long as they last.
    pub fn settled(&self, agent: &str, kind: ApprovalKind) -> Vec<Settled> {
        let mut state = self.lock();
        let _ = Self::sweep(&mut state, Instant::now());
        state
            .entries
            .values()
            .filter(|e| e.view.agent == agent && e.view.kind == kind)
            .filter(|e| {
                matches!(
                    e.view.status,
                    ApprovalStatus::Approved | ApprovalStatus::Consumed | ApprovalStatus::Denied
                )
            })
            .filter_map(|e| {
                let until = match (e.view.status, e.view.scope) {
                    (ApprovalStatus::Approved, Some(Scope::Once)) => e.usable_until,
                    // A grant that has ended grants nothing any more.
                    (ApprovalStatus::Approved, _) => {
                        state.grants.iter().find(|g| g.approval == e.view.id)?.until
                    }
                    _ => None,
                };
                Some(Settled {
                    approval: e.view.clone(),
                    until,
                })
            })
            .collect()
    }

    /// Use the `once` approval `id` (its call has started): it is `consumed` from now
    /// on. `false` when it is not an unused `once` approval.
    pub async fn consume(&self, id: &str) -> bool {
        let view = {
            let mut state = self.lock();
            let State {
                entries,
                generation,
                ..
            } = &mut *state;
            match entries.get_mut(id) {
                Some(e)
                    if e.view.status == ApprovalStatus::Approved
                        && e.view.scope == Some(Scope::Once) =>
                {
                    e.view.status = ApprovalStatus::Consumed;
                    let _ = e.status_tx.send(ApprovalStatus::Consumed);
                    *generation += 1;
                    e.view.clone()
                }
                _ => return false,
            }
        };
        self.audit(&view, "consumed", None).await;
        self.announce(ApprovalEvent::ApprovalDecided { approval: view });
        true
    }

    /// Waits up to `hold` for pending request `id` to be settled; the request as it is
    /// then (`None` when the broker no longer keeps it).
    pub async fn wait(&self, id: &str, hold: Duration) -> Option<Approval> {
        let mut rx = {
            let state = self.lock();
            let e = state.entries.get(id)?;
            if e.view.status != ApprovalStatus::Pending {
                return Some(e.view.clone());
            }
            e.status_tx.subscribe()
        };
        let _ = tokio::time::timeout(
            hold,
            rx.wait_for(|status| *status != ApprovalStatus::Pending),
        )
        .await;
        self.get(id)
    }

    /// Another call joined pending request `id` without asking again (egress: one more
    /// refused connection to its host and port): its `attempts` (or `joined`) grows by
    /// one. The request as it is now; `None` when it is no longer pending.
    pub fn note_attempt(&self, id: &str) -> Option<Approval> {
        let mut state = self.lock();
        let _ = Self::sweep(&mut state, Instant::now());
        let e = state.entries.get_mut(id)?;
        if e.view.status != ApprovalStatus::Pending {
            return None;
        }
        match e.view.attempts.as_mut() {
            Some(n) => *n = n.saturating_add(1),
            None => e.view.joined += 1,
        }
        Some(e.view.clone())
    }

    /// Requests of `session` asked since `since`, for the footer of the exec that ran
    /// them (the model waits for its exec, so they are the exec's scripts').
    pub fn asked_since(&self, session: &str, since: Instant) -> Vec<Approval> {
        let state = self.lock();
        let mut out: Vec<(Instant, Approval)> = state
            .entries
            .values()
            .filter(|e| e.view.session == session && e.created >= since)
            .map(|e| (e.created, e.view.clone()))
            .collect();
        out.sort_by_key(|e| e.0);
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// A call that needed approval in an unattended run was denied: audit it and tell
    /// the owner's channels.
    pub async fn report_unattended(&self, call: &CallFacts, origin: &str) {
        self.report_unattended_as(call, ApprovalKind::Tool, origin)
            .await;
    }

    /// [`Approvals::report_unattended`] for a call of `kind` (an egress destination).
    pub async fn report_unattended_as(&self, call: &CallFacts, kind: ApprovalKind, origin: &str) {
        let view = Approval {
            id: String::new(),
            agent: call.agent.clone(),
            session: call.session.clone(),
            exec: call.exec.clone(),
            tool: call.tool.clone(),
            args: call.args.clone(),
            cwd: call.cwd.clone(),
            rule: call.rule.clone(),
            justification: call.justification.clone(),
            reason: call.reason.clone(),
            call_digest: call_digest(call),
            status: ApprovalStatus::Denied,
            requested_at: rfc3339_in(Duration::ZERO),
            expires_at: rfc3339_in(Duration::ZERO),
            decided_by: Some("system".into()),
            scope: None,
            decision_reason: Some(format!("unattended run ({origin})")),
            joined: 0,
            kind,
            attempts: None,
        };
        self.audit(&view, "unattended", None).await;
        self.announce(ApprovalEvent::UnattendedDenied {
            agent: view.agent.clone(),
            session: view.session.clone(),
            call: view.call_line(),
            rule: view.rule.clone(),
            origin: origin.to_string(),
            notify: self.config().notify,
        });
    }
}

/// Whether `approver` may take decision `d` on `view`.
fn may_decide(
    approver: &Approver,
    view: &Approval,
    d: &ApprovalDecision,
) -> Result<(), DecideError> {
    match &approver.principal {
        Principal::Sandbox | Principal::Unverified | Principal::Embedder => {
            return Err(DecideError::Forbidden(format!(
                "{} cannot approve: approvals come from people on a channel, never from the agent or the gateway itself",
                approver.name()
            )))
        }
        _ => {}
    }
    match &approver.role {
        ApproverRole::Owner => Ok(()),
        ApproverRole::Member { sessions } => {
            let own =
                view.session == *sessions || view.session.starts_with(&format!("{sessions}:"));
            if !own {
                return Err(DecideError::Forbidden(format!(
                    "you cannot approve this: {} may decide only for its own chat's sessions",
                    approver.name()
                )));
            }
            if d.decision == Verdict::Approve && d.scope != Scope::Once {
                return Err(DecideError::Forbidden(format!(
                    "you cannot approve this for '{}': a member may approve once; ask the owner for wider grants",
                    d.scope.as_str()
                )));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
