//! Approvals for scripts in a real Docker sandbox: a script that calls an ask-ruled
//! plugin tool in a loop raises one request, its calls exit 76 `pending approval <id>`,
//! the exec result carries the footer, a `once` approval lets exactly one re-run
//! through, and the same exec from an unattended run is denied at once.

use beige_core::api::approvals::{ApprovalDecision, ApprovalEvent, Scope};
use beige_core::api::tools::{CoreToolCall, ToolContext};
use beige_core::api::{Admin as _, Gateway as _, Principal};
use beige_core::LocalGateway;
use serde_json::json;

use super::support::TestHome;
use crate::docker_or_skip;

async fn run(gw: &LocalGateway, command: &str, attended: bool) -> String {
    let ctx = ToolContext {
        session_key: Some("api:a:night".into()),
        channel: Some("api".into()),
        attended,
        ..ToolContext::default()
    };
    let call = CoreToolCall::parse("exec", json!({ "command": command })).unwrap();
    gw.call_tool("a", call, ctx).await.unwrap().joined_text()
}

#[tokio::test]
async fn a_script_calling_an_ask_ruled_tool_50_times_raises_one_approval() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let policy = json!({"rules": [
        {"id": "kv-set", "tool": "kv", "pattern": ["set"], "decision": "ask",
         "justification": "writes shared state"},
    ]});
    let mut config = t.config(&env, &[("a", json!({"tools": ["kv"], "policy": policy}))]);
    config.plugins = serde_json::from_value(json!({"kv": {}})).unwrap();
    config.approvals = Some(serde_json::from_value(json!({"scriptHoldSeconds": 0})).unwrap());
    let gw = t.gateway(&env, config).await;
    let mut events = gw.approval_receiver().await;

    let loop50 = "i=0; while [ $i -lt 50 ]; do i=$((i+1)); kv set k v </dev/null 2>/tmp/err; echo \"rc=$?\"; done; cat /tmp/err";
    let text = run(&gw, loop50, true).await;
    assert_eq!(text.matches("rc=76").count(), 50, "{text}");
    let pending = gw.approvals(Some("a")).await.unwrap();
    assert_eq!(
        pending.len(),
        1,
        "one request for 50 identical calls: {pending:?}"
    );
    let request = &pending[0];
    assert_eq!(request.joined, 49);
    assert_eq!(request.rule.as_deref(), Some("kv-set"));
    assert!(request.exec.is_some(), "the request names the exec");
    assert!(
        text.contains(&format!(
            "kv: pending approval {}: kv set k v (rule 'kv-set'); re-run after approval",
            request.id
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "[beige] 1 call waiting for approval: {} kv set k v",
            request.id
        )),
        "{text}"
    );
    let mut requested = 0;
    while let Ok(e) = events.try_recv() {
        if matches!(e, ApprovalEvent::ApprovalRequest { .. }) {
            requested += 1;
        }
    }
    assert_eq!(requested, 1);

    // The agent cannot approve: the decision needs a person.
    let refused = gw
        .decide_approval(
            &request.id,
            ApprovalDecision::approve(Scope::Once),
            Principal::Sandbox,
        )
        .await;
    assert!(refused.is_err());
    // A wrong digest is refused too.
    let wrong = ApprovalDecision::approve(Scope::Once).with_digest("0".repeat(64));
    assert!(gw
        .decide_approval(&request.id, wrong, Principal::ApiToken)
        .await
        .is_err());
    let once = ApprovalDecision::approve(Scope::Once).with_digest(request.call_digest.clone());
    gw.decide_approval(&request.id, once, Principal::ApiToken)
        .await
        .unwrap();
    // One re-run goes through, in a new exec of the same session; the next asks again.
    let again = "kv set k v </dev/null; echo \"rc=$?\"; kv set k v </dev/null; echo \"rc=$?\"";
    let text = run(&gw, again, true).await;
    assert!(text.contains("rc=0\nrc=76"), "{text}");
    // Another argument was never covered.
    let other = run(&gw, "kv set k w </dev/null; echo \"rc=$?\"", true).await;
    assert!(other.contains("rc=76"), "{other}");

    // The same loop from an unattended run: denied at once, no new request.
    let before = gw.approvals(Some("a")).await.unwrap().len();
    let started = std::time::Instant::now();
    let text = run(&gw, "kv set k z </dev/null 2>&1; echo \"rc=$?\"", false).await;
    assert!(text.contains("rc=1"), "{text}");
    assert!(text.contains("this run is unattended"), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(gw.approvals(Some("a")).await.unwrap().len(), before);
    gw.shutdown().await.unwrap();
}
