//! [`RemoteGateway`]: the [`Gateway`] trait over the HTTP API of a running gateway — what
//! the CLI, the TUI and out-of-process channels use (feature `remote`).
//!
//! Owns the client side of the `/api/*` contract (see beige-core's `channel::http` for
//! the server side): building URLs with percent-encoded path segments (session keys contain `:` and
//! may contain `/`), the bearer token, reading prompts as SSE through `eventsource-stream`
//! with an idle timeout, and turning HTTP errors back into typed [`GatewayError`]s. It
//! keeps no state besides the connection pool; everything lives in the gateway.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::{Stream, StreamExt};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::error::GatewayError;
use crate::events::AgentEvent;
use crate::gateway::{Admin, AgentEventStream, AgentInfo, AllowedModel, Gateway, Sessions};
use crate::home::BeigeHome;
use crate::hooks::HookName;
use crate::llm::{Message, ModelInfo, ThinkingLevel};
use crate::prompt::PromptRequest;
use crate::schedules::{ScheduleAuthor, ScheduleRun, ScheduleSpec, ScheduleView};
use crate::session::{SessionRecord, SessionSettings, SettingsPatch};
use crate::status::{ModelHealth, SandboxStatus};
use crate::tools::{CoreToolCall, InvalidCall, ToolContext, ToolOutput};
use crate::usage::{UsageQuery, UsageReport};

/// Where a gateway listens when nothing else is configured.
pub const DEFAULT_GATEWAY_URL: &str = "http://127.0.0.1:7433";

/// How long to wait for a TCP connection to the gateway.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time limit of a quick request (listings, settings, sessions).
const QUICK_TIMEOUT: Duration = Duration::from_secs(30);

/// Time limit of a hook request (a chain of handlers, each limited by the gateway).
const HOOK_TIMEOUT: Duration = Duration::from_secs(120);

/// No byte (event or keep-alive) on a prompt stream for this long: the connection is
/// considered lost. The gateway sends a keep-alive every 15 seconds.
const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The most of an error body that is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A [`Gateway`] reached over HTTP. Cheap to clone.
#[derive(Clone)]
pub struct RemoteGateway {
    base: Url,
    token: Option<String>,
    client: reqwest::Client,
}

impl std::fmt::Debug for RemoteGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteGateway")
            .field("base", &self.base.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// What to put into a typed error when the gateway answers with one.
#[derive(Default)]
struct ErrCtx<'a> {
    agent: Option<&'a str>,
    session: Option<&'a str>,
    model: Option<&'a str>,
    tool: Option<&'a str>,
}

impl<'a> ErrCtx<'a> {
    fn agent(agent: &'a str) -> Self {
        Self {
            agent: Some(agent),
            ..Self::default()
        }
    }
}

/// `AgentInfo` as it arrives (the gateway type only serializes).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireAgent {
    name: String,
    model: String,
    #[serde(default)]
    fallback_models: Vec<String>,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    skills: Vec<String>,
    #[serde(default)]
    workspace_dir: PathBuf,
    #[serde(default)]
    tool_context: String,
    #[serde(default)]
    skill_context: String,
}

impl From<WireAgent> for AgentInfo {
    fn from(a: WireAgent) -> Self {
        AgentInfo {
            name: a.name,
            model: a.model,
            fallback_models: a.fallback_models,
            tools: a.tools,
            skills: a.skills,
            workspace_dir: a.workspace_dir,
            tool_context: a.tool_context,
            skill_context: a.skill_context,
        }
    }
}

/// `AllowedModel` as it arrives.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireModel {
    provider: String,
    model: String,
    role: String,
    #[serde(default)]
    thinking_level: ThinkingLevel,
    #[serde(flatten)]
    info: ModelInfo,
    #[serde(default)]
    health: Option<ModelHealth>,
}

impl From<WireModel> for AllowedModel {
    fn from(m: WireModel) -> Self {
        AllowedModel {
            provider: m.provider,
            model: m.model,
            role: m.role,
            thinking_level: m.thinking_level,
            info: m.info,
            health: m.health,
        }
    }
}

impl RemoteGateway {
    /// A client for the gateway at `base_url` (`http://127.0.0.1:7433`; a path prefix is
    /// kept, for a gateway behind a reverse proxy). `token` is the bearer token (`None`
    /// when the gateway runs without authentication). Makes no request.
    pub fn new(base_url: &str, token: Option<String>) -> Result<Self, GatewayError> {
        let setup = |message: String| GatewayError::RemoteSetup {
            url: base_url.to_string(),
            message,
        };
        let trimmed = base_url.trim();
        let with_scheme = if trimmed.contains("://") {
            trimmed.to_string()
        } else {
            format!("http://{trimmed}")
        };
        let base = Url::parse(&with_scheme).map_err(|e| setup(format!("invalid URL: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(setup("the gateway URL must be http:// or https://".into()));
        }
        let loopback = base.host_str().is_some_and(|h| {
            let h = h.trim_start_matches('[').trim_end_matches(']');
            h.eq_ignore_ascii_case("localhost")
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("beige/", env!("CARGO_PKG_VERSION")));
        if loopback {
            // A proxy from the environment must never see the local gateway's token.
            builder = builder.no_proxy();
        }
        let client = builder
            .build()
            .map_err(|e| setup(format!("cannot build the HTTP client: {e}")))?;
        let token = token
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        Ok(Self {
            base,
            token,
            client,
        })
    }

    /// A client for the gateway of `home`: `url` if given, else the `gateway.host` and
    /// `gateway.port` of the home's `config.json5` (default `127.0.0.1:7433`), with the
    /// token from `BEIGE_HOME/gateway.token` (none when the file does not exist).
    pub fn from_home(home: &BeigeHome, url: Option<&str>) -> Result<Self, GatewayError> {
        let url = match url {
            Some(u) => u.to_string(),
            None => url_from_config(home),
        };
        let path = home.token_path();
        let token = match std::fs::read_to_string(&path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(GatewayError::RemoteSetup {
                    url,
                    message: format!(
                        "cannot read the API token {}: {e}; check its permissions (it belongs to the user running the gateway)",
                        path.display()
                    ),
                })
            }
        };
        Self::new(&url, token)
    }

    /// The gateway's base URL.
    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    /// `GET /api/health`: `{"status":"ok","version":…,"agents":n}`. Needs no token, so
    /// it tells "not running" apart from "wrong token".
    pub async fn status(&self) -> Result<Value, GatewayError> {
        self.call(
            Method::GET,
            &["api", "health"],
            None,
            Some(QUICK_TIMEOUT),
            ErrCtx::default(),
        )
        .await
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn unreachable(&self, e: &reqwest::Error) -> GatewayError {
        // The root cause ("Connection refused (os error 111)") says it best.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message = s.to_string();
            source = s.source();
        }
        if e.is_timeout() {
            message = "it did not answer in time".to_string();
        }
        GatewayError::Unreachable {
            url: self.base.as_str().trim_end_matches('/').to_string(),
            message,
        }
    }

    fn request(&self, method: Method, segments: &[&str]) -> reqwest::RequestBuilder {
        let b = self.client.request(method, self.url(segments));
        match &self.token {
            Some(t) => b.bearer_auth(t),
            None => b,
        }
    }

    /// Send a request and return the JSON answer, or the typed error.
    async fn call(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<Value>,
        timeout: Option<Duration>,
        ctx: ErrCtx<'_>,
    ) -> Result<Value, GatewayError> {
        let mut b = self.request(method, segments);
        if let Some(body) = &body {
            b = b.json(body);
        }
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        let response = b.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.error_from(response, ctx).await);
        }
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| GatewayError::Remote {
            status: status.as_u16(),
            message: format!("the gateway's answer is not JSON: {e}"),
        })
    }

    async fn call_as<T: DeserializeOwned>(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<Value>,
        timeout: Option<Duration>,
        ctx: ErrCtx<'_>,
    ) -> Result<T, GatewayError> {
        let value = self.call(method, segments, body, timeout, ctx).await?;
        decode(value)
    }

    /// `GET url` with the token, decoded as JSON.
    async fn get_url(&self, url: Url, ctx: ErrCtx<'_>) -> Result<Value, GatewayError> {
        let mut b = self.client.get(url).timeout(QUICK_TIMEOUT);
        if let Some(t) = &self.token {
            b = b.bearer_auth(t);
        }
        let response = b.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.error_from(response, ctx).await);
        }
        response.json().await.map_err(|e| GatewayError::Remote {
            status: status.as_u16(),
            message: format!("the gateway's answer is unreadable: {e}"),
        })
    }

    /// `METHOD /api/schedules/{id}[/action]`, answered with the schedule.
    async fn schedule_call(
        &self,
        method: Method,
        id: &str,
        action: Option<&str>,
    ) -> Result<ScheduleView, GatewayError> {
        let mut segments = vec!["api", "schedules", id];
        segments.extend(action);
        self.call_as(
            method,
            &segments,
            None,
            Some(QUICK_TIMEOUT),
            ErrCtx::default(),
        )
        .await
        .map_err(|e| schedule_error(id, e))
    }

    /// Turn an error answer into the [`GatewayError`] the local gateway would have
    /// returned, using what the caller knows (agent, session, model, tool).
    async fn error_from(&self, response: reqwest::Response, ctx: ErrCtx<'_>) -> GatewayError {
        let status = response.status();
        let bytes = response.bytes().await.unwrap_or_default();
        let bytes = &bytes[..bytes.len().min(MAX_ERROR_BODY)];
        let message = serde_json::from_slice::<Value>(bytes)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| {
                let text = String::from_utf8_lossy(bytes).trim().to_string();
                if text.is_empty() {
                    status.canonical_reason().unwrap_or("error").to_string()
                } else {
                    text
                }
            });
        match status {
            StatusCode::NOT_FOUND => {
                if let Some(agent) = message.strip_prefix("Unknown agent: ") {
                    let known = match self.agents_plain().await {
                        Ok(list) => list.join(", "),
                        Err(_) => "(could not list them)".to_string(),
                    };
                    return GatewayError::UnknownAgent {
                        agent: agent.to_string(),
                        known,
                    };
                }
                if let (Some(agent), Some(session), true) =
                    (ctx.agent, ctx.session, message.starts_with("no session "))
                {
                    return GatewayError::UnknownSession {
                        agent: agent.to_string(),
                        session: session.to_string(),
                    };
                }
            }
            StatusCode::FORBIDDEN => {
                if let (Some(agent), Some(model), true) =
                    (ctx.agent, ctx.model, message.starts_with("Model "))
                {
                    let allowed = match self.models(agent).await {
                        Ok(list) => list
                            .iter()
                            .map(|m| format!("{}/{}", m.provider, m.model))
                            .collect::<Vec<_>>()
                            .join(", "),
                        Err(_) => "(could not list them)".to_string(),
                    };
                    return GatewayError::ModelNotAllowed {
                        agent: agent.to_string(),
                        requested: model.to_string(),
                        allowed,
                    };
                }
            }
            StatusCode::BAD_REQUEST => {
                if let Some(tool) = ctx.tool {
                    return GatewayError::InvalidCall(InvalidCall {
                        tool: tool.to_string(),
                        message,
                    });
                }
            }
            _ => {}
        }
        GatewayError::Remote {
            status: status.as_u16(),
            message,
        }
    }

    /// Agent names, for error messages (boxed: error mapping calls it from `call`).
    fn agents_plain(&self) -> BoxFuture<'_, Result<Vec<String>, GatewayError>> {
        async move {
            let v = self
                .call(
                    Method::GET,
                    &["api", "agents"],
                    None,
                    Some(QUICK_TIMEOUT),
                    ErrCtx::default(),
                )
                .await?;
            Ok(v.get("agents")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.get("name").and_then(Value::as_str))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default())
        }
        .boxed()
    }
}

/// Decode a JSON answer into the expected type.
fn decode<T: DeserializeOwned>(value: Value) -> Result<T, GatewayError> {
    serde_json::from_value(value).map_err(|e| GatewayError::Remote {
        status: 200,
        message: format!("unexpected answer from the gateway (a different beige version?): {e}"),
    })
}

/// A field of an answer object, decoded.
fn field<T: DeserializeOwned>(mut value: Value, name: &str) -> Result<T, GatewayError> {
    match value.get_mut(name).map(Value::take) {
        Some(v) => decode(v),
        None => Err(GatewayError::Remote {
            status: 200,
            message: format!(
                "unexpected answer from the gateway: no '{name}' field (a different beige version?)"
            ),
        }),
    }
}

/// The URL of the gateway configured in the home's `config.json5`, read leniently (no
/// interpolation, no validation): the default when anything is missing.
fn url_from_config(home: &BeigeHome) -> String {
    let Ok(text) = std::fs::read_to_string(home.config_path()) else {
        return DEFAULT_GATEWAY_URL.to_string();
    };
    let Ok(config) = json5::from_str::<Value>(&text) else {
        return DEFAULT_GATEWAY_URL.to_string();
    };
    let gateway = config.get("gateway");
    let host = gateway
        .and_then(|g| g.get("host"))
        .and_then(Value::as_str)
        .filter(|h| !h.contains("${") && !h.trim().is_empty())
        .unwrap_or("127.0.0.1");
    let port = gateway
        .and_then(|g| g.get("port"))
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(7433);
    let host = host.trim().trim_start_matches('[').trim_end_matches(']');
    let host = match host {
        "0.0.0.0" => "127.0.0.1".to_string(),
        "::" => "[::1]".to_string(),
        h if h.contains(':') => format!("[{h}]"),
        h => h.to_string(),
    };
    format!("http://{host}:{port}")
}

/// The kebab-case route segment of a hook channels may trigger.
fn hook_segment(hook: HookName) -> Option<&'static str> {
    Some(match hook {
        HookName::PrePrompt => "pre-prompt",
        HookName::PostResponse => "post-response",
        HookName::SessionCreated => "session-created",
        HookName::SessionDisposed => "session-disposed",
        _ => return None,
    })
}

/// A byte stream that fails when no chunk arrives for `idle`.
fn with_idle_timeout<S>(
    stream: S,
    idle: Duration,
) -> impl Stream<Item = Result<bytes::Bytes, String>> + Send
where
    S: Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Send + 'static,
{
    futures_util::stream::unfold(Some(Box::pin(stream)), move |state| async move {
        let mut s = state?;
        match tokio::time::timeout(idle, s.next()).await {
            Ok(Some(Ok(b))) => Some((Ok(b), Some(s))),
            Ok(Some(Err(e))) => Some((Err(e.to_string()), None)),
            Ok(None) => None,
            Err(_) => Some((
                Err(format!("nothing received for {} seconds", idle.as_secs())),
                None,
            )),
        }
    })
}

/// Forward the SSE events of a prompt answer until the end, the cancel token or a
/// dropped receiver. Returning drops the response, which closes the connection; the
/// gateway then cancels the prompt.
async fn pump(
    response: reqwest::Response,
    tx: tokio::sync::mpsc::UnboundedSender<AgentEvent>,
    cancel: CancellationToken,
) {
    let mut events =
        Box::pin(with_idle_timeout(response.bytes_stream(), STREAM_IDLE_TIMEOUT).eventsource());
    let mut finished = false;
    let lost = |why: String| {
        AgentEvent::Error {
        message: format!("lost the connection to the gateway: {why}"),
        kind: None,
        hint: Some(
            "Check that the gateway is still running (`beige gateway status`) and send the message again."
                .into(),
        ),
    }
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tx.closed() => return,
            next = events.next() => match next {
                Some(Ok(ev)) => match serde_json::from_str::<AgentEvent>(&ev.data) {
                    Ok(e) => {
                        finished |= e.is_terminal();
                        if tx.send(e).is_err() {
                            return;
                        }
                    }
                    Err(err) => {
                        tracing::debug!(event = %ev.event, error = %err, "skipping an unknown event from the gateway");
                    }
                },
                Some(Err(e)) => {
                    if !finished {
                        let _ = tx.send(lost(e.to_string()));
                    }
                    return;
                }
                None => {
                    if !finished {
                        let _ = tx.send(lost("the stream ended before the prompt finished".into()));
                    }
                    return;
                }
            }
        }
    }
}

#[async_trait]
impl Gateway for RemoteGateway {
    async fn agents(&self) -> Result<Vec<AgentInfo>, GatewayError> {
        let v = self
            .call(
                Method::GET,
                &["api", "agents"],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx::default(),
            )
            .await?;
        let list: Vec<WireAgent> = field(v, "agents")?;
        Ok(list.into_iter().map(AgentInfo::from).collect())
    }

    async fn call_tool(
        &self,
        agent: &str,
        call: CoreToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, GatewayError> {
        let tool = call.name();
        let mut body = json!({"tool": tool, "params": call.params()});
        if let Some(key) = &ctx.session_key {
            body["sessionKey"] = json!(key);
        }
        if let Some((provider, model)) = ctx.model.as_deref().and_then(|m| m.split_once('/')) {
            body["activeModel"] = json!({"provider": provider, "modelId": model});
        }
        // No time limit: an `exec` runs as long as its own timeout allows.
        self.call_as(
            Method::POST,
            &["api", "agents", agent, "exec"],
            Some(body),
            None,
            ErrCtx {
                agent: Some(agent),
                tool: Some(tool),
                ..ErrCtx::default()
            },
        )
        .await
    }

    async fn prompt(&self, request: PromptRequest) -> Result<AgentEventStream, GatewayError> {
        let mut body = json!({
            "message": request.message,
            "sessionKey": request.session_key,
            "wait": request.wait,
        });
        if let Some(c) = &request.channel {
            body["channel"] = json!(c);
        }
        if let Some(c) = &request.chat_id {
            body["chatId"] = json!(c);
        }
        if let Some(t) = &request.thread_id {
            body["threadId"] = json!(t);
        }
        if request.approvals == crate::approvals::ApprovalMode::Stream {
            body["approvals"] = json!("stream");
        }
        let mut http = self
            .request(Method::POST, &["api", "agents", &request.agent, "prompt"])
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(key) = &request.idempotency_key {
            http = http.header("idempotency-key", key);
        }
        let response = http
            .json(&body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if !response.status().is_success() {
            return Err(self
                .error_from(response, ErrCtx::agent(&request.agent))
                .await);
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        tokio::spawn(pump(response, tx, cancel.clone()));
        Ok(AgentEventStream::new(rx, cancel))
    }

    async fn cancel(&self, agent: &str, session_key: &str) -> Result<bool, GatewayError> {
        let v = self
            .call(
                Method::POST,
                &["api", "agents", agent, "sessions", session_key, "cancel"],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx::agent(agent),
            )
            .await?;
        field(v, "cancelled")
    }
}

#[async_trait]
impl Sessions for RemoteGateway {
    async fn sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, GatewayError> {
        let v = self
            .call(
                Method::GET,
                &["api", "agents", agent, "sessions"],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx::agent(agent),
            )
            .await?;
        field(v, "sessions")
    }

    async fn new_session(
        &self,
        agent: &str,
        session_key: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.call_as(
            Method::POST,
            &["api", "agents", agent, "sessions"],
            Some(json!({"sessionKey": session_key})),
            Some(HOOK_TIMEOUT),
            ErrCtx::agent(agent),
        )
        .await
    }

    async fn resume_session(
        &self,
        agent: &str,
        session_key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, GatewayError> {
        self.call_as(
            Method::POST,
            &["api", "agents", agent, "sessions", session_key, "resume"],
            Some(json!({"sessionId": session_id})),
            Some(QUICK_TIMEOUT),
            ErrCtx {
                agent: Some(agent),
                session: Some(session_id),
                ..ErrCtx::default()
            },
        )
        .await
    }

    async fn session_messages(
        &self,
        agent: &str,
        session_id: &str,
    ) -> Result<Vec<Message>, GatewayError> {
        let v = self
            .call(
                Method::GET,
                &["api", "agents", agent, "sessions", session_id, "messages"],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx {
                    agent: Some(agent),
                    session: Some(session_id),
                    ..ErrCtx::default()
                },
            )
            .await?;
        field(v, "messages")
    }

    /// Settings belong to a session key, but the route names an agent: the key's second
    /// segment when it names one (`api:<agent>:…`), else the first agent.
    async fn settings(&self, session_key: &str) -> Result<SessionSettings, GatewayError> {
        let agents = self.agents_plain().await?;
        let from_key = session_key.split(':').nth(1);
        let agent = from_key
            .and_then(|a| agents.iter().find(|x| x.as_str() == a))
            .or_else(|| agents.first())
            .ok_or_else(|| GatewayError::Remote {
                status: 404,
                message: "the gateway has no agents".into(),
            })?;
        self.call_as(
            Method::GET,
            &["api", "agents", agent, "sessions", session_key, "settings"],
            None,
            Some(QUICK_TIMEOUT),
            ErrCtx::agent(agent),
        )
        .await
    }

    async fn update_settings(
        &self,
        agent: &str,
        session_key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, GatewayError> {
        let mut body = serde_json::Map::new();
        if let Some(v) = patch.verbose {
            body.insert("verbose".into(), json!(v));
        }
        if let Some(v) = patch.streaming {
            body.insert("streaming".into(), json!(v));
        }
        if let Some(v) = &patch.model_override {
            body.insert("modelOverride".into(), json!(v));
        }
        self.call_as(
            Method::PATCH,
            &["api", "agents", agent, "sessions", session_key, "settings"],
            Some(Value::Object(body)),
            Some(QUICK_TIMEOUT),
            ErrCtx {
                agent: Some(agent),
                model: patch.model_override.as_ref().and_then(|m| m.as_deref()),
                ..ErrCtx::default()
            },
        )
        .await
    }
}

#[async_trait]
impl Admin for RemoteGateway {
    async fn approvals(
        &self,
        agent: Option<&str>,
    ) -> Result<Vec<crate::approvals::Approval>, GatewayError> {
        let v = self
            .call(
                Method::GET,
                &["api", "approvals"],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx::default(),
            )
            .await?;
        let list: Vec<crate::approvals::Approval> = field(v, "approvals")?;
        Ok(list
            .into_iter()
            .filter(|a| agent.is_none_or(|x| a.agent == x))
            .collect())
    }

    /// The gateway takes the approver from this client's token; `_approver` is not sent.
    async fn decide_approval(
        &self,
        id: &str,
        decision: crate::approvals::ApprovalDecision,
        _approver: crate::principal::Principal,
    ) -> Result<crate::approvals::Approval, GatewayError> {
        let mut decision = decision;
        if decision.call_digest.is_none() {
            // Bind the decision to the call this client can see now.
            let current = self.approvals(None).await?;
            decision.call_digest = current
                .into_iter()
                .find(|a| a.id == id)
                .map(|a| a.call_digest);
        }
        let body = serde_json::to_value(&decision).map_err(|e| GatewayError::Remote {
            status: 0,
            message: e.to_string(),
        })?;
        let v = self
            .call(
                Method::POST,
                &["api", "approvals", id, "decision"],
                Some(body),
                Some(QUICK_TIMEOUT),
                ErrCtx::default(),
            )
            .await?;
        serde_json::from_value(v).map_err(|e| GatewayError::Remote {
            status: 200,
            message: format!("unexpected approval reply: {e}"),
        })
    }

    async fn health(&self) -> Result<HashMap<String, ModelHealth>, GatewayError> {
        let v = self
            .call(
                Method::GET,
                &["api", "health", "models"],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx::default(),
            )
            .await?;
        field(v, "models")
    }

    async fn models(&self, agent: &str) -> Result<Vec<AllowedModel>, GatewayError> {
        let v = self
            .call(
                Method::GET,
                &["api", "agents", agent, "models"],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx::agent(agent),
            )
            .await?;
        let list: Vec<WireModel> = field(v, "models")?;
        Ok(list.into_iter().map(AllowedModel::from).collect())
    }

    async fn mcp_servers(&self, agent: &str) -> Result<Vec<crate::McpServerView>, GatewayError> {
        // Not quick: servers that are not running are started for their lists.
        let v = self
            .call(
                Method::GET,
                &["api", "agents", agent, "mcp"],
                None,
                None,
                ErrCtx::agent(agent),
            )
            .await?;
        field(v, "servers")
    }

    async fn create_token(
        &self,
        new: crate::auth::NewToken,
    ) -> Result<crate::auth::MintedToken, GatewayError> {
        let body = serde_json::to_value(&new).map_err(|e| GatewayError::Remote {
            status: 0,
            message: format!("could not encode the token request: {e}"),
        })?;
        let v = self
            .call(
                Method::POST,
                &["api", "tokens"],
                Some(body),
                Some(QUICK_TIMEOUT),
                ErrCtx::default(),
            )
            .await?;
        decode(v)
    }

    async fn tokens(
        &self,
        user: Option<&str>,
    ) -> Result<Vec<crate::auth::TokenInfo>, GatewayError> {
        let mut url = self.url(&["api", "tokens"]);
        if let Some(u) = user {
            url.query_pairs_mut().append_pair("user", u);
        }
        let v = self.get_url(url, ErrCtx::default()).await?;
        field(v, "tokens")
    }

    async fn revoke_token(&self, id: &str) -> Result<crate::auth::TokenInfo, GatewayError> {
        let v = self
            .call(
                Method::DELETE,
                &["api", "tokens", id],
                None,
                Some(QUICK_TIMEOUT),
                ErrCtx::default(),
            )
            .await?;
        decode(v)
    }

    async fn config_summary(&self) -> Result<Value, GatewayError> {
        self.call(
            Method::GET,
            &["api", "config"],
            None,
            Some(QUICK_TIMEOUT),
            ErrCtx::default(),
        )
        .await
    }

    async fn run_hook(
        &self,
        agent: &str,
        hook: HookName,
        event: Value,
    ) -> Result<Value, GatewayError> {
        let Some(segment) = hook_segment(hook) else {
            return Err(GatewayError::HookNotTriggerable { hook });
        };
        let v = self
            .call(
                Method::POST,
                &["api", "agents", agent, "hooks", segment],
                Some(event),
                Some(HOOK_TIMEOUT),
                ErrCtx::agent(agent),
            )
            .await?;
        // Observers answer `{"ok": true}` over HTTP and `{}` in process.
        Ok(match hook {
            HookName::SessionCreated | HookName::SessionDisposed => json!({}),
            _ => v,
        })
    }

    async fn sandbox_status(&self, agent: &str) -> Result<SandboxStatus, GatewayError> {
        // Quick: the gateway waits at most a few seconds for the keepalive round trip.
        self.call_as(
            Method::GET,
            &["api", "agents", agent, "sandbox"],
            None,
            Some(QUICK_TIMEOUT),
            ErrCtx::agent(agent),
        )
        .await
    }

    async fn usage(&self, query: UsageQuery) -> Result<UsageReport, GatewayError> {
        let mut url = self.url(&["api", "usage"]);
        {
            let mut q = url.query_pairs_mut();
            if let Some(a) = &query.agent {
                q.append_pair("agent", a);
            }
            if let Some(since) = query.since_ms {
                q.append_pair("sinceMs", &since.to_string());
            }
            q.append_pair("by", query.by.as_str());
        }
        let mut b = self.client.get(url).timeout(QUICK_TIMEOUT);
        if let Some(t) = &self.token {
            b = b.bearer_auth(t);
        }
        let response = b.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.error_from(response, ErrCtx::default()).await);
        }
        response.json().await.map_err(|e| GatewayError::Remote {
            status: status.as_u16(),
            message: format!("the gateway's usage answer is unreadable: {e}"),
        })
    }

    async fn add_schedule(
        &self,
        spec: ScheduleSpec,
        _author: ScheduleAuthor,
    ) -> Result<ScheduleView, GatewayError> {
        // The gateway takes the author from the token, never from the request.
        let body = serde_json::to_value(&spec).map_err(|e| GatewayError::InvalidSchedule {
            message: format!("the schedule cannot be sent: {e}"),
        })?;
        self.call_as(
            Method::POST,
            &["api", "schedules"],
            Some(body),
            Some(QUICK_TIMEOUT),
            ErrCtx::default(),
        )
        .await
        .map_err(|e| schedule_error("", e))
    }

    async fn schedules(&self, agent: Option<&str>) -> Result<Vec<ScheduleView>, GatewayError> {
        let mut url = self.url(&["api", "schedules"]);
        if let Some(a) = agent {
            url.query_pairs_mut().append_pair("agent", a);
        }
        let v: Value = self.get_url(url, ErrCtx::default()).await?;
        decode(v.get("schedules").cloned().unwrap_or(Value::Null))
    }

    async fn schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        self.schedule_call(Method::GET, id, None).await
    }

    async fn pause_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        self.schedule_call(Method::POST, id, Some("pause")).await
    }

    async fn resume_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        self.schedule_call(Method::POST, id, Some("resume")).await
    }

    async fn cancel_schedule(&self, id: &str) -> Result<ScheduleView, GatewayError> {
        self.schedule_call(Method::DELETE, id, None).await
    }

    async fn schedule_history(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Vec<ScheduleRun>, GatewayError> {
        let mut url = self.url(&["api", "schedules", id, "runs"]);
        url.query_pairs_mut().append_pair("n", &limit.to_string());
        let v: Value = self
            .get_url(url, ErrCtx::default())
            .await
            .map_err(|e| schedule_error(id, e))?;
        decode(v.get("runs").cloned().unwrap_or(Value::Null))
    }

    async fn run_schedule_now(&self, id: &str) -> Result<ScheduleRun, GatewayError> {
        self.call_as(
            Method::POST,
            &["api", "schedules", id, "run"],
            None,
            Some(QUICK_TIMEOUT),
            ErrCtx::default(),
        )
        .await
        .map_err(|e| schedule_error(id, e))
    }
}

/// The schedule errors of the local gateway, from an HTTP answer about schedule `id`.
fn schedule_error(id: &str, e: GatewayError) -> GatewayError {
    match e {
        GatewayError::Remote {
            status: 404,
            message,
        } if message.starts_with("no schedule") => {
            GatewayError::UnknownSchedule { id: id.to_string() }
        }
        GatewayError::Remote {
            status: 400,
            message,
        } => GatewayError::InvalidSchedule { message },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        let g = RemoteGateway::new("http://127.0.0.1:7433/", None).unwrap();
        let u = g.url(&["api", "agents", "a", "sessions", "tg:42/7 x", "settings"]);
        assert_eq!(
            u.as_str(),
            "http://127.0.0.1:7433/api/agents/a/sessions/tg:42%2F7%20x/settings"
        );
        let g = RemoteGateway::new("https://proxy.example/beige", None).unwrap();
        assert_eq!(
            g.url(&["api", "health"]).as_str(),
            "https://proxy.example/beige/api/health"
        );
    }

    #[test]
    fn bad_urls_are_refused() {
        assert!(matches!(
            RemoteGateway::new("ftp://x", None),
            Err(GatewayError::RemoteSetup { .. })
        ));
        assert!(RemoteGateway::new("127.0.0.1:7433", None).is_ok());
    }

    #[test]
    fn url_from_a_config() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path());
        assert_eq!(url_from_config(&home), DEFAULT_GATEWAY_URL);
        std::fs::write(
            home.config_path(),
            "{gateway: {host: '0.0.0.0', port: 8123}, // comment\n}",
        )
        .unwrap();
        assert_eq!(url_from_config(&home), "http://127.0.0.1:8123");
    }
}
