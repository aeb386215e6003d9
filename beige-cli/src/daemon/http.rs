//! The daemon's HTTP API: beige-core's [`HttpApiChannel`] serving the
//! [`ReloadableGateway`](super::reload::ReloadableGateway), with
//! `POST /api/gateway/restart` wired to [`Daemon::reload`].
//!
//! The restart endpoint answers at once (202); the outcome of each restart is written
//! to [`RestartRecord::path`] so `beige gateway restart` can wait for it and report a
//! config error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use beige_core::channel::http::{ApiState, HttpApiChannel};
use beige_core::channel::Channel;
use beige_core::config::GatewayConfig;
use beige_core::home::BeigeHome;
use beige_core::GatewayFull;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::foreground::Daemon;

/// The outcome of the last in-place restart, as written for `beige gateway restart`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartRecord {
    /// Counts restarts of this daemon process, from 1.
    pub seq: u64,
    /// The daemon's pid (a new daemon starts counting again).
    pub pid: u32,
    pub ok: bool,
    pub message: String,
}

impl RestartRecord {
    /// `<BEIGE_HOME>/gateway.restart.json`.
    pub fn path(home: &BeigeHome) -> PathBuf {
        home.root().join("gateway.restart.json")
    }

    pub fn read(home: &BeigeHome) -> Option<Self> {
        let text = std::fs::read_to_string(Self::path(home)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub(super) fn write(&self, home: &BeigeHome) {
        let path = Self::path(home);
        let tmp = path.with_extension("json.tmp");
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "could not record the restart outcome");
        }
    }
}

/// The running API.
#[derive(Debug)]
pub struct Http {
    pub addr: SocketAddr,
    task: JoinHandle<Result<(), beige_core::channel::ChannelError>>,
}

impl Http {
    /// Wait until the API stops (after `shutdown`, or on an error).
    pub async fn done(&mut self) -> Result<()> {
        match (&mut self.task).await {
            Ok(r) => r.context("the HTTP API failed"),
            Err(e) => Err(anyhow::anyhow!("the HTTP API task ended: {e}")),
        }
    }
}

/// Bind `gateway.host:port` and serve until `shutdown` fires.
pub fn serve(
    config: &GatewayConfig,
    token: Option<String>,
    daemon: Arc<Daemon>,
    shutdown: CancellationToken,
) -> Result<Http> {
    let gateway: Arc<dyn GatewayFull> = daemon.gateway();
    let handle = tokio::runtime::Handle::current();
    let restart = Arc::new(move || {
        let daemon = daemon.clone();
        handle.spawn(async move {
            // `restart` logs its outcome.
            let _ = daemon.restart().await;
        });
    });
    let state = ApiState::new(gateway.clone(), token).with_restart(restart);
    let (channel, addr) = HttpApiChannel::bind(&config.host, config.port, state)?;
    let task = tokio::spawn(async move { channel.run(gateway, shutdown).await });
    Ok(Http { addr, task })
}
