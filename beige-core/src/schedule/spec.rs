//! Checking a [`ScheduleSpec`] against the config it runs under: the one set of rules the
//! config's `schedules` and the management API (`add_schedule`) share. A problem comes
//! back as the field it is about (relative to the schedule) and a message that names the
//! value, what is wrong and what to write instead.

use crate::config::Config;
use beige_client::schedules::{OnInterrupted, ScheduleSpec};

use super::cron::{parse_at, CronSpec};

/// One problem with a schedule: the field (`cron`, `tools`, …) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// The field, relative to the schedule (`""` for the schedule as a whole).
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

fn problem(field: &str, message: impl Into<String>) -> SpecProblem {
    SpecProblem {
        field: field.to_string(),
        message: message.into(),
    }
}

/// Whether `id` may name a config schedule: 1–64 of `A-Z a-z 0-9 _ - .`, not starting
/// with `sch_` (the prefix of generated ids).
pub fn is_valid_schedule_key(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with("sch_")
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The first problem of `spec` under `config`, if any.
pub fn check_spec(config: &Config, spec: &ScheduleSpec) -> Result<(), SpecProblem> {
    let Some(agent) = config.agents.get(&spec.agent) else {
        let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
        return Err(problem(
            "agent",
            format!(
                "unknown agent '{}'; configured agents: {}",
                spec.agent,
                known.join(", ")
            ),
        ));
    };
    match (&spec.cron, &spec.at) {
        (Some(_), Some(_)) => {
            return Err(problem(
                "at",
                "a schedule has either cron (repeating) or at (once), not both; remove one",
            ))
        }
        (None, None) => {
            return Err(problem(
                "cron",
                "a schedule needs cron (such as '0 8 * * 1-5') or at (such as '2026-12-24T18:00:00+01:00')",
            ))
        }
        (Some(cron), None) => {
            CronSpec::parse(cron, spec.tz.as_deref()).map_err(|e| {
                let field = if matches!(e, super::cron::TimeError::Zone { .. }) {
                    "tz"
                } else {
                    "cron"
                };
                problem(field, e.to_string())
            })?;
        }
        (None, Some(at)) => {
            parse_at(at).map_err(|e| problem("at", e.to_string()))?;
            if spec.tz.is_some() {
                return Err(problem(
                    "tz",
                    "tz applies to cron only; an at instant carries its own offset — remove tz",
                ));
            }
        }
    }
    match (&spec.prompt, &spec.exec) {
        (Some(_), Some(_)) => {
            return Err(problem(
                "exec",
                "a schedule runs either a prompt or an exec, not both; remove one",
            ))
        }
        (None, None) => {
            return Err(problem(
                "prompt",
                "a schedule needs a prompt (a message to the agent) or an exec (a command in its sandbox)",
            ))
        }
        (Some(p), None) if p.trim().is_empty() => {
            return Err(problem("prompt", "the prompt is empty; write the message to send"))
        }
        (None, Some(e)) if e.trim().is_empty() => {
            return Err(problem("exec", "the exec command is empty; write the command to run"))
        }
        _ => {}
    }
    if let Some(name) = spec.named_session() {
        let ok = name.len() <= 64
            && !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok {
            return Err(problem(
                "session",
                format!("session '{name}' is not valid; write \"new\" or a name of 1-64 letters, digits, '_', '-' or '.'"),
            ));
        }
    }
    if let Some(beige_client::schedules::Deliver::Chat(chat)) = &spec.deliver {
        if chat.channel != "telegram" {
            return Err(problem(
                "deliver.channel",
                format!(
                    "channel '{}' cannot deliver schedule results; use \"telegram\" with a chatId, or deliver: \"events\"",
                    chat.channel
                ),
            ));
        }
        if chat.chat_id.trim().parse::<i64>().is_err() {
            return Err(problem(
                "deliver.chatId",
                format!(
                    "chatId '{}' is not a Telegram chat id (a number such as \"123456789\")",
                    chat.chat_id
                ),
            ));
        }
    }
    if spec.missed.is_some() && spec.catch_up.is_some() {
        return Err(problem(
            "catchUp",
            "missed and catchUp say the same thing; keep one (missed: \"run-once\" | \"skip\")",
        ));
    }
    if let Some(budget) = &spec.budget {
        if let Some(c) = budget.cost_usd {
            if !c.is_finite() || c < 0.0 {
                return Err(problem(
                    "budget.costUsd",
                    format!("costUsd must be a number of US dollars, 0 or more (got {c})"),
                ));
            }
        }
        if budget.wall_seconds == Some(0) {
            return Err(problem(
                "budget.wallSeconds",
                "wallSeconds must be 1 or more (seconds one run may take)",
            ));
        }
    }
    if let Some(tools) = &spec.tools {
        for (i, t) in tools.iter().enumerate() {
            if !agent.tools.iter().any(|a| a == t) {
                return Err(problem(
                    &format!("tools[{i}]"),
                    format!(
                        "tool '{t}' is not one of agent '{}''s tools ({}); a schedule can only narrow its agent's rights — remove it, or add it to agents.{}.tools",
                        spec.agent,
                        if agent.tools.is_empty() {
                            "none".to_string()
                        } else {
                            agent.tools.join(", ")
                        },
                        spec.agent
                    ),
                ));
            }
        }
    }
    if spec.on_interrupted == Some(OnInterrupted::Rerun) && spec.exec.is_none() {
        return Err(problem(
            "onInterrupted",
            "onInterrupted: \"rerun\" is for exec schedules only (a prompt may have had effects); remove it",
        ));
    }
    Ok(())
}
