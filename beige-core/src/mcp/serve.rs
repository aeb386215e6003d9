//! beige as an MCP server (`spec/mcp.md` §2): an agent's tools served to outside MCP
//! clients (Claude Code, Codex, editors) at `/mcp/agents/{name}` on the gateway's port.
//!
//! Owns the hand-written rmcp [`ServerHandler`] over one agent's tools ([`AgentServer`]:
//! the four core tools with the schemas the model sees, and the plugin tools the agent
//! may use, as `{args: string[], stdin?: string}`), the streamable-HTTP services mounted
//! on the API router ([`McpEndpoint`], one per agent, sessions bound to the principal
//! that opened them), the role check ([`may_use_tools_directly`]) and the limit of
//! concurrent calls per principal ([`MAX_CALLS_PER_PRINCIPAL`]). It decides nothing
//! about a call: every call goes through [`Admin::call_agent_tool`], the gateway's
//! guarded path (policy, approvals, hooks, audit) with `channel: "mcp"`, the caller's
//! principal, `via: "mcp:<token id>"` and the session key `mcp:<agent>:<user>`. The
//! bearer token, `Host` and `Origin` checks are the HTTP API's (`channel::http`), which
//! names the caller; [`McpEndpoint::handle`] puts that [`McpCaller`] into the request's
//! extensions for the handler.
//!
//! [`Admin::call_agent_tool`]: crate::api::Admin::call_agent_tool

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as McpContent,
    Implementation, InitializeRequestParams, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::api::{
    AgentToolCall, ContentBlock, CoreToolCall, GatewayError, GatewayFull, Principal, ToolContext,
    ToolOutput,
};

/// The channel of MCP calls in audit records, sessions and `BEIGE_CHANNEL`.
pub const CHANNEL: &str = "mcp";

/// At most this many tool calls of one principal run at once; one more is answered at
/// once with `isError: true` and says so (it is not queued: a client that waits on its
/// own calls would deadlock behind a queue it cannot see).
pub const MAX_CALLS_PER_PRINCIPAL: usize = 8;

/// The id of the gateway's one bearer token (`gateway.token`) in `via`: `mcp:owner`.
pub const OWNER_TOKEN_ID: &str = "owner";

/// The header rmcp's streamable HTTP transport names a session with.
const SESSION_HEADER: &str = "mcp-session-id";

/// Session bindings kept before the ones of ended sessions are swept.
const MAX_BINDINGS: usize = 4096;

/// Who is calling the MCP endpoint, as the HTTP API's checks established it (never
/// read from a payload): put into the request's extensions, read by the handler from
/// the `http::request::Parts` rmcp keeps in the request context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpCaller {
    /// The principal of the bearer token.
    pub principal: Principal,
    /// The token's id (`owner` for `gateway.token`), for `via: "mcp:<id>"`.
    pub token_id: String,
}

impl McpCaller {
    /// The holder of the gateway's token (`gateway.token`), the owner.
    pub fn owner() -> Self {
        Self {
            principal: Principal::ApiToken,
            token_id: OWNER_TOKEN_ID.to_string(),
        }
    }

    /// The caller the HTTP API authenticated: their principal and token id (`owner`
    /// for the gateway's token).
    pub fn of(caller: &beige_client::auth::Caller) -> Self {
        Self {
            principal: caller.principal(),
            token_id: caller
                .token_id
                .clone()
                .unwrap_or_else(|| OWNER_TOKEN_ID.to_string()),
        }
    }

    /// The audit's name of the principal (`owner`, `<channel>:<id>`): the `<user>` of
    /// the session key and the key of the concurrency limit.
    pub fn user(&self) -> String {
        crate::principal::audit_name(&self.principal)
    }

    /// What binds a session: the principal and the token.
    fn binding(&self) -> String {
        format!("{}\u{0}{}", self.user(), self.token_id)
    }
}

/// Whether `principal` may call `agent`'s tools directly over MCP. Today the only
/// bearer token is the owner's, which has operator rights; users and roles (`people.md`
/// §1.2: `operator` and above) extend this one check.
pub fn may_use_tools_directly(principal: &Principal, _agent: &str) -> bool {
    // A person reaches this endpoint only past the HTTP API's check of the operator
    // role on the agent (`Access::Agent(Action::Operate)`).
    matches!(principal, Principal::ApiToken | Principal::Person { .. })
}

/// The session key of a principal's MCP calls to an agent: `mcp:<agent>:<user>`
/// (reaches `exec` as `BEIGE_SESSION_KEY`).
pub fn session_key(agent: &str, caller: &McpCaller) -> String {
    format!("{CHANNEL}:{agent}:{}", caller.user())
}

/// The concurrent calls of each principal.
#[derive(Debug, Default)]
struct CallLimits {
    by_user: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl CallLimits {
    fn semaphore(&self, user: &str) -> Arc<Semaphore> {
        self.by_user
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(user.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_CALLS_PER_PRINCIPAL)))
            .clone()
    }
}

type AgentService = StreamableHttpService<AgentServer, LocalSessionManager>;

/// One agent's streamable-HTTP service and the principals its sessions belong to.
struct Mounted {
    service: AgentService,
    sessions: Arc<LocalSessionManager>,
    /// Session id → the binding of the caller that opened it.
    bound: Mutex<HashMap<String, String>>,
}

/// The MCP endpoint of the HTTP API: one rmcp [`StreamableHttpService`] per agent,
/// made on the first request for it. The API's checks run first ([`McpEndpoint::handle`]
/// is given the caller they found).
#[derive(Default)]
pub struct McpEndpoint {
    agents: Mutex<HashMap<String, Arc<Mounted>>>,
    limits: Arc<CallLimits>,
}

impl std::fmt::Debug for McpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let agents: Vec<String> = self
            .agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        f.debug_struct("McpEndpoint")
            .field("agents", &agents)
            .finish_non_exhaustive()
    }
}

/// How the endpoint is served, from the HTTP API's settings.
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    /// Names accepted in `Host` (rmcp checks them again); `None` accepts any (the API
    /// listens on a wildcard address and has checked the `Host` itself).
    pub allowed_hosts: Option<Vec<String>>,
    /// Largest request body in bytes.
    pub body_limit: usize,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

impl McpEndpoint {
    /// An endpoint with no agent mounted yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve one request for `/mcp/agents/{agent}` from `caller`, who passed the API's
    /// token, `Host` and `Origin` checks. 404 for an unknown agent or a session opened
    /// by another principal, 403 for a principal without direct tool use and for any
    /// browser `Origin`.
    pub async fn handle(
        &self,
        gateway: Arc<dyn GatewayFull>,
        agent: &str,
        caller: McpCaller,
        options: &EndpointOptions,
        mut request: Request,
    ) -> Response {
        if request.headers().contains_key(header::ORIGIN) {
            return error(
                StatusCode::FORBIDDEN,
                "MCP requests from a browser are refused: the MCP endpoint takes no Origin",
            );
        }
        match gateway.agents().await {
            Ok(agents) if agents.iter().any(|a| a.name == agent) => {}
            Ok(_) => {
                return error(StatusCode::NOT_FOUND, format!("Unknown agent: {agent}"));
            }
            Err(e) => {
                tracing::error!(error = %e, "MCP: could not list the agents");
                return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
            }
        }
        if !may_use_tools_directly(&caller.principal, agent) {
            return error(
                StatusCode::FORBIDDEN,
                format!("This token may not use the tools of agent '{agent}' directly: that needs the operator role"),
            );
        }
        let mounted = self.mounted(gateway, agent, options);
        let session = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let binding = caller.binding();
        if let Some(id) = &session {
            let owner = mounted
                .bound
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(id)
                .cloned();
            if owner.is_some_and(|o| o != binding) {
                return error(StatusCode::NOT_FOUND, "Session not found");
            }
        }
        let deleting = request.method() == axum::http::Method::DELETE;
        request.extensions_mut().insert(caller);
        let response = mounted.service.handle(request).await.map(Body::new);
        if let Some(id) = &session {
            if deleting && response.status().is_success() {
                mounted
                    .bound
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(id);
            }
        } else if let Some(id) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
        {
            mounted.bind(id, binding).await;
        }
        response
    }

    fn mounted(
        &self,
        gateway: Arc<dyn GatewayFull>,
        agent: &str,
        options: &EndpointOptions,
    ) -> Arc<Mounted> {
        let mut agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        agents
            .entry(agent.to_string())
            .or_insert_with(|| {
                let mut config = StreamableHttpServerConfig::default()
                    .with_max_request_body_bytes(options.body_limit)
                    // An empty list with validation on: every browser `Origin` is refused.
                    .with_allowed_origins(Vec::<String>::new())
                    .enforce_origin_validation();
                config = match &options.allowed_hosts {
                    Some(hosts) => config.with_allowed_hosts(hosts.clone()),
                    None => config.disable_allowed_hosts(),
                };
                let sessions = Arc::new(LocalSessionManager::default());
                let server = AgentServer {
                    gateway,
                    agent: agent.to_string(),
                    limits: self.limits.clone(),
                };
                let service = StreamableHttpService::new(
                    move || Ok(server.clone()),
                    sessions.clone(),
                    config,
                );
                Arc::new(Mounted {
                    service,
                    sessions,
                    bound: Mutex::new(HashMap::new()),
                })
            })
            .clone()
    }
}

impl Mounted {
    /// Bind session `id` to `binding`; past [`MAX_BINDINGS`], the bindings of sessions
    /// rmcp no longer has are dropped first.
    async fn bind(&self, id: &str, binding: String) {
        let full = self.bound.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_BINDINGS;
        if full {
            let live: std::collections::HashSet<String> = self
                .sessions
                .sessions
                .read()
                .await
                .keys()
                .map(|k| k.to_string())
                .collect();
            self.bound
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|k, _| live.contains(k));
        }
        self.bound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), binding);
    }
}

/// The MCP server over one agent's tools, for one caller at a time (the caller comes
/// with each request).
#[derive(Clone)]
pub struct AgentServer {
    gateway: Arc<dyn GatewayFull>,
    agent: String,
    limits: Arc<CallLimits>,
}

impl std::fmt::Debug for AgentServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentServer")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl AgentServer {
    /// The server of `agent`'s tools through `gateway` (the endpoint makes one per
    /// agent; tests drive it directly).
    pub fn new(gateway: Arc<dyn GatewayFull>, agent: impl Into<String>) -> Self {
        Self {
            gateway,
            agent: agent.into(),
            limits: Arc::new(CallLimits::default()),
        }
    }

    /// The agent's tools as MCP tools: the four core tools (the model's schemas;
    /// `read` read-only, the others destructive) and its allowed plugin tools.
    pub async fn tools(&self) -> Result<Vec<Tool>, GatewayError> {
        let mut tools: Vec<Tool> = crate::tools::definitions()
            .into_iter()
            .map(|spec| {
                let schema = match spec.input_schema {
                    Value::Object(map) => map,
                    _ => Map::new(),
                };
                let read_only = spec.name == "read";
                let annotations = ToolAnnotations::new()
                    .read_only(read_only)
                    .destructive(!read_only);
                Tool::new(spec.name, spec.description, Arc::new(schema))
                    .with_annotations(annotations)
            })
            .collect();
        for t in self.gateway.agent_tools(&self.agent).await? {
            let mut description = t.description.clone();
            if !t.commands.is_empty() {
                description.push_str("\n\nUsage (args are the words after the tool's name):\n");
                description.push_str(&t.commands.join("\n"));
            }
            tools.push(Tool::new(t.name, description, Arc::new(plugin_schema())));
        }
        Ok(tools)
    }

    /// Run one call as `caller`; `cancel` ends it (an exec's processes are killed).
    pub async fn call(
        &self,
        caller: &McpCaller,
        name: &str,
        arguments: Map<String, Value>,
        cancel: CancellationToken,
    ) -> CallToolResult {
        let semaphore = self.limits.semaphore(&caller.user());
        let Ok(_permit) = semaphore.try_acquire_owned() else {
            return CallToolResult::error(vec![McpContent::text(format!(
                "Too many calls at once: at most {MAX_CALLS_PER_PRINCIPAL} tool calls of one token run concurrently; this one was not run. Retry when one has finished."
            ))]);
        };
        let call = if crate::tools::CORE_TOOLS.contains(&name) {
            match CoreToolCall::parse(name, Value::Object(arguments)) {
                Ok(call) => AgentToolCall::Core(call),
                Err(e) => return CallToolResult::error(vec![McpContent::text(e.message)]),
            }
        } else {
            match plugin_call(name, arguments) {
                Ok(call) => call,
                Err(message) => return CallToolResult::error(vec![McpContent::text(message)]),
            }
        };
        let ctx = ToolContext {
            session_key: Some(session_key(&self.agent, caller)),
            channel: Some(CHANNEL.to_string()),
            // An MCP client renders images itself.
            model_accepts_images: true,
            principal: caller.principal.clone(),
            // No approver is attached to an MCP call: an ask is denied at once (never
            // through elicitation: the client's model must not approve its own call).
            attended: false,
            ..ToolContext::default()
        };
        let via = format!("{CHANNEL}:{}", caller.token_id);
        match self
            .gateway
            .call_agent_tool(&self.agent, call, ctx, &via, cancel)
            .await
        {
            Ok(out) => to_result(out),
            Err(e) => CallToolResult::error(vec![McpContent::text(e.to_string())]),
        }
    }
}

/// The input schema of a plugin tool.
fn plugin_schema() -> Map<String, Value> {
    match json!({
        "type": "object",
        "properties": {
            "args": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The arguments after the tool's name, one word each (as a script passes them)"
            },
            "stdin": {"type": "string", "description": "Text piped into the tool"}
        },
        "required": ["args"],
        "additionalProperties": false
    }) {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// A plugin tool's arguments: `{args: string[], stdin?: string}`.
fn plugin_call(name: &str, mut arguments: Map<String, Value>) -> Result<AgentToolCall, String> {
    let usage = || {
        format!("Invalid arguments for {name}: expected {{\"args\": [\"word\", …], \"stdin\": \"optional text\"}}")
    };
    let args = match arguments.remove("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(usage()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(usage()),
    };
    let stdin = match arguments.remove("stdin") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.into_bytes()),
        Some(_) => return Err(usage()),
    };
    if let Some(extra) = arguments.keys().next() {
        return Err(format!("{}: unknown field '{extra}'", usage()));
    }
    Ok(AgentToolCall::Plugin {
        tool: name.to_string(),
        args,
        stdin,
    })
}

/// A tool's output as an MCP result: text and images in order, `isError` when it
/// failed or was denied.
fn to_result(out: ToolOutput) -> CallToolResult {
    let content: Vec<McpContent> = out
        .content
        .into_iter()
        .map(|block| match block {
            ContentBlock::Text { text } => McpContent::text(text),
            ContentBlock::Image { data, mime_type } => McpContent::image(data, mime_type),
        })
        .collect();
    if out.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

/// The caller rmcp carries with a request: the HTTP API put it into the request's
/// extensions, rmcp keeps the request's `Parts` in the context.
fn caller_of(context: &RequestContext<RoleServer>) -> Option<McpCaller> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<McpCaller>())
        .cloned()
}

impl ServerHandler for AgentServer {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("beige", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "The tools of beige agent '{}': read, write, patch and exec act in the agent's sandbox (/workspace); the other tools are its plugin tools, given their command-line arguments as `args`. Every call is checked by the gateway's policy and recorded in its audit log.",
                self.agent
            ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        // Self-reported by the client: recorded as such, never used for a decision.
        tracing::info!(
            agent = %self.agent,
            client = %request.client_info.name,
            client_version = %request.client_info.version,
            principal = caller_of(&context).map(|c| c.user()).unwrap_or_default(),
            "MCP client connected"
        );
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = self
            .tools()
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(caller) = caller_of(&context) else {
            // Only the HTTP API's route reaches this handler, and it always sets one.
            return Err(McpError::internal_error(
                "no authenticated caller for this request",
                None,
            ));
        };
        if let Some(info) = context.peer.peer_info() {
            tracing::debug!(
                agent = %self.agent,
                tool = %request.name,
                client = %info.client_info.name,
                client_version = %info.client_info.version,
                "MCP tool call"
            );
        }
        // A `notifications/cancelled` fires `context.ct`: the call is dropped, and a
        // running exec is killed in the sandbox.
        let result = self
            .call(
                &caller,
                &request.name,
                request.arguments.unwrap_or_default(),
                context.ct.clone(),
            )
            .await;
        Ok(result.into())
    }
}
