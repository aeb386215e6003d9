use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use base64::Engine as _;
use beige_protocol::link::EgressEntry;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::egress::engine::{ConnectionPhase, ConnectionRecord, EgressAudit, EgressEngine, Mode};
use crate::egress::upstream::{ResolveError, Resolver};
use crate::sandbox::EgressStream;

const SECRET: &str = "ghp_r3alSecretValue0123456789abcdef";
const API: &str = "api.example.test";
const PUBLIC_IP: &str = "11.0.0.1";

// ---- the scrubber ----

fn scrub_whole(secret: &str, input: &[u8]) -> (Vec<u8>, u64) {
    let mut s = Scrubber::new(secret);
    let mut out = s.push(input);
    out.extend(s.finish());
    (out, s.count())
}

#[test]
fn scrub_masks_raw_and_base64_with_the_same_length() {
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{SECRET}"));
    let input = format!("a {SECRET} b {b64} c {basic} d {SECRET}{SECRET}");
    let (out, count) = scrub_whole(SECRET, input.as_bytes());
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out.len(), input.len());
    assert!(!out.contains(SECRET), "{out}");
    assert!(!out.contains(&b64), "{out}");
    assert!(out.contains(&"*".repeat(SECRET.len())), "{out}");
    assert!(out.starts_with("a *"), "{out}");
    assert!(out.contains(" b *"), "{out}");
    assert!(out.contains(" d *"), "{out}");
    // What is not the secret stays.
    assert_eq!(out.matches(" b ").count(), 1);
    // raw, base64, inside Basic, raw twice.
    assert_eq!(count, 5, "{out}");
    // No part of the secret's base64 (beyond a few edge characters) survives in Basic.
    let basic_at = out.find(" c ").unwrap() + 3;
    let masked_basic = &out[basic_at..basic_at + basic.len()];
    assert!(
        masked_basic.matches('*').count() >= basic.len() - 24,
        "{masked_basic}"
    );
}

#[test]
fn scrub_gives_the_same_output_split_at_every_offset() {
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    let input = format!("HTTP body {SECRET}\n{b64}\nend {}{SECRET}", &SECRET[..10]);
    let (whole, whole_count) = scrub_whole(SECRET, input.as_bytes());
    assert!(whole_count >= 3);
    for at in 0..=input.len() {
        let mut s = Scrubber::new(SECRET);
        let mut out = s.push(&input.as_bytes()[..at]);
        out.extend(s.push(&input.as_bytes()[at..]));
        out.extend(s.finish());
        assert_eq!(out, whole, "split at {at}");
        assert_eq!(s.count(), whole_count, "split at {at}");
    }
    // Byte by byte.
    let mut s = Scrubber::new(SECRET);
    let mut out = Vec::new();
    for b in input.as_bytes() {
        out.extend(s.push(std::slice::from_ref(b)));
    }
    out.extend(s.finish());
    assert_eq!(out, whole);
    assert_eq!(s.count(), whole_count);
}

#[test]
fn scrub_stops_at_its_limit() {
    let input = format!("{SECRET}....{SECRET}");
    let mut s = Scrubber::with_limit(SECRET, SECRET.len() as u64 + 2);
    let mut out = s.push(input.as_bytes());
    out.extend(s.finish());
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out, format!("{}....{SECRET}", "*".repeat(SECRET.len())));
    assert_eq!(s.count(), 1);
    assert!(!format!("{s:?}").contains(SECRET));
}

// ---- an inspected stream, in process ----

#[derive(Debug)]
struct TestResolver;

#[async_trait]
impl Resolver for TestResolver {
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
        if name == API {
            Ok(vec![PUBLIC_IP.parse().unwrap()])
        } else {
            Err(ResolveError::NoAddresses {
                name: name.to_string(),
            })
        }
    }
}

/// Dials `11.0.0.1:443` on the upstream's loopback port; panics on any other address.
#[derive(Debug)]
struct TestDialer {
    upstream: SocketAddr,
    dials: Mutex<usize>,
}

#[async_trait]
impl Dialer for TestDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        assert_eq!(addr, SocketAddr::new(PUBLIC_IP.parse().unwrap(), 443));
        *self.dials.lock().unwrap() += 1;
        Ok(Box::pin(
            tokio::net::TcpStream::connect(self.upstream).await?,
        ))
    }
}

#[derive(Default)]
struct Recorder {
    connections: Mutex<Vec<ConnectionRecord>>,
    requests: Mutex<Vec<RequestRecord>>,
}

#[async_trait]
impl EgressAudit for Recorder {
    async fn record(&self, record: &ConnectionRecord) -> Result<(), String> {
        self.connections.lock().unwrap().push(record.clone());
        Ok(())
    }

    async fn record_request(&self, record: &RequestRecord) -> Result<(), String> {
        self.requests.lock().unwrap().push(record.clone());
        Ok(())
    }
}

/// A test CA (not beige's) and a TLS upstream on `127.0.0.1:0` for `api.example.test`
/// that answers each request (keep-alive) with the request head it got as its body, and
/// echoes `Authorization` in a response header. Every head it got is kept.
async fn echo_upstream() -> (SocketAddr, CertificateDer<'static>, Arc<Mutex<Vec<String>>>) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "upstream test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![API.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
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
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut got = Vec::new();
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&got[..end + 4]).into_owned();
                    got.drain(..end + 4);
                    seen.lock().unwrap().push(head.clone());
                    let auth = head
                        .lines()
                        .find_map(|l| l.strip_prefix("authorization: "))
                        .unwrap_or("")
                        .to_string();
                    let b64 = base64::engine::general_purpose::STANDARD
                        .encode(auth.strip_prefix("Bearer ").unwrap_or(""));
                    let body = format!("{head}b64: {b64}\n");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Echo-Authorization: {auth}\r\n\r\n{body}",
                        body.len()
                    );
                    if tls.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, ca.der().clone(), heads)
}

/// A response as the client read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// Sends one request on `tls` and reads its answer (`Content-Length` bodies only).
async fn request<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    tls: &mut S,
    path: &str,
    host: &str,
) -> Answer {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer sk-fake\r\n\
         Accept-Encoding: gzip\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let (status, headers, start) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut hs);
        if let httparse::Status::Complete(n) = resp.parse(&got).unwrap() {
            let headers: HashMap<String, String> = resp
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            break (resp.code.unwrap(), headers, n);
        }
        let n = tls.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the response head");
        got.extend_from_slice(&buf[..n]);
    };
    let len: usize = headers["content-length"].parse().unwrap();
    while got.len() < start + len {
        let n = tls.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the response body");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got.len(), start + len, "nothing after the body");
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&got[start..]).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_injects_the_credential_scrubs_it_and_checks_every_request() {
    let (upstream, upstream_ca, heads) = echo_upstream().await;
    let home = tempfile::tempdir().unwrap();
    let ca = Arc::new(EgressCa::load_or_create(&home.path().join("keys")).unwrap());
    let inspector = Arc::new(Inspector::new(ca.clone(), vec![upstream_ca]).unwrap());
    let dialer = Arc::new(TestDialer {
        upstream,
        dials: Mutex::new(0),
    });
    let engine = Arc::new(
        EgressEngine::new(Arc::new(TestResolver), dialer.clone()).with_inspector(inspector),
    );
    let top: crate::egress::config::EgressConfig = serde_json::from_value(json!({
        "credentials": { "api": {
            "secret": SECRET, "hosts": [API],
            "inject": { "header": "Authorization", "format": "Bearer {}" }
        } }
    }))
    .unwrap();
    let agent: crate::egress::config::AgentEgressConfig = serde_json::from_value(json!({
        "rules": [{ "id": "api", "hosts": [API], "paths": ["/v1/**"] }],
        "credentials": ["api"],
    }))
    .unwrap();
    let rules = Arc::new(crate::egress::config::rule_set(Some(&top), "intern", &agent, 7).unwrap());

    let (client, gateway) = tokio::io::duplex(64 * 1024);
    let (reader, writer) = tokio::io::split(gateway);
    let head = format!("CONNECT {API}:443 HTTP/1.1\r\nHost: {API}:443\r\n\r\n").into_bytes();
    let stream = EgressStream::new(
        EgressEntry::Explicit,
        Some(API.to_string()),
        443,
        head,
        Box::pin(reader),
        Box::pin(writer),
        "boot".into(),
    );
    let recorder = Arc::new(Recorder::default());
    let served = {
        let (engine, recorder, rules) = (engine.clone(), recorder.clone(), rules.clone());
        tokio::spawn(async move {
            engine
                .serve("intern", rules, 16, stream, recorder.as_ref())
                .await;
        })
    };

    // The CONNECT's 200, then TLS with a client that trusts only the beige CA.
    let mut client = client;
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(client.read(&mut byte).await.unwrap(), 1);
        got.push(byte[0]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut tls = connector
        .connect(ServerName::try_from(API).unwrap(), client)
        .await
        .unwrap();

    // 1. Injected upstream, masked for the client.
    let first = request(&mut tls, "/v1/echo?token=1", API).await;
    assert_eq!(first.status, 200, "{first:?}");
    let upstream_head = heads.lock().unwrap()[0].clone();
    assert!(
        upstream_head.contains(&format!("authorization: Bearer {SECRET}\r\n")),
        "{upstream_head}"
    );
    assert!(!upstream_head.contains("sk-fake"), "{upstream_head}");
    assert!(
        upstream_head.contains("accept-encoding: identity\r\n"),
        "{upstream_head}"
    );
    assert!(
        upstream_head.starts_with("GET /v1/echo?token=1 HTTP/1.1\r\n"),
        "{upstream_head}"
    );
    let mask = "*".repeat(SECRET.len());
    assert!(!first.body.contains(SECRET), "{}", first.body);
    assert!(
        first
            .body
            .contains(&format!("authorization: Bearer {mask}")),
        "{}",
        first.body
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
    assert!(!first.body.contains(&b64), "{}", first.body);
    assert_eq!(
        first.headers["x-echo-authorization"],
        format!("Bearer {mask}")
    );

    // 2. A path no rule allows: 403 on the same connection, which stays open.
    let refused = request(&mut tls, "/admin", API).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(
        refused.headers["x-beige-egress"].starts_with("denied; reason=path_not_allowed; id="),
        "{refused:?}"
    );
    assert!(
        refused.body.contains("no rule allows that path"),
        "{refused:?}"
    );
    let again = request(&mut tls, "/v1/again", API).await;
    assert_eq!(again.status, 200, "{again:?}");

    // 3. Another Host than the TLS name.
    let fronted = request(&mut tls, "/v1/echo", "other.example.test").await;
    assert_eq!(fronted.status, 403, "{fronted:?}");
    assert!(
        fronted.headers["x-beige-egress"].contains("reason=host_mismatch"),
        "{fronted:?}"
    );
    assert_eq!(
        heads.lock().unwrap().len(),
        2,
        "refusals never reach the upstream"
    );

    tls.shutdown().await.unwrap();
    drop(tls);
    tokio::time::timeout(std::time::Duration::from_secs(10), served)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        *dialer.dials.lock().unwrap(),
        1,
        "one upstream connection, reused"
    );

    // The records: started and finished, in inspect mode; one per request.
    let connections = recorder.connections.lock().unwrap().clone();
    assert_eq!(connections.len(), 2, "{connections:?}");
    assert_eq!(connections[0].phase, ConnectionPhase::Started);
    assert_eq!(connections[1].phase, ConnectionPhase::Finished);
    for c in &connections {
        assert_eq!(c.mode, Some(Mode::Inspect), "{c:?}");
        assert_eq!(c.rule.as_deref(), Some("api"));
        assert_eq!(c.policy_version, 7);
        assert_eq!(c.reason, None, "{c:?}");
    }
    assert_eq!(connections[1].error, None, "{:?}", connections[1]);
    assert!(connections[1].bytes_up > 0 && connections[1].bytes_down > 0);
    let requests = recorder.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 4, "{requests:?}");
    let seqs: Vec<u64> = requests.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    let r = &requests[0];
    assert_eq!(
        (r.status, r.method.as_str(), r.path.as_str()),
        (200, "GET", "/v1/echo")
    );
    assert!(r.substituted && r.scrubbed >= 2, "{r:?}");
    assert_eq!(r.credential.as_deref(), Some("api"));
    assert_eq!(r.id, connections[0].id);
    assert_eq!(requests[1].status, 403);
    assert_eq!(requests[1].reason, Some(DenyReason::PathNotAllowed));
    assert!(!requests[1].substituted);
    assert_eq!(requests[2].status, 200);
    assert_eq!(requests[3].reason, Some(DenyReason::HostMismatch));

    // The secret is in no record, in no Debug output.
    let shown = format!("{connections:?} {requests:?} {rules:?} {engine:?} {top:?}");
    assert!(!shown.contains(SECRET), "{shown}");
    for r in &requests {
        let audit = crate::gateway::egress::request_audit_record(r);
        let line = serde_json::to_string(&audit).unwrap();
        assert!(!line.contains(SECRET), "{line}");
        assert_eq!(audit.tool, "egress.request");
    }
    let line =
        serde_json::to_string(&crate::gateway::egress::request_audit_record(&requests[0])).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["egress"]["substituted"], true, "{v}");
    assert_eq!(v["egress"]["path"], "/v1/echo", "{v}");
    assert_eq!(v["egress"]["seq"], 1, "{v}");
}

#[tokio::test]
async fn a_stream_that_must_be_inspected_is_refused_without_an_inspector() {
    let engine = EgressEngine::new(
        Arc::new(TestResolver),
        Arc::new(TestDialer {
            upstream: "127.0.0.1:9".parse().unwrap(),
            dials: Mutex::new(0),
        }),
    );
    let agent: crate::egress::config::AgentEgressConfig = serde_json::from_value(json!({
        "rules": [{ "id": "api", "hosts": [API], "paths": ["/v1/**"] }],
    }))
    .unwrap();
    let rules = Arc::new(crate::egress::config::rule_set(None, "intern", &agent, 1).unwrap());
    let (mut client, gateway) = tokio::io::duplex(64 * 1024);
    let (reader, writer) = tokio::io::split(gateway);
    let head = format!("CONNECT {API}:443 HTTP/1.1\r\nHost: {API}:443\r\n\r\n").into_bytes();
    let stream = EgressStream::new(
        EgressEntry::Explicit,
        Some(API.to_string()),
        443,
        head,
        Box::pin(reader),
        Box::pin(writer),
        "boot".into(),
    );
    let recorder = Recorder::default();
    engine.serve("intern", rules, 16, stream, &recorder).await;
    let mut answer = String::new();
    client.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let connections = recorder.connections.lock().unwrap();
    assert_eq!(connections.len(), 1);
    assert_eq!(connections[0].reason, Some(DenyReason::PathNotAllowed));
}
