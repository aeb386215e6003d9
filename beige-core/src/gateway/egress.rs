//! The gateway's side of egress: each agent's [`RuleSet`] compiled from config at
//! start-up (and again by a reload), the one [`EgressEngine`] with the resolver and
//! dialer the builder was given (hickory and TCP by default), and the audit records of
//! every connection in the gateway's audit log (`type: egress`, `tool:
//! egress.connect`). An agent without an `egress` block has no rules: every stream its
//! sandbox opens is refused.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use crate::audit::{now_ts, AuditDecision, AuditRecord, AuditSink, AuditType, Phase};
use crate::config::{Config, ConfigError};
use crate::egress::engine::{
    ConnectionPhase, ConnectionRecord, EgressAudit, EgressEngine, DEFAULT_MAX_STREAMS,
};
use crate::egress::rules::RuleSet;
use crate::egress::upstream::{Dialer, HickoryResolver, Resolver, TcpDialer};
use crate::sandbox::EgressStream;

/// One agent's egress: its rules (the snapshot new streams get) and its stream limit.
#[derive(Debug)]
struct AgentEgress {
    rules: Arc<RuleSet>,
    max_streams: usize,
}

/// Egress for every agent of one engine.
#[derive(Debug)]
pub(crate) struct GatewayEgress {
    engine: EgressEngine,
    agents: HashMap<String, AgentEgress>,
}

impl GatewayEgress {
    /// The agents' rules from `config`; `None` when no agent has egress. The resolver
    /// and dialer default to the host's DNS and TCP.
    pub(crate) fn from_config(
        config: &Config,
        file: &Path,
        resolver: Option<Arc<dyn Resolver>>,
        dialer: Option<Arc<dyn Dialer>>,
        version: u64,
    ) -> Result<Option<Self>, ConfigError> {
        let invalid = |path: String, message: String| ConfigError::Invalid {
            file: file.to_path_buf(),
            path,
            message,
        };
        let mut agents = HashMap::new();
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
            agents.insert(
                name.clone(),
                AgentEgress {
                    rules: Arc::new(rules),
                    max_streams,
                },
            );
        }
        if agents.is_empty() {
            return Ok(None);
        }
        let resolver = match resolver {
            Some(r) => r,
            None => Arc::new(
                HickoryResolver::system().map_err(|e| invalid("egress".into(), e.to_string()))?,
            ),
        };
        let dialer = dialer.unwrap_or_else(|| Arc::new(TcpDialer));
        Ok(Some(Self {
            engine: EgressEngine::new(resolver, dialer),
            agents,
        }))
    }

    /// Refuse a stream when no agent has egress (a sandbox that should not have a
    /// proxy at all): no rules, so every stream gets `no_rule`, recorded.
    pub(crate) async fn refuse_all(agent: &str, stream: EgressStream, audit: &dyn AuditSink) {
        let engine = EgressEngine::new(Arc::new(NoResolver), Arc::new(TcpDialer));
        let rules = Arc::new(RuleSet::new(Vec::new(), 0));
        engine
            .serve(agent, rules, DEFAULT_MAX_STREAMS, stream, &Recorder(audit))
            .await;
    }

    /// Serve one stream of `agent`'s sandbox to its end.
    pub(crate) async fn serve(&self, agent: &str, stream: EgressStream, audit: &dyn AuditSink) {
        let recorder = Recorder(audit);
        let (rules, max) = match self.agents.get(agent) {
            Some(a) => (a.rules.clone(), a.max_streams),
            // No egress block: no rule allows anything.
            None => (Arc::new(RuleSet::new(Vec::new(), 0)), DEFAULT_MAX_STREAMS),
        };
        self.engine
            .serve(agent, rules, max, stream, &recorder)
            .await;
    }
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

/// Writes the engine's connection records to the gateway's audit log.
struct Recorder<'a>(&'a dyn AuditSink);

#[async_trait]
impl EgressAudit for Recorder<'_> {
    async fn record(&self, record: &ConnectionRecord) -> Result<(), String> {
        self.0
            .record(&audit_record(record))
            .await
            .map_err(|e| e.to_string())
    }
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
