//! The gateway as the platform tools see it ([`crate::platform::Host`]): the
//! operations `schedule`, `spawn` and `sessions` run through the gateway itself.

use super::Inner;
use crate::config::Config;
use crate::plugin::ToolError;
use crate::store::{SessionRecord, StoreError, StoredMessage};

/// A store failure as the platform tool's error, naming what was read.
fn store_failed(what: &str, e: StoreError) -> ToolError {
    ToolError::Failed(format!("reading {what} from the store failed: {e}"))
}

/// Whether `s` has the shape of a session id (`s_` and 16 hex digits).
fn looks_like_session_id(s: &str) -> bool {
    s.strip_prefix("s_")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[async_trait::async_trait]
impl crate::platform::Host for Inner {
    fn config(&self) -> &Config {
        &self.config
    }

    async fn spawn(
        &self,
        request: crate::platform::spawn::SpawnRequest,
    ) -> Result<crate::platform::spawn::SpawnReport, ToolError> {
        self.run_spawn(request).await
    }

    async fn spawn_info(
        &self,
        agent: &str,
        exec: Option<&str>,
        config: &crate::platform::spawn::SpawnConfig,
    ) -> Result<crate::plugin::ToolResult, ToolError> {
        self.spawn_info_text(agent, exec, config).await
    }

    async fn agent_sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, ToolError> {
        let mut sessions = self
            .store
            .list_sessions(agent)
            .await
            .map_err(|e| store_failed("the sessions", e))?;
        // The store answers by agent already; a record of another agent never passes.
        sessions.retain(|s| s.agent == agent);
        Ok(sessions)
    }

    async fn agent_session(
        &self,
        agent: &str,
        key_or_id: &str,
    ) -> Result<Option<SessionRecord>, ToolError> {
        let own = |r: Option<SessionRecord>| r.filter(|s| s.agent == agent);
        if looks_like_session_id(key_or_id) {
            let by_id = self
                .store
                .get_session(key_or_id)
                .await
                .map_err(|e| store_failed("a session", e))?;
            if let Some(record) = own(by_id) {
                return Ok(Some(record));
            }
        }
        let current = self
            .store
            .current_session(key_or_id)
            .await
            .map_err(|e| store_failed("a session", e))?;
        if let Some(record) = own(current) {
            return Ok(Some(record));
        }
        // A key whose current session is another agent's may still have older ones of
        // this agent.
        Ok(self
            .agent_sessions(agent)
            .await?
            .into_iter()
            .find(|s| s.key == key_or_id))
    }

    async fn agent_session_messages(
        &self,
        agent: &str,
        id: &str,
        include_compacted: bool,
    ) -> Result<Option<Vec<StoredMessage>>, ToolError> {
        let record = self
            .store
            .get_session(id)
            .await
            .map_err(|e| store_failed("a session", e))?;
        if record.is_none_or(|s| s.agent != agent) {
            return Ok(None);
        }
        self.store
            .messages(id, include_compacted)
            .await
            .map(Some)
            .map_err(|e| store_failed("a session's messages", e))
    }
}
