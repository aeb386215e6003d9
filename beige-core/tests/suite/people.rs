//! Users and roles (`spec/people.md` §1) over the real HTTP API on `127.0.0.1:0`: personal
//! tokens minted by the owner, each role's rights on each agent through every kind of
//! route, approvals decided by role, revocation that stops a token at once, and the
//! audit naming the person behind each prompt, approval and refusal. The model is a
//! labelled scripted provider and the sandbox the labelled `MemorySandbox`: what is
//! under test is who may do what, not the sandbox.

use std::sync::Arc;

use beige_core::api::approvals::{ApprovalDecision, Scope};
use beige_core::channel::http::{ApiState, HttpApiChannel};
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::testing::MemorySandbox;
use beige_core::{Admin as _, Gateway as _, LocalGateway, Principal, Sessions as _};
use beige_core::{AgentEvent, Channel as _, ChannelContext, GatewayBuilder, GatewayFull};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const OWNER_TOKEN: &str = "people-owner-token-0123456789";

struct Fixture {
    _dir: tempfile::TempDir,
    gw: Arc<LocalGateway>,
    url: String,
    http: reqwest::Client,
    stop: CancellationToken,
    model: ScriptedProvider,
    sandbox: Arc<MemorySandbox>,
}

impl Fixture {
    /// Agents `a` and `b`; users `mem` (member on a), `vi` (viewer everywhere), `op`
    /// (operator on a, viewer elsewhere) and `boss` (owner); `exec git push` asks.
    async fn new(model: ScriptedProvider) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = beige_core::BeigeHome::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let agent = json!({
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": [],
            "policy": {"rules": [{"id": "push", "tool": "exec", "pattern": ["git", "push"],
                                   "decision": "ask", "justification": "publishes work"}]},
        });
        let config: beige_core::config::Config = serde_json::from_value(json!({
            "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": "http://127.0.0.1:9"}}},
            "agents": {"a": agent.clone(), "b": agent},
            "approvals": {"holdSeconds": 30},
            "users": {
                "mem": {"roles": {"a": "member"}},
                "vi": {"roles": {"*": "viewer"}},
                "op": {"roles": {"a": "operator", "*": "viewer"}},
                "boss": {"roles": {"*": "owner"}},
            },
        }))
        .unwrap();
        let sandbox = Arc::new(MemorySandbox::new());
        let gw = Arc::new(
            GatewayBuilder::new(config, home)
                .sandbox(sandbox.clone())
                .provider(Arc::new(model.clone()))
                .build()
                .await
                .unwrap(),
        );
        let state = ApiState::new(gw.clone(), Some(OWNER_TOKEN.to_string()));
        let (channel, addr) = HttpApiChannel::bind("127.0.0.1", 0, state).unwrap();
        let stop = CancellationToken::new();
        let full: Arc<dyn GatewayFull> = gw.clone();
        tokio::spawn({
            let stop = stop.clone();
            async move { channel.run(ChannelContext::new(full, stop)).await }
        });
        Self {
            _dir: dir,
            gw,
            url: format!("http://{addr}"),
            http: reqwest::Client::new(),
            stop,
            model,
            sandbox,
        }
    }

    /// A token for `user`, minted by the owner over the API.
    async fn token_for(&self, user: &str) -> (String, String) {
        let (status, body) = self
            .call(
                OWNER_TOKEN,
                "POST",
                "/api/tokens",
                Some(json!({"user": user, "name": "test"})),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let token = body["token"].as_str().unwrap().to_string();
        assert!(token.starts_with("bgt_"), "{token}");
        (token, body["info"]["id"].as_str().unwrap().to_string())
    }

    async fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.gw.home().audit_log_path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn names(agents: &Value) -> Vec<String> {
    agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_string())
        .collect()
}

/// Every role against every kind of route, on the agent it has a role on and on the
/// other: see, prompt (own and others' sessions), run core tools directly, read
/// transcripts, administer. A member of `a` cannot reach `b` (404: names do not leak);
/// a viewer cannot prompt; an operator runs `exec` on `a` only; the owner does all.
#[tokio::test]
async fn each_role_may_do_exactly_what_the_table_says_through_the_http_api() {
    let model = ScriptedProvider::new("anthropic")
        .then_text("hello mem")
        .then_text("hello boss");
    let f = Fixture::new(model).await;
    let (mem, _) = f.token_for("mem").await;
    let (vi, _) = f.token_for("vi").await;
    let (op, _) = f.token_for("op").await;
    let (boss, _) = f.token_for("boss").await;

    // Seeing: each lists only the agents they have a role on.
    assert_eq!(
        names(&f.call(&mem, "GET", "/api/agents", None).await.1),
        ["a"]
    );
    assert_eq!(
        names(&f.call(&vi, "GET", "/api/agents", None).await.1),
        ["a", "b"]
    );
    let (status, who) = f.call(&mem, "GET", "/api/whoami", None).await;
    assert_eq!(status, 200);
    assert_eq!(who["user"], "mem");
    assert_eq!(who["roles"], json!({"a": "member"}));
    assert_eq!(who["owner"], false);
    // An agent without a role is not there at all.
    let (status, body) = f.call(&mem, "GET", "/api/agents/b/sandbox", None).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "Unknown agent: b");
    let (status, _) = f
        .call(
            &mem,
            "POST",
            "/api/agents/b/prompt",
            Some(json!({"message": "hi"})),
        )
        .await;
    assert_eq!(status, 404);

    // Prompting: a member in their own session (the default for them), not in others'.
    let (status, body) = f
        .call(
            &mem,
            "POST",
            "/api/agents/a/prompt",
            Some(json!({"message": "hi"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["response"], "hello mem");
    // The model is told who is speaking, as the gateway authenticated them.
    let system = &f.model.requests()[0].system;
    assert!(system.contains("- Speaker: mem, via token:"), "{system}");
    let (status, body) = f
        .call(
            &mem,
            "POST",
            "/api/agents/a/prompt",
            Some(json!({"message": "hi", "sessionKey": "api:a:default"})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("only their own sessions"),
        "{body}"
    );
    // A viewer may not prompt; the refusal names user, role and what is required.
    let (status, body) = f
        .call(
            &vi,
            "POST",
            "/api/agents/a/prompt",
            Some(json!({"message": "hi"})),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        body["error"],
        "vi (viewer on a) may not prompt a: member required"
    );

    // Core tools directly: operators only, on the agents they operate.
    let exec = json!({"tool": "exec", "params": {"command": "echo direct"}});
    let (status, body) = f
        .call(&mem, "POST", "/api/agents/a/exec", Some(exec.clone()))
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        body["error"],
        "mem (member on a) may not operate a: operator required"
    );
    let (status, body) = f
        .call(&op, "POST", "/api/agents/a/exec", Some(exec.clone()))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = f
        .call(&op, "POST", "/api/agents/b/exec", Some(exec.clone()))
        .await;
    assert_eq!(status, 403, "op is only a viewer on b");
    assert_eq!(
        f.sandbox
            .executed("a")
            .iter()
            .filter(|c| c.contains("echo direct"))
            .count(),
        1
    );
    assert!(f.sandbox.executed("b").is_empty());

    // Transcripts: the member sees only their own sessions; a viewer all, read-only.
    let (status, _) = f
        .call(
            &boss,
            "POST",
            "/api/agents/a/prompt",
            Some(json!({"message": "hi", "sessionKey": "api:a:default"})),
        )
        .await;
    assert_eq!(status, 200);
    let keys = |v: &Value| -> Vec<String> {
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["key"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, mine) = f.call(&mem, "GET", "/api/agents/a/sessions", None).await;
    assert_eq!(keys(&mine), ["api:a:u:mem"]);
    let (_, all) = f.call(&vi, "GET", "/api/agents/a/sessions", None).await;
    let mut all = keys(&all);
    all.sort();
    assert_eq!(all, ["api:a:default", "api:a:u:mem"]);
    let boss_session =
        f.gw.sessions("a")
            .await
            .unwrap()
            .into_iter()
            .find(|s| s.key == "api:a:default")
            .unwrap();
    let (status, _) = f
        .call(
            &mem,
            "GET",
            &format!("/api/agents/a/sessions/{}/messages", boss_session.id),
            None,
        )
        .await;
    assert_eq!(status, 403, "a member reads only their own transcripts");
    let (status, _) = f
        .call(
            &vi,
            "GET",
            &format!("/api/agents/a/sessions/{}/messages", boss_session.id),
            None,
        )
        .await;
    assert_eq!(status, 200);

    // Administration: owners only (the gateway token is one).
    for token in [&mem, &vi, &op] {
        let (status, body) = f.call(token, "GET", "/api/config", None).await;
        assert_eq!(status, 403, "{body}");
        assert!(body["error"].as_str().unwrap().contains("owner"), "{body}");
    }
    assert_eq!(f.call(&boss, "GET", "/api/config", None).await.0, 200);
    assert_eq!(f.call(OWNER_TOKEN, "GET", "/api/config", None).await.0, 200);
    // Nobody mints a token for someone else unless they are an owner.
    let (status, _) = f
        .call(
            &mem,
            "POST",
            "/api/tokens",
            Some(json!({"user": "op", "name": "x"})),
        )
        .await;
    assert_eq!(status, 403);
    let (status, own) = f
        .call(
            &mem,
            "POST",
            "/api/tokens",
            Some(json!({"name": "laptop", "scope": {"maxRole": "viewer"}})),
        )
        .await;
    assert_eq!(status, 201, "{own}");
    // A scope only narrows: this token of mem's is a viewer, so it may not prompt.
    let narrowed = own["token"].as_str().unwrap();
    let (status, _) = f
        .call(
            narrowed,
            "POST",
            "/api/agents/a/prompt",
            Some(json!({"message": "hi"})),
        )
        .await;
    assert_eq!(status, 403);

    // The audit names the person behind each prompt and each refusal.
    let audit = f.audit();
    let prompts: Vec<&Value> = audit.iter().filter(|r| r["type"] == "prompt").collect();
    assert!(
        prompts
            .iter()
            .any(|r| r["principal"] == "mem" && r["session"] == "api:a:u:mem"),
        "{prompts:?}"
    );
    assert!(
        prompts.iter().any(|r| r["principal"] == "boss"),
        "{prompts:?}"
    );
    assert!(prompts
        .iter()
        .all(|r| r["via"].as_str().unwrap().starts_with("token:")));
    let refused: Vec<&Value> = audit
        .iter()
        .filter(|r| r["tool"] == "auth.refused")
        .collect();
    assert!(
        refused.iter().any(|r| r["principal"] == "vi"
            && r["type"] == "auth"
            && r["error"].as_str().unwrap().contains("may not prompt")),
        "{refused:?}"
    );
}

/// Approvals by role: a viewer's decision is refused (403, still pending, audited); a
/// member may answer a request of their own session once but not for the session; an
/// operator decides with any scope, and the approval record names them.
#[tokio::test]
async fn approvals_are_decided_only_by_those_whose_role_allows_it() {
    let model = ScriptedProvider::new("anthropic")
        .then_tool("t1", "exec", json!({"command": "git push origin main"}))
        .then_text("pushed");
    let f = Fixture::new(model).await;
    let (mem, _) = f.token_for("mem").await;
    let (vi, _) = f.token_for("vi").await;
    let (op, _) = f.token_for("op").await;

    let remote = beige_core::RemoteGateway::new(&f.url, Some(mem.clone())).unwrap();
    let mut stream = remote
        .prompt(beige_core::PromptRequest::new("a", "api:a:u:mem", "push").attended())
        .await
        .unwrap();
    let request = loop {
        match tokio::time::timeout(std::time::Duration::from_secs(30), stream.next()).await {
            Ok(Some(AgentEvent::ApprovalRequest { approval })) => break approval,
            Ok(Some(e)) => assert!(!e.is_terminal(), "ended before asking: {e:?}"),
            other => panic!("no approval request: {other:?}"),
        }
    };
    let path = format!("/api/approvals/{}/decision", request.id);
    let decide = |scope: &str| json!({"decision": "approve", "scope": scope, "callDigest": request.call_digest});
    // A viewer sees the request but may not decide it.
    let (_, listed) = f.call(&vi, "GET", "/api/approvals", None).await;
    assert_eq!(listed["approvals"][0]["id"], request.id.as_str());
    let (status, body) = f.call(&vi, "POST", &path, Some(decide("once"))).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("vi (viewer on a) may not approve for a"),
        "{body}"
    );
    // A member may not approve their own request beyond once.
    let (status, body) = f.call(&mem, "POST", &path, Some(decide("session"))).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("operator required"),
        "{body}"
    );
    assert_eq!(
        f.gw.approvals(Some("a")).await.unwrap()[0].status.as_str(),
        "pending"
    );
    assert!(!f
        .sandbox
        .executed("a")
        .iter()
        .any(|c| c.contains("git push")));
    // The operator approves for the session.
    let (status, body) = f.call(&op, "POST", &path, Some(decide("session"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decidedBy"], "op");
    let rest = stream.collect_all().await;
    assert!(
        rest.iter()
            .any(|e| matches!(e, AgentEvent::Done { response, .. } if response == "pushed")),
        "{rest:?}"
    );
    assert_eq!(
        f.sandbox
            .executed("a")
            .iter()
            .filter(|c| c.contains("git push"))
            .count(),
        1
    );
    let audit = f.audit();
    assert!(
        audit.iter().any(|r| r["type"] == "approval"
            && r["approval"]["phase"] == "decided"
            && r["approval"]["approver"] == "op"),
        "the approval record names the operator"
    );
    assert!(
        audit
            .iter()
            .any(|r| r["tool"] == "auth.refused" && r["principal"] == "vi"),
        "the viewer's attempt is audited"
    );
    assert!(audit
        .iter()
        .any(|r| r["type"] == "prompt" && r["principal"] == "mem"));
    let _ = f.model.requests();
}

/// A revoked token stops at once: the next request is 401, and so is a token of a
/// user removed from the config; unknown and malformed tokens are 401 and audited.
#[tokio::test]
async fn a_revoked_token_stops_working_at_once() {
    let f = Fixture::new(ScriptedProvider::new("anthropic")).await;
    let (mem, id) = f.token_for("mem").await;
    assert_eq!(f.call(&mem, "GET", "/api/agents", None).await.0, 200);
    let (status, listed) = f
        .call(OWNER_TOKEN, "GET", "/api/tokens?user=mem", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(listed["tokens"][0]["id"], id.as_str());
    assert!(listed["tokens"][0].get("secret").is_none());
    assert!(
        !listed.to_string().contains(mem.rsplit('_').next().unwrap()),
        "no secret listed"
    );
    let (status, revoked) = f
        .call(OWNER_TOKEN, "DELETE", &format!("/api/tokens/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(revoked["revoked"], true);
    let (status, body) = f.call(&mem, "GET", "/api/agents", None).await;
    assert_eq!(status, 401, "{body}");
    // A right id with a wrong secret, and garbage, are refused the same way.
    let (_, id2) = f.token_for("mem").await;
    let forged = format!("bgt_{id2}_not-the-secret");
    assert_eq!(f.call(&forged, "GET", "/api/agents", None).await.0, 401);
    assert_eq!(f.call("bgt_x", "GET", "/api/agents", None).await.0, 401);
    let failed: Vec<Value> = f
        .audit()
        .into_iter()
        .filter(|r| r["tool"] == "auth.failed")
        .collect();
    assert!(
        failed.iter().any(|r| r["error"] == "revoked token"),
        "{failed:?}"
    );
    assert!(
        failed.iter().any(|r| r["error"] == "wrong secret"),
        "{failed:?}"
    );
    // In process, the same check: the gateway says nobody.
    assert!(f.gw.authenticate(&mem).await.unwrap().is_none());
    // The client `beige users token` uses: create, list, revoke over HTTP.
    let remote = beige_core::RemoteGateway::new(&f.url, Some(OWNER_TOKEN.into())).unwrap();
    let minted = remote
        .create_token(beige_core::api::auth::NewToken {
            user: "op".into(),
            name: "ci".into(),
            expires_in_secs: Some(3600),
            scope: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(
        f.call(&minted.token, "GET", "/api/whoami", None).await.1["user"],
        "op"
    );
    assert!(remote
        .tokens(Some("op"))
        .await
        .unwrap()
        .iter()
        .any(|t| t.id == minted.info.id));
    assert!(remote.revoke_token(&minted.info.id).await.unwrap().revoked);
    assert_eq!(
        f.call(&minted.token, "GET", "/api/whoami", None).await.0,
        401
    );
    let err = remote
        .create_token(beige_core::api::auth::NewToken {
            user: "nobody".into(),
            name: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no user 'nobody'"), "{err}");
    // The gateway's own token is still the owner, unchanged.
    assert_eq!(f.call(OWNER_TOKEN, "GET", "/api/config", None).await.0, 200);
    let _ = Principal::ApiToken;
    let _ = ApprovalDecision::approve(Scope::Once);
}
