//! `update` driven by key events and gateway events, with effects run against the fake
//! gateway — no terminal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use beige_client::events::AgentEvent;
use beige_client::llm::{ErrorKind, Message, Usage};
use beige_tui::app::{App, Cell, Connection, Modal};
use beige_tui::runtime::Driver;
use beige_tui::update::{self, Effect, Msg};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEventKind};

use super::fake::{session, FakeGateway};

const KEY: &str = "tui:assistant:default";

fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn key_mod(code: KeyCode, m: KeyModifiers) -> Msg {
    Msg::Key(KeyEvent::new(code, m))
}

fn ctrl_c() -> Msg {
    key_mod(KeyCode::Char('c'), KeyModifiers::CONTROL)
}

/// A driver on the fake gateway with `assistant` loaded.
async fn driver(fake: &Arc<FakeGateway>) -> Driver {
    let agents = fake.agents.lock().unwrap().clone();
    let app = App::new("http://127.0.0.1:7433", agents, "assistant", (80, 24));
    let mut d = Driver::new(app, fake.clone());
    d.execute(Effect::LoadAgent {
        agent: "assistant".into(),
    });
    d.settle().await;
    d
}

fn type_text(d: &mut Driver, text: &str) {
    for c in text.chars() {
        d.dispatch(key(KeyCode::Char(c)));
    }
}

fn answer(text: &str) -> Vec<AgentEvent> {
    vec![
        AgentEvent::TurnStarted {
            turn: 1,
            model: "anthropic/claude-sonnet-4-5".into(),
        },
        AgentEvent::TextDelta {
            text: text[..text.len() / 2].into(),
        },
        AgentEvent::TextDelta {
            text: text[text.len() / 2..].into(),
        },
        AgentEvent::Usage {
            model: "anthropic/claude-sonnet-4-5".into(),
            usage: Usage {
                input_tokens: 1000,
                output_tokens: 200,
                ..Usage::default()
            },
            cost: 0.006,
        },
        AgentEvent::Done {
            response: text.into(),
            session_id: "s_00000000000000aa".into(),
            usage: Usage::default(),
        },
    ]
}

fn texts(app: &App) -> Vec<String> {
    app.cells
        .iter()
        .map(|c| match c {
            Cell::User(t) => format!("user: {t}"),
            Cell::Assistant { text, .. } => format!("assistant: {text}"),
            Cell::Thinking { text } => format!("thinking: {text}"),
            Cell::Tool(t) => format!("tool: {} {:?}", t.name, t.status),
            Cell::Approval(a) => format!("approval: {} {:?}", a.approval.id, a.approval.status),
            Cell::Error(e) => format!("error: {}", e.title),
            Cell::Info(t) => format!("info: {t}"),
        })
        .collect()
}

#[tokio::test]
async fn enter_sends_and_the_answer_streams_in() {
    let fake = Arc::new(FakeGateway::new());
    fake.script(answer("Hi there!"), false);
    let mut d = driver(&fake).await;
    type_text(&mut d, "hello");
    d.dispatch(key(KeyCode::Enter));
    assert!(d.app.is_running());
    assert!(d.app.composer.is_empty());
    d.settle().await;

    let prompts = fake.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 1);
    assert_eq!(prompts[0].agent, "assistant");
    assert_eq!(prompts[0].session_key, KEY);
    assert_eq!(prompts[0].message, "hello");
    assert_eq!(texts(&d.app), ["user: hello", "assistant: Hi there!"]);
    assert!(!d.app.is_running());
    assert_eq!(d.app.tokens.input_tokens, 1000);
    assert_eq!(d.app.tokens.output_tokens, 200);
    assert!((d.app.cost - 0.006).abs() < 1e-9);
    assert_eq!(
        d.app.session.as_ref().map(|s| s.id.as_str()),
        Some("s_00000000000000aa")
    );
}

#[tokio::test]
async fn shift_enter_and_alt_enter_add_lines() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    type_text(&mut d, "one");
    d.dispatch(key_mod(KeyCode::Enter, KeyModifiers::SHIFT));
    type_text(&mut d, "two");
    d.dispatch(key_mod(KeyCode::Enter, KeyModifiers::ALT));
    type_text(&mut d, "three");
    assert_eq!(d.app.composer.text(), "one\ntwo\nthree");
    assert!(fake.prompts.lock().unwrap().is_empty());
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(fake.prompts.lock().unwrap()[0].message, "one\ntwo\nthree");
}

#[tokio::test]
async fn up_recalls_history_and_down_returns_to_the_draft() {
    let fake = Arc::new(FakeGateway::new());
    fake.script(answer("a"), false);
    fake.script(answer("b"), false);
    let mut d = driver(&fake).await;
    type_text(&mut d, "first");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    type_text(&mut d, "second");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;

    type_text(&mut d, "dra");
    d.dispatch(key(KeyCode::Up));
    assert_eq!(d.app.composer.text(), "second");
    d.dispatch(key(KeyCode::Up));
    assert_eq!(d.app.composer.text(), "first");
    d.dispatch(key(KeyCode::Down));
    assert_eq!(d.app.composer.text(), "second");
    d.dispatch(key(KeyCode::Down));
    assert_eq!(d.app.composer.text(), "dra");
}

#[tokio::test]
async fn paste_goes_into_the_composer() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    d.dispatch(Msg::Paste("line one\r\nline two".into()));
    assert_eq!(d.app.composer.text(), "line one\nline two");
    // Up/Down move inside a multi-line input instead of recalling history.
    d.dispatch(key(KeyCode::Up));
    assert_eq!(d.app.composer.cursor().0, 0);
    assert!(fake.prompts.lock().unwrap().is_empty());
}

#[tokio::test]
async fn ctrl_c_once_cancels_the_running_prompt_and_twice_quits() {
    let fake = Arc::new(FakeGateway::new());
    fake.script(
        vec![
            AgentEvent::TurnStarted {
                turn: 1,
                model: "anthropic/claude-sonnet-4-5".into(),
            },
            AgentEvent::TextDelta {
                text: "Working on".into(),
            },
        ],
        true,
    );
    let mut d = driver(&fake).await;
    type_text(&mut d, "long task");
    d.dispatch(key(KeyCode::Enter));
    // Wait until the gateway has the prompt and the first event arrived.
    let first = d.recv().await.unwrap();
    d.dispatch(first);
    assert!(d.app.is_running());

    d.dispatch(ctrl_c());
    assert!(!d.app.should_quit);
    assert!(d.app.running.as_ref().unwrap().cancelling);
    d.settle().await;
    assert_eq!(
        fake.cancels.lock().unwrap().clone(),
        [("assistant".to_string(), KEY.to_string())]
    );
    assert!(!d.app.is_running());
    assert_eq!(
        texts(&d.app),
        [
            "user: long task",
            "assistant: Working on",
            "info: Cancelled."
        ]
    );

    d.dispatch(ctrl_c());
    assert!(d.app.should_quit);
}

#[test]
fn ctrl_c_twice_only_quits_within_two_seconds() {
    let mut app = App::new("u", Vec::new(), "a", (80, 24));
    app.composer.set_text("draft");
    let t0 = Instant::now();
    assert!(update::ctrl_c(&mut app, t0).is_empty());
    assert!(app.composer.is_empty(), "the first Ctrl+C clears the input");
    assert!(!app.should_quit);
    let later = t0 + Duration::from_secs(3);
    assert!(update::ctrl_c(&mut app, later).is_empty());
    assert!(!app.should_quit);
    let effects = update::ctrl_c(&mut app, later + Duration::from_millis(500));
    assert_eq!(effects, [Effect::Quit]);
    assert!(app.should_quit);
}

#[tokio::test]
async fn ctrl_d_quits_on_an_empty_input() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    type_text(&mut d, "x");
    d.dispatch(key_mod(KeyCode::Char('d'), KeyModifiers::CONTROL));
    assert!(!d.app.should_quit);
    d.dispatch(key(KeyCode::Backspace));
    d.dispatch(key_mod(KeyCode::Char('d'), KeyModifiers::CONTROL));
    assert!(d.app.should_quit);
}

#[tokio::test]
async fn agent_command_switches_agents() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    type_text(&mut d, "/agent coder");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(d.app.agent, "coder");
    assert_eq!(d.app.session_key, "tui:coder:default");
    assert_eq!(d.app.model(), "openai/gpt-4o");
    assert_eq!(
        texts(&d.app),
        ["info: Switched to agent 'coder' (model openai/gpt-4o)."]
    );

    fake.script(answer("ok"), false);
    type_text(&mut d, "hi");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    let p = fake.prompts.lock().unwrap()[0].clone();
    assert_eq!(
        (p.agent.as_str(), p.session_key.as_str()),
        ("coder", "tui:coder:default")
    );

    type_text(&mut d, "/agent nobody");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    match d.app.cells.last() {
        Some(Cell::Error(e)) => {
            assert_eq!(e.title, "Unknown agent");
            assert_eq!(
                e.hint.as_deref(),
                Some("Available agents: assistant, coder.")
            );
        }
        other => panic!("expected an error cell, got {other:?}"),
    }
    assert_eq!(d.app.agent, "coder");
}

fn seed_sessions(fake: &FakeGateway) {
    for (i, title) in ["Newest chat", "Fix the build", "Oldest"]
        .iter()
        .enumerate()
    {
        let id = format!("s_00000000000000{i:02}");
        fake.add_session(
            session(
                &id,
                "assistant",
                KEY,
                Some(title),
                1_700_000_000_000 - i as i64 * 86_400_000,
                2,
            ),
            vec![
                Message::user_text(format!("question {i}")),
                Message::assistant_text(format!("answer {i}")),
            ],
        );
    }
}

#[tokio::test]
async fn startup_shows_the_current_session() {
    let fake = Arc::new(FakeGateway::new());
    seed_sessions(&fake);
    let d = driver(&fake).await;
    assert_eq!(d.app.session.as_ref().unwrap().id, "s_0000000000000000");
    assert_eq!(
        texts(&d.app)[..2],
        ["user: question 0", "assistant: answer 0"]
    );
    assert_eq!(d.app.tokens.input_tokens, 1200);
    // 1200 in × $3/M + 340 out × $15/M
    assert!((d.app.cost - 0.0087).abs() < 1e-9);
}

#[tokio::test]
async fn resume_2_loads_that_sessions_messages() {
    let fake = Arc::new(FakeGateway::new());
    seed_sessions(&fake);
    let mut d = driver(&fake).await;
    type_text(&mut d, "/resume 2");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(
        fake.resumed.lock().unwrap().clone(),
        [(
            "assistant".to_string(),
            KEY.to_string(),
            "s_0000000000000001".to_string()
        )]
    );
    assert_eq!(
        texts(&d.app),
        [
            "user: question 1",
            "assistant: answer 1",
            "info: Resumed session s_00000000 — Fix the build (2 messages)."
        ]
    );
    assert_eq!(d.app.session.as_ref().unwrap().id, "s_0000000000000001");

    type_text(&mut d, "/resume 9");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    match d.app.cells.last() {
        Some(Cell::Error(e)) => {
            assert_eq!(e.title, "Could not resume the session");
            assert!(e.message.contains("There is no session 9"), "{}", e.message);
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn sessions_list_opens_and_enter_resumes_the_selection() {
    let fake = Arc::new(FakeGateway::new());
    seed_sessions(&fake);
    let mut d = driver(&fake).await;
    type_text(&mut d, "/sessions");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    match &d.app.modal {
        Some(Modal::Sessions { list, selected }) => {
            assert_eq!(list.len(), 3);
            assert_eq!(*selected, 0, "the current session is selected");
        }
        other => panic!("expected the sessions list, got {other:?}"),
    }
    d.dispatch(key(KeyCode::Down));
    d.dispatch(key(KeyCode::Down));
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert!(d.app.modal.is_none());
    assert_eq!(fake.resumed.lock().unwrap()[0].2, "s_0000000000000002");
    assert_eq!(texts(&d.app)[0], "user: question 2");
}

/// Keys typed while a modal is open go to the modal, never into the composer: typing
/// `/quit` while the help is open (where `q` used to close it) sent "uit".
#[tokio::test]
async fn keys_typed_in_a_modal_never_reach_the_composer() {
    let fake = Arc::new(FakeGateway::new());
    seed_sessions(&fake);
    let mut d = driver(&fake).await;
    type_text(&mut d, "/help");
    d.dispatch(key(KeyCode::Enter));
    assert_eq!(d.app.modal, Some(Modal::Help { notice: None }));
    type_text(&mut d, "/quit now q ");
    assert_eq!(d.app.modal, Some(Modal::Help { notice: None }));
    assert_eq!(d.app.composer.text(), "");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert!(d.app.modal.is_none());
    assert_eq!(d.app.composer.text(), "");
    assert!(fake.prompts.lock().unwrap().is_empty());
    assert!(!d.app.should_quit);

    // The same in the sessions list: letters select nothing and close nothing.
    type_text(&mut d, "/sessions");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert!(matches!(d.app.modal, Some(Modal::Sessions { .. })));
    type_text(&mut d, "/quit");
    assert!(matches!(d.app.modal, Some(Modal::Sessions { .. })));
    d.dispatch(Msg::Paste("pasted".into()));
    d.dispatch(key(KeyCode::Esc));
    assert!(d.app.modal.is_none());
    assert_eq!(d.app.composer.text(), "");
    assert!(fake.prompts.lock().unwrap().is_empty());
    assert!(fake.resumed.lock().unwrap().is_empty());
    assert!(!d.app.should_quit);

    // After the modal is closed, typing reaches the composer again.
    type_text(&mut d, "hi");
    assert_eq!(d.app.composer.text(), "hi");
}

#[tokio::test]
async fn unknown_command_shows_help() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    type_text(&mut d, "/foo");
    d.dispatch(key(KeyCode::Enter));
    assert_eq!(
        d.app.modal,
        Some(Modal::Help {
            notice: Some("unknown command /foo".into())
        })
    );
    assert!(fake.prompts.lock().unwrap().is_empty());
    d.dispatch(key(KeyCode::Esc));
    assert!(d.app.modal.is_none());

    // `//` sends a message that starts with a slash.
    type_text(&mut d, "//etc is a folder?");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(fake.prompts.lock().unwrap()[0].message, "/etc is a folder?");
}

#[tokio::test]
async fn new_session_clears_the_screen() {
    let fake = Arc::new(FakeGateway::new());
    seed_sessions(&fake);
    let mut d = driver(&fake).await;
    type_text(&mut d, "/new");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(
        fake.created.lock().unwrap().clone(),
        [("assistant".to_string(), KEY.to_string())]
    );
    assert_eq!(texts(&d.app).len(), 1);
    assert!(texts(&d.app)[0].starts_with("info: New session s_new00000"));
    assert_eq!(d.app.tokens, Usage::default());
}

#[tokio::test]
async fn model_and_verbose_settings() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    type_text(&mut d, "/model openai/gpt-4o");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(d.app.model(), "openai/gpt-4o");
    assert_eq!(
        fake.settings.lock().unwrap()[KEY].model_override.as_deref(),
        Some("openai/gpt-4o")
    );

    type_text(&mut d, "/model google/gemini-x");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    match d.app.cells.last() {
        Some(Cell::Error(e)) => {
            assert_eq!(e.title, "Model not allowed");
            assert!(e
                .message
                .contains("anthropic/claude-sonnet-4-5, openai/gpt-4o"));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(d.app.model(), "openai/gpt-4o");

    type_text(&mut d, "/v on");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert!(d.app.verbose);
    assert_eq!(fake.settings.lock().unwrap()[KEY].verbose, Some(true));
}

#[tokio::test]
async fn tool_cells_and_tab_expands_the_last() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    d.app.running = None;
    type_text(&mut d, "list");
    fake.script(
        vec![
            AgentEvent::ToolCallStarted {
                id: "t1".into(),
                name: "exec".into(),
                args: serde_json::json!({"command": "ls"}),
            },
            AgentEvent::ToolCallFinished {
                id: "t1".into(),
                name: "exec".into(),
                output: "Exit code: 0\na\nb\nc\nd\ne".into(),
                is_error: false,
                duration_ms: 12,
            },
            AgentEvent::ToolCallStarted {
                id: "t2".into(),
                name: "git".into(),
                args: serde_json::json!({"args": ["push"]}),
            },
            AgentEvent::ToolCallFinished {
                id: "t2".into(),
                name: "git".into(),
                output: "Permission denied: tool 'git' is not allowed for agent 'assistant'".into(),
                is_error: true,
                duration_ms: 0,
            },
            AgentEvent::Done {
                response: String::new(),
                session_id: "s_1".into(),
                usage: Usage::default(),
            },
        ],
        false,
    );
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(
        texts(&d.app),
        ["user: list", "tool: exec Ok", "tool: git Denied"]
    );
    d.dispatch(key(KeyCode::Tab));
    let expanded: Vec<bool> = d
        .app
        .cells
        .iter()
        .filter_map(|c| match c {
            Cell::Tool(t) => Some(t.expanded),
            _ => None,
        })
        .collect();
    assert_eq!(expanded, [false, true]);
    d.dispatch(key_mod(KeyCode::BackTab, KeyModifiers::SHIFT));
    assert!(d
        .app
        .cells
        .iter()
        .all(|c| !matches!(c, Cell::Tool(t) if !t.expanded)));
}

#[tokio::test]
async fn errors_get_a_title_and_a_hint() {
    let fake = Arc::new(FakeGateway::new());
    fake.script(
        vec![AgentEvent::Error {
            message: "429 rate_limit_error: slow down".into(),
            kind: Some(ErrorKind::RateLimit),
            hint: None,
        }],
        false,
    );
    let mut d = driver(&fake).await;
    type_text(&mut d, "hi");
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    match d.app.cells.last() {
        Some(Cell::Error(e)) => {
            assert_eq!(e.title, "Rate limited");
            assert!(e
                .hint
                .as_deref()
                .unwrap()
                .contains("switch to another allowed model"));
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn fallback_shows_in_the_status() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    fake.script(
        vec![
            AgentEvent::TurnStarted {
                turn: 1,
                model: "anthropic/claude-sonnet-4-5".into(),
            },
            AgentEvent::ModelSwitched {
                from: "anthropic/claude-sonnet-4-5".into(),
                to: "openai/gpt-4o".into(),
                reason: "rate limited".into(),
            },
        ],
        true,
    );
    type_text(&mut d, "hi");
    d.dispatch(key(KeyCode::Enter));
    for _ in 0..2 {
        let m = d.recv().await.unwrap();
        d.dispatch(m);
    }
    assert_eq!(d.app.fallback.as_deref(), Some("openai/gpt-4o"));
    d.dispatch(ctrl_c());
    d.settle().await;
}

#[tokio::test]
async fn an_unreachable_gateway_reconnects_and_the_message_is_kept() {
    let fake = Arc::new(FakeGateway::new());
    let mut d = driver(&fake).await;
    fake.set_down(true);
    type_text(&mut d, "are you there?");
    d.dispatch(key(KeyCode::Enter));
    // PromptFailed → reconnecting (the reconnect loop runs in the background).
    let m = d.recv().await.unwrap();
    assert!(matches!(m, Msg::PromptFailed { .. }));
    d.dispatch(m);
    assert!(matches!(d.app.connection, Connection::Reconnecting { .. }));
    assert_eq!(d.app.composer.text(), "are you there?");
    assert!(texts(&d.app).iter().any(
        |t| t.starts_with("info: Gateway unreachable at http://127.0.0.1:7433 — reconnecting")
    ));

    // Sending while reconnecting keeps the message.
    d.dispatch(key(KeyCode::Enter));
    assert_eq!(d.app.composer.text(), "are you there?");

    let m = d.recv().await.unwrap();
    assert!(
        matches!(m, Msg::ReconnectFailed { attempt: 1, .. }),
        "{m:?}"
    );
    d.dispatch(m);
    fake.set_down(false);
    loop {
        let m = d.recv().await.unwrap();
        let done = matches!(m, Msg::Connected { .. });
        d.dispatch(m);
        if done {
            break;
        }
    }
    assert_eq!(d.app.connection, Connection::Connected);
    assert_eq!(
        texts(&d.app).last().unwrap(),
        "info: Reconnected to the gateway at http://127.0.0.1:7433."
    );
    fake.script(answer("yes"), false);
    d.dispatch(key(KeyCode::Enter));
    d.settle().await;
    assert_eq!(texts(&d.app).last().unwrap(), "assistant: yes");
}

#[test]
fn a_lost_stream_checks_the_connection() {
    let mut app = App::new("u", Vec::new(), "a", (80, 24));
    app.composer.set_text("hi");
    let effects = update::update(&mut app, key(KeyCode::Enter));
    assert!(matches!(effects[..], [Effect::SendPrompt { id: 1, .. }]));
    let effects = update::update(&mut app, Msg::PromptClosed { id: 1 });
    assert_eq!(effects, [Effect::Probe]);
    assert!(!app.is_running());
    assert!(matches!(app.cells.last(), Some(Cell::Error(e)) if e.title == "Connection lost"));
}

#[test]
fn scrolling_is_clamped_to_the_transcript() {
    let mut app = App::new("u", Vec::new(), "a", (80, 24));
    for i in 0..40 {
        app.cells.push(Cell::Info(format!("line {i}")));
    }
    update::update(&mut app, key(KeyCode::PageUp));
    assert!(app.scroll > 0);
    for _ in 0..20 {
        update::update(&mut app, Msg::Mouse(MouseEventKind::ScrollUp));
    }
    let top = app.scroll;
    update::update(&mut app, Msg::Mouse(MouseEventKind::ScrollUp));
    assert_eq!(app.scroll, top, "cannot scroll past the top");
    update::update(&mut app, key(KeyCode::PageDown));
    assert!(app.scroll < top);
    update::update(&mut app, key(KeyCode::Esc));
    assert_eq!(app.scroll, 0);
}
