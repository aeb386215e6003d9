//! Shared pieces of the Docker egress tests: the test resolver and dialer, a TLS upstream
//! on `127.0.0.1:0`, a servable bare repository, and audit readers.
//!
//! Loopback only. The test [`Resolver`] maps the test names to public-looking and to
//! private addresses; the test [`Dialer`] maps `11.0.0.1:443` to the upstream's
//! loopback port and refuses (and records) any other address, so the production
//! classifier and rules run unchanged and nothing is ever sent anywhere else.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_core::api::tools::{ContentBlock, CoreToolCall, ExecParams, ToolContext};
use beige_core::audit::AuditRecord;
use beige_core::egress::upstream::{BoxUpstream, Dialer, ResolveError, Resolver};
use beige_core::{Gateway, LocalGateway};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::support::TestHome;

pub(crate) const IMAGE: &str = "beige-test-debian:bookworm";
pub(crate) const API: &str = "api.example.test";
/// A host with a brokered credential: inspected.
pub(crate) const INJECT: &str = "inject.example.test";
pub(crate) const SECRET: &str = "ghp_dockerSecret0123456789abcdefXYZ";
pub(crate) const PUBLIC_IP: &str = "11.0.0.1";

#[derive(Debug)]
pub(crate) struct TestResolver(pub(crate) HashMap<&'static str, Result<Vec<IpAddr>, ()>>);

#[async_trait]
impl Resolver for TestResolver {
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
        match self.0.get(name) {
            Some(Ok(addrs)) => Ok(addrs.clone()),
            _ => Err(ResolveError::NoAddresses {
                name: name.to_string(),
            }),
        }
    }
}

/// Dials `11.0.0.1:443` on the upstream's loopback port; records every other address
/// and refuses it (it must never be asked for one).
#[derive(Debug)]
pub(crate) struct TestDialer {
    pub(crate) upstream: SocketAddr,
    pub(crate) unexpected: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Dialer for TestDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        if addr != SocketAddr::new(PUBLIC_IP.parse().unwrap(), 443) {
            self.unexpected.lock().unwrap().push(addr);
            return Err(std::io::Error::other(
                "the test dialer refuses this address",
            ));
        }
        let s = tokio::net::TcpStream::connect(self.upstream).await?;
        Ok(Box::pin(s))
    }
}

/// A TLS server on `127.0.0.1:0` for `api.example.test` and `inject.example.test`,
/// answering every request with a fixed body and the `Authorization` it got; records the
/// SNI and the request head of every handshake.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    pub(crate) ca_pem: String,
    pub(crate) snis: Arc<Mutex<Vec<String>>>,
    pub(crate) heads: Arc<Mutex<Vec<String>>>,
}

pub(crate) async fn tls_upstream(repo: std::path::PathBuf) -> Upstream {
    tls_upstream_named(repo, &[API, INJECT]).await
}

/// [`tls_upstream`] with a certificate for `names`.
pub(crate) async fn tls_upstream_named(repo: std::path::PathBuf, names: &[&str]) -> Upstream {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "beige egress test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let snis = Arc::new(Mutex::new(Vec::new()));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = snis.clone();
    let seen_heads = heads.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            let seen_heads = seen_heads.clone();
            let repo = repo.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let Some(sni) = tls.get_ref().1.server_name() {
                    seen.lock().unwrap().push(sni.to_string());
                }
                let mut buf = vec![0u8; 16 * 1024];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let request = String::from_utf8_lossy(&got).into_owned();
                seen_heads.lock().unwrap().push(request.clone());
                let auth = request
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .starts_with("authorization:")
                            .then(|| l["authorization:".len()..].trim().to_string())
                    })
                    .unwrap_or_default();
                // `GET /repo.git/…` serves the bare repository's files (git's dumb
                // HTTP protocol); anything else gets a fixed body (and the Authorization
                // it came with, if any).
                let line = String::from_utf8_lossy(&got)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let path = line.split(' ').nth(1).unwrap_or("/").to_string();
                let (status, body) = match path.strip_prefix("/repo.git/") {
                    Some(rel) if !rel.contains("..") => {
                        match std::fs::read(repo.join(rel.split('?').next().unwrap_or(""))) {
                            Ok(bytes) => ("200 OK", bytes),
                            Err(_) => ("404 Not Found", b"not found\n".to_vec()),
                        }
                    }
                    _ if !auth.is_empty() => (
                        "200 OK",
                        format!("hello from the upstream\nauthorization: {auth}\n").into_bytes(),
                    ),
                    _ => ("200 OK", b"hello from the upstream\n".to_vec()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(head.as_bytes()).await;
                let _ = tls.write_all(&body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    Upstream {
        addr,
        ca_pem: ca.pem(),
        snis,
        heads,
    }
}

/// A bare repository with one commit, made servable over dumb HTTP.
pub(crate) fn bare_repo(dir: &std::path::Path) -> std::path::PathBuf {
    let git = |args: &[&str], cwd: &std::path::Path| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(cwd)
            .env("GIT_AUTHOR_NAME", "beige")
            .env("GIT_AUTHOR_EMAIL", "beige@example.test")
            .env("GIT_COMMITTER_NAME", "beige")
            .env("GIT_COMMITTER_EMAIL", "beige@example.test")
            .output()
            .expect("git is installed on the test host");
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    let work = dir.join("repo-work");
    let bare = dir.join("repo.git");
    std::fs::create_dir_all(&work).unwrap();
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("README"), "cloned through the gateway\n").unwrap();
    git(&["add", "README"], &work);
    git(&["commit", "-q", "-m", "first"], &work);
    git(
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
        dir,
    );
    git(&["update-server-info"], &bare);
    bare
}

pub(crate) async fn exec(gw: &LocalGateway, command: &str) -> String {
    let out = gw
        .call_tool(
            "net",
            CoreToolCall::Exec(ExecParams {
                command: command.into(),
                timeout: Some(60),
            }),
            ToolContext::default(),
        )
        .await
        .unwrap();
    out.content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn egress_records(t: &TestHome) -> Vec<Value> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<AuditRecord>(l).ok())
        .filter(|r| r.tool == "egress.connect")
        .map(|r| serde_json::to_value(&r).unwrap())
        .collect()
}

/// The one record (or the pair) for `host:port`.
pub(crate) fn request_records(t: &TestHome) -> Vec<Value> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<AuditRecord>(l).ok())
        .filter(|r| r.tool == "egress.request")
        .map(|r| serde_json::to_value(&r).unwrap())
        .collect()
}

pub(crate) fn records_for<'a>(records: &'a [Value], host: &str, port: u16) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["egress"]["host"] == host && r["egress"]["port"] == port)
        .collect()
}

/// An `exec` as `agent`, with `timeout` seconds; the text of its result.
pub(crate) async fn exec_as(gw: &LocalGateway, agent: &str, command: &str, timeout: u64) -> String {
    let out = gw
        .call_tool(
            agent,
            CoreToolCall::Exec(ExecParams {
                command: command.into(),
                timeout: Some(timeout),
            }),
            ToolContext::default(),
        )
        .await
        .unwrap();
    out.content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A TLS upstream on `127.0.0.1:0` for `api.example.test` whose answers the test
/// controls, and that counts what it serves:
///
/// - `GET /hold…`: the head is read, then the answer (`held\n`) waits until
///   [`HeldUpstream::release`]; [`HeldUpstream::holding`] counts those waiting now;
/// - `GET /big/<bytes>…`: `Content-Length: <bytes>`, half of the body at once, the rest
///   after [`HeldUpstream::release`] (never, if it is not released); the bytes written
///   are counted in [`HeldUpstream::sent`];
/// - anything else: `hello from the upstream\n` at once.
pub(crate) struct HeldUpstream {
    pub(crate) addr: SocketAddr,
    pub(crate) ca_pem: String,
    /// Connections waiting in `/hold` now.
    pub(crate) holding: Arc<std::sync::atomic::AtomicUsize>,
    /// TLS connections open now (handshake done, answer not yet finished).
    pub(crate) open: Arc<std::sync::atomic::AtomicUsize>,
    /// Body bytes `/big` has written, all connections together.
    pub(crate) sent: Arc<std::sync::atomic::AtomicU64>,
    /// Request heads served, in order.
    pub(crate) heads: Arc<Mutex<Vec<String>>>,
    release: tokio::sync::watch::Sender<bool>,
}

impl HeldUpstream {
    /// Let every held answer (and every `/big` second half) go, now and later.
    pub(crate) fn release(&self) {
        self.release.send_replace(true);
    }
}

/// A test CA and a leaf for `names` signed by it: (acceptor, the CA's PEM).
pub(crate) fn test_tls_acceptor(names: &[&str]) -> (tokio_rustls::TlsAcceptor, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "beige egress test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca.pem())
}

pub(crate) async fn held_upstream() -> HeldUpstream {
    use std::sync::atomic::Ordering::SeqCst;
    let (acceptor, ca_pem) = test_tls_acceptor(&[API]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (release, released) = tokio::sync::watch::channel(false);
    let up = HeldUpstream {
        addr,
        ca_pem,
        holding: Arc::default(),
        open: Arc::default(),
        sent: Arc::default(),
        heads: Arc::default(),
        release,
    };
    let (holding, open, sent, heads) = (
        up.holding.clone(),
        up.open.clone(),
        up.sent.clone(),
        up.heads.clone(),
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let (holding, open, sent, heads) =
                (holding.clone(), open.clone(), sent.clone(), heads.clone());
            let mut released = released.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                open.fetch_add(1, SeqCst);
                /// Decrements a counter when dropped (the connection ends, however).
                struct Dec(Arc<std::sync::atomic::AtomicUsize>);
                impl Drop for Dec {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
                let _open = Dec(open);
                let mut buf = vec![0u8; 16 * 1024];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got).into_owned();
                heads.lock().unwrap().push(head.clone());
                let path = head
                    .lines()
                    .next()
                    .and_then(|l| l.split(' ').nth(1))
                    .unwrap_or("/")
                    .to_string();
                if path.starts_with("/hold") {
                    holding.fetch_add(1, SeqCst);
                    let _holding = Dec(holding);
                    if !released_or_gone(&mut released, &mut tls).await {
                        return;
                    }
                    let body = b"held\n";
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(body).await;
                } else if let Some(n) = path.strip_prefix("/big/") {
                    let total: usize = n.split('?').next().unwrap_or("0").parse().unwrap_or(0);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n"
                    );
                    if tls.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut written = 0usize;
                    while written < total {
                        if written >= total / 2 && !released_or_gone(&mut released, &mut tls).await
                        {
                            return;
                        }
                        let n = chunk.len().min(total - written);
                        if tls.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        written += n;
                        sent.fetch_add(n as u64, SeqCst);
                    }
                } else {
                    let body = b"hello from the upstream\n";
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(body).await;
                }
                let _ = tls.flush().await;
                let _ = tls.shutdown().await;
            });
        }
    });
    up
}

/// Wait until `released` says go (`true`) or the client's side of `tls` ends (`false`):
/// a held answer notices its client is gone without writing.
async fn released_or_gone<S: tokio::io::AsyncRead + Unpin>(
    released: &mut tokio::sync::watch::Receiver<bool>,
    tls: &mut S,
) -> bool {
    let mut scratch = [0u8; 1024];
    loop {
        tokio::select! {
            r = released.wait_for(|r| *r) => return r.is_ok(),
            n = tls.read(&mut scratch) => if matches!(n, Ok(0) | Err(_)) {
                return false;
            },
        }
    }
}

/// Poll `what` every 50 ms until it is true, for at most `limit`; whether it became true.
pub(crate) async fn wait_until(limit: std::time::Duration, mut what: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if what() {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Whether the Debian test image is there (a missing one fails in CI, else skips).
pub(crate) async fn debian_image(t: &TestHome) -> bool {
    if t.docker().await.client().inspect_image(IMAGE).await.is_ok() {
        return true;
    }
    assert!(
        !super::support::required(),
        "{IMAGE} missing in CI: scripts/setup-docker --debian-base builds it"
    );
    eprintln!("SKIPPED (not in CI): {IMAGE} missing; run scripts/setup-docker --debian-base");
    false
}
