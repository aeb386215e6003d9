//! The runtime: executes [`Effect`]s against a [`Gateway`] (each in its own task, the
//! outcome coming back as a [`Msg`]), owns the terminal and runs the event loop — one
//! `tokio::select!` over terminal events, gateway messages, a tick and termination
//! signals.
//!
//! The terminal is set up by [`TerminalGuard`] (raw mode, alternate screen, bracketed
//! paste, mouse capture, and the kitty keyboard protocol where the terminal supports it,
//! so Shift+Enter can be told from Enter) and restored when the guard drops — on a normal
//! exit, on an error and, through a panic hook, on a panic. When a request fails because
//! the gateway is unreachable, [`Effect::Reconnect`] retries with backoff until it answers.

use std::io::{self, Stdout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use beige_client::session::SettingsPatch;
use beige_client::{Admin, Gateway, GatewayError, GatewayFull, Principal, PromptRequest, Sessions};
use crossterm::event::{
    DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste, EnableMouseCapture, Event,
    EventStream, KeyboardEnhancementFlags, PopKeyboardEnhancementFlags,
    PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use futures_util::StreamExt;
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;

use crate::app::{session_key, App};
use crate::update::{update, AgentLoad, Effect, Failure, Msg, ResumeTarget, SettingChange};

/// Interval of [`Msg::Tick`] (spinner, periodic connection checks).
pub const TICK: Duration = Duration::from_millis(100);

/// First delay between reconnect attempts; doubles up to [`RECONNECT_MAX_DELAY`].
pub const RECONNECT_FIRST_DELAY: Duration = Duration::from_millis(500);

/// Longest delay between reconnect attempts.
pub const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(5);

/// Set this environment variable to make the TUI panic right after its first frame —
/// for tests that check the terminal is restored after a panic (beige-cli's `suite::tui_pty`).
pub const TEST_PANIC_ENV: &str = "BEIGE_TUI_TEST_PANIC";

/// How long quitting waits for pending cancel requests to reach the gateway.
const QUIT_CANCEL_WAIT: Duration = Duration::from_secs(2);

/// What `update` needs to know about a gateway error.
pub fn failure(e: &GatewayError) -> Failure {
    let (unreachable, status) = match e {
        GatewayError::Unreachable { .. } => (true, None),
        GatewayError::Remote { status, .. } => (false, Some(*status)),
        GatewayError::ModelNotAllowed { .. } => (false, Some(403)),
        GatewayError::UnknownAgent { .. } | GatewayError::UnknownSession { .. } => {
            (false, Some(404))
        }
        _ => (false, None),
    };
    Failure {
        message: e.to_string(),
        unreachable,
        status,
    }
}

/// Runs effects: every effect that talks to the gateway is a task whose result is sent
/// back as a [`Msg`].
pub struct Controller {
    gateway: Arc<dyn GatewayFull>,
    tx: UnboundedSender<Msg>,
    tasks: Vec<JoinHandle<()>>,
    cancels: Vec<JoinHandle<()>>,
    reconnect: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("tasks", &self.tasks.len())
            .field("cancels", &self.cancels.len())
            .field("reconnecting", &self.reconnect.is_some())
            .finish_non_exhaustive()
    }
}

impl Controller {
    pub fn new(gateway: Arc<dyn GatewayFull>, tx: UnboundedSender<Msg>) -> Self {
        Self {
            gateway,
            tx,
            tasks: Vec::new(),
            cancels: Vec::new(),
            reconnect: None,
        }
    }

    fn spawn<F>(&mut self, action: &'static str, work: F)
    where
        F: std::future::Future<Output = Result<Msg, Failure>> + Send + 'static,
    {
        let tx = self.tx.clone();
        self.tasks.retain(|t| !t.is_finished());
        self.tasks.push(tokio::spawn(async move {
            let msg = match work.await {
                Ok(m) => m,
                Err(failure) => Msg::Failed {
                    action: action.to_string(),
                    failure,
                },
            };
            let _ = tx.send(msg);
        }));
    }

    /// Start doing `effect`. `Effect::Quit` does nothing here (the loop ends on
    /// `App::should_quit`).
    pub fn execute(&mut self, effect: Effect) {
        let gw = self.gateway.clone();
        let f = |e: GatewayError| failure(&e);
        match effect {
            Effect::SendPrompt {
                id,
                agent,
                session_key,
                message,
            } => {
                let tx = self.tx.clone();
                self.tasks.retain(|t| !t.is_finished());
                self.tasks.push(tokio::spawn(async move {
                    // Attended: the gateway streams approval requests to the TUI, which
                    // answers them (instead of denying such calls at once).
                    let request = PromptRequest::new(agent, session_key, message).attended();
                    match gw.prompt(request).await {
                        Ok(mut stream) => {
                            while let Some(event) = stream.next().await {
                                if tx.send(Msg::Event { id, event }).is_err() {
                                    return;
                                }
                            }
                            let _ = tx.send(Msg::PromptClosed { id });
                        }
                        Err(e) => {
                            let _ = tx.send(Msg::PromptFailed {
                                id,
                                failure: failure(&e),
                            });
                        }
                    }
                }));
            }
            Effect::Cancel { agent, session_key } => {
                let tx = self.tx.clone();
                self.cancels.retain(|t| !t.is_finished());
                self.cancels.push(tokio::spawn(async move {
                    let msg = match gw.cancel(&agent, &session_key).await {
                        Ok(was_running) => Msg::Cancelled { was_running },
                        Err(e) => Msg::Failed {
                            action: "cancel the answer".into(),
                            failure: failure(&e),
                        },
                    };
                    let _ = tx.send(msg);
                }));
            }
            Effect::LoadAgent { agent } => self.spawn("load the agent", async move {
                load_agent(gw.as_ref(), &agent)
                    .await
                    .map(|l| Msg::AgentLoaded(Box::new(l)))
                    .map_err(f)
            }),
            Effect::LoadSessions { agent } => self.spawn("list the sessions", async move {
                gw.sessions(&agent)
                    .await
                    .map(Msg::SessionsLoaded)
                    .map_err(f)
            }),
            Effect::Resume {
                agent,
                session_key,
                target,
            } => self.spawn("resume the session", async move {
                let id = resolve_session(gw.as_ref(), &agent, target).await?;
                let record = gw
                    .resume_session(&agent, &session_key, &id)
                    .await
                    .map_err(f)?;
                let messages = gw.session_messages(&agent, &id).await.map_err(f)?;
                Ok(Msg::Resumed { record, messages })
            }),
            Effect::NewSession { agent, session_key } => {
                self.spawn("start a new session", async move {
                    gw.new_session(&agent, &session_key)
                        .await
                        .map(Msg::SessionCreated)
                        .map_err(f)
                })
            }
            Effect::SetModel {
                agent,
                session_key,
                model,
            } => self.spawn("set the model", async move {
                let patch = SettingsPatch {
                    model_override: Some(model),
                    ..SettingsPatch::default()
                };
                gw.update_settings(&agent, &session_key, patch)
                    .await
                    .map(|settings| Msg::SettingsChanged {
                        settings,
                        change: SettingChange::Model,
                    })
                    .map_err(f)
            }),
            Effect::SetVerbose {
                agent,
                session_key,
                on,
            } => self.spawn("change verbose", async move {
                let patch = SettingsPatch {
                    verbose: Some(Some(on)),
                    ..SettingsPatch::default()
                };
                gw.update_settings(&agent, &session_key, patch)
                    .await
                    .map(|settings| Msg::SettingsChanged {
                        settings,
                        change: SettingChange::Verbose,
                    })
                    .map_err(f)
            }),
            Effect::DecideApproval { id, decision } => {
                let tx = self.tx.clone();
                self.tasks.retain(|t| !t.is_finished());
                self.tasks.push(tokio::spawn(async move {
                    // Over HTTP the gateway names the approver after the API token.
                    let msg = match gw.decide_approval(&id, decision, Principal::ApiToken).await {
                        Ok(approval) => Msg::ApprovalAnswered(approval),
                        Err(e) => Msg::ApprovalFailed {
                            id,
                            failure: failure(&e),
                        },
                    };
                    let _ = tx.send(msg);
                }));
            }
            Effect::Probe => self.spawn("reach the gateway", async move {
                gw.agents()
                    .await
                    .map(|agents| Msg::Connected { agents })
                    .map_err(f)
            }),
            Effect::Reconnect => {
                if self.reconnect.as_ref().is_some_and(|t| !t.is_finished()) {
                    return;
                }
                let tx = self.tx.clone();
                self.reconnect = Some(tokio::spawn(reconnect(gw, tx)));
            }
            Effect::Quit => {}
        }
    }

    /// Wait until every running request (not a reconnect loop) has finished. A prompt
    /// that never ends keeps this waiting.
    pub async fn join_tasks(&mut self) -> bool {
        let tasks: Vec<JoinHandle<()>> =
            self.tasks.drain(..).chain(self.cancels.drain(..)).collect();
        let any = !tasks.is_empty();
        for t in tasks {
            let _ = t.await;
        }
        any
    }

    /// Let pending cancel requests reach the gateway (bounded), then stop every task.
    /// Dropping a prompt's stream also cancels it on the gateway.
    pub async fn shutdown(&mut self) {
        let cancels: Vec<JoinHandle<()>> = self.cancels.drain(..).collect();
        let _ = tokio::time::timeout(QUIT_CANCEL_WAIT, async {
            for c in cancels {
                let _ = c.await;
            }
        })
        .await;
        for t in self.tasks.drain(..) {
            t.abort();
        }
        if let Some(r) = self.reconnect.take() {
            r.abort();
        }
    }
}

/// Everything `AgentLoaded` needs: settings of the agent's TUI key, allowed models, the
/// key's current session (the newest with that key) and its messages.
pub async fn load_agent(gw: &dyn GatewayFull, agent: &str) -> Result<AgentLoad, GatewayError> {
    let key = session_key(agent);
    let settings = gw.settings(&key).await?;
    let models = gw.models(agent).await?;
    let sessions = gw.sessions(agent).await?;
    let session = sessions.into_iter().find(|s| s.key == key);
    let messages = match &session {
        Some(s) => gw.session_messages(agent, &s.id).await?,
        None => Vec::new(),
    };
    Ok(AgentLoad {
        agent: agent.to_string(),
        settings,
        models,
        session,
        messages,
    })
}

/// The id of a `/resume` target: a 1-based position in the session list, a full id or
/// an unambiguous prefix of one.
async fn resolve_session(
    gw: &dyn GatewayFull,
    agent: &str,
    target: ResumeTarget,
) -> Result<String, Failure> {
    let list = gw.sessions(agent).await.map_err(|e| failure(&e))?;
    match target {
        ResumeTarget::Index(n) => list
            .get(n.saturating_sub(1))
            .map(|s| s.id.clone())
            .ok_or_else(|| {
                Failure::new(format!(
                    "There is no session {n}: agent '{agent}' has {} (see /sessions).",
                    list.len()
                ))
            }),
        ResumeTarget::Id(id) => {
            if list.iter().any(|s| s.id == id) {
                return Ok(id);
            }
            let matches: Vec<&str> = list
                .iter()
                .map(|s| s.id.as_str())
                .filter(|s| s.starts_with(&id))
                .collect();
            match matches.as_slice() {
                [one] => Ok((*one).to_string()),
                [] => Err(Failure::new(format!(
                    "No session '{id}' for agent '{agent}' (see /sessions)."
                ))),
                _ => Err(Failure::new(format!(
                    "'{id}' matches {} sessions; type more of the id.",
                    matches.len()
                ))),
            }
        }
    }
}

/// Ask the gateway for its agents with growing delays until it answers.
async fn reconnect(gw: Arc<dyn GatewayFull>, tx: UnboundedSender<Msg>) {
    let mut delay = RECONNECT_FIRST_DELAY;
    let mut attempt = 0u32;
    loop {
        tokio::time::sleep(delay).await;
        attempt += 1;
        match gw.agents().await {
            Ok(agents) => {
                let _ = tx.send(Msg::Connected { agents });
                return;
            }
            Err(e) => {
                let f = failure(&e);
                if f.unreachable {
                    if tx
                        .send(Msg::ReconnectFailed {
                            attempt,
                            error: f.message,
                        })
                        .is_err()
                    {
                        return;
                    }
                    delay = (delay * 2).min(RECONNECT_MAX_DELAY);
                } else {
                    // It answers (with an error): reachable again.
                    let _ = tx.send(Msg::Connected { agents: Vec::new() });
                    let _ = tx.send(Msg::Failed {
                        action: "list the agents".into(),
                        failure: f,
                    });
                    return;
                }
            }
        }
    }
}

/// The app plus the machinery that runs its effects: what the event loop and the tests
/// drive.
pub struct Driver {
    pub app: App,
    ctl: Controller,
    rx: UnboundedReceiver<Msg>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("agent", &self.app.agent)
            .field("ctl", &self.ctl)
            .finish_non_exhaustive()
    }
}

impl Driver {
    pub fn new(app: App, gateway: Arc<dyn GatewayFull>) -> Self {
        let (tx, rx) = unbounded_channel();
        Self {
            app,
            ctl: Controller::new(gateway, tx),
            rx,
        }
    }

    /// Start an effect directly (what the runtime does first: load the agent).
    pub fn execute(&mut self, effect: Effect) {
        self.ctl.execute(effect);
    }

    /// `update` with `msg`, then start its effects.
    pub fn dispatch(&mut self, msg: Msg) {
        for effect in update(&mut self.app, msg) {
            self.ctl.execute(effect);
        }
    }

    /// Dispatch every message already waiting; `true` when there was one.
    pub fn drain(&mut self) -> bool {
        let mut any = false;
        while let Ok(m) = self.rx.try_recv() {
            self.dispatch(m);
            any = true;
        }
        any
    }

    /// The next message from a running effect (not dispatched).
    pub async fn recv(&mut self) -> Option<Msg> {
        self.rx.recv().await
    }

    /// Run until no request is in flight and no message is waiting. Does not wait for a
    /// reconnect loop; waits forever for a prompt whose stream never ends.
    pub async fn settle(&mut self) {
        loop {
            let drained = self.drain();
            let waited = self.ctl.join_tasks().await;
            if !drained && !waited && self.rx.is_empty() {
                return;
            }
        }
    }

    pub async fn shutdown(&mut self) {
        self.ctl.shutdown().await;
    }
}

static KEYBOARD_ENHANCED: AtomicBool = AtomicBool::new(false);
static TERMINAL_ACTIVE: AtomicBool = AtomicBool::new(false);
static PANIC_HOOK: Once = Once::new();

/// Put the terminal back as it was. Does something only while the TUI owns the terminal,
/// so the panic hook and the guard's drop do not both leave the alternate screen (a second
/// "leave" would move the cursor back over the panic message). Errors are ignored: there
/// is nothing better to do with them while exiting.
pub fn restore_terminal() {
    if !TERMINAL_ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    let _ = disable_raw_mode();
    let mut out = io::stdout();
    if KEYBOARD_ENHANCED.swap(false, Ordering::SeqCst) {
        let _ = crossterm::execute!(out, PopKeyboardEnhancementFlags);
    }
    let _ = crossterm::execute!(
        out,
        DisableMouseCapture,
        DisableBracketedPaste,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

/// The terminal in TUI mode; restores it when dropped.
pub struct TerminalGuard {
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl std::fmt::Debug for TerminalGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TerminalGuard")
    }
}

impl TerminalGuard {
    /// Enter raw mode and the alternate screen; install the restoring panic hook.
    pub fn enter() -> io::Result<Self> {
        PANIC_HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore_terminal();
                previous(info);
            }));
        });
        let setup = || -> io::Result<Terminal<CrosstermBackend<Stdout>>> {
            TERMINAL_ACTIVE.store(true, Ordering::SeqCst);
            enable_raw_mode()?;
            let mut out = io::stdout();
            crossterm::execute!(
                out,
                EnterAlternateScreen,
                EnableBracketedPaste,
                EnableMouseCapture
            )?;
            if matches!(
                crossterm::terminal::supports_keyboard_enhancement(),
                Ok(true)
            ) {
                crossterm::execute!(
                    out,
                    PushKeyboardEnhancementFlags(
                        KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES
                    )
                )?;
                KEYBOARD_ENHANCED.store(true, Ordering::SeqCst);
            }
            let mut terminal = Terminal::new(CrosstermBackend::new(out))?;
            terminal.clear()?;
            Ok(terminal)
        };
        match setup() {
            Ok(terminal) => Ok(Self { terminal }),
            Err(e) => {
                restore_terminal();
                Err(e)
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Run the TUI on the current terminal until the user quits. `app` must already name a
/// valid agent; its agent is loaded first.
pub async fn run_terminal(mut app: App, gateway: Arc<dyn GatewayFull>) -> io::Result<()> {
    let mut guard = TerminalGuard::enter()?;
    let size = guard.terminal.size()?;
    app.size = (size.width, size.height);
    let agent = app.agent.clone();
    let mut driver = Driver::new(app, gateway);
    driver.ctl.execute(Effect::LoadAgent { agent });
    let result = event_loop(&mut guard, &mut driver).await;
    driver.shutdown().await;
    drop(guard);
    result
}

#[cfg(unix)]
async fn terminated(
    term: &mut Option<tokio::signal::unix::Signal>,
    hup: &mut Option<tokio::signal::unix::Signal>,
) {
    let t = async {
        match term {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    let h = async {
        match hup {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = t => {}
        _ = h => {}
    }
}

async fn event_loop(guard: &mut TerminalGuard, driver: &mut Driver) -> io::Result<()> {
    let mut events = EventStream::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    #[cfg(unix)]
    let (mut term, mut hup) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::hangup()).ok(),
        )
    };
    let test_panic = std::env::var_os(TEST_PANIC_ENV).is_some();
    let mut dirty = true;
    loop {
        if dirty {
            guard
                .terminal
                .draw(|f| crate::render::render(&driver.app, f))?;
        }
        if driver.app.should_quit {
            return Ok(());
        }
        if test_panic {
            panic!("{TEST_PANIC_ENV} is set: panicking on purpose to test that the terminal is restored");
        }
        #[cfg(unix)]
        let stop = terminated(&mut term, &mut hup);
        #[cfg(not(unix))]
        let stop = std::future::pending::<()>();
        let msg = tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(Event::Key(k))) => Msg::Key(k),
                Some(Ok(Event::Paste(s))) => Msg::Paste(s),
                Some(Ok(Event::Mouse(m))) => Msg::Mouse(m.kind),
                Some(Ok(Event::Resize(w, h))) => Msg::Resize(w, h),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
            Some(m) = driver.rx.recv() => m,
            _ = tick.tick() => Msg::Tick,
            _ = stop => return Ok(()),
        };
        // Idle ticks change nothing visible (the spinner only runs with a prompt).
        dirty = !matches!(msg, Msg::Tick) || driver.app.is_running();
        driver.dispatch(msg);
        // Apply whatever else arrived (streamed text) before drawing again.
        dirty |= driver.drain();
    }
}
