//! The TUI end to end in a real pseudo-terminal, against a real gateway: `beige tui` run by
//! a shell in an 80×24 pty whose output feeds a terminal emulator (`vt100`), typed into and
//! read back as a person would.
//!
//! 1. with no gateway running, `beige tui` says how to start it and exits 1;
//! 2. a fake Anthropic provider (one tool call, `exec echo hello-from-the-sandbox`, then a
//!    short markdown answer per message) and `beige gateway start` on a test home whose
//!    agent `e2e` uses it;
//! 3. `beige tui e2e` from the shell: a bracketed paste with a line break lands in the input
//!    without being sent, a two-line message (Alt+Enter) is sent, and the streamed reply and
//!    the `exec` tool cell appear on screen;
//! 4. the gateway is stopped (SIGTERM): "reconnecting"; started again: "Reconnected", and a
//!    second message is answered;
//! 5. `/new`, `/quit`, and the terminal is restored: the shell runs the next command, the
//!    screen left the alternate screen, the cursor is visible, the tty is in cooked mode
//!    (`stty` reports icanon and echo);
//! 6. once more with `BEIGE_TUI_TEST_PANIC=1` (the TUI panics after its first frame): the
//!    same after the panic, whose message is on screen.
//!
//! The emulator answers the one query the TUI sends, primary device attributes (crossterm
//! asks `ESC [ ? u` then `ESC [ c` to learn whether the kitty keyboard protocol is there);
//! like tmux 3.3 it answers only the second, so the TUI runs without the protocol and a new
//! line is Alt+Enter. Needs Docker (the agent's sandbox): skips outside CI with a printed
//! reason when a piece is missing. On failure the message holds the screen and the end of
//! the gateway log; `BEIGE_PTY_SHOW=1` prints the screen after each step.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use beige_core::home::BeigeHome;
use beige_testkit::anthropic::MessageStream;
use beige_testkit::llm::FakeLlmServer;
use rustix::process::{kill_process, kill_process_group, test_kill_process, Pid, Signal};
use serde_json::json;

use super::{free_port, TestEnv};
use crate::docker_or_skip;

/// The terminal's size: the classic 80×24.
const ROWS: u16 = 24;
const COLS: u16 = 80;

/// The longest wait for one thing to appear on screen.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Primary device attributes, the query and tmux's answer (a VT100 with advanced video).
const DA1_QUERIES: [&[u8]; 2] = [b"\x1b[c", b"\x1b[0c"];
const DA1_ANSWER: &[u8] = b"\x1b[?1;2c";

/// A shell in a pseudo-terminal, its output parsed into a screen by a reader thread.
struct Terminal {
    pty: Arc<pty_process::blocking::Pty>,
    screen: Arc<Mutex<vt100::Parser>>,
    shell: Child,
    /// Where the gateway keeps its log, for failure messages.
    home: BeigeHome,
}

impl Terminal {
    /// `bash --norc --noprofile` with prompt `e2e-shell$ `, in the test's environment.
    fn start(env: &TestEnv) -> Self {
        let (pty, pts) = pty_process::blocking::open().expect("open a pty");
        pty.resize(pty_process::Size::new(ROWS, COLS))
            .expect("size the pty");
        let mut cmd = std::process::Command::new("bash");
        cmd.args(["--norc", "--noprofile"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", env.dir().join("user"))
            .env("BEIGE_HOME", env.home())
            .env("PS1", "e2e-shell$ ")
            .env("TERM", "xterm-256color")
            .current_dir(env.dir());
        for name in ["DOCKER_HOST", "BEIGE_SHIM", "BEIGE_TEST_IMAGE"] {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        // The shell leads a new session whose controlling terminal is the pty.
        let shell = pty_process::blocking::Command::from(cmd)
            .spawn(pts)
            .expect("start bash in the pty");
        let pty = Arc::new(pty);
        let screen = Arc::new(Mutex::new(vt100::Parser::new(ROWS, COLS, 0)));
        let (reader, parser) = (Arc::clone(&pty), Arc::clone(&screen));
        std::thread::spawn(move || read_into(&reader, &parser));
        Self {
            pty,
            screen,
            shell,
            home: BeigeHome::new(env.home()),
        }
    }

    /// The visible screen, one line per row without trailing blanks (as `tmux
    /// capture-pane -p` prints it).
    fn screen(&self) -> String {
        let parser = self.screen.lock().unwrap_or_else(|e| e.into_inner());
        parser.screen().rows(0, COLS).collect::<Vec<_>>().join("\n")
    }

    fn shows(&self, text: &str) -> bool {
        self.screen().lines().any(|l| l.contains(text))
    }

    fn alternate_screen(&self) -> bool {
        let parser = self.screen.lock().unwrap_or_else(|e| e.into_inner());
        parser.screen().alternate_screen()
    }

    fn cursor_visible(&self) -> bool {
        let parser = self.screen.lock().unwrap_or_else(|e| e.into_inner());
        !parser.screen().hide_cursor()
    }

    fn bracketed_paste(&self) -> bool {
        let parser = self.screen.lock().unwrap_or_else(|e| e.into_inner());
        parser.screen().bracketed_paste()
    }

    /// Fail with `message`, the screen and the end of the gateway log.
    fn fail(&self, message: &str) -> ! {
        let log =
            std::fs::read_to_string(self.home.root().join("logs/gateway.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        panic!(
            "{message}\n----- screen -----\n{}\n------------------\n----- gateway log (last 30 lines) -----\n{tail}",
            self.screen()
        );
    }

    /// Print the screen when `BEIGE_PTY_SHOW=1`.
    fn show(&self) {
        if std::env::var("BEIGE_PTY_SHOW").is_ok_and(|v| v == "1") {
            eprintln!("----- screen -----\n{}\n------------------", self.screen());
        }
    }

    /// Until a line of the screen holds `text`.
    fn wait_for(&self, text: &str, limit: Duration) {
        self.wait_until(&format!("'{text}' did not appear on screen"), limit, || {
            self.shows(text)
        });
    }

    fn wait_until(&self, what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
        let started = Instant::now();
        while !ok() {
            if started.elapsed() >= limit {
                self.fail(&format!("{what} within {}s", limit.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Send bytes as typed keys.
    fn keys(&self, bytes: &[u8]) {
        (&*self.pty).write_all(bytes).expect("write to the pty");
    }

    /// Type `text` literally, then Enter.
    fn type_line(&self, text: &str) {
        self.keys(text.as_bytes());
        self.keys(b"\r");
    }

    /// Paste `text` as tmux's `paste-buffer -p` does: line feeds become carriage returns,
    /// inside bracketed-paste markers when the application asked for them.
    fn paste(&self, text: &str) {
        let body = text.replace('\n', "\r");
        if self.bracketed_paste() {
            self.keys(format!("\x1b[200~{body}\x1b[201~").as_bytes());
        } else {
            self.keys(body.as_bytes());
        }
    }

    /// The screen left the alternate screen, shows the cursor, and the tty is back in
    /// cooked mode (icanon, echo).
    fn check_restored(&self, after: &str) {
        if self.alternate_screen() {
            self.fail(&format!(
                "the terminal is still on the alternate screen after {after}"
            ));
        }
        if !self.cursor_visible() {
            self.fail(&format!("the cursor is still hidden after {after}"));
        }
        self.type_line(
            "stty -a | tr ' ;' '\\n\\n' | grep -xE 'icanon|echo' | tr '\\n' ' '; echo :STTY",
        );
        self.wait_until(
            &format!("the terminal is still in raw mode after {after} (stty)"),
            Duration::from_secs(10),
            || {
                self.screen().lines().any(|l| {
                    l.starts_with("icanon echo :STTY") || l.starts_with("echo icanon :STTY")
                })
            },
        );
    }
}

impl Drop for Terminal {
    /// Stop whatever still runs in the terminal (the TUI after a failure), then the shell.
    fn drop(&mut self) {
        let shell = Pid::from_raw(self.shell.id() as i32);
        if let Ok(group) = rustix::termios::tcgetpgrp(&*self.pty) {
            if Some(group) != shell {
                let _ = kill_process_group(group, Signal::KILL);
            }
        }
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

/// Feed the pty's output to the screen, answering device-attribute queries, until every
/// process on the terminal is gone.
fn read_into(pty: &pty_process::blocking::Pty, parser: &Mutex<vt100::Parser>) {
    let mut buf = [0u8; 8192];
    // The last bytes of the previous read: a query may be split across two reads.
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let n = match (&*pty).read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        parser
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .process(&buf[..n]);
        let mut window = std::mem::take(&mut carry);
        let old = window.len();
        window.extend_from_slice(&buf[..n]);
        for query in DA1_QUERIES {
            let queries = window
                .windows(query.len())
                .enumerate()
                .filter(|(i, w)| *w == query && i + query.len() > old)
                .count();
            for _ in 0..queries {
                let _ = (&*pty).write_all(DA1_ANSWER);
            }
        }
        carry = window[window.len().saturating_sub(3)..].to_vec();
    }
}

/// The pid in `gateway.pid` (its first line).
fn gateway_pid(home: &Path) -> Option<Pid> {
    let text = std::fs::read_to_string(home.join("gateway.pid")).ok()?;
    let digits: String = text
        .lines()
        .next()?
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    Pid::from_raw(digits.parse().ok()?)
}

/// SIGTERM to the gateway, up to 10 s for it to go, then SIGKILL; the pid file goes too.
fn stop_gateway(home: &Path) {
    if let Some(pid) = gateway_pid(home) {
        if test_kill_process(pid).is_ok() {
            let _ = kill_process(pid, Signal::TERM);
            for _ in 0..100 {
                if test_kill_process(pid).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if test_kill_process(pid).is_ok() {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
    }
    let _ = std::fs::remove_file(home.join("gateway.pid"));
}

/// Stops the gateway of a test home when dropped (also when the test panicked) and removes
/// its containers.
struct GatewayGuard<'a>(&'a TestEnv);

impl Drop for GatewayGuard<'_> {
    fn drop(&mut self) {
        stop_gateway(&self.0.home());
        let Ok(Some(id)) = BeigeHome::new(self.0.home()).read_installation_id() else {
            return;
        };
        let filter = format!("label=io.beige.installation={id}");
        if let Ok(out) = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", &filter])
            .output()
        {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(&ids)
                    .output();
            }
        }
    }
}

/// What `beige-tui/examples/fake_provider.rs` answers, for `exchanges` messages: a tool
/// call (`exec echo hello-from-the-sandbox`), then, once its result is back, an answer
/// streamed in small pieces.
fn queue_exchanges(server: &FakeLlmServer, exchanges: usize) {
    for i in 1..=exchanges {
        server.push(
            MessageStream::new()
                .text("Let me check the sandbox.")
                .tool_use(
                    &format!("toolu_e2e_{i:04}"),
                    "exec",
                    json!({"command": "echo hello-from-the-sandbox"}),
                )
                .usage(420, 38)
                .reply(),
        );
        server.push(
            MessageStream::new()
                .text(&format!(
                    "The sandbox answered **hello-from-the-sandbox**.\n\n- exit code 0\n- reply number {i}"
                ))
                .usage(510, 24)
                .piece_size(3)
                .reply(),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tui_in_a_pseudo_terminal_against_a_real_gateway() {
    let docker = docker_or_skip!();
    let provider = FakeLlmServer::start().await;
    queue_exchanges(&provider, 2);
    let env = TestEnv::new();
    tokio::task::block_in_place(|| session(&env, &provider.url(), &docker.image));
    assert_eq!(
        provider.replies_left(),
        0,
        "every queued reply was asked for"
    );
}

fn session(env: &TestEnv, provider_url: &str, image: &str) {
    use std::os::unix::fs::PermissionsExt;

    let home = env.home();
    std::fs::create_dir_all(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let beige = env!("CARGO_BIN_EXE_beige");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");

    // ---- 1. no gateway
    let run = env.run(&["tui", "e2e", "-g", &url]);
    let said = format!("{}{}", run.stdout, run.stderr);
    assert_eq!(
        run.code,
        Some(1),
        "with no gateway, `beige tui` exited {:?}: {said}",
        run.code
    );
    assert!(
        said.contains(&format!("not running at {url}")) && said.contains("beige gateway start"),
        "with no gateway, `beige tui` said: {said}"
    );

    // ---- 2. provider and gateway
    std::fs::write(
        home.join("config.json5"),
        format!(
            r#"// Written by the TUI pty test.
{{
  llm: {{
    providers: {{
      anthropic: {{ apiKey: "e2e-not-a-secret", baseUrl: "{provider_url}" }},
    }},
  }},
  agents: {{
    e2e: {{
      model: {{ provider: "anthropic", model: "claude-sonnet-4-5" }},
      tools: [],
      sandbox: {{ image: "{image}" }},
    }},
  }},
  gateway: {{ host: "127.0.0.1", port: {port} }},
}}
"#
        ),
    )
    .unwrap();
    let run = env.run(&["setup"]);
    assert_eq!(run.code, Some(0), "beige setup failed: {}", run.stderr);
    let _gateway = GatewayGuard(env);
    let start_gateway = || {
        let timeout = TIMEOUT.as_secs().to_string();
        let run = env.run(&["gateway", "start", "--timeout", &timeout]);
        assert_eq!(
            run.code,
            Some(0),
            "beige gateway start failed: {}{}",
            run.stdout,
            run.stderr
        );
        assert!(
            gateway_pid(&home).is_some(),
            "no pid in {}",
            home.join("gateway.pid").display()
        );
    };
    start_gateway();

    // ---- 3. a session in the terminal
    let term = Terminal::start(env);
    term.wait_for("e2e-shell$", Duration::from_secs(10));
    term.type_line(&format!("{beige} tui e2e; echo TUI-EXIT=$?"));
    term.wait_for("Message e2e", Duration::from_secs(30));
    term.wait_for("connected", TIMEOUT);
    if !term.alternate_screen() {
        term.fail("the TUI did not switch to the alternate screen");
    }

    // A bracketed paste with a line break lands in the input and is not sent; Esc clears it.
    term.paste("pasted line one\npasted line two");
    term.wait_for("  pasted line two", Duration::from_secs(10));
    if !term.shows("› pasted line one") {
        term.fail("the paste did not land in the input");
    }
    term.keys(b"\x1b");
    term.wait_for("Message e2e", Duration::from_secs(10));
    // Alt+Enter adds a line (the terminal does not report Shift+Enter); Enter sends both.
    term.keys(b"Please run a command");
    term.keys(b"\x1b\r");
    term.keys(b"in your sandbox.");
    term.keys(b"\r");
    term.wait_for("  in your sandbox.", TIMEOUT);
    if !term.shows("› Please run a command") {
        term.fail("the two-line message is not in the transcript");
    }
    term.wait_for("exec echo hello-from-the-sandbox", TIMEOUT);
    term.wait_for("reply number 1", TIMEOUT);
    term.wait_for("The sandbox answered hello-from-the-sandbox.", TIMEOUT);
    if !term.shows("exit 0") {
        term.fail("the exec tool cell shows no exit code");
    }
    term.show();

    // ---- 4. gateway restart
    stop_gateway(&home);
    term.wait_for("reconnecting", TIMEOUT);
    term.show();
    start_gateway();
    term.wait_for("Reconnected to the gateway", TIMEOUT);
    term.type_line("And once more, please.");
    term.wait_for("reply number 2", TIMEOUT);
    term.show();

    // ---- 5. /new, /quit, terminal restored
    term.type_line("/new");
    term.wait_for("New session", TIMEOUT);
    term.show();
    term.type_line("/quit");
    term.wait_for("TUI-EXIT=0", Duration::from_secs(20));
    term.check_restored("quitting");

    // ---- 6. restored after a panic
    term.type_line(&format!(
        "clear; RUST_BACKTRACE=0 BEIGE_TUI_TEST_PANIC=1 {beige} tui e2e; echo TUI-EXIT=$?"
    ));
    term.wait_for("TUI-EXIT=101", Duration::from_secs(30));
    if !term.shows("panicking on purpose") {
        term.fail("the panic message is not on screen after the panic");
    }
    term.check_restored("a panic");
    term.show();
}
