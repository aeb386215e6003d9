//! Egress end to end: real clients (curl, openssl) in a Debian sandbox with no network,
//! through PID 1's proxy and the link, to a TLS upstream on `127.0.0.1`.
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
use beige_core::{Gateway, GatewayBuilder, LocalGateway};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::support::TestHome;
use crate::docker_or_skip;

const IMAGE: &str = "beige-test-debian:bookworm";
const API: &str = "api.example.test";
/// A host with a brokered credential: inspected.
const INJECT: &str = "inject.example.test";
const SECRET: &str = "ghp_dockerSecret0123456789abcdefXYZ";
const PUBLIC_IP: &str = "11.0.0.1";

#[derive(Debug)]
struct TestResolver(HashMap<&'static str, Result<Vec<IpAddr>, ()>>);

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
struct TestDialer {
    upstream: SocketAddr,
    unexpected: Mutex<Vec<SocketAddr>>,
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
struct Upstream {
    addr: SocketAddr,
    ca_pem: String,
    snis: Arc<Mutex<Vec<String>>>,
    heads: Arc<Mutex<Vec<String>>>,
}

async fn tls_upstream(repo: std::path::PathBuf) -> Upstream {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "beige egress test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![API.to_string(), INJECT.to_string()])
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
fn bare_repo(dir: &std::path::Path) -> std::path::PathBuf {
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

async fn exec(gw: &LocalGateway, command: &str) -> String {
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

fn egress_records(t: &TestHome) -> Vec<Value> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<AuditRecord>(l).ok())
        .filter(|r| r.tool == "egress.connect")
        .map(|r| serde_json::to_value(&r).unwrap())
        .collect()
}

/// The one record (or the pair) for `host:port`.
fn request_records(t: &TestHome) -> Vec<Value> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<AuditRecord>(l).ok())
        .filter(|r| r.tool == "egress.request")
        .map(|r| serde_json::to_value(&r).unwrap())
        .collect()
}

fn records_for<'a>(records: &'a [Value], host: &str, port: u16) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["egress"]["host"] == host && r["egress"]["port"] == port)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_an_allowed_host_through_the_gateway_and_nothing_else() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let docker = t.docker().await;
    if docker.client().inspect_image(IMAGE).await.is_err() {
        assert!(
            !super::support::required(),
            "{IMAGE} missing in CI: scripts/setup-docker --debian-base builds it"
        );
        eprintln!("SKIPPED (not in CI): {IMAGE} missing; run scripts/setup-docker --debian-base");
        return;
    }
    let repo = bare_repo(t.dir.path());
    let upstream = tls_upstream(repo).await;
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let resolver = TestResolver(HashMap::from([
        (API, Ok(vec![ip(PUBLIC_IP)])),
        (INJECT, Ok(vec![ip(PUBLIC_IP)])),
        ("internal.example.test", Ok(vec![ip("10.0.0.1")])),
        ("metadata.example.test", Ok(vec![ip("169.254.169.254")])),
        (
            "mixed.example.test",
            Ok(vec![ip(PUBLIC_IP), ip("10.0.0.1")]),
        ),
        ("mapped.example.test", Ok(vec![ip("::ffff:10.0.0.1")])),
        ("loop.example.test", Ok(vec![ip("127.0.0.1")])),
        ("broken.example.test", Err(())),
    ]));
    let dialer = Arc::new(TestDialer {
        upstream: upstream.addr,
        unexpected: Mutex::new(Vec::new()),
    });

    let mut config = t.config(
        &env,
        &[(
            "net",
            json!({
                "sandbox": {"image": IMAGE, "memoryLimit": "256m"},
                "egress": {"rules": [
                    {"id": "api", "hosts": [API]},
                    {"id": "inject", "hosts": [INJECT]},
                    {"id": "trap", "hosts": [
                        "internal.example.test", "metadata.example.test",
                        "mixed.example.test", "mapped.example.test",
                        "loop.example.test", "broken.example.test"
                    ]},
                    {"id": "no-gist", "hosts": ["gist.example.test"], "action": "deny"},
                ], "credentials": ["tok"]},
            }),
        )],
    );
    // The credential, and the upstream's CA as an extra root of inspect mode.
    let roots = t.home.root().join("upstream-ca.pem");
    std::fs::write(&roots, &upstream.ca_pem).unwrap();
    config.egress = Some(
        serde_json::from_value(json!({
            "credentials": {"tok": {
                "secret": SECRET, "hosts": [INJECT],
                "inject": {"header": "Authorization", "format": "Bearer {}"},
            }},
            "tls": {"extraRoots": [roots.to_string_lossy()]},
        }))
        .unwrap(),
    );
    config.gateway.keep_sandboxes = false;
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker.clone()))
        .egress_resolver(Arc::new(resolver))
        .egress_dialer(dialer.clone())
        .build()
        .await
        .unwrap();
    let ws = gw.config().agent_workspace(gw.home(), "net");
    std::fs::write(ws.join("ca.pem"), &upstream.ca_pem).unwrap();

    // The proxy environment is there for every exec.
    let envs = exec(&gw, "env | grep -i _proxy | sort").await;
    assert!(envs.contains("HTTPS_PROXY=http://127.0.0.1:3128"), "{envs}");
    assert!(envs.contains("NO_PROXY=localhost,127.0.0.1,::1"), "{envs}");
    // PID 1's DNS stub is the sandbox's only name server, without search domains.
    let resolv = exec(&gw, "cat /etc/resolv.conf").await;
    assert!(resolv.contains("nameserver 127.0.0.1"), "{resolv}");
    assert!(!resolv.contains("search"), "{resolv}");

    // 1. An allowed host: through the tunnel, the upstream saw the SNI.
    let ok = exec(
        &gw,
        &format!(
            "curl -sS --max-time 20 --cacert /workspace/ca.pem https://{API}/ ; echo \"rc=$?\""
        ),
    )
    .await;
    assert!(ok.contains("hello from the upstream"), "{ok}");
    assert!(ok.contains("rc=0"), "{ok}");
    assert_eq!(upstream.snis.lock().unwrap().as_slice(), [API]);

    // 1b. The same without the proxy: the name resolves to a synthetic loopback
    // address of PID 1's DNS stub, and the connection to it is carried transparently.
    let names = exec(
        &gw,
        &format!("getent hosts {API}; getent ahostsv6 {API}; echo \"rc=$?\""),
    )
    .await;
    assert!(
        names.contains(&format!("127.77.0.1      {API}")) || names.contains("127.77."),
        "{names}"
    );
    let transparent = exec(
        &gw,
        &format!("curl -sS --noproxy '*' --max-time 20 --cacert /workspace/ca.pem https://{API}/ ; echo \"rc=$?\""),
    )
    .await;
    assert!(
        transparent.contains("hello from the upstream"),
        "{transparent}"
    );
    assert_eq!(upstream.snis.lock().unwrap().as_slice(), [API, API]);

    // 1b'. Python's own HTTP client honours the proxy variables too.
    let py = exec(
        &gw,
        &format!(
            "python3 -c \"import ssl, urllib.request as u; print(u.urlopen('https://{API}/', context=ssl.create_default_context(cafile='/workspace/ca.pem'), timeout=20).read().decode())\" 2>&1"
        ),
    )
    .await;
    assert!(py.contains("hello from the upstream"), "{py}");

    // 1c. git clones over HTTPS through the proxy (dumb HTTP from the upstream).
    let cloned = exec(
        &gw,
        &format!(
            "cd /tmp && GIT_SSL_CAINFO=/workspace/ca.pem git clone -q https://{API}/repo.git r 2>&1; cat r/README; echo \"rc=$?\""
        ),
    )
    .await;
    assert!(cloned.contains("cloned through the gateway"), "{cloned}");
    // And fails readably for a host no rule allows.
    let refused_clone = exec(
        &gw,
        "cd /tmp && GIT_SSL_CAINFO=/workspace/ca.pem git clone -q https://code.example.test/repo.git s 2>&1; echo \"rc=$?\"",
    )
    .await;
    assert!(refused_clone.contains("403"), "{refused_clone}");
    assert!(!refused_clone.contains("rc=0"), "{refused_clone}");

    // 2. Refusals, each readable by a curl user.
    let refused = |host: &str, port: u16| {
        format!(
            "curl -sS -v --max-time 20 --cacert /workspace/ca.pem https://{host}:{port}/ 2>&1 | grep -i -e x-beige-egress -e 'HTTP/1.1 403' ; true"
        )
    };
    for (host, port, reason) in [
        ("unknown.example.test", 443, "no_rule"),
        ("gist.example.test", 443, "denied_by_rule"),
        (API, 8443, "port_not_allowed"),
        ("internal.example.test", 443, "private_address"),
        ("metadata.example.test", 443, "private_address"),
        ("mixed.example.test", 443, "private_address"),
        ("mapped.example.test", 443, "private_address"),
        ("loop.example.test", 443, "private_address"),
        ("broken.example.test", 443, "dns_failed"),
        (PUBLIC_IP, 443, "ip_literal"),
    ] {
        let out = exec(&gw, &refused(host, port)).await;
        assert!(out.contains("403"), "{host}:{port}: {out}");
        // The exec's result names the refusal for the model, once.
        let footer = format!("[beige] egress: 1 connection to {host}:{port} refused ({reason}: ");
        assert_eq!(out.matches(&footer).count(), 1, "{out}");
        assert!(
            out.to_ascii_lowercase()
                .contains(&format!("x-beige-egress: denied; reason={reason}")),
            "{host}:{port}: {out}"
        );
    }

    // 3. Domain fronting: a TLS client that names another server is cut off.
    let handshakes = upstream.snis.lock().unwrap().len();
    let fronted = exec(
        &gw,
        &format!(
            "echo | timeout 20 openssl s_client -proxy 127.0.0.1:3128 -connect {API}:443 -servername evil.example.test 2>&1 | head -5; true"
        ),
    )
    .await;
    assert!(!fronted.contains("Verify return code: 0"), "{fronted}");
    assert_eq!(
        upstream.snis.lock().unwrap().len(),
        handshakes,
        "the fronted hello must not reach the upstream"
    );

    // 3b. The agent cannot take PID 1's listeners.
    let binds = exec(
        &gw,
        r#"python3 -c '
import socket, errno
for kind, addr in [("tcp", ("127.0.0.1", 3128)), ("tcp", ("0.0.0.0", 443)), ("tcp", ("127.77.0.9", 80)), ("udp", ("127.0.0.1", 53))]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr); print(kind, addr, "bound")
    except OSError as e:
        print(kind, addr, errno.errorcode[e.errno])
'"#,
    )
    .await;
    assert_eq!(binds.matches("EADDRINUSE").count(), 4, "{binds}");

    // 4. No route out: a direct connect fails in the sandbox, with no packet sent.
    let direct = exec(
        &gw,
        "curl -sS --noproxy '*' --max-time 5 https://1.1.1.1/ 2>&1; echo \"rc=$?\"; ip route 2>/dev/null | wc -l",
    )
    .await;
    assert!(direct.contains("rc=7"), "{direct}");

    // 5. Inspect: the gateway injects the credential and masks it in the answer; the
    // client trusts the home's egress CA.
    let ca = std::fs::read_to_string(t.home.root().join("keys/egress-ca.pem")).unwrap();
    std::fs::write(ws.join("beige-ca.pem"), ca).unwrap();
    let injected = exec(
        &gw,
        &format!(
            "curl -sS --max-time 20 --cacert /workspace/beige-ca.pem -H 'Authorization: Bearer sk-fake' https://{INJECT}/v1/x https://{INJECT}/v1/y ; echo \"rc=$?\""
        ),
    )
    .await;
    assert!(injected.contains("rc=0"), "{injected}");
    assert!(!injected.contains(SECRET), "{injected}");
    assert_eq!(
        injected
            .matches(&format!(
                "authorization: Bearer {}",
                "*".repeat(SECRET.len())
            ))
            .count(),
        2,
        "{injected}"
    );
    let heads = upstream.heads.lock().unwrap().clone();
    let inject_heads: Vec<&String> = heads.iter().filter(|h| h.contains(INJECT)).collect();
    assert_eq!(inject_heads.len(), 2, "{heads:?}");
    for h in &inject_heads {
        assert!(
            h.contains(&format!("authorization: Bearer {SECRET}")),
            "{h}"
        );
        assert!(!h.contains("sk-fake"), "{h}");
    }

    // The dialer was only ever asked for the one allowed, public address.
    assert!(
        dialer.unexpected.lock().unwrap().is_empty(),
        "dialled: {:?}",
        dialer.unexpected.lock().unwrap()
    );

    // Audit: the allowed stream has `started` then `finished` with its bytes; every
    // refusal is one `finished`, `denied` record with its reason.
    let records = egress_records(&t);
    let api = records_for(&records, API, 443);
    let phases: Vec<&str> = api.iter().filter_map(|r| r["phase"].as_str()).collect();
    assert!(phases.starts_with(&["started", "finished"]), "{api:?}");
    let done = api[1];
    let transparent: Vec<_> = api
        .iter()
        .filter(|r| r["egress"]["entry"] == "transparent" && r["phase"] == "finished")
        .collect();
    assert_eq!(transparent.len(), 1, "{api:?}");
    assert_eq!(
        transparent[0]["decision"], "allowed",
        "{:?}",
        transparent[0]
    );
    assert_eq!(transparent[0]["egress"]["ip"], PUBLIC_IP);
    assert_eq!(done["decision"], "allowed", "{done}");
    assert_eq!(done["egress"]["ip"], PUBLIC_IP, "{done}");
    assert_eq!(done["egress"]["mode"], "tunnel", "{done}");
    assert_eq!(done["egress"]["entry"], "explicit", "{done}");
    assert_eq!(done["egress"]["rule"], "api", "{done}");
    assert!(done["egress"]["bytesUp"].as_u64().unwrap() > 0, "{done}");
    assert!(done["egress"]["bytesDown"].as_u64().unwrap() > 0, "{done}");
    for (host, reason) in [
        ("unknown.example.test", "no_rule"),
        ("gist.example.test", "denied_by_rule"),
        ("internal.example.test", "private_address"),
        ("metadata.example.test", "private_address"),
        ("broken.example.test", "dns_failed"),
    ] {
        let r = records_for(&records, host, 443);
        assert_eq!(r.len(), 1, "{host}: {r:?}");
        assert_eq!(r[0]["decision"], "denied", "{host}: {:?}", r[0]);
        assert_eq!(r[0]["egress"]["reason"], reason, "{host}: {:?}", r[0]);
    }
    let fronted: Vec<_> = api
        .iter()
        .filter(|r| r["egress"]["reason"] == "sni_mismatch")
        .collect();
    assert_eq!(fronted.len(), 1, "{api:?}");

    // Inspect: the connection record says so; one request record per request.
    let inject = records_for(&records, INJECT, 443);
    assert!(!inject.is_empty(), "{records:?}");
    for r in &inject {
        assert_eq!(r["egress"]["mode"], "inspect", "{r}");
    }
    let requests = request_records(&t);
    assert_eq!(requests.len(), 2, "{requests:?}");
    for (r, path) in requests.iter().zip(["/v1/x", "/v1/y"]) {
        assert_eq!(r["egress"]["path"], path, "{r}");
        assert_eq!(r["egress"]["status"], 200, "{r}");
        assert_eq!(r["egress"]["substituted"], true, "{r}");
        assert_eq!(r["egress"]["scrubbed"], 1, "{r}");
    }
    let audit = std::fs::read_to_string(t.home.audit_log_path()).unwrap();
    assert!(!audit.contains(SECRET), "the secret is in the audit log");
    gw.shutdown().await.unwrap();
}
