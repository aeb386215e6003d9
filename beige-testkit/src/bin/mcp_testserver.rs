//! `beige-mcp-testserver`: the MCP server of beige's tests (`spec/mcp.md` §3), built
//! static by `scripts/build-shim` and mounted into the busybox test image, where it runs
//! as an agent's stdio server; with `--http 127.0.0.1:0` it serves streamable HTTP on
//! loopback instead (the remote-server tests). Its tools exercise the paths of the MCP
//! client: plain text, errors, structured output, cancellation, images, big outputs, junk
//! on stdout, a changing tool list, the identity and environment it runs with, and the
//! headers an HTTP request carried. It counts its calls and the cancellations it sees, so
//! a test can assert that a refused call never reached it.
//!
//! ```text
//! beige-mcp-testserver                       stdio (the default)
//! beige-mcp-testserver --http 127.0.0.1:0    streamable HTTP; first stdout line:
//!                                            listening on http://ADDR/mcp
//! ```

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

/// A 1×1 PNG, base64.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
/// The largest `big` answer (64 MiB): larger asks are refused.
const MAX_BIG: u64 = 64 * 1024 * 1024;

/// What the server has seen, shared by every session (HTTP makes one handler per session).
#[derive(Debug, Default)]
struct State {
    calls: BTreeMap<String, u64>,
    cancellations: u64,
    junk_lines: u64,
    extra_tool: bool,
}

#[derive(Debug, Clone)]
struct TestServer {
    state: Arc<Mutex<State>>,
    http: bool,
}

fn object(v: Value) -> Arc<JsonObject> {
    Arc::new(match v {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    })
}

fn tool(name: &'static str, description: &'static str, schema: Value) -> Tool {
    Tool::new(name, description, object(schema))
}

fn no_args() -> Value {
    json!({"type": "object", "properties": {}})
}

/// The tools, `extra` once `change_tools` was called.
fn tools(extra: bool) -> Vec<Tool> {
    let mut list = vec![
        tool(
            "echo",
            "Echo the text back.",
            json!({"type": "object", "properties": {"text": {"type": "string", "description": "What to echo."}}, "required": ["text"]}),
        ),
        tool(
            "add",
            "Add two integers.",
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}),
        )
        .with_raw_output_schema(object(json!({
            "type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]
        }))),
        tool(
            "fail",
            "Answer with isError and the message.",
            json!({"type": "object", "properties": {"message": {"type": "string"}}}),
        ),
        tool(
            "slow",
            "Sleep for some seconds; a cancellation ends the sleep and is counted.",
            json!({"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0}}, "required": ["seconds"]}),
        ),
        tool(
            "calls",
            "How many times each tool was called, and the cancellations seen.",
            no_args(),
        ),
        tool("image", "A 1x1 PNG image.", no_args()),
        tool(
            "big",
            "A text block of that many bytes.",
            json!({"type": "object", "properties": {"bytes": {"type": "integer", "minimum": 0}}, "required": ["bytes"]}),
        ),
        tool(
            "junk_stdout",
            "Write a line that is not JSON-RPC to stdout (stdio mode), then answer.",
            no_args(),
        ),
        tool(
            "change_tools",
            "Add the tool `extra` and send notifications/tools/list_changed.",
            no_args(),
        ),
        tool(
            "whoami",
            "The uid, gid and the BEIGE_*, MCP_* and TOKEN environment variables.",
            no_args(),
        ),
        tool(
            "headers",
            "The authorization header of the HTTP request (HTTP mode).",
            no_args(),
        ),
        tool(
            "headers_digest",
            "The sha256 (hex) of the authorization header of the HTTP request, and the host (HTTP mode): a test can check the secret arrived without the secret in the result.",
            no_args(),
        ),
    ];
    if extra {
        list.push(tool("extra", "Added by change_tools.", no_args()));
    }
    list
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s)])
}

fn json_text(v: &Value) -> CallToolResult {
    text(v.to_string())
}

fn bad(message: impl Into<String>) -> ErrorData {
    ErrorData::invalid_params(message.into(), None)
}

/// `uid` and `gid` from `/proc/self/status` (the real ids).
fn ids() -> (Option<u64>, Option<u64>) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    (field("Uid:"), field("Gid:"))
}

impl TestServer {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn dispatch(
        &self,
        name: &str,
        args: &JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let get = |k: &str| args.get(k);
        match name {
            "echo" => match get("text") {
                Some(Value::String(s)) => Ok(text(s.clone())),
                _ => Err(bad("echo needs a string `text`")),
            },
            "add" => match (
                get("a").and_then(Value::as_i64),
                get("b").and_then(Value::as_i64),
            ) {
                (Some(a), Some(b)) => {
                    let sum = a.checked_add(b).ok_or_else(|| bad("the sum overflows"))?;
                    let mut r = text(sum.to_string());
                    r.structured_content = Some(json!({"sum": sum}));
                    Ok(r)
                }
                _ => Err(bad("add needs integers `a` and `b`")),
            },
            "fail" => {
                let message = get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("failed as asked");
                Ok(CallToolResult::error(vec![ContentBlock::text(message)]))
            }
            "slow" => {
                let seconds = get("seconds")
                    .and_then(Value::as_f64)
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 3600.0)
                    .ok_or_else(|| bad("slow needs `seconds` between 0 and 3600"))?;
                tokio::select! {
                    () = context.ct.cancelled() => {
                        self.lock().cancellations += 1;
                        eprintln!("beige-mcp-testserver: slow was cancelled");
                        Ok(CallToolResult::error(vec![ContentBlock::text("cancelled")]))
                    }
                    () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {
                        Ok(text(format!("slept {seconds} s")))
                    }
                }
            }
            "calls" => {
                let s = self.lock();
                Ok(json_text(&json!({
                    "calls": s.calls,
                    "cancellations": s.cancellations,
                    "junkLines": s.junk_lines,
                })))
            }
            "image" => Ok(CallToolResult::success(vec![
                ContentBlock::text("a 1x1 PNG"),
                ContentBlock::image(PNG_1X1, "image/png"),
            ])),
            "big" => {
                let bytes = get("bytes")
                    .and_then(Value::as_u64)
                    .filter(|b| *b <= MAX_BIG)
                    .ok_or_else(|| bad(format!("big needs `bytes` between 0 and {MAX_BIG}")))?;
                let n = usize::try_from(bytes).map_err(|_| bad("too big for this machine"))?;
                Ok(text("x".repeat(n)))
            }
            "junk_stdout" => {
                if !self.http {
                    let mut out = std::io::stdout().lock();
                    let written = out
                        .write_all(b"this line is not JSON-RPC\n")
                        .and_then(|()| out.flush());
                    if let Err(e) = written {
                        return Err(ErrorData::internal_error(format!("stdout: {e}"), None));
                    }
                }
                self.lock().junk_lines += 1;
                Ok(text("wrote a junk line to stdout"))
            }
            "change_tools" => {
                self.lock().extra_tool = true;
                if let Err(e) = context.peer.notify_tool_list_changed().await {
                    return Err(ErrorData::internal_error(
                        format!("sending tools/list_changed: {e}"),
                        None,
                    ));
                }
                Ok(text("added the tool extra"))
            }
            "extra" if self.lock().extra_tool => Ok(text("extra")),
            "whoami" => {
                let (uid, gid) = ids();
                let env: BTreeMap<String, String> = std::env::vars()
                    .filter(|(k, _)| {
                        k.starts_with("BEIGE_") || k.starts_with("MCP_") || k == "TOKEN"
                    })
                    .collect();
                Ok(json_text(
                    &json!({"uid": uid, "gid": gid, "pid": std::process::id(), "env": env}),
                ))
            }
            "headers" | "headers_digest" => {
                let Some(parts) = context.extensions.get::<axum::http::request::Parts>() else {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(
                        "no HTTP request: the server runs over stdio",
                    )]));
                };
                let header = |name: &str| {
                    parts
                        .headers
                        .get(name)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                };
                if name == "headers_digest" {
                    use sha2::Digest as _;
                    let digest = header("authorization").map(|a| {
                        sha2::Sha256::digest(a.as_bytes())
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<String>()
                    });
                    return Ok(json_text(&json!({
                        "authorization_sha256": digest,
                        "host": header("host"),
                    })));
                }
                Ok(json_text(&json!({
                    "authorization": header("authorization"),
                    "host": header("host"),
                })))
            }
            other => Err(bad(format!("unknown tool {other:?}"))),
        }
    }
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            "beige-mcp-testserver",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let extra = self.lock().extra_tool;
        Ok(ListToolsResult::with_all_items(tools(extra)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        *self.lock().calls.entry(name.clone()).or_default() += 1;
        let args = request.arguments.unwrap_or_default();
        self.dispatch(&name, &args, &context).await.map(Into::into)
    }
}

/// Why the server could not run.
#[derive(Debug)]
enum Error {
    Usage(String),
    Io(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Usage(m) => write!(
                f,
                "{m}\nusage: beige-mcp-testserver [--http 127.0.0.1:PORT]"
            ),
            Error::Io(m) => f.write_str(m),
        }
    }
}

/// The mode asked for on the command line.
enum Mode {
    Stdio,
    Http(SocketAddr),
    Version,
}

fn mode(args: &[String]) -> Result<Mode, Error> {
    match args {
        [] => Ok(Mode::Stdio),
        [flag] if flag == "--version" => Ok(Mode::Version),
        [flag, addr] if flag == "--http" => {
            let addr: SocketAddr = addr
                .parse()
                .map_err(|e| Error::Usage(format!("--http {addr:?}: {e}")))?;
            if !addr.ip().is_loopback() {
                return Err(Error::Usage(format!(
                    "--http {addr}: only a loopback address is allowed"
                )));
            }
            Ok(Mode::Http(addr))
        }
        other => Err(Error::Usage(format!("unexpected arguments {other:?}"))),
    }
}

async fn serve_stdio(server: TestServer) -> Result<(), Error> {
    eprintln!("beige-mcp-testserver: serving MCP on stdio");
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::Io(format!("initialize: {e}")))?;
    running
        .waiting()
        .await
        .map_err(|e| Error::Io(format!("serving: {e}")))?;
    Ok(())
}

async fn serve_http(server: TestServer, addr: SocketAddr) -> Result<(), Error> {
    use rmcp::transport::streamable_http_server::{
        session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    };
    // Loopback only (checked above); any Host is accepted, so tests may name the server
    // (e.g. mcp.example.test) through their own resolver.
    let service: StreamableHttpService<TestServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::default(),
            StreamableHttpServerConfig::default().disable_allowed_hosts(),
        );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Io(format!("bind {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::Io(format!("local address: {e}")))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{local}/mcp")
            .and_then(|()| out.flush())
            .map_err(|e| Error::Io(format!("stdout: {e}")))?;
    }
    eprintln!("beige-mcp-testserver: serving MCP on http://{local}/mcp");
    axum::serve(listener, router)
        .await
        .map_err(|e| Error::Io(format!("serving: {e}")))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match mode(&args) {
        Ok(Mode::Version) => {
            println!("beige-mcp-testserver {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Ok(mode) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let server = TestServer {
                state: Arc::default(),
                http: matches!(mode, Mode::Http(_)),
            };
            let result = match (runtime, mode) {
                (Err(e), _) => Err(Error::Io(format!("runtime: {e}"))),
                (Ok(rt), mode) => {
                    let result = match mode {
                        Mode::Http(addr) => rt.block_on(serve_http(server, addr)),
                        _ => rt.block_on(serve_stdio(server)),
                    };
                    // Not waiting for the blocking stdin reader to see EOF.
                    rt.shutdown_background();
                    result
                }
            };
            match result {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("beige-mcp-testserver: {e}");
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("beige-mcp-testserver: {e}");
            2
        }
    };
    std::process::exit(code);
}
