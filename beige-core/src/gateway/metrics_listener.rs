//! The metrics listener (observability.md §2): `GET /metrics` without a token on the
//! loopback address `telemetry.metrics.listen` names, run by [`LocalGateway::serve`]
//! beside the channels and stopped with them.
//!
//! Owns the refusal of any address that is not loopback (the same rule the config
//! validation applies, [`crate::metrics::listen_address`]) and the bind; the app itself
//! (one route behind the HTTP API's `Host` and `Origin` checks) is the channel layer's.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{LocalGateway, ServeError};
use crate::api::GatewayFull;

/// Check `value` (`telemetry.metrics.listen`) and listen on it.
pub(super) async fn bind(value: &str) -> Result<tokio::net::TcpListener, ServeError> {
    let addr =
        crate::metrics::listen_address(value).map_err(|message| ServeError::MetricsListen {
            message: format!("telemetry.metrics.listen: {message}"),
        })?;
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::MetricsBind { addr, source })
}

/// Serve `/metrics` on `listener` until `stop` is cancelled.
pub(super) async fn run(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    gateway: LocalGateway,
    stop: CancellationToken,
) {
    let as_api: Arc<dyn GatewayFull> = Arc::new(gateway.clone());
    let render: crate::channel::metrics_listener::Render = Arc::new(move || {
        let gateway = gateway.clone();
        Box::pin(async move { gateway.render_metrics().await })
    });
    crate::channel::metrics_listener::run(listener, addr, as_api, render, stop).await;
}
