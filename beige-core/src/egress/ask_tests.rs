//! `onUnknown: "ask"` without Docker: the real engine (a tokio duplex plays the client,
//! a TCP echo server on `127.0.0.1:0` the upstream behind the public-looking
//! `11.0.0.1`), the real approvals broker, and [`EgressAsk`] between them, as the
//! gateway wires them for one stream.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use beige_client::approvals::{
    Approval, ApprovalDecision, ApprovalEvent, ApprovalKind, ApprovalStatus, Scope,
};
use beige_protocol::link::EgressEntry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::approvals::{call_digest, ApprovalsConfig, Approver};
use crate::audit::{AuditError, AuditRecord, AuditSink};
use crate::egress::config::{rule_set, AgentEgressConfig};
use crate::egress::engine::{ConnectionPhase, ConnectionRecord, EgressAudit, EgressEngine};
use crate::egress::upstream::{BoxUpstream, Dialer, ResolveError, Resolver};
use crate::sandbox::EgressStream;

const PUBLIC: &str = "11.0.0.1";

#[derive(Debug)]
struct Names(HashMap<String, Vec<IpAddr>>);

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

/// Dials `11.0.0.1` on the echo server; records every address and refuses any other.
#[derive(Debug)]
struct Echo {
    at: SocketAddr,
    dialled: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Dialer for Echo {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        self.dialled.lock().unwrap().push(addr);
        if addr.ip() != PUBLIC.parse::<IpAddr>().unwrap() {
            return Err(std::io::Error::other(
                "the test dialer refuses this address",
            ));
        }
        Ok(Box::pin(tokio::net::TcpStream::connect(self.at).await?))
    }
}

/// The approvals broker's audit trail.
#[derive(Debug, Default)]
struct Trail(Mutex<Vec<AuditRecord>>);

#[async_trait]
impl AuditSink for Trail {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.0.lock().unwrap().push(record.clone());
        Ok(())
    }
}

impl Trail {
    fn phases(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|r| r.approval.as_ref().map(|a| a.phase.clone()))
            .collect()
    }
}

/// The engine's records; a started stream is reported as the gateway's recorder does.
struct Recorder<'a> {
    all: Mutex<Vec<ConnectionRecord>>,
    ask: &'a EgressAsk,
    approvals: &'a Approvals,
    run: &'a EgressRun,
}

#[async_trait]
impl EgressAudit for Recorder<'_> {
    async fn record(&self, record: &ConnectionRecord) -> Result<(), String> {
        self.all.lock().unwrap().push(record.clone());
        if let (ConnectionPhase::Started, Some(rule)) = (record.phase, &record.rule) {
            self.ask.admitted(self.approvals, rule, self.run).await;
        }
        Ok(())
    }
}

struct World {
    engine: EgressEngine,
    dialer: Arc<Echo>,
    approvals: Approvals,
    trail: Arc<Trail>,
    ask: EgressAsk,
    base: RuleSet,
    /// The execs of agent `a` still running.
    running: Arc<Mutex<HashSet<String>>>,
}

/// What one connection attempt came to.
#[derive(Debug)]
struct Outcome {
    /// The response head the client read (`HTTP/1.1 200 …` or the 403 with its header).
    answer: String,
    /// The stream's last record.
    record: ConnectionRecord,
}

impl Outcome {
    fn allowed(&self) -> bool {
        self.answer.starts_with("HTTP/1.1 200")
    }

    fn reason(&self) -> Option<DenyReason> {
        self.record.reason
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

async fn world() -> World {
    let at = echo_server().await;
    let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for n in [
        "new.example.test",
        "other.example.test",
        "blocked.example.test",
        "known.example.test",
    ] {
        names.insert(n.into(), vec![PUBLIC.parse().unwrap()]);
    }
    for i in 1..=6 {
        names.insert(format!("h{i}.example.test"), vec![PUBLIC.parse().unwrap()]);
    }
    names.insert(
        "inner.example.test".into(),
        vec!["10.1.2.3".parse().unwrap()],
    );
    names.insert("lo.example.test".into(), vec!["127.0.0.1".parse().unwrap()]);
    names.insert(
        "mixed.example.test".into(),
        vec![PUBLIC.parse().unwrap(), "10.0.0.1".parse().unwrap()],
    );
    let dialer = Arc::new(Echo {
        at,
        dialled: Mutex::new(Vec::new()),
    });
    let agent: AgentEgressConfig = serde_json::from_value(serde_json::json!({
        "onUnknown": "ask",
        "rules": [
            {"id": "known", "hosts": ["known.example.test"], "ports": [7000]},
            {"id": "no-blocked", "hosts": ["blocked.example.test"], "action": "deny"},
        ],
    }))
    .unwrap();
    let trail = Arc::new(Trail::default());
    World {
        engine: EgressEngine::new(Arc::new(Names(names)), dialer.clone()),
        dialer,
        approvals: Approvals::new(ApprovalsConfig::default(), trail.clone()),
        trail,
        ask: EgressAsk::new(),
        base: rule_set(None, "a", &agent, 100).unwrap(),
        running: Arc::default(),
    }
}

/// A run of session `session` whose exec `exec` runs now; attended.
fn attended(session: &str, exec: &str) -> EgressRun {
    EgressRun {
        session: Some(session.into()),
        exec: Some(exec.into()),
        command: Some("curl https://new.example.test:7000/".into()),
        unattended: None,
    }
}

impl World {
    fn start(&self, exec: &str) {
        self.running.lock().unwrap().insert(exec.into());
    }

    fn end(&self, exec: &str) {
        self.running.lock().unwrap().remove(exec);
    }

    /// One `CONNECT target` of a stream of agent `a` in `run`, wired as the gateway
    /// wires it; `ask` false is `onUnknown: "deny"`.
    async fn connect_with(&self, run: &EgressRun, target: &str, ask: bool) -> Outcome {
        let running = {
            let set = self.running.clone();
            move |exec: &str| set.lock().unwrap().contains(exec)
        };
        let rules = self
            .ask
            .rules_for(&self.approvals, "a", &self.base, run, &running);
        let recorder = Recorder {
            all: Mutex::new(Vec::new()),
            ask: &self.ask,
            approvals: &self.approvals,
            run,
        };
        let asking = AskFor {
            ask: &self.ask,
            approvals: &self.approvals,
            agent: "a",
            base: &self.base,
            rules: &rules,
            run,
            running: &running,
        };
        let (client, gateway) = tokio::io::duplex(64 * 1024);
        let (r, w) = tokio::io::split(gateway);
        let stream = EgressStream::new(
            EgressEntry::Explicit,
            None,
            0,
            format!("CONNECT {target} HTTP/1.1\r\n\r\n").into_bytes(),
            Box::pin(r),
            Box::pin(w),
            "boot".into(),
        );
        let unknown = ask.then_some(&asking as &dyn UnknownHosts);
        let serving = self
            .engine
            .serve_with("a", rules.clone(), 16, stream, &recorder, unknown);
        let talking = async move {
            let mut client = client;
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match client.read(&mut byte).await {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            if head.starts_with(b"HTTP/1.1 200") {
                // The tunnel carries bytes to the echo server and back.
                client.write_all(b"ping").await.unwrap();
                let mut pong = [0u8; 4];
                client.read_exact(&mut pong).await.unwrap();
                assert_eq!(&pong, b"ping");
                client.shutdown().await.unwrap();
            }
            let mut rest = Vec::new();
            let _ = client.read_to_end(&mut rest).await;
            head.extend_from_slice(&rest);
            String::from_utf8_lossy(&head).into_owned()
        };
        let ((), answer) = tokio::join!(serving, talking);
        let record = recorder.all.lock().unwrap().last().cloned().unwrap();
        Outcome { answer, record }
    }

    async fn connect(&self, run: &EgressRun, target: &str) -> Outcome {
        self.connect_with(run, target, true).await
    }

    fn requests(&self) -> Vec<Approval> {
        self.approvals.list(Some("a"))
    }

    async fn decide(&self, id: &str, decision: ApprovalDecision) {
        self.approvals
            .decide(id, &decision, &Approver::owner("api"))
            .await
            .unwrap();
    }

    fn dialled(&self) -> usize {
        self.dialer.dialled.lock().unwrap().len()
    }
}

/// The approval id a `403 approval-pending` names.
fn pending_id(o: &Outcome) -> String {
    assert!(o.answer.starts_with("HTTP/1.1 403"), "{}", o.answer);
    let header = o
        .answer
        .lines()
        .find_map(|l| l.strip_prefix("X-Beige-Egress: "))
        .unwrap_or_else(|| panic!("no X-Beige-Egress in {}", o.answer));
    assert!(
        header.starts_with("approval-pending; approval="),
        "{header}"
    );
    let id = header
        .split("; ")
        .find_map(|p| p.strip_prefix("approval="))
        .unwrap()
        .to_string();
    assert_eq!(o.reason(), Some(DenyReason::ApprovalPending));
    assert_eq!(o.record.approval.as_deref(), Some(id.as_str()));
    id
}

#[tokio::test]
async fn fifty_misses_raise_one_egress_request_with_fifty_attempts() {
    let w = world().await;
    w.start("e1");
    let run = attended("tui:1", "e1");
    let mut ids = HashSet::new();
    for _ in 0..50 {
        let o = w.connect(&run, "new.example.test:7000").await;
        ids.insert(pending_id(&o));
        assert!(
            o.answer.contains("retry once it is approved"),
            "{}",
            o.answer
        );
    }
    assert_eq!(ids.len(), 1, "one request for all 50: {ids:?}");
    let requests = w.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let r = &requests[0];
    assert_eq!(r.kind, ApprovalKind::Egress);
    assert_eq!(r.attempts, Some(50));
    assert_eq!(r.status, ApprovalStatus::Pending);
    assert_eq!(r.session, "tui:1");
    assert_eq!(r.exec.as_deref(), Some("e1"));
    assert_eq!(r.tool, "egress.connect");
    assert_eq!(
        r.args,
        ["new.example.test:7000", "entry=explicit", "mode=tunnel"]
    );
    assert_eq!(
        r.justification.as_deref(),
        Some("exec: curl https://new.example.test:7000/")
    );
    // The digest covers the call: host, port, entry and mode, in its session.
    let facts = |args: Vec<String>| CallFacts {
        agent: "a".into(),
        session: "tui:1".into(),
        exec: None,
        tool: TOOL.into(),
        args,
        cwd: None,
        stdin_sha256: None,
        rule: None,
        justification: None,
        reason: String::new(),
    };
    assert_eq!(r.call_digest, call_digest(&facts(r.args.clone())));
    let mut other_port = r.args.clone();
    other_port[0] = "new.example.test:7001".into();
    assert_ne!(r.call_digest, call_digest(&facts(other_port)));
    // Asked once, nothing dialled.
    assert_eq!(
        w.trail
            .phases()
            .iter()
            .filter(|p| *p == "requested")
            .count(),
        1
    );
    assert_eq!(w.dialled(), 0);
}

#[tokio::test]
async fn deny_rules_and_the_classifier_refuse_without_asking() {
    let w = world().await;
    w.start("e1");
    let run = attended("tui:1", "e1");
    for (target, reason) in [
        ("blocked.example.test:443", DenyReason::DeniedByRule),
        ("blocked.example.test:7000", DenyReason::DeniedByRule),
        ("inner.example.test:443", DenyReason::PrivateAddress),
        ("lo.example.test:443", DenyReason::PrivateAddress),
        ("mixed.example.test:443", DenyReason::PrivateAddress),
        ("gone.example.test:443", DenyReason::DnsFailed),
        ("11.0.0.1:443", DenyReason::IpLiteral),
    ] {
        let o = w.connect(&run, target).await;
        assert!(
            o.answer.starts_with("HTTP/1.1 403"),
            "{target}: {}",
            o.answer
        );
        assert_eq!(o.reason(), Some(reason), "{target}: {:?}", o.record);
        assert_eq!(o.record.approval, None, "{target}");
        assert!(
            o.answer.contains(&format!(
                "X-Beige-Egress: denied; reason={}",
                reason.as_str()
            )),
            "{target}: {}",
            o.answer
        );
    }
    assert!(w.requests().is_empty(), "{:?}", w.requests());
    assert_eq!(w.dialled(), 0);
    // With `onUnknown: "deny"` a miss is refused as it is.
    let o = w.connect_with(&run, "new.example.test:7000", false).await;
    assert_eq!(o.reason(), Some(DenyReason::NoRule));
    assert!(w.requests().is_empty());
}

#[tokio::test]
async fn approve_once_admits_that_host_and_port_for_the_exec_that_uses_it() {
    let w = world().await;
    w.start("e1");
    let first = attended("tui:1", "e1");
    let id = pending_id(&w.connect(&first, "new.example.test:7000").await);
    w.decide(&id, ApprovalDecision::approve(Scope::Once)).await;
    // The asking exec has ended; the session's next exec retries.
    w.end("e1");
    w.start("e2");
    let retry = attended("tui:1", "e2");
    let o = w.connect(&retry, "new.example.test:7000").await;
    assert!(o.allowed(), "{}", o.answer);
    assert_eq!(o.record.reason, None);
    let rule = format!("approval-{id}");
    assert_eq!(o.record.rule.as_deref(), Some(rule.as_str()));
    assert!(
        o.record.policy_version > 100,
        "a decision bumps the version"
    );
    assert_eq!(
        w.approvals.get(&id).unwrap().status,
        ApprovalStatus::Consumed
    );
    // Used by e2: e2 may connect again while it runs.
    assert!(w.connect(&retry, "new.example.test:7000").await.allowed());
    // Another port or another host is not approved: each asks on its own.
    let port = pending_id(&w.connect(&retry, "new.example.test:7001").await);
    let host = pending_id(&w.connect(&retry, "other.example.test:7000").await);
    assert_ne!(port, id);
    assert_ne!(host, id);
    assert_ne!(port, host);
    // Another exec running at the same time in the session is not e2.
    w.start("e3");
    let other_exec = attended("tui:1", "e3");
    let again = pending_id(&w.connect(&other_exec, "new.example.test:7000").await);
    assert_ne!(again, id);
    // Once e2 has ended the rule is gone.
    w.end("e2");
    w.end("e3");
    w.start("e4");
    let later = attended("tui:1", "e4");
    assert!(!w.connect(&later, "new.example.test:7000").await.allowed());
    assert_eq!(w.dialled(), 2, "only the two approved streams were dialled");
}

#[tokio::test]
async fn approve_for_the_session_admits_that_session_only_and_for_a_while_until_it_ends() {
    let w = world().await;
    w.start("e1");
    let run = attended("tui:1", "e1");
    let id = pending_id(&w.connect(&run, "new.example.test:7000").await);
    w.decide(&id, ApprovalDecision::approve(Scope::Session))
        .await;
    for exec in ["e1", "e2"] {
        w.start(exec);
        let o = w
            .connect(&attended("tui:1", exec), "new.example.test:7000")
            .await;
        assert!(o.allowed(), "{exec}: {}", o.answer);
    }
    // Another session of the agent asks for itself.
    w.start("x1");
    let elsewhere = attended("telegram:42", "x1");
    let theirs = pending_id(&w.connect(&elsewhere, "new.example.test:7000").await);
    assert_ne!(theirs, id);
    // Not another port.
    assert!(!w.connect(&run, "new.example.test:7001").await.allowed());

    // Time-boxed: a second's grant ends.
    let mut decision = ApprovalDecision::approve(Scope::Duration);
    decision.duration_seconds = Some(1);
    w.decide(&theirs, decision).await;
    assert!(w
        .connect(&elsewhere, "new.example.test:7000")
        .await
        .allowed());
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let o = w.connect(&elsewhere, "new.example.test:7000").await;
    assert!(!o.allowed(), "{}", o.answer);
    // The first session's grant is unaffected.
    assert!(w.connect(&run, "new.example.test:7000").await.allowed());
}

#[tokio::test]
async fn approve_always_admits_every_session_and_a_denial_refuses_without_asking_again() {
    let w = world().await;
    w.start("e1");
    let run = attended("tui:1", "e1");
    let id = pending_id(&w.connect(&run, "new.example.test:7000").await);
    w.decide(&id, ApprovalDecision::approve(Scope::Always))
        .await;
    for (session, exec) in [("tui:1", "e1"), ("telegram:42", "x1")] {
        w.start(exec);
        assert!(w
            .connect(&attended(session, exec), "new.example.test:7000")
            .await
            .allowed());
    }
    // Even a run nobody attends gets an `always` rule.
    let unattended = EgressRun {
        unattended: Some("a schedule".into()),
        ..attended("schedule:s1", "s1")
    };
    w.start("s1");
    assert!(w
        .connect(&unattended, "new.example.test:7000")
        .await
        .allowed());

    let denied = pending_id(&w.connect(&run, "other.example.test:7000").await);
    w.decide(&denied, ApprovalDecision::deny(Some("not that one".into())))
        .await;
    for _ in 0..3 {
        let o = w.connect(&run, "other.example.test:7000").await;
        assert_eq!(
            o.reason(),
            Some(DenyReason::ApprovalDenied),
            "{:?}",
            o.record
        );
        assert_eq!(o.record.approval.as_deref(), Some(denied.as_str()));
        assert!(
            o.answer
                .contains("X-Beige-Egress: denied; reason=approval_denied; approval="),
            "{}",
            o.answer
        );
    }
    assert_eq!(w.requests().len(), 2, "no new request after the denial");
}

#[tokio::test]
async fn an_unattended_run_is_denied_at_once_and_reported_once() {
    let w = world().await;
    let mut events = w.approvals.subscribe();
    w.start("s1");
    let run = EgressRun {
        unattended: Some("session 'schedule:s1' has no attended prompt running".into()),
        ..attended("schedule:s1", "s1")
    };
    for _ in 0..3 {
        let o = w.connect(&run, "new.example.test:7000").await;
        assert_eq!(o.reason(), Some(DenyReason::Unattended), "{:?}", o.record);
        assert!(
            o.answer
                .contains("X-Beige-Egress: denied; reason=unattended"),
            "{}",
            o.answer
        );
    }
    // An unbound stream too.
    let unbound = EgressRun {
        unattended: Some("an unbound stream".into()),
        ..EgressRun::default()
    };
    assert_eq!(
        w.connect(&unbound, "new.example.test:7000").await.reason(),
        Some(DenyReason::Unattended)
    );
    assert!(w.requests().is_empty());
    assert_eq!(
        w.trail.phases(),
        ["unattended", "unattended"],
        "reported once per run and target"
    );
    match events.try_recv().unwrap() {
        ApprovalEvent::UnattendedDenied { agent, call, .. } => {
            assert_eq!(agent, "a");
            assert!(
                call.starts_with("egress.connect new.example.test:7000"),
                "{call}"
            );
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(w.dialled(), 0);
}

#[tokio::test]
async fn at_most_five_egress_requests_wait_per_agent() {
    let w = world().await;
    w.start("e1");
    let run = attended("tui:1", "e1");
    for i in 1..=5 {
        pending_id(&w.connect(&run, &format!("h{i}.example.test:443")).await);
    }
    let sixth = w.connect(&run, "h6.example.test:443").await;
    assert_eq!(
        sixth.reason(),
        Some(DenyReason::NoRule),
        "{:?}",
        sixth.record
    );
    assert_eq!(sixth.record.approval, None);
    assert!(
        sixth
            .record
            .error
            .as_deref()
            .is_some_and(|e| e.contains("at most 5")),
        "{:?}",
        sixth.record
    );
    assert_eq!(w.requests().len(), 5);
    // Answering one makes room.
    let first = w
        .requests()
        .into_iter()
        .find(|r| r.args[0] == "h1.example.test:443")
        .unwrap();
    w.decide(&first.id, ApprovalDecision::deny(None)).await;
    pending_id(&w.connect(&run, "h6.example.test:443").await);
}

#[tokio::test]
async fn a_known_host_on_another_port_is_asked_about_and_its_rule_stays() {
    let w = world().await;
    w.start("e1");
    let run = attended("tui:1", "e1");
    assert!(w.connect(&run, "known.example.test:7000").await.allowed());
    let id = pending_id(&w.connect(&run, "known.example.test:7001").await);
    let r = w.approvals.get(&id).unwrap();
    assert!(r.reason.contains("port_not_allowed"), "{}", r.reason);
    assert_eq!(w.requests().len(), 1);
}
