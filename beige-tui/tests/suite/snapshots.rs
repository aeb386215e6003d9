//! Snapshots of every screen state at 80×24 and 120×40 on ratatui's `TestBackend`. The
//! states are built by feeding `update` the same messages the runtime would.

use beige_client::events::{AgentEvent, OutputStream};
use beige_client::llm::{ErrorKind, Usage};
use beige_tui::app::App;
use beige_tui::render::render;
use beige_tui::update::{update, Msg};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::fake::{agent, approval, model, session};

const SIZES: [(u16, u16); 2] = [(80, 24), (120, 40)];

fn app() -> App {
    let agents = vec![
        agent(
            "assistant",
            "anthropic/claude-sonnet-4-5",
            &["openai/gpt-4o"],
        ),
        agent("coder", "openai/gpt-4o", &[]),
    ];
    let mut app = App::new("http://127.0.0.1:7433", agents, "assistant", (80, 24));
    app.models = vec![
        model("anthropic/claude-sonnet-4-5", "primary"),
        model("openai/gpt-4o", "fallback"),
    ];
    app
}

fn send(app: &mut App, text: &str) {
    app.composer.set_text(text);
    update(
        app,
        Msg::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)),
    );
}

fn events(app: &mut App, events: Vec<AgentEvent>) {
    let id = app.running.as_ref().map(|r| r.id).unwrap_or(0);
    for event in events {
        update(app, Msg::Event { id, event });
    }
}

fn delta(text: &str) -> AgentEvent {
    AgentEvent::TextDelta { text: text.into() }
}

fn usage(input: u64, output: u64, cost: f64) -> AgentEvent {
    AgentEvent::Usage {
        model: "anthropic/claude-sonnet-4-5".into(),
        usage: Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        },
        cost,
    }
}

fn done() -> AgentEvent {
    AgentEvent::Done {
        response: String::new(),
        session_id: "s_3f2a9c0d11aa22bb".into(),
        usage: Usage::default(),
    }
}

/// Render `app` at both sizes and compare with the stored snapshots.
fn snap(name: &str, app: &App) {
    for (w, h) in SIZES {
        let mut app = app.clone();
        update(&mut app, Msg::Resize(w, h));
        let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
        terminal.draw(|f| render(&app, f)).unwrap();
        insta::assert_snapshot!(format!("{name}_{w}x{h}"), terminal.backend());
    }
}

const ANSWER: &str = "## Reading a file in Rust

The simplest way is `std::fs::read_to_string`, which returns a **`Result`**:

```rust
use std::fs;

fn main() -> std::io::Result<()> {
    let text = fs::read_to_string(\"notes.txt\")?;
    println!(\"{} bytes\", text.len());
    Ok(())
}
```

Things to keep in mind:

- it reads the *whole* file into memory;
- the file must be valid UTF-8;
  - use `fs::read` for bytes
1. Handle the error with `?` or `match`.
2. Prefer `BufReader` for large files.";

#[test]
fn empty_session() {
    snap("empty_session", &app());
}

#[test]
fn streamed_answer_in_progress() {
    let mut a = app();
    send(&mut a, "How do I read a file in Rust?");
    events(
        &mut a,
        vec![
            AgentEvent::TurnStarted {
                turn: 1,
                model: "anthropic/claude-sonnet-4-5".into(),
            },
            delta("## Reading a file in Rust\n\nThe simplest way is `std::fs::read_to_string`, "),
            delta("which returns a **`Result`**:\n\n```rust\nuse std::fs;\n"),
        ],
    );
    a.tick = 3;
    snap("streaming", &a);
}

#[test]
fn finished_answer_with_code_and_list() {
    let mut a = app();
    send(&mut a, "How do I read a file in Rust?");
    events(
        &mut a,
        vec![delta(ANSWER), usage(1520, 312, 0.00924), done()],
    );
    snap("finished_answer", &a);
}

fn exec_app(expanded: bool) -> App {
    let mut a = app();
    send(&mut a, "What is in the workspace?");
    events(
        &mut a,
        vec![
            delta("Let me look."),
            AgentEvent::ToolCallStarted {
                id: "toolu_1".into(),
                name: "exec".into(),
                args: serde_json::json!({"command": "ls -la /workspace"}),
            },
            AgentEvent::ToolCallFinished {
                id: "toolu_1".into(),
                name: "exec".into(),
                output: "Exit code: 0\ntotal 24\ndrwxr-xr-x 3 agent agent 4096 Jan  2 10:00 .\ndrwxr-xr-x 1 root  root  4096 Jan  2 09:58 ..\n-rw-r--r-- 1 agent agent  512 Jan  2 10:00 AGENTS.md\n-rw-r--r-- 1 agent agent 1830 Jan  2 10:00 notes.md\ndrwxr-xr-x 2 agent agent 4096 Jan  2 10:00 src".into(),
                is_error: false,
                duration_ms: 48,
            },
            delta("There are two markdown files and a `src` folder."),
            usage(2100, 95, 0.0077),
            done(),
        ],
    );
    if expanded {
        update(
            &mut a,
            Msg::Key(KeyEvent::new(KeyCode::Tab, KeyModifiers::NONE)),
        );
    }
    a
}

#[test]
fn exec_tool_running_with_live_output() {
    let mut a = app();
    send(&mut a, "Build it.");
    let live = |stream: OutputStream, text: &str| AgentEvent::ToolOutput {
        id: "toolu_9".into(),
        stream,
        text: text.into(),
    };
    events(
        &mut a,
        vec![
            AgentEvent::ToolCallStarted {
                id: "toolu_9".into(),
                name: "exec".into(),
                args: serde_json::json!({"command": "make all"}),
            },
            live(OutputStream::Stdout, "cc -c a.c\ncc -c b.c\n"),
            live(OutputStream::Stderr, "b.c:3: warning: unused x\n"),
            live(OutputStream::Stdout, "cc -c c.c\ncc -o app a.o b.o c.o\n"),
        ],
    );
    snap("exec_tool_running_with_live_output", &a);
}

#[test]
fn exec_tool_collapsed() {
    snap("exec_tool_collapsed", &exec_app(false));
}

#[test]
fn exec_tool_expanded() {
    snap("exec_tool_expanded", &exec_app(true));
}

#[test]
fn denied_tool_call() {
    let mut a = app();
    send(&mut a, "Push the branch.");
    events(
        &mut a,
        vec![
            AgentEvent::ToolCallStarted {
                id: "toolu_2".into(),
                name: "git".into(),
                args: serde_json::json!({"args": ["push", "origin", "main"]}),
            },
            AgentEvent::ToolCallFinished {
                id: "toolu_2".into(),
                name: "git".into(),
                output: "Permission denied: tool 'git' is not allowed for agent 'assistant'".into(),
                is_error: true,
                duration_ms: 0,
            },
            delta("I am not allowed to use git here, so I could not push."),
            done(),
        ],
    );
    snap("denied_tool", &a);
}

#[test]
fn rate_limit_error_with_hint() {
    let mut a = app();
    send(&mut a, "Summarise notes.md");
    events(
        &mut a,
        vec![AgentEvent::Error {
            message: "anthropic/claude-sonnet-4-5: 429 rate_limit_error: Number of request tokens has exceeded your per-minute rate limit".into(),
            kind: Some(ErrorKind::RateLimit),
            hint: beige_client::events::hint_for(ErrorKind::RateLimit).map(str::to_string),
        }],
    );
    snap("rate_limit_error", &a);
}

#[test]
fn sessions_list() {
    let mut a = app();
    a.session = Some(session(
        "s_0000000000000001",
        "assistant",
        "tui:assistant:default",
        Some("Fix the build script"),
        1_736_000_000_000,
        12,
    ));
    let list = vec![
        session(
            "s_0000000000000002",
            "assistant",
            "tui:assistant:default",
            None,
            1_736_100_000_000,
            0,
        ),
        session(
            "s_0000000000000001",
            "assistant",
            "tui:assistant:default",
            Some("Fix the build script"),
            1_736_000_000_000,
            12,
        ),
        session(
            "s_0000000000000000",
            "assistant",
            "telegram:42",
            Some(
                "A very long title that goes on and on about many different things until it is cut",
            ),
            1_735_000_000_000,
            48,
        ),
    ];
    update(&mut a, Msg::SessionsLoaded(list));
    snap("sessions_list", &a);
}

#[test]
fn help() {
    let mut a = app();
    a.composer.set_text("/help");
    update(
        &mut a,
        Msg::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)),
    );
    snap("help", &a);
}

#[test]
fn help_after_unknown_command() {
    let mut a = app();
    a.composer.set_text("/foo");
    update(
        &mut a,
        Msg::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)),
    );
    snap("help_unknown_command", &a);
}

#[test]
fn status_line_during_fallback() {
    let mut a = app();
    send(&mut a, "Explain the borrow checker briefly.");
    events(
        &mut a,
        vec![
            AgentEvent::TurnStarted {
                turn: 1,
                model: "anthropic/claude-sonnet-4-5".into(),
            },
            AgentEvent::ModelSwitched {
                from: "anthropic/claude-sonnet-4-5".into(),
                to: "openai/gpt-4o".into(),
                reason: "rate limited (429)".into(),
            },
            delta("The borrow checker makes sure every reference"),
            AgentEvent::Usage {
                model: "openai/gpt-4o".into(),
                usage: Usage {
                    input_tokens: 15_300,
                    output_tokens: 1_200,
                    ..Usage::default()
                },
                cost: 0.0502,
            },
        ],
    );
    snap("fallback_status", &a);
}

#[test]
fn reconnecting() {
    let mut a = app();
    send(&mut a, "hello?");
    let id = a.running.as_ref().unwrap().id;
    update(
        &mut a,
        Msg::PromptFailed {
            id,
            failure: beige_tui::update::Failure {
                message: "connection refused".into(),
                unreachable: true,
                status: None,
            },
        },
    );
    update(
        &mut a,
        Msg::ReconnectFailed {
            attempt: 3,
            error: "connection refused".into(),
        },
    );
    snap("reconnecting", &a);
}

#[test]
fn multi_line_composer_and_scrolled_transcript() {
    let mut a = app();
    for i in 0..30 {
        a.cells
            .push(beige_tui::app::Cell::Info(format!("note {i}")));
    }
    update(
        &mut a,
        Msg::Key(KeyEvent::new(KeyCode::PageUp, KeyModifiers::NONE)),
    );
    update(&mut a, Msg::Paste("first line\nsecond line\nthird".into()));
    snap("composer_multiline_scrolled", &a);
}

#[test]
fn verbose_shows_thinking() {
    let mut a = app();
    send(&mut a, "Is 2^61 - 1 prime?");
    events(
        &mut a,
        vec![
            AgentEvent::ThinkingDelta {
                text: "2^61 - 1 is a Mersenne number.\nIt is known to be prime (M61).".into(),
            },
            delta("Yes — **2⁶¹ − 1** is a Mersenne prime."),
            done(),
        ],
    );
    let hidden = a.clone();
    a.verbose = true;
    snap("verbose_thinking", &a);
    let mut terminal = Terminal::new(TestBackend::new(80, 24)).unwrap();
    terminal.draw(|f| render(&hidden, f)).unwrap();
    let text = format!("{}", terminal.backend());
    assert!(
        !text.contains("Mersenne number"),
        "thinking is hidden unless verbose"
    );
}

/// Every state renders at tiny sizes without panicking (the layout degrades instead).
#[test]
fn tiny_terminals_do_not_panic() {
    let mut states = vec![app(), exec_app(true)];
    let mut help = app();
    help.composer.set_text("/foo");
    update(
        &mut help,
        Msg::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)),
    );
    states.push(help);
    let mut long = app();
    long.composer.set_text(&"wide 日本語 text ".repeat(40));
    states.push(long);
    for state in states {
        for (w, h) in [(1, 1), (2, 2), (10, 3), (20, 5), (30, 4), (79, 23)] {
            let mut s = state.clone();
            update(&mut s, Msg::Resize(w, h));
            update(
                &mut s,
                Msg::Key(KeyEvent::new(KeyCode::PageUp, KeyModifiers::NONE)),
            );
            let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
            terminal.draw(|f| render(&s, f)).unwrap();
        }
    }
}

/// An exec that waits for approval: the card with the call, cwd, rule, justification,
/// id, expiry and the keys.
fn approval_app() -> App {
    let mut a = app();
    send(&mut a, "Push the fix.");
    events(
        &mut a,
        vec![
            delta("I'll push it."),
            AgentEvent::ApprovalRequest {
                approval: approval("AP7Q2M4XK9R3T5VW"),
            },
        ],
    );
    a
}

#[test]
fn approval_pending() {
    snap("approval_pending", &approval_app());
}

#[test]
fn approval_decided() {
    let mut a = approval_app();
    let mut decided = approval("AP7Q2M4XK9R3T5VW");
    decided.status = beige_client::approvals::ApprovalStatus::Approved;
    decided.scope = Some(beige_client::approvals::Scope::Once);
    decided.decided_by = Some("api-token".into());
    update(&mut a, Msg::ApprovalAnswered(decided));
    snap("approval_decided", &a);
}
