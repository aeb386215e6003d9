//! [`MemoryAudit`]: an audit sink that keeps every record in memory, for tests and
//! examples that want to read back what the gateway recorded.

use std::sync::Mutex;

use async_trait::async_trait;

use crate::audit::{AuditError, AuditRecord, AuditSink};

/// Keeps every [`AuditRecord`] it is given, in order. Give it to
/// `GatewayBuilder::audit`; the gateway still bounds and redacts records before they
/// arrive here, as it does for the JSONL log.
#[derive(Debug, Default)]
pub struct MemoryAudit {
    records: Mutex<Vec<AuditRecord>>,
}

impl MemoryAudit {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every record so far, oldest first.
    pub fn records(&self) -> Vec<AuditRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[async_trait]
impl AuditSink for MemoryAudit {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_records_in_order() {
        let audit = MemoryAudit::new();
        assert!(audit.records().is_empty());
        let record = |tool: &str| -> AuditRecord {
            serde_json::from_value(serde_json::json!({
                "ts": "2026-12-02T01:00:00.000+00:00", "agent": "a", "phase": "started",
                "type": "core_tool", "tool": tool, "args": [], "decision": "allowed",
            }))
            .unwrap()
        };
        let (first, second) = (record("exec"), record("read"));
        audit.record(&first).await.unwrap();
        audit.record(&second).await.unwrap();
        let tools: Vec<String> = audit.records().into_iter().map(|r| r.tool).collect();
        assert_eq!(tools, ["exec", "read"]);
    }
}
