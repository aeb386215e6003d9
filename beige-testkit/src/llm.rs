//! [`FakeLlmServer`]: a fake LLM provider on `127.0.0.1:0` that answers every request
//! (any method, any path) with the next scripted [`Reply`] — an SSE body sent as raw byte
//! chunks with optional pauses, an HTTP error, a stream cut off mid-way, or no answer at
//! all — and records each request ([`RecordedRequest`]: method, path, headers, body) for
//! assertions. Optional checks ([`FakeLlmServer::check`]) reject a bad request the way
//! the real API would (HTTP 400) and remember why ([`FakeLlmServer::violations`]). The
//! per-API byte streams live in [`crate::anthropic`] and [`crate::openai_completions`];
//! this module knows no wire format.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::watch;

/// A piece of a streamed body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Bytes written as one chunk (one HTTP/1.1 chunk on the wire).
    Bytes(Bytes),
    /// Wait this long before the next part.
    Pause(Duration),
}

/// How a streamed body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The body ends normally (whatever it contained).
    Close,
    /// The connection is aborted after the last part (the chunked body is never
    /// terminated), like a network cut.
    Cut,
    /// No more data, but the connection stays open until the client gives up.
    Hang,
}

#[derive(Debug, Clone)]
enum Kind {
    Stream { parts: Vec<Part>, end: End },
    Body(Bytes),
    Hang,
}

/// One scripted answer. Build with [`Reply::sse`], [`Reply::error`] or [`Reply::hang`].
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    kind: Kind,
}

impl Reply {
    /// `200 text/event-stream` with `body` as a single chunk (split it with
    /// [`Reply::chunked`] or [`Reply::split_at`]).
    pub fn sse(body: impl Into<Bytes>) -> Self {
        Self::sse_parts(vec![Part::Bytes(body.into())])
    }

    /// `200 text/event-stream` sent exactly as these parts.
    pub fn sse_parts(parts: Vec<Part>) -> Self {
        Self {
            status: 200,
            headers: vec![
                ("content-type".into(), "text/event-stream".into()),
                ("cache-control".into(), "no-cache".into()),
            ],
            kind: Kind::Stream {
                parts,
                end: End::Close,
            },
        }
    }

    /// An error answer: `status` with a JSON body (a `Value::String` is sent as plain
    /// text instead).
    pub fn error(status: u16, body: Value) -> Self {
        let (ct, bytes) = match body {
            Value::String(s) => ("text/plain", Bytes::from(s)),
            other => ("application/json", Bytes::from(other.to_string())),
        };
        Self {
            status,
            headers: vec![("content-type".into(), ct.into())],
            kind: Kind::Body(bytes),
        }
    }

    /// Accept the request and never answer (not even the status line).
    pub fn hang() -> Self {
        Self {
            status: 200,
            headers: Vec::new(),
            kind: Kind::Hang,
        }
    }

    /// Add a response header (e.g. `retry-after`).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    /// Change the status.
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Re-split every run of bytes into chunks of `size` bytes (pauses stay where they
    /// are). Small sizes split `data:` lines, JSON and UTF-8 characters.
    pub fn chunked(self, size: usize) -> Self {
        let size = size.max(1);
        self.map_runs(|run| run.chunks(size).map(Bytes::copy_from_slice).collect())
    }

    /// Split the bytes at these offsets, counted over all bytes of the body (pauses do
    /// not count). Use it to cut in the middle of a UTF-8 character or a line ending.
    pub fn split_at(self, offsets: &[usize]) -> Self {
        let mut offsets: Vec<usize> = offsets.to_vec();
        offsets.sort_unstable();
        let mut seen = 0usize;
        self.map_runs(move |run| {
            let start = seen;
            seen += run.len();
            let mut cuts: Vec<usize> = offsets
                .iter()
                .filter(|&&o| o > start && o < start + run.len())
                .map(|o| o - start)
                .collect();
            cuts.push(run.len());
            let mut out = Vec::new();
            let mut from = 0;
            for c in cuts {
                out.push(Bytes::copy_from_slice(&run[from..c]));
                from = c;
            }
            out
        })
    }

    /// Append bytes after the current parts.
    pub fn then_bytes(mut self, bytes: impl Into<Bytes>) -> Self {
        if let Kind::Stream { parts, .. } = &mut self.kind {
            parts.push(Part::Bytes(bytes.into()));
        }
        self
    }

    /// Append a pause after the current parts.
    pub fn then_pause(mut self, pause: Duration) -> Self {
        if let Kind::Stream { parts, .. } = &mut self.kind {
            parts.push(Part::Pause(pause));
        }
        self
    }

    /// Insert a pause right after byte `offset` of the body (splitting there).
    pub fn pause_at(self, offset: usize, pause: Duration) -> Self {
        let mut me = self.split_at(&[offset]);
        if let Kind::Stream { parts, .. } = &mut me.kind {
            let mut seen = 0usize;
            let mut at = parts.len();
            for (i, p) in parts.iter().enumerate() {
                if let Part::Bytes(b) = p {
                    seen += b.len();
                    if seen >= offset {
                        at = i + 1;
                        break;
                    }
                }
            }
            parts.insert(at.min(parts.len()), Part::Pause(pause));
        }
        me
    }

    /// Abort the connection after the last part instead of ending the body.
    pub fn cut(self) -> Self {
        self.end(End::Cut)
    }

    /// Keep the connection open, silent, after the last part.
    pub fn hang_after(self) -> Self {
        self.end(End::Hang)
    }

    /// Set how the stream ends.
    pub fn end(mut self, how: End) -> Self {
        if let Kind::Stream { end, .. } = &mut self.kind {
            *end = how;
        }
        self
    }

    /// The parts of a streamed reply (empty for other replies).
    pub fn parts(&self) -> &[Part] {
        match &self.kind {
            Kind::Stream { parts, .. } => parts,
            _ => &[],
        }
    }

    /// All bytes of the body, concatenated.
    pub fn body_bytes(&self) -> Vec<u8> {
        match &self.kind {
            Kind::Stream { parts, .. } => parts
                .iter()
                .filter_map(|p| match p {
                    Part::Bytes(b) => Some(b.as_ref()),
                    Part::Pause(_) => None,
                })
                .flatten()
                .copied()
                .collect(),
            Kind::Body(b) => b.to_vec(),
            Kind::Hang => Vec::new(),
        }
    }

    fn map_runs(mut self, mut f: impl FnMut(&[u8]) -> Vec<Bytes>) -> Self {
        if let Kind::Stream { parts, .. } = &mut self.kind {
            let mut out = Vec::new();
            let mut run: Vec<u8> = Vec::new();
            for p in parts.drain(..) {
                match p {
                    Part::Bytes(b) => run.extend_from_slice(&b),
                    Part::Pause(d) => {
                        if !run.is_empty() {
                            out.extend(f(&run).into_iter().map(Part::Bytes));
                            run.clear();
                        }
                        out.push(Part::Pause(d));
                    }
                }
            }
            if !run.is_empty() {
                out.extend(f(&run).into_iter().map(Part::Bytes));
            }
            *parts = out;
        }
        self
    }
}

/// One request the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    /// The path without the query.
    pub path: String,
    pub query: Option<String>,
    /// Header names in lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON (`Value::Null` when it is not JSON).
    pub body: Value,
    /// The body as received.
    pub raw_body: String,
}

impl RecordedRequest {
    /// The first value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Everywhere `secret` appears: `"path"`, `"query"`, `"header <name>"`, `"body"`.
    /// A client that sends its key only in its auth header gives exactly one entry.
    pub fn secret_locations(&self, secret: &str) -> Vec<String> {
        let mut at = Vec::new();
        if self.path.contains(secret) {
            at.push("path".to_string());
        }
        if self.query.as_deref().is_some_and(|q| q.contains(secret)) {
            at.push("query".to_string());
        }
        for (n, v) in &self.headers {
            if v.contains(secret) {
                at.push(format!("header {n}"));
            }
        }
        if self.raw_body.contains(secret) {
            at.push("body".to_string());
        }
        at
    }
}

type Check = Arc<dyn Fn(&RecordedRequest) -> Result<(), String> + Send + Sync>;

struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<RecordedRequest>>,
    checks: Mutex<Vec<Check>>,
    violations: Mutex<Vec<String>>,
    count: watch::Sender<usize>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts a request as in flight until its response body is finished or dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: Arc<Shared>) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A fake provider on `127.0.0.1:<random port>`. Stops when dropped.
pub struct FakeLlmServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeLlmServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeLlmServer")
            .field("addr", &self.addr)
            .field("requests", &lock(&self.shared.requests).len())
            .field("replies_left", &lock(&self.shared.replies).len())
            .finish_non_exhaustive()
    }
}

impl Drop for FakeLlmServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeLlmServer {
    /// Start on `127.0.0.1:0`.
    ///
    /// # Panics
    /// When no loopback port can be bound (test support: failing loudly is the point).
    pub async fn start() -> Self {
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", 0)).await {
            Ok(l) => l,
            Err(e) => panic!("fake LLM server: cannot bind 127.0.0.1:0: {e}"),
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => panic!("fake LLM server: no local address: {e}"),
        };
        let shared = Arc::new(Shared {
            replies: Mutex::default(),
            requests: Mutex::default(),
            checks: Mutex::default(),
            violations: Mutex::default(),
            count: watch::channel(0).0,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>` (no trailing slash): the base URL for a client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queue a reply; replies are served in order, one per request.
    pub fn push(&self, reply: Reply) -> &Self {
        lock(&self.shared.replies).push_back(reply);
        self
    }

    /// Replies not served yet.
    pub fn replies_left(&self) -> usize {
        lock(&self.shared.replies).len()
    }

    /// Reject (HTTP 400, the reply stays queued) any request for which `check` fails, and
    /// remember the failure in [`FakeLlmServer::violations`].
    pub fn check(
        &self,
        check: impl Fn(&RecordedRequest) -> Result<(), String> + Send + Sync + 'static,
    ) -> &Self {
        lock(&self.shared.checks).push(Arc::new(check));
        self
    }

    /// Require a header with exactly this value.
    pub fn require_header(&self, name: &str, value: &str) -> &Self {
        let (name, value) = (name.to_string(), value.to_string());
        self.check(move |r| match r.header(&name) {
            Some(v) if v == value => Ok(()),
            Some(_) => Err(format!("header {name} has the wrong value")),
            None => Err(format!("header {name} is missing")),
        })
    }

    /// Why requests were rejected by the checks, in order.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.shared.violations).clone()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// The last request received.
    pub fn last_request(&self) -> Option<RecordedRequest> {
        lock(&self.shared.requests).last().cloned()
    }

    pub fn request_count(&self) -> usize {
        lock(&self.shared.requests).len()
    }

    /// Wait until at least `n` requests have arrived.
    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.shared.count.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// Requests being answered right now (a streamed answer counts until its body ends).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }
}

fn json_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message}
    });
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let guard = InFlight::new(shared.clone());
    let (head, body) = req.into_parts();
    let raw = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("fake server: {e}")),
    };
    let raw_body = String::from_utf8_lossy(&raw).into_owned();
    let recorded = RecordedRequest {
        method: head.method.to_string(),
        path: head.uri.path().to_string(),
        query: head.uri.query().map(str::to_string),
        headers: head
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
        raw_body,
    };
    let checks: Vec<Check> = lock(&shared.checks).clone();
    let failures: Vec<String> = checks.iter().filter_map(|c| c(&recorded).err()).collect();
    {
        let mut requests = lock(&shared.requests);
        requests.push(recorded);
        let n = requests.len();
        shared.count.send_replace(n);
    }
    if !failures.is_empty() {
        let msg = format!("fake server: {}", failures.join("; "));
        lock(&shared.violations).extend(failures);
        return json_error(StatusCode::BAD_REQUEST, &msg);
    }
    let Some(reply) = lock(&shared.replies).pop_front() else {
        return json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "fake server: no scripted reply left",
        );
    };
    let body = match reply.kind {
        Kind::Hang => {
            let _guard = guard;
            std::future::pending::<()>().await;
            return json_error(StatusCode::INTERNAL_SERVER_ERROR, "unreachable");
        }
        Kind::Body(bytes) => {
            drop(guard);
            Body::from(bytes)
        }
        Kind::Stream { parts, end } => stream_body(parts, end, guard),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    for (n, v) in &reply.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            resp.headers_mut().append(n, v);
        }
    }
    resp
}

fn stream_body(parts: Vec<Part>, end: End, guard: InFlight) -> Body {
    let state = (VecDeque::from(parts), end, guard, false);
    let stream =
        futures_util::stream::unfold(state, |(mut parts, end, guard, finished)| async move {
            if finished {
                return None;
            }
            loop {
                match parts.pop_front() {
                    Some(Part::Bytes(b)) => {
                        return Some((Ok::<Bytes, std::io::Error>(b), (parts, end, guard, false)))
                    }
                    Some(Part::Pause(d)) => tokio::time::sleep(d).await,
                    None => match end {
                        End::Close => return None,
                        End::Hang => std::future::pending::<()>().await,
                        End::Cut => {
                            // Let hyper flush what was sent before aborting the connection.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            return Some((
                                Err(std::io::Error::other("fake server: connection cut")),
                                (parts, end, guard, true),
                            ));
                        }
                    },
                }
            }
        });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitting_keeps_bytes_and_pauses() {
        let r = Reply::sse("abcdefgh")
            .then_pause(Duration::from_millis(1))
            .then_bytes("ij")
            .chunked(3);
        assert_eq!(r.body_bytes(), b"abcdefghij");
        let sizes: Vec<Option<usize>> = r
            .parts()
            .iter()
            .map(|p| match p {
                Part::Bytes(b) => Some(b.len()),
                Part::Pause(_) => None,
            })
            .collect();
        assert_eq!(sizes, vec![Some(3), Some(3), Some(2), None, Some(2)]);
        let r = Reply::sse("héllo").split_at(&[2]);
        assert_eq!(r.parts().len(), 2);
        assert_eq!(r.body_bytes(), "héllo".as_bytes());
        let r = Reply::sse("abcdef").pause_at(4, Duration::from_millis(1));
        assert_eq!(r.parts().len(), 3);
        assert!(matches!(r.parts()[1], Part::Pause(_)));
    }
}
