//! `onUnknown: "ask"` (spec `egress.md` §6): a destination no rule allows becomes an
//! approval request of kind `egress`, and a human's decision becomes an exact
//! host-and-port rule of the agent.
//!
//! Owns [`EgressAsk`], the gateway's memory of which requests it raised (one per agent,
//! session, host and port; at most [`MAX_PENDING_PER_AGENT`] pending per agent) and of
//! which exec a used `once` approval is bound to; the rules decisions add to an agent's
//! snapshot ([`EgressAsk::rules_for`]); and [`AskFor`], the engine's
//! [`UnknownHosts`] for one stream. The decisions themselves live in the approvals
//! broker ([`Approvals`]), which every channel already shows and which survives a
//! reload: the rules are derived from its settled requests each time a stream opens.
//!
//! What a decision adds ([`RuleSource::Approval`], id `approval-<request id>`, the
//! request's host and port only, no methods, paths, credentials or `allowPrivate`):
//!
//! | decision | the rule applies to |
//! |---|---|
//! | once | the session's next exec that connects (unused, it lapses after `approvals.retryWindowSeconds`), then that exec's streams until it ends (at most an hour) |
//! | session | the request's session, for the gateway's life |
//! | duration | the request's session, until `durationSeconds` have passed |
//! | always | every stream of the agent, for the gateway's life (not written to the config) |
//! | deny | nothing is added; the same host and port are refused `approval_denied` for the agent without a new request, for an hour |
//!
//! Deny rules and the classifier answer before anything is asked (the engine), and an
//! approval rule is only ever added next to them: it cannot lift either. A host with a
//! bound credential is never asked about (its rules are the config's to write).
//!
//! Streams do not carry their exec yet: the gateway attributes a stream to the agent's
//! running exec when there is exactly one session running ([`EgressRun`]); otherwise
//! the stream is unbound and treated as unattended.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use beige_client::approvals::{ApprovalKind, ApprovalStatus, Scope};

use super::engine::{Miss, MissAnswer, UnknownHosts};
use super::rules::{Action, DenyReason, HostPattern, Rule, RuleSet, RuleSource};
use crate::approvals::{Approvals, AskOutcome, CallFacts, Settled};

/// Pending egress requests one agent may have; further misses are refused without one.
pub const MAX_PENDING_PER_AGENT: usize = 5;
/// The tool name egress requests carry (their call is `egress.connect host:port
/// entry=… mode=…`).
pub const TOOL: &str = "egress.connect";
/// The prefix of the id of a rule an approval added.
pub const RULE_PREFIX: &str = "approval-";
/// An unattended miss of the same host and port is reported at most this often.
const REPORT_EVERY: Duration = Duration::from_secs(600);
/// Most characters of the exec's command a request shows.
const COMMAND_CHARS: usize = 120;

/// The run a stream is attributed to, as the gateway sees it when the stream opens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressRun {
    /// The session (`None` for an unbound stream).
    pub session: Option<String>,
    /// The exec (the newest running exec of that session).
    pub exec: Option<String>,
    /// That exec's command, for the approver.
    pub command: Option<String>,
    /// `None` when a human can answer; else why not (an unattended run, or an unbound
    /// stream).
    pub unattended: Option<String>,
}

/// (agent, session, host, port).
type Key = (String, String, String, u16);

/// The egress side of approvals, for one gateway (see the module docs).
#[derive(Debug, Default)]
pub struct EgressAsk {
    /// The request raised for each (agent, session, host, port).
    tracked: tokio::sync::Mutex<HashMap<Key, String>>,
    /// Used `once` approvals: the agent and exec each is bound to.
    bound: Mutex<HashMap<String, (String, String)>>,
    /// When an unattended miss was last reported.
    reported: Mutex<HashMap<Key, Instant>>,
}

/// The host and port an egress request is about: its first argument, `host:port`.
fn target_of(args: &[String]) -> Option<(&str, u16)> {
    let (host, port) = args.first()?.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// The rule an approval adds for `host:port`.
fn approval_rule(id: &str, host: &str, port: u16) -> Rule {
    Rule {
        id: format!("{RULE_PREFIX}{id}"),
        hosts: vec![HostPattern::Exact(host.to_string())],
        ports: vec![port],
        action: Action::Allow,
        methods: None,
        paths: None,
        allow_private: Vec::new(),
        source: RuleSource::Approval,
    }
}

/// A command as a request shows it: escaped, at most [`COMMAND_CHARS`] characters.
fn shown_command(command: &str) -> String {
    let escaped: String = command.chars().flat_map(char::escape_debug).collect();
    if escaped.chars().count() <= COMMAND_CHARS {
        return escaped;
    }
    let mut cut: String = escaped.chars().take(COMMAND_CHARS).collect();
    cut.push('…');
    cut
}

fn refuse(reason: DenyReason, approval: Option<String>, error: Option<String>) -> MissAnswer {
    MissAnswer::Refuse {
        reason,
        approval,
        error,
    }
}

impl EgressAsk {
    /// Nothing asked yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn bound(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, String)>> {
        self.bound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rule `settled` adds for a stream of `run`, if any. `running` tells whether an
    /// exec of the agent is still running.
    fn grant_rule(
        &self,
        settled: &Settled,
        run: &EgressRun,
        running: &(dyn Fn(&str) -> bool + Send + Sync),
    ) -> Option<Rule> {
        let a = &settled.approval;
        let (host, port) = target_of(&a.args)?;
        let same_session = run.session.as_deref() == Some(a.session.as_str());
        let applies = match (a.status, a.scope) {
            (ApprovalStatus::Approved, Some(Scope::Always)) => true,
            (ApprovalStatus::Approved, Some(_)) => same_session,
            (ApprovalStatus::Consumed, Some(Scope::Once)) => {
                let bound = self.bound().get(&a.id).map(|(_, exec)| exec.clone());
                match (bound, &run.exec) {
                    (Some(b), Some(exec)) => b == *exec && running(&b),
                    _ => false,
                }
            }
            _ => false,
        };
        applies.then(|| approval_rule(&a.id, host, port))
    }

    /// The snapshot a stream of `agent` in `run` gets: the config's rules `base`, plus
    /// the rules approvals add for that run. Its version is `base`'s plus the broker's
    /// count of settling steps, so every decision makes a newer version.
    pub fn rules_for(
        &self,
        approvals: &Approvals,
        agent: &str,
        base: &RuleSet,
        run: &EgressRun,
        running: &(dyn Fn(&str) -> bool + Send + Sync),
    ) -> Arc<RuleSet> {
        let settled = approvals.settled(agent, ApprovalKind::Egress);
        let generation = approvals.generation();
        let mut rules = base.rules().to_vec();
        rules.extend(
            settled
                .iter()
                .filter_map(|s| self.grant_rule(s, run, running)),
        );
        // Bound `once` approvals of the agent whose exec ended, or whose request the
        // broker no longer keeps, are forgotten.
        self.bound().retain(|id, (a, exec)| {
            a != agent || (running(exec) && settled.iter().any(|s| s.approval.id == *id))
        });
        Arc::new(
            RuleSet::new(rules, base.version().saturating_add(generation))
                .with_credentials(base.credentials().to_vec()),
        )
    }

    /// A stream of `run` started under rule `rule`: when that rule is an unused `once`
    /// approval's, the approval is used now and bound to the run's exec.
    pub async fn admitted(&self, approvals: &Approvals, rule: &str, run: &EgressRun) {
        let (Some(id), Some(exec)) = (rule.strip_prefix(RULE_PREFIX), &run.exec) else {
            return;
        };
        let Some(approval) = approvals.get(id) else {
            return;
        };
        if approval.status != ApprovalStatus::Approved || approval.scope != Some(Scope::Once) {
            return;
        }
        {
            let mut bound = self.bound();
            if bound.contains_key(id) {
                return;
            }
            bound.insert(id.to_string(), (approval.agent.clone(), exec.clone()));
        }
        if !approvals.consume(id).await {
            tracing::debug!(
                approval = id,
                "egress: a once approval was used by another stream first"
            );
        }
    }

    /// What becomes of `miss`, a stream of `agent` in `run` that the rules `rules`
    /// (the stream's snapshot) do not allow.
    #[allow(clippy::too_many_arguments)]
    pub async fn on_miss(
        &self,
        approvals: &Approvals,
        agent: &str,
        rules: &RuleSet,
        base: &RuleSet,
        run: &EgressRun,
        miss: &Miss<'_>,
        running: &(dyn Fn(&str) -> bool + Send + Sync),
    ) -> MissAnswer {
        let host = super::target::Host::Name(miss.host.to_string());
        // A credential's host is the config's to open, on each port.
        if rules.credential_for(&host).is_some() {
            return refuse(
                miss.reason,
                None,
                Some("a host with a brokered credential is never asked about; add its port to a rule".into()),
            );
        }
        let settled = approvals.settled(agent, ApprovalKind::Egress);
        if let Some(denied) = settled.iter().find(|s| {
            s.approval.status == ApprovalStatus::Denied
                && target_of(&s.approval.args) == Some((miss.host, miss.port))
        }) {
            let by = denied.approval.decided_by.clone().unwrap_or_default();
            return refuse(
                DenyReason::ApprovalDenied,
                Some(denied.approval.id.clone()),
                Some(format!("{by} refused {}:{}", miss.host, miss.port)),
            );
        }
        let session = run
            .session
            .clone()
            .unwrap_or_else(|| format!("unbound:{agent}"));
        let call = CallFacts {
            agent: agent.to_string(),
            session: session.clone(),
            exec: run.exec.clone(),
            tool: TOOL.to_string(),
            args: vec![
                format!("{}:{}", miss.host, miss.port),
                format!("entry={}", miss.entry.as_str()),
                format!("mode={}", miss.mode.as_str()),
            ],
            cwd: None,
            stdin_sha256: None,
            rule: None,
            justification: run
                .command
                .as_deref()
                .map(|c| format!("exec: {}", shown_command(c))),
            reason: format!(
                "no egress rule allows {}:{} ({}); egress.onUnknown is \"ask\"",
                miss.host,
                miss.port,
                miss.reason.as_str()
            ),
        };
        let key: Key = (agent.to_string(), session, miss.host.to_string(), miss.port);
        if let Some(origin) = &run.unattended {
            let report = {
                let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
                let now = Instant::now();
                reported.retain(|_, at| now.duration_since(*at) < REPORT_EVERY);
                match reported.get(&key) {
                    Some(_) => false,
                    None => {
                        reported.insert(key, now);
                        true
                    }
                }
            };
            if report {
                approvals.report_unattended(&call, origin).await;
            }
            return refuse(
                DenyReason::Unattended,
                None,
                Some(format!("nobody can approve it: {origin}")),
            );
        }
        let mut tracked = self.tracked.lock().await;
        if let Some(id) = tracked.get(&key).cloned() {
            if let Some(pending) = approvals.note_attempt(&id) {
                return refuse(
                    DenyReason::ApprovalPending,
                    Some(pending.id),
                    Some(format!(
                        "approval {id} pending ({} attempts)",
                        pending.attempts.unwrap_or(0)
                    )),
                );
            }
            tracked.remove(&key);
        }
        // Requests no longer pending are forgotten; the agent's pending ones counted.
        tracked.retain(|_, id| {
            approvals
                .get(id)
                .is_some_and(|a| a.status == ApprovalStatus::Pending)
        });
        let pending = tracked.keys().filter(|k| k.0 == agent).count();
        if pending >= MAX_PENDING_PER_AGENT {
            return refuse(
                miss.reason,
                None,
                Some(format!(
                    "agent '{agent}' already has {pending} egress approval requests pending (at most {MAX_PENDING_PER_AGENT}); answer them first"
                )),
            );
        }
        match approvals.ask_kind(call, ApprovalKind::Egress, Duration::ZERO).await {
            AskOutcome::Pending { approval } => {
                tracked.insert(key, approval.id.clone());
                refuse(DenyReason::ApprovalPending, Some(approval.id), None)
            }
            AskOutcome::Approved { .. } => {
                drop(tracked);
                MissAnswer::Retry(self.rules_for(approvals, agent, base, run, running))
            }
            AskOutcome::Denied { approval, by, .. } => refuse(
                DenyReason::ApprovalDenied,
                Some(approval),
                Some(format!("{by} refused it")),
            ),
            AskOutcome::Expired { approval } => refuse(
                miss.reason,
                Some(approval),
                Some("the approval request expired".into()),
            ),
            AskOutcome::TooMany { limit } => refuse(
                miss.reason,
                None,
                Some(format!(
                    "the session already has {limit} approval requests pending (approvals.maxPendingPerSession)"
                )),
            ),
        }
    }
}

/// The engine's [`UnknownHosts`] for one stream of `agent` in `run`.
pub struct AskFor<'a> {
    /// The gateway's egress asks.
    pub ask: &'a EgressAsk,
    /// The approvals broker.
    pub approvals: &'a Approvals,
    /// The stream's agent.
    pub agent: &'a str,
    /// The agent's rules from config.
    pub base: &'a RuleSet,
    /// The stream's snapshot (config rules plus the run's approvals).
    pub rules: &'a RuleSet,
    /// The run the stream is attributed to.
    pub run: &'a EgressRun,
    /// Whether an exec of the agent is still running.
    pub running: &'a (dyn Fn(&str) -> bool + Send + Sync),
}

impl std::fmt::Debug for AskFor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AskFor")
            .field("agent", &self.agent)
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl UnknownHosts for AskFor<'_> {
    async fn ask(&self, miss: &Miss<'_>) -> MissAnswer {
        self.ask
            .on_miss(
                self.approvals,
                self.agent,
                self.rules,
                self.base,
                self.run,
                miss,
                self.running,
            )
            .await
    }
}

#[cfg(test)]
#[path = "ask_tests.rs"]
mod tests;
