//! `egress.onUnknown: "ask"` end to end: a client in a busybox sandbox with no network
//! asks the explicit proxy for a plain-HTTP host no rule allows; the attended run gets
//! `403 approval-pending` at once and one approval request of kind `egress`; a decision
//! through the gateway API lets the next exec through; an unattended run is denied at
//! once and reported.
//!
//! Loopback only: the test resolver maps `api.example.test` to the public-looking
//! `11.0.0.1`, and the test dialer maps `11.0.0.1:80` to an HTTP server on
//! `127.0.0.1:0` and refuses (and records) any other address. The client is busybox `nc`
//! speaking absolute-form HTTP to PID 1's proxy, so the `X-Beige-Egress` header can be
//! read as it is (the busybox image has no curl).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_core::api::approvals::{ApprovalDecision, ApprovalKind, ApprovalStatus, Scope};
use beige_core::api::tools::{CoreToolCall, ToolContext};
use beige_core::api::{Admin as _, Gateway as _, Principal};
use beige_core::audit::AuditRecord;
use beige_core::egress::upstream::{BoxUpstream, Dialer};
use beige_core::{GatewayBuilder, LocalGateway};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::egress_support::{
    egress_records, records_for, wait_until, TestResolver, API, PUBLIC_IP,
};
use super::support::TestHome;
use crate::docker_or_skip;

/// Dials `11.0.0.1:80` on the plain-HTTP upstream; records every other address and
/// refuses it (it must never be asked for one).
#[derive(Debug)]
struct PlainDialer {
    upstream: SocketAddr,
    unexpected: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Dialer for PlainDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        if addr != SocketAddr::new(PUBLIC_IP.parse().unwrap(), 80) {
            self.unexpected.lock().unwrap().push(addr);
            return Err(std::io::Error::other(
                "the test dialer refuses this address",
            ));
        }
        Ok(Box::pin(
            tokio::net::TcpStream::connect(self.upstream).await?,
        ))
    }
}

/// An HTTP server on `127.0.0.1:0` that answers every request `hello from the
/// upstream` and closes; counts the requests it served.
async fn plain_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = l.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let body = "hello from the upstream\n";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (at, heads)
}

const SESSION: &str = "api:net:ask";

/// An exec of agent `net` in [`SESSION`], attended or not; its result's text.
async fn run(gw: &LocalGateway, command: &str, attended: bool) -> String {
    let ctx = ToolContext {
        session_key: Some(SESSION.into()),
        channel: Some("api".into()),
        attended,
        ..ToolContext::default()
    };
    let call = CoreToolCall::parse("exec", json!({ "command": command, "timeout": 60 })).unwrap();
    gw.call_tool("net", call, ctx).await.unwrap().joined_text()
}

/// One absolute-form `GET http://<host>/` to PID 1's proxy with busybox `nc`: the
/// response as it came, then `rc=<nc's exit code>`.
fn get(host: &str) -> String {
    format!(
        "printf 'GET http://{host}/ HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n' | timeout 20 nc 127.0.0.1 3128; echo \"rc=$?\""
    )
}

fn approval_phases(t: &TestHome) -> Vec<String> {
    std::fs::read_to_string(t.home.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<AuditRecord>(l).ok())
        .filter(|r| r.tool == "egress.connect")
        .filter_map(|r| r.approval.map(|a| a.phase))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_host_is_asked_about_approved_through_the_api_and_then_reached() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let docker = t.docker().await;
    let (upstream, served) = plain_upstream().await;
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let resolver = TestResolver(HashMap::from([
        (API, Ok(vec![ip(PUBLIC_IP)])),
        ("loop.example.test", Ok(vec![ip("127.0.0.1")])),
        ("gist.example.test", Ok(vec![ip(PUBLIC_IP)])),
    ]));
    let dialer = Arc::new(PlainDialer {
        upstream,
        unexpected: Mutex::new(Vec::new()),
    });
    // No rule names api.example.test: it is unknown, and the agent asks.
    let mut config = t.config(
        &env,
        &[(
            "net",
            json!({
                "egress": {"onUnknown": "ask", "rules": [
                    {"id": "no-gist", "hosts": ["gist.example.test"], "action": "deny"},
                ]},
            }),
        )],
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

    // 1. Attended: three tries, each refused at once as pending; one request.
    let started = std::time::Instant::now();
    let asked = run(&gw, &format!("{c}; {c}; {c}", c = get(API)), true).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "refused at once, not held"
    );
    assert_eq!(
        asked.matches("HTTP/1.1 403 Forbidden").count(),
        3,
        "{asked}"
    );
    let requests = gw.approvals(Some("net")).await.unwrap();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = &requests[0];
    assert_eq!(request.kind, ApprovalKind::Egress);
    assert_eq!(request.status, ApprovalStatus::Pending);
    assert_eq!(request.attempts, Some(3), "{request:?}");
    assert_eq!(request.session, SESSION);
    assert!(request.exec.is_some(), "the request names the exec");
    assert_eq!(request.tool, "egress.connect");
    assert_eq!(
        request.args,
        [
            format!("{API}:80"),
            "entry=explicit".into(),
            "mode=http".into()
        ]
    );
    assert_eq!(
        asked
            .matches(&format!(
                "X-Beige-Egress: approval-pending; approval={}; reason=approval_pending",
                request.id
            ))
            .count(),
        3,
        "{asked}"
    );
    // The model reads which approval its command waits for.
    assert!(
        asked.contains(&format!(
            "[beige] 1 call waiting for approval: {}",
            request.id
        )),
        "{asked}"
    );
    // A refusal is recorded just after its 403 is written.
    let settle = std::time::Duration::from_secs(10);
    wait_until(settle, || {
        records_for(&egress_records(&t), API, 80).len() >= 3
    })
    .await;
    let records = egress_records(&t);
    let refused = records_for(&records, API, 80);
    assert_eq!(refused.len(), 3, "{refused:?}");
    for r in &refused {
        assert_eq!(r["egress"]["reason"], "approval_pending", "{r}");
        assert_eq!(r["egress"]["approval"], request.id.as_str(), "{r}");
    }
    assert!(
        served.lock().unwrap().is_empty(),
        "nothing reached the upstream"
    );

    // A deny rule and the classifier are never asked about.
    let blocked = run(
        &gw,
        &format!("{}; {}", get("gist.example.test"), get("loop.example.test")),
        true,
    )
    .await;
    assert!(blocked.contains("reason=denied_by_rule"), "{blocked}");
    assert!(blocked.contains("reason=private_address"), "{blocked}");
    assert_eq!(gw.approvals(Some("net")).await.unwrap().len(), 1);

    // 2. Approved once through the gateway API: the next exec goes through, twice.
    let once = ApprovalDecision::approve(Scope::Once).with_digest(request.call_digest.clone());
    let decided = gw
        .decide_approval(&request.id, once, Principal::ApiToken)
        .await
        .unwrap();
    assert_eq!(decided.status, ApprovalStatus::Approved);
    let through = run(&gw, &format!("{c}; {c}", c = get(API)), true).await;
    assert_eq!(
        through.matches("hello from the upstream").count(),
        2,
        "{through}"
    );
    assert_eq!(served.lock().unwrap().len(), 2);
    wait_until(settle, || {
        records_for(&egress_records(&t), API, 80)
            .iter()
            .filter(|r| r["phase"] == "finished" && r["egress"]["reason"].is_null())
            .count()
            >= 2
    })
    .await;
    let records = egress_records(&t);
    let rule = format!("approval-{}", request.id);
    let admitted: Vec<_> = records_for(&records, API, 80)
        .into_iter()
        .filter(|r| r["phase"] == "started")
        .collect();
    assert_eq!(admitted.len(), 2, "{admitted:?}");
    assert!(admitted
        .iter()
        .all(|r| r["egress"]["rule"] == rule.as_str()));
    assert_eq!(
        gw.approvals(Some("net"))
            .await
            .unwrap()
            .iter()
            .find(|a| a.id == request.id)
            .map(|a| a.status),
        Some(ApprovalStatus::Consumed)
    );

    // 3. The once approval ended with that exec: a new exec asks again.
    let again = run(&gw, &get(API), true).await;
    assert!(again.contains("approval-pending"), "{again}");
    let requests = gw.approvals(Some("net")).await.unwrap();
    let second = requests
        .iter()
        .find(|a| a.status == ApprovalStatus::Pending)
        .expect("a new request");
    assert_ne!(second.id, request.id);

    // 4. An unattended run (a plain API exec) is denied at once, and reported.
    let unattended = run(&gw, &get(API), false).await;
    assert!(unattended.contains("reason=unattended"), "{unattended}");
    assert!(
        !unattended.contains("hello from the upstream"),
        "{unattended}"
    );
    assert_eq!(
        gw.approvals(Some("net")).await.unwrap().len(),
        2,
        "no request from an unattended run"
    );
    assert!(
        approval_phases(&t).iter().any(|p| p == "unattended"),
        "{:?}",
        approval_phases(&t)
    );
    let unattended_recorded = || {
        records_for(&egress_records(&t), API, 80)
            .iter()
            .any(|r| r["egress"]["reason"] == "unattended")
    };
    wait_until(settle, unattended_recorded).await;
    let records = egress_records(&t);
    assert!(
        records_for(&records, API, 80)
            .iter()
            .any(|r| r["egress"]["reason"] == "unattended"),
        "{:#?}",
        records_for(&records, API, 80)
    );
    assert_eq!(served.lock().unwrap().len(), 2);
    assert!(dialer.unexpected.lock().unwrap().is_empty());
}
