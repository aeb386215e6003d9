//! The per-agent tool socket: `run/<agent>/gateway.sock`, mounted at `/beige/run/` in the
//! agent's sandbox, where `/tools/bin/<tool>` launchers send their calls.
//!
//! Owns the listener and the connection rules of `sandbox.md` §3: identity is the
//! listener (the agent is fixed when the server starts; nothing in a request changes it),
//! requests on one connection are answered in order, and every bound holds — line size,
//! stdin size, idle clients, per-agent concurrency. What a request *means* (policy,
//! hooks, audit, the handler) is the [`ToolRequestHandler`]'s business.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
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

/// Handles one parsed request from an agent's socket.
#[async_trait]
pub trait ToolRequestHandler: Send + Sync {
    /// `agent` is the socket's agent — the only identity there is.
    async fn handle(&self, agent: &str, request: ToolRequest) -> ToolResponse;

    /// A request that could not be parsed; `tool` when it was readable. Used for audit.
    async fn rejected(&self, agent: &str, tool: Option<&str>, error: &str);
}

/// Bounds of one agent's socket.
#[derive(Debug, Clone, Copy)]
pub struct SocketLimits {
    /// Requests running at once for this agent; more wait.
    pub concurrency: usize,
    /// A client that sends nothing for this long is disconnected.
    pub idle: Duration,
    /// Longest request line, not counting the base64 `stdin` field.
    pub max_line: usize,
    /// Largest `stdin` after decoding.
    pub max_stdin: usize,
}

impl Default for SocketLimits {
    fn default() -> Self {
        Self {
            concurrency: 32,
            idle: Duration::from_secs(30),
            max_line: MAX_REQUEST_LINE,
            max_stdin: MAX_STDIN_BYTES,
        }
    }
}

/// A running socket server; stops and unlinks its socket when dropped.
#[derive(Debug)]
pub struct SocketServer {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl SocketServer {
    /// Bind `path` (replacing a stale socket), make it connectable by the sandbox user
    /// and serve `agent`'s requests.
    pub fn start(
        agent: &str,
        path: &Path,
        handler: Arc<dyn ToolRequestHandler>,
        limits: SocketLimits,
    ) -> std::io::Result<Self> {
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
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let conn = Connection {
                            agent: agent.clone(),
                            handler: handler.clone(),
                            permits: permits.clone(),
                            limits,
                        };
                        tokio::spawn(conn.serve(stream));
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

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

struct Connection {
    agent: Arc<str>,
    handler: Arc<dyn ToolRequestHandler>,
    permits: Arc<Semaphore>,
    limits: SocketLimits,
}

enum Line {
    Data(Vec<u8>),
    TooLong,
    Eof,
}

impl Connection {
    async fn serve(self, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut reader = BufReader::with_capacity(64 * 1024, read);
        loop {
            // Room for the base64 of the largest stdin on top of the line limit.
            let hard_max = self.limits.max_line + self.limits.max_stdin.div_ceil(3) * 4 + 64;
            let line = match tokio::time::timeout(
                self.limits.idle,
                read_line(&mut reader, hard_max),
            )
            .await
            {
                Err(_) => {
                    tracing::debug!(agent = %self.agent, "idle socket client disconnected");
                    return;
                }
                Ok(Err(_)) | Ok(Ok(Line::Eof)) => return,
                Ok(Ok(Line::TooLong)) => {
                    let msg = format!(
                        "Invalid request: line longer than {} bytes (stdin over {} bytes or too many arguments); connection closed",
                        self.limits.max_line, self.limits.max_stdin
                    );
                    self.handler.rejected(&self.agent, None, &msg).await;
                    let _ = send(&mut write, &ToolResponse::error(msg, 1)).await;
                    return;
                }
                Ok(Ok(Line::Data(bytes))) if self.fits(&bytes) => bytes,
                Ok(Ok(Line::Data(_))) => {
                    let msg = format!(
                        "Invalid request: line longer than {} bytes (stdin over {} bytes or too many arguments); connection closed",
                        self.limits.max_line, self.limits.max_stdin
                    );
                    self.handler.rejected(&self.agent, None, &msg).await;
                    let _ = send(&mut write, &ToolResponse::error(msg, 1)).await;
                    return;
                }
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let response = self.answer(&line).await;
            if send(&mut write, &response).await.is_err() {
                return;
            }
        }
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

    async fn answer(&self, line: &[u8]) -> ToolResponse {
        let value: serde_json::Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                let msg = format!("Invalid request: {e}");
                self.handler.rejected(&self.agent, None, &msg).await;
                return ToolResponse::error(msg, 1);
            }
        };
        let tool = value
            .get("tool")
            .and_then(|t| t.as_str())
            .map(str::to_string);
        let kind = value.get("type").and_then(|t| t.as_str()).unwrap_or("");
        if kind != TOOL_REQUEST {
            let msg = format!("Unknown message type: {kind}");
            self.handler
                .rejected(&self.agent, tool.as_deref(), &msg)
                .await;
            return ToolResponse::error(msg, 1);
        }
        let request: ToolRequest = match serde_json::from_value(value) {
            Ok(r) => r,
            Err(e) => {
                let msg = format!("Invalid request: {e}");
                self.handler
                    .rejected(&self.agent, tool.as_deref(), &msg)
                    .await;
                return ToolResponse::error(msg, 1);
            }
        };
        let Ok(_permit) = self.permits.acquire().await else {
            return ToolResponse::error("the gateway is shutting down", 1);
        };
        self.handler.handle(&self.agent, request).await
    }
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

/// Read one `\n`-terminated line of at most `max` bytes without buffering more.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Line> {
    let mut line = Vec::new();
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if line.is_empty() {
                Line::Eof
            } else {
                Line::Data(line)
            });
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                if line.len() + i > max {
                    return Ok(Line::TooLong);
                }
                line.extend_from_slice(&buf[..i]);
                reader.consume(i + 1);
                return Ok(Line::Data(line));
            }
            None => {
                let n = buf.len();
                if line.len() + n > max {
                    return Ok(Line::TooLong);
                }
                line.extend_from_slice(buf);
                reader.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;

    #[derive(Default)]
    struct Echo {
        rejected: AtomicUsize,
    }

    #[async_trait]
    impl ToolRequestHandler for Echo {
        async fn handle(&self, agent: &str, request: ToolRequest) -> ToolResponse {
            if request.tool == "slow" {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            ToolResponse::from_result(
                format!("{agent}:{}:{}", request.tool, request.args.join(",")),
                0,
            )
        }
        async fn rejected(&self, _agent: &str, _tool: Option<&str>, _error: &str) {
            self.rejected.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn roundtrip(stream: &mut UnixStream, line: &str) -> ToolResponse {
        stream.write_all(line.as_bytes()).await.unwrap();
        let mut reader = BufReader::new(stream);
        let mut out = String::new();
        reader.read_line(&mut out).await.unwrap();
        serde_json::from_str(&out).unwrap()
    }

    #[tokio::test]
    async fn identity_order_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/a/gateway.sock");
        let handler = Arc::new(Echo::default());
        let limits = SocketLimits {
            idle: Duration::from_millis(300),
            max_line: 1000,
            max_stdin: 300,
            ..Default::default()
        };
        let _server = SocketServer::start("a", &path, handler.clone(), limits).unwrap();
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

        // An oversized line is refused and the connection closed.
        let mut big = UnixStream::connect(&path).await.unwrap();
        big.write_all(&vec![b'x'; 5000]).await.unwrap();
        let mut out = String::new();
        big.read_to_string(&mut out).await.unwrap();
        assert!(out.contains("line longer than 1000 bytes"), "{out}");

        // A silent client is disconnected after the idle limit.
        let mut idle = UnixStream::connect(&path).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 0);
    }
}
