//! The HTTP API channel: [`router`] (the axum app every test drives) and
//! [`HttpApiChannel`] (the same app bound to `gateway.host:gateway.port`).
//!
//! Owns the wire contract of `/api/*` — routes, request and response shapes, status codes —
//! and the checks in front of it: the bearer token (constant-time compare), the `Host`
//! and `Origin` rules against DNS rebinding and cross-site requests, `Content-Type` and
//! the body size limit. Everything behind the checks goes through the [`Gateway`] trait,
//! so policy, hooks, fallback and audit apply exactly as for every other channel; this
//! module never touches the gateway's internals, the store or the sandboxes.
//!
//! With feature `mcp`, `/mcp/agents/{name}` serves an agent's tools over MCP's
//! streamable HTTP transport behind the same checks (`mcp::serve`).
//!
//! The route table [`routes`] is the single list the router is built from; the OpenAPI
//! document served at `/api/openapi.json` ([`OPENAPI_JSON`]) is checked against it by a
//! test. `docs/http-api.md` is the reference for people.

use std::convert::Infallible;
use std::future::IntoFuture;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, MethodRouter};
use axum::{Json, Router};
use beige_client::approvals::{ApprovalDecision, ApprovalMode};
use beige_client::auth::{Action, AuthEvent, Caller, Refusal};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

use super::{Channel, ChannelContext, ChannelError};
use crate::api::{
    Admin, AgentEvent, CoreToolCall, Gateway, GatewayError, GatewayFull, HookName, Principal,
    PromptRequest, Sessions, SettingsPatch, ToolContext,
};

/// Default limit of a request body: 10 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 10 * 1024 * 1024;

/// The OpenAPI 3.1 document served at `GET /api/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../../assets/openapi.json");

/// The 401 message: what is missing and where the token is.
pub const UNAUTHORIZED_MESSAGE: &str =
    "Missing or invalid token: send Authorization: Bearer <token from BEIGE_HOME/gateway.token>";

/// The channel name (also the default first segment of API session keys).
pub const CHANNEL_NAME: &str = "api";

/// How long [`HttpApiChannel::run`] waits for open requests after shutdown fires.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Interval of SSE keep-alive comments (they also reveal a closed connection).
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The most of an error body (from an extractor rejection) wrapped into `{error}`.
const MAX_REWRAPPED_BODY: usize = 16 * 1024;

/// What the daemon does on `POST /api/gateway/restart`: start an in-place restart in the
/// background and return at once.
pub type RestartHook = Arc<dyn Fn() + Send + Sync>;

/// More routes served on the API's port (the web console at `/console`): built from the
/// state once [`HttpApiChannel::run`] has the gateway, and merged into the app outside
/// the API's checks (such routes apply [`refuse_foreign`] and their own authentication).
pub type ExtraRoutes = Arc<dyn Fn(&ApiState) -> Router + Send + Sync>;

/// How the HTTP API serves, apart from the gateway it serves: what
/// [`HttpApiChannel::bind`] takes (the gateway comes with [`Channel::run`]'s context, and
/// the restart route from its reload handle unless a hook is set here).
#[derive(Clone)]
#[non_exhaustive]
pub struct ApiOptions {
    /// The bearer token; `None` disables authentication (only allowed on loopback).
    pub token: Option<String>,
    /// Extra names accepted in `Host` and `Origin` (see [`ApiState::allowed_hosts`]).
    pub allowed_hosts: Vec<String>,
    /// Largest accepted request body in bytes.
    pub body_limit: usize,
    /// `POST /api/gateway/restart`; `None` uses the context's reload handle, else 501.
    pub restart: Option<RestartHook>,
    /// The port the API listens on (set by [`HttpApiChannel::bind`]).
    pub port: Option<u16>,
    /// Accept any IP literal in `Host`/`Origin` (set when listening on a wildcard).
    pub allow_ip_hosts: bool,
    /// More routes on the same port (see [`ExtraRoutes`]).
    pub extra_routes: Option<ExtraRoutes>,
}

impl ApiOptions {
    /// Options with the default body limit and no extra hosts.
    pub fn new(token: Option<String>) -> Self {
        Self {
            token,
            allowed_hosts: Vec::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            restart: None,
            port: None,
            allow_ip_hosts: false,
            extra_routes: None,
        }
    }

    /// Accept this name (`name` or `name:port`) in `Host` and `Origin`.
    pub fn with_allowed_host(mut self, host: impl Into<String>) -> Self {
        self.allowed_hosts.push(host.into());
        self
    }

    /// Change the body limit.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Serve these routes too (see [`ExtraRoutes`]).
    pub fn with_extra_routes(mut self, routes: ExtraRoutes) -> Self {
        self.extra_routes = Some(routes);
        self
    }

    /// The state serving `gateway` with these options.
    pub fn with_gateway(self, gateway: Arc<dyn GatewayFull>) -> ApiState {
        ApiState {
            gateway,
            token: self.token,
            allowed_hosts: self.allowed_hosts,
            body_limit: self.body_limit,
            restart: self.restart,
            port: self.port,
            allow_ip_hosts: self.allow_ip_hosts,
            #[cfg(feature = "mcp")]
            mcp: Arc::default(),
        }
    }
}

impl std::fmt::Debug for ApiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("allowed_hosts", &self.allowed_hosts)
            .field("body_limit", &self.body_limit)
            .field("restart", &self.restart.is_some())
            .field("port", &self.port)
            .field("allow_ip_hosts", &self.allow_ip_hosts)
            .field("extra_routes", &self.extra_routes.is_some())
            .finish()
    }
}

impl From<ApiState> for ApiOptions {
    fn from(state: ApiState) -> Self {
        state.options()
    }
}

/// Everything the HTTP API needs. Build it with [`ApiState::new`].
#[derive(Clone)]
pub struct ApiState {
    /// Every route is served through this gateway ([`HttpApiChannel::run`] replaces it
    /// with the gateway it is given).
    pub gateway: Arc<dyn GatewayFull>,
    /// The bearer token; `None` disables authentication (only allowed on loopback).
    pub token: Option<String>,
    /// Extra names accepted in `Host` and `Origin` (`name` or `name:port`), e.g. the name
    /// of a reverse proxy. Loopback names are always accepted.
    pub allowed_hosts: Vec<String>,
    /// Largest accepted request body in bytes.
    pub body_limit: usize,
    /// `POST /api/gateway/restart`; `None` answers 501.
    pub restart: Option<RestartHook>,
    /// The port the API listens on: an `Origin` on a loopback name must use it. `None`
    /// (an unbound router) accepts any port.
    pub port: Option<u16>,
    /// Accept any IP literal in `Host`/`Origin` (set when listening on a wildcard
    /// address; an IP literal cannot be a DNS-rebinding name).
    pub allow_ip_hosts: bool,
    /// The MCP endpoint `/mcp/agents/{name}` (its per-agent services and sessions).
    #[cfg(feature = "mcp")]
    mcp: Arc<crate::mcp::serve::McpEndpoint>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The same fields as the options (token redacted), without the gateway.
        self.options().fmt(f)
    }
}

impl ApiState {
    /// A state with the default body limit, no extra hosts and no restart hook.
    pub fn new(gateway: Arc<dyn GatewayFull>, token: Option<String>) -> Self {
        Self {
            gateway,
            token,
            allowed_hosts: Vec::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            restart: None,
            port: None,
            allow_ip_hosts: false,
            #[cfg(feature = "mcp")]
            mcp: Arc::default(),
        }
    }

    /// Accept this name (`name` or `name:port`) in `Host` and `Origin`.
    pub fn with_allowed_host(mut self, host: impl Into<String>) -> Self {
        self.allowed_hosts.push(host.into());
        self
    }

    /// Change the body limit.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// How the MCP endpoint serves: the same `Host` names as the API (any, when the
    /// API accepts any IP literal and has checked the `Host` itself), the same body
    /// limit.
    #[cfg(feature = "mcp")]
    fn mcp_options(&self) -> crate::mcp::serve::EndpointOptions {
        let hosts = (!self.allow_ip_hosts).then(|| {
            let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
                .into_iter()
                .map(str::to_string)
                .collect();
            hosts.extend(self.allowed_hosts.iter().cloned());
            hosts
        });
        crate::mcp::serve::EndpointOptions {
            allowed_hosts: hosts,
            body_limit: self.body_limit,
        }
    }

    /// Serve `POST /api/gateway/restart` with this hook.
    pub fn with_restart(mut self, hook: RestartHook) -> Self {
        self.restart = Some(hook);
        self
    }

    /// The options, without the gateway.
    pub fn options(&self) -> ApiOptions {
        ApiOptions {
            token: self.token.clone(),
            allowed_hosts: self.allowed_hosts.clone(),
            body_limit: self.body_limit,
            restart: self.restart.clone(),
            port: self.port,
            allow_ip_hosts: self.allow_ip_hosts,
            extra_routes: None,
        }
    }

    /// Whether a `Host` (or `Origin`) host name is acceptable, port aside.
    fn host_name_ok(&self, host: &str) -> bool {
        is_loopback_name(host) || (self.allow_ip_hosts && parse_ip(host).is_some())
    }

    fn host_allowed(&self, authority: &str) -> bool {
        let (host, port) = split_host_port(authority);
        self.host_name_ok(&host) || self.listed(&host, port, true)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let (scheme, rest) = match origin.split_once("://") {
            Some((s, r)) => (s.to_ascii_lowercase(), r),
            None => return false,
        };
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return false,
        };
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.is_empty() || authority.contains('@') {
            return false;
        }
        let (host, port) = split_host_port(authority);
        let port = port.unwrap_or(default_port);
        (self.host_name_ok(&host) && self.port.is_none_or(|p| p == port))
            || self.listed(&host, Some(port), false)
    }

    /// Whether `host[:port]` matches an entry of `allowed_hosts`. An entry without a port
    /// matches every port; `port_optional` lets a request without a port match an entry
    /// with one (a `Host` header may omit the default port).
    fn listed(&self, host: &str, port: Option<u16>, port_optional: bool) -> bool {
        self.allowed_hosts.iter().any(|entry| {
            let (h, p) = split_host_port(entry);
            h == host
                && match (p, port) {
                    (None, _) => true,
                    (Some(a), Some(b)) => a == b,
                    (Some(_), None) => port_optional,
                }
        })
    }

    /// Who the request's bearer token is: the gateway's token (or no token, when
    /// authentication is off) is the owner; a personal `bgt_…` token is its user, as the
    /// gateway says (`Admin::authenticate`: revoked, expired and unknown tokens are
    /// `None`); anything else is nobody.
    pub async fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        if self.token.is_none() || self.token_ok(headers) {
            return Some(Caller::owner());
        }
        let given = bearer(headers)?;
        if !given.starts_with("bgt_") {
            return None;
        }
        match self.gateway.authenticate(given).await {
            Ok(caller) => caller,
            Err(e) => {
                tracing::warn!(error = %e, "could not check a personal token");
                None
            }
        }
    }

    fn token_ok(&self, headers: &HeaderMap) -> bool {
        let Some(expected) = &self.token else {
            return true;
        };
        let Some(given) = bearer(headers) else {
            return false;
        };
        constant_time_eq(given.as_bytes(), expected.as_bytes())
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
}

/// Compare two secrets without leaking where they differ (or their lengths): both are
/// hashed, and the digests are compared in constant time.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (x, y) = (Sha256::digest(a), Sha256::digest(b));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

fn parse_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok()
}

fn is_loopback_name(host: &str) -> bool {
    host == "localhost" || parse_ip(host).is_some_and(|ip| ip.is_loopback())
}

/// Split `host[:port]` (`[v6]:port` too) into a lowercase host without brackets or a
/// trailing dot, and the port.
fn split_host_port(authority: &str) -> (String, Option<u16>) {
    let a = authority.trim();
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (rest, None),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, p.parse().ok()),
            _ => (a, None),
        }
    };
    (host.trim_end_matches('.').to_ascii_lowercase(), port)
}

// ---------------------------------------------------------------------------------------
// Errors

/// An error answer: a status and `{"error": …}` (plus optional extra fields).
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    body: Map<String, Value>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let mut body = Map::new();
        body.insert("error".into(), Value::String(message.into()));
        Self { status, body }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn with(mut self, key: &str, value: Value) -> Self {
        self.body.insert(key.into(), value);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(Value::Object(self.body))).into_response()
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        match e {
            GatewayError::UnknownAgent { agent, .. } => {
                ApiError::new(StatusCode::NOT_FOUND, format!("Unknown agent: {agent}"))
            }
            GatewayError::ModelNotAllowed {
                agent,
                requested,
                allowed,
            } => ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "Model {requested} is not in the allowed list for agent '{agent}' (allowed: {allowed})"
                ),
            ),
            e @ (GatewayError::UnknownSession { .. } | GatewayError::UnknownSchedule { .. }) => {
                ApiError::new(StatusCode::NOT_FOUND, e.to_string())
            }
            e @ GatewayError::InvalidSchedule { .. } => ApiError::bad_request(e.to_string()),
            GatewayError::InvalidCall(c) => ApiError::bad_request(c.message),
            // Hook events that do not parse, hooks that cannot be triggered from outside,
            // a compaction whose summary the model did not write.
            e @ (GatewayError::InvalidHookEvent { .. }
            | GatewayError::HookNotTriggerable { .. }
            | GatewayError::Compaction { .. }) => ApiError::bad_request(e.to_string()),
            // A gateway that is itself remote: pass its answer through.
            GatewayError::Remote { status, message } => ApiError::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                message,
            ),
            e @ GatewayError::Unreachable { .. } => {
                ApiError::new(StatusCode::BAD_GATEWAY, e.to_string())
            }
            GatewayError::Approval { status, message } => ApiError::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::CONFLICT),
                message,
            ),
            GatewayError::Refused(r) => refused(&r),
            GatewayError::InvalidAuth { status, message } => ApiError::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                message,
            ),
            // An administration call this gateway leaves at its default.
            e @ GatewayError::Unsupported { .. } => {
                ApiError::new(StatusCode::NOT_IMPLEMENTED, e.to_string())
            }
            // The agent is paused until the disk has room again: retry later.
            e @ GatewayError::DiskLow { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
            other => {
                tracing::error!(error = %other, "HTTP API request failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Internal error; the details are in the gateway log (`beige gateway logs`)",
                )
            }
        }
    }
}

type ApiResult = Result<Response, ApiError>;

// ---------------------------------------------------------------------------------------
// Router

type Shared = Arc<ApiState>;
type Handler = fn() -> MethodRouter<Shared>;

/// What a route needs of its caller (`spec/people.md` §1.2), checked by [`guard`]
/// before the handler runs. Handlers of [`Access::Any`] routes narrow what they show
/// (agents, approvals) or what they do (approval decisions, tokens) to the caller.
#[derive(Debug, Clone, Copy)]
enum Access {
    /// No token (health).
    Public,
    /// Any authenticated caller.
    Any,
    /// This action on the agent named by the path's `{name}`.
    Agent(Action),
    /// Administration of the whole gateway (owners).
    Admin,
}

/// The route a request is for: its access rule and the `{name}` segment of its path.
fn route_access(method: &str, path: &str) -> Option<(Access, Option<String>)> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    TABLE.iter().find_map(|(m, pattern, access, _)| {
        if *m != method {
            return None;
        }
        let want: Vec<&str> = pattern.split('/').collect();
        if want.len() != segments.len() {
            return None;
        }
        let mut agent = None;
        for (w, got) in want.iter().zip(&segments) {
            if *w == "{name}" {
                agent = Some(percent_decode(got));
            } else if !(w.starts_with('{') || w == got) {
                return None;
            }
        }
        Some((*access, agent))
    })
}

/// `%XX` escapes of a path segment decoded (as axum's `Path` does), so the name checked
/// is the name the handler uses.
fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&segment[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A refusal as the API answers it: 404 for an agent the caller has no role on, else
/// 403 naming what is missing.
fn refused(refusal: &Refusal) -> ApiError {
    let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::FORBIDDEN);
    ApiError::new(status, refusal.to_string())
}

/// The route table: method, path (axum syntax, also the OpenAPI path), what the caller
/// needs ([`Access`], checked by [`guard`] before the handler runs) and handler. The
/// router is built from it and a test checks the OpenAPI document against it.
const TABLE: &[(&str, &str, Access, Handler)] = &[
    ("GET", "/api/health", Access::Public, || get(health)),
    ("GET", "/api/health/models", Access::Any, || {
        get(models_health)
    }),
    ("GET", "/api/usage", Access::Any, || get(usage)),
    ("GET", "/api/openapi.json", Access::Any, || get(openapi)),
    ("GET", "/api/agents", Access::Any, || get(agents)),
    ("GET", "/api/config", Access::Admin, || get(config)),
    (
        "GET",
        "/api/agents/{name}/models",
        Access::Agent(Action::See),
        || get(agent_models),
    ),
    (
        "GET",
        "/api/agents/{name}/sandbox",
        Access::Agent(Action::See),
        || get(agent_sandbox),
    ),
    (
        "GET",
        "/api/agents/{name}/mcp",
        Access::Agent(Action::See),
        || get(agent_mcp),
    ),
    (
        "POST",
        "/api/agents/{name}/exec",
        Access::Agent(Action::Operate),
        || post(exec),
    ),
    (
        "POST",
        "/api/agents/{name}/prompt",
        Access::Agent(Action::Prompt),
        || post(prompt),
    ),
    (
        "GET",
        "/api/agents/{name}/sessions",
        Access::Agent(Action::See),
        || get(list_sessions),
    ),
    (
        "POST",
        "/api/agents/{name}/sessions",
        Access::Agent(Action::Prompt),
        || post(new_session),
    ),
    (
        "GET",
        "/api/agents/{name}/sessions/{id}/messages",
        Access::Agent(Action::See),
        || get(session_messages),
    ),
    (
        "POST",
        "/api/agents/{name}/sessions/{key}/resume",
        Access::Agent(Action::Prompt),
        || post(resume_session),
    ),
    (
        "PATCH",
        "/api/agents/{name}/sessions/{key}/model",
        Access::Agent(Action::Prompt),
        || patch(set_model),
    ),
    (
        "GET",
        "/api/agents/{name}/sessions/{key}/settings",
        Access::Agent(Action::Prompt),
        || get(get_settings),
    ),
    (
        "PATCH",
        "/api/agents/{name}/sessions/{key}/settings",
        Access::Agent(Action::Prompt),
        || patch(update_settings),
    ),
    (
        "POST",
        "/api/agents/{name}/sessions/{key}/cancel",
        Access::Agent(Action::Prompt),
        || post(cancel),
    ),
    (
        "POST",
        "/api/agents/{name}/hooks/pre-prompt",
        Access::Agent(Action::Operate),
        || hook_route(HookName::PrePrompt),
    ),
    (
        "POST",
        "/api/agents/{name}/hooks/post-response",
        Access::Agent(Action::Operate),
        || hook_route(HookName::PostResponse),
    ),
    (
        "POST",
        "/api/agents/{name}/hooks/session-created",
        Access::Agent(Action::Operate),
        || hook_route(HookName::SessionCreated),
    ),
    (
        "POST",
        "/api/agents/{name}/hooks/session-disposed",
        Access::Agent(Action::Operate),
        || hook_route(HookName::SessionDisposed),
    ),
    ("POST", "/api/gateway/restart", Access::Admin, || {
        post(restart)
    }),
    ("GET", "/api/whoami", Access::Any, || get(whoami)),
    ("GET", "/api/tokens", Access::Any, || get(list_tokens)),
    ("POST", "/api/tokens", Access::Any, || post(create_token)),
    ("DELETE", "/api/tokens/{id}", Access::Any, || {
        delete(revoke_token)
    }),
    ("GET", "/api/approvals", Access::Any, || get(list_approvals)),
    ("GET", "/api/approvals/events", Access::Any, || {
        get(approval_events)
    }),
    ("GET", "/api/approvals/{id}", Access::Any, || {
        get(get_approval)
    }),
    ("POST", "/api/approvals/{id}/decision", Access::Any, || {
        post(decide_approval)
    }),
    ("GET", "/api/schedules", Access::Admin, || {
        get(list_schedules)
    }),
    ("POST", "/api/schedules", Access::Admin, || {
        post(add_schedule)
    }),
    ("GET", "/api/schedules/{id}", Access::Admin, || {
        get(get_schedule)
    }),
    ("DELETE", "/api/schedules/{id}", Access::Admin, || {
        delete(cancel_schedule)
    }),
    ("GET", "/api/schedules/{id}/runs", Access::Admin, || {
        get(schedule_runs)
    }),
    ("POST", "/api/schedules/{id}/pause", Access::Admin, || {
        post(pause_schedule)
    }),
    ("POST", "/api/schedules/{id}/resume", Access::Admin, || {
        post(resume_schedule)
    }),
    ("POST", "/api/schedules/{id}/run", Access::Admin, || {
        post(run_schedule)
    }),
    ("GET", "/metrics", Access::Admin, || get(metrics)),
    #[cfg(feature = "mcp")]
    (
        "POST",
        "/mcp/agents/{name}",
        Access::Agent(Action::Operate),
        || post(mcp_endpoint),
    ),
    #[cfg(feature = "mcp")]
    (
        "GET",
        "/mcp/agents/{name}",
        Access::Agent(Action::Operate),
        || get(mcp_endpoint),
    ),
    #[cfg(feature = "mcp")]
    (
        "DELETE",
        "/mcp/agents/{name}",
        Access::Agent(Action::Operate),
        || delete(mcp_endpoint),
    ),
];

/// Every route the API serves, as `(method, path)` with `{param}` placeholders.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    TABLE.iter().map(|(m, p, _, _)| (*m, *p)).collect()
}

/// The HTTP API as a whole axum app, as [`HttpApiChannel`] serves it: the routes, the
/// checks in front of them, and JSON answers for unknown paths and methods. Serve it with
/// `axum::serve`, or drive it in tests with `tower::ServiceExt::oneshot`.
pub fn router(state: ApiState) -> Router {
    let shared: Shared = Arc::new(state);
    table_routes()
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

/// The API's routes with their checks (`Host`, `Origin`, token, body limit) and no
/// top-level fallback, to merge into an existing axum app (`app.merge(api_router(..))`):
/// the app's own routes and fallback stay as they are, and only the API's paths get the
/// API's checks.
pub fn api_router(state: ApiState) -> Router {
    let shared: Shared = Arc::new(state);
    table_routes()
        .route_layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

fn table_routes() -> Router<Shared> {
    let mut app: Router<Shared> = Router::new();
    for (_, path, _, handler) in TABLE {
        app = app.route(path, handler());
    }
    app
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "Not found")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed")
}

/// The checks in front of every route: `Host`, `Origin`, the token (not for
/// `/api/health`), a declared body over the limit. Non-JSON error answers (extractor
/// rejections) are rewrapped as `{"error": …}`.
async fn guard(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(refused) = refuse_foreign(&s, &req) {
        return refused;
    }
    let mut req = req;
    let route = route_access(req.method().as_str(), req.uri().path());
    if !matches!(route, Some((Access::Public, _))) {
        let Some(caller) = s.caller(req.headers()).await else {
            return ApiError::new(StatusCode::UNAUTHORIZED, UNAUTHORIZED_MESSAGE)
                .with_www_authenticate()
                .into_response();
        };
        let checked = match &route {
            Some((Access::Agent(action), Some(agent))) => caller
                .may(*action, agent)
                .map_err(|r| (r, Some(agent.clone()))),
            Some((Access::Admin, _)) => caller.may_administer().map_err(|r| (r, None)),
            _ => Ok(()),
        };
        if let Err((refusal, agent)) = checked {
            s.gateway
                .audit_auth(AuthEvent::refused(&caller, agent.as_deref(), &refusal))
                .await;
            return refused(&refusal).into_response();
        }
        req.extensions_mut().insert(caller);
    }
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > s.body_limit as u64 {
            return too_large(s.body_limit).into_response();
        }
    }
    let response = next.run(req).await;
    rewrap_error(response).await
}

/// The `Host` and `Origin` checks in front of every API route (against DNS rebinding
/// and cross-site requests): the refusal to answer with, or `None` when the request may
/// go on. The metrics listener and the web console apply the same checks.
pub fn refuse_foreign(s: &ApiState, req: &Request) -> Option<Response> {
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        });
    match authority {
        None => {
            return Some(ApiError::bad_request("Missing Host header").into_response());
        }
        Some(h) if !s.host_allowed(&h) => {
            tracing::warn!(host = %h, "refused a request with a foreign Host header");
            return Some(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "Host '{h}' is not allowed: use localhost or 127.0.0.1 (requests for other names are refused to prevent DNS rebinding)"
                ),
            )
            .into_response());
        }
        Some(_) => {}
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("<invalid>");
        if !s.origin_allowed(origin) {
            tracing::warn!(origin, "refused a cross-origin request");
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("Origin '{origin}' is not allowed: cross-site requests to the gateway are refused"),
            )
            .into_response());
        }
    }
    None
}

impl ApiError {
    fn with_www_authenticate(self) -> WithHeader {
        WithHeader(self, header::WWW_AUTHENTICATE, "Bearer")
    }
}

struct WithHeader(ApiError, header::HeaderName, &'static str);

impl IntoResponse for WithHeader {
    fn into_response(self) -> Response {
        let mut r = self.0.into_response();
        r.headers_mut()
            .insert(self.1, HeaderValue::from_static(self.2));
        r
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "Request body too large: the limit is {limit} bytes ({} MiB)",
            limit / (1024 * 1024)
        ),
    )
}

/// Turn an error answer that is not JSON (an axum rejection) into `{"error": …}`.
async fn rewrap_error(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_REWRAPPED_BODY)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("Error").to_string()
    } else {
        text
    };
    let mut r = ApiError::new(status, message).into_response();
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            r.headers_mut().insert(name.clone(), value.clone());
        }
    }
    r
}

// ---------------------------------------------------------------------------------------
// Request bodies

/// Read a JSON object body. An absent (empty) body is `None`; a body needs
/// `Content-Type: application/json` (415), must fit the limit (413) and parse (400).
async fn json_body(
    s: &ApiState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Map<String, Value>, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or_default().to_ascii_lowercase());
    let is_json = content_type.as_deref().is_some_and(|ct| {
        let essence = ct.split(';').next().unwrap_or_default().trim();
        essence == "application/json"
            || (essence.starts_with("application/") && essence.ends_with("+json"))
    });
    let unsupported = || {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported Content-Type: send the body as JSON with Content-Type: application/json",
        )
    };
    if content_type.is_some() && !is_json {
        return Err(unsupported());
    }
    let bytes = axum::body::to_bytes(body, s.body_limit)
        .await
        .map_err(|e| {
            let mut source: Option<&dyn std::error::Error> = Some(&e);
            while let Some(err) = source {
                if err.to_string().contains("length limit") {
                    return too_large(s.body_limit);
                }
                source = err.source();
            }
            ApiError::bad_request(format!("Could not read the request body: {e}"))
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    if !is_json {
        return Err(unsupported());
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request(
            "The request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::bad_request(format!("Invalid JSON: {e}"))),
    }
}

/// An optional string field (`null` counts as absent).
fn opt_str(map: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(format!(
            "Invalid {field}: expected a string"
        ))),
    }
}

/// An optional non-empty string field.
fn opt_key(map: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match opt_str(map, field)? {
        Some(s) if s.trim().is_empty() => Err(ApiError::bad_request(format!(
            "Invalid {field}: must not be empty"
        ))),
        other => Ok(other),
    }
}

/// A required non-empty string field; `missing` is the message when it is absent.
fn req_str(map: &Map<String, Value>, field: &str, missing: &str) -> Result<String, ApiError> {
    match opt_str(map, field)? {
        Some(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(ApiError::bad_request(missing)),
    }
}

/// A tri-state field for a settings patch: absent → leave, `null` → clear, value → set.
fn patch_field<T>(
    map: &Map<String, Value>,
    field: &str,
    expected: &str,
    get: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Option<T>>, ApiError> {
    match map.get(field) {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(v) => get(v).map(|t| Some(Some(t))).ok_or_else(|| {
            ApiError::bad_request(format!("Invalid {field}: expected {expected} or null"))
        }),
    }
}

fn default_key(agent: &str) -> String {
    format!("{CHANNEL_NAME}:{agent}:default")
}

/// Fail with 404 `Unknown agent: x` unless the agent is configured.
async fn ensure_agent(s: &ApiState, name: &str) -> Result<(), ApiError> {
    let agents = s.gateway.agents().await?;
    if agents.iter().any(|a| a.name == name) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Unknown agent: {name}"),
        ))
    }
}

// ---------------------------------------------------------------------------------------
// Handlers

async fn health(State(s): State<Shared>, headers: HeaderMap) -> Response {
    let mut body = json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")});
    match s.gateway.agents().await {
        Ok(a) => body["agents"] = json!(a.len()),
        Err(e) => tracing::warn!(error = %e, "health: could not list agents"),
    }
    // Low disk space pauses agents: say so. Paths and agents only to token holders.
    match s.gateway.disk_status().await {
        Ok(Some(disk)) if disk.low => {
            body["status"] = json!("degraded");
            body["disk"] = if s.token_ok(&headers) {
                serde_json::to_value(&disk).unwrap_or_else(|_| json!({"low": true}))
            } else {
                json!({"low": true})
            };
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "health: could not read the disk status"),
    }
    Json(body).into_response()
}

async fn models_health(State(s): State<Shared>) -> ApiResult {
    let health = s.gateway.health().await?;
    Ok(Json(json!({ "models": health })).into_response())
}

/// `GET /api/usage?agent=&since=7d&by=agent|session|model|day` (or `sinceMs=<Unix ms>`).
async fn usage(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    axum::extract::Query(params): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> ApiResult {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, m);
    let mut query = crate::store::UsageQuery {
        agent: params.get("agent").filter(|a| !a.is_empty()).cloned(),
        ..Default::default()
    };
    // Everyone's usage is the owners'; others ask for an agent they see.
    match &query.agent {
        Some(agent) => caller.may(Action::See, agent).map_err(|r| refused(&r))?,
        None => caller.may_administer().map_err(|_| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!("{} may read the usage of one agent at a time: add ?agent=NAME (all agents: owner required)", caller.user),
            )
        })?,
    }
    if let Some(by) = params.get("by").filter(|b| !b.is_empty()) {
        query.by = by.parse().map_err(bad)?;
    }
    if let Some(since) = params.get("since").filter(|v| !v.is_empty()) {
        let back = beige_client::usage::parse_since(since).map_err(bad)?;
        query.since_ms = Some(crate::store::now_ms().saturating_sub(back));
    }
    if let Some(ms) = params.get("sinceMs").filter(|v| !v.is_empty()) {
        query.since_ms = Some(
            ms.parse()
                .map_err(|_| bad(format!("sinceMs must be Unix milliseconds, not '{ms}'")))?,
        );
    }
    Ok(Json(s.gateway.usage(query).await?).into_response())
}

async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI_JSON,
    )
        .into_response()
}

async fn agents(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult {
    let mut agents = s.gateway.agents().await?;
    agents.retain(|a| caller.sees(&a.name));
    Ok(Json(json!({ "agents": agents })).into_response())
}

async fn config(State(s): State<Shared>) -> ApiResult {
    Ok(Json(s.gateway.config_summary().await?).into_response())
}

async fn agent_models(State(s): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let models = s.gateway.models(&name).await?;
    Ok(Json(json!({ "models": models })).into_response())
}

async fn agent_sandbox(State(s): State<Shared>, Path(name): Path<String>) -> ApiResult {
    Ok(Json(s.gateway.sandbox_status(&name).await?).into_response())
}

async fn agent_mcp(State(s): State<Shared>, Path(name): Path<String>) -> ApiResult {
    let servers = s.gateway.mcp_servers(&name).await?;
    Ok(Json(json!({ "servers": servers })).into_response())
}

async fn exec(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let map = json_body(&s, &headers, body).await?;
    let missing = || ApiError::bad_request("Missing tool or params");
    let tool = opt_str(&map, "tool")?.ok_or_else(missing)?;
    let params = match map.get("params") {
        Some(p @ Value::Object(_)) => p.clone(),
        Some(Value::Null) | None => return Err(missing()),
        Some(_) => return Err(ApiError::bad_request("Invalid params: expected an object")),
    };
    let session_key =
        opt_key(&map, "sessionKey")?.unwrap_or_else(|| caller.default_session_key(&name));
    // The model whose image support `read` checks: `activeModel`, else the primary.
    let active = match map.get("activeModel") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            let provider = opt_str(m, "provider")?;
            let model = opt_str(m, "modelId")?.or(opt_str(m, "model")?);
            match (provider, model) {
                (Some(p), Some(m)) => Some(format!("{p}/{m}")),
                _ => {
                    return Err(ApiError::bad_request(
                        "Invalid activeModel: expected {provider, modelId}",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "Invalid activeModel: expected {provider, modelId}",
            ))
        }
    };
    let models = s.gateway.models(&name).await?;
    let (model, images) = match active {
        Some(key) => {
            let images = models
                .iter()
                .find(|m| format!("{}/{}", m.provider, m.model) == key)
                .map(|m| m.info.images)
                .unwrap_or_else(|| {
                    let id = key.split_once('/').map(|(_, m)| m).unwrap_or(&key);
                    crate::llm::catalog::lookup(id, None).images
                });
            (Some(key), images)
        }
        None => match models.first() {
            Some(m) => (Some(format!("{}/{}", m.provider, m.model)), m.info.images),
            None => (None, false),
        },
    };
    let call = CoreToolCall::parse(&tool, params).map_err(|e| ApiError::bad_request(e.message))?;
    let ctx = ToolContext {
        session_key: Some(session_key),
        channel: Some(CHANNEL_NAME.to_string()),
        model,
        model_accepts_images: images,
        // The caller the guard authenticated (never read from the body).
        principal: caller.principal(),
        ..ToolContext::default()
    };
    let out = s.gateway.call_tool(&name, call, ctx).await?;
    Ok(Json(out).into_response())
}

fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/event-stream"))
}

/// One `AgentEvent` as an SSE event: `event: <type>`, `data: <the event as JSON>`.
fn sse_event<T: serde::Serialize>(e: &T) -> Event {
    let value = serde_json::to_value(e).unwrap_or_else(
        |err| json!({"type": "error", "message": format!("could not encode an event: {err}")}),
    );
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message")
        .to_string();
    Event::default().event(kind).data(value.to_string())
}

async fn list_approvals(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let mut list = s
        .gateway
        .approvals(q.get("agent").map(String::as_str))
        .await?;
    list.retain(|a| caller.sees(&a.agent));
    Ok(Json(json!({ "approvals": list })).into_response())
}

async fn get_approval(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    let list = s.gateway.approvals(None).await?;
    match list
        .into_iter()
        .find(|a| a.id == id && caller.sees(&a.agent))
    {
        Some(a) => Ok(Json(a).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no approval request '{id}'"),
        )),
    }
}

async fn decide_approval(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let map = json_body(&s, &headers, body).await?;
    let decision: ApprovalDecision = serde_json::from_value(Value::Object(map)).map_err(|e| {
        ApiError::bad_request(format!(
            "Invalid decision: {e}; send {{\"decision\": \"approve\"|\"deny\", \"scope\": \"once\"|\"session\"|\"duration\"|\"always\", \"callDigest\": \"…\"}}"
        ))
    })?;
    if decision.call_digest.is_none() {
        return Err(ApiError::bad_request(
            "Missing callDigest: quote the request's callDigest (GET /api/approvals/{id}) so the decision is bound to the call you saw",
        ));
    }
    // The gateway checks the caller's role on the request's agent (and that a member
    // decides only their own sessions' requests, once).
    let approval = s
        .gateway
        .decide_approval(&id, decision, caller.principal())
        .await?;
    Ok(Json(approval).into_response())
}

/// The agent an approvals event is about (`None`: not about one agent).
fn approval_event_agent(e: &beige_client::approvals::ApprovalEvent) -> Option<&str> {
    use beige_client::approvals::ApprovalEvent;
    match e {
        ApprovalEvent::ApprovalRequest { approval }
        | ApprovalEvent::ApprovalDecided { approval } => Some(approval.agent.as_str()),
        ApprovalEvent::UnattendedDenied { agent, .. } => Some(agent.as_str()),
    }
}

// ---- people ----

/// `GET /api/whoami`: the caller, how they authenticated, and their role on each agent
/// they see.
async fn whoami(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult {
    let agents = s.gateway.agents().await?;
    let roles: Map<String, Value> = agents
        .iter()
        .filter_map(|a| caller.role_on(&a.name).map(|r| (a.name.clone(), json!(r))))
        .collect();
    Ok(Json(json!({
        "user": caller.user,
        "via": caller.via,
        "tokenId": caller.token_id,
        "owner": caller.may_administer().is_ok(),
        "roles": roles,
    }))
    .into_response())
}

/// `GET /api/tokens[?user=]`: the caller's own tokens; an owner's: everyone's (or one
/// user's).
async fn list_tokens(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let user = match (caller.may_administer().is_ok(), q.get("user")) {
        (true, u) => u.cloned(),
        (false, Some(u)) if *u != caller.user => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "{} may list only their own tokens: owner required for {u}'s",
                    caller.user
                ),
            ))
        }
        (false, _) => Some(caller.user.clone()),
    };
    let tokens = s.gateway.tokens(user.as_deref()).await?;
    Ok(Json(json!({ "tokens": tokens })).into_response())
}

/// `POST /api/tokens` `{user?, name, expiresInSecs?, scope?}`: a new personal token
/// (its secret shown once). Owners make tokens for anyone; others for themselves.
async fn create_token(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let mut map = json_body(&s, &headers, body).await?;
    if !map.contains_key("user") {
        map.insert("user".into(), json!(caller.user));
    }
    let new: beige_client::auth::NewToken = serde_path_to_error::deserialize(Value::Object(map))
        .map_err(|e| {
            ApiError::bad_request(format!(
                "Invalid token request at {}: {}; send {{\"name\": \"laptop\", \"expiresInSecs\": 2592000, \"scope\": {{\"agents\": [\"intern\"], \"maxRole\": \"member\"}}}}",
                e.path(),
                e.inner()
            ))
        })?;
    if new.user != caller.user || caller.is_gateway_owner() {
        caller.may_administer().map_err(|r| refused(&r))?;
    }
    let minted = s.gateway.create_token(new).await?;
    Ok((StatusCode::CREATED, Json(minted)).into_response())
}

/// `DELETE /api/tokens/{id}`: revoke a token (own, or anyone's for an owner).
async fn revoke_token(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult {
    if caller.may_administer().is_err() {
        let own = s.gateway.tokens(Some(&caller.user)).await?;
        if !own.iter().any(|t| t.id == id) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no token '{id}' of {}; list yours with GET /api/tokens",
                    caller.user
                ),
            ));
        }
    }
    Ok(Json(s.gateway.revoke_token(&id).await?).into_response())
}

// ---- schedules ----

/// `GET /api/schedules[?agent=]`.
async fn list_schedules(
    State(s): State<Shared>,
    axum::extract::Query(params): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> ApiResult {
    let agent = params.get("agent").filter(|a| !a.is_empty());
    let schedules = s.gateway.schedules(agent.map(String::as_str)).await?;
    Ok(Json(json!({ "schedules": schedules })).into_response())
}

/// `POST /api/schedules`: the config shape of a schedule, plus `agent`.
async fn add_schedule(State(s): State<Shared>, headers: HeaderMap, body: Body) -> ApiResult {
    let map = json_body(&s, &headers, body).await?;
    let spec: beige_client::schedules::ScheduleSpec =
        serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
            ApiError::bad_request(format!(
                "Invalid schedule at {}: {}; send the config shape of a schedule with its agent, e.g. {{\"agent\": \"assistant\", \"cron\": \"0 8 * * 1-5\", \"tz\": \"Europe/Berlin\", \"prompt\": \"…\"}}",
                e.path(),
                e.inner()
            ))
        })?;
    // Past the token check: the caller holds the API token.
    let author = beige_client::schedules::ScheduleAuthor::principal(&Principal::ApiToken);
    let view = s.gateway.add_schedule(spec, author).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// `GET /api/schedules/{id}`.
async fn get_schedule(State(s): State<Shared>, Path(id): Path<String>) -> ApiResult {
    Ok(Json(s.gateway.schedule(&id).await?).into_response())
}

/// `DELETE /api/schedules/{id}`: cancelled for good; the history is kept.
async fn cancel_schedule(State(s): State<Shared>, Path(id): Path<String>) -> ApiResult {
    Ok(Json(s.gateway.cancel_schedule(&id).await?).into_response())
}

/// `POST /api/schedules/{id}/pause`.
async fn pause_schedule(State(s): State<Shared>, Path(id): Path<String>) -> ApiResult {
    Ok(Json(s.gateway.pause_schedule(&id).await?).into_response())
}

/// `POST /api/schedules/{id}/resume`.
async fn resume_schedule(State(s): State<Shared>, Path(id): Path<String>) -> ApiResult {
    Ok(Json(s.gateway.resume_schedule(&id).await?).into_response())
}

/// `POST /api/schedules/{id}/run`: fire once now; the run goes on in the background.
async fn run_schedule(State(s): State<Shared>, Path(id): Path<String>) -> ApiResult {
    let run = s.gateway.run_schedule_now(&id).await?;
    Ok((StatusCode::ACCEPTED, Json(run)).into_response())
}

/// `GET /api/schedules/{id}/runs[?n=20]`: newest first.
async fn schedule_runs(
    State(s): State<Shared>,
    Path(id): Path<String>,
    axum::extract::Query(params): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> ApiResult {
    let n = match params.get("n").filter(|v| !v.is_empty()) {
        None => 20,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!("n must be a number from 1 to 1000, not '{v}'"))
            })?,
    };
    let runs = s.gateway.schedule_history(&id, n).await?;
    Ok(Json(json!({ "runs": runs })).into_response())
}

/// `GET /metrics`: the gateway's metrics in the OpenMetrics text format, behind the
/// token like every route but health; 501 unless `telemetry.metrics.enabled`.
async fn metrics(State(s): State<Shared>) -> ApiResult {
    let text = s.gateway.metrics().await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// `/mcp/agents/{name}` (POST, GET, DELETE): the agent's tools over MCP's streamable
/// HTTP transport (`mcp::serve`), behind the same checks as every route.
#[cfg(feature = "mcp")]
async fn mcp_endpoint(
    State(s): State<Shared>,
    axum::Extension(person): axum::Extension<Caller>,
    Path(name): Path<String>,
    req: Request,
) -> Response {
    // The guard authenticated the bearer token and checked the operator role on the
    // agent (never read from the body).
    let caller = crate::mcp::serve::McpCaller::of(&person);
    let options = s.mcp_options();
    s.mcp
        .handle(s.gateway.clone(), &name, caller, &options, req)
        .await
}

async fn approval_events(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> ApiResult {
    let stream = s.gateway.approval_events().await?;
    let events = stream
        .filter(move |e| std::future::ready(approval_event_agent(e).is_none_or(|a| caller.sees(a))))
        .map(|e| Ok::<Event, Infallible>(sse_event(&e)));
    let mut r = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response();
    r.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(r)
}

async fn prompt(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let map = json_body(&s, &headers, body).await?;
    let message = req_str(&map, "message", "Missing message")?;
    let key = opt_key(&map, "sessionKey")?.unwrap_or_else(|| caller.default_session_key(&name));
    caller
        .may_use_session(&name, &key)
        .map_err(|r| refused(&r))?;
    let mut request = PromptRequest::new(name, key, message);
    // The caller the guard authenticated (never read from the body).
    request.principal = caller.principal();
    request.idempotency_key = idempotency_key(&headers)?;
    request.channel = opt_key(&map, "channel")?;
    request.chat_id = opt_str(&map, "chatId")?;
    request.thread_id = opt_str(&map, "threadId")?;
    request.wait = match map.get("wait") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("Invalid wait: expected a boolean")),
    };
    // Only an SSE client can see an approval request and answer it: a plain JSON
    // prompt is unattended whatever it says.
    request.approvals = match map.get("approvals") {
        None | Some(Value::Null) => ApprovalMode::None,
        Some(Value::String(m)) if m == "none" => ApprovalMode::None,
        Some(Value::String(m)) if m == "stream" => {
            if wants_sse(&headers) {
                ApprovalMode::Stream
            } else {
                ApprovalMode::None
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "Invalid approvals: expected \"stream\" (answer approval_request events through POST /api/approvals/{id}/decision) or \"none\"",
            ))
        }
    };
    let mut stream = s.gateway.prompt(request).await?;

    if wants_sse(&headers) {
        // Dropping the body (client gone) drops the stream, which cancels the prompt.
        let events = stream.map(|e| Ok::<Event, Infallible>(sse_event(&e)));
        let mut r = Sse::new(events)
            .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
            .into_response();
        r.headers_mut()
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
        return Ok(r);
    }

    while let Some(event) = stream.next().await {
        match event {
            AgentEvent::Done {
                response,
                session_id,
                usage,
            } => {
                return Ok(Json(json!({
                    "response": response,
                    "sessionId": session_id,
                    "usage": usage,
                }))
                .into_response())
            }
            AgentEvent::Blocked { reason } => {
                // The original answered a blocked prompt with the reason as the response.
                return Ok(Json(json!({
                    "response": reason,
                    "blocked": true,
                    "reason": reason,
                }))
                .into_response());
            }
            AgentEvent::Error {
                message,
                kind,
                hint,
            } => {
                let status = if kind == Some(crate::llm::ErrorKind::IdempotencyConflict) {
                    StatusCode::UNPROCESSABLE_ENTITY
                } else if message == "cancelled"
                    || message.starts_with("cancelled ")
                    || message.ends_with("is busy with another prompt")
                {
                    StatusCode::CONFLICT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                let hint = hint.unwrap_or_else(|| {
                    if status == StatusCode::CONFLICT {
                        "The session's prompt was cancelled or is busy; send the message again."
                    } else {
                        "See the gateway log (`beige gateway logs`) for details."
                    }
                    .to_string()
                });
                let mut err = ApiError::new(status, message).with("hint", Value::String(hint));
                if let Some(kind) = kind {
                    err = err.with("kind", json!(kind));
                }
                return Err(err);
            }
            _ => {}
        }
    }
    tracing::error!("a prompt ended without a final event");
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "The prompt ended without an answer; the details are in the gateway log (`beige gateway logs`)",
    ))
}

/// The `Idempotency-Key` header of a prompt, checked: absent is `None`; one that is
/// not 1 to 255 bytes of visible ASCII is a 400.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bad = |why: String| {
        ApiError::bad_request(format!(
            "Invalid Idempotency-Key header: {why}. Send 1 to {} visible ASCII characters, the same for every retry of one message",
            beige_client::prompt::MAX_IDEMPOTENCY_KEY
        ))
    };
    let key = value
        .to_str()
        .map_err(|_| bad("it may only hold visible ASCII characters (no spaces)".into()))?;
    match beige_client::prompt::idempotency_key_problem(key) {
        Some(why) => Err(bad(why)),
        None => Ok(Some(key.to_string())),
    }
}

async fn list_sessions(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult {
    let mut sessions = s.gateway.sessions(&name).await?;
    // Members list their own sessions; viewers (read-only), operators and owners all.
    if caller.may(Action::ReadAllTranscripts, &name).is_err() {
        sessions.retain(|r| caller.owns_session(&name, &r.key));
    }
    Ok(Json(json!({ "sessions": sessions })).into_response())
}

async fn new_session(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let map = json_body(&s, &headers, body).await?;
    let key = opt_key(&map, "sessionKey")?.unwrap_or_else(|| caller.default_session_key(&name));
    caller
        .may_use_session(&name, &key)
        .map_err(|r| refused(&r))?;
    let session = s.gateway.new_session(&name, &key).await?;
    Ok((StatusCode::CREATED, Json(session)).into_response())
}

async fn session_messages(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult {
    if caller.may(Action::ReadAllTranscripts, &name).is_err() {
        // A member reads the transcripts of their own sessions only.
        let own = s
            .gateway
            .sessions(&name)
            .await?
            .iter()
            .any(|r| r.id == id && caller.owns_session(&name, &r.key));
        if !own {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("{} may read only their own sessions of {name}: operator or viewer required for others'", caller.user),
            ));
        }
    }
    let messages = s.gateway.session_messages(&name, &id).await?;
    Ok(Json(json!({ "messages": messages })).into_response())
}

async fn resume_session(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((name, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    caller
        .may_use_session(&name, &key)
        .map_err(|r| refused(&r))?;
    let map = json_body(&s, &headers, body).await?;
    let id = req_str(&map, "sessionId", "Missing sessionId")?;
    let session = s.gateway.resume_session(&name, &key, &id).await?;
    Ok(Json(session).into_response())
}

async fn set_model(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((name, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    caller
        .may_use_session(&name, &key)
        .map_err(|r| refused(&r))?;
    let map = json_body(&s, &headers, body).await?;
    let provider = opt_key(&map, "provider")?;
    let model_id = opt_key(&map, "modelId")?;
    let model = opt_key(&map, "model")?;
    let value = match (provider, model_id.or(model)) {
        (Some(p), Some(m)) => Some(format!("{p}/{m}")),
        (None, Some(m)) if m.contains('/') => Some(m),
        // `{"model": null}` clears the override.
        (None, None) if matches!(map.get("model"), Some(Value::Null)) => None,
        _ => return Err(ApiError::bad_request(
            "Missing provider or modelId (send {provider, modelId} or {model: \"provider/model\"})",
        )),
    };
    let patch = SettingsPatch {
        model_override: Some(value),
        ..SettingsPatch::default()
    };
    let settings = s.gateway.update_settings(&name, &key, patch).await?;
    Ok(Json(json!({"ok": true, "settings": settings})).into_response())
}

async fn get_settings(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((name, key)): Path<(String, String)>,
) -> ApiResult {
    caller
        .may_use_session(&name, &key)
        .map_err(|r| refused(&r))?;
    ensure_agent(&s, &name).await?;
    Ok(Json(s.gateway.settings(&key).await?).into_response())
}

async fn update_settings(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((name, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    caller
        .may_use_session(&name, &key)
        .map_err(|r| refused(&r))?;
    let map = json_body(&s, &headers, body).await?;
    if let Some(unknown) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "verbose" | "streaming" | "modelOverride"))
    {
        return Err(ApiError::bad_request(format!(
            "Unknown field '{unknown}': settings are verbose, streaming and modelOverride"
        )));
    }
    let patch = SettingsPatch {
        verbose: patch_field(&map, "verbose", "a boolean", Value::as_bool)?,
        streaming: patch_field(&map, "streaming", "a boolean", Value::as_bool)?,
        model_override: patch_field(&map, "modelOverride", "\"provider/model\"", |v| {
            v.as_str().map(str::to_string)
        })?,
    };
    Ok(Json(s.gateway.update_settings(&name, &key, patch).await?).into_response())
}

async fn cancel(
    State(s): State<Shared>,
    axum::Extension(caller): axum::Extension<Caller>,
    Path((name, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    caller
        .may_use_session(&name, &key)
        .map_err(|r| refused(&r))?;
    // The body is optional and ignored, but still checked like every body.
    json_body(&s, &headers, body).await?;
    let cancelled = s.gateway.cancel(&name, &key).await?;
    Ok(Json(json!({ "cancelled": cancelled })).into_response())
}

/// `POST /api/agents/{name}/hooks/<hook>`: one route per hook, one handler.
fn hook_route(hook: HookName) -> MethodRouter<Shared> {
    post(
        move |State(s): State<Shared>, Path(name): Path<String>, headers: HeaderMap, body: Body| {
            run_hook(s, name, headers, body, hook)
        },
    )
}

async fn run_hook(
    s: Shared,
    name: String,
    headers: HeaderMap,
    body: Body,
    hook: HookName,
) -> ApiResult {
    let mut map = json_body(&s, &headers, body).await?;
    match hook {
        HookName::PrePrompt => {
            req_str(&map, "message", "Missing message")?;
        }
        HookName::PostResponse if !matches!(map.get("response"), Some(Value::String(_))) => {
            return Err(ApiError::bad_request("Missing response"));
        }
        _ => {}
    }
    let key = opt_key(&map, "sessionKey")?.unwrap_or_else(|| default_key(&name));
    let channel = opt_key(&map, "channel")?
        .unwrap_or_else(|| key.split(':').next().unwrap_or(CHANNEL_NAME).to_string());
    map.insert("sessionKey".into(), Value::String(key));
    map.insert("channel".into(), Value::String(channel));
    // Identity comes from the route.
    map.insert("agentName".into(), Value::String(name.clone()));
    let result = s.gateway.run_hook(&name, hook, Value::Object(map)).await?;
    Ok(match hook {
        HookName::SessionCreated | HookName::SessionDisposed => Json(json!({"ok": true})),
        _ => Json(result),
    }
    .into_response())
}

async fn restart(State(s): State<Shared>, headers: HeaderMap, body: Body) -> ApiResult {
    json_body(&s, &headers, body).await?;
    let Some(hook) = &s.restart else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "This gateway cannot restart itself over the API: it is embedded in another program, not run by `beige gateway start`; restart that program instead",
        ));
    };
    hook();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "status": "restarting",
            "message": "Graceful restart initiated. Follow progress with: beige gateway logs -f",
        })),
    )
        .into_response())
}

// ---------------------------------------------------------------------------------------
// The channel

/// The HTTP API as a [`Channel`]: [`router`] served on a bound TCP listener.
pub struct HttpApiChannel {
    options: ApiOptions,
    listener: Mutex<Option<std::net::TcpListener>>,
    addr: SocketAddr,
}

impl std::fmt::Debug for HttpApiChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpApiChannel")
            .field("addr", &self.addr)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl HttpApiChannel {
    /// Listen on `host:port` (port 0 picks a free one) and return the channel with the
    /// address it listens on. Nothing is served until [`Channel::run`].
    ///
    /// Refuses a non-loopback address when `state.token` is `None` (no authentication).
    /// The bound address is added to the names accepted in `Host`/`Origin`; on a
    /// wildcard address (`0.0.0.0`, `::`) any IP literal is accepted, and other names
    /// must be listed in `state.allowed_hosts`.
    pub fn bind(
        host: &str,
        port: u16,
        options: impl Into<ApiOptions>,
    ) -> Result<(Self, SocketAddr), ChannelError> {
        let options: ApiOptions = options.into();
        let failed = |message: String| ChannelError::Failed {
            channel: CHANNEL_NAME.to_string(),
            message,
        };
        let bare = host.trim().trim_start_matches('[').trim_end_matches(']');
        let shown = if bare.contains(':') {
            format!("[{bare}]:{port}")
        } else {
            format!("{bare}:{port}")
        };
        let mut candidates: Vec<SocketAddr> = (bare, port)
            .to_socket_addrs()
            .map_err(|e| failed(format!("cannot resolve gateway.host '{host}': {e}")))?
            .collect();
        if candidates.is_empty() {
            return Err(failed(format!(
                "gateway.host '{host}' resolves to no address"
            )));
        }
        // `localhost` resolves to both families; clients mostly try IPv4 first.
        candidates.sort_by_key(|a| a.is_ipv6());
        let loopback = candidates.iter().all(|a| a.ip().is_loopback());
        if !loopback && options.token.is_none() {
            return Err(failed(format!(
                "refusing to listen on {shown} without authentication: anyone who can reach that address could prompt your agents and run commands in their sandboxes. Turn gateway.auth back on (the default), or set gateway.host to 127.0.0.1"
            )));
        }
        let listener = std::net::TcpListener::bind(&candidates[..]).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                failed(format!(
                    "cannot listen on {shown}: the address is already in use; another gateway is probably running (`beige gateway status`), or change gateway.port"
                ))
            } else {
                failed(format!("cannot listen on {shown}: {e}"))
            }
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| failed(format!("cannot configure the listener on {shown}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| failed(format!("cannot read the address of {shown}: {e}")))?;
        let mut options = options;
        options.port = Some(addr.port());
        if addr.ip().is_unspecified() {
            options.allow_ip_hosts = true;
        } else if !addr.ip().is_loopback() {
            options.allowed_hosts.push(bare.to_string());
            options.allowed_hosts.push(addr.ip().to_string());
        }
        Ok((
            Self {
                options,
                listener: Mutex::new(Some(listener)),
                addr,
            },
            addr,
        ))
    }

    /// The address the channel listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

#[async_trait]
impl Channel for HttpApiChannel {
    fn name(&self) -> &str {
        CHANNEL_NAME
    }

    /// Serve the API with `gateway` until `shutdown` fires, then give open requests
    /// (SSE streams included) a few seconds to finish. Runs once per `bind`.
    async fn run(&self, ctx: ChannelContext) -> Result<(), ChannelError> {
        let ChannelContext {
            gateway,
            reload,
            shutdown,
            ..
        } = ctx;
        let failed = |message: String| ChannelError::Failed {
            channel: CHANNEL_NAME.to_string(),
            message,
        };
        let std_listener = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                failed("the HTTP API is already running (bind again to serve twice)".into())
            })?;
        let listener = tokio::net::TcpListener::from_std(std_listener)
            .map_err(|e| failed(format!("cannot use the listener on {}: {e}", self.addr)))?;
        let mut state = self.options.clone().with_gateway(gateway);
        if let (None, Some(reload)) = (&state.restart, reload) {
            state.restart = Some(Arc::new(move || reload.request()));
        }
        let extra = self
            .options
            .extra_routes
            .as_ref()
            .map(|build| build(&state));
        let mut app = router(state);
        if let Some(extra) = extra {
            app = app.merge(extra);
        }
        tracing::info!(addr = %self.addr, "HTTP API listening");
        let stop = shutdown.clone();
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let serve = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .into_future();
        tokio::select! {
            r = serve => r.map_err(|e| failed(format!("serving on {} failed: {e}", self.addr))),
            _ = async {
                shutdown.cancelled().await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {
                tracing::warn!("HTTP API: requests still open {SHUTDOWN_GRACE:?} after shutdown; closing them");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ports_split() {
        assert_eq!(
            split_host_port("localhost:7433"),
            ("localhost".into(), Some(7433))
        );
        assert_eq!(split_host_port("[::1]:80"), ("::1".into(), Some(80)));
        assert_eq!(split_host_port("[::1]"), ("::1".into(), None));
        assert_eq!(
            split_host_port("Example.COM."),
            ("example.com".into(), None)
        );
        assert_eq!(split_host_port("::1"), ("::1".into(), None));
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
