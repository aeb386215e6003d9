//! The engine without Docker: a tokio duplex plays the client in the sandbox, a TCP
//! echo server on `127.0.0.1:0` the upstream; the test resolver maps names to
//! public-looking or private addresses and the test dialer only ever connects to the
//! echo server (any other address is recorded and refused).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_protocol::link::EgressEntry;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::egress::config::{rule_set, AgentEgressConfig};
use crate::egress::upstream::{BoxUpstream, ResolveError};

#[derive(Debug)]
struct Names(HashMap<&'static str, Vec<IpAddr>>);

#[async_trait]
impl Resolver for Names {
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| ResolveError::Failed {
                name: name.into(),
                message: "SERVFAIL".into(),
            })
    }
}

#[derive(Debug)]
struct Echo {
    at: SocketAddr,
    dialled: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Dialer for Echo {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        self.dialled.lock().unwrap().push(addr);
        if addr.ip() != "11.0.0.1".parse::<IpAddr>().unwrap() {
            return Err(std::io::Error::other(
                "the test dialer refuses this address",
            ));
        }
        Ok(Box::pin(tokio::net::TcpStream::connect(self.at).await?))
    }
}

#[derive(Default)]
struct Records {
    all: Mutex<Vec<ConnectionRecord>>,
    fail: bool,
}

#[async_trait]
impl EgressAudit for Records {
    async fn record(&self, record: &ConnectionRecord) -> Result<(), String> {
        if self.fail {
            return Err("the audit disk is full".into());
        }
        self.all.lock().unwrap().push(record.clone());
        Ok(())
    }
}

async fn echo_server() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    at
}

fn rules() -> Arc<RuleSet> {
    let agent: AgentEgressConfig = serde_json::from_value(serde_json::json!({"rules": [
        {"id": "echo", "hosts": ["echo.example.test"], "ports": [7000]},
        {"id": "inner", "hosts": ["inner.example.test"], "ports": [7000]},
    ]}))
    .unwrap();
    Arc::new(rule_set(None, "a", &agent, 4).unwrap())
}

struct Setup {
    engine: Arc<EgressEngine>,
    dialer: Arc<Echo>,
}

async fn setup() -> Setup {
    let at = echo_server().await;
    let names = Names(HashMap::from([
        ("echo.example.test", vec!["11.0.0.1".parse().unwrap()]),
        ("inner.example.test", vec!["10.1.2.3".parse().unwrap()]),
    ]));
    let dialer = Arc::new(Echo {
        at,
        dialled: Mutex::new(Vec::new()),
    });
    Setup {
        engine: Arc::new(EgressEngine::new(Arc::new(names), dialer.clone())),
        dialer,
    }
}

/// A client stream as PID 1 hands it over, `head` already read; returns the client's
/// end of the pipe.
fn client_stream(head: &[u8]) -> (EgressStream, DuplexStream) {
    let (client, gateway) = tokio::io::duplex(64 * 1024);
    let (r, w) = tokio::io::split(gateway);
    let s = EgressStream::new(
        EgressEntry::Explicit,
        None,
        0,
        head.to_vec(),
        Box::pin(r),
        Box::pin(w),
        "boot".into(),
    );
    (s, client)
}

async fn read_to_end(client: &mut DuplexStream) -> String {
    let mut out = Vec::new();
    let _ = client.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn an_allowed_connect_is_recorded_before_its_bytes_and_spliced_to_the_pinned_address() {
    let s = setup().await;
    let audit = Arc::new(Records::default());
    let (stream, mut client) =
        client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\nearly");
    let (engine, a) = (s.engine.clone(), audit.clone());
    let task = tokio::spawn(async move {
        engine.serve("a", rules(), 8, stream, a.as_ref()).await;
    });
    let mut got = vec![0u8; http::CONNECT_OK.len() + 5];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[..http::CONNECT_OK.len()], http::CONNECT_OK);
    // Bytes the client sent with its request went up first, then the stream.
    assert_eq!(&got[http::CONNECT_OK.len()..], b"early");
    client.write_all(b" and more").await.unwrap();
    let mut more = vec![0u8; 9];
    client.read_exact(&mut more).await.unwrap();
    assert_eq!(&more, b" and more");
    client.shutdown().await.unwrap();
    drop(client);
    task.await.unwrap();

    let records = audit.all.lock().unwrap().clone();
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0].phase, ConnectionPhase::Started);
    assert_eq!(records[1].phase, ConnectionPhase::Finished);
    let done = &records[1];
    assert_eq!(done.reason, None);
    assert_eq!(done.host, "echo.example.test");
    assert_eq!(done.ip, Some("11.0.0.1".parse().unwrap()));
    assert_eq!(done.rule.as_deref(), Some("echo"));
    assert_eq!(done.policy_version, 4);
    assert_eq!(done.mode, Some(Mode::Tunnel));
    assert_eq!((done.bytes_up, done.bytes_down), (14, 14));
    assert_eq!(
        s.dialer.dialled.lock().unwrap().as_slice(),
        ["11.0.0.1:7000".parse::<SocketAddr>().unwrap()]
    );
    assert_eq!(s.engine.open_streams("a"), 0, "the slot is given back");
}

#[tokio::test]
async fn refusals_answer_403_once_record_once_and_never_dial() {
    let s = setup().await;
    for (head, reason) in [
        (
            &b"CONNECT nowhere.example.test:7000 HTTP/1.1\r\n\r\n"[..],
            DenyReason::NoRule,
        ),
        (
            b"CONNECT echo.example.test:7001 HTTP/1.1\r\n\r\n",
            DenyReason::PortNotAllowed,
        ),
        (
            b"CONNECT inner.example.test:7000 HTTP/1.1\r\n\r\n",
            DenyReason::PrivateAddress,
        ),
        (
            b"CONNECT 11.0.0.1:7000 HTTP/1.1\r\n\r\n",
            DenyReason::IpLiteral,
        ),
        (
            b"GET /x HTTP/1.1\r\nHost: echo.example.test\r\n\r\n",
            DenyReason::BadRequest,
        ),
    ] {
        let audit = Records::default();
        let (stream, mut client) = client_stream(head);
        s.engine.serve("a", rules(), 8, stream, &audit).await;
        let answer = read_to_end(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{reason:?}: {answer}");
        assert!(
            answer.contains(&format!(
                "X-Beige-Egress: denied; reason={}",
                reason.as_str()
            )),
            "{answer}"
        );
        assert!(answer.contains("refused for agent 'a'"), "{answer}");
        let records = audit.all.lock().unwrap().clone();
        assert_eq!(records.len(), 1, "{reason:?}: {records:?}");
        assert_eq!(records[0].reason, Some(reason));
        assert_eq!(records[0].phase, ConnectionPhase::Finished);
    }
    assert!(s.dialer.dialled.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_dns_failure_is_a_refusal() {
    let s = setup().await;
    let agent: AgentEgressConfig = serde_json::from_value(serde_json::json!({"rules": [
        {"id": "gone", "hosts": ["gone.example.test"]},
    ]}))
    .unwrap();
    let rules = Arc::new(rule_set(None, "a", &agent, 1).unwrap());
    let audit = Records::default();
    let (stream, mut client) = client_stream(b"CONNECT gone.example.test:443 HTTP/1.1\r\n\r\n");
    s.engine.serve("a", rules, 8, stream, &audit).await;
    assert!(read_to_end(&mut client).await.contains("reason=dns_failed"));
    assert!(s.dialer.dialled.lock().unwrap().is_empty());
}

#[tokio::test]
async fn streams_over_the_agents_limit_are_refused_and_an_unwritable_audit_refuses_all() {
    let s = setup().await;
    let audit = Arc::new(Records::default());
    // One stream held open.
    let (held, mut held_client) = client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\n");
    let (engine, a) = (s.engine.clone(), audit.clone());
    let task = tokio::spawn(async move { engine.serve("a", rules(), 1, held, a.as_ref()).await });
    let mut ok = vec![0u8; http::CONNECT_OK.len()];
    held_client.read_exact(&mut ok).await.unwrap();
    assert_eq!(s.engine.open_streams("a"), 1);

    let (second, mut client) = client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\n");
    s.engine
        .serve("a", rules(), 1, second, audit.as_ref())
        .await;
    assert!(read_to_end(&mut client)
        .await
        .contains("reason=too_many_streams"));
    // Another agent is not starved by this one.
    let (other, mut other_client) =
        client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\n");
    let (engine, a) = (s.engine.clone(), audit.clone());
    let other_task =
        tokio::spawn(async move { engine.serve("b", rules(), 1, other, a.as_ref()).await });
    let mut ok = vec![0u8; http::CONNECT_OK.len()];
    other_client.read_exact(&mut ok).await.unwrap();
    assert_eq!(ok, http::CONNECT_OK);
    drop(other_client);
    drop(held_client);
    task.await.unwrap();
    other_task.await.unwrap();

    // No record can be written: nothing goes up.
    let failing = Records {
        fail: true,
        ..Default::default()
    };
    let before = s.dialer.dialled.lock().unwrap().len();
    let (stream, mut client) =
        client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\nsecret bytes");
    s.engine.serve("a", rules(), 8, stream, &failing).await;
    let answer = read_to_end(&mut client).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        !answer.contains("secret bytes"),
        "nothing was echoed: {answer}"
    );
    assert_eq!(s.dialer.dialled.lock().unwrap().len(), before + 1);
}

#[tokio::test]
async fn a_stream_keeps_the_rules_it_was_decided_with() {
    let s = setup().await;
    let audit = Arc::new(Records::default());
    let (stream, mut client) = client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\n");
    let old = rules();
    let (engine, a, snapshot) = (s.engine.clone(), audit.clone(), old.clone());
    let task =
        tokio::spawn(async move { engine.serve("a", snapshot, 8, stream, a.as_ref()).await });
    let mut ok = vec![0u8; http::CONNECT_OK.len()];
    client.read_exact(&mut ok).await.unwrap();
    // The rules change (a reload): a new stream is refused, the open one goes on.
    let none = Arc::new(RuleSet::new(Vec::new(), 5));
    let (fresh, mut fresh_client) =
        client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\n");
    s.engine.serve("a", none, 8, fresh, audit.as_ref()).await;
    assert!(read_to_end(&mut fresh_client)
        .await
        .contains("reason=no_rule"));
    client.write_all(b"still here").await.unwrap();
    let mut back = vec![0u8; 10];
    client.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still here");
    drop(client);
    task.await.unwrap();
    let versions: Vec<u64> = audit
        .all
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.policy_version)
        .collect();
    assert!(
        versions.contains(&4) && versions.contains(&5),
        "{versions:?}"
    );
}

#[tokio::test]
async fn a_transparent_stream_is_decided_by_the_name_pid_1_mapped_and_gets_no_proxy_answer() {
    let s = setup().await;
    let audit = Records::default();
    let (client, gateway) = tokio::io::duplex(64 * 1024);
    let (r, w) = tokio::io::split(gateway);
    let stream = EgressStream::new(
        EgressEntry::Transparent,
        Some("Echo.Example.Test.".into()),
        7000,
        b"raw first bytes".to_vec(),
        Box::pin(r),
        Box::pin(w),
        "boot".into(),
    );
    let mut client = client;
    let (engine, snapshot) = (s.engine.clone(), rules());
    let serve = async move { engine.serve("a", snapshot, 8, stream, &audit).await };
    let talk = async {
        let mut got = vec![0u8; 15];
        client.read_exact(&mut got).await.unwrap();
        // Echoed as they were: no `200` in front.
        assert_eq!(&got, b"raw first bytes");
        drop(client);
    };
    tokio::join!(serve, talk);

    // An unmapped or private name is refused, and a TLS client is just closed.
    let audit = Records::default();
    let (client, gateway) = tokio::io::duplex(1024);
    let (r, w) = tokio::io::split(gateway);
    let stream = EgressStream::new(
        EgressEntry::Transparent,
        Some("inner.example.test".into()),
        443,
        Vec::new(),
        Box::pin(r),
        Box::pin(w),
        "boot".into(),
    );
    s.engine.serve("a", rules(), 8, stream, &audit).await;
    let mut client = client;
    assert_eq!(read_to_end(&mut client).await, "");
    let records = audit.all.lock().unwrap().clone();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].reason, Some(DenyReason::PortNotAllowed));
    assert_eq!(records[0].entry, EgressEntry::Transparent);
}

#[tokio::test]
async fn a_rule_that_limits_methods_or_paths_is_never_a_whole_tunnel() {
    let s = setup().await;
    let agent: AgentEgressConfig = serde_json::from_value(serde_json::json!({"rules": [
        {"id": "read-only", "hosts": ["echo.example.test"], "ports": [7000],
         "methods": ["GET"], "paths": ["/repos/**"]},
    ]}))
    .unwrap();
    let rules = Arc::new(rule_set(None, "a", &agent, 1).unwrap());
    let audit = Records::default();
    let (stream, mut client) = client_stream(b"CONNECT echo.example.test:7000 HTTP/1.1\r\n\r\n");
    s.engine.serve("a", rules.clone(), 8, stream, &audit).await;
    let answer = read_to_end(&mut client).await;
    assert!(answer.contains("reason=path_not_allowed"), "{answer}");
    assert!(s.dialer.dialled.lock().unwrap().is_empty());

    // Plain HTTP: the first request is checked, and the upstream is told to close
    // after it, so a second request on the connection is never served unchecked.
    let (stream, mut client) = client_stream(
        b"GET http://echo.example.test:7000/repos/x HTTP/1.1\r\nConnection: keep-alive\r\n\r\nPOST /admin HTTP/1.1\r\n\r\n",
    );
    let (engine, snapshot) = (s.engine.clone(), rules.clone());
    let task = tokio::spawn(async move {
        let audit = Records::default();
        engine.serve("a", snapshot, 8, stream, &audit).await;
    });
    let mut echoed = vec![0u8; 200];
    let n = client.read(&mut echoed).await.unwrap();
    let echoed = String::from_utf8_lossy(&echoed[..n]).to_string();
    assert!(echoed.starts_with("GET /repos/x HTTP/1.1\r\n"), "{echoed}");
    assert!(echoed.contains("Connection: close\r\n\r\n"), "{echoed}");
    assert!(!echoed.contains("keep-alive"), "{echoed}");
    drop(client);
    task.await.unwrap();
}

#[tokio::test]
async fn a_gateway_connection_is_decided_classified_pinned_and_recorded_like_a_stream() {
    let s = setup().await;
    let audit = Records::default();
    let rules = rules();
    let target = |host: &str, port| Target {
        host: Host::Name(host.into()),
        port,
    };

    // Allowed: recorded `started` before the dial, to the pinned, checked address.
    let opened = s
        .engine
        .open_outbound(
            "a",
            &rules,
            &target("echo.example.test", 7000),
            None,
            &audit,
        )
        .await
        .unwrap();
    let Outbound {
        mut upstream,
        record,
        started,
    } = opened;
    assert_eq!(record.phase, ConnectionPhase::Started);
    assert_eq!(record.ip, Some("11.0.0.1".parse().unwrap()));
    assert_eq!(record.rule.as_deref(), Some("echo"));
    upstream.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    upstream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    s.engine
        .finish_outbound(record, started, (4, 4), None, &audit)
        .await;
    {
        let all = audit.all.lock().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].phase, ConnectionPhase::Finished);
        assert_eq!((all[1].bytes_up, all[1].bytes_down), (4, 4));
    }

    // No rule, another port, a private address: refused with one record each, and the
    // dialer is never asked.
    let dialled = s.dialer.dialled.lock().unwrap().len();
    for (host, port, reason) in [
        ("other.example.test", 7000, DenyReason::NoRule),
        ("echo.example.test", 7001, DenyReason::PortNotAllowed),
        ("inner.example.test", 7000, DenyReason::PrivateAddress),
    ] {
        let refused = s
            .engine
            .open_outbound("a", &rules, &target(host, port), None, &audit)
            .await
            .unwrap_err();
        assert_eq!(refused.reason, Some(reason), "{host}:{port}");
        assert_eq!(refused.phase, ConnectionPhase::Finished);
        let checked = s
            .engine
            .check_outbound("a", &rules, &target(host, port), None)
            .await;
        assert_eq!(checked.unwrap_err().reason, Some(reason));
    }
    assert_eq!(s.dialer.dialled.lock().unwrap().len(), dialled);
    assert_eq!(audit.all.lock().unwrap().len(), 5);
}
