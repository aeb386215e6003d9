//! `beige gateway start --foreground`: the gateway process itself.
//!
//! Builds the [`LocalGateway`](beige_core::LocalGateway) from the config (default Docker
//! sandbox, providers from the config) with its channels — the HTTP API on
//! `gateway.host:port` with the token from `<BEIGE_HOME>/gateway.token` (unless
//! `gateway.auth: false`), and Telegram when configured — and lets
//! [`LocalGateway::serve`](beige_core::LocalGateway::serve) run them: SIGTERM/SIGINT
//! drain running prompts for up to [`DRAIN`] and then shut down (sandboxes removed unless
//! `gateway.keepSandboxes`); SIGHUP and `POST /api/gateway/restart` reload in place from
//! [`DaemonConfig`], which installs missing plugins first. What stays here is the process:
//! exit codes, and the outcome of each restart in [`RestartRecord::path`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use async_trait::async_trait;
use beige_core::channel::http::{ApiOptions, ExtraRoutes, HttpApiChannel};
use beige_core::config::{Config, LoadedConfig};
use beige_core::home::BeigeHome;
use beige_core::GatewayBuilder;
use beige_core::{BoxError, ConfigSource, ServeError, Shutdown};

use super::http::RestartRecord;
use crate::Exit;

/// How long a stop waits for running prompts before cancelling them.
pub const DRAIN: Duration = Duration::from_secs(10);

/// The daemon's config source: install plugins that have a `_source` but no files yet,
/// then read the config file again.
#[derive(Debug)]
pub struct DaemonConfig {
    path: PathBuf,
    home: BeigeHome,
}

#[async_trait]
impl ConfigSource for DaemonConfig {
    async fn load(&self) -> Result<LoadedConfig, BoxError> {
        install_missing(&self.path, &self.home).await?;
        Config::load(&self.path, &self.home).map_err(|e| format!("config error: {e}").into())
    }
}

/// Install plugins that have a `_source` but no files yet (into this config file, which
/// may be a `--config` path rather than `<BEIGE_HOME>/config.json5`).
async fn install_missing(config_path: &std::path::Path, home: &BeigeHome) -> Result<(), String> {
    let (p, h) = (config_path.to_path_buf(), home.clone());
    let installed = tokio::task::spawn_blocking(move || crate::install::ensure_installed(&p, &h))
        .await
        .map_err(|e| format!("plugin installation was interrupted: {e}"))?
        .map_err(|e| format!("cannot install a configured plugin: {e}"))?;
    for p in &installed {
        tracing::info!(plugin = %p.name, source = %p.source, "installed plugin from its _source");
    }
    Ok(())
}

/// The Telegram channel when `plugins.telegram` is configured (the built-in), or `None`
/// (also when it cannot be made: that is logged and the HTTP API serves anyway). It keeps
/// its records in the gateway's store.
fn telegram(config: &Config) -> Option<Arc<dyn beige_core::channel::Channel>> {
    use beige_core::channel::telegram::TelegramChannel;
    match TelegramChannel::from_config(config) {
        Ok(Some(c)) => Some(Arc::new(c)),
        Ok(None) => None,
        Err(e) => {
            tracing::error!("Telegram channel not started: {e}");
            None
        }
    }
}

/// Write each reload's outcome to [`RestartRecord::path`] for `beige gateway restart`.
fn record_restarts(home: BeigeHome, gateway: &beige_core::LocalGateway) {
    let mut outcomes = gateway.reload_outcomes();
    tokio::spawn(async move {
        let mut seq = 0;
        while outcomes.changed().await.is_ok() {
            let Some(outcome) = outcomes.borrow_and_update().clone() else {
                continue;
            };
            seq += 1;
            RestartRecord {
                seq,
                pid: std::process::id(),
                ok: outcome.ok,
                message: outcome.message,
            }
            .write(&home);
        }
    });
}

/// Run the gateway in this process until SIGTERM or SIGINT.
pub async fn run(home: BeigeHome, config_path: PathBuf) -> Result<()> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        pid = std::process::id(),
        config = %config_path.display(),
        home = %home.root().display(),
        "starting the beige gateway"
    );
    install_missing(&config_path, &home).await.map_err(|e| {
        tracing::error!("cannot start: {e}");
        Exit::new(1, format!("error: {e}"))
    })?;
    let loaded: LoadedConfig = Config::load(&config_path, &home).map_err(|e| {
        tracing::error!("cannot start: {e}");
        Exit::new(1, format!("error: {e}"))
    })?;
    for w in &loaded.warnings {
        tracing::warn!("{}: {w}", loaded.path.display());
    }
    let gw_config = loaded.config.gateway.clone();
    let token = if gw_config.auth {
        match crate::client::read_token(&home) {
            Some(t) => Some(t),
            None => {
                let msg = format!(
                    "error: gateway.auth is on but there is no API token at {}. Create one with `beige setup`.",
                    home.token_path().display()
                );
                tracing::error!("{msg}");
                return Err(Exit::new(1, msg).into());
            }
        }
    } else {
        tracing::warn!("gateway.auth is false: the HTTP API accepts requests without a token");
        None
    };

    // The web console at /console on the same port (docs/console.md).
    let audit_log = home.audit_log_path();
    let console: ExtraRoutes = Arc::new(move |state| {
        beige_console::router(
            state,
            beige_console::ConsoleOptions::new().audit_log(audit_log.clone()),
        )
    });
    let options = ApiOptions::new(token).with_extra_routes(console);
    let (api, addr) =
        HttpApiChannel::bind(&gw_config.host, gw_config.port, options).map_err(|e| {
            tracing::error!("cannot start the HTTP API: {e:#}");
            Exit::new(1, format!("error: {e:#}"))
        })?;
    let shim = super::find_shim(loaded.config.sandbox.shim.as_deref()).map_err(|e| {
        tracing::error!("cannot start: {e}");
        Exit::new(1, format!("error: {e}"))
    })?;
    let mut builder = GatewayBuilder::new(loaded.config.clone(), home.clone())
        .config_file(&loaded.path)
        .config_source(Arc::new(DaemonConfig {
            path: loaded.path.clone(),
            home: home.clone(),
        }))
        .shim(shim)
        .channel(Arc::new(api));
    if let Some(telegram) = telegram(&loaded.config) {
        builder = builder.channel_optional(telegram);
    }
    let gateway = builder.build().await.map_err(|e| {
        tracing::error!("cannot start: {e}");
        Exit::new(1, format!("error: {e}"))
    })?;
    record_restarts(home.clone(), &gateway);
    tracing::info!(url = %format!("http://{addr}"), "beige gateway ready");

    let shutdown = Shutdown::on_signals()?.drain(DRAIN);
    match gateway.serve(shutdown).await {
        Ok(()) => Ok(()),
        Err(ServeError::Channel { channel, source }) => {
            tracing::error!("the {channel} channel stopped: {source:#}");
            Err(Exit::new(1, format!("error: the {channel} channel failed: {source}")).into())
        }
        Err(e @ ServeError::ShutdownTimeout(_)) => {
            tracing::error!("{e}");
            Err(Exit::new(1, "error: shutdown timed out").into())
        }
        Err(e) => {
            let e = anyhow::Error::from(e);
            tracing::error!("{e:#}");
            Err(Exit::new(1, format!("error: {e:#}")).into())
        }
    }
}
