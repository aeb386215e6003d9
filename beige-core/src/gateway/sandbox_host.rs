//! The gateway as the sandbox backend sees it ([`SandboxHost`]): plugin tool calls from
//! inside a sandbox take the guarded path with the agent the backend's transport
//! belongs to (principal `Sandbox`); refused requests and the sandbox layer's events
//! become audit records. Holds the gateway without keeping it alive.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use beige_protocol::op::OpReply;
use beige_protocol::socket::{ToolRequest, ToolResponse};

use super::{CallMeta, Inner, UNPARSED_TOOL};
use crate::audit::{now_ts, AuditDecision, AuditRecord, AuditType, Phase, Target};
use crate::ident::{Attribution, ExecRegistry};
use crate::policy::{Principal, ToolKind};
use crate::sandbox::{SandboxHost, SecurityEvent};

/// Routes a backend's calls to the gateway.
pub(super) struct GatewayHost(Weak<Inner>);

impl GatewayHost {
    pub(super) fn new(inner: &Arc<Inner>) -> Self {
        Self(Arc::downgrade(inner))
    }
}

#[async_trait]
impl SandboxHost for GatewayHost {
    async fn tool_call(
        &self,
        agent: &str,
        caller: &Attribution,
        request: ToolRequest,
    ) -> ToolResponse {
        match self.0.upgrade() {
            Some(inner) => inner.handle_tool_request(agent, caller, request).await,
            None => ToolResponse::error("the gateway is shutting down", 1),
        }
    }

    fn exec_registry(&self) -> Option<Arc<ExecRegistry>> {
        self.0.upgrade().map(|inner| inner.execs.clone())
    }

    /// Every refused request is recorded, attributed to the endpoint's agent: with the
    /// tool when it was readable, and the request line itself as the one argument (the
    /// audit keeps an excerpt, its size and hash).
    async fn rejected(&self, agent: &str, tool: Option<&str>, error: &str, raw: &[u8]) {
        let Some(inner) = self.0.upgrade() else {
            tracing::warn!(agent, error, "rejected socket request");
            return;
        };
        let meta = CallMeta {
            agent,
            tool: tool.unwrap_or(UNPARSED_TOOL),
            kind: ToolKind::Plugin,
            args: vec![String::from_utf8_lossy(raw).into_owned()],
            session: Some(format!("socket:{agent}")),
            channel: Some("socket".into()),
            via: None,
            model: None,
            principal: Principal::Sandbox,
            target: Target::Gateway,
            unattended: None,
            cwd: None,
            stdin_sha256: None,
            exec: None,
            attribution: None,
        };
        inner.audit_denied(&meta, error).await;
    }

    async fn security_event(&self, event: SecurityEvent) {
        let Some(inner) = self.0.upgrade() else {
            tracing::warn!(?event, "a sandbox event after the gateway stopped");
            return;
        };
        let record = record_of(&event);
        if let Err(e) = inner.audit.record(&record).await {
            tracing::error!(agent = %record.agent, tool = %record.tool, error = %e, "could not audit a sandbox event");
        }
    }

    /// An egress stream: decided with the agent's rules and carried (or refused) by the
    /// gateway's egress engine; refused when no agent has egress.
    #[cfg(feature = "egress")]
    async fn egress(&self, agent: &str, stream: crate::sandbox::EgressStream) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        match &inner.egress {
            Some(egress) => egress.serve(agent, stream, &inner).await,
            None => {
                super::egress::GatewayEgress::refuse_all(agent, stream, inner.audit.as_ref()).await
            }
        }
    }

    fn link_event(&self, agent: &str, event: crate::sandbox::LinkEvent) {
        if let Some(inner) = self.0.upgrade() {
            inner.metrics.link_event(agent, event);
        }
    }
}

/// The audit record of a sandbox event.
fn record_of(event: &SecurityEvent) -> AuditRecord {
    match event {
        SecurityEvent::LinkRejected {
            agent,
            pid,
            uid,
            reason,
        } => {
            let show = |v: &Option<u32>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
            let mut r = AuditRecord::security(
                agent,
                "security.link_reject",
                vec![format!("pid={}", show(pid)), format!("uid={}", show(uid))],
                AuditDecision::Denied,
            );
            r.error = Some(reason.clone());
            r
        }
        SecurityEvent::ToolEndpointLimit {
            agent,
            limit,
            message,
        } => {
            let mut r = AuditRecord::security(
                agent,
                "security.socket_limit",
                vec![format!("limit={limit}")],
                AuditDecision::Denied,
            );
            r.session = Some(format!("socket:{agent}"));
            r.channel = Some("socket".into());
            r.error = Some(message.clone());
            r
        }
        SecurityEvent::OpRecovered {
            agent,
            op_id,
            reply,
        } => {
            let (tool, exit_code, output_bytes, duration_ms, error) = match reply {
                Some(OpReply::Exec(e)) => (
                    "exec",
                    e.exit_code.or(e.signal.map(|s| 128 + s)),
                    Some((e.stdout.len() + e.stderr.len()) as u64),
                    Some(e.duration_ms),
                    e.timed_out.then(|| "timed out".to_string()),
                ),
                Some(OpReply::Read(_)) => ("read", Some(0), None, None, None),
                Some(OpReply::Write(_)) => ("write", Some(0), None, None, None),
                Some(OpReply::Patch(_)) => ("patch", Some(0), None, None, None),
                Some(OpReply::Kill(_)) => ("kill", Some(0), None, None, None),
                Some(OpReply::Error(e)) => ("op", Some(1), None, None, Some(e.message.clone())),
                None => ("op", None, None, None, Some("unreadable reply".to_string())),
            };
            AuditRecord {
                trace_id: None,
                span_id: None,
                ts: now_ts(),
                agent: agent.clone(),
                session: None,
                model: None,
                channel: None,
                principal: None,
                via: None,
                phase: Phase::Finished,
                kind: AuditType::CoreTool,
                tool: tool.to_string(),
                args: vec!["recovered-after-restart".to_string(), op_id.clone()],
                decision: AuditDecision::Allowed,
                target: Some(Target::Sandbox),
                duration_ms,
                exit_code,
                output_bytes,
                error,
                args_bytes: None,
                args_sha256: None,
                args_truncated: None,
                egress: None,
                approval: None,
                spawn: None,
                parent_session: None,
                exec: None,
                attribution: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_link_peer_is_a_denied_security_record() {
        let r = record_of(&SecurityEvent::LinkRejected {
            agent: "a".into(),
            pid: Some(42),
            uid: None,
            reason: "the peer is not the container's PID 1".into(),
        });
        assert_eq!(r.tool, "security.link_reject");
        assert_eq!(r.kind, AuditType::Security);
        assert_eq!(r.decision, AuditDecision::Denied);
        assert_eq!(r.phase, Phase::Finished);
        assert_eq!(r.target, Some(Target::Gateway));
        assert_eq!(r.args, ["pid=42", "uid=?"]);
        assert_eq!(
            r.error.as_deref(),
            Some("the peer is not the container's PID 1")
        );
    }

    #[test]
    fn a_socket_bound_is_recorded_in_the_socket_session() {
        let r = record_of(&SecurityEvent::ToolEndpointLimit {
            agent: "a".into(),
            limit: "connections".into(),
            message: "too many".into(),
        });
        assert_eq!(r.tool, "security.socket_limit");
        assert_eq!(r.args, ["limit=connections"]);
        assert_eq!(r.session.as_deref(), Some("socket:a"));
        assert_eq!(r.channel.as_deref(), Some("socket"));
        assert_eq!(r.error.as_deref(), Some("too many"));
    }

    #[test]
    fn a_recovered_result_is_the_finished_record_of_its_op() {
        let reply = serde_json::from_value(serde_json::json!({
            "result": "exec", "exitCode": null, "signal": 9, "stdout": "ab", "stderr": "c",
            "timedOut": true, "durationMs": 7
        }))
        .unwrap();
        let r = record_of(&SecurityEvent::OpRecovered {
            agent: "a".into(),
            op_id: "g1-2".into(),
            reply: Some(reply),
        });
        assert_eq!(
            (r.tool.as_str(), r.kind, r.decision),
            ("exec", AuditType::CoreTool, AuditDecision::Allowed)
        );
        assert_eq!(r.args, ["recovered-after-restart", "g1-2"]);
        assert_eq!(r.target, Some(Target::Sandbox));
        assert_eq!(
            (r.exit_code, r.output_bytes, r.duration_ms),
            (Some(137), Some(3), Some(7))
        );
        assert_eq!(r.error.as_deref(), Some("timed out"));
        let unreadable = record_of(&SecurityEvent::OpRecovered {
            agent: "a".into(),
            op_id: "x".into(),
            reply: None,
        });
        assert_eq!(
            (unreadable.tool.as_str(), unreadable.exit_code),
            ("op", None)
        );
    }
}
