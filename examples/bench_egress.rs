//! Egress figures for the benchmark harness: an HTTPS GET through the gateway's egress
//! engine in tunnel mode against the same GET straight to the upstream, and a 100 MiB
//! download both ways. Everything is on loopback: the upstream is a TLS server on
//! `127.0.0.1:0` with a certificate from a CA made here, the engine's resolver maps the
//! bench name to a public-looking address and its dialer connects that to the upstream.
//! The client side of the tunnel is a Unix socket pair, the carrier the link uses, where
//! PID 1's proxy would be, so the figure is the engine's own cost (decide, resolve,
//! classify, SNI check, audit, splice), not the container's. The inspect figure is the
//! same GET through a rule with `methods`, so the engine terminates TLS with its CA,
//! decides the request and talks TLS to the upstream itself.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use beige_core::egress::config::{rule_set, AgentEgressConfig};
use beige_core::egress::engine::{ConnectionRecord, EgressAudit, EgressEngine};
use beige_core::egress::upstream::{BoxUpstream, Dialer, ResolveError, Resolver};
use beige_core::sandbox::EgressStream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::Figure;

const NAME: &str = "bench.example.test";
const BIG: usize = 100 * 1024 * 1024;

#[derive(Debug)]
struct OneName;

#[async_trait]
impl Resolver for OneName {
    async fn resolve(&self, _name: &str) -> Result<Vec<IpAddr>, ResolveError> {
        Ok(vec![IpAddr::from([11, 0, 0, 1])])
    }
}

#[derive(Debug)]
struct ToUpstream(SocketAddr);

#[async_trait]
impl Dialer for ToUpstream {
    async fn dial(&self, _addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        let s = tokio::net::TcpStream::connect(self.0).await?;
        s.set_nodelay(true)?;
        Ok(Box::pin(s))
    }
}

/// Counts records, as a fast audit sink would.
struct Counting;

#[async_trait]
impl EgressAudit for Counting {
    async fn record(&self, _record: &ConnectionRecord) -> Result<(), String> {
        Ok(())
    }
}

/// A TLS upstream: `GET /big` gets [`BIG`] bytes, anything else two. Also its CA.
async fn upstream() -> anyhow::Result<(
    SocketAddr,
    rustls::RootCertStore,
    rustls::pki_types::CertificateDer<'static>,
)> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate()?;
    let leaf =
        rcgen::CertificateParams::new(vec![NAME.to_string()])?.signed_by(&leaf_key, &issuer)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let big = got.starts_with(b"GET /big ");
                let len = if big { BIG } else { 2 };
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                if tls.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                if big {
                    let chunk = vec![b'x'; 256 * 1024];
                    for _ in 0..BIG / chunk.len() {
                        if tls.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                } else {
                    let _ = tls.write_all(b"ok").await;
                }
                let _ = tls.shutdown().await;
            });
        }
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone())?;
    Ok((addr, roots, ca.der().clone()))
}

/// One GET over `io` (already connected to the upstream or to the tunnel); the body's
/// length.
async fn get<S>(connector: &tokio_rustls::TlsConnector, io: S, path: &str) -> anyhow::Result<usize>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = rustls::pki_types::ServerName::try_from(NAME)?;
    let mut tls = connector.connect(name, io).await?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut total = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match tls.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => total += n,
            // A peer that closes without close_notify still delivered the body.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total)
}

/// A tunnel to the upstream through the engine: the client's end of the pipe, after
/// the proxy's `200`.
async fn tunnel(
    engine: &Arc<EgressEngine>,
    rules: &Arc<beige_core::egress::rules::RuleSet>,
) -> anyhow::Result<tokio::net::UnixStream> {
    let (mut client, gateway) = tokio::net::UnixStream::pair()?;
    let (r, w) = gateway.into_split();
    let stream = EgressStream::new(
        beige_core::sandbox::EgressEntry::Explicit,
        Some(NAME.into()),
        443,
        format!("CONNECT {NAME}:443 HTTP/1.1\r\nHost: {NAME}:443\r\n\r\n").into_bytes(),
        Box::pin(r),
        Box::pin(w),
        "bench".into(),
    );
    let (engine, rules) = (engine.clone(), rules.clone());
    tokio::spawn(async move { engine.serve("bench", rules, 1024, stream, &Counting).await });
    let mut ok = [0u8; 39];
    client.read_exact(&mut ok).await?;
    anyhow::ensure!(ok.starts_with(b"HTTP/1.1 200"), "the tunnel was refused");
    Ok(client)
}

/// `egress_direct_https_get`, `egress_tunnel_https_get`, `egress_inspect_https_get`
/// (ms per new-connection GET)
/// and `egress_direct_download`, `egress_tunnel_download` (MiB/s of 100 MiB).
pub async fn figures() -> anyhow::Result<Vec<Figure>> {
    let (addr, mut roots, upstream_ca) = upstream().await?;
    // Inspect mode: the engine's CA (in a scratch keys directory), trusted by the client
    // too; the upstream's CA is an extra root of the engine's own client.
    let keys = tempfile::tempdir()?;
    let ca = Arc::new(beige_core::egress::ca::EgressCa::load_or_create(
        keys.path(),
    )?);
    roots.add(ca.cert_der().clone())?;
    let inspector = beige_core::egress::inspect::Inspector::new(ca, vec![upstream_ca])?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let inspecting = Arc::new(
        EgressEngine::new(Arc::new(OneName), Arc::new(ToUpstream(addr)))
            .with_inspector(Arc::new(inspector)),
    );
    let inspect_agent: AgentEgressConfig = serde_json::from_value(serde_json::json!({
        "rules": [{"id": "bench", "hosts": [NAME], "methods": ["GET"]}]
    }))?;
    let inspect_rules =
        Arc::new(rule_set(None, "bench", &inspect_agent, 1).map_err(|e| anyhow::anyhow!("{e:?}"))?);
    let engine = Arc::new(EgressEngine::new(
        Arc::new(OneName),
        Arc::new(ToUpstream(addr)),
    ));
    let agent: AgentEgressConfig = serde_json::from_value(serde_json::json!({
        "rules": [{"id": "bench", "hosts": [NAME]}]
    }))?;
    let rules = Arc::new(rule_set(None, "bench", &agent, 1).map_err(|e| anyhow::anyhow!("{e:?}"))?);

    let (mut direct, mut tunnelled, mut inspected) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..1050 {
        let t = Instant::now();
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        anyhow::ensure!(get(&connector, tcp, "/small").await? > 0);
        let d = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        let pipe = tunnel(&engine, &rules).await?;
        anyhow::ensure!(get(&connector, pipe, "/small").await? > 0);
        let e = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        let pipe = tunnel(&inspecting, &inspect_rules).await?;
        anyhow::ensure!(get(&connector, pipe, "/small").await? > 0);
        let n = t.elapsed().as_secs_f64() * 1000.0;
        if i >= 50 {
            direct.push(d);
            tunnelled.push(e);
            inspected.push(n);
        }
    }
    let (mut direct_tp, mut tunnel_tp) = (Vec::new(), Vec::new());
    let mib = BIG as f64 / (1024.0 * 1024.0);
    for _ in 0..5 {
        let t = Instant::now();
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let n = get(&connector, tcp, "/big").await?;
        anyhow::ensure!(n > BIG, "short download: {n}");
        direct_tp.push(mib / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let pipe = tunnel(&engine, &rules).await?;
        let n = get(&connector, pipe, "/big").await?;
        anyhow::ensure!(n > BIG, "short download through the tunnel: {n}");
        tunnel_tp.push(mib / t.elapsed().as_secs_f64());
    }
    Ok(vec![
        Figure {
            name: "egress_direct_https_get",
            unit: "ms",
            samples: direct,
        },
        Figure {
            name: "egress_tunnel_https_get",
            unit: "ms",
            samples: tunnelled,
        },
        Figure {
            name: "egress_inspect_https_get",
            unit: "ms",
            samples: inspected,
        },
        Figure {
            name: "egress_direct_download",
            unit: "MiB/s",
            samples: direct_tp,
        },
        Figure {
            name: "egress_tunnel_download",
            unit: "MiB/s",
            samples: tunnel_tp,
        },
    ])
}
