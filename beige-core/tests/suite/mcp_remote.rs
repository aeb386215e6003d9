//! A remote MCP server (`mcp.servers.<name>.url`) on the real Docker engine
//! (`spec/mcp.md` §1.2, §3 "Remote"): the test server serves streamable HTTP on
//! `127.0.0.1:0`, named `mcp.example.test` through egress's test resolver (a
//! public-looking `11.0.0.1`) and dialer (that address to the loopback port, nothing
//! else), so the production matcher and classifier run unchanged. The gateway is the
//! client: a script's `remote echo` works, the server receives the brokered token, and
//! the token is in no exec output, audit line, log or byte of the container. An agent
//! whose egress does not allow the host gets exit 126 naming it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_core::egress::upstream::{BoxUpstream, Dialer};
use beige_core::Admin as _;
use beige_core::GatewayBuilder;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use super::egress_support::{exec_as, TestResolver, PUBLIC_IP};
use super::mcp_cli::testserver;
use super::support::TestHome;
use crate::docker_or_skip;

const HOST: &str = "mcp.example.test";
const SECRET: &str = "mcp_remoteSecret0123456789abcdefXYZ";

/// Dials `11.0.0.1:<port>` on `127.0.0.1:<port>`; records every other address and
/// refuses it.
#[derive(Debug)]
struct LoopbackDialer {
    port: u16,
    dialled: Mutex<Vec<SocketAddr>>,
    unexpected: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Dialer for LoopbackDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        if addr != SocketAddr::new(PUBLIC_IP.parse().unwrap(), self.port) {
            self.unexpected.lock().unwrap().push(addr);
            return Err(std::io::Error::other(
                "the test dialer refuses this address",
            ));
        }
        self.dialled.lock().unwrap().push(addr);
        let s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        Ok(Box::pin(s))
    }
}

/// Starts the test server over HTTP on loopback: the process and its port.
async fn http_server(path: &std::path::Path) -> (tokio::process::Child, u16) {
    let mut child = tokio::process::Command::new(path)
        .args(["--http", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let url = first.strip_prefix("listening on http://").unwrap();
    let addr: SocketAddr = url.trim_end_matches("/mcp").parse().unwrap();
    (child, addr.port())
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn json_line(text: &str) -> Value {
    text.lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line in: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_server_through_egress_gets_the_brokered_token_and_the_sandbox_never_does() {
    let env = docker_or_skip!();
    let Some(server) = testserver() else { return };
    let t = TestHome::new();
    let docker = t.docker().await;
    let (_child, port) = http_server(&server).await;

    let public: IpAddr = PUBLIC_IP.parse().unwrap();
    let resolver = TestResolver(HashMap::from([(HOST, Ok(vec![public]))]));
    let dialer = Arc::new(LoopbackDialer {
        port,
        dialled: Mutex::new(Vec::new()),
        unexpected: Mutex::new(Vec::new()),
    });
    let mut config = t.config(
        &env,
        &[
            (
                "m",
                json!({
                    "tools": ["remote"],
                    "egress": {"rules": [{"id": "mcp", "hosts": [HOST], "ports": [port]}]},
                }),
            ),
            (
                // Egress, but no rule for the server's host.
                "n",
                json!({
                    "tools": ["remote"],
                    "egress": {"rules": [{"id": "api", "hosts": ["api.example.test"]}]},
                }),
            ),
        ],
    );
    config.egress = Some(
        serde_json::from_value(json!({
            "credentials": {
                "mcp-token": {
                    "secret": SECRET, "hosts": [HOST],
                    "inject": {"header": "Authorization", "format": "Bearer {}"},
                },
            },
        }))
        .unwrap(),
    );
    config.mcp = Some(
        serde_json::from_value(json!({ "servers": { "remote": {
            "url": format!("http://{HOST}:{port}/mcp"),
            "credentials": ["mcp-token"],
            "timeout": "20s",
        } } }))
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

    let mut outputs = Vec::new();
    // A call works.
    let echo = exec_as(&gw, "m", "remote echo --text hi; echo rc=$?", 120).await;
    assert!(echo.contains("hi") && echo.contains("rc=0"), "{echo}");
    outputs.push(echo);

    // The server received the brokered token: its digest says so, and the secret
    // itself never comes back into the sandbox.
    let digest = exec_as(&gw, "m", "remote headers_digest; echo rc=$?", 120).await;
    let got = json_line(&digest);
    assert_eq!(
        got["authorization_sha256"],
        sha256_hex(&format!("Bearer {SECRET}")),
        "{digest}"
    );
    assert_eq!(got["host"], format!("{HOST}:{port}"), "{digest}");
    outputs.push(digest);

    // Every connection went to the pinned, checked address, and nothing else was dialled.
    assert!(dialer.unexpected.lock().unwrap().is_empty());
    assert!(!dialer.dialled.lock().unwrap().is_empty());

    // An agent whose rules do not allow the host: 126, naming the host and the rule.
    let refused = exec_as(&gw, "n", "remote echo --text hi; echo rc=$?", 120).await;
    assert!(refused.contains("rc=126"), "{refused}");
    assert!(refused.contains(HOST), "{refused}");
    assert!(refused.contains("no_rule"), "{refused}");
    assert!(refused.contains("agents.n.egress.rules"), "{refused}");
    outputs.push(refused);

    // The connection is audited like egress: the agent, the server, the pinned address.
    let audit = std::fs::read_to_string(t.home.audit_log_path()).unwrap();
    let records: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let connects: Vec<&Value> = records
        .iter()
        .filter(|r| r["tool"] == "egress.connect" && r["egress"]["mcpServer"] == "remote")
        .collect();
    assert!(
        connects.iter().any(|r| r["phase"] == "started"
            && r["agent"] == "m"
            && r["egress"]["entry"] == "gateway"
            && r["egress"]["host"] == HOST
            && r["egress"]["port"] == port
            && r["egress"]["ip"] == PUBLIC_IP
            && r["egress"]["rule"] == "mcp"),
        "{connects:?}"
    );
    assert!(
        connects.iter().any(|r| r["agent"] == "n"
            && r["decision"] == "denied"
            && r["egress"]["reason"] == "no_rule"
            && r["egress"]["host"] == HOST),
        "the refusal is recorded: {connects:?}"
    );
    assert!(
        records.iter().any(|r| r["tool"] == "remote.echo"
            && r["phase"] == "finished"
            && r["decision"] == "allowed"),
        "the call is audited as a tool"
    );

    // The secret is in no exec output, no audit line, no log, no byte of the container.
    for out in &outputs {
        assert!(
            !out.contains(SECRET),
            "the secret reached the sandbox: {out}"
        );
    }
    assert!(!audit.contains(SECRET));
    let container = gw.sandbox_status("m").await.unwrap().container;
    super::egress_robust::assert_secret_absent(
        docker.client(),
        &container,
        &[t.home.root()],
        &[SECRET],
    )
    .await;
    gw.shutdown().await.unwrap();
}
