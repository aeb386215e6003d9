//! Run with `cargo run -p beige-examples --example stdio_channel [-- <agent>]` while a
//! gateway is running (`beige gateway start`). It finds the gateway and its token through
//! `BEIGE_HOME` (default `~/.beige`); set `BEIGE_GATEWAY_URL` to reach another address.
//!
//! A custom channel written only against the public [`Channel`] and [`Gateway`] traits: a
//! line-based chat on stdin/stdout. Every line is a prompt to the agent; the answer is
//! printed as it streams, tool activity goes to stderr. `/new` starts a new session,
//! `/quit` (or end of input) leaves, Ctrl+C cancels a running answer. The channel gets an
//! `Arc<dyn GatewayFull>` and nothing else, so it works the same in process (`LocalGateway`)
//! and against a daemon (`RemoteGateway`, used here). `docs/channels.md` walks through it.

use std::io::Write;
use std::sync::Arc;

use async_trait::async_trait;
use beige_core::channel::{Channel, ChannelContext, ChannelError};
use beige_core::AgentEvent;
use beige_core::RemoteGateway;
use beige_core::{BeigeHome, Gateway, GatewayError, PromptRequest};
use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

/// The channel: which agent to talk to (the first one when `None`).
struct StdioChannel {
    agent: Option<String>,
}

/// Turn a gateway error into the channel's error type.
fn failed(e: GatewayError) -> ChannelError {
    ChannelError::Failed {
        channel: "stdio".into(),
        message: e.to_string(),
    }
}

fn prompt_marker() {
    print!("> ");
    let _ = std::io::stdout().flush();
}

#[async_trait]
impl Channel for StdioChannel {
    /// Also the first segment of this channel's session keys (`stdio:<agent>:<user>`);
    /// hooks and `exec`'s `BEIGE_CHANNEL` see it.
    fn name(&self) -> &str {
        "stdio"
    }

    async fn run(&self, ctx: ChannelContext) -> Result<(), ChannelError> {
        let (gateway, shutdown) = (ctx.gateway, ctx.shutdown);
        // Pick the agent: the one asked for, else the first configured.
        let agents = gateway.agents().await.map_err(failed)?;
        let agent = match &self.agent {
            Some(name) => agents.iter().find(|a| &a.name == name),
            None => agents.first(),
        }
        .ok_or_else(|| ChannelError::Failed {
            channel: "stdio".into(),
            message: format!(
                "no agent {}; configured: {}",
                self.agent.as_deref().unwrap_or("at all"),
                agents
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
        let user = std::env::var("USER").unwrap_or_else(|_| "local".into());
        let key = format!("{}:{}:{user}", self.name(), agent.name);
        println!(
            "Talking to {} ({}), session key {key}. /new starts a new session, /quit leaves.",
            agent.name, agent.model
        );

        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        loop {
            prompt_marker();
            let line = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::signal::ctrl_c() => break,
                line = lines.next_line() => line.map_err(|e| ChannelError::Failed {
                    channel: "stdio".into(),
                    message: format!("cannot read stdin: {e}"),
                })?,
            };
            let Some(line) = line else { break }; // end of input
            match line.trim() {
                "" => continue,
                "/quit" | "/exit" => break,
                "/new" => {
                    let s = gateway
                        .new_session(&agent.name, &key)
                        .await
                        .map_err(failed)?;
                    println!("New session {}.", s.id);
                }
                text => {
                    let request = PromptRequest::new(&agent.name, &key, text);
                    let mut events = match gateway.prompt(request).await {
                        Ok(events) => events,
                        Err(e) => {
                            eprintln!("error: {e}");
                            continue;
                        }
                    };
                    loop {
                        let event = tokio::select! {
                            // Dropping `events` cancels the prompt in the gateway.
                            _ = tokio::signal::ctrl_c() => {
                                println!("\n[cancelled]");
                                break;
                            }
                            _ = shutdown.cancelled() => return Ok(()),
                            event = events.next() => event,
                        };
                        match event {
                            None => break,
                            Some(AgentEvent::TextDelta { text }) => {
                                print!("{text}");
                                let _ = std::io::stdout().flush();
                            }
                            Some(AgentEvent::ToolCallStarted { name, args, .. }) => {
                                eprintln!("\n  ⚙ {name} {args}");
                            }
                            Some(AgentEvent::ToolCallFinished {
                                name,
                                is_error,
                                duration_ms,
                                ..
                            }) => {
                                let how = if is_error { "failed" } else { "ok" };
                                eprintln!("  ⚙ {name} {how} ({duration_ms} ms)");
                            }
                            Some(AgentEvent::ModelSwitched { to, reason, .. }) => {
                                eprintln!("  (answering with {to}: {reason})");
                            }
                            Some(AgentEvent::Done { .. }) => println!(),
                            Some(AgentEvent::Blocked { reason }) => println!("[blocked] {reason}"),
                            Some(AgentEvent::Error { message, hint, .. }) => {
                                eprintln!("\nerror: {message}");
                                if let Some(hint) = hint {
                                    eprintln!("hint: {hint}");
                                }
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Messages nobody asked for (reminders, plugin notifications) are printed too.
    async fn send(
        &self,
        chat_id: &str,
        _thread_id: Option<&str>,
        text: &str,
    ) -> Result<(), ChannelError> {
        println!("\n[{chat_id}] {text}");
        prompt_marker();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let home = BeigeHome::from_env();
    let url = std::env::var("BEIGE_GATEWAY_URL").ok();
    let gateway = RemoteGateway::from_home(&home, url.as_deref())?;
    let channel = StdioChannel {
        agent: std::env::args().nth(1),
    };
    let result = channel
        .run(ChannelContext::new(
            Arc::new(gateway),
            CancellationToken::new(),
        ))
        .await;
    if let Err(e) = result {
        eprintln!("error: {e}");
        // A blocking stdin read cannot be cancelled; exit instead of waiting for it.
        std::process::exit(1);
    }
    std::process::exit(0);
}
