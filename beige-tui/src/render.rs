//! `render(&App, &mut Frame)`: the pure view. Draws the transcript (user and assistant
//! messages, tool cells, errors with hints, notes), the composer with its cursor, the
//! status line and the modal views (`/help`, `/sessions`).
//!
//! The transcript is laid out into lines here ([`transcript_lines`]) so `update` can
//! clamp scrolling with the same numbers. Colours are the terminal's named ones plus
//! modifiers (bold, dim, italic, reversed), never RGB, so light themes work too.

use beige_client::approvals::{Approval, ApprovalStatus};
use beige_client::session::SessionRecord;
use ratatui::layout::{Constraint, Layout, Position, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

use crate::app::{App, ApprovalCell, Cell, Connection, ErrorCell, Modal, ToolCell, ToolStatus};
use crate::commands::{COMMANDS, KEYS};
use crate::markdown;
use crate::update::short_id;
use crate::wrap::{hard_wrap, sanitize, truncate, width, wrap_spans};

/// Output lines a collapsed tool cell shows.
pub const COLLAPSED_LINES: usize = 3;

/// Output lines an expanded tool cell shows at most.
pub const EXPANDED_MAX_LINES: usize = 400;

const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

fn dim() -> Style {
    Style::default().add_modifier(Modifier::DIM)
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

fn red_bold() -> Style {
    Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
}

fn spinner(app: &App) -> &'static str {
    SPINNER[(app.tick % SPINNER.len() as u64) as usize]
}

/// The three areas of the screen.
#[derive(Debug, Clone, Copy)]
struct Areas {
    transcript: Rect,
    composer: Rect,
    status: Rect,
}

fn max_composer_rows(height: u16) -> usize {
    usize::from(height / 3).clamp(1, 10)
}

fn areas(app: &App, area: Rect) -> Areas {
    let comp = composer_layout(app, area.width);
    let rows = comp.lines.len().clamp(1, max_composer_rows(area.height)) as u16;
    let [transcript, composer, status] = Layout::vertical([
        Constraint::Min(0),
        Constraint::Length(rows + 1),
        Constraint::Length(1),
    ])
    .areas(area);
    Areas {
        transcript,
        composer,
        status,
    }
}

/// Rows the transcript gets on a terminal of `size`.
pub fn transcript_height(app: &App, size: (u16, u16)) -> usize {
    usize::from(
        areas(app, Rect::new(0, 0, size.0, size.1))
            .transcript
            .height,
    )
}

/// Draw the whole screen.
pub fn render(app: &App, frame: &mut Frame<'_>) {
    let area = frame.area();
    let a = areas(app, area);
    render_transcript(app, frame, a.transcript);
    render_composer(app, frame, a.composer);
    render_status(app, frame, a.status);
    match &app.modal {
        Some(Modal::Help { notice }) => render_help(frame, area, notice.as_deref()),
        Some(Modal::Sessions { list, selected }) => {
            render_sessions(app, frame, area, list, *selected)
        }
        None => {}
    }
}

// ---------------------------------------------------------------- transcript

/// The transcript laid out at `width` columns.
pub fn transcript_lines(app: &App, width: u16) -> Vec<Line<'static>> {
    let width = usize::from(width).max(16);
    if app.cells.is_empty() {
        return welcome(app, width);
    }
    let last_tool = app.cells.iter().rposition(|c| matches!(c, Cell::Tool(_)));
    let target = app.approval_target();
    let mut out: Vec<Line<'static>> = Vec::new();
    for (i, cell) in app.cells.iter().enumerate() {
        let lines = match cell {
            Cell::Approval(a) => approval_lines(app, a, width, Some(i) == target),
            _ => cell_lines(app, cell, width, Some(i) == last_tool),
        };
        if lines.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(Line::default());
        }
        out.extend(lines);
    }
    out
}

fn welcome(app: &App, width: usize) -> Vec<Line<'static>> {
    let indent = [Span::raw("  ")];
    let mut out = vec![Line::default()];
    let head = vec![
        Span::styled("beige", bold()),
        Span::raw(" · agent "),
        Span::styled(app.agent.clone(), bold()),
        Span::raw(format!(" · {}", app.model())),
    ];
    out.extend(wrap_spans(&head, width, &indent, &indent));
    out.extend(wrap_spans(
        &[Span::styled(
            format!("gateway {} · session {}", app.url, app.session_key),
            dim(),
        )],
        width,
        &indent,
        &indent,
    ));
    out.push(Line::default());
    for text in [
        "Type a message and press Enter. Shift+Enter (or Alt+Enter) starts a new line.",
        "/help lists commands and keys · Ctrl+C cancels an answer · twice quits.",
    ] {
        out.extend(wrap_spans(
            &[Span::styled(text, dim())],
            width,
            &indent,
            &indent,
        ));
    }
    out
}

fn cell_lines(app: &App, cell: &Cell, width: usize, last_tool: bool) -> Vec<Line<'static>> {
    match cell {
        Cell::User(text) => {
            let first = [Span::styled("› ", bold().fg(Color::Cyan))];
            let rest = [Span::raw("  ")];
            let mut out = Vec::new();
            for (i, line) in sanitize(text).split('\n').enumerate() {
                let p: &[Span<'static>] = if i == 0 { &first } else { &rest };
                out.extend(wrap_spans(
                    &[Span::styled(line.to_string(), bold())],
                    width,
                    p,
                    &rest,
                ));
            }
            out
        }
        Cell::Assistant { text, streaming } => {
            let mut out = markdown::render(text, width, &[Span::raw("  ")]);
            if *streaming {
                let cursor = Span::styled("▍", dim());
                match out.last_mut() {
                    Some(l) if crate::wrap::line_width(l) < width => l.spans.push(cursor),
                    _ => out.push(Line::from(vec![Span::raw("  "), cursor])),
                }
            }
            out
        }
        Cell::Thinking { text } => {
            if !app.verbose {
                return Vec::new();
            }
            let prefix = [Span::styled("  ┊ ", dim())];
            let style = dim().add_modifier(Modifier::ITALIC);
            let mut out = Vec::new();
            for line in sanitize(text.trim()).split('\n') {
                out.extend(wrap_spans(
                    &[Span::styled(line.to_string(), style)],
                    width,
                    &prefix,
                    &prefix,
                ));
            }
            out
        }
        Cell::Tool(t) => tool_lines(app, t, width, last_tool),
        Cell::Approval(a) => approval_lines(app, a, width, false),
        Cell::Error(e) => error_lines(e, width),
        Cell::Info(text) => wrap_spans(
            &[Span::styled(sanitize(text), dim())],
            width,
            &[Span::styled("  · ", dim())],
            &[Span::raw("    ")],
        ),
    }
}

/// What a tool call is about, on one line: the command of `exec`, the path of file tools,
/// the arguments as JSON otherwise.
pub fn tool_summary(t: &ToolCell) -> String {
    let s = |k: &str| t.args.get(k).and_then(|v| v.as_str());
    let text = match (t.name.as_str(), &t.args) {
        (_, serde_json::Value::Null) => String::new(),
        ("exec", _) if s("command").is_some() => s("command").unwrap_or_default().to_string(),
        ("write", _) if s("path").is_some() => format!(
            "{} ({} bytes)",
            s("path").unwrap_or_default(),
            s("content").map(str::len).unwrap_or(0)
        ),
        ("read" | "patch", _) if s("path").is_some() => s("path").unwrap_or_default().to_string(),
        (_, args) => args.to_string(),
    };
    sanitize(&text).replace('\n', " ⏎ ")
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

fn tool_lines(app: &App, t: &ToolCell, width: usize, last_tool: bool) -> Vec<Line<'static>> {
    let (icon, icon_style) = match t.status {
        ToolStatus::Running => (spinner(app), Style::default().fg(Color::Cyan)),
        ToolStatus::Ok => ("✓", Style::default().fg(Color::Green)),
        ToolStatus::Failed => ("✗", Style::default().fg(Color::Red)),
        ToolStatus::Denied => ("⊘", Style::default().fg(Color::Red)),
        ToolStatus::Interrupted => ("◌", dim()),
    };
    let took = t.duration_ms.map(duration);
    let right = match t.status {
        ToolStatus::Running => "running…".to_string(),
        ToolStatus::Denied => "denied".to_string(),
        ToolStatus::Interrupted if t.output.is_empty() => "interrupted".to_string(),
        _ => {
            let mut parts = Vec::new();
            match t.exit_code() {
                Some(code) => parts.push(format!("exit {code}")),
                None if t.status == ToolStatus::Failed => parts.push("error".to_string()),
                None => {}
            }
            parts.extend(took);
            parts.join(" · ")
        }
    };
    let right_style = match t.status {
        ToolStatus::Failed | ToolStatus::Denied => Style::default().fg(Color::Red),
        _ => dim(),
    };
    let summary = tool_summary(t);
    let head_w = 4 + width_of(&t.name) + 1;
    let room = width.saturating_sub(head_w + width_of(&right) + 2);
    let mut head = vec![
        Span::raw("  "),
        Span::styled(icon.to_string(), icon_style),
        Span::raw(" "),
        Span::styled(t.name.clone(), bold()),
        Span::raw(" "),
        Span::raw(truncate(&summary, room)),
    ];
    let used: usize = head.iter().map(|s| width_of(&s.content)).sum();
    if !right.is_empty() {
        head.push(Span::raw(
            " ".repeat(width.saturating_sub(used + width_of(&right)).max(1)),
        ));
        head.push(Span::styled(right, right_style));
    }
    let mut out = vec![Line::from(head)];
    let bar = [Span::styled("    │ ", dim())];
    if t.status == ToolStatus::Denied {
        for line in sanitize(t.output.trim()).split('\n') {
            out.extend(wrap_spans(
                &[Span::raw(line.to_string())],
                width,
                &bar,
                &bar,
            ));
        }
        out.extend(wrap_spans(
            &[
                Span::styled("hint: ", bold()),
                Span::styled(
                    denial_hint(app, t),
                    Style::default().add_modifier(Modifier::ITALIC),
                ),
            ],
            width,
            &[Span::raw("    ")],
            &[Span::raw("    ")],
        ));
        return out;
    }
    let body = sanitize(t.body().trim_end());
    let mut lines: Vec<&str> = if body.is_empty() {
        Vec::new()
    } else {
        body.split('\n').collect()
    };
    if t.expanded {
        if t.name == "exec" && width_of(&summary) > room {
            let cmd = format!("$ {summary}");
            out.extend(hard_wrap(&cmd, dim(), width, &bar, &bar));
        }
        let omitted = lines.len().saturating_sub(EXPANDED_MAX_LINES);
        lines.truncate(EXPANDED_MAX_LINES);
        for line in lines {
            out.extend(hard_wrap(line, Style::default(), width, &bar, &bar));
        }
        if omitted > 0 {
            out.push(Line::from(vec![
                Span::raw("    "),
                Span::styled(format!("… {omitted} more lines not shown"), dim()),
            ]));
        }
    } else if t.status == ToolStatus::Running {
        // Live output: its last lines, like `tail`.
        let earlier = lines.len().saturating_sub(COLLAPSED_LINES);
        if earlier > 0 {
            out.push(Line::from(vec![
                Span::raw("    "),
                Span::styled(format!("… {earlier} earlier lines"), dim()),
            ]));
        }
        for line in lines.iter().skip(earlier) {
            let mut spans = bar.to_vec();
            spans.push(Span::raw(truncate(line, width.saturating_sub(6))));
            out.push(Line::from(spans));
        }
    } else {
        let more = lines.len().saturating_sub(COLLAPSED_LINES);
        for line in lines.iter().take(COLLAPSED_LINES) {
            let mut spans = bar.to_vec();
            spans.push(Span::raw(truncate(line, width.saturating_sub(6))));
            out.push(Line::from(spans));
        }
        if more > 0 {
            let how = if last_tool {
                "Tab expands"
            } else {
                "Shift+Tab expands all"
            };
            out.push(Line::from(vec![
                Span::raw("    "),
                Span::styled(format!("… {more} more lines · {how}"), dim()),
            ]));
        }
    }
    out
}

/// The call of an approval request as data, never as markup: the tool and its
/// arguments separated by spaces (`exec git push origin main`, like
/// [`Approval::call_line`]), with every argument that is empty or holds spaces, quotes,
/// backslashes or characters that do not print quoted and escaped (`"a b"`, `"\u{202e}"`),
/// so `rm "a b"` cannot pass for `rm a b`.
pub fn approval_call(a: &Approval) -> String {
    let mut line = sanitize(&a.tool);
    for arg in &a.args {
        line.push(' ');
        let plain = !arg.is_empty()
            && arg.chars().all(|c| {
                !c.is_whitespace() && !matches!(c, '"' | '\'' | '\\') && c.escape_debug().len() == 1
            });
        if plain {
            line.push_str(arg);
        } else {
            line.push_str(&format!("{arg:?}"));
        }
    }
    line
}

/// `expires_at` (RFC 3339) as a local time of day, or as given when it does not parse.
pub fn expiry(at: &str, offset_secs: i32) -> String {
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(at) else {
        return sanitize(at);
    };
    let utc = t.with_timezone(&chrono::Utc);
    match chrono::FixedOffset::east_opt(offset_secs) {
        Some(o) => utc.with_timezone(&o).format("%H:%M:%S").to_string(),
        None => utc.format("%H:%M:%S").to_string(),
    }
}

/// An approval card: the call, where and why it asks, the id and expiry, then the keys
/// (on the card they act on, `target`) or how it was decided.
fn approval_lines(app: &App, c: &ApprovalCell, width: usize, target: bool) -> Vec<Line<'static>> {
    let a = &c.approval;
    let yellow = Style::default()
        .fg(Color::Yellow)
        .add_modifier(Modifier::BOLD);
    let green = Style::default().fg(Color::Green);
    let red = Style::default().fg(Color::Red);
    let (icon, icon_style) = match a.status {
        ApprovalStatus::Pending if c.closed => ("◌", dim()),
        ApprovalStatus::Pending => ("?", yellow),
        ApprovalStatus::Approved | ApprovalStatus::Consumed => ("✓", green),
        ApprovalStatus::Denied => ("⊘", red),
        ApprovalStatus::Expired => ("◌", dim()),
    };
    let indent = [Span::raw("    ")];
    let bar = [Span::styled("    │ ", dim())];
    let mut head = vec![
        Span::raw("  "),
        Span::styled(icon.to_string(), icon_style),
        Span::raw(" "),
        Span::styled(
            if a.status == ApprovalStatus::Pending && !c.closed {
                "approval needed"
            } else {
                "approval"
            }
            .to_string(),
            bold(),
        ),
    ];
    if a.agent != app.agent {
        head.push(Span::styled(
            format!(" · agent {}", sanitize(&a.agent)),
            dim(),
        ));
    }
    let mut out = vec![Line::from(head)];
    out.extend(hard_wrap(&approval_call(a), bold(), width, &bar, &bar));
    let mut detail = |label: &str, text: &str, style: Style| {
        out.extend(wrap_spans(
            &[
                Span::styled(format!("{label} "), dim()),
                Span::styled(sanitize(text).replace('\n', " ⏎ "), style),
            ],
            width,
            &bar,
            &bar,
        ));
    };
    if let Some(cwd) = &a.cwd {
        detail("cwd", cwd, Style::default());
    }
    if let Some(rule) = &a.rule {
        detail("rule", rule, Style::default());
    }
    let italic = Style::default().add_modifier(Modifier::ITALIC);
    match &a.justification {
        Some(j) => detail("why", j, italic),
        None if !a.reason.is_empty() => detail("why", &a.reason, italic),
        None => {}
    }
    let mut id = format!("id {}", sanitize(&a.id));
    if let Some(exec) = &a.exec {
        id.push_str(&format!(" · exec {}", sanitize(exec)));
    }
    if a.status == ApprovalStatus::Pending {
        id.push_str(&format!(
            " · expires {}",
            expiry(&a.expires_at, app.utc_offset_secs)
        ));
    }
    out.extend(wrap_spans(&[Span::styled(id, dim())], width, &bar, &bar));
    let by = a
        .decided_by
        .as_deref()
        .map(|b| format!(" by {}", sanitize(b)))
        .unwrap_or_default();
    let scope = a.scope.map(|s| s.as_str()).unwrap_or("once");
    let status: Vec<Span<'static>> = match a.status {
        ApprovalStatus::Pending => match (&c.sending, c.closed) {
            (Some(what), _) => vec![Span::styled(format!("sending: {what}…"), dim())],
            (None, true) => vec![Span::styled(
                "the answer ended before a decision".to_string(),
                dim(),
            )],
            (None, false) if target => {
                let mut keys = Vec::new();
                for (k, what) in [
                    ("y", "once"),
                    ("s", "session"),
                    ("h", "1 h"),
                    ("a", "always"),
                    ("n", "deny"),
                ] {
                    if !keys.is_empty() {
                        keys.push(Span::raw("  "));
                    }
                    keys.push(Span::styled(format!("[{k}]"), yellow));
                    keys.push(Span::raw(format!(" {what}")));
                }
                keys
            }
            (None, false) => vec![Span::styled(
                "waiting — answer the request above first".to_string(),
                dim(),
            )],
        },
        ApprovalStatus::Approved => vec![Span::styled(format!("approved ({scope}){by}"), green)],
        ApprovalStatus::Consumed => vec![Span::styled(
            format!("approved ({scope}){by} · used"),
            green,
        )],
        ApprovalStatus::Denied => {
            let mut text = format!("denied{by}");
            if let Some(r) = &a.decision_reason {
                text.push_str(&format!(": {}", sanitize(r)));
            }
            vec![Span::styled(text, red)]
        }
        ApprovalStatus::Expired => vec![Span::styled(
            "expired — nobody answered in time".to_string(),
            dim(),
        )],
    };
    if let Some(e) = &c.error {
        out.extend(wrap_spans(
            &[Span::styled(format!("✗ {}", sanitize(e)), red)],
            width,
            &indent,
            &indent,
        ));
    }
    out.extend(wrap_spans(&status, width, &indent, &indent));
    out
}

fn width_of(s: &str) -> usize {
    width(s)
}

fn denial_hint(app: &App, t: &ToolCell) -> String {
    if t.output.contains("denyTools") {
        format!(
            "The gateway's config takes this tool away from '{}' (agents.{}.denyTools). The model was told and may try another way.",
            app.agent, app.agent
        )
    } else if t.output.contains("is not allowed") {
        format!(
            "'{}' is not in agents.{}.tools of the gateway's config. The model was told and may try another way.",
            t.name, app.agent
        )
    } else {
        "The gateway's policy or a preToolExec hook refused this call. The model was told and may try another way.".to_string()
    }
}

fn error_lines(e: &ErrorCell, width: usize) -> Vec<Line<'static>> {
    let indent = [Span::raw("    ")];
    let mut out = vec![Line::from(vec![
        Span::raw("  "),
        Span::styled("✗ ", red_bold()),
        Span::styled(e.title.clone(), red_bold()),
    ])];
    for line in sanitize(e.message.trim()).split('\n') {
        out.extend(wrap_spans(
            &[Span::raw(line.to_string())],
            width,
            &indent,
            &indent,
        ));
    }
    if let Some(hint) = &e.hint {
        out.extend(wrap_spans(
            &[
                Span::styled("hint: ", bold()),
                Span::styled(
                    sanitize(hint),
                    Style::default().add_modifier(Modifier::ITALIC),
                ),
            ],
            width,
            &indent,
            &indent,
        ));
    }
    out
}

fn render_transcript(app: &App, frame: &mut Frame<'_>, area: Rect) {
    if area.height == 0 {
        return;
    }
    let lines = transcript_lines(app, area.width);
    let height = usize::from(area.height);
    let max_scroll = lines.len().saturating_sub(height);
    let scroll = app.scroll.min(max_scroll);
    let end = lines.len() - scroll;
    let start = end.saturating_sub(height);
    let visible: Vec<Line<'static>> = lines[start..end].to_vec();
    frame.render_widget(Paragraph::new(visible), area);
}

// ---------------------------------------------------------------- composer

/// The composer laid out: its visual lines and the cursor (row, column) among them.
#[derive(Debug)]
struct ComposerLayout {
    lines: Vec<Line<'static>>,
    cursor: (usize, usize),
}

fn composer_layout(app: &App, width: u16) -> ComposerLayout {
    let avail = usize::from(width).saturating_sub(3).max(4);
    let prompt = || Span::styled("› ", bold().fg(Color::Cyan));
    if app.composer.is_empty() {
        let placeholder = format!("Message {} — Enter sends, /help for commands", app.agent);
        return ComposerLayout {
            lines: vec![Line::from(vec![
                prompt(),
                Span::styled(truncate(&placeholder, avail), dim()),
            ])],
            cursor: (0, 0),
        };
    }
    let (crow, ccol) = app.composer.cursor();
    let mut lines = Vec::new();
    let mut cursor = (0, 0);
    for (i, line) in app.composer.lines().iter().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut chunks = Vec::new();
        let (mut start, mut w) = (0, 0);
        for (j, c) in chars.iter().enumerate() {
            let cw = crate::wrap::char_width(*c);
            if w + cw > avail && j > start {
                chunks.push((start, j));
                start = j;
                w = 0;
            }
            w += cw;
        }
        chunks.push((start, chars.len()));
        let n = chunks.len();
        for (k, (s, e)) in chunks.into_iter().enumerate() {
            let text: String = chars[s..e].iter().collect();
            if i == crow && ccol >= s && (ccol < e || k + 1 == n) {
                let x: usize = chars[s..ccol]
                    .iter()
                    .map(|c| crate::wrap::char_width(*c))
                    .sum();
                cursor = (lines.len(), x);
            }
            let lead = if i == 0 && k == 0 {
                prompt()
            } else {
                Span::raw("  ")
            };
            lines.push(Line::from(vec![lead, Span::raw(text)]));
        }
    }
    if cursor.1 >= avail {
        cursor = (cursor.0 + 1, 0);
        lines.insert(cursor.0, Line::from("  "));
    }
    ComposerLayout { lines, cursor }
}

fn render_composer(app: &App, frame: &mut Frame<'_>, area: Rect) {
    if area.height == 0 {
        return;
    }
    let title: Option<Line<'static>> = if let Some(n) = &app.notice {
        Some(Line::from(Span::styled(format!(" {n} "), bold())))
    } else if let Some(r) = &app.running {
        let what = if r.cancelling {
            "cancelling…".to_string()
        } else if app.approval_target().is_some() {
            if app.composer.is_empty() {
                "waiting for your approval · y/s/h/a/n answer".to_string()
            } else {
                "waiting for your approval · empty the input to answer".to_string()
            }
        } else if let Some(tool) = &r.tool {
            format!("running {tool} · Ctrl+C cancels")
        } else {
            "answering · Ctrl+C cancels".to_string()
        };
        Some(Line::from(vec![
            Span::raw(" "),
            Span::styled(spinner(app), Style::default().fg(Color::Cyan)),
            Span::raw(format!(" {what} ")),
        ]))
    } else if let Connection::Reconnecting { .. } = app.connection {
        Some(Line::from(Span::styled(
            " gateway unreachable — reconnecting… ",
            red_bold(),
        )))
    } else {
        None
    };
    let mut block = Block::default().borders(Borders::TOP).border_style(dim());
    if let Some(t) = title {
        block = block.title(t);
    }
    if app.scroll > 0 {
        block = block.title(
            Line::from(Span::styled(
                format!(" ↓ {} more lines · PgDn ", app.scroll),
                bold(),
            ))
            .right_aligned(),
        );
    }
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let layout = composer_layout(app, area.width);
    let rows = usize::from(inner.height);
    let offset = (layout.cursor.0 + 1).saturating_sub(rows);
    let visible: Vec<Line<'static>> = layout.lines.into_iter().skip(offset).take(rows).collect();
    frame.render_widget(Paragraph::new(visible), inner);
    if app.modal.is_none() && rows > 0 {
        let y = inner.y + (layout.cursor.0 - offset) as u16;
        let x = inner.x + 2 + layout.cursor.1 as u16;
        frame.set_cursor_position(Position::new(x.min(inner.right().saturating_sub(1)), y));
    }
}

// ---------------------------------------------------------------- status line

/// `1234` → `1.2k`.
pub fn tokens(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.1}k", n as f64 / 1_000.0),
        _ => format!("{:.1}M", n as f64 / 1_000_000.0),
    }
}

/// US dollars: four decimals below $1, else two.
pub fn dollars(cost: f64) -> String {
    if cost < 1.0 {
        format!("${cost:.4}")
    } else {
        format!("${cost:.2}")
    }
}

fn render_status(app: &App, frame: &mut Frame<'_>, area: Rect) {
    // (priority: lower survives longer, spans)
    let mut segs: Vec<(u8, Vec<Span<'static>>)> = vec![(
        0,
        vec![Span::styled(
            format!(" {} ", app.agent),
            bold().add_modifier(Modifier::REVERSED),
        )],
    )];
    let model = match &app.fallback {
        Some(f) => vec![Span::styled(
            format!("fallback → {f}"),
            bold().fg(Color::Magenta),
        )],
        None => vec![Span::raw(app.model())],
    };
    segs.push((0, model));
    if let Some(s) = &app.session {
        segs.push((4, vec![Span::styled(short_id(&s.id), dim())]));
    }
    if app.verbose {
        segs.push((5, vec![Span::styled("verbose", dim())]));
    }
    segs.push((
        1,
        vec![Span::raw(format!(
            "↑{} ↓{}",
            tokens(
                app.tokens.input_tokens
                    + app.tokens.cache_read_tokens
                    + app.tokens.cache_write_tokens
            ),
            tokens(app.tokens.output_tokens)
        ))],
    ));
    segs.push((2, vec![Span::raw(dollars(app.cost))]));
    let conn = match &app.connection {
        Connection::Connected => vec![
            Span::styled("●", Style::default().fg(Color::Green)),
            Span::raw(" connected "),
        ],
        Connection::Reconnecting { attempt, .. } => vec![Span::styled(
            if *attempt > 0 {
                format!("◌ reconnecting ({attempt})… ")
            } else {
                "◌ reconnecting… ".to_string()
            },
            red_bold(),
        )],
    };
    let total_w = usize::from(area.width);
    let w = |spans: &[Span<'static>]| spans.iter().map(|s| width(&s.content)).sum::<usize>();
    let conn_w = w(&conn);
    loop {
        let used: usize = segs.iter().map(|(_, s)| w(s) + 3).sum::<usize>() + conn_w;
        if used <= total_w {
            break;
        }
        let Some(max) = segs.iter().map(|(p, _)| *p).max().filter(|p| *p > 0) else {
            break;
        };
        if let Some(i) = segs.iter().rposition(|(p, _)| *p == max) {
            segs.remove(i);
        }
    }
    let mut spans: Vec<Span<'static>> = Vec::new();
    for (i, (_, s)) in segs.into_iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled(" · ", dim()));
        }
        spans.extend(s);
    }
    let used = w(&spans);
    spans.push(Span::raw(" ".repeat(total_w.saturating_sub(used + conn_w))));
    spans.extend(conn);
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

// ---------------------------------------------------------------- modals

fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

fn render_help(frame: &mut Frame<'_>, area: Rect, notice: Option<&str>) {
    let mut lines: Vec<Line<'static>> = Vec::new();
    if let Some(n) = notice {
        lines.push(Line::from(Span::styled(n.to_string(), red_bold())));
        lines.push(Line::default());
    }
    let section = |lines: &mut Vec<Line<'static>>, title: &str, rows: &[(&str, &str)]| {
        lines.push(Line::from(Span::styled(title.to_string(), bold())));
        for (k, d) in rows {
            lines.push(Line::from(vec![
                Span::styled(format!("  {k:<18}"), Style::default().fg(Color::Cyan)),
                Span::raw((*d).to_string()),
            ]));
        }
    };
    section(&mut lines, "Commands", COMMANDS);
    section(&mut lines, "Keys", KEYS);
    let w = lines
        .iter()
        .map(crate::wrap::line_width)
        .max()
        .unwrap_or(40) as u16
        + 4;
    let rect = centered(area, w, lines.len() as u16 + 2);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(" help ", bold()))
        .title_bottom(Line::from(Span::styled(" Esc closes ", dim())).right_aligned());
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(block.padding(ratatui::widgets::Padding::horizontal(1))),
        rect,
    );
}

/// `YYYY-MM-DD HH:MM` of a Unix-ms time at a fixed offset from UTC.
pub fn date(ms: i64, offset_secs: i32) -> String {
    let offset =
        chrono::FixedOffset::east_opt(offset_secs).or_else(|| chrono::FixedOffset::east_opt(0));
    match (chrono::DateTime::from_timestamp_millis(ms), offset) {
        (Some(t), Some(o)) => t.with_timezone(&o).format("%Y-%m-%d %H:%M").to_string(),
        _ => "?".to_string(),
    }
}

fn render_sessions(
    app: &App,
    frame: &mut Frame<'_>,
    area: Rect,
    list: &[SessionRecord],
    selected: usize,
) {
    let w = area.width.saturating_sub(4).min(100);
    let h = (list.len() as u16 + 2)
        .min(area.height.saturating_sub(2))
        .max(3);
    let rect = centered(area, w, h);
    let inner_w = usize::from(w.saturating_sub(4));
    let rows = usize::from(h.saturating_sub(2));
    let offset = (selected + 1).saturating_sub(rows);
    let current = app.session.as_ref().map(|s| s.id.as_str());
    let lines: Vec<Line<'static>> = list
        .iter()
        .enumerate()
        .skip(offset)
        .take(rows)
        .map(|(i, r)| {
            let mark = if Some(r.id.as_str()) == current {
                "●"
            } else {
                " "
            };
            let left = format!(
                "{mark} {:>2}. {}  ",
                i + 1,
                date(r.created, app.utc_offset_secs)
            );
            let right = format!("  {} msgs  {}", r.message_count, short_id(&r.id));
            let room = inner_w.saturating_sub(width(&left) + width(&right));
            let title = r
                .title
                .clone()
                .unwrap_or_else(|| "(no messages yet)".into());
            let title = truncate(&sanitize(&title).replace('\n', " "), room);
            let pad = " ".repeat(room.saturating_sub(width(&title)));
            let line = Line::from(vec![
                Span::raw(left),
                Span::styled(title, bold()),
                Span::raw(pad),
                Span::styled(right, dim()),
            ]);
            if i == selected {
                line.style(Style::default().add_modifier(Modifier::REVERSED))
            } else {
                line
            }
        })
        .collect();
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(format!(" sessions of {} ", app.agent), bold()))
        .title_bottom(
            Line::from(Span::styled(
                " ↑↓ select · Enter or 1-9 resume · Esc closes ",
                dim(),
            ))
            .right_aligned(),
        );
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(block.padding(ratatui::widgets::Padding::horizontal(1))),
        rect,
    );
}
