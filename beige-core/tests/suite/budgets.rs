//! Budgets and the cost ledger, with real components: the agent loop against the fake
//! Anthropic server (usage scripted per response), the SQLite store in a temp dir, the
//! HTTP API on `127.0.0.1:0` read through `RemoteGateway` (the client `beige usage`
//! uses), and a real Docker sandbox for the per-exec tool-call budget.

use std::sync::Arc;

use beige_core::api::usage::{UsageGroupBy, UsageQuery, UsageTotals};
use beige_core::api::{Admin as _, ErrorKind};
use beige_core::audit::{AuditType, Phase};
use beige_core::channel::http::{ApiState, HttpApiChannel};
use beige_core::config::Config;
use beige_core::store::{LedgerFilter, SqliteStore, UsageLedger};
use beige_core::testing::{MemoryAudit, MemorySandbox};
use beige_core::{AgentEvent, Channel as _, ChannelContext, Gateway as _, GatewayBuilder};
use beige_core::{BeigeHome, GatewayFull, PromptRequest};
use beige_testkit::anthropic::{text_response, MessageStream};
use beige_testkit::llm::FakeLlmServer;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::sandbox_docker::exec;
use super::support::TestHome;
use crate::docker_or_skip;

const TOKEN: &str = "budget-test-token-0123456789";

fn config(llm: &FakeLlmServer, budgets: serde_json::Value) -> Config {
    serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": llm.url()}}},
        "budgets": budgets,
        "agents": {"a": {
            "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
            "tools": [],
            "sandbox": {"image": super::support::test_image(), "memoryLimit": "256m"},
        }},
    }))
    .unwrap()
}

/// Prompts agent `a` in its default API session and collects the turn's events.
async fn prompt_a<G: beige_core::Gateway + ?Sized>(gw: &G, text: &str) -> Vec<AgentEvent> {
    gw.prompt(PromptRequest::new("a", "api:a:default", text))
        .await
        .unwrap()
        .collect_all()
        .await
}

/// A tool call answered with the given usage (input, output, cache read, cache write).
fn tool_call(id: &str, usage: (u64, u64, u64, u64)) -> beige_testkit::llm::Reply {
    MessageStream::new()
        .tool_use(id, "read", json!({"path": "notes.txt"}))
        .stop_reason("tool_use")
        .usage(usage.0, usage.1)
        .cache(usage.2, usage.3)
        .reply()
}

/// With no budget to check, a call that asks for tools has its ledger row written while
/// the tools run: when the prompt is done, every call of it is in the ledger all the
/// same, each priced.
#[tokio::test]
async fn without_budgets_every_model_call_of_a_tool_turn_is_in_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let llm = FakeLlmServer::start().await;
    llm.push(tool_call("tu_1", (1_000, 100, 0, 0)));
    llm.push(tool_call("tu_2", (2_000, 200, 0, 0)));
    llm.push(MessageStream::new().text("done").usage(300, 30).reply());
    let store = Arc::new(SqliteStore::open(dir.path().join("beige.db")).unwrap());
    let gw = GatewayBuilder::new(config(&llm, json!({})), home)
        .sandbox(Arc::new(MemorySandbox::new()))
        .store(store.clone())
        .build()
        .await
        .unwrap();
    let events = prompt_a(&gw, "read my notes twice").await;
    assert!(
        matches!(events.last(), Some(AgentEvent::Done { .. })),
        "{events:#?}"
    );
    let totals = store
        .usage_totals(LedgerFilter {
            agent: Some("a".into()),
            ..LedgerFilter::default()
        })
        .await
        .unwrap();
    // The two tool turns and the answer, as the fake server reports each.
    assert_eq!(totals.calls, 3, "{totals:?}");
    assert_eq!(totals.input_tokens, 1_000 + 2_000 + 300, "{totals:?}");
    assert_eq!(totals.output_tokens, 100 + 200 + 30, "{totals:?}");
    assert!(totals.cost_micros > 0, "{totals:?}");
}

#[tokio::test]
async fn a_session_over_its_token_budget_ends_its_turn_and_the_ledger_adds_up() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let llm = FakeLlmServer::start().await;
    // 10000 + 1000 + 6000 = 17000 tokens (85 %), then 2000 + 417 + 1000 more: 20417.
    // Cache reads (4000, 500) are not budget tokens.
    llm.push(tool_call("tu_1", (10_000, 1_000, 4_000, 6_000)));
    llm.push(tool_call("tu_2", (2_000, 417, 500, 1_000)));
    llm.push(text_response("never asked for"));
    let store = Arc::new(SqliteStore::open(dir.path().join("beige.db")).unwrap());
    let audit = Arc::new(MemoryAudit::new());
    let gw = Arc::new(
        GatewayBuilder::new(config(&llm, json!({"session": {"tokens": 20000}})), home)
            .sandbox(Arc::new(MemorySandbox::new()))
            .store(store.clone())
            .audit(audit.clone())
            .build()
            .await
            .unwrap(),
    );

    let events = prompt_a(&*gw, "read my notes twice").await;
    let message = "Session budget of 20000 tokens reached (20417 used). Raise budgets.session.tokens (or agents.a.budgets.session.tokens) to continue.";
    match events.last() {
        Some(AgentEvent::Error {
            message: m,
            kind,
            hint,
        }) => {
            assert_eq!(m, message);
            assert_eq!(*kind, Some(ErrorKind::BudgetExhausted));
            assert!(hint
                .as_deref()
                .unwrap_or("")
                .contains("budgets.session.tokens"));
        }
        other => panic!("expected the budget error, got {other:?} in {events:#?}"),
    }
    assert_eq!(
        llm.request_count(),
        2,
        "no model call after the budget was reached"
    );
    // The 80 % warning came once, after the first call, though the second was over it too.
    let warnings: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::BudgetWarning {
                scope,
                key,
                used,
                limit,
                pct,
            } => Some((scope.clone(), key.clone(), *used, *limit, *pct)),
            _ => None,
        })
        .collect();
    assert_eq!(
        warnings,
        [(
            "session".to_string(),
            "tokens".to_string(),
            17_000.0,
            20_000.0,
            85
        )]
    );
    let records = audit.records();
    let budget: Vec<_> = records
        .iter()
        .filter(|r| r.kind == AuditType::Budget)
        .collect();
    assert_eq!(budget.len(), 2, "{budget:#?}");
    assert_eq!(budget[0].phase, Phase::Warning);
    assert_eq!(budget[1].phase, Phase::Exhausted);
    assert_eq!(budget[1].tool, "budget.session.tokens");
    assert_eq!(budget[1].error.as_deref(), Some(message));
    assert!(
        budget[1].args.contains(&"used=20417".to_string()),
        "{:?}",
        budget[1].args
    );

    // The ledger holds exactly what the provider reported, priced at claude-sonnet-4's
    // $3 / $15 / $0.30 / $3.75 per million input / output / cache-read / cache-write:
    // call 1: 10000×3 + 1000×15 + 4000×0.3 + 6000×3.75 = 30000 + 15000 + 1200 + 22500
    // call 2:  2000×3 +  417×15 +  500×0.3 + 1000×3.75 =  6000 +  6255 +  150 +  3750
    let expected = UsageTotals {
        calls: 2,
        input_tokens: 12_000,
        output_tokens: 1_417,
        cache_read_tokens: 4_500,
        cache_write_tokens: 7_000,
        cost_micros: 68_700 + 16_155,
        unpriced_calls: 0,
    };
    let totals = store
        .usage_totals(LedgerFilter {
            agent: Some("a".into()),
            ..LedgerFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(totals, expected);
    // The `usage` events carried the same costs.
    let costs: Vec<f64> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Usage { cost, .. } => Some(*cost),
            _ => None,
        })
        .collect();
    assert_eq!(costs, [0.0687, 0.016155]);

    // The next prompt of the session stops before its first model call.
    let again = gw
        .prompt(PromptRequest::new("a", "api:a:default", "and again"))
        .await
        .unwrap()
        .collect_all()
        .await;
    assert!(
        matches!(again.last(), Some(AgentEvent::Error { message: m, .. }) if m == message),
        "{again:#?}"
    );
    assert_eq!(llm.request_count(), 2);

    // GET /api/usage over real HTTP and the client `beige usage` uses agree with it.
    let state = ApiState::new(gw.clone(), Some(TOKEN.to_string()));
    let (channel, addr) = HttpApiChannel::bind("127.0.0.1", 0, state).unwrap();
    let shutdown = CancellationToken::new();
    let full: Arc<dyn GatewayFull> = gw.clone();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move { channel.run(ChannelContext::new(full, stop)).await });
    let url = format!("http://{addr}");
    let body: serde_json::Value = reqwest::Client::new()
        .get(format!("{url}/api/usage?agent=a&since=1d&by=model"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["by"], "model");
    assert_eq!(body["rows"][0]["key"], "anthropic/claude-sonnet-4-6");
    assert_eq!(body["rows"][0]["cacheWriteTokens"], 7_000);
    assert_eq!(body["total"]["costMicros"], 84_855);
    let unauthenticated = reqwest::get(format!("{url}/api/usage")).await.unwrap();
    assert_eq!(unauthenticated.status(), 401);
    let remote = beige_core::RemoteGateway::new(&url, Some(TOKEN.into())).unwrap();
    let report = remote
        .usage(UsageQuery {
            agent: Some("a".into()),
            since_ms: Some(0),
            by: UsageGroupBy::Model,
        })
        .await
        .unwrap();
    assert_eq!(report.total, expected);
    assert_eq!(serde_json::to_value(&report).unwrap(), body);
    let bad = reqwest::Client::new()
        .get(format!("{url}/api/usage?by=week"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn an_unpriced_model_under_a_cost_limit_is_refused_unless_uncounted() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlmServer::start().await;
    let mut cfg = config(&llm, json!({"turn": {"costUsd": 1}}));
    cfg.agents["a"].model.model = "local-llama".into();
    let gw = GatewayBuilder::new(cfg.clone(), BeigeHome::new(dir.path().join("h1")))
        .sandbox(Arc::new(MemorySandbox::new()))
        .store(Arc::new(beige_core::testing::MemoryStore::new()))
        .build()
        .await
        .unwrap();
    let events = gw
        .prompt(PromptRequest::new("a", "api:a:default", "hi"))
        .await
        .unwrap()
        .collect_all()
        .await;
    match events.last() {
        Some(AgentEvent::Error { message, .. }) => {
            assert!(
                message.contains("llm.providers.anthropic.models.local-llama.cost"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(llm.request_count(), 0);

    cfg.budgets.as_mut().unwrap().unknown_model_price =
        Some(beige_core::budget::UnknownModelPrice::Uncounted);
    let store = beige_core::testing::MemoryStore::new();
    let gw = GatewayBuilder::new(cfg, BeigeHome::new(dir.path().join("h2")))
        .sandbox(Arc::new(MemorySandbox::new()))
        .store(Arc::new(store.clone()))
        .build()
        .await
        .unwrap();
    llm.push(MessageStream::new().text("ok").usage(10, 2).reply());
    let events = gw
        .prompt(PromptRequest::new("a", "api:a:default", "hi"))
        .await
        .unwrap()
        .collect_all()
        .await;
    assert!(
        matches!(events.last(), Some(AgentEvent::Done { .. })),
        "{events:#?}"
    );
    let totals = store.usage_totals(LedgerFilter::default()).await.unwrap();
    assert_eq!(
        (totals.calls, totals.unpriced_calls, totals.cost_micros),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn the_101st_tool_call_of_an_exec_fails_with_exit_77() {
    let env = docker_or_skip!();
    let t = TestHome::new();
    let mut config = t.config(&env, &[("a", json!({"tools": ["kv"]}))]);
    config.plugins = serde_json::from_value(json!({"kv": {}})).unwrap();
    config.budgets = Some(serde_json::from_value(json!({"exec": {"toolCalls": 100}})).unwrap());
    let gw = t.gateway(&env, config).await;

    let out = exec(
        &gw,
        "a",
        "i=0; while [ $i -lt 101 ]; do i=$((i+1)); kv set k$i v </dev/null >/dev/null || { echo \"call $i exit $?\"; break; }; done",
    )
    .await;
    let text = out.joined_text();
    assert!(text.contains("call 101 exit 77"), "{text}");
    assert!(
        text.contains("kv: budget exhausted: exec tool-call budget of 100 reached; raise budgets.exec.toolCalls"),
        "{text}"
    );
    // The count died with the exec: the next exec has its own 100.
    let next = exec(&gw, "a", "kv get k100").await;
    assert!(next.joined_text().contains('v'), "{}", next.joined_text());
    gw.shutdown().await.unwrap();
}
