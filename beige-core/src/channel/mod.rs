//! Channels: how people reach agents (the HTTP API, Telegram, the TUI through the HTTP
//! API, plugin channels).
//!
//! Owns the [`Channel`] trait. A channel gets an `Arc<dyn GatewayFull>` and nothing else, so
//! hooks, policy, fallback and audit apply identically whichever channel a message came
//! from; it never reaches into the gateway's internals.

#[cfg(feature = "http-api")]
pub mod http;
#[cfg(feature = "telegram")]
pub mod telegram;

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::config::PluginEntry;
use crate::gateway::GatewayFull;
use crate::plugin::Plugin;

/// The plugin of the built-in channel that the `plugins.<name>` entry `entry` enables, if
/// it names one compiled into this build (today: `telegram`, cargo feature `telegram`).
/// A built-in channel whose feature is off is refused when plugins are loaded.
pub(crate) fn builtin_plugin(name: &str, entry: &PluginEntry) -> Option<Arc<dyn Plugin>> {
    #[cfg(feature = "telegram")]
    if name == "telegram" && telegram::is_builtin(entry) {
        return Some(Arc::new(telegram::TelegramPlugin::new()));
    }
    let _ = (name, entry);
    None
}

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
