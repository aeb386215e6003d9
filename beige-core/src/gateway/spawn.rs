//! The gateway's side of `spawn` (platform.md §2): sub-agents whose rights only shrink.
//!
//! Owns finding the caller's session through the exec the kernel attributed it to
//! (never a key or variable the sandbox supplies), the checks before a child starts
//! (target listed, depth, the parent's session, day and turn budgets, `maxConcurrent`,
//! no egress beyond the ancestors', one spawn at a time per child session), creating the
//! child session with its lineage in one store operation, running the child's prompt
//! unattended with a time limit, and the child state every later call consults: the
//! [`RightSet`] (tools, ancestors' rule sets, egress, budgets) and the denials that end a
//! spawn as `child denied: …`. It also writes the `type: "spawn"` audit records, and
//! tells the socket which agents other agents spawn (their unbound callers get nothing).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{GatewayError, Inner, PromptRequest, NEXT_PROMPT};
use crate::agent::events::AgentEvent;
use crate::audit::{now_ts, AuditDecision, AuditRecord, AuditType, Phase, Target};
use crate::budget::{BudgetExhausted, BudgetKey, Limits, Scope};
use crate::ident::ExecId;
use crate::llm::ErrorKind;
use crate::platform::spawn::{
    RightSet, SpawnBudget, SpawnConfig, SpawnOutcome, SpawnReport, SpawnRequest, EXIT_TIMEOUT,
    GATEWAY_MAX_DEPTH, SELF_TARGET,
};
use crate::plugin::{ToolError, ToolResult};
use crate::store::{LedgerFilter, Lineage, NewSession, SessionRecord, UsageTotals};
use beige_protocol::socket::EXIT_BUDGET_EXHAUSTED;

/// The prefix of every child session key.
pub(crate) const CHILD_KEY_PREFIX: &str = "spawn:";

/// How long a cancelled child gets to wind down before the parent stops waiting.
const CANCEL_GRACE: Duration = Duration::from_secs(15);

/// Most denials remembered per child.
const KEPT_DENIALS: usize = 16;

/// The children the gateway knows now, and how many each agent has running.
#[derive(Debug, Default)]
pub(crate) struct SpawnState {
    /// By child session key.
    children: RwLock<HashMap<String, Arc<Child>>>,
    /// Children running per calling agent (`maxConcurrent`).
    running: Mutex<HashMap<String, u32>>,
    /// The child session keys a spawn is running now: one spawn at a time per child.
    active: Mutex<HashSet<String>>,
    /// When the running turn of each session (by id) started: a sub-agent spends what is
    /// left of its ancestors' turns.
    turns: Mutex<HashMap<String, TurnStart>>,
    /// The agents other agents may spawn (from the config, read once).
    spawned: std::sync::OnceLock<BTreeSet<String>>,
}

/// When a turn started: on the ledger's clock (Unix ms) and for its wall time; and
/// whether it has spawned sub-agents (whose spending its budgets then count).
#[derive(Debug, Clone, Copy)]
struct TurnStart {
    ms: i64,
    at: Instant,
    spawned: bool,
}

/// Keeps a session's turn known to its sub-agents ([`Inner::turn_started`]).
pub(crate) struct TurnGuard<'a> {
    state: &'a SpawnState,
    session_id: String,
}

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.state
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.session_id);
    }
}

/// One sub-agent's session, as every call from it is checked.
#[derive(Debug)]
pub(crate) struct Child {
    /// The child's session id.
    pub(crate) session_id: String,
    /// Its agent.
    pub(crate) agent: String,
    /// The key of the session that spawned it.
    pub(crate) parent_key: String,
    /// How deep it is (a child of a root session is at depth 1).
    pub(crate) depth: u32,
    /// What it may do.
    pub(crate) rights: RightSet,
    /// Calls of it that needed approval and were denied (it is unattended): the first
    /// is the reason its spawn fails.
    denials: Mutex<Vec<String>>,
}

impl Child {
    /// Remember a denied ask of this child.
    pub(crate) fn note_denial(&self, reason: &str) {
        let mut d = self.denials.lock().unwrap_or_else(PoisonError::into_inner);
        if d.len() < KEPT_DENIALS {
            d.push(reason.to_string());
        }
    }

    fn first_denial(&self) -> Option<String> {
        self.denials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first()
            .cloned()
    }
}

/// Holds one of an agent's `maxConcurrent` places while its child runs.
struct Slot<'a> {
    running: &'a Mutex<HashMap<String, u32>>,
    agent: String,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut r = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = r.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                r.remove(&self.agent);
            }
        }
    }
}

/// Marks a child session as run by one spawn; when dropped (the spawn ended, however)
/// the session is free again and its child state, if still this spawn's, forgotten.
struct Active<'a> {
    state: &'a SpawnState,
    key: String,
    child: Arc<Child>,
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        let mut children = self
            .state
            .children
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if children
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &self.child))
        {
            children.remove(&self.key);
        }
        drop(children);
        self.state
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// The caller of a spawn, as the gateway knows it.
struct Caller {
    exec: String,
    session: SessionRecord,
    /// Its own child state when it is itself a sub-agent.
    child: Option<Arc<Child>>,
}

fn store_failed(what: &str, e: impl std::fmt::Display) -> ToolError {
    ToolError::Failed(format!("spawn: {what} failed in the store: {e}"))
}

/// Why a sub-agent may not make a call of a tool it has: a schedule outlives the child
/// and runs later as its agent, with the agent's own rights and rules, not the child's,
/// so a child may read, pause and cancel its agent's schedules but not add, resume or
/// fire one. `None` when the call is not such a step out of its rights.
pub(crate) fn beyond_child(tool: &str, args: &[String]) -> Option<String> {
    if tool != "schedule" {
        return None;
    }
    let sub = args.first().map(String::as_str).unwrap_or("help");
    if matches!(
        sub,
        "help" | "--help" | "-h" | "list" | "get" | "history" | "pause" | "cancel"
    ) {
        return None;
    }
    Some(format!(
        "schedule {sub}: not allowed for this sub-agent (a schedule runs later with its agent's own rights, beyond the sub-agent's; only list, get, history, pause and cancel are)"
    ))
}

/// Totals of `session` and every session below it.
fn tree(session_id: &str) -> LedgerFilter {
    LedgerFilter {
        session_id: Some(session_id.to_string()),
        with_children: true,
        ..LedgerFilter::default()
    }
}

/// The first limit of `budget` that `used` reached, as a [`BudgetExhausted`] of `agent`
/// in `scope`.
fn over(
    agent: &str,
    scope: Scope,
    cost_usd: Option<f64>,
    tokens: Option<u64>,
    used: &UsageTotals,
) -> Option<BudgetExhausted> {
    let hit = |key, used: f64, limit: f64| {
        (used >= limit).then(|| BudgetExhausted {
            agent: agent.to_string(),
            scope,
            key,
            limit,
            used,
        })
    };
    tokens
        .and_then(|t| hit(BudgetKey::Tokens, used.tokens() as f64, t as f64))
        .or_else(|| cost_usd.and_then(|c| hit(BudgetKey::CostUsd, used.cost_usd(), c)))
}

impl Inner {
    /// The gateway itself, shared (for running a child's prompt from a tool call).
    fn shared(&self) -> Result<Arc<Inner>, ToolError> {
        self.me
            .get()
            .and_then(std::sync::Weak::upgrade)
            .ok_or_else(|| ToolError::Failed("the gateway is not running".into()))
    }

    /// The child state of session key `key` when it is a sub-agent's and known now.
    pub(crate) fn child(&self, key: &str) -> Option<Arc<Child>> {
        self.spawn
            .children
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// The child state of the session key a call runs in: known, or read from the
    /// stored lineage of the key's current session. A store failure for a child key
    /// fails closed: no rights at all.
    pub(crate) async fn child_for_key(&self, key: &str) -> Option<Arc<Child>> {
        if let Some(c) = self.child(key) {
            return Some(c);
        }
        if !key.starts_with(CHILD_KEY_PREFIX) {
            return None;
        }
        let session = match self.store.current_session(key).await {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot read a sub-agent's session; its calls get no rights");
                return Some(Arc::new(self.closed_child(key)));
            }
        };
        match self.child_of(&session).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot read a sub-agent's lineage; its calls get no rights");
                Some(Arc::new(self.closed_child(key)))
            }
        }
    }

    fn closed_child(&self, key: &str) -> Child {
        Child {
            session_id: String::new(),
            agent: String::new(),
            parent_key: key.to_string(),
            depth: GATEWAY_MAX_DEPTH,
            rights: RightSet::nothing(),
            denials: Mutex::default(),
        }
    }

    /// The child state of `session` when it is a sub-agent's (`None` for a root
    /// session), from memory or from its stored lineage.
    pub(crate) async fn child_of(
        &self,
        session: &SessionRecord,
    ) -> Result<Option<Arc<Child>>, GatewayError> {
        if let Some(c) = self.child(&session.key) {
            if c.session_id == session.id {
                return Ok(Some(c));
            }
        }
        let Some(lineage) = self.store.session_lineage(&session.id).await? else {
            return Ok(None);
        };
        let parent_key = self
            .store
            .get_session(&lineage.parent_session_id)
            .await?
            .map(|p| p.key)
            .unwrap_or_else(|| lineage.parent_session_id.clone());
        let child = Arc::new(Child {
            session_id: session.id.clone(),
            agent: session.agent.clone(),
            parent_key,
            depth: lineage.depth,
            rights: RightSet::from_json(&lineage.rights).unwrap_or_else(RightSet::nothing),
            denials: Mutex::default(),
        });
        self.spawn
            .children
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session.key.clone(), child.clone());
        Ok(Some(child))
    }

    /// Whether another agent lists `agent` as a spawn target: then a process outside any
    /// exec in its sandbox may be a sub-agent's leftover, and gets none of its rights.
    pub(crate) fn is_spawned_agent(&self, agent: &str) -> bool {
        self.spawn
            .spawned
            .get_or_init(|| {
                crate::platform::spawn::spawned_agents(&self.config)
                    .into_keys()
                    .collect()
            })
            .contains(agent)
    }

    /// A turn of session `session_id` starts now: its sub-agents count against what is
    /// left of its `budgets.turn` until the guard drops (a session runs one prompt at a
    /// time).
    pub(crate) fn turn_started(&self, session_id: &str) -> TurnGuard<'_> {
        self.spawn
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                session_id.to_string(),
                TurnStart {
                    ms: crate::store::now_ms(),
                    at: Instant::now(),
                    spawned: false,
                },
            );
        TurnGuard {
            state: &self.spawn,
            session_id: session_id.to_string(),
        }
    }

    /// What the running turn of `session_id` has used, for its own `budgets.turn`:
    /// `own` (its model calls), or, once it has spawned sub-agents, everything its
    /// session tree recorded since the turn started — its calls and its children's.
    pub(crate) async fn turn_totals(
        &self,
        session_id: &str,
        own: UsageTotals,
    ) -> Result<UsageTotals, GatewayError> {
        let start = self
            .spawn
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session_id)
            .copied();
        match start {
            Some(start) if start.spawned => Ok(self
                .ledger
                .usage_totals(LedgerFilter {
                    since_ms: Some(start.ms),
                    ..tree(session_id)
                })
                .await?),
            _ => Ok(own),
        }
    }

    /// The turn budget of `agent` that its running turn in `session_id` reached,
    /// counting the spending of the session's sub-agents since the turn started (`None`
    /// when no turn of it runs, or no turn limit is set).
    async fn turn_budget_exhausted(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Option<BudgetExhausted>, GatewayError> {
        let limits = Limits::for_agent(&self.config, agent).turn;
        let start = self
            .spawn
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session_id)
            .copied();
        let Some(start) = start else {
            return Ok(None);
        };
        let hit = |key, used: f64, limit: f64| {
            (used >= limit).then(|| BudgetExhausted {
                agent: agent.to_string(),
                scope: Scope::Turn,
                key,
                limit,
                used,
            })
        };
        if let Some(e) = limits.wall_seconds.and_then(|w| {
            hit(
                BudgetKey::WallSeconds,
                start.at.elapsed().as_secs_f64(),
                w as f64,
            )
        }) {
            return Ok(Some(e));
        }
        if limits.cost_usd.is_none() && limits.tokens.is_none() && limits.model_calls.is_none() {
            return Ok(None);
        }
        let used = self
            .ledger
            .usage_totals(LedgerFilter {
                since_ms: Some(start.ms),
                ..tree(session_id)
            })
            .await?;
        if let Some(e) = over(agent, Scope::Turn, limits.cost_usd, limits.tokens, &used) {
            return Ok(Some(e));
        }
        Ok(limits
            .model_calls
            .and_then(|m| hit(BudgetKey::ModelCalls, used.calls as f64, m as f64)))
    }

    /// The first budget a sub-agent's spending reached: its spawn budget (over its own
    /// and its children's spending), then each ancestor's session, day and running
    /// turn budgets — the child spends its ancestors' money.
    pub(crate) async fn lineage_budget_exhausted(
        &self,
        child: &Child,
    ) -> Result<Option<BudgetExhausted>, GatewayError> {
        let SpawnBudget { cost_usd, tokens } = child.rights.budget;
        if child.rights.budget.is_set() {
            let used = self.ledger.usage_totals(tree(&child.session_id)).await?;
            if let Some(e) = over(&child.agent, Scope::Spawn, cost_usd, tokens, &used) {
                return Ok(Some(e));
            }
        }
        for a in &child.rights.ancestors {
            if let Some(e) = self
                .session_budget_exhausted(&a.agent, &a.session_id)
                .await?
            {
                return Ok(Some(e));
            }
            if let Some(e) = self.turn_budget_exhausted(&a.agent, &a.session_id).await? {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// The session and day budgets of `agent`'s session `session_id`, its children's
    /// spending included.
    async fn session_budget_exhausted(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Option<BudgetExhausted>, GatewayError> {
        let limits = Limits::for_agent(&self.config, agent);
        let (needs_session, needs_day) = limits.needs_ledger();
        if needs_session {
            let used = self.ledger.usage_totals(tree(session_id)).await?;
            if let Some(e) = over(
                agent,
                Scope::Session,
                limits.session.cost_usd,
                limits.session.tokens,
                &used,
            ) {
                return Ok(Some(e));
            }
        }
        if needs_day {
            let used = self
                .ledger
                .usage_totals(LedgerFilter {
                    agent: Some(agent.to_string()),
                    since_ms: Some(crate::budget::day_start_ms(crate::store::now_ms())),
                    ..LedgerFilter::default()
                })
                .await?;
            if let Some(e) = over(
                agent,
                Scope::AgentDay,
                limits.day.cost_usd,
                limits.day.tokens,
                &used,
            ) {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// Who calls spawn: the exec the kernel attributed the caller to, the session that
    /// exec was started in, and that session's lineage. `Err` is the refusal.
    async fn spawn_caller(
        &self,
        agent: &str,
        exec: Option<&str>,
    ) -> Result<Result<Caller, String>, ToolError> {
        let Some(exec) = exec else {
            return Ok(Err(
                "this process belongs to no exec of the agent, so there is no session to spawn from; call spawn from a command the agent runs".into(),
            ));
        };
        let Some(record) = self.execs.get(agent, &ExecId::new(exec)) else {
            return Ok(Err(format!(
                "exec {exec} is not known to the gateway; call spawn from a command the agent runs"
            )));
        };
        if record.ended {
            return Ok(Err(format!(
                "exec {exec} has ended; run spawn from an exec that waits for it"
            )));
        }
        let Some(key) = record.session.key.clone() else {
            return Ok(Err(format!(
                "exec {exec} was started outside any session (an API exec); spawn from an exec of a prompt"
            )));
        };
        let session = match self.store.current_session(&key).await {
            Ok(Some(s)) if s.agent == agent => s,
            Ok(_) => {
                return Ok(Err(format!(
                    "session '{key}' of exec {exec} has no stored session of agent '{agent}' yet; spawn from a prompt's exec"
                )))
            }
            Err(e) => return Err(store_failed("reading the caller's session", e)),
        };
        let child = self
            .child_of(&session)
            .await
            .map_err(|e| store_failed("reading the caller's lineage", e))?;
        Ok(Ok(Caller {
            exec: exec.to_string(),
            session,
            child,
        }))
    }

    /// The rights of the caller: its own as a child, else its agent's tools — those a
    /// schedule's `tools` leave its run, when the caller is a narrowed schedule run
    /// (platform.md §2.3: the parent's effective rights).
    async fn caller_rights(&self, agent: &str, caller: &Caller) -> RightSet {
        match &caller.child {
            Some(c) => c.rights.clone(),
            None => RightSet::root(
                self.agent_tools(agent)
                    .await
                    .into_iter()
                    .filter(|t| crate::schedule::narrow::allows(&caller.session.key, t)),
            ),
        }
    }

    /// Why a child on `child_agent` with `rights` could reach hosts an ancestor cannot,
    /// if it could. The child runs in its agent's sandbox, whose streams the egress proxy
    /// decides by that agent's rules alone (a stream is not attributed to an exec or a
    /// session), so the intersection of §2.3 cannot be enforced per child yet. Until it
    /// can, a child is started only when its agent has no egress, or exactly the egress
    /// block of every ancestor agent whose rules should also apply: then the
    /// intersection is the child agent's own rules.
    fn wider_egress(&self, child_agent: &str, rights: &RightSet) -> Option<String> {
        let egress_of = |agent: &str| {
            self.config
                .agents
                .get(agent)
                .and_then(|a| a.egress.as_ref())
        };
        let theirs = egress_of(child_agent)?;
        let ancestor = rights
            .egress_agents
            .iter()
            .find(|a| egress_of(a) != Some(theirs))?;
        Some(format!(
            "target '{child_agent}' has egress rules (agents.{child_agent}.egress) that agent '{ancestor}' does not have, and a sub-agent is not narrowed to its parent's egress yet, so it was not started: it could reach hosts its parent cannot. Spawn SELF, a target without egress, or give both agents the same egress block"
        ))
    }

    /// The plugin tools `agent` has: configured, registered and exposed by policy.
    async fn agent_tools(&self, agent: &str) -> BTreeSet<String> {
        match self.config.agents.get(agent) {
            Some(a) => super::launchable_tools(self.policy.as_ref(), &self.registry, agent, a)
                .await
                .into_iter()
                .collect(),
            None => BTreeSet::new(),
        }
    }

    async fn spawn_audit(
        &self,
        phase: Phase,
        agent: &str,
        caller_key: &str,
        body: serde_json::Value,
    ) {
        let record = AuditRecord {
            trace_id: None,
            span_id: None,
            ts: now_ts(),
            agent: agent.to_string(),
            session: Some(caller_key.to_string()),
            model: None,
            channel: None,
            principal: None,
            via: None,
            phase,
            kind: AuditType::Spawn,
            tool: "spawn".into(),
            args: Vec::new(),
            decision: AuditDecision::Allowed,
            target: Some(Target::Gateway),
            duration_ms: None,
            exit_code: None,
            output_bytes: None,
            error: None,
            args_bytes: None,
            args_sha256: None,
            args_truncated: None,
            egress: None,
            approval: None,
            exec: None,
            attribution: None,
            spawn: Some(body),
            parent_session: None,
        };
        if let Err(e) = self.audit.record(&record).await {
            tracing::error!(error = %e, "could not audit a spawn");
        }
    }

    /// Run one `spawn` ([`crate::platform::Host::spawn`]).
    pub(crate) async fn run_spawn(&self, req: SpawnRequest) -> Result<SpawnReport, ToolError> {
        let me = self.shared()?;
        let caller = match self.spawn_caller(&req.agent, req.exec.as_deref()).await? {
            Ok(c) => c,
            Err(reason) => return Ok(SpawnReport::refused(reason, 1)),
        };
        let parent_depth = caller.child.as_ref().map_or(0, |c| c.depth);
        let parent_rights = self.caller_rights(&req.agent, &caller).await;

        // The target: opt-in, by name or SELF.
        let Some(target) = req.config.targets.get(&req.target).copied() else {
            let listed: Vec<&str> = req.config.targets.keys().map(String::as_str).collect();
            return Ok(SpawnReport::refused(
                format!(
                    "target '{}' is not one of agent '{}''s spawn targets ({}); list it under agents.{}.pluginConfigs.spawn.targets",
                    req.target,
                    req.agent,
                    if listed.is_empty() { "none".to_string() } else { listed.join(", ") },
                    req.agent
                ),
                1,
            ));
        };
        let child_agent = if req.target == SELF_TARGET {
            req.agent.clone()
        } else {
            req.target.clone()
        };
        if !self.config.agents.contains_key(&child_agent) {
            return Ok(SpawnReport::refused(
                format!("target '{child_agent}' is not an agent of this gateway"),
                1,
            ));
        }

        // Depth, read from the caller's stored lineage.
        let depth = parent_depth + 1;
        let max = parent_rights
            .max_depth
            .min(target.max_depth.unwrap_or(GATEWAY_MAX_DEPTH))
            .min(GATEWAY_MAX_DEPTH);
        if depth > max {
            return Ok(SpawnReport::refused(
                format!(
                    "depth limit {max} reached: this session is at depth {parent_depth}, and a chain through target '{}' may be at most {max} deep",
                    req.target
                ),
                1,
            ));
        }

        // A parent at its limit cannot spawn.
        let exhausted = match &caller.child {
            Some(c) => self.lineage_budget_exhausted(c).await,
            None => Ok(None),
        }
        .map_err(|e| store_failed("reading the budgets", e))?;
        let exhausted = match exhausted {
            Some(e) => Some(e),
            None => self
                .session_budget_exhausted(&req.agent, &caller.session.id)
                .await
                .map_err(|e| store_failed("reading the budgets", e))?,
        };
        let exhausted = match exhausted {
            Some(e) => Some(e),
            None => self
                .turn_budget_exhausted(&req.agent, &caller.session.id)
                .await
                .map_err(|e| store_failed("reading the budgets", e))?,
        };
        if let Some(e) = exhausted {
            return Ok(SpawnReport::refused(
                format!("budget exhausted: {}", e.message()),
                EXIT_BUDGET_EXHAUSTED,
            ));
        }

        // maxConcurrent children of this agent.
        let _slot = {
            let mut running = self
                .spawn
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let n = running.entry(req.agent.clone()).or_default();
            if *n >= req.config.max_concurrent {
                return Ok(SpawnReport::refused(
                    format!(
                        "agent '{}' already has {n} sub-agents running, its maxConcurrent; wait for one to finish",
                        req.agent
                    ),
                    1,
                ));
            }
            *n += 1;
            Slot {
                running: &self.spawn.running,
                agent: req.agent.clone(),
            }
        };

        // The child session: a new one with its lineage, or an earlier child of this
        // parent.
        let target_tools = self.agent_tools(&child_agent).await;
        let rights = parent_rights.child(
            &req.agent,
            &caller.session.id,
            &child_agent,
            &target_tools,
            &target,
        );
        if let Some(reason) = self.wider_egress(&child_agent, &rights) {
            return Ok(SpawnReport::refused(reason, 1));
        }
        let (session, child) = match &req.session {
            Some(key) => {
                let found = self
                    .store
                    .current_session(key)
                    .await
                    .map_err(|e| store_failed("reading the session to continue", e))?;
                let lineage = match &found {
                    Some(s) => self
                        .store
                        .session_lineage(&s.id)
                        .await
                        .map_err(|e| store_failed("reading the session to continue", e))?,
                    None => None,
                };
                match (found, lineage) {
                    (Some(s), Some(l))
                        if s.agent == child_agent && l.parent_session_id == caller.session.id =>
                    {
                        let child = Arc::new(Child {
                            session_id: s.id.clone(),
                            agent: child_agent.clone(),
                            parent_key: caller.session.key.clone(),
                            depth: l.depth,
                            // What it got then, and never more than what it would get now.
                            rights: RightSet::from_json(&l.rights)
                                .map(|r| r.narrowed(&rights))
                                .unwrap_or_else(RightSet::nothing),
                            denials: Mutex::default(),
                        });
                        (s, child)
                    }
                    _ => {
                        return Ok(SpawnReport::refused(
                            format!(
                                "session '{key}' is not a child of this session on target '{}'; `--session` continues only this session's own children",
                                req.target
                            ),
                            1,
                        ))
                    }
                }
            }
            None => {
                let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S");
                let key = format!(
                    "{CHILD_KEY_PREFIX}{}:{child_agent}:{stamp}-{:06x}",
                    caller.session.key,
                    rand::random::<u32>() & 0xff_ffff
                );
                let model = self
                    .config
                    .agents
                    .get(&child_agent)
                    .map(|a| crate::agent::router::model_key(&a.model));
                let s = self
                    .store
                    .create_child_session(
                        NewSession {
                            agent: child_agent.clone(),
                            key,
                            parent_id: Some(caller.session.id.clone()),
                            model,
                        },
                        Lineage {
                            parent_session_id: caller.session.id.clone(),
                            depth,
                            invoked_by_exec: Some(caller.exec.clone()),
                            rights: rights.to_json(),
                        },
                    )
                    .await
                    .map_err(|e| store_failed("creating the child session", e))?;
                let child = Arc::new(Child {
                    session_id: s.id.clone(),
                    agent: child_agent.clone(),
                    parent_key: caller.session.key.clone(),
                    depth,
                    rights: rights.clone(),
                    denials: Mutex::default(),
                });
                (s, child)
            }
        };
        // One spawn at a time runs a child session: a second `--session` of a child
        // still running would share its state and lose its denials.
        if !self
            .spawn
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session.key.clone())
        {
            return Ok(SpawnReport::refused(
                format!(
                    "session '{}' is still running for another spawn; wait for that spawn to finish before continuing it",
                    session.key
                ),
                1,
            ));
        }
        let _active = Active {
            state: &self.spawn,
            key: session.key.clone(),
            child: child.clone(),
        };
        // From now on the caller's turn counts its children's spending.
        if let Some(t) = self
            .spawn
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&caller.session.id)
        {
            t.spawned = true;
        }
        self.spawn
            .children
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session.key.clone(), child.clone());

        let facts = json!({
            "parent": {"agent": req.agent, "session": caller.session.key, "exec": caller.exec},
            "child": {"agent": child_agent, "session": session.key},
            "depth": child.depth,
            "rights": {
                "tools": child.rights.tools.iter().collect::<Vec<_>>(),
                "digest": child.rights.digest(),
            },
        });
        self.spawn_audit(
            Phase::Started,
            &req.agent,
            &caller.session.key,
            facts.clone(),
        )
        .await;

        let before = self
            .ledger
            .usage_totals(tree(&session.id))
            .await
            .map_err(|e| store_failed("reading the child's spending", e))?;
        let (outcome, status) = self
            .run_child(&me, &child_agent, &session.key, &req, &child)
            .await;
        let after = self
            .ledger
            .usage_totals(tree(&session.id))
            .await
            .map_err(|e| store_failed("reading the child's spending", e))?;
        let cost = after.cost_micros.saturating_sub(before.cost_micros);

        let mut finished = facts;
        if let Some(o) = finished.as_object_mut() {
            o.insert("status".into(), json!(status));
            o.insert("costMicros".into(), json!(cost));
        }
        self.spawn_audit(Phase::Finished, &req.agent, &caller.session.key, finished)
            .await;
        Ok(SpawnReport {
            session: Some(session.key),
            outcome,
        })
    }

    /// Run the child's prompt unattended until it ends or the time limit, when it is
    /// cancelled. Returns the outcome and its audit status.
    async fn run_child(
        &self,
        me: &Arc<Inner>,
        child_agent: &str,
        key: &str,
        req: &SpawnRequest,
        child: &Child,
    ) -> (SpawnOutcome, &'static str) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let id = NEXT_PROMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_string())
            .or_default()
            .push((id, cancel.clone()));
        let mut prompt = PromptRequest::new(child_agent, key, req.message.clone());
        prompt.channel = Some("spawn".into());
        let timeout = req.config.timeout();
        let timed_out = {
            let run = me.run_prompt(prompt, tx, cancel.clone());
            tokio::pin!(run);
            let timed_out = tokio::select! {
                () = &mut run => false,
                () = tokio::time::sleep(timeout) => true,
            };
            if timed_out {
                cancel.cancel();
                let _ = tokio::time::timeout(CANCEL_GRACE, &mut run).await;
            }
            timed_out
        };
        {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(list) = running.get_mut(key) {
                list.retain(|(i, _)| *i != id);
                if list.is_empty() {
                    running.remove(key);
                }
            }
        }
        let mut answer = None;
        let mut error: Option<(String, Option<ErrorKind>)> = None;
        while let Ok(ev) = rx.try_recv() {
            match ev {
                AgentEvent::Done { response, .. } => answer = Some(response),
                AgentEvent::Error { message, kind, .. } => error = Some((message, kind)),
                AgentEvent::Blocked { reason } => {
                    error = Some((format!("blocked: {reason}"), None))
                }
                _ => {}
            }
        }
        let failed = |reason: String, exit_code| SpawnOutcome::Failed { reason, exit_code };
        if timed_out {
            return (
                failed(
                    format!(
                        "the child did not finish within {} s (pluginConfigs.spawn.timeoutSeconds) and was cancelled",
                        timeout.as_secs()
                    ),
                    EXIT_TIMEOUT,
                ),
                "timeout",
            );
        }
        if let Some(denied) = child.first_denial() {
            return (failed(format!("child denied: {denied}"), 1), "denied");
        }
        match (answer, error) {
            (_, Some((message, Some(ErrorKind::BudgetExhausted)))) => (
                failed(
                    format!("budget exhausted: {message}"),
                    EXIT_BUDGET_EXHAUSTED,
                ),
                "budget_exhausted",
            ),
            (_, Some((message, _))) => (failed(format!("child failed: {message}"), 1), "failed"),
            (Some(answer), None) => (SpawnOutcome::Answered(answer), "ok"),
            (None, None) => (
                failed("the child ended without an answer".into(), 1),
                "failed",
            ),
        }
    }

    /// `spawn --info` ([`crate::platform::Host::spawn_info`]).
    pub(crate) async fn spawn_info_text(
        &self,
        agent: &str,
        exec: Option<&str>,
        config: &SpawnConfig,
    ) -> Result<ToolResult, ToolError> {
        let caller = self.spawn_caller(agent, exec).await?.ok();
        let depth = caller
            .as_ref()
            .and_then(|c| c.child.as_ref())
            .map_or(0, |c| c.depth);
        let chain_max = caller
            .as_ref()
            .and_then(|c| c.child.as_ref())
            .map_or(GATEWAY_MAX_DEPTH, |c| c.rights.max_depth);
        let mut out = format!("spawn: agent {agent}, at depth {depth}");
        if let Some(c) = caller.as_ref().and_then(|c| c.child.as_ref()) {
            out.push_str(&format!(" (a sub-agent of session {})", c.parent_key));
        }
        out.push('\n');
        if config.targets.is_empty() {
            out.push_str(&format!(
                "no targets: list them under agents.{agent}.pluginConfigs.spawn.targets\n"
            ));
        }
        for (name, t) in &config.targets {
            let max = chain_max
                .min(t.max_depth.unwrap_or(GATEWAY_MAX_DEPTH))
                .min(GATEWAY_MAX_DEPTH);
            let left = max.saturating_sub(depth);
            let budget = match t.budget.and_then(|b| b.cost_usd) {
                Some(c) => format!(", budget ${c:.2}"),
                None => String::new(),
            };
            out.push_str(&format!(
                "  {name:<12} maxDepth {max}, depth left {left}{budget}{}\n",
                if left == 0 {
                    " (cannot spawn: depth limit reached)"
                } else {
                    ""
                }
            ));
        }
        if let Some(c) = &caller {
            let limits = Limits::for_agent(&self.config, agent);
            if let Some(limit) = limits.session.cost_usd {
                let used = self
                    .ledger
                    .usage_totals(tree(&c.session.id))
                    .await
                    .map_err(|e| store_failed("reading the budgets", e))?;
                out.push_str(&format!(
                    "budget left: ${:.2} of the session's ${limit:.2} (children included)\n",
                    (limit - used.cost_usd()).max(0.0)
                ));
            }
        }
        out.push_str(&format!(
            "maxConcurrent {}, timeoutSeconds {}\n",
            config.max_concurrent, config.timeout_seconds
        ));
        Ok(ToolResult::ok(out))
    }
}

impl RightSet {
    /// `self` with nothing `ceiling` lacks: the stricter of the two, field by field.
    pub(crate) fn narrowed(&self, ceiling: &RightSet) -> RightSet {
        let mut out = self.clone();
        out.tools = self.tools.intersection(&ceiling.tools).cloned().collect();
        for a in &ceiling.rule_agents {
            if !out.rule_agents.contains(a) {
                out.rule_agents.push(a.clone());
            }
        }
        for a in &ceiling.egress_agents {
            if !out.egress_agents.contains(a) {
                out.egress_agents.push(a.clone());
            }
        }
        out.max_depth = self.max_depth.min(ceiling.max_depth);
        out.budget = self.budget.min(ceiling.budget);
        out
    }
}
