//! The metrics listener's app (observability.md §2): `GET /metrics` without a token,
//! behind the HTTP API's own `Host` and `Origin` checks ([`super::http::refuse_foreign`]),
//! answering the OpenMetrics text the gateway renders. The gateway binds the loopback
//! address (`telemetry.metrics.listen`) and runs this beside the channels.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use super::http::{refuse_foreign, ApiState};
use crate::api::{GatewayError, GatewayFull};

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders the metrics text for one scrape.
pub(crate) type Render = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<String, GatewayError>> + Send>> + Send + Sync,
>;

#[derive(Clone)]
struct Listening {
    /// For the `Host`/`Origin` checks only (no token: the address is loopback).
    checks: Arc<ApiState>,
    render: Render,
}

/// Serve `/metrics` on `listener` (bound to `addr`) until `stop` is cancelled.
pub(crate) async fn run(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    gateway: Arc<dyn GatewayFull>,
    render: Render,
    stop: CancellationToken,
) {
    let mut checks = ApiState::new(gateway, None);
    checks.port = Some(addr.port());
    let state = Listening {
        checks: Arc::new(checks),
        render,
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
    match (s.render)().await {
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
