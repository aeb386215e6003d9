//! The Chat page and its running turns. A prompt sent from the console runs in a task of
//! its own (leaving the page does not cancel it); its events are kept in a [`Turn`] and
//! streamed to any page watching it as server-rendered HTML fragments over SSE — text
//! deltas, tool cells (the call, then exit code, duration and output), approval cards
//! and the turn's status — replayed from the start (or from `Last-Event-ID`) and then
//! followed. This module owns the turns; the transcript comes from `Sessions`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect};
use axum::Form;
use beige_core::api::auth::Action;
use beige_core::api::{
    AgentEvent, Block, Gateway as _, Message, PromptRequest, Role, Sessions as _, ToolResultPart,
};
use futures_util::StreamExt as _;
use serde::Deserialize;
use tokio::sync::watch;

use crate::auth;
use crate::error::{ConsoleError, PageResult};
use crate::pages::{from_htmx, html, session, SSE_KEEP_ALIVE};
use crate::views::{
    ApprovalCard, ChatPage, Delta, Entry, Layout, LiveTurn, OutputChunk, ToolCell, TurnStatus,
};
use crate::Shared;

/// How long a finished turn stays watchable.
const KEEP_FINISHED: Duration = Duration::from_secs(300);
/// How long a prompt without JavaScript waits for its turn before showing the page.
const NO_JS_WAIT: Duration = Duration::from_secs(600);

/// One prompt's run: its events so far and whether it ended.
#[derive(Debug)]
pub(crate) struct Turn {
    id: String,
    agent: String,
    key: String,
    events: Mutex<Vec<AgentEvent>>,
    /// The number of events, and whether the turn ended.
    progress: watch::Sender<(usize, bool)>,
    /// Calls by id: the line shown for each (`exec echo hi`).
    calls: Mutex<HashMap<String, String>>,
}

impl Turn {
    fn push(&self, event: AgentEvent) {
        let n = {
            let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
            events.push(event);
            events.len()
        };
        self.progress.send_replace((n, false));
    }

    fn finish(&self) {
        let n = self.events.lock().unwrap_or_else(|e| e.into_inner()).len();
        self.progress.send_replace((n, true));
    }

    fn event(&self, i: usize) -> Option<AgentEvent> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(i)
            .cloned()
    }
}

/// The running (and recently finished) turns, by id and by session.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    by_id: Mutex<HashMap<String, Arc<Turn>>>,
    /// `(agent, key)` → the id of its latest turn.
    by_session: Mutex<HashMap<(String, String), String>>,
}

impl Turns {
    fn get(&self, id: &str) -> Option<Arc<Turn>> {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// The session's turn, while it runs.
    fn running(&self, agent: &str, key: &str) -> Option<Arc<Turn>> {
        let id = self
            .by_session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(agent.to_string(), key.to_string()))
            .cloned()?;
        self.get(&id).filter(|t| !t.progress.borrow().1)
    }

    fn insert(&self, turn: Arc<Turn>) {
        self.by_session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((turn.agent.clone(), turn.key.clone()), turn.id.clone());
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(turn.id.clone(), turn);
    }

    fn remove(&self, id: &str) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        self.by_session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, v| v != id);
    }
}

/// The line a call is shown as: `exec <command>`, else the tool and its arguments.
fn call_line(name: &str, args: &serde_json::Value) -> String {
    match (name, args.get("command").and_then(|c| c.as_str())) {
        ("exec", Some(command)) => format!("exec {command}"),
        _ => format!("{name} {args}"),
    }
}

/// A finished call's output split into its exit code (`Exit code: N`, the first line
/// of an exec result) and the rest.
fn split_exit(output: &str) -> (Option<String>, String) {
    let (first, rest) = output.split_once('\n').unwrap_or((output, ""));
    match first.strip_prefix("Exit code: ") {
        Some(code) => (Some(format!("exit {}", code.trim())), rest.to_string()),
        None => (None, output.to_string()),
    }
}

fn tool_dom_id(call_id: &str) -> String {
    format!("tool-{}", crate::dom_id(call_id))
}

fn finished_cell(
    call_id: &str,
    call: String,
    output: &str,
    is_error: bool,
    duration: Option<u64>,
) -> ToolCell {
    let (exit, output) = split_exit(output);
    ToolCell {
        dom_id: tool_dom_id(call_id),
        call,
        running: false,
        exit,
        duration: duration.map(|ms| format!("{ms} ms")),
        output,
        is_error,
        oob: false,
    }
}

/// The transcript as entries: text of either side, tool calls paired with their results.
fn entries(messages: &[Message]) -> Vec<Entry> {
    let mut results: HashMap<&str, (String, bool)> = HashMap::new();
    for m in messages {
        for b in &m.content {
            if let Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } = b
            {
                let text: Vec<&str> = content
                    .iter()
                    .filter_map(|p| match p {
                        ToolResultPart::Text { text } => Some(text.as_str()),
                        ToolResultPart::Image { .. } => None,
                    })
                    .collect();
                results.insert(tool_use_id, (text.join("\n"), *is_error));
            }
        }
    }
    let mut out = Vec::new();
    for m in messages {
        for b in &m.content {
            match (m.role, b) {
                (Role::User, Block::Text { text }) => out.push(Entry::User(text.clone())),
                (Role::Assistant, Block::Text { text }) => out.push(Entry::Assistant(text.clone())),
                (_, Block::ToolUse { id, name, input }) => {
                    let (output, is_error) = results.get(id.as_str()).cloned().unwrap_or_default();
                    out.push(Entry::Tool(finished_cell(
                        id,
                        call_line(name, input),
                        &output,
                        is_error,
                        None,
                    )));
                }
                _ => {}
            }
        }
    }
    out
}

/// May the caller read this session's transcript?
fn may_read(
    caller: &beige_core::api::auth::Caller,
    agent: &str,
    key: &str,
) -> Result<(), ConsoleError> {
    caller.may(Action::See, agent)?;
    if caller.may(Action::ReadAllTranscripts, agent).is_ok() || caller.owns_session(agent, key) {
        return Ok(());
    }
    caller.may_use_session(agent, key)?;
    Ok(())
}

/// `GET /console/agents/{agent}/sessions/{key}`.
pub(crate) async fn page(
    State(s): State<Shared>,
    Path((agent, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> PageResult {
    let me = session(&s, &headers).await?;
    may_read(&me.caller, &agent, &key)?;
    let gw = &s.api.gateway;
    let latest = gw
        .sessions(&agent)
        .await?
        .into_iter()
        .filter(|r| r.key == key)
        .max_by_key(|r| r.updated);
    let messages = match latest {
        Some(r) => gw.session_messages(&agent, &r.id).await?,
        None => Vec::new(),
    };
    let live = s.turns.running(&agent, &key).map(|t| LiveTurn {
        id: t.id.clone(),
        agent: agent.clone(),
        key: key.clone(),
        csrf: me.csrf.clone(),
        message: None,
    });
    html(&ChatPage {
        l: Layout::new(
            format!("{agent} · {key}"),
            "agents",
            Some(&me.caller),
            &me.csrf,
        ),
        may_prompt: me.caller.may_use_session(&agent, &key).is_ok(),
        entries: entries(&messages),
        live,
        agent,
        key,
    })
}

/// The composer.
#[derive(Debug, Deserialize)]
pub(crate) struct PromptForm {
    #[serde(default, rename = "_csrf")]
    csrf: String,
    #[serde(default)]
    message: String,
}

/// `POST /console/agents/{agent}/sessions/{key}/prompt`: start a turn. htmx gets the
/// live view; a browser without JavaScript waits for the turn and sees the page again.
pub(crate) async fn prompt(
    State(s): State<Shared>,
    Path((agent, key)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<PromptForm>,
) -> PageResult {
    let me = session(&s, &headers).await?;
    auth::check_csrf(&headers, Some(&form.csrf), &me.csrf)?;
    me.caller.may_use_session(&agent, &key)?;
    let message = form.message.trim().to_string();
    if message.is_empty() {
        return Err(ConsoleError::BadRequest("the message is empty".into()));
    }
    let mut request = PromptRequest::new(agent.clone(), key.clone(), message.clone()).attended();
    request.principal = me.caller.principal();
    request.channel = Some("console".to_string());
    let mut stream = s.api.gateway.prompt(request).await?;
    let (progress, _) = watch::channel((0, false));
    let turn = Arc::new(Turn {
        id: auth::random_token()[..22].to_string(),
        agent: agent.clone(),
        key: key.clone(),
        events: Mutex::new(Vec::new()),
        progress,
        calls: Mutex::new(HashMap::new()),
    });
    s.turns.insert(turn.clone());
    let task_turn = turn.clone();
    let task_state = s.clone();
    tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            let end = event.is_terminal();
            task_turn.push(event);
            if end {
                break;
            }
        }
        task_turn.finish();
        tokio::time::sleep(KEEP_FINISHED).await;
        task_state.turns.remove(&task_turn.id);
    });
    if from_htmx(&headers) {
        return html(&LiveTurn {
            id: turn.id.clone(),
            agent,
            key,
            csrf: me.csrf,
            message: Some(message),
        });
    }
    let mut rx = turn.progress.subscribe();
    let _ = tokio::time::timeout(NO_JS_WAIT, rx.wait_for(|(_, done)| *done)).await;
    Ok(Redirect::to(&format!(
        "/console/agents/{}/sessions/{}",
        crate::url_encode(&agent),
        crate::url_encode(&key)
    ))
    .into_response())
}

/// `POST /console/agents/{agent}/sessions/{key}/cancel`: cancel the session's running
/// turn (the turn's stream then ends with its status).
pub(crate) async fn cancel(
    State(s): State<Shared>,
    Path((agent, key)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<CsrfOnly>,
) -> PageResult {
    let me = session(&s, &headers).await?;
    auth::check_csrf(&headers, Some(&form.csrf), &me.csrf)?;
    me.caller.may_use_session(&agent, &key)?;
    let cancelled = s.api.gateway.cancel(&agent, &key).await?;
    tracing::info!(%agent, %key, user = %me.caller.user, cancelled, "console: cancel");
    if from_htmx(&headers) {
        return Ok(axum::http::StatusCode::NO_CONTENT.into_response());
    }
    Ok(Redirect::to(&format!(
        "/console/agents/{}/sessions/{}",
        crate::url_encode(&agent),
        crate::url_encode(&key)
    ))
    .into_response())
}

/// A form with only the CSRF field.
#[derive(Debug, Deserialize)]
pub(crate) struct CsrfOnly {
    #[serde(default, rename = "_csrf")]
    csrf: String,
}

/// SSE `data` cannot carry a carriage return.
fn sse_html(html: String) -> String {
    html.replace('\r', "&#13;")
}

/// The fragment of one event (what is appended to the turn, with out-of-band updates).
fn fragment(turn: &Turn, event: &AgentEvent, me: &auth::Session) -> Result<String, askama::Error> {
    let status = |state: &'static str, text: String| TurnStatus {
        id: turn.id.clone(),
        state,
        text,
    };
    Ok(match event {
        AgentEvent::TextDelta { text } => Delta { text: text.clone() }.render()?,
        AgentEvent::ToolCallStarted { id, name, args } => {
            let call = call_line(name, args);
            turn.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.clone(), call.clone());
            ToolCell {
                dom_id: tool_dom_id(id),
                call,
                running: true,
                exit: None,
                duration: None,
                output: String::new(),
                is_error: false,
                oob: false,
            }
            .render()?
        }
        AgentEvent::ToolOutput { id, text, .. } => OutputChunk {
            dom_id: tool_dom_id(id),
            text: text.clone(),
        }
        .render()?,
        AgentEvent::ToolCallFinished {
            id,
            name,
            output,
            is_error,
            duration_ms,
        } => {
            let call = turn
                .calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(id)
                .cloned()
                .unwrap_or_else(|| name.clone());
            let mut cell = finished_cell(id, call, output, *is_error, Some(*duration_ms));
            cell.oob = true;
            cell.render()?
        }
        AgentEvent::ApprovalRequest { approval } => {
            let card = ApprovalCard::new(approval, &me.caller, &me.csrf).render()?;
            let st = status(
                "waiting",
                format!("Waiting for approval of {}", approval.call_line()),
            );
            format!("{card}{}", st.render()?)
        }
        AgentEvent::ApprovalDecided { approval } => {
            let mut card = ApprovalCard::new(approval, &me.caller, &me.csrf);
            card.oob = true;
            let st = status("running", "Working…".into());
            format!("{}{}", card.render()?, st.render()?)
        }
        AgentEvent::ModelSwitched { from, to, reason } => {
            status("running", format!("Switched from {from} to {to}: {reason}")).render()?
        }
        AgentEvent::Done { usage, .. } => status(
            "done",
            format!(
                "Done ({} tokens in, {} out)",
                usage.input_tokens, usage.output_tokens
            ),
        )
        .render()?,
        AgentEvent::Blocked { reason } => {
            status("failed", format!("Blocked: {reason}")).render()?
        }
        AgentEvent::Error { message, hint, .. } => {
            let text = match hint {
                Some(h) => format!("Failed: {message} — {h}"),
                None => format!("Failed: {message}"),
            };
            status("failed", text).render()?
        }
        _ => String::new(),
    })
}

/// `GET /console/turns/{id}/events`: the turn's fragments, replayed then followed; a
/// `done` event at the end (the page then closes the stream).
pub(crate) async fn events(
    State(s): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> PageResult {
    let me = session(&s, &headers).await?;
    let turn = s
        .turns
        .get(&id)
        .ok_or_else(|| ConsoleError::NotFound(format!("turn {id}")))?;
    may_read(&me.caller, &turn.agent, &turn.key).map_err(|e| match e {
        ConsoleError::Refused(_) => ConsoleError::NotFound(format!("turn {id}")),
        other => other,
    })?;
    let start = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(0, |last| last + 1);
    let rx = turn.progress.subscribe();
    let state = (turn, me, rx, start, false);
    let stream =
        futures_util::stream::unfold(state, |(turn, me, mut rx, next, closed)| async move {
            if closed {
                return None;
            }
            loop {
                if let Some(event) = turn.event(next) {
                    let data = match fragment(&turn, &event, &me) {
                        Ok(html) => sse_html(html),
                        Err(e) => {
                            tracing::warn!(error = %e, "console: a turn fragment failed to render");
                            String::new()
                        }
                    };
                    let sse = Event::default()
                        .event("turn")
                        .id(next.to_string())
                        .data(data);
                    return Some((
                        Ok::<Event, Infallible>(sse),
                        (turn, me, rx, next + 1, false),
                    ));
                }
                let (count, done) = *rx.borrow_and_update();
                if next >= count && done {
                    let sse = Event::default().event("done").data("done");
                    return Some((Ok(sse), (turn, me, rx, next, true)));
                }
                if next < count {
                    continue;
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_split_from_exec_output() {
        assert_eq!(
            split_exit("Exit code: 0\nhi\n"),
            (Some("exit 0".into()), "hi\n".into())
        );
        assert_eq!(split_exit("no code"), (None, "no code".into()));
    }

    #[test]
    fn exec_calls_show_their_command() {
        let args = serde_json::json!({"command": "echo hi"});
        assert_eq!(call_line("exec", &args), "exec echo hi");
        assert_eq!(
            call_line("read", &serde_json::json!({"path": "a"})),
            "read {\"path\":\"a\"}"
        );
    }

    #[test]
    fn text_is_escaped_in_fragments() {
        let html = Delta {
            text: "<script>x</script>".into(),
        }
        .render()
        .unwrap();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&#60;script&#62;"), "{html}");
    }
}
