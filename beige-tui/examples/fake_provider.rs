//! A fake Anthropic Messages API on 127.0.0.1 for trying the TUI without a real provider
//! (beige-cli's pty test of the TUI, `tests/suite/tui_pty.rs`, queues the same answers).
//!
//! Run with `cargo run -p beige-tui --example fake_provider -- [URL_FILE]`.
//!
//! It prints `http://127.0.0.1:<port>` (and writes it to `URL_FILE` when given), then
//! answers every user message the same way, with the real SSE wire format of
//! `beige_testkit::anthropic`: first a tool call (`exec` of
//! `echo hello-from-the-sandbox`), then — once the tool result comes back — a short
//! markdown answer. Point a provider at it with `baseUrl: "<the URL>"` and any `apiKey`.
//! Stops on Ctrl+C or SIGTERM.

use beige_testkit::anthropic::MessageStream;
use beige_testkit::llm::FakeLlmServer;
use serde_json::json;

/// Exchanges queued (each a tool call and an answer).
const EXCHANGES: usize = 200;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = FakeLlmServer::start().await;
    for i in 1..=EXCHANGES {
        server.push(
            MessageStream::new()
                .text("Let me check the sandbox.")
                .tool_use(
                    &format!("toolu_e2e_{i:04}"),
                    "exec",
                    json!({"command": "echo hello-from-the-sandbox"}),
                )
                .usage(420, 38)
                .reply(),
        );
        server.push(
            MessageStream::new()
                .text(&format!(
                    "The sandbox answered **hello-from-the-sandbox**.\n\n- exit code 0\n- reply number {i}"
                ))
                .usage(510, 24)
                .piece_size(3)
                .reply(),
        );
    }
    let url = server.url();
    println!("{url}");
    if let Some(path) = std::env::args().nth(1) {
        std::fs::write(&path, format!("{url}\n"))?;
    }
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    drop(server);
    Ok(())
}
