//! The gateway's in-memory session contexts (issue #18): a prompt into a long session
//! sends the model exactly what the store holds, and the kept context is never served
//! once anything else has changed the session — a second handle on the same database
//! (another replica), a compaction, a new session for the key. A gateway with the
//! labelled `MemorySandbox`, the labelled `ScriptedProvider` and a real SQLite store.

use std::sync::Arc;

use beige_core::config::Config;
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::{Block, Message, Role, ToolResultPart};
use beige_core::store::{NewMessage, SessionStore, SqliteStore};
use beige_core::testing::MemorySandbox;
use beige_core::{AgentEvent, BeigeHome, Gateway as _, GatewayBuilder, LocalGateway};
use beige_core::{PromptRequest, Sessions as _};
use serde_json::json;

const KEY: &str = "api:a:history";

struct Harness {
    _dir: tempfile::TempDir,
    gw: LocalGateway,
    /// The gateway's own store handle.
    store: SqliteStore,
    /// A second handle on the same database: another writer the gateway does not know.
    other: SqliteStore,
    model: ScriptedProvider,
}

fn config(threshold: Option<u64>) -> Config {
    let mut model = json!({"provider": "scripted", "model": "scripted"});
    if let Some(t) = threshold {
        model["compactionThreshold"] = json!(t);
    }
    serde_json::from_value(json!({
        "llm": {"providers": {"scripted": {
            "api": "anthropic-messages",
            "models": {"scripted": {"contextWindow": 4_000_000}}
        }}},
        "agents": {"a": {"model": model, "tools": []}}
    }))
    .unwrap()
}

async fn harness(model: ScriptedProvider, threshold: Option<u64>) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    std::fs::create_dir_all(home.root()).unwrap();
    let db = dir.path().join("sessions.db");
    let store = SqliteStore::open(&db).unwrap();
    let other = SqliteStore::open(&db).unwrap();
    let gw = GatewayBuilder::new(config(threshold), home)
        .sandbox(Arc::new(MemorySandbox::new()))
        .store(Arc::new(store.clone()))
        .provider(Arc::new(model.clone()))
        .build()
        .await
        .unwrap();
    Harness {
        _dir: dir,
        gw,
        store,
        other,
        model,
    }
}

/// A scripted model that answers every call with text.
fn answers(n: usize) -> ScriptedProvider {
    let mut p = ScriptedProvider::new("scripted");
    for i in 0..n {
        p = p.then_text(format!("[scripted] answer {i}"));
    }
    p
}

async fn ask(h: &Harness, message: &str) {
    let events =
        h.gw.prompt(PromptRequest::new("a", KEY, message))
            .await
            .unwrap()
            .collect_all()
            .await;
    assert!(
        matches!(events.last(), Some(AgentEvent::Done { .. })),
        "{events:?}"
    );
}

async fn session_id(h: &Harness) -> String {
    h.store.current_session(KEY).await.unwrap().unwrap().id
}

/// Consecutive messages of the same role merged, as the agent loop sends them.
fn alternate(messages: impl IntoIterator<Item = Message>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    for m in messages {
        match out.last_mut() {
            Some(last) if last.role == m.role => last.content.extend(m.content),
            _ => out.push(m),
        }
    }
    out
}

/// The model's last request was exactly the stored context before the prompt's answer
/// (read fresh from the store now), with the prompt's message.
async fn assert_last_request_is_the_stored_context(h: &Harness) {
    let stored = h.store.messages(&session_id(h).await, false).await.unwrap();
    let (answer, before) = stored.split_last().unwrap();
    assert_eq!(answer.message.role, Role::Assistant);
    let expected = alternate(before.iter().map(|m| m.message.clone()));
    let requests = h.model.requests();
    let sent = requests.last().unwrap().messages.to_vec();
    assert_eq!(sent.len(), expected.len());
    assert_eq!(sent, expected);
}

/// One working turn: a question, an `exec` call, its output, an answer.
fn turn(i: usize) -> Vec<NewMessage> {
    vec![
        NewMessage::plain(Message::user_text(format!("question {i}"))),
        NewMessage::plain(Message {
            role: Role::Assistant,
            content: vec![Block::ToolUse {
                id: format!("tu_{i}"),
                name: "exec".into(),
                input: json!({"command": format!("echo {i}")}),
            }],
        }),
        NewMessage::plain(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: format!("tu_{i}"),
                content: vec![ToolResultPart::Text {
                    text: format!("Exit code: 0\n{i}"),
                }],
                is_error: false,
            }],
        }),
        NewMessage::plain(Message::assistant_text(format!("answer {i}"))),
    ]
}

#[tokio::test]
async fn a_long_sessions_prompts_send_exactly_the_stored_history() {
    let h = harness(answers(6), None).await;
    ask(&h, "first").await;
    let id = session_id(&h).await;
    for i in 0..500 {
        h.other.append_turn(&id, turn(i)).await.unwrap();
    }
    // A turn an interrupted writer left without an answer: the next prompt's message
    // merges into it.
    h.other
        .append_turn(&id, vec![NewMessage::plain(Message::user_text("dangling"))])
        .await
        .unwrap();
    for n in 0..5 {
        ask(&h, &format!("prompt {n}")).await;
        assert_last_request_is_the_stored_context(&h).await;
    }
    assert_eq!(h.model.requests().last().unwrap().messages.len(), 2011);
}

#[tokio::test]
async fn a_turn_written_behind_the_gateway_is_in_the_next_request() {
    let h = harness(answers(4), None).await;
    ask(&h, "one").await;
    ask(&h, "two").await; // the context is kept now
    let id = session_id(&h).await;
    h.other.append_turn(&id, turn(7)).await.unwrap();
    ask(&h, "three").await;
    assert_last_request_is_the_stored_context(&h).await;
    let texts: Vec<String> = h.model.requests()[2]
        .messages
        .iter()
        .map(Message::text)
        .collect();
    assert!(texts.contains(&"question 7".to_string()), "{texts:?}");
    ask(&h, "four").await;
    assert_last_request_is_the_stored_context(&h).await;
}

#[tokio::test]
async fn a_compaction_behind_the_gateway_is_seen() {
    let h = harness(answers(4), None).await;
    ask(&h, "one").await;
    ask(&h, "two").await;
    let id = session_id(&h).await;
    h.other
        .compact(&id, 2, Message::user_text("[Summary] one, answered"))
        .await
        .unwrap();
    ask(&h, "three").await;
    assert_last_request_is_the_stored_context(&h).await;
    let first = h.model.requests()[2].messages[0].text();
    assert!(first.starts_with("[Summary] one"), "{first}");
}

#[tokio::test]
async fn the_gateways_own_compaction_is_seen() {
    // Prompts 1 and 2 answer; prompt 3 is over the threshold: a summary call, then the
    // answer; prompt 4 again (its compaction summarises the summary and prompt 3).
    let h = harness(answers(6), Some(1)).await;
    ask(&h, "one").await;
    ask(&h, "two").await;
    ask(&h, "three").await;
    assert_last_request_is_the_stored_context(&h).await;
    let stored = h
        .store
        .messages(&session_id(&h).await, false)
        .await
        .unwrap();
    assert!(stored[0].summary, "{stored:?}");
    ask(&h, "four").await;
    assert_last_request_is_the_stored_context(&h).await;
}

#[tokio::test]
async fn a_new_session_starts_empty_and_resume_brings_the_old_one_back() {
    let h = harness(answers(4), None).await;
    ask(&h, "one").await;
    let old = session_id(&h).await;
    ask(&h, "two").await;
    h.gw.new_session("a", KEY).await.unwrap();
    ask(&h, "fresh").await;
    let sent = h.model.requests()[2].messages.to_vec();
    assert_eq!(sent, vec![Message::user_text("fresh")]);
    h.gw.resume_session("a", KEY, &old).await.unwrap();
    ask(&h, "three").await;
    assert_last_request_is_the_stored_context(&h).await;
    assert_eq!(h.model.requests()[3].messages.len(), 5);
}
