//! Channels: how people reach agents (the HTTP API, Telegram, the TUI through the HTTP
//! API, plugin channels).
//!
//! Owns the [`Channel`] trait. A channel gets an `Arc<dyn GatewayFull>` and nothing else, so
//! hooks, policy, fallback and audit apply identically whichever channel a message came
//! from; it never reaches into the gateway's internals.

pub mod http;
pub mod telegram;

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::gateway::GatewayFull;

/// A channel failed to start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    #[error("channel '{channel}': {message}")]
    Failed { channel: String, message: String },
    #[error("channel '{channel}' cannot send messages on its own")]
    Unsupported { channel: String },
}

/// A way to reach agents.
#[async_trait]
pub trait Channel: Send + Sync {
    /// The channel's name (`api`, `telegram`, …), also the first segment of its session
    /// keys.
    fn name(&self) -> &str;

    /// Serve until `shutdown` fires. Errors at start-up are returned at once.
    async fn run(
        &self,
        gateway: Arc<dyn GatewayFull>,
        shutdown: CancellationToken,
    ) -> Result<(), ChannelError>;

    /// Deliver a message that no prompt asked for (reminders, plugin notifications).
    async fn send(
        &self,
        chat_id: &str,
        thread_id: Option<&str>,
        text: &str,
    ) -> Result<(), ChannelError> {
        let _ = (chat_id, thread_id, text);
        Err(ChannelError::Unsupported {
            channel: self.name().to_string(),
        })
    }
}
