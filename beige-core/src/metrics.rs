//! Prometheus metrics of one gateway (observability.md §2): prompts, model calls and
//! their tokens and cost, tool calls by kind and decision, audit records by type, and
//! approvals pending.
//!
//! Owns one registry per gateway (no global state: two gateways in one process stay
//! apart), the metric families and their bounded label sets, and the text a scrape
//! returns. Labels are only ever agent, channel, provider, model, configured tool names
//! and fixed words: a tool name a sandbox made up is counted as `other`, and nothing
//! carries a session, user, chat, host or path. Tool calls are counted from the audit
//! records (the authority on what ran and how it was decided) through
//! [`ObservedAudit`], so every path that audits is counted. Without the `metrics`
//! feature every method is a no-op and [`Metrics::render`] is `None`.

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
        self.inner.record(record).await?;
        self.metrics.audited(record, &self.known_tools);
        Ok(())
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

    type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

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
