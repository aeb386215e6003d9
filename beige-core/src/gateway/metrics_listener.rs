//! The metrics listener (observability.md §2): `GET /metrics` without a token on the
//! loopback address `telemetry.metrics.listen` names, run by [`LocalGateway::serve`]
//! beside the channels and stopped with them.
//!
//! Owns the refusal of any address that is not loopback (the same rule the config
//! validation applies, [`crate::metrics::listen_address`]), the bind, and the small app:
//! one route, behind the HTTP API's own `Host` and `Origin` checks
//! ([`crate::channel::http::refuse_foreign`]), answering the same OpenMetrics text as the
//! API's `/metrics`.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use super::{LocalGateway, ServeError};
use crate::api::GatewayFull;
use crate::channel::http::{refuse_foreign, ApiState};

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

#[derive(Clone)]
struct Listening {
    /// For the `Host`/`Origin` checks only (no token: the address is loopback).
    checks: Arc<ApiState>,
    gateway: LocalGateway,
}

/// Serve `/metrics` on `listener` until `stop` is cancelled.
pub(super) async fn run(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    gateway: LocalGateway,
    stop: CancellationToken,
) {
    let as_api: Arc<dyn GatewayFull> = Arc::new(gateway.clone());
    let mut checks = ApiState::new(as_api, None);
    checks.port = Some(addr.port());
    let state = Listening {
        checks: Arc::new(checks),
        gateway,
    };
    let app = Router::new()
        .route("/metrics", get(scrape))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state);
    tracing::info!(addr = %addr, "metrics listening (no token, loopback only)");
    let serve = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .into_future();
    if let Err(e) = serve.await {
        tracing::error!(addr = %addr, error = %e, "the metrics listener failed");
    }
}

async fn guard(State(s): State<Listening>, req: Request, next: Next) -> Response {
    if let Some(refused) = refuse_foreign(&s.checks, &req) {
        return refused;
    }
    next.run(req).await
}

async fn scrape(State(s): State<Listening>) -> Response {
    match s.gateway.render_metrics().await {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(e) => (StatusCode::NOT_IMPLEMENTED, e.to_string()).into_response(),
    }
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "Not found: this listener serves only GET /metrics",
    )
        .into_response()
}
