use std::sync::Arc;
use std::time::Duration;

use beige_client::approvals::{ApprovalDecision, ApprovalStatus, Scope};

use super::*;
use crate::audit::{AuditError, AuditRecord, AuditSink};

/// Keeps every record, to assert on the audit trail.
#[derive(Debug, Default)]
struct Records(Mutex<Vec<AuditRecord>>);

#[async_trait::async_trait]
impl AuditSink for Records {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.0.lock().unwrap().push(record.clone());
        Ok(())
    }
}

impl Records {
    fn phases(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|r| r.approval.as_ref().map(|a| a.phase.clone()))
            .collect()
    }
}

fn broker(timeout: u64) -> (Arc<Approvals>, Arc<Records>) {
    let records = Arc::new(Records::default());
    let config = ApprovalsConfig {
        timeout_seconds: timeout,
        ..Default::default()
    };
    (Arc::new(Approvals::new(config, records.clone())), records)
}

fn call(args: &[&str]) -> CallFacts {
    CallFacts {
        agent: "intern".into(),
        session: "telegram:42".into(),
        exec: None,
        tool: "gh".into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        cwd: Some("repo".into()),
        stdin_sha256: None,
        rule: Some("r3".into()),
        justification: Some("merges publish work".into()),
        reason: "needs approval".into(),
    }
}

fn member(chat: &str) -> Approver {
    Approver {
        principal: Principal::user("telegram", chat),
        role: ApproverRole::Member {
            sessions: format!("telegram:{chat}"),
        },
        via: "telegram".into(),
    }
}

async fn pending_id(b: &Approvals, c: CallFacts) -> String {
    match b.ask(c, Duration::ZERO).await {
        AskOutcome::Pending { approval } => approval.id,
        other => panic!("expected pending, got {other:?}"),
    }
}

#[tokio::test]
async fn a_once_approval_runs_exactly_that_call_once() {
    let (b, records) = broker(900);
    let id = pending_id(&b, call(&["pr", "merge", "41"])).await;
    assert_eq!(id.len(), 16);
    // The identical call joins the request instead of raising a new one.
    assert_eq!(pending_id(&b, call(&["pr", "merge", "41"])).await, id);
    assert_eq!(b.list(None).len(), 1);
    assert_eq!(b.get(&id).unwrap().joined, 1);

    let view = b
        .decide(&id, &ApprovalDecision::approve(Scope::Once), &member("42"))
        .await
        .unwrap();
    assert_eq!(view.status, ApprovalStatus::Approved);
    assert_eq!(view.decided_by.as_deref(), Some("telegram:42"));
    // Another call is not covered by it…
    let other = pending_id(&b, call(&["pr", "merge", "42"])).await;
    assert_ne!(other, id);
    // …nor the same call in another session.
    let mut elsewhere = call(&["pr", "merge", "41"]);
    elsewhere.session = "telegram:43".into();
    assert_ne!(pending_id(&b, elsewhere).await, id);
    // The call itself runs once, then asks again.
    assert!(matches!(
        b.ask(call(&["pr", "merge", "41"]), Duration::ZERO).await,
        AskOutcome::Approved { ref approval, .. } if *approval == id
    ));
    assert!(matches!(
        b.ask(call(&["pr", "merge", "41"]), Duration::ZERO).await,
        AskOutcome::Pending { ref approval } if approval.id != id
    ));
    assert_eq!(b.get(&id).unwrap().status, ApprovalStatus::Consumed);
    let phases = records.phases();
    for p in ["requested", "decided", "consumed"] {
        assert!(phases.iter().any(|x| x == p), "{p} missing from {phases:?}");
    }
}

#[tokio::test]
async fn a_held_caller_gets_the_answer_when_it_comes() {
    let (b, _) = broker(900);
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.ask(call(&["pr", "merge", "41"]), Duration::from_secs(30))
                .await
        })
    };
    let id = loop {
        if let Some(a) = b.list(None).first() {
            break a.id.clone();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    b.decide(
        &id,
        &ApprovalDecision::deny(Some("not today".into())),
        &Approver::owner("api"),
    )
    .await
    .unwrap();
    match waiter.await.unwrap() {
        AskOutcome::Denied { by, reason, .. } => {
            assert_eq!(by, "api-token");
            assert_eq!(reason.as_deref(), Some("not today"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn who_may_decide_what() {
    let (b, records) = broker(900);
    let id = pending_id(&b, call(&["pr", "merge", "41"])).await;
    let digest = b.get(&id).unwrap().call_digest;
    // The agent, unverified callers and the gateway itself never approve.
    for p in [
        Principal::Sandbox,
        Principal::Unverified,
        Principal::Embedder,
    ] {
        let a = Approver {
            principal: p,
            role: ApproverRole::Owner,
            via: "socket".into(),
        };
        let e = b
            .decide(&id, &ApprovalDecision::approve(Scope::Once), &a)
            .await;
        assert!(matches!(e, Err(DecideError::Forbidden(_))), "{e:?}");
    }
    // A member of another chat, or a member asking for more than once.
    assert!(matches!(
        b.decide(&id, &ApprovalDecision::approve(Scope::Once), &member("7"))
            .await,
        Err(DecideError::Forbidden(_))
    ));
    assert!(matches!(
        b.decide(
            &id,
            &ApprovalDecision::approve(Scope::Always),
            &member("42")
        )
        .await,
        Err(DecideError::Forbidden(_))
    ));
    // A wrong digest is refused; the request stays pending.
    let wrong = ApprovalDecision::approve(Scope::Once).with_digest("00");
    assert!(matches!(
        b.decide(&id, &wrong, &Approver::owner("api")).await,
        Err(DecideError::DigestMismatch { .. })
    ));
    assert!(matches!(
        b.decide("NOSUCHIDNOSUCHID", &wrong, &Approver::owner("api"))
            .await,
        Err(DecideError::NotFound(_))
    ));
    assert_eq!(b.get(&id).unwrap().status, ApprovalStatus::Pending);
    assert!(records.phases().iter().filter(|p| *p == "refused").count() >= 5);
    // The owner may; the first decision wins.
    let right = ApprovalDecision::approve(Scope::Session).with_digest(digest);
    b.decide(&id, &right, &Approver::owner("api"))
        .await
        .unwrap();
    assert!(matches!(
        b.decide(&id, &ApprovalDecision::deny(None), &Approver::owner("api"))
            .await,
        Err(DecideError::Settled {
            status: ApprovalStatus::Approved,
            ..
        })
    ));
    // A session grant covers the exact call again and again.
    for _ in 0..3 {
        assert!(matches!(
            b.ask(call(&["pr", "merge", "41"]), Duration::ZERO).await,
            AskOutcome::Approved { .. }
        ));
    }
}

#[tokio::test]
async fn requests_expire_and_floods_are_bounded() {
    let (b, records) = broker(1);
    let started = std::time::Instant::now();
    let outcome = b
        .ask(call(&["pr", "merge", "41"]), Duration::from_secs(30))
        .await;
    assert!(matches!(outcome, AskOutcome::Expired { .. }), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(records.phases().iter().any(|p| p == "expired"));

    let (b, _) = broker(900);
    for i in 0..5 {
        pending_id(&b, call(&["pr", "merge", &i.to_string()])).await;
    }
    assert!(matches!(
        b.ask(call(&["pr", "merge", "99"]), Duration::ZERO).await,
        AskOutcome::TooMany { limit: 5 }
    ));
}

#[test]
fn the_digest_binds_every_part_of_the_call() {
    let base = call(&["pr", "merge", "41"]);
    let d = call_digest(&base);
    assert_eq!(d.len(), 64);
    let mut exec_only = base.clone();
    exec_only.exec = Some("e1".into());
    assert_eq!(
        call_digest(&exec_only),
        d,
        "the exec is recorded, not hashed"
    );
    for change in [
        |c: &mut CallFacts| c.args.push("x".into()),
        |c: &mut CallFacts| c.cwd = None,
        |c: &mut CallFacts| c.session = "api:x".into(),
        |c: &mut CallFacts| c.tool = "kv".into(),
        |c: &mut CallFacts| c.stdin_sha256 = Some("ab".into()),
        |c: &mut CallFacts| c.agent = "other".into(),
    ] {
        let mut c = base.clone();
        change(&mut c);
        assert_ne!(call_digest(&c), d);
    }
}

#[tokio::test]
async fn egress_requests_count_attempts_and_list_what_is_settled() {
    use beige_client::approvals::ApprovalKind;
    let (b, records) = broker(900);
    let egress = |host: &str| CallFacts {
        tool: "egress.connect".into(),
        args: vec![format!("{host}:443")],
        cwd: None,
        rule: None,
        ..call(&[])
    };
    let asked = b
        .ask_kind(
            egress("a.example.test"),
            ApprovalKind::Egress,
            Duration::ZERO,
        )
        .await;
    let AskOutcome::Pending { approval } = asked else {
        panic!("{asked:?}")
    };
    assert_eq!(approval.kind, ApprovalKind::Egress);
    assert_eq!(approval.attempts, Some(1));
    // Joining the same call, and noting an attempt, both count.
    let _ = b
        .ask_kind(
            egress("a.example.test"),
            ApprovalKind::Egress,
            Duration::ZERO,
        )
        .await;
    assert_eq!(b.note_attempt(&approval.id).unwrap().attempts, Some(3));
    // A tool request has no attempts and another kind.
    let tool = pending_id(&b, call(&["pr", "merge", "1"])).await;
    assert_eq!(b.get(&tool).unwrap().kind, ApprovalKind::Tool);
    assert_eq!(b.get(&tool).unwrap().attempts, None);
    assert_eq!(b.note_attempt(&tool).unwrap().joined, 1);
    assert!(b.settled("intern", ApprovalKind::Egress).is_empty());

    // Waiting ends with the decision.
    let generation = b.generation();
    let (waited, decided) = tokio::join!(b.wait(&approval.id, Duration::from_secs(5)), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.decide(
            &approval.id,
            &ApprovalDecision::approve(Scope::Once),
            &Approver::owner("api"),
        )
        .await
    });
    assert_eq!(waited.unwrap().status, ApprovalStatus::Approved);
    assert!(decided.is_ok());
    assert!(b.generation() > generation, "a decision is a settling step");
    assert!(b.note_attempt(&approval.id).is_none(), "no longer pending");
    let settled = b.settled("intern", ApprovalKind::Egress);
    assert_eq!(settled.len(), 1);
    assert!(settled[0].until.is_some(), "an unused once approval lapses");
    assert!(b.settled("intern", ApprovalKind::Tool).is_empty());
    assert!(b.settled("other", ApprovalKind::Egress).is_empty());
    // Used once: consumed, audited, and not again.
    assert!(b.consume(&approval.id).await);
    assert!(!b.consume(&approval.id).await);
    assert_eq!(
        b.get(&approval.id).unwrap().status,
        ApprovalStatus::Consumed
    );
    assert_eq!(
        records.phases().iter().filter(|p| *p == "consumed").count(),
        1
    );

    // A duration grant is listed until it ends, then no more.
    let AskOutcome::Pending { approval: timed } = b
        .ask_kind(
            egress("b.example.test"),
            ApprovalKind::Egress,
            Duration::ZERO,
        )
        .await
    else {
        panic!()
    };
    let mut d = ApprovalDecision::approve(Scope::Duration);
    d.duration_seconds = Some(1);
    b.decide(&timed.id, &d, &Approver::owner("api"))
        .await
        .unwrap();
    let listed = |b: &Approvals| {
        b.settled("intern", ApprovalKind::Egress)
            .into_iter()
            .any(|s| s.approval.id == timed.id)
    };
    assert!(listed(&b));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(!listed(&b), "an ended grant grants nothing");
}
