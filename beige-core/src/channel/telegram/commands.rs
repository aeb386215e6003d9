//! Bot commands, registered with `setMyCommands` at start: `/start`, `/help`, `/new`,
//! `/status`, `/verbose on|off` (`/v`), `/streaming on|off` (`/s`), `/model
//! [provider/model]`, `/stop`, plus `/compact` (explains that compaction is automatic).
//!
//! Commands run in their own task as soon as they arrive — `/stop` never waits behind
//! the prompt it stops. Their answers go through the outbox like every reply. Settings
//! (`verbose`, `streaming`, the model override) live in the gateway's per-key settings;
//! a model can only be switched to one the agent allows (the gateway checks).

use std::sync::Arc;

use super::api::BotCommand;
use super::format::{escape_html, Chunk};
use super::outbox::OutItem;
use super::{Ctx, Job};
use crate::api::GatewayError;
use crate::store::SettingsPatch;

/// A recognised command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    Help,
    New,
    Status,
    Verbose(Option<String>),
    Streaming(Option<String>),
    Model(Option<String>),
    Stop,
    Compact,
}

/// The commands shown in Telegram's menu.
pub(crate) fn bot_commands() -> Vec<BotCommand> {
    [
        ("start", "Show what this bot does and its commands"),
        ("new", "Start a new session (the old one is kept)"),
        ("status", "Agent, model, session and token usage"),
        (
            "model",
            "List the allowed models or switch: /model provider/model",
        ),
        ("verbose", "Show tool calls: /verbose on|off"),
        (
            "streaming",
            "Edit the answer as it arrives: /streaming on|off",
        ),
        ("stop", "Cancel the running answer"),
        ("help", "Show the commands"),
    ]
    .into_iter()
    .map(|(c, d)| BotCommand {
        command: c.into(),
        description: d.into(),
    })
    .collect()
}

/// `/name[@bot] args…` → a command; anything else (unknown commands included) is a
/// message for the agent.
pub(crate) fn parse(text: &str) -> Option<Command> {
    let text = text.trim();
    let rest = text.strip_prefix('/')?;
    let (head, args) = match rest.split_once(char::is_whitespace) {
        Some((h, a)) => (h, a.trim()),
        None => (rest, ""),
    };
    let name = head.split('@').next().unwrap_or("").to_ascii_lowercase();
    let arg = (!args.is_empty()).then(|| args.to_string());
    Some(match name.as_str() {
        "start" | "help" => Command::Help,
        "new" => Command::New,
        "status" => Command::Status,
        "verbose" | "v" => Command::Verbose(arg),
        "streaming" | "s" => Command::Streaming(arg),
        "model" => Command::Model(arg),
        "stop" => Command::Stop,
        "compact" => Command::Compact,
        _ => return None,
    })
}

fn on_off(arg: Option<&str>) -> Option<bool> {
    match arg?.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Some(true),
        "off" | "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

fn word(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Plain text of our own HTML (tags dropped, entities decoded).
fn plain_of(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

/// Run a command and queue its answer.
pub(crate) async fn run(ctx: &Arc<Ctx>, job: Job, cmd: Command) {
    let html = match answer(ctx, &job, cmd).await {
        Ok(h) => h,
        Err(e) => format!("⚠️ {}", escape_html(&e.to_string())),
    };
    let item = OutItem::Text {
        chat_id: job.chat_id,
        thread_id: job.thread_id,
        chunks: vec![Chunk {
            plain: plain_of(&html),
            html,
        }],
        edit_message_id: None,
        reply_to: job.reply_to(),
        update_id: Some(job.update_id),
    };
    ctx.finish(job.update_id, job.inbox_id, Some(item)).await;
}

async fn answer(ctx: &Arc<Ctx>, job: &Job, cmd: Command) -> Result<String, GatewayError> {
    let gw = &ctx.gateway;
    let settings = gw.settings(&job.key).await?;
    let verbose = settings.verbose.unwrap_or(ctx.cfg.defaults.verbose);
    let streaming = settings.streaming.unwrap_or(ctx.cfg.defaults.streaming);
    let agent = escape_html(&job.agent);
    Ok(match cmd {
        Command::Help => format!(
            "👋 You are talking to the agent <b>{agent}</b>. Send a message and it answers; it works in its own sandbox.\n\n\
             <b>Commands</b>\n\
             /new — start a new session (the old one is kept)\n\
             /status — agent, model, session and token usage\n\
             /model [provider/model] — list or switch the allowed models\n\
             /verbose on|off — show each tool call (/v)\n\
             /streaming on|off — edit the answer as it arrives (/s)\n\
             /stop — cancel the running answer\n\
             /help — this help\n\n\
             Verbose: {} · Streaming: {}",
            word(verbose),
            word(streaming)
        ),
        Command::New => {
            gw.update_settings(
                &job.agent,
                &job.key,
                SettingsPatch {
                    verbose: Some(None),
                    streaming: Some(None),
                    model_override: Some(None),
                },
            )
            .await?;
            gw.new_session(&job.agent, &job.key).await?;
            "🆕 New session started. Previous conversation is saved.".to_string()
        }
        Command::Stop => {
            let queued = ctx.stop_queue(&job.key);
            let cancelled = gw.cancel(&job.agent, &job.key).await?;
            if cancelled || queued > 0 {
                "⛔ Stopped.".to_string()
            } else {
                "No active operation to stop.".to_string()
            }
        }
        Command::Compact => "🗜️ Compaction happens automatically when the conversation gets long. To start fresh, use /new.".to_string(),
        Command::Verbose(arg) => match on_off(arg.as_deref()) {
            Some(v) => {
                gw.update_settings(
                    &job.agent,
                    &job.key,
                    SettingsPatch {
                        verbose: Some(Some(v)),
                        ..Default::default()
                    },
                )
                .await?;
                if v {
                    "🔧 Verbose on: each tool call is shown.".to_string()
                } else {
                    "Verbose off: tool calls are not shown.".to_string()
                }
            }
            None => format!("Usage: /verbose on|off (now {})", word(verbose)),
        },
        Command::Streaming(arg) => match on_off(arg.as_deref()) {
            Some(v) => {
                gw.update_settings(
                    &job.agent,
                    &job.key,
                    SettingsPatch {
                        streaming: Some(Some(v)),
                        ..Default::default()
                    },
                )
                .await?;
                format!("✅ Streaming {}.", word(v))
            }
            None => format!("Usage: /streaming on|off (now {})", word(streaming)),
        },
        Command::Status => status(ctx, job, verbose, streaming).await?,
        Command::Model(arg) => model(ctx, job, arg).await?,
    })
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

async fn status(
    ctx: &Arc<Ctx>,
    job: &Job,
    verbose: bool,
    streaming: bool,
) -> Result<String, GatewayError> {
    let gw = &ctx.gateway;
    let settings = gw.settings(&job.key).await?;
    let models = gw.models(&job.agent).await?;
    let primary = models
        .first()
        .map(|m| format!("{}/{}", m.provider, m.model))
        .unwrap_or_default();
    let (model, note) = match &settings.model_override {
        Some(m) => (m.clone(), " (chosen with /model)"),
        None => (primary, ""),
    };
    let session = ctx
        .sessions
        .current_session(&job.key)
        .await
        .map_err(GatewayError::from)?
        .filter(|s| s.agent == job.agent);
    let mut lines = vec![
        "<b>Status</b>".to_string(),
        format!("Agent: <code>{}</code>", escape_html(&job.agent)),
        format!("Model: <code>{}</code>{note}", escape_html(&model)),
    ];
    match session {
        Some(s) => {
            if let Some(last) = s.model.as_deref().filter(|m| *m != model) {
                lines.push(format!(
                    "Last answered by: <code>{}</code>",
                    escape_html(last)
                ));
            }
            lines.push(format!(
                "Session: <code>{}</code> · <code>{}</code> · {} messages",
                escape_html(&job.key),
                escape_html(&s.id),
                s.message_count
            ));
            let u = s.usage;
            let mut usage = format!(
                "Usage: {} tokens in · {} out",
                thousands(u.input_tokens),
                thousands(u.output_tokens)
            );
            if u.cache_read_tokens + u.cache_write_tokens > 0 {
                usage.push_str(&format!(
                    " · cache {} read, {} written",
                    thousands(u.cache_read_tokens),
                    thousands(u.cache_write_tokens)
                ));
            }
            lines.push(usage);
        }
        None => {
            lines.push(format!(
                "Session: <code>{}</code> (no messages yet)",
                escape_html(&job.key)
            ));
            lines.push("Usage: 0 tokens".to_string());
        }
    }
    lines.push(format!(
        "Verbose: {} · Streaming: {}",
        word(verbose),
        word(streaming)
    ));
    Ok(lines.join("\n"))
}

async fn model(ctx: &Arc<Ctx>, job: &Job, arg: Option<String>) -> Result<String, GatewayError> {
    let gw = &ctx.gateway;
    let settings = gw.settings(&job.key).await?;
    let models = gw.models(&job.agent).await?;
    let keys: Vec<String> = models
        .iter()
        .map(|m| format!("{}/{}", m.provider, m.model))
        .collect();
    let current = settings
        .model_override
        .clone()
        .or_else(|| keys.first().cloned())
        .unwrap_or_default();
    let Some(arg) = arg else {
        let mut lines = vec![format!("<b>Models of {}</b>", escape_html(&job.agent))];
        for (m, key) in models.iter().zip(&keys) {
            let mark = if *key == current { " ← current" } else { "" };
            lines.push(format!(
                "• <code>{}</code> ({}, {}k context){mark}",
                escape_html(key),
                escape_html(&m.role),
                m.info.context_window / 1000
            ));
        }
        lines.push(
            "Switch with /model provider/model; /model default goes back to the primary."
                .to_string(),
        );
        return Ok(lines.join("\n"));
    };
    if matches!(arg.as_str(), "default" | "reset") {
        gw.update_settings(
            &job.agent,
            &job.key,
            SettingsPatch {
                model_override: Some(None),
                ..Default::default()
            },
        )
        .await?;
        return Ok(format!(
            "✅ Back to the primary model <code>{}</code>.",
            escape_html(keys.first().map(String::as_str).unwrap_or(""))
        ));
    }
    if !arg.contains('/') {
        return Ok(format!(
            "❌ Give the model as provider/model, for example /model {}.",
            escape_html(
                keys.first()
                    .map(String::as_str)
                    .unwrap_or("anthropic/claude-sonnet-4-6")
            )
        ));
    }
    match gw
        .update_settings(
            &job.agent,
            &job.key,
            SettingsPatch {
                model_override: Some(Some(arg.clone())),
                ..Default::default()
            },
        )
        .await
    {
        Ok(_) => {
            let ctx_k = keys
                .iter()
                .position(|k| *k == arg)
                .and_then(|i| models.get(i))
                .map(|m| format!(" ({}k context)", m.info.context_window / 1000))
                .unwrap_or_default();
            Ok(format!(
                "✅ Switched to <code>{}</code>{ctx_k}.",
                escape_html(&arg)
            ))
        }
        Err(GatewayError::ModelNotAllowed { allowed, .. }) => Ok(format!(
            "❌ <code>{}</code> is not allowed for <b>{}</b>. Allowed: {}",
            escape_html(&arg),
            escape_html(&job.agent),
            escape_html(&allowed)
        )),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing() {
        assert_eq!(parse("/start"), Some(Command::Help));
        assert_eq!(parse("/status@my_bot"), Some(Command::Status));
        assert_eq!(parse("/v on"), Some(Command::Verbose(Some("on".into()))));
        assert_eq!(
            parse("/model  spare/x "),
            Some(Command::Model(Some("spare/x".into())))
        );
        assert_eq!(parse("/unknown thing"), None);
        assert_eq!(parse("hello /new"), None);
        assert_eq!(on_off(Some("ON")), Some(true));
        assert_eq!(on_off(Some("maybe")), None);
    }

    #[test]
    fn helpers() {
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(plain_of("<b>a &amp; b</b> &lt;x&gt;"), "a & b <x>");
        assert!(bot_commands().iter().all(|c| c.command.len() <= 32
            && c.command
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch == '_')));
    }
}
