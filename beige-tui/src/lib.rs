//! The beige terminal UI: a ratatui client of a running gateway.
//!
//! ```no_run
//! # async fn demo() -> Result<(), beige_tui::TuiError> {
//! // What `beige tui [agent] [-g url]` does: the gateway of `BEIGE_HOME`, the first agent.
//! let code = beige_tui::run(None, None).await?;
//! std::process::exit(code);
//! # }
//! ```
//!
//! It talks to the gateway only through the [`Gateway`]
//! trait — [`RemoteGateway`] in production, any
//! implementation in tests ([`run_with`]). Elm-like split:
//!
//! | module | owns |
//! |---|---|
//! | [`app`] | the state: agents, session, transcript cells, composer, scroll, status, modals |
//! | [`update`](mod@update) | `update(&mut App, Msg) -> Vec<Effect>`: all behaviour, no terminal, no I/O |
//! | [`render`] | `render(&App, &mut Frame)`: the pure view |
//! | [`runtime`] | runs effects against the gateway, the terminal guard, the event loop, reconnecting |
//! | [`markdown`], [`wrap`] | rendering answers and laying text out in columns |
//! | [`commands`], [`composer`] | slash commands and help; the input editor and history |
//!
//! The user guide is `docs/tui.md`.
//!
//! [`Gateway`]: beige_client::Gateway
//! [`RemoteGateway`]: beige_client::RemoteGateway

pub mod app;
pub mod commands;
pub mod composer;
pub mod markdown;
pub mod render;
pub mod runtime;
pub mod update;
pub mod wrap;

use std::sync::Arc;

use beige_client::home::BeigeHome;
use beige_client::{Gateway, GatewayError, GatewayFull, RemoteGateway};

pub use app::App;
pub use update::{update, Effect, Msg};

/// Why the TUI could not run (problems with the gateway are reported to the user and
/// turned into an exit code instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuiError {
    #[error("terminal error: {0}")]
    Terminal(#[from] std::io::Error),
}

/// What to print when the gateway does not answer.
pub fn not_running_message(url: &str) -> String {
    format!("the beige gateway is not running at {url} — start it with `beige gateway start`")
}

/// Run the TUI against the gateway of `BEIGE_HOME` (`url` overrides the address from its
/// config) on the current terminal. Returns the process exit code: 0 after a normal quit,
/// 1 when the gateway is not running, refuses the token or has no such agent (a message
/// saying so is printed to stderr before the terminal is touched), 2 for a bad URL or an
/// unreadable token file.
pub async fn run(agent: Option<String>, url: Option<String>) -> Result<i32, TuiError> {
    let home = BeigeHome::from_env();
    let remote = match RemoteGateway::from_home(&home, url.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("beige tui: {e}");
            return Ok(2);
        }
    };
    let url = remote.base_url().trim_end_matches('/').to_string();
    match remote.status().await {
        Ok(_) => {}
        Err(GatewayError::Unreachable { .. }) => {
            eprintln!("{}", not_running_message(&url));
            return Ok(1);
        }
        Err(e) => {
            eprintln!("beige tui: {e}");
            return Ok(1);
        }
    }
    run_with(Arc::new(remote), url, agent).await
}

/// Run the TUI against any gateway; `url` is only shown. Checks the agents first and
/// reports problems (unreachable, unknown agent, none configured) on stderr with exit
/// code 1 before touching the terminal.
pub async fn run_with(
    gateway: Arc<dyn GatewayFull>,
    url: String,
    agent: Option<String>,
) -> Result<i32, TuiError> {
    let agents = match gateway.agents().await {
        Ok(a) => a,
        Err(GatewayError::Unreachable { .. }) => {
            eprintln!("{}", not_running_message(&url));
            return Ok(1);
        }
        Err(e) => {
            eprintln!("beige tui: {e}");
            return Ok(1);
        }
    };
    let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
    let agent = match agent {
        Some(a) if names.contains(&a.as_str()) => a,
        Some(a) => {
            eprintln!(
                "beige tui: unknown agent '{a}'; available agents: {}",
                names.join(", ")
            );
            return Ok(1);
        }
        None => match names.first() {
            Some(first) => first.to_string(),
            None => {
                eprintln!("beige tui: the gateway at {url} has no agents; add one under `agents` in config.json5");
                return Ok(1);
            }
        },
    };
    let mut app = App::new(url, agents, &agent, (80, 24));
    app.utc_offset_secs = chrono::Local::now().offset().local_minus_utc();
    runtime::run_terminal(app, gateway).await?;
    Ok(0)
}
