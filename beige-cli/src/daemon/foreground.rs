//! `beige gateway start --foreground`: the gateway process itself.
//!
//! Builds the [`LocalGateway`] from the config (default Docker sandbox, providers from
//! the config), serves the HTTP API on `gateway.host:port` with the token from
//! `<BEIGE_HOME>/gateway.token` (unless `gateway.auth: false`), and handles signals:
//! SIGTERM/SIGINT drain running prompts for up to [`DRAIN`] and then shut down (sandboxes
//! removed unless `gateway.keepSandboxes`); SIGHUP and `POST /api/gateway/restart`
//! reload in place ([`Daemon::reload`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use beige_core::config::{Config, LoadedConfig};
use beige_core::home::BeigeHome;
use beige_core::{GatewayBuilder, GatewayError, LocalGateway};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::http::RestartRecord;
use super::reload::ReloadableGateway;
use crate::Exit;

/// How long a stop waits for running prompts before cancelling them.
pub const DRAIN: Duration = Duration::from_secs(10);

/// The running daemon: where its config comes from and the gateway it serves.
#[derive(Debug)]
pub struct Daemon {
    home: BeigeHome,
    config_path: PathBuf,
    gateway: Arc<ReloadableGateway>,
    /// The config the current gateway was built from (kept to fall back to).
    config: tokio::sync::Mutex<Config>,
    /// Restarts so far (numbers the [`RestartRecord`]s).
    restarts: AtomicU64,
}

/// Build a gateway from a loaded config: Docker sandbox, providers from the config.
async fn build(
    home: &BeigeHome,
    path: &std::path::Path,
    config: Config,
) -> Result<LocalGateway, GatewayError> {
    let shim = super::find_shim(config.sandbox.shim.as_deref())?;
    GatewayBuilder::new(config, home.clone())
        .config_file(path)
        .shim(shim)
        .build()
        .await
}

impl Daemon {
    /// The gateway the HTTP channel serves.
    pub fn gateway(&self) -> Arc<ReloadableGateway> {
        self.gateway.clone()
    }

    /// [`Daemon::reload`], then record the outcome in [`RestartRecord::path`] for
    /// `beige gateway restart`.
    pub async fn restart(&self) -> Result<String, String> {
        let outcome = self.reload().await;
        let record = RestartRecord {
            seq: self.restarts.fetch_add(1, Ordering::SeqCst) + 1,
            pid: std::process::id(),
            ok: outcome.is_ok(),
            message: match &outcome {
                Ok(m) | Err(m) => m.clone(),
            },
        };
        record.write(&self.home);
        outcome
    }

    /// In-place restart: load the config first — when it fails, keep serving the old
    /// gateway and return the error. Otherwise wait for running prompts (up to
    /// [`DRAIN`]), stop the old gateway keeping its containers, build the new one (it
    /// reattaches them) and swap it in. Returns a short description of what happened.
    pub async fn reload(&self) -> Result<String, String> {
        tracing::info!(config = %self.config_path.display(), "restart requested: reloading the config");
        if let Err(e) = install_missing(&self.config_path, &self.home).await {
            tracing::error!("restart refused, the gateway keeps its previous config: {e}");
            return Err(e);
        }
        let loaded = match Config::load(&self.config_path, &self.home) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("restart refused, the gateway keeps its previous config: {e}");
                return Err(format!("config error: {e}"));
            }
        };
        for w in &loaded.warnings {
            tracing::warn!("{}: {w}", loaded.path.display());
        }
        let mut previous = self.config.lock().await;
        let mut slot = self.gateway.lock().await;
        let old = slot.clone();
        drain(&old).await;
        if let Err(e) = old.stop(true).await {
            tracing::warn!(error = %e, "stopping the previous gateway failed; starting the new one anyway");
        }
        let started = Instant::now();
        match build(&self.home, &loaded.path, loaded.config.clone()).await {
            Ok(new) => {
                let report = new.reconcile_report().clone();
                *slot = Arc::new(new);
                *previous = loaded.config;
                let msg = format!(
                    "restarted in {} ms ({} sandbox(es) reattached, {} created)",
                    started.elapsed().as_millis(),
                    report.reattached.len(),
                    report.created.len()
                );
                tracing::info!("{msg}");
                Ok(msg)
            }
            Err(e) => {
                tracing::error!(error = %e, "the new config could not be started; going back to the previous one");
                match build(&self.home, &self.config_path, previous.clone()).await {
                    Ok(back) => {
                        *slot = Arc::new(back);
                        Err(format!(
                            "the new config could not be started ({e}); the gateway is running with the previous config again"
                        ))
                    }
                    Err(e2) => {
                        tracing::error!(error = %e2, "the previous config could not be started again either");
                        Err(format!(
                            "the new config could not be started ({e}), and restarting the previous one failed too ({e2}); the gateway serves nothing until a restart succeeds"
                        ))
                    }
                }
            }
        }
    }
}

/// Wait until no prompt runs on `gateway`, for at most [`DRAIN`].
async fn drain(gateway: &LocalGateway) {
    let started = Instant::now();
    let mut announced = false;
    while gateway.running_prompts() > 0 && started.elapsed() < DRAIN {
        if !announced {
            tracing::info!(
                running = gateway.running_prompts(),
                "waiting up to {} s for running prompts",
                DRAIN.as_secs()
            );
            announced = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if gateway.running_prompts() > 0 {
        tracing::warn!(
            running = gateway.running_prompts(),
            "prompts still running after {} s; cancelling them",
            DRAIN.as_secs()
        );
    }
}

/// Install plugins that have a `_source` but no files yet (into this config file, which
/// may be a `--config` path rather than `<BEIGE_HOME>/config.json5`).
async fn install_missing(config_path: &std::path::Path, home: &BeigeHome) -> Result<(), String> {
    let (p, h) = (config_path.to_path_buf(), home.clone());
    let installed =
        tokio::task::spawn_blocking(move || beige_core::plugin::install::ensure_installed(&p, &h))
            .await
            .map_err(|e| format!("plugin installation was interrupted: {e}"))?
            .map_err(|e| format!("cannot install a configured plugin: {e}"))?;
    for p in &installed {
        tracing::info!(plugin = %p.name, source = %p.source, "installed plugin from its _source");
    }
    Ok(())
}

/// Start the Telegram channel when `plugins.telegram` is configured (the built-in). It
/// serves the reloadable gateway, so it survives in-place restarts; a channel that cannot
/// start is logged and the HTTP API keeps serving.
fn start_telegram(
    home: &BeigeHome,
    config: &Config,
    gateway: Arc<ReloadableGateway>,
    token: CancellationToken,
) {
    use beige_core::channel::telegram::TelegramChannel;
    use beige_core::channel::Channel;
    let store: Arc<dyn beige_core::store::Store> =
        match beige_core::store::SqliteStore::open(home.db_path()) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::error!("Telegram channel not started: {e}");
                return;
            }
        };
    let channel = match TelegramChannel::from_config(config, store) {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            tracing::error!("Telegram channel not started: {e}");
            return;
        }
    };
    tokio::spawn(async move {
        let gateway: Arc<dyn beige_core::GatewayFull> = gateway;
        if let Err(e) = channel.run(gateway, token).await {
            tracing::error!("Telegram channel stopped: {e}");
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

    let gateway = build(&home, &loaded.path, loaded.config.clone())
        .await
        .map_err(|e| {
            tracing::error!("cannot start: {e}");
            Exit::new(1, format!("error: {e}"))
        })?;
    let daemon = Arc::new(Daemon {
        home: home.clone(),
        config_path: loaded.path.clone(),
        gateway: Arc::new(ReloadableGateway::new(gateway)),
        config: tokio::sync::Mutex::new(loaded.config.clone()),
        restarts: AtomicU64::new(0),
    });

    let shutdown = CancellationToken::new();
    let mut http = match super::http::serve(&gw_config, token, daemon.clone(), shutdown.clone()) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("cannot start the HTTP API: {e:#}");
            let _ = daemon.gateway.current().await.shutdown().await;
            return Err(Exit::new(1, format!("error: {e:#}")).into());
        }
    };
    tracing::info!(url = %format!("http://{}", http.addr), "beige gateway ready");
    start_telegram(
        &home,
        &loaded.config,
        daemon.gateway(),
        shutdown.child_token(),
    );

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); break; }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: restarting in place");
                // `restart` logs its outcome.
                let _ = daemon.restart().await;
            }
            r = http.done() => {
                if let Err(e) = r {
                    tracing::error!("the HTTP API stopped: {e:#}");
                }
                break;
            }
        }
    }

    // Drain while the API still serves the running streams; a second signal skips it.
    let current = daemon.gateway.current().await;
    tokio::select! {
        _ = drain(&current) => {}
        _ = term.recv() => tracing::warn!("second signal: not waiting for running prompts"),
        _ = int.recv() => tracing::warn!("second signal: not waiting for running prompts"),
    }
    shutdown.cancel();
    let stopped = tokio::time::timeout(DRAIN, current.shutdown()).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), http.done()).await;
    match stopped {
        Ok(Ok(())) => {
            tracing::info!("beige gateway stopped");
            Ok(())
        }
        Ok(Err(e)) => {
            tracing::error!("shutdown failed: {e}");
            Err(Exit::new(1, format!("error: shutdown failed: {e}")).into())
        }
        Err(_) => {
            tracing::error!("shutdown did not finish within {} s", DRAIN.as_secs());
            Err(Exit::new(1, "error: shutdown timed out").into())
        }
    }
}
