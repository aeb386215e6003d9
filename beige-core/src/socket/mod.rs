//! The per-agent tool socket: `run/<agent>/gateway.sock`, mounted at `/beige/run/` in the
//! agent's sandbox, where `/tools/bin/<tool>` launchers send their calls.
//!
//! Owns the listener and the connection rules of `sandbox.md` §3: identity is the
//! listener (the agent is fixed when the server starts; nothing in a request changes it),
//! requests on one connection are answered in order, and everything a sandbox can make
//! the gateway hold is bounded ([`SocketLimits`]): open connections per agent and
//! descriptors of all sockets together ([`DescriptorBudget`]), bytes of requests held
//! per agent, line and stdin size, idle clients, calls in flight. Over a bound the caller
//! gets one JSON error line naming it and what to do. Each connection is attributed
//! once, when it is accepted: its peer's pid (`SO_PEERCRED`) goes to the
//! [`ExecRegistry`], which names the exec the process belongs to ([`Attribution`]); every
//! request on the connection is handed to the handler with it. What a request *means*
//! (policy, hooks, audit, the handler) is the [`ToolRequestHandler`]'s business.

mod fdlimit;

pub(crate) use fdlimit::{nofile_limit, raise_nofile_limit, DescriptorBudget};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use beige_protocol::socket::{
    ToolRequest, ToolResponse, MAX_REQUEST_LINE, MAX_STDIN_BYTES, TOOL_REQUEST,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use fdlimit::Descriptor;

use crate::ident::{Attribution, ExecRegistry};

/// Handles one parsed request from an agent's socket.
#[async_trait]
pub(crate) trait ToolRequestHandler: Send + Sync {
    /// `agent` is the socket's agent — nothing in a request changes it; `caller` is the
    /// exec the kernel's view of the connecting process leads to (or unbound).
    async fn handle(&self, agent: &str, caller: &Attribution, request: ToolRequest)
        -> ToolResponse;

    /// A request that could not be parsed or was refused before it was parsed; `tool`
    /// when it was readable, `raw` the bytes received (or the start of them). Used for
    /// audit.
    async fn rejected(&self, agent: &str, tool: Option<&str>, error: &str, raw: &[u8]);

    /// The agent reached a bound of its socket (`limit` names it, `message` is what the
    /// caller was told). Called once when the agent first hits it, not for every refusal,
    /// until the agent is back under it.
    async fn limit_reached(&self, _agent: &str, _limit: Limit, _message: &str) {}
}

/// The bounds of [`SocketLimits`] a caller can run into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// [`SocketLimits::max_connections`].
    Connections,
    /// The process's [`DescriptorBudget`].
    Descriptors,
    /// [`SocketLimits::max_buffered`].
    Buffered,
    /// [`SocketLimits::concurrency`] for longer than [`SocketLimits::call_wait`].
    InFlight,
}

impl Limit {
    /// A short name, e.g. for `security.socket_limit` audit records.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Limit::Connections => "connections",
            Limit::Descriptors => "descriptors",
            Limit::Buffered => "buffered",
            Limit::InFlight => "in_flight",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Bounds of one agent's socket.
#[derive(Debug, Clone, Copy)]
pub struct SocketLimits {
    /// Requests running at once for this agent; more wait up to `call_wait`.
    pub concurrency: usize,
    /// How long a request waits for one of the `concurrency` slots before it is
    /// answered with an error.
    pub call_wait: Duration,
    /// A client that sends nothing for this long is disconnected.
    pub idle: Duration,
    /// Longest request line, not counting the base64 `stdin` field.
    pub max_line: usize,
    /// Largest `stdin` after decoding.
    pub max_stdin: usize,
    /// Connections open at once per agent; over it a connection gets one error line and
    /// is closed.
    pub max_connections: usize,
    /// Bytes of request lines one agent may have the gateway hold at once, over all its
    /// connections — unfinished lines and requests being answered. Over it the
    /// connection gets an error line and is closed.
    pub max_buffered: usize,
    /// Descriptors of the process's limit that the sockets never use (for the HTTP API,
    /// the store, Docker, plugins).
    pub fd_reserve: usize,
}

impl Default for SocketLimits {
    fn default() -> Self {
        Self {
            concurrency: 32,
            call_wait: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            max_line: MAX_REQUEST_LINE,
            max_stdin: MAX_STDIN_BYTES,
            max_connections: 64,
            max_buffered: 16 * 1024 * 1024,
            fd_reserve: 256,
        }
    }
}

/// What one agent holds on its socket now.
#[derive(Debug, Default)]
struct AgentLoad {
    connections: AtomicUsize,
    buffered: AtomicUsize,
    /// Per [`Limit`]: the agent is over it (reported once until it is under it again).
    over: [AtomicBool; 4],
}

impl AgentLoad {
    /// Mark `limit` as reached; `true` the first time since the agent was last under it.
    fn reached(&self, limit: Limit) -> bool {
        !self.over[limit.index()].swap(true, Ordering::SeqCst)
    }

    fn under(&self, limit: Limit) {
        self.over[limit.index()].store(false, Ordering::Relaxed);
    }
}

/// One open connection of an agent, counted until dropped.
#[derive(Debug)]
struct ConnectionSlot {
    load: Arc<AgentLoad>,
    _descriptor: Descriptor,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.load.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bytes of request data an agent has the gateway hold, given back when dropped.
#[derive(Debug)]
struct Held {
    load: Arc<AgentLoad>,
    bytes: usize,
    max: usize,
}

impl Held {
    fn new(load: Arc<AgentLoad>, max: usize) -> Self {
        Self {
            load,
            bytes: 0,
            max,
        }
    }

    /// Count `n` more bytes; `false` (nothing counted) when the agent's budget would be
    /// exceeded.
    fn grow(&mut self, n: usize) -> bool {
        let max = self.max;
        let ok = self
            .load
            .buffered
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                b.checked_add(n).filter(|t| *t <= max)
            })
            .is_ok();
        if ok {
            self.bytes += n;
        }
        ok
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.load.buffered.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// A running socket server; stops and unlinks its socket when dropped.
#[derive(Debug)]
pub(crate) struct SocketServer {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl SocketServer {
    /// Bind `path` (replacing a stale socket), make it connectable by the sandbox user
    /// and serve `agent`'s requests within `limits`; the listener and every connection
    /// take a descriptor of `descriptors`. Connections are attributed with `execs`
    /// (without one, every caller is unbound).
    pub(crate) fn start(
        agent: &str,
        path: &Path,
        handler: Arc<dyn ToolRequestHandler>,
        limits: SocketLimits,
        descriptors: Arc<DescriptorBudget>,
        execs: Option<Arc<ExecRegistry>>,
    ) -> std::io::Result<Self> {
        let Some(listener_fd) = descriptors.take() else {
            return Err(std::io::Error::other(format!(
                "the tool sockets already hold all {} descriptors they may use; raise the gateway's descriptor limit (ulimit -n) or run fewer agents",
                descriptors.max()
            )));
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        // The sandbox user (another uid) must be able to connect; BEIGE_HOME (0700)
        // keeps other host users out.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        let agent: Arc<str> = Arc::from(agent);
        let permits = Arc::new(Semaphore::new(limits.concurrency.max(1)));
        let load = Arc::new(AgentLoad::default());
        let task = tokio::spawn(async move {
            let _listener_fd = listener_fd;
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let slot = match admit(&load, &descriptors, &limits) {
                            Ok(slot) => slot,
                            Err(limit) => {
                                let message = refusal(&agent, limit, &limits, descriptors.max());
                                refuse(stream, &message);
                                if load.reached(limit) {
                                    tracing::warn!(agent = %agent, limit = limit.as_str(), "{message}");
                                    let handler = handler.clone();
                                    let agent = agent.clone();
                                    tokio::spawn(async move {
                                        handler.limit_reached(&agent, limit, &message).await;
                                    });
                                }
                                continue;
                            }
                        };
                        let conn = Connection {
                            agent: agent.clone(),
                            handler: handler.clone(),
                            permits: permits.clone(),
                            load: load.clone(),
                            limits,
                            execs: execs.clone(),
                        };
                        tokio::spawn(conn.serve(stream, slot));
                    }
                    Err(e) => {
                        tracing::warn!(agent = %agent, error = %e, "socket accept failed");
                        // Out of file descriptors and the like: back off briefly.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        tracing::info!(path = %path.display(), "tool socket listening");
        Ok(Self {
            path: path.to_path_buf(),
            task,
        })
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Count a new connection of the agent, or say which bound it would cross.
fn admit(
    load: &Arc<AgentLoad>,
    descriptors: &Arc<DescriptorBudget>,
    limits: &SocketLimits,
) -> Result<ConnectionSlot, Limit> {
    let max = limits.max_connections.max(1);
    load.connections
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max).then_some(n + 1)
        })
        .map_err(|_| Limit::Connections)?;
    let Some(descriptor) = descriptors.take() else {
        load.connections.fetch_sub(1, Ordering::SeqCst);
        return Err(Limit::Descriptors);
    };
    load.under(Limit::Connections);
    load.under(Limit::Descriptors);
    Ok(ConnectionSlot {
        load: load.clone(),
        _descriptor: descriptor,
    })
}

/// The error line for a caller over `limit`.
fn refusal(agent: &str, limit: Limit, limits: &SocketLimits, descriptors_max: usize) -> String {
    match limit {
        Limit::Connections => format!(
            "agent '{agent}' already has {} connections open to the tool socket (the limit); connection closed. Close idle connections or make fewer calls at once",
            limits.max_connections
        ),
        Limit::Descriptors => format!(
            "the tool sockets of this gateway already hold {} connections (its descriptor limit minus a reserve); connection closed. Try again shortly; the owner can raise the gateway's descriptor limit (ulimit -n)",
            descriptors_max
        ),
        Limit::Buffered => format!(
            "Invalid request: agent '{agent}' has more than {} bytes of requests held by the gateway at once, over all its connections (the limit); connection closed. Send fewer large requests at once",
            limits.max_buffered
        ),
        Limit::InFlight => format!(
            "agent '{agent}' already has {} tool calls running (the limit) and this one waited {} s for a free slot; it did not run. Make fewer calls at once",
            limits.concurrency,
            limits.call_wait.as_secs_f64()
        ),
    }
}

/// Write one error line without waiting (a fresh socket's buffer has room for it) and
/// close the connection.
fn refuse(stream: UnixStream, message: &str) {
    if let Ok(mut bytes) = serde_json::to_vec(&ToolResponse::error(message, 1)) {
        bytes.push(b'\n');
        let _ = stream.try_write(&bytes);
    }
}

struct Connection {
    agent: Arc<str>,
    handler: Arc<dyn ToolRequestHandler>,
    permits: Arc<Semaphore>,
    load: Arc<AgentLoad>,
    limits: SocketLimits,
    execs: Option<Arc<ExecRegistry>>,
}

enum Line {
    Data(Vec<u8>),
    TooLong(Vec<u8>),
    OverBudget(Vec<u8>),
    Eof,
}

/// How much of a refused line is passed on for the audit excerpt.
const RAW_EXCERPT: usize = 4096;

impl Connection {
    async fn serve(self, stream: UnixStream, _slot: ConnectionSlot) {
        let caller = self.attribute(&stream).await;
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::with_capacity(64 * 1024, read);
        loop {
            // Room for the base64 of the largest stdin on top of the line limit.
            let hard_max = self.limits.max_line + self.limits.max_stdin.div_ceil(3) * 4 + 64;
            let mut held = Held::new(self.load.clone(), self.limits.max_buffered);
            let line = match tokio::time::timeout(
                self.limits.idle,
                read_line(&mut reader, hard_max, &mut held),
            )
            .await
            {
                Err(_) => {
                    tracing::debug!(agent = %self.agent, "idle socket client disconnected");
                    return;
                }
                Ok(Err(_)) | Ok(Ok(Line::Eof)) => return,
                Ok(Ok(Line::TooLong(start))) => {
                    let msg = self.too_long();
                    self.handler.rejected(&self.agent, None, &msg, &start).await;
                    let _ = send(&mut write, &ToolResponse::error(msg, 1)).await;
                    linger(reader, write).await;
                    return;
                }
                Ok(Ok(Line::OverBudget(start))) => {
                    let msg = refusal(&self.agent, Limit::Buffered, &self.limits, 0);
                    if self.load.reached(Limit::Buffered) {
                        tracing::warn!(agent = %self.agent, limit = "buffered", "{msg}");
                        self.handler
                            .limit_reached(&self.agent, Limit::Buffered, &msg)
                            .await;
                    }
                    self.handler.rejected(&self.agent, None, &msg, &start).await;
                    let _ = send(&mut write, &ToolResponse::error(msg, 1)).await;
                    linger(reader, write).await;
                    return;
                }
                Ok(Ok(Line::Data(bytes))) if self.fits(&bytes) => bytes,
                Ok(Ok(Line::Data(bytes))) => {
                    let msg = self.too_long();
                    let start = &bytes[..bytes.len().min(RAW_EXCERPT)];
                    self.handler.rejected(&self.agent, None, &msg, start).await;
                    let _ = send(&mut write, &ToolResponse::error(msg, 1)).await;
                    return;
                }
            };
            self.load.under(Limit::Buffered);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            // `held` still counts the line while it is parsed and answered.
            let response = self.answer(&caller, line).await;
            drop(held);
            if send(&mut write, &response).await.is_err() {
                return;
            }
        }
    }

    /// The exec of the process at the other end, from its `SO_PEERCRED` pid.
    async fn attribute(&self, stream: &UnixStream) -> Attribution {
        let Some(execs) = &self.execs else {
            return Attribution::unbound();
        };
        let pid = match stream.peer_cred() {
            Ok(cred) => cred.pid().and_then(|p| u32::try_from(p).ok()),
            Err(e) => {
                tracing::debug!(agent = %self.agent, error = %e, "no peer credentials on a tool socket connection");
                None
            }
        };
        let caller = execs.attribute(&self.agent, pid).await;
        tracing::debug!(agent = %self.agent, pid, exec = ?caller.exec, method = caller.method.as_str(), "tool socket caller attributed");
        caller
    }

    fn too_long(&self) -> String {
        format!(
            "Invalid request: line longer than {} bytes (stdin over {} bytes or too many arguments); connection closed",
            self.limits.max_line, self.limits.max_stdin
        )
    }

    /// The line without its `stdin` field is within `max_line`, and the stdin within
    /// `max_stdin` (checked cheaply on the base64 length).
    fn fits(&self, line: &[u8]) -> bool {
        if line.len() <= self.limits.max_line {
            return true;
        }
        let stdin_len = stdin_field_len(line);
        line.len() - stdin_len <= self.limits.max_line
            && stdin_len / 4 * 3 <= self.limits.max_stdin + 2
    }

    async fn answer(&self, caller: &Attribution, line: Vec<u8>) -> ToolResponse {
        let value: serde_json::Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(e) => {
                let msg = format!("Invalid request: {e}");
                self.handler.rejected(&self.agent, None, &msg, &line).await;
                return ToolResponse::error(msg, 1);
            }
        };
        let tool = value
            .get("tool")
            .and_then(|t| t.as_str())
            .map(str::to_string);
        let kind = value.get("type").and_then(|t| t.as_str()).unwrap_or("");
        if kind != TOOL_REQUEST {
            let msg = format!("Unknown message type: {}", excerpt(kind, 64));
            self.handler
                .rejected(&self.agent, tool.as_deref(), &msg, &line)
                .await;
            return ToolResponse::error(msg, 1);
        }
        let request: ToolRequest = match serde_json::from_value(value) {
            Ok(r) => r,
            Err(e) => {
                let msg = format!("Invalid request: {}", excerpt(&e.to_string(), 512));
                self.handler
                    .rejected(&self.agent, tool.as_deref(), &msg, &line)
                    .await;
                return ToolResponse::error(msg, 1);
            }
        };
        drop(line);
        let permit = match tokio::time::timeout(self.limits.call_wait, self.permits.acquire()).await
        {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return ToolResponse::error("the gateway is shutting down", 1),
            Err(_) => {
                let msg = refusal(&self.agent, Limit::InFlight, &self.limits, 0);
                if self.load.reached(Limit::InFlight) {
                    tracing::warn!(agent = %self.agent, limit = "in_flight", "{msg}");
                    self.handler
                        .limit_reached(&self.agent, Limit::InFlight, &msg)
                        .await;
                }
                return ToolResponse::error(msg, 1);
            }
        };
        self.load.under(Limit::InFlight);
        let response = self.handler.handle(&self.agent, caller, request).await;
        drop(permit);
        response
    }
}

/// How long a refused connection's remaining input is read and dropped before it is
/// closed, so that a client still writing its line gets to read the error.
const LINGER: Duration = Duration::from_secs(1);

/// Close after an error: stop writing, then read and drop what the client still sends
/// (holding nothing) for at most [`LINGER`], so its write does not fail before it can
/// read the error line.
async fn linger(
    mut reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    mut write: tokio::net::unix::OwnedWriteHalf,
) {
    let _ = write.shutdown().await;
    let drain = async {
        loop {
            match reader.fill_buf().await {
                Ok(buf) if !buf.is_empty() => {
                    let n = buf.len();
                    reader.consume(n);
                }
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// At most `max` bytes of `s`, cut at a character boundary, with `…` when cut.
fn excerpt(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

/// Length of the value of a `"stdin":"…"` field (base64 has no escapes), 0 if absent.
fn stdin_field_len(line: &[u8]) -> usize {
    let key = b"\"stdin\"";
    let Some(start) = line.windows(key.len()).position(|w| w == key) else {
        return 0;
    };
    let rest = &line[start + key.len()..];
    let Some(open) = rest.iter().position(|&b| b == b'"') else {
        return 0;
    };
    rest[open + 1..]
        .iter()
        .position(|&b| b == b'"')
        .unwrap_or(0)
}

async fn send(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    response: &ToolResponse,
) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(response).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    write.write_all(&bytes).await
}

/// Read one `\n`-terminated line of at most `max` bytes without buffering more, every
/// byte counted in `held` first. A refused line comes back with its first bytes.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
    held: &mut Held,
) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let start = |mut line: Vec<u8>| {
        line.truncate(RAW_EXCERPT);
        line.shrink_to_fit();
        line
    };
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if line.is_empty() {
                Line::Eof
            } else {
                Line::Data(line)
            });
        }
        let (take, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            let mut first = line;
            first.extend_from_slice(&buf[..take.min(RAW_EXCERPT)]);
            return Ok(Line::TooLong(start(first)));
        }
        if !held.grow(take) {
            let mut first = line;
            first.extend_from_slice(&buf[..take.min(RAW_EXCERPT)]);
            return Ok(Line::OverBudget(start(first)));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(if complete { take + 1 } else { take });
        if complete {
            return Ok(Line::Data(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::AsyncReadExt;

    #[derive(Default)]
    struct Echo {
        rejected: AtomicUsize,
        raw: Mutex<Vec<Vec<u8>>>,
        limits: Mutex<Vec<Limit>>,
    }

    #[async_trait]
    impl ToolRequestHandler for Echo {
        async fn handle(
            &self,
            agent: &str,
            caller: &Attribution,
            request: ToolRequest,
        ) -> ToolResponse {
            if request.tool == "whoami" {
                return ToolResponse::from_result(
                    format!("{}:{:?}", caller.method.as_str(), caller.exec),
                    0,
                );
            }
            if request.tool == "slow" {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if request.tool == "slower" {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
            ToolResponse::from_result(
                format!("{agent}:{}:{}", request.tool, request.args.join(",")),
                0,
            )
        }
        async fn rejected(&self, _agent: &str, _tool: Option<&str>, _error: &str, raw: &[u8]) {
            self.rejected.fetch_add(1, Ordering::SeqCst);
            self.raw.lock().unwrap().push(raw.to_vec());
        }
        async fn limit_reached(&self, _agent: &str, limit: Limit, _message: &str) {
            self.limits.lock().unwrap().push(limit);
        }
    }

    async fn roundtrip(stream: &mut UnixStream, line: &str) -> ToolResponse {
        stream.write_all(line.as_bytes()).await.unwrap();
        let mut reader = BufReader::new(stream);
        let mut out = String::new();
        reader.read_line(&mut out).await.unwrap();
        serde_json::from_str(&out).unwrap()
    }

    fn start(
        dir: &tempfile::TempDir,
        handler: Arc<Echo>,
        limits: SocketLimits,
        descriptors: Arc<DescriptorBudget>,
    ) -> (SocketServer, PathBuf) {
        let path = dir.path().join("run/a/gateway.sock");
        let server = SocketServer::start("a", &path, handler, limits, descriptors, None).unwrap();
        (server, path)
    }

    /// Everything the server sends before it closes the connection.
    async fn read_all(mut s: UnixStream) -> String {
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
            .await
            .unwrap()
            .unwrap();
        out
    }

    #[tokio::test]
    async fn identity_order_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let handler = Arc::new(Echo::default());
        let limits = SocketLimits {
            idle: Duration::from_millis(300),
            max_line: 1000,
            max_stdin: 300,
            ..Default::default()
        };
        let (_server, path) = start(&dir, handler.clone(), limits, DescriptorBudget::new(100));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);

        let mut s = UnixStream::connect(&path).await.unwrap();
        // The payload cannot change the agent.
        let r = roundtrip(&mut s, "{\"type\":\"tool_request\",\"tool\":\"kv\",\"args\":[\"x\"],\"sessionContext\":{\"agentName\":\"b\"}}\n").await;
        assert_eq!(r.output.as_deref(), Some("a:kv:x"));
        // Two requests in one write are answered in order.
        s.write_all(b"{\"type\":\"tool_request\",\"tool\":\"slow\",\"args\":[]}\n{\"type\":\"tool_request\",\"tool\":\"fast\",\"args\":[]}\n").await.unwrap();
        let mut reader = BufReader::new(&mut s);
        let (mut l1, mut l2) = (String::new(), String::new());
        reader.read_line(&mut l1).await.unwrap();
        reader.read_line(&mut l2).await.unwrap();
        assert!(l1.contains("a:slow"), "{l1}");
        assert!(l2.contains("a:fast"), "{l2}");

        let r = roundtrip(&mut s, "not json\n").await;
        assert!(r.error.unwrap().starts_with("Invalid request:"));
        let r = roundtrip(&mut s, "{\"type\":\"hello\",\"tool\":\"kv\"}\n").await;
        assert_eq!(r.error.as_deref(), Some("Unknown message type: hello"));
        let r = roundtrip(&mut s, "{\"type\":\"tool_request\"}\n").await;
        assert!(r.error.unwrap().contains("missing field `tool`"));
        assert_eq!(handler.rejected.load(Ordering::SeqCst), 3);
        // The rejected line itself goes to the handler (for the audit excerpt).
        assert_eq!(handler.raw.lock().unwrap()[0], b"not json");

        // An oversized line is refused and the connection closed.
        let mut big = UnixStream::connect(&path).await.unwrap();
        big.write_all(&vec![b'x'; 5000]).await.unwrap();
        let out = read_all(big).await;
        assert!(out.contains("line longer than 1000 bytes"), "{out}");
        let raw = handler.raw.lock().unwrap().last().unwrap().clone();
        assert!(!raw.is_empty() && raw.len() <= RAW_EXCERPT && raw.iter().all(|b| *b == b'x'));

        // A silent client is disconnected after the idle limit.
        let mut idle = UnixStream::connect(&path).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn connections_per_agent_and_descriptors_are_capped_with_an_error_line() {
        let dir = tempfile::tempdir().unwrap();
        let handler = Arc::new(Echo::default());
        let limits = SocketLimits {
            max_connections: 3,
            ..Default::default()
        };
        // The listener takes one descriptor: three connections fit in five.
        let descriptors = DescriptorBudget::new(5);
        let (_server, path) = start(&dir, handler.clone(), limits, descriptors.clone());
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut s = UnixStream::connect(&path).await.unwrap();
            let r = roundtrip(&mut s, "{\"type\":\"tool_request\",\"tool\":\"kv\"}\n").await;
            assert!(r.success, "{r:?}");
            held.push(s);
        }
        assert_eq!(descriptors.used(), 4);
        for _ in 0..5 {
            let out = read_all(UnixStream::connect(&path).await.unwrap()).await;
            let r: ToolResponse = serde_json::from_str(out.trim()).unwrap();
            let e = r.error.unwrap();
            assert!(
                e.contains("agent 'a' already has 3 connections open")
                    && e.contains("connection closed"),
                "{e}"
            );
        }
        // Reported once, not for every refused connection.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*handler.limits.lock().unwrap(), [Limit::Connections]);
        assert_eq!(descriptors.used(), 4);

        // A closed connection makes room again.
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut s = UnixStream::connect(&path).await.unwrap();
        let r = roundtrip(&mut s, "{\"type\":\"tool_request\",\"tool\":\"kv\"}\n").await;
        assert!(r.success, "{r:?}");
        held.push(s);

        // The process-wide descriptor budget binds as well: the listener and two
        // connections fill three.
        descriptors.set_max(3);
        drop(held.pop());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let out = read_all(UnixStream::connect(&path).await.unwrap()).await;
        assert!(out.contains("descriptor limit minus a reserve"), "{out}");
    }

    #[tokio::test]
    async fn unfinished_lines_of_one_agent_share_one_budget() {
        let dir = tempfile::tempdir().unwrap();
        let handler = Arc::new(Echo::default());
        let limits = SocketLimits {
            max_line: 100_000,
            max_buffered: 250_000,
            ..Default::default()
        };
        let (_server, path) = start(&dir, handler.clone(), limits, DescriptorBudget::new(100));
        // Two unfinished lines of 100 kB each fit …
        let mut open = Vec::new();
        for _ in 0..2 {
            let mut s = UnixStream::connect(&path).await.unwrap();
            s.write_all(&vec![b'x'; 100_000]).await.unwrap();
            open.push(s);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // … a third does not: that connection is told and closed.
        let mut third = UnixStream::connect(&path).await.unwrap();
        // The server reads (and drops) the rest, so the write completes.
        third.write_all(&vec![b'x'; 100_000]).await.unwrap();
        let out = read_all(third).await;
        assert!(
            out.contains("more than 250000 bytes of requests held by the gateway"),
            "{out}"
        );
        assert_eq!(*handler.limits.lock().unwrap(), [Limit::Buffered]);
        // Small calls still go through, and a closed connection gives its bytes back.
        let mut s = UnixStream::connect(&path).await.unwrap();
        let r = roundtrip(&mut s, "{\"type\":\"tool_request\",\"tool\":\"kv\"}\n").await;
        assert!(r.success, "{r:?}");
        drop(open);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut big = format!(
            "{{\"type\":\"tool_request\",\"tool\":\"kv\",\"args\":[\"{}\"]}}",
            "y".repeat(90_000)
        );
        big.push('\n');
        let r = roundtrip(&mut s, &big).await;
        assert!(r.success, "{:?}", r.error);
    }

    #[tokio::test]
    async fn calls_over_the_concurrency_wait_a_bounded_time_then_fail_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let handler = Arc::new(Echo::default());
        let limits = SocketLimits {
            concurrency: 1,
            call_wait: Duration::from_millis(300),
            ..Default::default()
        };
        let (_server, path) = start(&dir, handler.clone(), limits, DescriptorBudget::new(100));
        let mut first = UnixStream::connect(&path).await.unwrap();
        first
            .write_all(b"{\"type\":\"tool_request\",\"tool\":\"slower\"}\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut second = UnixStream::connect(&path).await.unwrap();
        let started = std::time::Instant::now();
        let r = roundtrip(&mut second, "{\"type\":\"tool_request\",\"tool\":\"kv\"}\n").await;
        assert!(started.elapsed() < Duration::from_millis(1200));
        let e = r.error.unwrap();
        assert!(
            e.contains("already has 1 tool calls running (the limit)") && e.contains("did not run"),
            "{e}"
        );
        assert_eq!(*handler.limits.lock().unwrap(), [Limit::InFlight]);
        let mut reader = BufReader::new(&mut first);
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        assert!(line.contains("a:slower"), "{line}");
    }

    #[tokio::test]
    async fn each_connection_is_attributed_from_its_peer_pid() {
        // A procfs in which this test process is a member of exec `xa`'s session in a
        // container (depth 2), and the gateway (`self`) is on the host (depth 1).
        let fake = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let write = |pid: &str, stat: String, status: &str| {
            let dir = fake.path().join(pid);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("stat"), stat).unwrap();
            std::fs::write(dir.join("status"), status).unwrap();
        };
        let stat = |pid: u32, sid: u32, start: u64| {
            format!("{pid} (x) S 1 {sid} {sid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n")
        };
        write("self", stat(me, me, 1), &format!("NSpid:\t{me}\n"));
        let leader = me.wrapping_add(100_000);
        write(
            &me.to_string(),
            stat(me, leader, 600),
            &format!("NSpid:\t{me}\t10\nNSsid:\t{leader}\t5\n"),
        );
        write(
            &leader.to_string(),
            stat(leader, leader, 500),
            &format!("NSpid:\t{leader}\t5\nNSsid:\t{leader}\t5\n"),
        );
        let execs = Arc::new(ExecRegistry::with_proc_root(fake.path()));
        let a = crate::ident::ExecId::new("xa");
        execs.register("a", &a, Default::default(), "kv");
        assert!(execs.started("a", "xa", 5, 500));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.sock");
        let handler = Arc::new(Echo::default());
        let _server = SocketServer::start(
            "a",
            &path,
            handler,
            SocketLimits::default(),
            DescriptorBudget::new(100),
            Some(execs),
        )
        .unwrap();
        let mut s = UnixStream::connect(&path).await.unwrap();
        let r = roundtrip(&mut s, "{\"type\":\"tool_request\",\"tool\":\"whoami\",\"sessionContext\":{\"execId\":\"xb\"}}\n").await;
        assert_eq!(r.output.as_deref(), Some("session-id:Some(ExecId(\"xa\"))"));
    }
}
