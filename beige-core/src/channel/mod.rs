//! Channels: how people reach agents (the HTTP API, Telegram, the TUI through the HTTP
//! API, plugin channels).
//!
//! Owns the [`Channel`] trait. A channel gets an `Arc<dyn GatewayFull>` and nothing else, so
//! hooks, policy, fallback and audit apply identically whichever channel a message came
//! from; it never reaches into the gateway's internals.

#[cfg(feature = "http-api")]
pub mod http;
#[cfg(feature = "http-api")]
pub(crate) mod metrics_listener;
#[cfg(feature = "telegram")]
pub mod telegram;

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::api::GatewayFull;
use crate::config::PluginEntry;
use crate::plugin::Plugin;
use crate::store::Stores;

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
    /// The channel failed, with its message.
    #[error("channel '{channel}': {message}")]
    Failed {
        /// The channel's name (`api`, `telegram`, a plugin channel's name).
        channel: String,
        /// What went wrong.
        message: String,
    },
    /// No channel of that name is registered with the gateway.
    #[error("no channel '{channel}' is registered; registered channels: {known}")]
    Unknown {
        /// The name asked for.
        channel: String,
        /// The registered channels, comma-separated (`none` when there are none).
        known: String,
    },
    /// The channel cannot send messages unprompted.
    #[error("channel '{channel}' cannot send messages on its own")]
    Unsupported {
        /// The channel's name.
        channel: String,
    },
}

/// Asks the gateway to reload its config in place (what the HTTP API's restart route
/// does); the outcome is reported by the gateway, not to the caller. Made by
/// `LocalGateway::reload_handle`.
#[derive(Clone)]
pub struct ReloadHandle(Arc<dyn Fn() + Send + Sync>);

impl ReloadHandle {
    /// A handle that runs `request` (which must return at once: start the reload in the
    /// background).
    pub fn new(request: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Arc::new(request))
    }

    /// Start a reload in the background.
    pub fn request(&self) {
        (self.0)()
    }
}

impl std::fmt::Debug for ReloadHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadHandle")
    }
}

/// What a channel gets when it runs: the gateway and when to stop.
#[derive(Clone)]
#[non_exhaustive]
pub struct ChannelContext {
    /// Every request goes through here, so hooks, policy and audit apply whatever the
    /// channel. Under `LocalGateway::serve` it survives reloads.
    pub gateway: Arc<dyn GatewayFull>,
    /// Reload the gateway (`None` when it has nothing to reload from).
    pub reload: Option<ReloadHandle>,
    /// The gateway's store, for a channel's own records (offsets, its outbox, its plugin
    /// data): one handle shared with the gateway. `None` when the channel runs outside
    /// `LocalGateway::serve` without one.
    pub stores: Option<Stores>,
    /// Fires when the channel must stop.
    pub shutdown: CancellationToken,
}

impl std::fmt::Debug for ChannelContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelContext")
            .field("reload", &self.reload.is_some())
            .field("stores", &self.stores.is_some())
            .field("stopped", &self.shutdown.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl ChannelContext {
    /// A context serving `gateway` until `shutdown` fires, without reload (tests, and
    /// embedders that run a channel themselves).
    pub fn new(gateway: Arc<dyn GatewayFull>, shutdown: CancellationToken) -> Self {
        Self {
            gateway,
            reload: None,
            stores: None,
            shutdown,
        }
    }

    /// Give the channel a store for its own records.
    pub fn with_stores(mut self, stores: impl Into<Stores>) -> Self {
        self.stores = Some(stores.into());
        self
    }

    /// Let the channel reload the gateway.
    pub fn with_reload(mut self, reload: ReloadHandle) -> Self {
        self.reload = Some(reload);
        self
    }
}

/// A way to reach agents. Register one with `GatewayBuilder::channel` and
/// `LocalGateway::serve` runs it.
#[async_trait]
pub trait Channel: Send + Sync {
    /// The channel's name (`api`, `telegram`, …), also the first segment of its session
    /// keys.
    fn name(&self) -> &str;

    /// Serve until `ctx.shutdown` fires. Errors at start-up are returned at once.
    async fn run(&self, ctx: ChannelContext) -> Result<(), ChannelError>;

    /// The tools the channel brings, as a plugin registered with the gateway (its
    /// `plugins.<name>` entry then needs no folder).
    fn plugin(&self) -> Option<Arc<dyn Plugin>> {
        None
    }

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
