//! A small markdown renderer for the transcript: headings, emphasis (`**bold**`,
//! `*italic*`, `_italic_`, `~~strike~~`), inline code, links, fenced code blocks, lists,
//! block quotes and rules — the subset models actually write.
//!
//! It works line by line and never fails, so it renders half-streamed text as well as
//! finished answers (an unclosed code fence simply runs to the end; an unclosed `**` stays
//! literal). Source line breaks are kept. Styles use modifiers and the terminal's own
//! palette (no RGB), so light and dark themes both stay readable.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};

use crate::wrap::{hard_wrap, sanitize, wrap_spans};

/// Style of inline code and code blocks.
pub fn code_style() -> Style {
    Style::default().fg(Color::Cyan)
}

/// Render `text` to lines at most `width` columns wide, every line starting with
/// `indent` (counted in the width).
pub fn render(text: &str, width: usize, indent: &[Span<'static>]) -> Vec<Line<'static>> {
    let text = sanitize(text);
    let mut out: Vec<Line<'static>> = Vec::new();
    let mut fence: Option<String> = None;
    let mut last_blank = true;
    for raw in text.split('\n') {
        let trimmed = raw.trim_start();
        if let Some(f) = &fence {
            if trimmed.starts_with(f.as_str())
                && trimmed.trim_end().chars().all(|c| c == '`' || c == '~')
            {
                fence = None;
                continue;
            }
            let mut first = indent.to_vec();
            first.push(Span::styled(
                "│ ",
                Style::default().add_modifier(Modifier::DIM),
            ));
            out.extend(hard_wrap(raw, code_style(), width, &first, &first));
            last_blank = false;
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            let marker: String = trimmed
                .chars()
                .take_while(|c| *c == '`' || *c == '~')
                .collect();
            let lang = trimmed[marker.len()..].trim();
            fence = Some(marker);
            if !lang.is_empty() {
                let mut spans = indent.to_vec();
                spans.push(Span::styled(
                    format!("╭ {lang}"),
                    Style::default().add_modifier(Modifier::DIM),
                ));
                out.push(Line::from(spans));
            }
            last_blank = false;
            continue;
        }
        if trimmed.trim().is_empty() {
            if !last_blank {
                out.push(Line::from(indent.to_vec()));
            }
            last_blank = true;
            continue;
        }
        last_blank = false;
        if let Some((level, rest)) = heading(trimmed) {
            let mut style = Style::default().add_modifier(Modifier::BOLD);
            if level == 1 {
                style = style.add_modifier(Modifier::UNDERLINED);
            }
            out.extend(wrap_spans(&inline(rest, style), width, indent, indent));
            continue;
        }
        if is_rule(trimmed) {
            let used: usize = indent.iter().map(|s| crate::wrap::width(&s.content)).sum();
            let mut spans = indent.to_vec();
            spans.push(Span::styled(
                "─".repeat(width.saturating_sub(used).min(60)),
                Style::default().add_modifier(Modifier::DIM),
            ));
            out.push(Line::from(spans));
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('>') {
            let mut first = indent.to_vec();
            first.push(Span::styled(
                "▎ ",
                Style::default().add_modifier(Modifier::DIM),
            ));
            let style = Style::default().add_modifier(Modifier::ITALIC);
            out.extend(wrap_spans(
                &inline(rest.trim_start(), style),
                width,
                &first,
                &first,
            ));
            continue;
        }
        if let Some((marker, rest)) = list_item(trimmed) {
            let depth = (raw.len() - trimmed.len()) / 2;
            let pad = "  ".repeat(depth.min(8));
            let mut first = indent.to_vec();
            first.push(Span::raw(pad.clone()));
            first.push(Span::styled(
                marker.clone(),
                Style::default().add_modifier(Modifier::BOLD),
            ));
            let mut rest_prefix = indent.to_vec();
            rest_prefix.push(Span::raw(format!(
                "{pad}{}",
                " ".repeat(crate::wrap::width(&marker))
            )));
            out.extend(wrap_spans(
                &inline(rest, Style::default()),
                width,
                &first,
                &rest_prefix,
            ));
            continue;
        }
        out.extend(wrap_spans(
            &inline(trimmed, Style::default()),
            width,
            indent,
            indent,
        ));
    }
    while out.len() > 1 && out.last().is_some_and(|l| is_blank(l, indent)) {
        out.pop();
    }
    out
}

fn is_blank(line: &Line<'_>, indent: &[Span<'static>]) -> bool {
    line.spans.len() == indent.len()
}

/// `# Title` → (1, "Title").
fn heading(line: &str) -> Option<(usize, &str)> {
    let level = line.chars().take_while(|c| *c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &line[level..];
    if rest.is_empty() {
        return Some((level, ""));
    }
    rest.strip_prefix(' ')
        .map(|r| (level, r.trim().trim_end_matches('#').trim_end()))
}

/// `---`, `***`, `___` (three or more, spaces allowed).
fn is_rule(line: &str) -> bool {
    let chars: Vec<char> = line.chars().filter(|c| !c.is_whitespace()).collect();
    chars.len() >= 3 && matches!(chars[0], '-' | '*' | '_') && chars.iter().all(|c| *c == chars[0])
}

/// `- x`, `* x`, `+ x` → ("• ", "x"); `12. x` / `12) x` → ("12. ", "x").
fn list_item(line: &str) -> Option<(String, &str)> {
    for bullet in ["- ", "* ", "+ "] {
        if let Some(rest) = line.strip_prefix(bullet) {
            return Some(("• ".to_string(), rest));
        }
    }
    let digits = line.chars().take_while(|c| c.is_ascii_digit()).count();
    if (1..=9).contains(&digits) {
        let rest = &line[digits..];
        for sep in [". ", ") "] {
            if let Some(r) = rest.strip_prefix(sep) {
                return Some((format!("{}. ", &line[..digits]), r));
            }
        }
    }
    None
}

/// Inline markup of one line as styled spans on top of `base`.
pub fn inline(text: &str, base: Style) -> Vec<Span<'static>> {
    let chars: Vec<char> = text.chars().collect();
    let mut spans = Vec::new();
    parse_inline(&chars, base, &mut spans);
    spans
}

fn flush(buf: &mut String, style: Style, out: &mut Vec<Span<'static>>) {
    if !buf.is_empty() {
        out.push(Span::styled(std::mem::take(buf), style));
    }
}

fn find_run(chars: &[char], from: usize, c: char, n: usize) -> Option<usize> {
    let mut i = from;
    while i + n <= chars.len() {
        if chars[i..i + n].iter().all(|x| *x == c) {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn parse_inline(chars: &[char], base: Style, out: &mut Vec<Span<'static>>) {
    let mut buf = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' if i + 1 < chars.len() && chars[i + 1].is_ascii_punctuation() => {
                buf.push(chars[i + 1]);
                i += 2;
                continue;
            }
            '`' => {
                let n = chars[i..].iter().take_while(|x| **x == '`').count();
                if let Some(end) = find_run(chars, i + n, '`', n) {
                    flush(&mut buf, base, out);
                    let code: String = chars[i + n..end].iter().collect();
                    out.push(Span::styled(code, base.patch(code_style())));
                    i = end + n;
                    continue;
                }
                buf.extend(&chars[i..i + n]);
                i += n;
                continue;
            }
            '*' | '_' | '~' => {
                let run = chars[i..].iter().take_while(|x| **x == c).count();
                let n = if c == '~' {
                    if run >= 2 {
                        2
                    } else {
                        0
                    }
                } else {
                    run.min(3)
                };
                let opens = n > 0
                    && chars.get(i + n).is_some_and(|x| !x.is_whitespace())
                    && (c != '_' || i == 0 || !chars[i - 1].is_alphanumeric());
                if opens {
                    if let Some(end) = find_closer(chars, i + n + 1, c, n) {
                        flush(&mut buf, base, out);
                        let style = match (c, n) {
                            ('~', _) => base.add_modifier(Modifier::CROSSED_OUT),
                            (_, 1) => base.add_modifier(Modifier::ITALIC),
                            (_, 2) => base.add_modifier(Modifier::BOLD),
                            _ => base.add_modifier(Modifier::BOLD | Modifier::ITALIC),
                        };
                        parse_inline(&chars[i + n..end], style, out);
                        i = end + n;
                        continue;
                    }
                }
                buf.extend(&chars[i..i + run]);
                i += run;
                continue;
            }
            '[' => {
                if let Some(close) = chars[i + 1..].iter().position(|x| *x == ']') {
                    let close = i + 1 + close;
                    if chars.get(close + 1) == Some(&'(') {
                        if let Some(end) = chars[close + 2..].iter().position(|x| *x == ')') {
                            let end = close + 2 + end;
                            flush(&mut buf, base, out);
                            let label: String = chars[i + 1..close].iter().collect();
                            let url: String = chars[close + 2..end].iter().collect();
                            parse_inline(
                                &chars[i + 1..close],
                                base.add_modifier(Modifier::UNDERLINED),
                                out,
                            );
                            if !url.is_empty() && url != label {
                                out.push(Span::styled(
                                    format!(" ({url})"),
                                    base.add_modifier(Modifier::DIM),
                                ));
                            }
                            i = end + 1;
                            continue;
                        }
                    }
                }
                buf.push(c);
            }
            _ => buf.push(c),
        }
        i += 1;
    }
    flush(&mut buf, base, out);
}

/// The first run of `n` × `c` at or after `from` that can close an emphasis.
fn find_closer(chars: &[char], from: usize, c: char, n: usize) -> Option<usize> {
    let mut at = from;
    while let Some(end) = find_run(chars, at, c, n) {
        let closes = !chars[end - 1].is_whitespace()
            && (c != '_' || chars.get(end + n).is_none_or(|x| !x.is_alphanumeric()))
            && chars.get(end + n) != Some(&c);
        if closes {
            return Some(end);
        }
        at = end + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    fn styled(spans: &[Span<'_>]) -> Vec<(String, Modifier)> {
        spans
            .iter()
            .map(|s| (s.content.to_string(), s.style.add_modifier))
            .collect()
    }

    #[test]
    fn emphasis_and_code() {
        let s = inline("a **bold** and *it* `x*y` _u_ snake_case", Style::default());
        assert_eq!(
            styled(&s),
            [
                ("a ".into(), Modifier::empty()),
                ("bold".into(), Modifier::BOLD),
                (" and ".into(), Modifier::empty()),
                ("it".into(), Modifier::ITALIC),
                (" ".into(), Modifier::empty()),
                ("x*y".into(), Modifier::empty()),
                (" ".into(), Modifier::empty()),
                ("u".into(), Modifier::ITALIC),
                (" snake_case".into(), Modifier::empty()),
            ]
        );
        assert_eq!(s[5].style.fg, Some(Color::Cyan));
    }

    #[test]
    fn unclosed_markers_stay_literal() {
        let s = inline("2 * 3 = 6 and **half", Style::default());
        let text: String = s.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "2 * 3 = 6 and **half");
        let s = inline("`open", Style::default());
        assert_eq!(s[0].content, "`open");
    }

    #[test]
    fn links_show_their_target() {
        let s = inline("see [docs](https://x.dev)", Style::default());
        let text: String = s.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "see docs (https://x.dev)");
    }

    #[test]
    fn blocks() {
        let md = "# Title\n\nSome text.\n\n- one\n- two\n  - nested\n1. first\n\n```rust\nfn main() {}\n```\n> quoted\n---";
        assert_eq!(
            plain(&render(md, 40, &[])),
            [
                "Title",
                "",
                "Some text.",
                "",
                "• one",
                "• two",
                "  • nested",
                "1. first",
                "",
                "╭ rust",
                "│ fn main() {}",
                "▎ quoted",
                "────────────────────────────────────────",
            ]
        );
    }

    #[test]
    fn streaming_fence_runs_to_the_end() {
        let lines = render("text\n```\nlet x = 1;", 30, &[Span::raw("  ")]);
        assert_eq!(plain(&lines), ["  text", "  │ let x = 1;"]);
    }

    #[test]
    fn list_items_wrap_under_their_text() {
        let lines = render("- a long item that wraps", 12, &[]);
        assert_eq!(plain(&lines), ["• a long", "  item that", "  wraps"]);
    }
}
