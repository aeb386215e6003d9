//! Inspect mode (spec `egress.md` §5.2, §5.3): the gateway terminates an agent's TLS,
//! reads each HTTP request, decides it again with the stream's [`RuleSet`], injects the
//! credential bound to the host and scrubs the secret from what comes back.
//!
//! After the engine has decided a CONNECT, resolved, classified, pinned and dialled its
//! address, answered `200` and checked the ClientHello's SNI, a stream that
//! `needs_inspect` comes here with the client's bytes so far and the dialled upstream.
//! [`Inspector`] then:
//!
//! - shows the client a leaf for the exact name from the per-home [`EgressCa`] (ALPN
//!   `http/1.1` only: HTTP/2 is not served yet, so clients fall back to HTTP/1.1);
//! - serves HTTP/1.1 with keep-alive; for each request, `Host` must name the target
//!   (else `403 host_mismatch`), then the method and path go through
//!   [`RuleSet::decide`]; a refusal is a `403` with its `X-Beige-Egress` header on the
//!   same connection, which stays open;
//! - on a route with a bound [`Credential`], sets its header (dropping the client's
//!   value) and `Accept-Encoding: identity`, and masks the secret, raw or base64, in the
//!   response headers and the first [`SCRUB_LIMIT`] bytes of the body with `*` of the
//!   same length ([`Scrubber`]; `Content-Length` stays right);
//! - forwards over TLS (SNI = the name; `webpki-roots` plus the configured extra roots)
//!   on the pinned address: the connection the engine dialled first, the same address
//!   again when the upstream closed it (nothing is resolved again);
//! - records one [`RequestRecord`] per request through the engine's [`EgressAudit`],
//!   when its response has been sent. No record, header or error carries the secret.
//!
//! WebSocket upgrades and HTTP/2 are out of scope for now: `Upgrade` is dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::broker::{Broker, Misuse, RequestBody};
use super::ca::EgressCa;
use super::config::{Credential, Delivery};
use super::engine::EgressAudit;
use super::http;
use super::placeholder::PlaceholderKey;
use super::rules::{DenyReason, Request as RuleRequest, RuleSet, Verdict};
use super::target::{parse_authority, Host, Target};
use super::upstream::{BoxUpstream, Dialer};
use crate::sandbox::{StreamReader, StreamWriter};

/// Body bytes of each response the secret is masked in; the rest passes as it is.
pub const SCRUB_LIMIT: u64 = 16 * 1024 * 1024;
/// How long a TLS handshake (client or upstream) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Headers that belong to one hop and are never forwarded.
const HOP_HEADERS: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// Why an [`Inspector`] could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// An extra root is not a usable CA certificate.
    #[error("extra root {index}: {message}")]
    BadRoot {
        /// Its position in the list given.
        index: usize,
        /// What rustls said.
        message: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(String),
}

/// One record of an inspected request, for the audit log (`tool: egress.request`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestRecord {
    /// The stream's id (the connection record's).
    pub id: String,
    /// The agent whose sandbox sent it.
    pub agent: String,
    /// Its place on the stream, from 1.
    pub seq: u64,
    /// The method as sent.
    pub method: String,
    /// The path as sent, without the query.
    pub path: String,
    /// The target host.
    pub host: String,
    /// The target port.
    pub port: u16,
    /// The status the client got (0 when no response was sent).
    pub status: u16,
    /// From the request head to the end of the response.
    pub duration: Duration,
    /// Whether a credential was set in it.
    pub substituted: bool,
    /// How many times the secret was masked in its response.
    pub scrubbed: u64,
    /// The rule that allowed or refused it.
    pub rule: Option<String>,
    /// The credential bound to its route, by name.
    pub credential: Option<String>,
    /// Why it was refused; `None` when it was forwarded.
    pub reason: Option<DenyReason>,
    /// What went wrong upstream or on the way, in words.
    pub error: Option<String>,
    /// The exec whose placeholder was swapped in, when one was.
    pub exec: Option<String>,
    /// A placeholder headed for a host its credential is not bound to.
    pub misuse: Option<Misuse>,
}

/// Terminates inspected streams: the CA for the client side, the trust for the upstream
/// side. One per engine.
pub struct Inspector {
    ca: Arc<EgressCa>,
    client_tls: Arc<rustls::ClientConfig>,
    placeholders: Option<Arc<PlaceholderKey>>,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in the PEM file at `path` (e.g. an `egress.tls.extraRoots` entry).
pub fn read_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not PEM certificates ({e})", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

impl Inspector {
    /// An inspector signing leaves with `ca` and trusting, upstream, the public roots
    /// (`webpki-roots`) and `extra_roots`.
    pub fn new(
        ca: Arc<EgressCa>,
        extra_roots: Vec<CertificateDer<'static>>,
    ) -> Result<Self, InspectError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for (index, root) in extra_roots.into_iter().enumerate() {
            roots.add(root).map_err(|e| InspectError::BadRoot {
                index,
                message: e.to_string(),
            })?;
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| InspectError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca,
            client_tls: Arc::new(client),
            placeholders: None,
        })
    }

    /// The same inspector brokering placeholders made with `key`: swapped on their
    /// credentials' routes, refused everywhere else.
    pub fn with_placeholders(mut self, key: Arc<PlaceholderKey>) -> Self {
        self.placeholders = Some(key);
        self
    }

    /// The CA the leaves are signed by.
    pub fn ca(&self) -> &Arc<EgressCa> {
        &self.ca
    }

    /// Serves one inspected stream to its end: `first` is what the client sent after the
    /// `200` (its ClientHello so far), `upstream` the connection to the pinned address.
    pub(crate) async fn serve(
        &self,
        session: Session<'_>,
        reader: StreamReader,
        writer: StreamWriter,
        first: Vec<u8>,
        upstream: BoxUpstream,
    ) -> Outcome {
        let up = Arc::new(AtomicU64::new(0));
        let down = Arc::new(AtomicU64::new(0));
        let outcome = |error: Option<String>| Outcome {
            bytes_up: up.load(Ordering::Relaxed),
            bytes_down: down.load(Ordering::Relaxed),
            error,
        };
        let name = session.target.host.to_string();
        let leaf = match self.ca.leaf(&name) {
            Ok(leaf) => leaf,
            Err(e) => return outcome(Some(format!("no leaf certificate: {e}"))),
        };
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| {
                b.with_no_client_auth()
                    .with_single_cert(leaf.chain.clone(), leaf.key.clone_key())
            });
        let mut config = match config {
            Ok(c) => c,
            Err(e) => return outcome(Some(format!("TLS configuration: {e}"))),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];

        let client = Counted {
            inner: tokio::io::join(
                Prefixed {
                    prefix: first,
                    pos: 0,
                    inner: reader,
                },
                writer,
            ),
            read: up.clone(),
            written: down.clone(),
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(client)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                return outcome(Some(format!(
                    "the TLS handshake with the client failed (does it trust the beige \
                     egress CA?): {e}"
                )))
            }
            Err(_) => return outcome(Some("the client's TLS handshake took too long".into())),
        };
        if let Host::Name(expected) = &session.target.host {
            let sni = tls.get_ref().1.server_name();
            if sni != Some(expected.as_str()) {
                return outcome(Some(match sni {
                    Some(s) => format!("the TLS client named '{s}' (sni_mismatch)"),
                    None => "the TLS client named no server (sni_missing)".into(),
                }));
            }
        }

        let (records, mut drain) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            agent: session.agent.to_string(),
            id: session.id.to_string(),
            target: session.target.clone(),
            credential: session.rules.credential_for(&session.target.host).cloned(),
            placeholders: self.placeholders.clone().filter(|_| {
                session
                    .rules
                    .credentials()
                    .iter()
                    .any(|c| matches!(c.delivery, Delivery::Placeholder { .. }))
            }),
            rules: session.rules,
            seq: AtomicU64::new(0),
            pool: tokio::sync::Mutex::new(Pool {
                fresh: Some(upstream),
                sender: None,
            }),
            client_tls: self.client_tls.clone(),
            dialer: session.dialer,
            pinned: session.pinned,
            records,
        });
        let service = hyper::service::service_fn(move |req| {
            let shared = shared.clone();
            async move { Ok::<_, Infallible>(handle(&shared, req).await) }
        });
        let server = async move {
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(true)
                .serve_connection(TokioIo::new(tls), service)
                .await
        };
        let audit = session.audit;
        let write_records = async move {
            while let Some(record) = drain.recv().await {
                if let Err(e) = audit.record_request(&record).await {
                    tracing::error!(
                        agent = record.agent,
                        "egress: a request's audit record cannot be written: {e}"
                    );
                }
            }
        };
        let (served, ()) = tokio::join!(server, write_records);
        outcome(served.err().and_then(|e| {
            // A client that goes away between requests, or before its close is answered,
            // is the normal end.
            (!e.is_incomplete_message() && !e.is_shutdown())
                .then(|| format!("the inspected connection broke: {e}"))
        }))
    }
}

/// What the engine hands an inspected stream over with.
pub(crate) struct Session<'a> {
    /// The agent.
    pub agent: &'a str,
    /// The stream's id.
    pub id: &'a str,
    /// Where it goes.
    pub target: &'a Target,
    /// The rules it was decided with (credentials included).
    pub rules: Arc<RuleSet>,
    /// Where the request records go.
    pub audit: &'a dyn EgressAudit,
    /// To dial the pinned address again when the upstream closed its connection.
    pub dialer: Arc<dyn Dialer>,
    /// The pinned, checked address.
    pub pinned: SocketAddr,
}

/// How an inspected stream ended.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Bytes from the client (TLS included).
    pub bytes_up: u64,
    /// Bytes to the client (TLS included).
    pub bytes_down: u64,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// What every request of one inspected stream shares.
struct Shared {
    agent: String,
    id: String,
    target: Target,
    rules: Arc<RuleSet>,
    credential: Option<Credential>,
    /// The key, when the agent has placeholder credentials (then every request is
    /// scanned).
    placeholders: Option<Arc<PlaceholderKey>>,
    seq: AtomicU64,
    pool: tokio::sync::Mutex<Pool>,
    client_tls: Arc<rustls::ClientConfig>,
    dialer: Arc<dyn Dialer>,
    pinned: SocketAddr,
    records: mpsc::UnboundedSender<RequestRecord>,
}

/// The upstream side: the connection the engine dialled, until it is used, and the
/// HTTP/1.1 client on it.
struct Pool {
    fresh: Option<BoxUpstream>,
    sender: Option<hyper::client::conn::http1::SendRequest<RequestBody>>,
}

impl Shared {
    /// A new HTTP/1.1 client connection to the pinned address, over TLS.
    async fn connect(
        &self,
        fresh: Option<BoxUpstream>,
    ) -> Result<hyper::client::conn::http1::SendRequest<RequestBody>, (&'static str, String)> {
        let tcp = match fresh {
            Some(tcp) => tcp,
            None => self.dialer.dial(self.pinned).await.map_err(|e| {
                (
                    "connect_failed",
                    format!("cannot connect to {}: {e}", self.pinned),
                )
            })?,
        };
        let server_name = match &self.target.host {
            Host::Name(n) => ServerName::try_from(n.clone()),
            Host::Ip(ip) => Ok(ServerName::from(*ip)),
        }
        .map_err(|e| ("tls_failed", e.to_string()))?;
        let connector = tokio_rustls::TlsConnector::from(self.client_tls.clone());
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(server_name, tcp))
            .await
        {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => return Err(("tls_failed", format!("upstream TLS: {e}"))),
            Err(_) => return Err(("timeout", "the upstream TLS handshake took too long".into())),
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| ("protocol_error", e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Sends `req` upstream, on the open connection or a new one to the pinned address.
    async fn send(
        &self,
        req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, (&'static str, String)> {
        let mut pool = self.pool.lock().await;
        for _ in 0..2 {
            if pool.sender.as_ref().is_none_or(|s| s.is_closed()) {
                let fresh = pool.fresh.take();
                pool.sender = Some(self.connect(fresh).await?);
            }
            let Some(sender) = pool.sender.as_mut() else {
                continue;
            };
            if sender.ready().await.is_err() {
                pool.sender = None;
                continue;
            }
            return sender
                .send_request(req)
                .await
                .map_err(|e| ("upstream_failed", e.to_string()));
        }
        Err(("upstream_failed", "the upstream keeps closing".into()))
    }
}

/// The record of one request, sent when it is dropped (with the response's end).
struct Tracker {
    record: RequestRecord,
    started: Instant,
    records: mpsc::UnboundedSender<RequestRecord>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.record.duration = self.started.elapsed();
        let _ = self.records.send(self.record.clone());
    }
}

/// One request: checked, forwarded with the credential, its response scrubbed.
async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<InspectBody> {
    let seq = shared.seq.fetch_add(1, Ordering::Relaxed) + 1;
    let path = req.uri().path().to_string();
    let method = req.method().as_str().to_string();
    let mut tracker = Tracker {
        record: RequestRecord {
            id: shared.id.clone(),
            agent: shared.agent.clone(),
            seq,
            method: method.clone(),
            path: path.clone(),
            host: shared.target.host.to_string(),
            port: shared.target.port,
            status: 0,
            duration: Duration::ZERO,
            substituted: false,
            scrubbed: 0,
            rule: None,
            credential: None,
            reason: None,
            error: None,
            exec: None,
            misuse: None,
        },
        started: Instant::now(),
        records: shared.records.clone(),
    };

    // The request must be for the host the TLS name (and the CONNECT) named.
    if let Err(seen) = host_matches(&req, &shared.target) {
        tracker.record.error = Some(seen);
        return refuse(shared, tracker, DenyReason::HostMismatch, None);
    }
    // The one matcher, again, with method and path.
    let verdict = shared.rules.decide(
        &shared.target,
        Some(RuleRequest {
            method: &method,
            path: &path,
        }),
    );
    match verdict {
        Verdict::Allow(allowed) => tracker.record.rule = Some(allowed.rule),
        Verdict::Deny(denied) => return refuse(shared, tracker, denied.reason, denied.rule),
    }

    let (mut parts, body) = req.into_parts();
    parts.version = hyper::Version::HTTP_11;
    let host = shared.target.host.to_string();
    // With placeholders about, the request is scanned before anything is forwarded: a
    // valid one headed for a host its credential is not bound to is refused here.
    let body = match &shared.placeholders {
        Some(key) => {
            let (body, prefix) = match RequestBody::buffered(body).await {
                Ok(read) => read,
                Err(e) => {
                    tracker.record.error = Some(format!("the request body broke: {e}"));
                    return refuse(shared, tracker, DenyReason::BadRequest, None);
                }
            };
            let broker = Broker {
                key,
                agent: &shared.agent,
                credentials: shared.rules.credentials(),
            };
            let line = format!("{} {}", parts.method, parts.uri);
            if let Some(misuse) = broker.misuse(&host, line.as_bytes(), &parts.headers, &prefix) {
                tracker.record.credential = Some(misuse.credential.clone());
                tracker.record.misuse = Some(misuse);
                return refuse(shared, tracker, DenyReason::PlaceholderMisuse, None);
            }
            body
        }
        None => RequestBody::streaming(body),
    };
    if let Some(pq) = parts.uri.path_and_query().cloned() {
        parts.uri = hyper::Uri::from(pq);
    }
    drop_hop_headers(&mut parts.headers);
    if let Some(credential) = &shared.credential {
        tracker.record.credential = Some(credential.name.clone());
        match (&credential.delivery, &shared.placeholders) {
            (Delivery::Inject { .. }, _) => {
                let Some((header, value)) = credential.header_value() else {
                    return upstream_error(shared, tracker, "credential_invalid");
                };
                match (
                    HeaderName::from_bytes(header.as_bytes()),
                    HeaderValue::from_str(&value),
                ) {
                    (Ok(name), Ok(mut value)) => {
                        value.set_sensitive(true);
                        parts.headers.remove(&name);
                        parts.headers.insert(name, value);
                        tracker.record.substituted = true;
                    }
                    _ => {
                        tracker.record.error = Some("the credential is not a valid header".into());
                        return upstream_error(shared, tracker, "credential_invalid");
                    }
                }
            }
            (Delivery::Placeholder { .. }, Some(key)) => {
                let broker = Broker {
                    key,
                    agent: &shared.agent,
                    credentials: shared.rules.credentials(),
                };
                match broker.substitute(credential, &mut parts.headers, &mut parts.uri) {
                    Ok(exec) => {
                        tracker.record.substituted = exec.is_some();
                        tracker.record.exec = exec;
                    }
                    Err(reason) => {
                        tracker.record.error =
                            Some("the request with the secret is not valid HTTP".into());
                        return upstream_error(shared, tracker, reason);
                    }
                }
                if !tracker.record.substituted && credential.require {
                    return refuse(shared, tracker, DenyReason::CredentialRequired, None);
                }
            }
            (Delivery::Placeholder { .. }, None) => {
                tracker.record.error = Some("no placeholder key".into());
                return upstream_error(shared, tracker, "credential_invalid");
            }
        }
        if credential.scrub {
            parts.headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
    }

    let response = match shared.send(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err((reason, e)) => {
            tracker.record.error = Some(e);
            return upstream_error(shared, tracker, reason);
        }
    };
    let (mut parts, body) = response.into_parts();
    drop_hop_headers(&mut parts.headers);
    let scrubber = shared.credential.as_ref().filter(|c| c.scrub).map(|c| {
        let mut headers = Scrubber::new(c.secret.expose());
        scrub_headers(&mut headers, &mut parts.headers);
        tracker.record.scrubbed += headers.count();
        Box::new(Scrubber::new(c.secret.expose()))
    });
    tracker.record.status = parts.status.as_u16();
    Response::from_parts(
        parts,
        InspectBody {
            kind: Kind::Upstream {
                inner: body,
                scrubber,
                pending: None,
                done: false,
            },
            tracker: Some(tracker),
        },
    )
}

/// `Ok` when the request names the target (its `Host`, and an absolute URI's authority);
/// else what it named.
fn host_matches(req: &Request<Incoming>, target: &Target) -> Result<(), String> {
    let names = |value: &str| parse_authority(value, target.port).is_ok_and(|t| &t == target);
    if let Some(authority) = req.uri().authority() {
        if !names(authority.as_str()) {
            return Err(format!(
                "the request is for '{}'",
                authority.as_str().escape_debug()
            ));
        }
    }
    let hosts: Vec<&HeaderValue> = req.headers().get_all(header::HOST).iter().collect();
    match hosts.as_slice() {
        [one] => match one.to_str() {
            Ok(v) if names(v) => Ok(()),
            Ok(v) => Err(format!("Host: {}", v.escape_debug())),
            Err(_) => Err("Host is not text".into()),
        },
        [] => Err("the request has no Host".into()),
        _ => Err("the request has several Host headers".into()),
    }
}

fn drop_hop_headers(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_HEADERS {
        headers.remove(name);
    }
}

/// Masks the secret in every header value; values it is found in are replaced.
fn scrub_headers(scrubber: &mut Scrubber, headers: &mut HeaderMap) {
    for value in headers.values_mut() {
        let before = scrubber.count();
        let masked = scrubber.scrub_all(value.as_bytes());
        if scrubber.count() > before {
            if let Ok(mut v) = HeaderValue::from_bytes(&masked) {
                v.set_sensitive(value.is_sensitive());
                *value = v;
            }
        }
    }
}

/// A `403` with its `X-Beige-Egress` header, on the open connection.
fn refuse(
    shared: &Shared,
    mut tracker: Tracker,
    reason: DenyReason,
    rule: Option<String>,
) -> Response<InspectBody> {
    let (value, body) = http::refusal_parts(
        reason.as_str(),
        reason.explain(),
        &shared.target.to_string(),
        &shared.agent,
        &shared.id,
    );
    tracker.record.reason = Some(reason);
    if rule.is_some() {
        tracker.record.rule = rule;
    }
    text_response(StatusCode::FORBIDDEN, &value, body, tracker)
}

/// A `502` (or `504` on a timeout) with `X-Beige-Egress: upstream-error; reason=…`.
fn upstream_error(shared: &Shared, tracker: Tracker, reason: &str) -> Response<InspectBody> {
    let (value, body) =
        http::upstream_error_parts(reason, &shared.target.to_string(), &shared.agent);
    let status = if reason == "timeout" {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    text_response(status, &value, body, tracker)
}

fn text_response(
    status: StatusCode,
    egress_header: &str,
    body: String,
    mut tracker: Tracker,
) -> Response<InspectBody> {
    tracker.record.status = status.as_u16();
    let mut response = Response::new(InspectBody {
        kind: Kind::Full(Some(Bytes::from(body))),
        tracker: Some(tracker),
    });
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(egress_header) {
        headers.insert(HeaderName::from_static("x-beige-egress"), v);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A response body: a fixed one (refusals) or the upstream's, scrubbed. It carries the
/// request's record, which is sent when the body is done or dropped.
pub(crate) struct InspectBody {
    kind: Kind,
    tracker: Option<Tracker>,
}

enum Kind {
    Full(Option<Bytes>),
    Upstream {
        inner: Incoming,
        scrubber: Option<Box<Scrubber>>,
        /// Trailers held back until the scrubber's last bytes went out.
        pending: Option<Frame<Bytes>>,
        done: bool,
    },
}

impl Drop for InspectBody {
    fn drop(&mut self) {
        if let (
            Kind::Upstream {
                scrubber: Some(s), ..
            },
            Some(tracker),
        ) = (&self.kind, self.tracker.as_mut())
        {
            tracker.record.scrubbed += s.count();
        }
    }
}

impl Body for InspectBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        match &mut this.kind {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Upstream {
                inner,
                scrubber,
                pending,
                done,
            } => loop {
                if let Some(frame) = pending.take() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if *done {
                    return Poll::Ready(None);
                }
                let frame = match Pin::new(&mut *inner).poll_frame(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(frame) => frame,
                };
                let Some(s) = scrubber.as_mut() else {
                    if frame.is_none() {
                        *done = true;
                    }
                    return Poll::Ready(frame);
                };
                match frame {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            let out = s.push(&data);
                            if !out.is_empty() {
                                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                            }
                        }
                        Err(trailers) => {
                            let out = s.finish();
                            if out.is_empty() {
                                return Poll::Ready(Some(Ok(trailers)));
                            }
                            *pending = Some(trailers);
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    },
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                    None => {
                        *done = true;
                        let out = s.finish();
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(bytes) => bytes.is_none(),
            Kind::Upstream { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Kind::Full(None) => SizeHint::with_exact(0),
            // Masking keeps every length.
            Kind::Upstream { inner, .. } => inner.size_hint(),
        }
    }
}

/// Masks a secret, raw and base64, in a stream of bytes with `*` of the same length.
///
/// The forms masked: the secret's bytes; its standard base64 with and without padding and
/// its URL-safe base64; and, so it is found inside a longer base64 text (a Basic
/// credential, say), the part of its base64 that does not depend on its neighbours in
/// each of the three alignments. Bytes are held back (`len − 1` of the longest form)
/// until it is known that no form starts in them, so splitting the input anywhere gives
/// the same output and the same count. Only the first [`SCRUB_LIMIT`] bytes are looked
/// at.
#[derive(Clone)]
pub struct Scrubber {
    forms: Vec<Vec<u8>>,
    longest: usize,
    carry: Vec<u8>,
    /// Leading carry bytes a match already found covers.
    masked: usize,
    /// Where the last counted match ended (absolute offset).
    counted_end: u64,
    /// Bytes taken in so far.
    seen: u64,
    count: u64,
    limit: u64,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("forms", &self.forms.len())
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// The shortest base64 fragment worth masking (shorter ones would mask noise).
const MIN_FRAGMENT: usize = 8;

impl Scrubber {
    /// A scrubber for `secret` (an empty secret masks nothing).
    pub fn new(secret: &str) -> Self {
        Self::with_limit(secret, SCRUB_LIMIT)
    }

    /// A scrubber that looks at the first `limit` bytes only.
    pub fn with_limit(secret: &str, limit: u64) -> Self {
        let raw = secret.as_bytes();
        let mut forms: Vec<Vec<u8>> = Vec::new();
        if !raw.is_empty() {
            forms.push(raw.to_vec());
            let b64 = base64::engine::general_purpose::STANDARD;
            for encoded in [
                b64.encode(raw),
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw),
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw),
            ] {
                forms.push(encoded.into_bytes());
            }
            let n = raw.len();
            for k in 0..3usize {
                let mut shifted = vec![0u8; k];
                shifted.extend_from_slice(raw);
                let encoded = b64.encode(&shifted);
                // Characters made only of the secret's bits.
                let start = (8 * k).div_ceil(6);
                let end = (8 * (k + n)) / 6;
                if end >= start + MIN_FRAGMENT {
                    if let Some(core) = encoded.as_bytes().get(start..end) {
                        forms.push(core.to_vec());
                    }
                }
            }
        }
        forms.sort();
        forms.dedup();
        let longest = forms.iter().map(Vec::len).max().unwrap_or(0);
        Self {
            forms,
            longest,
            carry: Vec::new(),
            masked: 0,
            counted_end: 0,
            seen: 0,
            count: 0,
            limit,
        }
    }

    /// How many occurrences were masked so far (overlapping forms count once).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The next bytes of the stream, masked; some may be held back until the next call
    /// or [`Scrubber::finish`].
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let taken = self.seen.saturating_add(self.carry.len() as u64);
        if taken >= self.limit || self.forms.is_empty() {
            let mut out = std::mem::take(&mut self.carry);
            self.masked = 0;
            out.extend_from_slice(chunk);
            return out;
        }
        let room = usize::try_from(self.limit - taken).unwrap_or(usize::MAX);
        if chunk.len() > room {
            let (scanned, rest) = chunk.split_at(room);
            let mut out = self.scan(scanned, false);
            out.extend(self.scan(&[], true));
            out.extend_from_slice(rest);
            return out;
        }
        self.scan(chunk, false)
    }

    /// The bytes held back, masked: the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        self.scan(&[], true)
    }

    /// Masks `bytes` as a whole (a header value): [`Scrubber::push`] then
    /// [`Scrubber::finish`], with no limit.
    pub fn scrub_all(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = self.scan(bytes, false);
        out.extend(self.scan(&[], true));
        out
    }

    fn scan(&mut self, chunk: &[u8], last: bool) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(chunk);
        let boundary = if last {
            buf.len()
        } else {
            buf.len().saturating_sub(self.longest.saturating_sub(1))
        };
        // Every match that starts before the boundary fits in `buf`.
        let mut matches: Vec<(usize, usize)> = Vec::new();
        for form in &self.forms {
            if form.len() > buf.len() {
                continue;
            }
            let first = form[0];
            let mut at = 0;
            while at < boundary && at + form.len() <= buf.len() {
                if buf[at] == first && buf[at..].starts_with(form) {
                    matches.push((at, at + form.len()));
                }
                at += 1;
            }
        }
        matches.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let base = self.seen;
        let mut ranges = vec![(0, self.masked)];
        for (start, end) in matches {
            let (abs_start, abs_end) = (base + start as u64, base + end as u64);
            if abs_start >= self.counted_end {
                self.count += 1;
                self.counted_end = abs_end;
            } else {
                self.counted_end = self.counted_end.max(abs_end);
            }
            ranges.push((start, end));
        }
        // The carry keeps the original bytes, so the next chunk matches as the whole
        // stream would; what is already known to be masked in it is remembered.
        let mut out = buf;
        let carry = out.split_off(boundary);
        let mut mask_end = 0;
        for (start, end) in ranges {
            mask_end = mask_end.max(end);
            let stop = end.min(out.len());
            if let Some(run) = out.get_mut(start..stop) {
                run.fill(b'*');
            }
        }
        self.masked = mask_end.saturating_sub(boundary);
        self.seen += boundary as u64;
        self.carry = carry;
        out
    }
}

/// Reads `prefix` first, then `inner`.
struct Prefixed {
    prefix: Vec<u8>,
    pos: usize,
    inner: StreamReader,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Some(rest) = this.prefix.get(this.pos..).filter(|r| !r.is_empty()) {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.pos += n;
            return Poll::Ready(Ok(()));
        }
        this.inner.as_mut().poll_read(cx, buf)
    }
}

/// Counts the bytes read from and written to `inner`.
struct Counted<T> {
    inner: T,
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            let n = buf.filled().len().saturating_sub(before);
            this.read.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &polled {
            this.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "inspect_tests.rs"]
mod tests;
