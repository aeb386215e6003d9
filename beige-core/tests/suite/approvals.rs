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

const TOKEN: &str = "test-token-0123456789";

/// The HTTP API end to end: an SSE prompt sent with `approvals: "stream"` gets the
/// `approval_request` event and is answered through the decision route (by the client
/// the TUI uses); a plain JSON prompt is unattended; the route checks the digest and
/// the token.
#[tokio::test]
async fn over_http_an_sse_client_answers_the_request_and_plain_json_is_unattended() {
    use beige_core::channel::http::{ApiState, HttpApiChannel};
    use beige_core::llm::scripted::ScriptedProvider;
    use beige_core::testing::MemorySandbox;
    use beige_core::{AgentEvent, Channel as _, ChannelContext, GatewayBuilder, GatewayFull};
    use futures_util::StreamExt;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let home = beige_core::BeigeHome::new(dir.path().join("home"));
    std::fs::create_dir_all(home.root()).unwrap();
    let config: beige_core::config::Config = serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": "http://127.0.0.1:9"}}},
        "agents": {"a": {
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": [],
            "policy": {"rules": [{"id": "push", "tool": "exec", "pattern": ["git", "push"],
                                   "decision": "ask", "justification": "publishes work"}]},
        }},
        "approvals": {"holdSeconds": 30},
    }))
    .unwrap();
    let model = ScriptedProvider::new("anthropic")
        .then_tool("t1", "exec", json!({"command": "git push origin main"}))
        .then_text("pushed")
        .then_tool("t2", "exec", json!({"command": "git push origin main"}))
        .then_text("not pushed");
    let sandbox = Arc::new(MemorySandbox::new());
    let gw = Arc::new(
        GatewayBuilder::new(config, home)
            .sandbox(sandbox.clone())
            .provider(Arc::new(model.clone()))
            .build()
            .await
            .unwrap(),
    );
    let state = ApiState::new(gw.clone(), Some(TOKEN.to_string()));
    let (channel, addr) = HttpApiChannel::bind("127.0.0.1", 0, state).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let full: Arc<dyn GatewayFull> = gw.clone();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { channel.run(ChannelContext::new(full, stop)).await }
    });
    let url = format!("http://{addr}");
    let remote = beige_core::RemoteGateway::new(&url, Some(TOKEN.into())).unwrap();

    let mut stream = remote
        .prompt(beige_core::PromptRequest::new("a", "api:a:web", "push").attended())
        .await
        .unwrap();
    let request = loop {
        match tokio::time::timeout(std::time::Duration::from_secs(30), stream.next()).await {
            Ok(Some(AgentEvent::ApprovalRequest { approval })) => break approval,
            Ok(Some(e)) => assert!(!e.is_terminal(), "ended before asking: {e:?}"),
            other => panic!("no approval request: {other:?}"),
        }
    };
    assert_eq!(request.call_line(), "exec git push origin main");
    assert_eq!(request.rule.as_deref(), Some("push"));
    // The route: no token → 401, no digest → 400, a wrong digest → 409.
    let decision = format!("{url}/api/approvals/{}/decision", request.id);
    let http = reqwest::Client::new();
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(
            http.post(&decision)
                .json(&json!({"decision": "approve"}))
                .send()
                .await
                .unwrap()
        ),
        401
    );
    let post = |body: serde_json::Value| http.post(&decision).bearer_auth(TOKEN).json(&body).send();
    assert_eq!(
        status(post(json!({"decision": "approve"})).await.unwrap()),
        400
    );
    assert_eq!(
        status(
            post(json!({"decision": "approve", "callDigest": "00"}))
                .await
                .unwrap()
        ),
        409
    );
    let listed: serde_json::Value = http
        .get(format!("{url}/api/approvals"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["approvals"][0]["id"], request.id.as_str());
    assert_eq!(listed["approvals"][0]["status"], "pending");
    // The client binds its decision to the digest it sees.
    let decided = remote
        .decide_approval(
            &request.id,
            ApprovalDecision::approve(Scope::Once),
            Principal::ApiToken,
        )
        .await
        .unwrap();
    assert_eq!(decided.decided_by.as_deref(), Some("api-token"));
    let rest: Vec<AgentEvent> = stream.collect_all().await;
    assert!(
        rest.iter()
            .any(|e| matches!(e, AgentEvent::Done { response, .. } if response == "pushed")),
        "{rest:?}"
    );
    assert_eq!(
        sandbox
            .executed("a")
            .iter()
            .filter(|c| c.contains("git push"))
            .count(),
        1
    );
    // Deciding again is a conflict.
    assert_eq!(
        status(
            post(json!({"decision": "deny", "callDigest": request.call_digest}))
                .await
                .unwrap()
        ),
        409
    );

    // A plain JSON prompt cannot answer, so it is unattended even if it asks to stream.
    let started = std::time::Instant::now();
    let answer: serde_json::Value = http
        .post(format!("{url}/api/agents/a/prompt"))
        .bearer_auth(TOKEN)
        .json(&json!({"message": "push again", "sessionKey": "api:a:web", "approvals": "stream"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(answer["response"], "not pushed", "{answer}");
    let last = serde_json::to_string(&model.requests().last().unwrap().messages).unwrap();
    assert!(last.contains("this run is unattended"), "{last}");
    assert_eq!(
        sandbox
            .executed("a")
            .iter()
            .filter(|c| c.contains("git push"))
            .count(),
        1
    );
    stop.cancel();
    let _ = task.await;
}
