//! Word wrapping of styled text into terminal lines.
//!
//! The transcript is laid out here, not by ratatui's `Paragraph` wrapping, so the view
//! knows exactly how many rows every cell takes (scrolling and "N more lines" depend on
//! it). Widths are display columns (`unicode-width`), so CJK and emoji line up.

use ratatui::style::Style;
use ratatui::text::{Line, Span};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// Display width of a string in terminal columns.
pub fn width(s: &str) -> usize {
    UnicodeWidthStr::width(s)
}

/// Display width of a char (control characters count as zero).
pub fn char_width(c: char) -> usize {
    UnicodeWidthChar::width(c).unwrap_or(0)
}

/// Display width of a line of spans.
pub fn line_width(line: &Line<'_>) -> usize {
    line.spans.iter().map(|s| width(&s.content)).sum()
}

/// Shorten `s` to at most `max` columns, ending with `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut out = String::new();
    let mut w = 0;
    for c in s.chars() {
        let cw = char_width(c);
        if w + cw > max.saturating_sub(1) {
            break;
        }
        out.push(c);
        w += cw;
    }
    out.push('…');
    out
}

/// Replace tabs by spaces and drop other control characters (they would corrupt the
/// screen).
pub fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' => out.push_str("    "),
            '\n' => out.push('\n'),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// Collects styled characters into spans, merging runs of the same style.
#[derive(Debug, Default)]
struct LineBuilder {
    spans: Vec<Span<'static>>,
    current: String,
    style: Style,
    width: usize,
}

impl LineBuilder {
    fn push(&mut self, c: char, style: Style) {
        if style != self.style && !self.current.is_empty() {
            self.flush();
        }
        self.style = style;
        self.current.push(c);
        self.width += char_width(c);
    }

    fn flush(&mut self) {
        if !self.current.is_empty() {
            self.spans
                .push(Span::styled(std::mem::take(&mut self.current), self.style));
        }
    }

    fn is_empty(&self) -> bool {
        self.width == 0 && self.current.is_empty() && self.spans.is_empty()
    }

    fn finish(mut self, prefix: &[Span<'static>]) -> Line<'static> {
        self.flush();
        let mut spans = prefix.to_vec();
        spans.extend(self.spans);
        Line::from(spans)
    }
}

/// Word-wrap `spans` to `width` columns. The first line starts with `first`, the
/// following ones with `rest` (both count against the width). Runs of spaces at a break
/// are dropped; words longer than a line are split.
pub fn wrap_spans(
    spans: &[Span<'_>],
    width: usize,
    first: &[Span<'static>],
    rest: &[Span<'static>],
) -> Vec<Line<'static>> {
    // Tokens: runs of spaces or of non-spaces, each a list of (char, style).
    let mut tokens: Vec<(bool, Vec<(char, Style)>)> = Vec::new();
    for span in spans {
        for c in span.content.chars() {
            let space = c == ' ';
            match tokens.last_mut() {
                Some((s, chars)) if *s == space => chars.push((c, span.style)),
                _ => tokens.push((space, vec![(c, span.style)])),
            }
        }
    }
    let prefix_w = |p: &[Span<'static>]| p.iter().map(|s| self::width(&s.content)).sum::<usize>();
    let avail_first = width.saturating_sub(prefix_w(first)).max(1);
    let avail_rest = width.saturating_sub(prefix_w(rest)).max(1);

    let mut lines = Vec::new();
    let mut line = LineBuilder::default();
    let mut avail = avail_first;
    let mut is_first = true;
    let mut break_line = |line: &mut LineBuilder, avail: &mut usize, is_first: &mut bool| {
        let done = std::mem::take(line);
        lines.push(done.finish(if *is_first { first } else { rest }));
        *is_first = false;
        *avail = avail_rest;
    };
    // Spaces wait here until a word follows them on the same line (no trailing spaces).
    let mut pending: Vec<(char, Style)> = Vec::new();
    for (space, chars) in tokens {
        if space {
            // Leading spaces of the very first line are kept (indentation).
            if !line.is_empty() || is_first {
                pending.extend(chars);
            }
            continue;
        }
        let w: usize = chars.iter().map(|(c, _)| char_width(*c)).sum();
        let pw: usize = pending.iter().map(|(c, _)| char_width(*c)).sum();
        let spaces = std::mem::take(&mut pending);
        if line.width + pw + w <= avail {
            for (c, st) in spaces.into_iter().chain(chars) {
                line.push(c, st);
            }
            continue;
        }
        if w <= avail_rest && !line.is_empty() {
            break_line(&mut line, &mut avail, &mut is_first);
            for (c, st) in chars {
                line.push(c, st);
            }
            continue;
        }
        // A word longer than a line: split it.
        if line.width + pw < avail {
            for (c, st) in spaces {
                line.push(c, st);
            }
        }
        for (c, st) in chars {
            let cw = char_width(c);
            if line.width + cw > avail && !line.is_empty() {
                break_line(&mut line, &mut avail, &mut is_first);
            }
            line.push(c, st);
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line.finish(if is_first { first } else { rest }));
    }
    lines
}

/// Split `text` at every `width` columns exactly (code, where spaces matter).
pub fn hard_wrap(
    text: &str,
    style: Style,
    width: usize,
    first: &[Span<'static>],
    rest: &[Span<'static>],
) -> Vec<Line<'static>> {
    let prefix_w = |p: &[Span<'static>]| p.iter().map(|s| self::width(&s.content)).sum::<usize>();
    let mut lines = Vec::new();
    let mut line = LineBuilder::default();
    let mut avail = width.saturating_sub(prefix_w(first)).max(1);
    let mut is_first = true;
    for c in text.chars() {
        let cw = char_width(c);
        if line.width + cw > avail && !line.is_empty() {
            lines.push(std::mem::take(&mut line).finish(if is_first { first } else { rest }));
            is_first = false;
            avail = width.saturating_sub(prefix_w(rest)).max(1);
        }
        line.push(c, style);
    }
    lines.push(line.finish(if is_first { first } else { rest }));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    #[test]
    fn wraps_words_and_keeps_prefixes() {
        let spans = [Span::raw("the quick brown fox jumps over the lazy dog")];
        let lines = wrap_spans(&spans, 12, &[Span::raw("> ")], &[Span::raw("  ")]);
        assert_eq!(
            text(&lines),
            [
                "> the quick",
                "  brown fox",
                "  jumps over",
                "  the lazy",
                "  dog"
            ]
        );
        assert!(lines.iter().all(|l| line_width(l) <= 12));
    }

    #[test]
    fn splits_long_words_and_wide_chars() {
        let lines = wrap_spans(&[Span::raw("abcdefghij")], 4, &[], &[]);
        assert_eq!(text(&lines), ["abcd", "efgh", "ij"]);
        let lines = wrap_spans(&[Span::raw("日本語テキスト")], 6, &[], &[]);
        assert_eq!(text(&lines), ["日本語", "テキス", "ト"]);
    }

    #[test]
    fn empty_text_is_one_line() {
        assert_eq!(text(&wrap_spans(&[], 10, &[Span::raw("x")], &[])), ["x"]);
        assert_eq!(
            text(&hard_wrap("  ab cd", Style::default(), 4, &[], &[])),
            ["  ab", " cd"]
        );
    }

    #[test]
    fn truncates_with_ellipsis() {
        assert_eq!(truncate("hello world", 8), "hello w…");
        assert_eq!(truncate("short", 8), "short");
        assert_eq!(sanitize("a\tb\x1b[31m"), "a    b[31m");
    }
}
