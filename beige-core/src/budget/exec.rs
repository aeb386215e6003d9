//! [`ExecBudgets`]: plugin tool calls counted per running `exec`, against
//! `budgets.exec.toolCalls`. An exec is counted from [`ExecBudgets::begin`] until its
//! [`ExecGuard`] drops (the exec ended); its count dies with it.
//!
//! The counter does not care where a call's exec id comes from: today the tool client's
//! advisory `execId` (`BEIGE_EXEC_ID`), later the kernel's attribution. A call naming no
//! exec, or one that is not running, is not counted here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{BudgetExhausted, BudgetKey, Scope};

/// Tool calls per running exec, and each agent's limit.
#[derive(Debug, Clone, Default)]
pub struct ExecBudgets {
    limits: Arc<HashMap<String, u64>>,
    running: Arc<Mutex<HashMap<(String, String), u64>>>,
}

/// Counts one exec while it lives; dropping it forgets the exec.
#[derive(Debug)]
#[must_use = "the exec is forgotten when the guard drops"]
pub struct ExecGuard {
    budgets: ExecBudgets,
    key: (String, String),
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        self.budgets
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

impl ExecBudgets {
    /// Counters with `budgets.exec.toolCalls` per agent (agents without one are not
    /// limited).
    pub fn new(limits: impl IntoIterator<Item = (String, u64)>) -> Self {
        Self {
            limits: Arc::new(limits.into_iter().collect()),
            running: Arc::default(),
        }
    }

    /// The limits of every agent of `config`.
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self::new(config.agents.keys().filter_map(|a| {
            super::Limits::for_agent(config, a)
                .exec_tool_calls
                .map(|n| (a.clone(), n))
        }))
    }

    /// Start counting exec `exec_id` of `agent`, until the guard drops.
    pub fn begin(&self, agent: &str, exec_id: &str) -> ExecGuard {
        let key = (agent.to_string(), exec_id.to_string());
        if self.limits.contains_key(agent) {
            self.running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), 0);
        }
        ExecGuard {
            budgets: self.clone(),
            key,
        }
    }

    /// Count one tool call of `agent` from exec `exec_id`; refused once the exec has made
    /// as many calls as its limit (the error's `used` equals the limit on the first
    /// refusal and grows after it).
    pub fn note_call(&self, agent: &str, exec_id: Option<&str>) -> Result<(), BudgetExhausted> {
        let (Some(limit), Some(id)) = (self.limits.get(agent), exec_id) else {
            return Ok(());
        };
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = running.get_mut(&(agent.to_string(), id.to_string())) else {
            return Ok(());
        };
        // Refused calls are counted too: `used` is the calls made before this one, so the
        // first refusal has `used == limit`.
        let used = *count;
        *count += 1;
        if used >= *limit {
            return Err(BudgetExhausted {
                agent: agent.to_string(),
                scope: Scope::Exec,
                key: BudgetKey::ToolCalls,
                limit: *limit as f64,
                used: used as f64,
            });
        }
        Ok(())
    }

    /// Execs being counted now (for tests and diagnostics).
    pub fn running(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_over_the_limit_is_refused_and_the_count_dies_with_the_exec() {
        let b = ExecBudgets::new([("a".to_string(), 3)]);
        let guard = b.begin("a", "x1");
        for _ in 0..3 {
            b.note_call("a", Some("x1")).unwrap();
        }
        let e = b.note_call("a", Some("x1")).unwrap_err();
        assert_eq!((e.limit, e.used, e.scope), (3.0, 3.0, Scope::Exec));
        let again = b.note_call("a", Some("x1")).unwrap_err();
        assert_eq!(again.used, 4.0, "refusals go on being counted");
        // Another exec has its own count; an unknown one is not counted.
        let other = b.begin("a", "x2");
        b.note_call("a", Some("x2")).unwrap();
        b.note_call("a", Some("gone")).unwrap();
        assert_eq!(b.running(), 2);
        drop(guard);
        drop(other);
        assert_eq!(b.running(), 0);
        b.note_call("a", Some("x1")).unwrap();
        // Agents without a limit are never refused nor tracked.
        let _g = b.begin("free", "x3");
        assert_eq!(b.running(), 0);
        b.note_call("free", Some("x3")).unwrap();
    }
}
