//! `beige run`, `beige exec` and `beige sessions`: the running gateway's API from the
//! command line, through `RemoteGateway` (the same `Gateway` trait channels use).
//!
//! `run` streams the answer's text to stdout and tool activity to stderr (`→ exec ls`,
//! `✓ exec (12 ms)`), or every event as a JSON line with `--json`. Exit codes: 0 done,
//! 1 the prompt failed (message and hint from the `Error` event), 3 the gateway is not
//! running, 4 unknown agent, 130 Ctrl+C (the prompt is cancelled by dropping its
//! stream).

use std::io::Write;

use anyhow::Result;
use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext};
use beige_core::store::SessionRecord;
use beige_core::AgentEvent;
use beige_core::{Gateway, GatewayError, PromptRequest, Sessions};
use futures_util::StreamExt;
use serde_json::Value;

use crate::cli::{ExecArgs, RunArgs, SessionsArgs};
use crate::client::{self, Target};
use crate::{code, Exit};

/// Turn a gateway error into the exit the user should see.
async fn fail(target: &Target, gw: &dyn Gateway, agent: &str, e: GatewayError) -> anyhow::Error {
    match e {
        GatewayError::Unreachable { .. } => {
            Exit::new(code::NOT_RUNNING, client::not_running_message(&target.url)).into()
        }
        GatewayError::UnknownAgent { known, .. } => unknown_agent(agent, &known).into(),
        GatewayError::Remote { status: 404, message } if message.starts_with("Unknown agent") => {
            let known = match gw.agents().await {
                Ok(list) => list
                    .into_iter()
                    .map(|a| a.name)
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(_) => "?".into(),
            };
            unknown_agent(agent, &known).into()
        }
        GatewayError::Remote { status: 401, .. } => Exit::new(
            1,
            "error: the gateway refused the API token. The CLI reads it from <BEIGE_HOME>/gateway.token: check that BEIGE_HOME is the gateway's, or restart the gateway after changing the token.",
        )
        .into(),
        other => Exit::new(1, format!("error: {other}")).into(),
    }
}

fn unknown_agent(agent: &str, known: &str) -> Exit {
    Exit::new(
        code::UNKNOWN_AGENT,
        format!(
            "error: no agent '{agent}' on this gateway. Known agents: {}",
            if known.is_empty() { "none" } else { known }
        ),
    )
}

/// A short description of a tool call for the activity lines.
fn describe(name: &str, args: &Value) -> String {
    let field = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_string);
    let detail = match name {
        "exec" => field("command"),
        "read" | "write" | "patch" => field("path"),
        _ => None,
    }
    .unwrap_or_else(|| args.to_string());
    let detail = detail.replace('\n', " ⏎ ");
    let detail = if detail.chars().count() > 120 {
        format!("{}…", detail.chars().take(119).collect::<String>())
    } else {
        detail
    };
    format!("{name} {detail}")
}

/// `beige run`.
pub async fn run(target: &Target, args: RunArgs) -> Result<()> {
    let gw = target.remote()?;
    let agent = args.agent.clone();
    let key = args
        .session
        .clone()
        .unwrap_or_else(|| format!("cli:{agent}:default"));
    let mut request = PromptRequest::new(&agent, key, args.message.join(" "));
    request.channel = Some("cli".into());
    let interrupted = || Exit::new(code::INTERRUPTED, "\ncancelled");
    let mut stream = tokio::select! {
        r = gw.prompt(request) => match r {
            Ok(s) => s,
            Err(e) => return Err(fail(target, &gw, &agent, e).await),
        },
        _ = tokio::signal::ctrl_c() => return Err(interrupted().into()),
    };
    let mut out = std::io::stdout();
    let mut text_open = false;
    // A line of live tool output is being printed (stderr).
    let mut live_open = false;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = tokio::signal::ctrl_c() => {
                drop(stream);
                if text_open { println!(); }
                return Err(interrupted().into());
            }
        };
        let Some(event) = event else {
            if text_open {
                println!();
            }
            return Err(Exit::new(
                1,
                "error: the gateway ended the answer early (it may have been stopped or restarted). Try again.",
            )
            .into());
        };
        if args.json {
            println!("{}", serde_json::to_string(&event)?);
            match event {
                AgentEvent::Done { .. } => return Ok(()),
                AgentEvent::Error { .. } | AgentEvent::Blocked { .. } => {
                    return Err(Exit::silent(1).into())
                }
                _ => continue,
            }
        }
        match event {
            AgentEvent::TextDelta { text } => {
                print!("{text}");
                let _ = out.flush();
                text_open = !text.ends_with('\n');
            }
            AgentEvent::ToolCallStarted { name, args, .. } => {
                if text_open {
                    println!();
                    text_open = false;
                }
                eprintln!("→ {}", describe(&name, &args));
            }
            AgentEvent::ToolOutput { text, .. } => {
                // Live output of a running command, on stderr like the tool lines.
                for piece in text.split_inclusive('\n') {
                    if !live_open {
                        eprint!("  │ ");
                    }
                    eprint!("{piece}");
                    live_open = !piece.ends_with('\n');
                }
            }
            AgentEvent::ToolCallFinished {
                name,
                output,
                is_error,
                duration_ms,
                ..
            } => {
                if live_open {
                    eprintln!();
                    live_open = false;
                }
                if is_error {
                    let first = output.lines().next().unwrap_or_default();
                    eprintln!("✗ {name} ({duration_ms} ms): {first}");
                } else {
                    eprintln!("✓ {name} ({duration_ms} ms)");
                }
            }
            AgentEvent::ModelSwitched { from, to, reason } => {
                eprintln!("(switched from {from} to {to}: {reason})");
            }
            AgentEvent::Compacted {
                summarized_messages,
            } => {
                eprintln!("(compacted {summarized_messages} earlier messages into a summary)");
            }
            AgentEvent::Done { response, .. } => {
                if !text_open && response.is_empty() {
                    // Nothing was said; keep stdout empty.
                } else if text_open {
                    println!();
                }
                return Ok(());
            }
            AgentEvent::Error { message, hint, .. } => {
                if text_open {
                    println!();
                }
                let mut msg = format!("error: {message}");
                if let Some(h) = hint {
                    msg.push_str(&format!("\nhint: {h}"));
                }
                return Err(Exit::new(1, msg).into());
            }
            AgentEvent::Blocked { reason } => {
                if text_open {
                    println!();
                }
                return Err(Exit::new(1, format!("blocked: {reason}")).into());
            }
            _ => {}
        }
    }
}

/// Join command words into one `sh -c` line: a single word is taken as a shell line as
/// is; several words are quoted where needed.
pub fn shell_line(words: &[String]) -> String {
    if let [one] = words {
        return one.clone();
    }
    words
        .iter()
        .map(|w| {
            if !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Split an exec result into its exit code and the rest of the text.
pub fn split_exit_code(text: &str) -> (Option<i32>, &str) {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    match first
        .strip_prefix("Exit code: ")
        .and_then(|c| c.split_whitespace().next())
        .and_then(|c| c.parse().ok())
    {
        Some(code) => (Some(code), rest),
        None => (None, text),
    }
}

/// `beige exec`.
pub async fn exec(target: &Target, args: ExecArgs) -> Result<()> {
    let gw = target.remote()?;
    let call = CoreToolCall::Exec(ExecParams {
        command: shell_line(&args.command),
        timeout: args.timeout,
    });
    let ctx = ToolContext {
        session_key: Some(format!("cli:{}:exec", args.agent)),
        channel: Some("cli".into()),
        ..Default::default()
    };
    let out = tokio::select! {
        r = gw.call_tool(&args.agent, call, ctx) => match r {
            Ok(o) => o,
            Err(e) => return Err(fail(target, &gw, &args.agent, e).await),
        },
        _ = tokio::signal::ctrl_c() => return Err(Exit::new(code::INTERRUPTED, "\ncancelled").into()),
    };
    let text = out.joined_text();
    let (exit, body) = split_exit_code(&text);
    if !body.is_empty() {
        println!("{body}");
    }
    match exit {
        Some(0) => Ok(()),
        Some(c) => Err(Exit::silent(u8::try_from(c).unwrap_or(1)).into()),
        None if out.is_error => Err(Exit::silent(1).into()),
        None => Ok(()),
    }
}

fn when(ms: i64) -> String {
    use chrono::TimeZone;
    match chrono::Local.timestamp_millis_opt(ms) {
        chrono::LocalResult::Single(t) => t.format("%Y-%m-%d %H:%M").to_string(),
        _ => ms.to_string(),
    }
}

/// The sessions as a table.
pub fn table(sessions: &[SessionRecord]) -> String {
    let rows: Vec<[String; 5]> = sessions
        .iter()
        .map(|s| {
            [
                s.key.clone(),
                s.id.clone(),
                when(s.created),
                s.title.clone().unwrap_or_else(|| "—".into()),
                s.model.clone().unwrap_or_else(|| "—".into()),
            ]
        })
        .collect();
    let header = ["KEY", "ID", "CREATED", "TITLE", "MODEL"].map(String::from);
    let mut widths = header.clone().map(|h| h.chars().count());
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i]
                .max(c.chars().count())
                .min(if i == 3 { 48 } else { 80 });
        }
    }
    let line = |r: &[String; 5]| {
        let mut s = String::new();
        for (i, c) in r.iter().enumerate() {
            let c = if c.chars().count() > widths[i] {
                format!("{}…", c.chars().take(widths[i] - 1).collect::<String>())
            } else {
                c.clone()
            };
            if i < 4 {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            } else {
                s.push_str(&c);
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(&header);
    out.push('\n');
    for r in &rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

/// `beige sessions`.
pub async fn sessions(target: &Target, args: SessionsArgs) -> Result<()> {
    let gw = target.remote()?;
    let list = match gw.sessions(&args.agent).await {
        Ok(l) => l,
        Err(e) => return Err(fail(target, &gw, &args.agent, e).await),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else if list.is_empty() {
        println!(
            "Agent '{}' has no sessions yet. Start one with `beige run {} \"…\"`.",
            args.agent, args.agent
        );
    } else {
        print!("{}", table(&list));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_words_become_a_shell_line() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(shell_line(&w(&["ls -la | wc -l"])), "ls -la | wc -l");
        assert_eq!(shell_line(&w(&["ls", "-la", "/tmp"])), "ls -la /tmp");
        assert_eq!(
            shell_line(&w(&["sh", "-c", "echo it's"])),
            r"sh -c 'echo it'\''s'"
        );
    }

    #[test]
    fn exit_codes_are_read_from_the_result() {
        assert_eq!(split_exit_code("Exit code: 3\nout"), (Some(3), "out"));
        assert_eq!(split_exit_code("Exit code: 0"), (Some(0), ""));
        assert_eq!(
            split_exit_code("Exit code: 137 (killed by signal 9)\nx"),
            (Some(137), "x")
        );
        assert_eq!(
            split_exit_code("Error: timed out"),
            (None, "Error: timed out")
        );
    }

    #[test]
    fn tool_calls_are_described_briefly() {
        assert_eq!(
            describe("exec", &serde_json::json!({"command": "ls\n-la"})),
            "exec ls ⏎ -la"
        );
        assert_eq!(
            describe(
                "write",
                &serde_json::json!({"path": "a.txt", "content": "x"})
            ),
            "write a.txt"
        );
    }
}
