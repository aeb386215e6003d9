//! Prometheus metrics of one gateway (observability.md §2): prompts, model calls and
//! their tokens and cost, tool calls by kind and decision, sandbox ops, sandbox links,
//! egress connections and bytes, audit records, writes and failures, waiters for a
//! session or a provider slot, and approvals pending.
//!
//! Owns one registry per gateway (no global state: two gateways in one process stay
//! apart), the metric families and their bounded label sets, and the text a scrape
//! returns. Labels are only ever agent, channel, provider, model, configured tool names
//! and fixed words: a tool name a sandbox made up is counted as `other`, and nothing
//! carries a session, user, chat, host or path. Tool calls are counted from the audit
//! records (the authority on what ran and how it was decided) through
//! [`ObservedAudit`], so every path that audits is counted; egress connections too.
//! Also owns the rule for `telemetry.metrics.listen` ([`listen_address`]: loopback
//! only). Without the `metrics` feature every method is a no-op and [`Metrics::render`]
//! is `None`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::audit::{AuditError, AuditRecord, AuditSink};

/// How a prompt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptOutcome {
    /// It answered.
    Done,
    /// A hook or a budget blocked it.
    Blocked,
    /// It failed (a model error, a refusal).
    Failed,
    /// It was cancelled.
    Cancelled,
}

impl PromptOutcome {
    /// The word the metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Blocked => "blocked",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The address `telemetry.metrics.listen` names: an IP literal with a port
/// (`127.0.0.1:9464`, `[::1]:9464`) or `localhost:<port>` (127.0.0.1), port 0 meaning a
/// free one. The listener serves without a token, so the address must be loopback; the
/// error says what is wrong and what to write instead.
pub fn listen_address(value: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let fix = "use a loopback address such as \"127.0.0.1:9464\" (the listener has no \
               token; to scrape from another host, use telemetry.metrics.enabled and a token \
               on the API's port)";
    let trimmed = value.trim();
    let addr = if let Ok(addr) = trimmed.parse::<SocketAddr>() {
        addr
    } else {
        let Some((host, port)) = trimmed.rsplit_once(':') else {
            return Err(format!("\"{value}\" has no port; {fix}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("\"{value}\" has no valid port (0-65535); {fix}"))?;
        let host = host.trim_end_matches('.');
        if host.contains(':') {
            return Err(format!(
                "\"{value}\" is not a valid address (an IPv6 address goes in brackets, \
                 e.g. \"[::1]:9464\"); {fix}"
            ));
        } else if host.eq_ignore_ascii_case("localhost") {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
        } else if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            return Err(format!("\"{value}\" is not a valid address; {fix}"));
        } else {
            return Err(format!(
                "\"{value}\" names host \"{host}\": only IP addresses and localhost are \
                 accepted, since a name could resolve to a public address; {fix}"
            ));
        }
    };
    if !addr.ip().is_loopback() {
        return Err(format!(
            "\"{value}\" is not a loopback address: the metrics listener serves without a \
             token, so it would expose the gateway's metrics to {}; {fix}",
            if addr.ip().is_unspecified() {
                "every network the host is on"
            } else {
                "that network"
            }
        ));
    }
    Ok(addr)
}

/// The metrics of one gateway, shared by every engine a reload builds.
#[derive(Debug, Default)]
pub struct Metrics {
    #[cfg(feature = "metrics")]
    imp: imp::Families,
}

impl Metrics {
    /// A fresh registry with every family registered (and empty).
    pub fn new() -> Self {
        Self::default()
    }

    /// One prompt ended after `took`.
    #[allow(unused_variables)]
    pub fn prompt(&self, agent: &str, channel: &str, outcome: PromptOutcome, took: Duration) {
        #[cfg(feature = "metrics")]
        self.imp.prompt(agent, channel, outcome, took);
    }

    /// One model call answered: its tokens and cost.
    #[allow(unused_variables)]
    pub fn model_call(
        &self,
        agent: &str,
        model_key: &str,
        usage: &crate::llm::Usage,
        cost_micros: i64,
    ) {
        #[cfg(feature = "metrics")]
        self.imp.model_call(agent, model_key, usage, cost_micros);
    }

    /// One core tool op reached the sandbox and ended after `took`: `op` is the core
    /// tool (`read`, `write`, `patch`, `exec`), `transport` how it went (`link-unix`,
    /// `link-attach`, `docker-exec`, `direct`) or `none` when it failed before one.
    #[allow(unused_variables)]
    pub fn sandbox_op(&self, op: &str, transport: &str, took: Duration) {
        #[cfg(feature = "metrics")]
        self.imp.sandbox_op(op, transport, took);
    }

    /// What happened to `agent`'s sandbox link (up, down, a refused peer, a ping).
    #[allow(unused_variables)]
    pub fn link_event(&self, agent: &str, event: crate::sandbox::LinkEvent) {
        #[cfg(feature = "metrics")]
        self.imp.link_event(agent, event);
    }

    /// A prompt of `agent` waits for its session's lock while the guard lives.
    #[allow(unused_variables)]
    pub fn session_waiting(&self, agent: &str) -> Waiting {
        #[cfg(feature = "metrics")]
        {
            Waiting::on(self.imp.session_waiters(agent))
        }
        #[cfg(not(feature = "metrics"))]
        {
            Waiting {}
        }
    }

    /// A model call waits for a slot of `provider` (its `concurrency`) while the guard
    /// lives.
    #[allow(unused_variables)]
    pub fn provider_waiting(&self, provider: &str) -> Waiting {
        #[cfg(feature = "metrics")]
        {
            Waiting::on(self.imp.provider_queue(provider))
        }
        #[cfg(not(feature = "metrics"))]
        {
            Waiting {}
        }
    }

    /// One attempt to write an audit record took `took`; `failed` when the log could
    /// not be written (a refusal by the audit budget is neither).
    #[allow(unused_variables)]
    fn audit_write(&self, took: Duration, failed: bool) {
        #[cfg(feature = "metrics")]
        self.imp.audit_write(took, failed);
    }

    /// The exposition text (OpenMetrics), with `pending` as the approvals waiting per
    /// agent; `None` without the `metrics` feature.
    #[allow(unused_variables)]
    pub fn render(&self, pending: &[(String, usize)]) -> Option<String> {
        #[cfg(feature = "metrics")]
        {
            Some(self.imp.render(pending))
        }
        #[cfg(not(feature = "metrics"))]
        {
            None
        }
    }

    /// Count one audit record that was written.
    #[allow(unused_variables)]
    fn audited(&self, record: &AuditRecord, known_tools: &HashSet<String>) {
        #[cfg(feature = "metrics")]
        self.imp.audited(record, known_tools);
    }
}

/// One waiter in a gauge (a session's waiters, a provider's queue): counted while it
/// lives.
#[derive(Debug)]
#[must_use = "the waiter is counted only while the guard lives"]
pub struct Waiting {
    #[cfg(feature = "metrics")]
    gauge: prometheus_client::metrics::gauge::Gauge,
}

#[cfg(feature = "metrics")]
impl Waiting {
    fn on(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self { gauge }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        self.gauge.dec();
    }
}

/// An audit sink that counts what its inner sink wrote: every record by type, and each
/// finished tool call by agent, kind, tool and decision, with its duration.
#[derive(Debug)]
pub struct ObservedAudit {
    inner: Arc<dyn AuditSink>,
    metrics: Arc<Metrics>,
    /// Tool names that may become label values; any other is `other`.
    known_tools: HashSet<String>,
}

impl ObservedAudit {
    /// Count what `inner` writes into `metrics`; `known_tools` are the configured tool
    /// names (the core tools are always known).
    pub fn new(
        inner: Arc<dyn AuditSink>,
        metrics: Arc<Metrics>,
        known_tools: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut known: HashSet<String> = known_tools.into_iter().collect();
        for core in ["read", "write", "patch", "exec"] {
            known.insert(core.to_string());
        }
        Self {
            inner,
            metrics,
            known_tools: known,
        }
    }
}

#[async_trait]
impl AuditSink for ObservedAudit {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let started = std::time::Instant::now();
        match self.inner.record(record).await {
            Ok(()) => {
                self.metrics.audit_write(started.elapsed(), false);
                self.metrics.audited(record, &self.known_tools);
                Ok(())
            }
            Err(e @ AuditError::Write { .. }) => {
                self.metrics.audit_write(started.elapsed(), true);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use std::collections::HashSet;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;
    use std::time::Duration;

    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
    use prometheus_client::registry::{Registry, Unit};

    use super::PromptOutcome;
    use crate::audit::{AuditDecision, AuditRecord, AuditType, Phase};

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct PromptLabels {
        agent: String,
        channel: String,
        outcome: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct PromptDurationLabels {
        agent: String,
        outcome: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct ModelLabels {
        provider: String,
        model: String,
        outcome: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct TokenLabels {
        provider: String,
        model: String,
        kind: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct CostLabels {
        agent: String,
        provider: String,
        model: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct ToolLabels {
        agent: String,
        kind: String,
        tool: String,
        decision: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct ToolDurationLabels {
        agent: String,
        kind: String,
        tool: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct TypeLabels {
        r#type: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct AgentLabels {
        agent: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct ProviderLabels {
        provider: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct OpLabels {
        op: String,
        transport: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct EgressLabels {
        agent: String,
        decision: String,
        mode: String,
        rule: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct EgressBytesLabels {
        agent: String,
        direction: String,
    }

    type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

    /// The id prefix of the rule an egress approval adds (`egress::ask::RULE_PREFIX`,
    /// which needs the `egress` feature; a test keeps the two equal).
    pub(super) const APPROVAL_RULE_PREFIX: &str = "approval-";

    /// Operations: 100 µs to about 10 s.
    fn op_histogram() -> Histogram {
        Histogram::new(exponential_buckets(0.0001, 2.0, 18))
    }

    /// Model calls and prompts: 0.1 s to about 600 s.
    fn long_histogram() -> Histogram {
        Histogram::new(exponential_buckets(0.1, 2.0, 14))
    }

    #[derive(Debug)]
    pub(super) struct Families {
        registry: Mutex<Registry>,
        prompts: Family<PromptLabels, Counter>,
        prompt_duration: Histograms<PromptDurationLabels>,
        model_calls: Family<ModelLabels, Counter>,
        model_tokens: Family<TokenLabels, Counter>,
        model_cost: Family<CostLabels, Counter<f64, AtomicU64>>,
        tool_calls: Family<ToolLabels, Counter>,
        tool_duration: Histograms<ToolDurationLabels>,
        audit_records: Family<TypeLabels, Counter>,
        approvals_pending: Family<AgentLabels, Gauge>,
        sandbox_ops: Histograms<OpLabels>,
        egress_requests: Family<EgressLabels, Counter>,
        egress_bytes: Family<EgressBytesLabels, Counter>,
        audit_commit: Histogram,
        audit_failures: Counter,
        session_waiters: Family<AgentLabels, Gauge>,
        provider_queue: Family<ProviderLabels, Gauge>,
        link_up: Family<AgentLabels, Gauge>,
        link_reconnects: Family<AgentLabels, Counter>,
        link_rejected: Family<AgentLabels, Counter>,
        link_ping: Histograms<AgentLabels>,
    }

    impl Default for Families {
        fn default() -> Self {
            let mut registry = Registry::default();
            let prompts = Family::<PromptLabels, Counter>::default();
            registry.register(
                "beige_prompts",
                "Prompts that ended, by agent, channel and outcome",
                prompts.clone(),
            );
            let prompt_duration: Histograms<PromptDurationLabels> =
                Family::new_with_constructor(long_histogram);
            registry.register_with_unit(
                "beige_prompt_duration",
                "Time from a prompt's start to its end",
                Unit::Seconds,
                prompt_duration.clone(),
            );
            let model_calls = Family::<ModelLabels, Counter>::default();
            registry.register(
                "beige_model_calls",
                "Model calls that answered, by provider, model and outcome",
                model_calls.clone(),
            );
            let model_tokens = Family::<TokenLabels, Counter>::default();
            registry.register(
                "beige_model_tokens",
                "Tokens of model calls, by provider, model and kind",
                model_tokens.clone(),
            );
            let model_cost = Family::<CostLabels, Counter<f64, AtomicU64>>::default();
            registry.register(
                "beige_model_cost_usd",
                "US dollars of model calls, priced from the model catalogue",
                model_cost.clone(),
            );
            let tool_calls = Family::<ToolLabels, Counter>::default();
            registry.register(
                "beige_tool_calls",
                "Tool calls that ended, by agent, kind (core, plugin), tool and decision",
                tool_calls.clone(),
            );
            let tool_duration: Histograms<ToolDurationLabels> =
                Family::new_with_constructor(op_histogram);
            registry.register_with_unit(
                "beige_tool_call_duration",
                "Time a tool call took, from its audit record",
                Unit::Seconds,
                tool_duration.clone(),
            );
            let audit_records = Family::<TypeLabels, Counter>::default();
            registry.register(
                "beige_audit_records",
                "Audit records written, by type",
                audit_records.clone(),
            );
            let approvals_pending = Family::<AgentLabels, Gauge>::default();
            registry.register(
                "beige_approvals_pending",
                "Approval requests waiting for a person, by agent",
                approvals_pending.clone(),
            );
            let sandbox_ops: Histograms<OpLabels> = Family::new_with_constructor(op_histogram);
            registry.register_with_unit(
                "beige_sandbox_op_duration",
                "Time a core tool op took in the sandbox, by op and transport",
                Unit::Seconds,
                sandbox_ops.clone(),
            );
            let egress_requests = Family::<EgressLabels, Counter>::default();
            registry.register(
                "beige_egress_requests",
                "Egress connections, by agent, decision (allowed, denied, asked), mode and rule",
                egress_requests.clone(),
            );
            let egress_bytes = Family::<EgressBytesLabels, Counter>::default();
            registry.register(
                "beige_egress_bytes",
                "Bytes carried by finished egress connections, by agent and direction (up, down)",
                egress_bytes.clone(),
            );
            let audit_commit = op_histogram();
            registry.register_with_unit(
                "beige_audit_commit_duration",
                "Time one audit record took to write",
                Unit::Seconds,
                audit_commit.clone(),
            );
            let audit_failures = Counter::default();
            registry.register(
                "beige_audit_write_failures",
                "Audit records that could not be written (their calls were refused)",
                audit_failures.clone(),
            );
            let session_waiters = Family::<AgentLabels, Gauge>::default();
            registry.register(
                "beige_session_waiters",
                "Prompts waiting for their session (another prompt holds it), by agent",
                session_waiters.clone(),
            );
            let provider_queue = Family::<ProviderLabels, Gauge>::default();
            registry.register(
                "beige_provider_queue_depth",
                "Model calls waiting for a slot of their provider (llm.providers.<p>.concurrency)",
                provider_queue.clone(),
            );
            let link_up = Family::<AgentLabels, Gauge>::default();
            registry.register(
                "beige_link_up",
                "Whether the agent's sandbox link to its PID 1 is up (1) or down (0)",
                link_up.clone(),
            );
            let link_reconnects = Family::<AgentLabels, Counter>::default();
            registry.register(
                "beige_link_reconnects",
                "Sandbox links that came up again after the first, by agent",
                link_reconnects.clone(),
            );
            let link_rejected = Family::<AgentLabels, Counter>::default();
            registry.register(
                "beige_link_rejected_peers",
                "Connections to the sandbox control socket refused (not PID 1), by agent",
                link_rejected.clone(),
            );
            let link_ping: Histograms<AgentLabels> = Family::new_with_constructor(op_histogram);
            registry.register_with_unit(
                "beige_link_ping",
                "Round trip of a sandbox link keepalive, by agent",
                Unit::Seconds,
                link_ping.clone(),
            );
            Self {
                registry: Mutex::new(registry),
                prompts,
                prompt_duration,
                model_calls,
                model_tokens,
                model_cost,
                tool_calls,
                tool_duration,
                audit_records,
                approvals_pending,
                sandbox_ops,
                egress_requests,
                egress_bytes,
                audit_commit,
                audit_failures,
                session_waiters,
                provider_queue,
                link_up,
                link_reconnects,
                link_rejected,
                link_ping,
            }
        }
    }

    impl Families {
        pub(super) fn prompt(
            &self,
            agent: &str,
            channel: &str,
            outcome: PromptOutcome,
            took: Duration,
        ) {
            self.prompts
                .get_or_create(&PromptLabels {
                    agent: agent.to_string(),
                    channel: bounded_channel(channel).to_string(),
                    outcome: outcome.as_str().to_string(),
                })
                .inc();
            self.prompt_duration
                .get_or_create(&PromptDurationLabels {
                    agent: agent.to_string(),
                    outcome: outcome.as_str().to_string(),
                })
                .observe(took.as_secs_f64());
        }

        pub(super) fn model_call(
            &self,
            agent: &str,
            model_key: &str,
            usage: &crate::llm::Usage,
            cost_micros: i64,
        ) {
            let (provider, model) = model_key.split_once('/').unwrap_or(("", model_key));
            self.model_calls
                .get_or_create(&ModelLabels {
                    provider: provider.to_string(),
                    model: model.to_string(),
                    outcome: "ok".to_string(),
                })
                .inc();
            for (kind, n) in [
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
                ("cache_read", usage.cache_read_tokens),
                ("cache_write", usage.cache_write_tokens),
            ] {
                self.model_tokens
                    .get_or_create(&TokenLabels {
                        provider: provider.to_string(),
                        model: model.to_string(),
                        kind: kind.to_string(),
                    })
                    .inc_by(n);
            }
            #[allow(clippy::cast_precision_loss)] // micro-dollars far below 2^52
            let usd = cost_micros.max(0) as f64 / 1_000_000.0;
            self.model_cost
                .get_or_create(&CostLabels {
                    agent: agent.to_string(),
                    provider: provider.to_string(),
                    model: model.to_string(),
                })
                .inc_by(usd);
        }

        pub(super) fn sandbox_op(&self, op: &str, transport: &str, took: Duration) {
            let op = match op {
                "read" | "write" | "patch" | "exec" | "spawn" => op,
                _ => "other",
            };
            let transport = match transport {
                "link-unix" | "link-attach" | "docker-exec" | "direct" | "none" => transport,
                _ => "other",
            };
            self.sandbox_ops
                .get_or_create(&OpLabels {
                    op: op.to_string(),
                    transport: transport.to_string(),
                })
                .observe(took.as_secs_f64());
        }

        pub(super) fn link_event(&self, agent: &str, event: crate::sandbox::LinkEvent) {
            use crate::sandbox::LinkEvent;
            let labels = AgentLabels {
                agent: agent.to_string(),
            };
            match event {
                LinkEvent::Up { reconnect } => {
                    self.link_up.get_or_create(&labels).set(1);
                    if reconnect {
                        self.link_reconnects.get_or_create(&labels).inc();
                    }
                }
                LinkEvent::Down => {
                    self.link_up.get_or_create(&labels).set(0);
                }
                LinkEvent::RejectedPeer => {
                    self.link_rejected.get_or_create(&labels).inc();
                }
                LinkEvent::Ping(rtt) => {
                    self.link_ping
                        .get_or_create(&labels)
                        .observe(rtt.as_secs_f64());
                }
            }
        }

        pub(super) fn session_waiters(&self, agent: &str) -> Gauge {
            self.session_waiters
                .get_or_create(&AgentLabels {
                    agent: agent.to_string(),
                })
                .clone()
        }

        pub(super) fn provider_queue(&self, provider: &str) -> Gauge {
            self.provider_queue
                .get_or_create(&ProviderLabels {
                    provider: provider.to_string(),
                })
                .clone()
        }

        pub(super) fn audit_write(&self, took: Duration, failed: bool) {
            self.audit_commit.observe(took.as_secs_f64());
            if failed {
                self.audit_failures.inc();
            }
        }

        /// An `egress.connect` record: a connection counted once, when it started
        /// (allowed) or when it was refused without starting (denied, or asked when it
        /// waits for an approval); its bytes when it finished.
        fn egress(&self, record: &AuditRecord) {
            let Some(egress) = record.egress.as_ref() else {
                return;
            };
            if record.tool != "egress.connect" {
                return;
            }
            let field = |k: &str| egress.get(k).and_then(serde_json::Value::as_str);
            let decision = match (record.phase, record.decision) {
                (Phase::Started, _) => "allowed",
                (Phase::Finished, AuditDecision::Denied) => {
                    if field("reason") == Some("approval_pending") {
                        "asked"
                    } else {
                        "denied"
                    }
                }
                (Phase::Finished, AuditDecision::Allowed) => {
                    for (direction, key) in [("up", "bytesUp"), ("down", "bytesDown")] {
                        let n = egress.get(key).and_then(serde_json::Value::as_u64);
                        self.egress_bytes
                            .get_or_create(&EgressBytesLabels {
                                agent: record.agent.clone(),
                                direction: direction.to_string(),
                            })
                            .inc_by(n.unwrap_or(0));
                    }
                    return;
                }
                _ => return,
            };
            let mode = field("mode")
                .filter(|m| matches!(*m, "tunnel" | "http" | "inspect"))
                .unwrap_or("none");
            // Rule ids come from the config; an approval's rule carries the request id,
            // so every approval counts under one value.
            let rule = match field("rule") {
                Some(r) if r.starts_with(APPROVAL_RULE_PREFIX) => "approval",
                Some(r) => r,
                None => "none",
            };
            self.egress_requests
                .get_or_create(&EgressLabels {
                    agent: record.agent.clone(),
                    decision: decision.to_string(),
                    mode: mode.to_string(),
                    rule: rule.to_string(),
                })
                .inc();
        }

        pub(super) fn audited(&self, record: &AuditRecord, known_tools: &HashSet<String>) {
            let kind = serde_json::to_value(record.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "other".to_string());
            self.audit_records
                .get_or_create(&TypeLabels {
                    r#type: kind.clone(),
                })
                .inc();
            let call_kind = match record.kind {
                AuditType::CoreTool => "core",
                AuditType::Tool => "plugin",
                AuditType::Egress => return self.egress(record),
                _ => return,
            };
            if record.phase != Phase::Finished {
                return;
            }
            // `<plugin>.<sub>` counts under its plugin; a name nobody configured is
            // `other`, so a sandbox cannot mint label values.
            let base = record.tool.split('.').next().unwrap_or_default();
            let tool = if known_tools.contains(base) {
                base
            } else {
                "other"
            };
            let decision = match record.decision {
                AuditDecision::Allowed => "allowed",
                AuditDecision::Denied => "denied",
            };
            self.tool_calls
                .get_or_create(&ToolLabels {
                    agent: record.agent.clone(),
                    kind: call_kind.to_string(),
                    tool: tool.to_string(),
                    decision: decision.to_string(),
                })
                .inc();
            if let Some(ms) = record.duration_ms {
                #[allow(clippy::cast_precision_loss)] // milliseconds far below 2^52
                self.tool_duration
                    .get_or_create(&ToolDurationLabels {
                        agent: record.agent.clone(),
                        kind: call_kind.to_string(),
                        tool: tool.to_string(),
                    })
                    .observe(ms as f64 / 1000.0);
            }
        }

        pub(super) fn render(&self, pending: &[(String, usize)]) -> String {
            self.approvals_pending.clear();
            for (agent, n) in pending {
                self.approvals_pending
                    .get_or_create(&AgentLabels {
                        agent: agent.clone(),
                    })
                    .set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
            let mut out = String::new();
            let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
            // Writing into a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
            out
        }
    }

    /// A channel name as a label: the built-in ones as they are, anything else `other`
    /// (a plugin channel's name is configured, but a session key's prefix is not).
    fn bounded_channel(channel: &str) -> &str {
        match channel {
            "tui" | "http" | "api" | "telegram" | "cli" | "schedule" | "spawn" | "socket" => {
                channel
            }
            _ => "other",
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;
    use crate::audit::AuditDecision;

    /// The value of the sample written exactly as `series` (name and labels).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[derive(Debug)]
    struct Broken;

    #[async_trait]
    impl AuditSink for Broken {
        async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
            if record.tool == "throttled" {
                return Err(AuditError::Throttled {
                    agent: record.agent.clone(),
                    budget: 1,
                    retry_secs: 1,
                });
            }
            Err(AuditError::Write {
                path: "/nowhere/audit.jsonl".into(),
                source: std::io::Error::other("disk full"),
            })
        }
    }

    #[derive(Debug)]
    struct Written;

    #[async_trait]
    impl AuditSink for Written {
        async fn record(&self, _: &AuditRecord) -> Result<(), AuditError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_failed_audit_write_is_counted_and_a_throttled_record_is_not() {
        let metrics = Arc::new(Metrics::new());
        let audit = ObservedAudit::new(Arc::new(Broken), metrics.clone(), []);
        for tool in ["exec", "exec", "throttled"] {
            let record = AuditRecord::security("a", tool, vec![], AuditDecision::Allowed);
            assert!(audit.record(&record).await.is_err());
        }
        let text = metrics.render(&[]).unwrap_or_default();
        assert_eq!(
            sample(&text, "beige_audit_write_failures_total"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "beige_audit_commit_duration_seconds_count"),
            Some(2.0),
            "{text}"
        );
        assert!(!text.contains("beige_audit_records_total{"), "{text}");
    }

    #[test]
    fn waiters_are_counted_while_their_guards_live() {
        let metrics = Metrics::new();
        let first = metrics.session_waiting("a");
        let second = metrics.session_waiting("a");
        let queued = metrics.provider_waiting("anthropic");
        let text = metrics.render(&[]).unwrap_or_default();
        assert_eq!(
            sample(&text, r#"beige_session_waiters{agent="a"}"#),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"beige_provider_queue_depth{provider="anthropic"}"#),
            Some(1.0),
            "{text}"
        );
        drop((first, second, queued));
        let text = metrics.render(&[]).unwrap_or_default();
        assert_eq!(
            sample(&text, r#"beige_session_waiters{agent="a"}"#),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"beige_provider_queue_depth{provider="anthropic"}"#),
            Some(0.0),
            "{text}"
        );
    }

    #[test]
    fn link_events_set_the_gauge_and_count_reconnects() {
        use crate::sandbox::LinkEvent;
        let metrics = Metrics::new();
        metrics.link_event("a", LinkEvent::Up { reconnect: false });
        metrics.link_event("a", LinkEvent::Down);
        metrics.link_event("a", LinkEvent::Up { reconnect: true });
        metrics.link_event("a", LinkEvent::RejectedPeer);
        metrics.link_event("a", LinkEvent::Ping(Duration::from_micros(300)));
        metrics.link_event("b", LinkEvent::Up { reconnect: false });
        metrics.link_event("b", LinkEvent::Down);
        let text = metrics.render(&[]).unwrap_or_default();
        assert_eq!(
            sample(&text, r#"beige_link_up{agent="a"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"beige_link_up{agent="b"}"#),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"beige_link_reconnects_total{agent="a"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"beige_link_reconnects_total{agent="b"}"#),
            None
        );
        assert_eq!(
            sample(&text, r#"beige_link_rejected_peers_total{agent="a"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"beige_link_ping_seconds_count{agent="a"}"#),
            Some(1.0),
            "{text}"
        );
    }

    #[test]
    fn sandbox_ops_keep_to_known_label_values() {
        let metrics = Metrics::new();
        metrics.sandbox_op("exec", "link-unix", Duration::from_millis(3));
        metrics.sandbox_op("exec", "link-unix", Duration::from_millis(5));
        metrics.sandbox_op("/etc/passwd", "made-up", Duration::from_millis(1));
        let text = metrics.render(&[]).unwrap_or_default();
        assert_eq!(
            sample(
                &text,
                r#"beige_sandbox_op_duration_seconds_count{op="exec",transport="link-unix"}"#
            ),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                r#"beige_sandbox_op_duration_seconds_count{op="other",transport="other"}"#
            ),
            Some(1.0),
            "{text}"
        );
    }

    /// Egress is counted from the records the egress engine's connections become
    /// (`gateway::egress::audit_record`): one count per connection, bytes when it ends.
    #[cfg(feature = "egress")]
    #[tokio::test]
    async fn egress_connections_are_counted_from_their_records() {
        use crate::egress::engine::{ConnectionPhase, ConnectionRecord, Mode};
        use crate::egress::rules::DenyReason;
        use crate::gateway::egress::audit_record;

        assert_eq!(imp::APPROVAL_RULE_PREFIX, crate::egress::ask::RULE_PREFIX);
        let connection = |phase, mode, rule: Option<&str>, reason, up, down| ConnectionRecord {
            id: "c".into(),
            agent: "a".into(),
            entry: beige_protocol::link::EgressEntry::Explicit,
            host: "secret-host.example".into(),
            port: 443,
            ip: None,
            mode,
            rule: rule.map(str::to_string),
            policy_version: 1,
            bytes_up: up,
            bytes_down: down,
            phase,
            reason,
            approval: None,
            error: None,
            duration: None,
        };
        let metrics = Arc::new(Metrics::new());
        let audit = ObservedAudit::new(Arc::new(Written), metrics.clone(), []);
        let (started, finished) = (ConnectionPhase::Started, ConnectionPhase::Finished);
        let records = [
            // Two tunnelled connections under rule `api`, 10/100 and 5/50 bytes.
            connection(started, Some(Mode::Tunnel), Some("api"), None, 0, 0),
            connection(finished, Some(Mode::Tunnel), Some("api"), None, 10, 100),
            connection(started, Some(Mode::Tunnel), Some("api"), None, 0, 0),
            connection(finished, Some(Mode::Tunnel), Some("api"), None, 5, 50),
            // One inspected under an approval's rule.
            connection(
                started,
                Some(Mode::Inspect),
                Some("approval-apr_1"),
                None,
                0,
                0,
            ),
            connection(
                finished,
                Some(Mode::Inspect),
                Some("approval-apr_1"),
                None,
                1,
                2,
            ),
            // Refused: no rule; waiting for an approval.
            connection(finished, None, None, Some(DenyReason::NoRule), 0, 0),
            connection(
                finished,
                None,
                None,
                Some(DenyReason::ApprovalPending),
                0,
                0,
            ),
        ];
        for r in &records {
            audit.record(&audit_record(r)).await.unwrap();
        }
        let text = metrics.render(&[]).unwrap_or_default();
        let requests = |labels: &str| {
            sample(
                &text,
                &format!("beige_egress_requests_total{{agent=\"a\",{labels}}}"),
            )
        };
        assert_eq!(
            requests(r#"decision="allowed",mode="tunnel",rule="api""#),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            requests(r#"decision="allowed",mode="inspect",rule="approval""#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            requests(r#"decision="denied",mode="none",rule="none""#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            requests(r#"decision="asked",mode="none",rule="none""#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                r#"beige_egress_bytes_total{agent="a",direction="up"}"#
            ),
            Some(16.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                r#"beige_egress_bytes_total{agent="a",direction="down"}"#
            ),
            Some(152.0),
            "{text}"
        );
        assert!(
            !text.contains("secret-host") && !text.contains("apr_1"),
            "{text}"
        );
    }
}
