//! The gateway's side of egress: each agent's [`RuleSet`] compiled from config at
//! start-up (and again by a reload), the one [`EgressEngine`] with the resolver and
//! dialer the builder was given (hickory and TCP by default), and the audit records of
//! every connection in the gateway's audit log (`type: egress`, `tool:
//! egress.connect`, and `egress.request` for each inspected request). When some agent's
//! streams may need inspecting (request rules or granted credentials), the per-home CA
//! (`<BEIGE_HOME>/keys/egress-ca.{key,pem}`) is loaded or made and the engine gets an
//! [`Inspector`] trusting the public roots plus `egress.tls.extraRoots`. An agent without
//! an `egress` block has no rules: every stream its sandbox opens is refused.
//!
//! With `onUnknown: "ask"`, a miss of an attended run becomes an approval request
//! ([`crate::egress::ask`]): each stream is attributed to the agent's running exec (when
//! exactly one session runs), its snapshot gets the rules the run's approvals add, and
//! the engine asks about what no rule allows.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::audit::{now_ts, AuditDecision, AuditRecord, AuditSink, AuditType, Phase};
use crate::config::{Config, ConfigError};
use crate::egress::ask::{AskFor, EgressAsk, EgressRun};
use crate::egress::broker::Misuse;
use crate::egress::ca::EgressCa;
use crate::egress::config::{Delivery, OnUnknown};
use crate::egress::engine::{
    ConnectionPhase, ConnectionRecord, EgressAudit, EgressEngine, DEFAULT_MAX_STREAMS,
};
use crate::egress::inspect::{read_pem_certs, Inspector, RequestRecord};
use crate::egress::placeholder::PlaceholderKey;
use crate::egress::rules::{DenyReason, RuleSet};
use crate::egress::upstream::{Dialer, HickoryResolver, Resolver, TcpDialer};
use crate::sandbox::{EgressStream, Sandbox};

/// One agent's egress: its rules (the snapshot new streams get), its stream limit, and
/// the placeholders each of its execs gets (`(variable, credential, prefix)`).
#[derive(Debug)]
struct AgentEgress {
    rules: Arc<RuleSet>,
    max_streams: usize,
    /// What a miss does.
    on_unknown: OnUnknown,
    /// How long an asked-about connection waits for the answer.
    hold: std::time::Duration,
    placeholders: Vec<(String, String, String)>,
}

/// Egress for every agent of one engine.
#[derive(Debug)]
pub(crate) struct GatewayEgress {
    engine: Arc<EgressEngine>,
    agents: HashMap<String, AgentEgress>,
    /// The home's egress CA, installed in every sandbox with egress.
    ca: Arc<EgressCa>,
    /// The home's placeholder key, when some agent has a placeholder credential.
    placeholder_key: Option<Arc<PlaceholderKey>>,
    /// Cancelled by the gateway's final stop: every open stream ends.
    end: CancellationToken,
    /// Recent refusals per agent, for the footer of the exec they happened during.
    refusals: Refusals,
    /// The requests misses raised (`onUnknown: "ask"`) and the `once` approvals used.
    ask: EgressAsk,
}

/// Most refusals kept per agent for exec footers.
const KEPT_REFUSALS: usize = 256;
/// Most footer lines under one exec result.
const FOOTER_LINES: usize = 5;

/// One refusal: when, the target (`host:port`), why, and the approval request it waits
/// for or was refused by.
type Refusal = (Instant, String, DenyReason, Option<String>);

/// Recent refusals per agent.
#[derive(Debug, Default)]
struct Refusals(Mutex<HashMap<String, VecDeque<Refusal>>>);

impl Refusals {
    fn push(&self, agent: &str, target: String, reason: DenyReason, approval: Option<String>) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let q = all.entry(agent.to_string()).or_default();
        if q.len() == KEPT_REFUSALS {
            q.pop_front();
        }
        q.push_back((Instant::now(), target, reason, approval));
    }

    /// The refusals of `agent` since `since`, as at most [`FOOTER_LINES`] lines.
    fn footer(&self, agent: &str, since: Instant) -> Option<String> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let q = all.get(agent)?;
        let mut groups: Vec<((String, DenyReason), usize, Option<String>)> = Vec::new();
        for (_, target, reason, approval) in q.iter().filter(|(at, ..)| *at >= since) {
            match groups
                .iter_mut()
                .find(|((t, r), ..)| t == target && r == reason)
            {
                Some((_, n, last)) => {
                    *n += 1;
                    if approval.is_some() {
                        last.clone_from(approval);
                    }
                }
                None => groups.push(((target.clone(), *reason), 1, approval.clone())),
            }
        }
        if groups.is_empty() {
            return None;
        }
        let mut lines: Vec<String> = groups
            .iter()
            .take(FOOTER_LINES)
            .map(|((target, reason), n, approval)| {
                let what = if *n == 1 {
                    "1 connection".to_string()
                } else {
                    format!("{n} connections")
                };
                let approval = match (reason, approval) {
                    (DenyReason::ApprovalPending, Some(id)) => format!("; approval {id} pending"),
                    (_, Some(id)) => format!("; approval {id}"),
                    (_, None) => String::new(),
                };
                format!(
                    "[beige] egress: {what} to {target} refused ({}: {}){approval}",
                    reason.as_str(),
                    reason.explain()
                )
            })
            .collect();
        if groups.len() > FOOTER_LINES {
            lines.push(format!(
                "[beige] egress: and {} more refused targets (see the audit log)",
                groups.len() - FOOTER_LINES
            ));
        }
        Some(lines.join("\n"))
    }
}

impl GatewayEgress {
    /// The agents' rules from `config`; `None` when no agent has egress. The resolver
    /// and dialer default to the host's DNS and TCP; the CA, when one is needed, lives in
    /// `keys_dir`.
    pub(crate) fn from_config(
        config: &Config,
        file: &Path,
        keys_dir: &Path,
        resolver: Option<Arc<dyn Resolver>>,
        dialer: Option<Arc<dyn Dialer>>,
        version: u64,
        end: CancellationToken,
    ) -> Result<Option<Self>, ConfigError> {
        let invalid = |path: String, message: String| ConfigError::Invalid {
            file: file.to_path_buf(),
            path,
            message,
        };
        let mut agents = HashMap::new();
        let mut may_inspect = false;
        for (name, agent) in &config.agents {
            let Some(egress) = &agent.egress else {
                continue;
            };
            let first = |errors: Vec<crate::egress::config::RuleError>| {
                let e = errors.into_iter().next();
                invalid(
                    e.as_ref().map(|e| e.path.clone()).unwrap_or_default(),
                    e.map(|e| e.message).unwrap_or_default(),
                )
            };
            let rules =
                crate::egress::config::rule_set(config.egress.as_ref(), name, egress, version)
                    .map_err(first)?;
            let settings = crate::egress::config::settings(config.egress.as_ref(), name, egress)
                .map_err(first)?;
            let max_streams = settings.max_streams;
            let on_unknown = settings.on_unknown;
            let hold = std::time::Duration::from_secs(settings.hold_seconds);
            may_inspect |= !egress.credentials.is_empty()
                || rules.rules().iter().any(|r| r.is_request_level());
            let placeholders = rules
                .credentials()
                .iter()
                .filter_map(|c| match &c.delivery {
                    Delivery::Placeholder { env, prefix } => {
                        Some((env.clone(), c.name.clone(), prefix.clone()))
                    }
                    Delivery::Inject { .. } => None,
                })
                .collect();
            agents.insert(
                name.clone(),
                AgentEgress {
                    rules: Arc::new(rules),
                    max_streams,
                    on_unknown,
                    hold,
                    placeholders,
                },
            );
        }
        if agents.is_empty() {
            return Ok(None);
        }
        // The CA is installed whenever egress is on, so that a rule that starts
        // inspecting never needs the sandbox made again.
        let ca = Arc::new(EgressCa::load_or_create(keys_dir).map_err(|e| {
            invalid(
                "egress".into(),
                format!("the egress CA cannot be set up: {e}"),
            )
        })?);
        let placeholder_key = if agents.values().any(|a| !a.placeholders.is_empty()) {
            Some(Arc::new(PlaceholderKey::load_or_create(keys_dir).map_err(
                |e| {
                    invalid(
                        "egress.credentials".into(),
                        format!("the placeholder key cannot be set up: {e}"),
                    )
                },
            )?))
        } else {
            None
        };
        let resolver = match resolver {
            Some(r) => r,
            None => Arc::new(
                HickoryResolver::system().map_err(|e| invalid("egress".into(), e.to_string()))?,
            ),
        };
        let dialer = dialer.unwrap_or_else(|| Arc::new(TcpDialer));
        let mut engine = EgressEngine::new(resolver, dialer);
        if may_inspect {
            let mut inspector = inspector(config, file, ca.clone())?;
            if let Some(key) = &placeholder_key {
                inspector = inspector.with_placeholders(key.clone());
            }
            engine = engine.with_inspector(Arc::new(inspector));
        }
        Ok(Some(Self {
            engine: Arc::new(engine),
            agents,
            ca,
            placeholder_key,
            end,
            refusals: Refusals::default(),
            ask: EgressAsk::new(),
        }))
    }

    /// Refuse a stream when no agent has egress (a sandbox that should not have a
    /// proxy at all): no rules, so every stream gets `no_rule`, recorded.
    pub(crate) async fn refuse_all(agent: &str, stream: EgressStream, audit: &dyn AuditSink) {
        let engine = EgressEngine::new(Arc::new(NoResolver), Arc::new(TcpDialer));
        let rules = Arc::new(RuleSet::new(Vec::new(), 0));
        let recorder = Recorder {
            audit,
            refusals: None,
            sandbox: None,
            admitted: None,
            traces: None,
        };
        engine
            .serve(agent, rules, DEFAULT_MAX_STREAMS, stream, &recorder)
            .await;
    }

    /// Serve one stream of `agent`'s sandbox to its end, for `gateway`.
    pub(super) async fn serve(&self, agent: &str, stream: EgressStream, gateway: &super::Inner) {
        let audit = gateway.audit.as_ref();
        let Some(a) = self.agents.get(agent) else {
            // No egress block: no rule allows anything.
            let recorder = Recorder {
                audit,
                refusals: Some(&self.refusals),
                sandbox: Some(gateway.sandbox.as_ref()),
                admitted: None,
                traces: None,
            };
            let rules = Arc::new(RuleSet::new(Vec::new(), 0));
            return self
                .until_end(
                    agent,
                    self.engine
                        .serve(agent, rules, DEFAULT_MAX_STREAMS, stream, &recorder),
                )
                .await;
        };
        // The run the stream is attributed to, and the rules its approvals add.
        let approvals = gateway.approvals().as_ref();
        let run = gateway.egress_run(agent).await;
        let execs = gateway.execs.clone();
        let owner = agent.to_string();
        let running = move |exec: &str| {
            execs
                .get(&owner, &crate::ident::ExecId::new(exec))
                .is_some_and(|r| !r.ended)
        };
        let rules = self
            .ask
            .rules_for(approvals, agent, &a.rules, &run, &running);
        let recorder = Recorder {
            audit,
            refusals: Some(&self.refusals),
            sandbox: Some(gateway.sandbox.as_ref()),
            admitted: Some((&self.ask, approvals, &run)),
            traces: run.exec.as_deref().map(|e| (gateway.traces.as_ref(), e)),
        };
        let asking = AskFor {
            ask: &self.ask,
            approvals,
            agent,
            base: &a.rules,
            rules: &rules,
            run: &run,
            running: &running,
            hold: a.hold,
        };
        let unknown = (a.on_unknown == OnUnknown::Ask)
            .then_some(&asking as &dyn crate::egress::engine::UnknownHosts);
        self.until_end(
            agent,
            self.engine.serve_with(
                agent,
                rules.clone(),
                a.max_streams,
                stream,
                &recorder,
                unknown,
            ),
        )
        .await;
    }

    /// Runs `serving` until it ends or the gateway's final stop: a reload keeps the
    /// stream on its snapshot; the final stop ends it (its sockets close, so both sides
    /// see the end).
    async fn until_end(&self, agent: &str, serving: impl std::future::Future<Output = ()>) {
        tokio::select! {
            () = serving => {}
            () = self.end.cancelled() => {
                tracing::info!(agent, "egress: the gateway stopped; an open stream ends");
            }
        }
    }
}

impl super::Inner {
    /// The run a new egress stream of `agent` is attributed to. Streams do not name
    /// their exec yet, so this is the agent's running exec: the newest, when all running
    /// execs are of one session. With none, or several sessions, the stream is unbound.
    /// The run is attended when an attended prompt runs in that session and it is not a
    /// sub-agent's.
    pub(super) async fn egress_run(&self, agent: &str) -> EgressRun {
        let running = self.execs.running(agent);
        let Some(newest) = running.last() else {
            return EgressRun {
                unattended: Some(format!(
                    "an unbound stream: no exec of agent '{agent}' is running"
                )),
                ..EgressRun::default()
            };
        };
        let key = newest.session.key.clone();
        if running.iter().any(|r| r.session.key != key) {
            return EgressRun {
                unattended: Some(format!(
                    "an unbound stream: execs of several sessions of agent '{agent}' are running, and streams do not name their exec yet"
                )),
                ..EgressRun::default()
            };
        }
        let Some(key) = key else {
            return EgressRun {
                exec: Some(newest.id.to_string()),
                command: Some(newest.command.clone()),
                unattended: Some("an exec without a session".into()),
                ..EgressRun::default()
            };
        };
        let unattended = if self.child_for_key(&key).await.is_some() {
            Some(format!(
                "a sub-agent's session '{key}'; its parent agent cannot approve it"
            ))
        } else if !self.is_attended(&key) {
            Some(format!("session '{key}' has no attended prompt running"))
        } else {
            None
        };
        EgressRun {
            session: Some(key),
            exec: Some(newest.id.to_string()),
            command: Some(newest.command.clone()),
            unattended,
        }
    }
}

/// The inspector of `config`: the home's CA and the extra roots of
/// `egress.tls.extraRoots` (`~/` is the user's home, relative paths are relative to the
/// config file).
fn inspector(config: &Config, file: &Path, ca: Arc<EgressCa>) -> Result<Inspector, ConfigError> {
    let invalid = |path: String, message: String| ConfigError::Invalid {
        file: file.to_path_buf(),
        path,
        message,
    };
    let mut roots = Vec::new();
    let listed = config
        .egress
        .as_ref()
        .map(|e| e.tls.extra_roots.as_slice())
        .unwrap_or_default();
    for (i, raw) in listed.iter().enumerate() {
        let path = if let Some(rest) = raw.strip_prefix("~/") {
            crate::home::user_home().join(rest)
        } else {
            let p = Path::new(raw);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                file.parent().unwrap_or(Path::new(".")).join(p)
            }
        };
        let certs =
            read_pem_certs(&path).map_err(|e| invalid(format!("egress.tls.extraRoots[{i}]"), e))?;
        roots.extend(certs);
    }
    Inspector::new(ca, roots).map_err(|e| invalid("egress.tls.extraRoots".into(), e.to_string()))
}

/// A resolver never asked: with no rules, nothing gets as far as resolving.
#[derive(Debug)]
struct NoResolver;

#[async_trait]
impl Resolver for NoResolver {
    async fn resolve(
        &self,
        name: &str,
    ) -> Result<Vec<std::net::IpAddr>, crate::egress::upstream::ResolveError> {
        Err(crate::egress::upstream::ResolveError::NoAddresses {
            name: name.to_string(),
        })
    }
}

/// Writes the engine's connection records to the gateway's audit log, and keeps the
/// refusals for the exec footer.
struct Recorder<'a> {
    audit: &'a dyn AuditSink,
    refusals: Option<&'a Refusals>,
    /// Where a misused placeholder's exec is killed (`violation: block_and_kill`).
    sandbox: Option<&'a dyn Sandbox>,
    /// Told of each stream that starts, so that a `once` approval its rule came from is
    /// used (bound to the run's exec).
    admitted: Option<(
        &'a EgressAsk,
        &'a crate::approvals::Approvals,
        &'a EgressRun,
    )>,
    /// The tracer and the exec the streams are attributed to: a stream's
    /// `beige.egress.request` span goes under that exec's span (none without one).
    traces: Option<(&'a crate::telemetry::Traces, &'a str)>,
}

impl Recorder<'_> {
    /// The span of the stream `r` is a record of: begun at `started` (and kept open),
    /// taken back at `finished`; a stream refused before it started gets one at its
    /// `finished` record. `None` when traces are off or no exec is running.
    fn span(&self, r: &ConnectionRecord) -> Option<(opentelemetry::Context, bool)> {
        use crate::telemetry::names;
        use opentelemetry::trace::TraceContextExt as _;
        use opentelemetry::KeyValue;
        let (traces, exec) = self.traces.filter(|(t, _)| t.is_on())?;
        let key = format!("egress:{}:{}", r.agent, r.id);
        if r.phase == ConnectionPhase::Finished {
            if let Some(cx) = traces.take_open(&key) {
                return Some((cx, true));
            }
        }
        let parent = traces.exec_context(Some(exec));
        if !parent.span().span_context().is_valid() {
            return None;
        }
        let mut attributes = vec![
            KeyValue::new(names::SERVER_ADDRESS, r.host.clone()),
            KeyValue::new(names::SERVER_PORT, i64::from(r.port)),
            KeyValue::new(names::EXEC_ID, exec.to_string()),
        ];
        if let Some(mode) = r.mode {
            attributes.push(KeyValue::new(names::EGRESS_MODE, mode.as_str()));
        }
        let cx = traces.child(&parent, names::SPAN_EGRESS.to_string(), attributes);
        let ends = r.phase == ConnectionPhase::Finished || !traces.keep_open(key, &cx);
        Some((cx, ends))
    }
}

impl Recorder<'_> {
    /// Keep a refusal for the footer, then write the record.
    async fn write(
        &self,
        agent: &str,
        target: (&str, u16),
        reason: Option<(DenyReason, Option<&String>)>,
        record: AuditRecord,
    ) -> Result<(), String> {
        if let (Some(refusals), Some((reason, approval))) = (self.refusals, reason) {
            refusals.push(
                agent,
                format!("{}:{}", target.0, target.1),
                reason,
                approval.cloned(),
            );
        }
        self.audit.record(&record).await.map_err(|e| e.to_string())
    }
}

#[async_trait]
impl EgressAudit for Recorder<'_> {
    async fn record(&self, r: &ConnectionRecord) -> Result<(), String> {
        use opentelemetry::trace::FutureExt as _;
        let span = self.span(r);
        let written = self
            .write(
                &r.agent,
                (&r.host, r.port),
                r.reason.map(|reason| (reason, r.approval.as_ref())),
                audit_record(r),
            )
            .with_context(span.as_ref().map(|(cx, _)| cx.clone()).unwrap_or_default())
            .await;
        if let Some((cx, true)) = &span {
            crate::telemetry::end(cx, stream_attributes(r));
        }
        written?;
        if let (ConnectionPhase::Started, Some(rule), Some((ask, approvals, run))) =
            (r.phase, &r.rule, self.admitted)
        {
            ask.admitted(approvals, rule, run).await;
        }
        Ok(())
    }

    async fn record_request(&self, r: &RequestRecord) -> Result<(), String> {
        if let Some(misuse) = &r.misuse {
            let killed = match (misuse.kill, self.sandbox) {
                (true, Some(sandbox)) => {
                    let kill =
                        beige_protocol::op::OpRequest::Kill(beige_protocol::op::KillRequest {
                            exec_id: misuse.exec.clone(),
                        });
                    match sandbox.run_op(&r.agent, &kill).await {
                        Ok(_) => true,
                        Err(e) => {
                            tracing::warn!(agent = r.agent, exec = misuse.exec, error = %e, "egress: cannot kill the exec of a misused placeholder");
                            false
                        }
                    }
                }
                _ => false,
            };
            let record = misuse_audit_record(r, misuse, killed);
            self.audit
                .record(&record)
                .await
                .map_err(|e| e.to_string())?;
        }
        self.write(
            &r.agent,
            (&r.host, r.port),
            r.reason.map(|reason| (reason, None)),
            request_audit_record(r),
        )
        .await
    }
}

/// The security record of a misused placeholder (`tool:
/// security.egress_placeholder_misuse`): the credential, the host, how the placeholder
/// was written, the exec it was made for and whether it was killed; never the token.
fn misuse_audit_record(r: &RequestRecord, misuse: &Misuse, killed: bool) -> AuditRecord {
    let mut record = AuditRecord::security(
        &r.agent,
        "security.egress_placeholder_misuse",
        vec![format!("{}:{}", r.host, r.port)],
        AuditDecision::Denied,
    );
    record.ts = now_ts();
    record.target = None;
    record.error = Some(format!(
        "a placeholder of credential '{}' (made for exec {}) was sent to {}, which it is not \
         for",
        misuse.credential, misuse.exec, r.host
    ));
    record.egress = Some(json!({
        "id": r.id,
        "credential": misuse.credential,
        "host": r.host,
        "port": r.port,
        "encoding": misuse.encoding.as_str(),
        "exec": misuse.exec,
        "killed": killed,
    }));
    record
}

/// The audit record of an inspected request (`tool: egress.request`).
pub(crate) fn request_audit_record(r: &RequestRecord) -> AuditRecord {
    let mut egress = Map::new();
    egress.insert("id".into(), json!(r.id));
    egress.insert("seq".into(), json!(r.seq));
    egress.insert("method".into(), json!(r.method));
    egress.insert("path".into(), json!(r.path));
    egress.insert("status".into(), json!(r.status));
    egress.insert("ms".into(), json!(r.duration.as_millis() as u64));
    egress.insert("substituted".into(), json!(r.substituted));
    egress.insert("scrubbed".into(), json!(r.scrubbed));
    egress.insert("host".into(), json!(r.host));
    egress.insert("port".into(), json!(r.port));
    egress.insert("mode".into(), json!("inspect"));
    if let Some(rule) = &r.rule {
        egress.insert("rule".into(), json!(rule));
    }
    if let Some(credential) = &r.credential {
        egress.insert("credential".into(), json!(credential));
    }
    if let Some(reason) = r.reason {
        egress.insert("reason".into(), json!(reason.as_str()));
    }
    if let Some(exec) = &r.exec {
        egress.insert("exec".into(), json!(exec));
    }
    let mut record = AuditRecord::security(
        &r.agent,
        "egress.request",
        vec![format!("{} {}:{}{}", r.method, r.host, r.port, r.path)],
        if r.reason.is_some() {
            AuditDecision::Denied
        } else {
            AuditDecision::Allowed
        },
    );
    record.ts = now_ts();
    record.kind = AuditType::Egress;
    record.target = None;
    record.phase = Phase::Finished;
    record.duration_ms = Some(r.duration.as_millis() as u64);
    record.error = match (&r.error, r.reason) {
        (Some(e), Some(reason)) => Some(format!("{}: {e}", reason.explain())),
        (None, Some(reason)) => Some(reason.explain().to_string()),
        (e, None) => e.clone(),
    };
    record.egress = Some(Value::Object(egress));
    record
}

impl GatewayEgress {
    /// The footer of an exec of `agent` that started at `since`: the egress refusals
    /// of the agent meanwhile (attributed by time, not yet by process: two execs of one
    /// agent at once see each other's).
    pub(crate) fn footer(&self, agent: &str, since: Instant) -> Option<String> {
        self.refusals.footer(agent, since)
    }

    /// The CA every sandbox with egress trusts (DER).
    pub(crate) fn ca_der(&self) -> Vec<u8> {
        self.ca.cert_der().as_ref().to_vec()
    }

    /// The placeholders exec `exec_id` of `agent` gets, as environment variables: one
    /// per placeholder credential it is granted, made for this exec.
    pub(crate) fn exec_env(&self, agent: &str, exec_id: &str) -> Vec<(String, String)> {
        let (Some(key), Some(a)) = (&self.placeholder_key, self.agents.get(agent)) else {
            return Vec::new();
        };
        a.placeholders
            .iter()
            .filter_map(|(env, credential, prefix)| {
                Some((env.clone(), key.mint(agent, credential, exec_id, prefix)?))
            })
            .collect()
    }
}

/// What a stream's span says when it ends: the decision, the rule, why it was refused
/// and what it carried.
fn stream_attributes(r: &ConnectionRecord) -> Vec<opentelemetry::KeyValue> {
    use crate::telemetry::names;
    use opentelemetry::KeyValue;
    let mut v = vec![KeyValue::new(
        names::DECISION,
        if r.reason.is_some() {
            "denied"
        } else {
            "allowed"
        },
    )];
    if let Some(rule) = &r.rule {
        v.push(KeyValue::new(names::RULE_ID, rule.clone()));
    }
    if let Some(mode) = r.mode {
        v.push(KeyValue::new(names::EGRESS_MODE, mode.as_str()));
    }
    if let Some(reason) = r.reason {
        v.push(KeyValue::new(names::EGRESS_REASON, reason.as_str()));
    }
    if r.phase == ConnectionPhase::Finished && r.reason.is_none() {
        v.push(KeyValue::new(names::EGRESS_BYTES_UP, r.bytes_up as i64));
        v.push(KeyValue::new(names::EGRESS_BYTES_DOWN, r.bytes_down as i64));
    }
    v
}

/// The audit record of a connection record.
pub(crate) fn audit_record(r: &ConnectionRecord) -> AuditRecord {
    let mut egress = Map::new();
    egress.insert("id".into(), json!(r.id));
    egress.insert("entry".into(), json!(r.entry.as_str()));
    egress.insert("host".into(), json!(r.host));
    egress.insert("port".into(), json!(r.port));
    if let Some(ip) = r.ip {
        egress.insert("ip".into(), json!(ip.to_string()));
    }
    if let Some(mode) = r.mode {
        egress.insert("mode".into(), json!(mode.as_str()));
    }
    if let Some(rule) = &r.rule {
        egress.insert("rule".into(), json!(rule));
    }
    egress.insert("policyVersion".into(), json!(r.policy_version));
    if r.phase == ConnectionPhase::Finished && r.reason.is_none() {
        egress.insert("bytesUp".into(), json!(r.bytes_up));
        egress.insert("bytesDown".into(), json!(r.bytes_down));
    }
    if let Some(reason) = r.reason {
        egress.insert("reason".into(), json!(reason.as_str()));
    }
    if let Some(approval) = &r.approval {
        egress.insert("approval".into(), json!(approval));
    }
    let mut record = AuditRecord::security(
        &r.agent,
        "egress.connect",
        vec![format!("{}:{}", r.host, r.port)],
        if r.reason.is_some() {
            AuditDecision::Denied
        } else {
            AuditDecision::Allowed
        },
    );
    record.ts = now_ts();
    record.kind = AuditType::Egress;
    record.target = None;
    record.phase = match r.phase {
        ConnectionPhase::Started => Phase::Started,
        ConnectionPhase::Finished => Phase::Finished,
    };
    record.duration_ms = r.duration.map(|d| d.as_millis() as u64);
    record.error = match (&r.error, r.reason) {
        (Some(e), Some(reason)) => Some(format!("{}: {e}", reason.explain())),
        (None, Some(reason)) => Some(reason.explain().to_string()),
        (e, None) => e.clone(),
    };
    record.egress = Some(Value::Object(egress));
    record
}

/// Remote MCP servers' egress (`spec/mcp.md` §1.2): the gateway's own connections to a
/// server decided with the agent's rules by the engine's matcher and classifier, pinned,
/// dialled with the engine's dialer and recorded like sandbox streams (`egress.connect`,
/// `entry: "gateway"`, `mcpServer`), and the server's credentials as headers.
#[cfg(feature = "mcp")]
#[derive(Debug)]
pub(crate) struct McpEgressRoutes {
    engine: Arc<EgressEngine>,
    /// Each agent's rules (agents without egress have none).
    rules: HashMap<String, Arc<RuleSet>>,
    /// `egress.credentials`.
    credentials: indexmap::IndexMap<String, crate::egress::config::CredentialConfig>,
    audit: Arc<dyn AuditSink>,
}

#[cfg(feature = "mcp")]
impl GatewayEgress {
    /// What remote MCP servers of `config`'s agents go out through.
    pub(crate) fn mcp_routes(
        &self,
        config: &Config,
        audit: Arc<dyn AuditSink>,
    ) -> Arc<dyn crate::mcp::remote::McpEgress> {
        Arc::new(McpEgressRoutes {
            engine: self.engine.clone(),
            rules: self
                .agents
                .iter()
                .map(|(name, a)| (name.clone(), a.rules.clone()))
                .collect(),
            credentials: config
                .egress
                .as_ref()
                .map(|e| e.credentials.clone())
                .unwrap_or_default(),
            audit,
        })
    }
}

#[cfg(feature = "mcp")]
impl McpEgressRoutes {
    fn target(
        t: &crate::mcp::remote::RemoteTarget,
    ) -> Result<crate::egress::target::Target, String> {
        let host = crate::egress::target::normalize_host(&t.host)
            .map_err(|e| format!("its host {:?} cannot be used: {e}", t.host))?;
        Ok(crate::egress::target::Target { host, port: t.port })
    }

    fn rule_hint(agent: &str, t: &crate::mcp::remote::RemoteTarget) -> String {
        format!(
            "add a rule to agents.{agent}.egress.rules: {{ id: \"mcp-{}\", hosts: [\"{}\"], ports: [{}] }}",
            t.server, t.host, t.port
        )
    }
}

/// Writes a remote MCP server's connection records: egress records marked as the
/// gateway's own connection for the server.
#[cfg(feature = "mcp")]
struct McpRecorder<'a> {
    audit: &'a dyn AuditSink,
    server: &'a str,
}

#[cfg(feature = "mcp")]
#[async_trait]
impl EgressAudit for McpRecorder<'_> {
    async fn record(&self, r: &ConnectionRecord) -> Result<(), String> {
        let mut record = audit_record(r);
        if let Some(Value::Object(egress)) = record.egress.as_mut() {
            egress.insert("entry".into(), json!("gateway"));
            egress.insert("mcpServer".into(), json!(self.server));
        }
        self.audit.record(&record).await.map_err(|e| e.to_string())
    }
}

#[cfg(feature = "mcp")]
#[async_trait]
impl crate::mcp::remote::McpEgress for McpEgressRoutes {
    async fn check(&self, agent: &str, t: &crate::mcp::remote::RemoteTarget) -> Result<(), String> {
        let Some(rules) = self.rules.get(agent) else {
            return Err(format!(
                "a remote MCP server is reached through the agent's egress, and agent '{agent}' has no egress; add agents.{agent}.egress and in it a rule {{ id: \"mcp-{}\", hosts: [\"{}\"], ports: [{}] }}",
                t.server, t.host, t.port
            ));
        };
        let target = Self::target(t)?;
        let request = crate::egress::rules::Request {
            method: "POST",
            path: &t.path,
        };
        match self
            .engine
            .check_outbound(agent, rules, &target, Some(request))
            .await
        {
            Ok(_) => Ok(()),
            Err(mut refused) => {
                // Refused before any connection: one denied record, as a stream gets.
                let recorder = McpRecorder {
                    audit: self.audit.as_ref(),
                    server: &t.server,
                };
                refused.phase = ConnectionPhase::Finished;
                if let Err(e) = recorder.record(&refused).await {
                    tracing::error!(agent, "egress: a refusal's record failed: {e}");
                }
                let reason = refused.reason.unwrap_or(DenyReason::NoRule);
                let what = match (&refused.error, &refused.rule) {
                    (Some(e), _) => format!("{}: {e}", reason.explain()),
                    (None, Some(rule)) => format!("{} (rule '{rule}')", reason.explain()),
                    (None, None) => reason.explain().to_string(),
                };
                let fix = match reason {
                    DenyReason::NoRule | DenyReason::PortNotAllowed => {
                        format!("; {}", Self::rule_hint(agent, t))
                    }
                    _ => String::new(),
                };
                Err(format!(
                    "agent '{agent}' may not reach {}:{} ({}: {what}){fix}",
                    t.host,
                    t.port,
                    reason.as_str()
                ))
            }
        }
    }

    async fn open(
        &self,
        agent: &str,
        t: &crate::mcp::remote::RemoteTarget,
    ) -> Result<crate::mcp::remote::Opened, String> {
        let Some(rules) = self.rules.get(agent).cloned() else {
            return Err(format!("agent '{agent}' has no egress"));
        };
        let target = Self::target(t)?;
        let request = crate::egress::rules::Request {
            method: "POST",
            path: &t.path,
        };
        let recorder = McpRecorder {
            audit: self.audit.as_ref(),
            server: &t.server,
        };
        let outbound = self
            .engine
            .open_outbound(agent, &rules, &target, Some(request), &recorder)
            .await
            .map_err(|refused| match (refused.reason, refused.error) {
                (Some(reason), Some(e)) => {
                    format!("{} ({}): {e}", reason.as_str(), reason.explain())
                }
                (Some(reason), None) => format!("{} ({})", reason.as_str(), reason.explain()),
                (None, Some(e)) => e,
                (None, None) => "refused".to_string(),
            })?;
        let crate::egress::engine::Outbound {
            upstream,
            record,
            started,
            ..
        } = outbound;
        let (engine, audit, server) = (self.engine.clone(), self.audit.clone(), t.server.clone());
        Ok(crate::mcp::remote::Opened {
            upstream,
            finished: Box::new(move |up, down, error| {
                Box::pin(async move {
                    let recorder = McpRecorder {
                        audit: audit.as_ref(),
                        server: &server,
                    };
                    engine
                        .finish_outbound(record, started, (up, down), error, &recorder)
                        .await;
                })
            }),
        })
    }

    fn credential_headers(
        &self,
        agent: &str,
        t: &crate::mcp::remote::RemoteTarget,
        credentials: &[String],
    ) -> Result<Vec<crate::mcp::remote::CredentialHeader>, String> {
        let Some(rules) = self.rules.get(agent) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for name in credentials {
            let Some(config) = self.credentials.get(name) else {
                return Err(format!(
                    "mcp.servers.{}.credentials names '{name}', which egress.credentials does not define; define it there",
                    t.server
                ));
            };
            let path = format!("egress.credentials.{name}");
            let credential =
                crate::egress::config::check_credential(&path, agent, name, config, rules)
                    .map_err(|errors| {
                        errors
                            .into_iter()
                            .map(|e| format!("{}: {}", e.path, e.message))
                            .collect::<Vec<_>>()
                            .join("; ")
                    })?;
            if !credential.is_for(&t.host) {
                return Err(format!(
                    "credential '{name}' is for {}, not {}; add {} to egress.credentials.{name}.hosts",
                    credential.hosts.join(", "),
                    t.host,
                    t.host
                ));
            }
            let (header, value) = match credential.header_value() {
                Some((header, value)) => (header.to_string(), value),
                // A placeholder credential: the gateway is the client, so the secret
                // itself goes in, as a bearer token.
                None => (
                    "authorization".to_string(),
                    format!("Bearer {}", credential.secret.expose()),
                ),
            };
            out.push(crate::mcp::remote::CredentialHeader {
                name: header,
                value,
            });
        }
        Ok(out)
    }
}
