//! Markdown → Telegram HTML, and splitting long answers into messages Telegram accepts.
//!
//! Models answer in Markdown; Telegram renders a small HTML subset (`parse_mode: HTML`):
//! `b`, `i`, `s`, `code`, `pre`, `a` and a few more, properly nested, with every `<`, `>`
//! and `&` outside tags written as an entity. [`markdown_to_html`] produces exactly that:
//! every construct it emits is opened and closed around content rendered by the same
//! rules, so the output is balanced whatever the input; markers it cannot match stay
//! literal text (escaped), and `snake_case_names` never turn italic.
//!
//! | Markdown | Telegram HTML |
//! |---|---|
//! | `**bold**`, `__bold__` | `<b>bold</b>` |
//! | `*italic*`, `_italic_` | `<i>italic</i>` |
//! | `***both***` | `<b><i>both</i></b>` |
//! | `~~struck~~` | `<s>struck</s>` |
//! | `` `code` `` | `<code>code</code>` |
//! | fenced code with a language | `<pre><code class="language-rust">…</code></pre>` |
//! | `[text](https://…)` | `<a href="https://…">text</a>` |
//! | `# Heading` | `<b>Heading</b>` |
//! | `- item`, `* item` | `• item` |
//!
//! [`render_chunks`] splits an answer into messages of at most [`MAX_MESSAGE_LEN`]
//! characters (counted in UTF-16 code units, as Telegram does, on the HTML source — so
//! the limit holds before and after Telegram parses the entities). It splits between
//! lines where it can, then between words, then inside a word; a fenced code block that
//! does not fit is closed at the split and reopened (same language) in the next message,
//! so every message is valid HTML on its own. Each chunk also carries a plain-text
//! version used when Telegram refuses the HTML anyway.

/// Telegram's limit for one message text.
pub const MAX_MESSAGE_LEN: usize = 4096;

/// How deep inline constructs may nest before the rest is rendered as plain text.
const MAX_DEPTH: usize = 8;

/// One message of a split answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Chunk {
    /// Telegram HTML (`parse_mode: HTML`).
    pub html: String,
    /// The same content as plain text (the Markdown source of the piece), sent without
    /// `parse_mode` when Telegram refuses the HTML.
    pub plain: String,
}

/// Length as Telegram counts it (UTF-16 code units).
pub fn tg_len(s: &str) -> usize {
    s.encode_utf16().count()
}

/// Escape text for Telegram HTML: `&`, `<`, `>`.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        c => out.push(c),
    }
}

/// Escape an attribute value (also `"`).
fn escape_attr(s: &str) -> String {
    escape_html(s).replace('"', "&quot;")
}

/// Render a whole Markdown text as Telegram HTML (no length limit; see
/// [`render_chunks`]).
pub fn markdown_to_html(md: &str) -> String {
    blocks(md)
        .iter()
        .map(|b| match b {
            Block::Line(l) => render_line(l),
            Block::Code { lang, lines, .. } => code_html(lang, &lines.join("\n")),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Split `md` into messages of at most `limit` characters (UTF-16 code units) of HTML,
/// never breaking a code block or an HTML construct. An empty answer gives no chunks.
pub fn render_chunks(md: &str, limit: usize) -> Vec<Chunk> {
    let limit = limit.max(64);
    let mut units: Vec<Chunk> = Vec::new();
    for block in blocks(md) {
        match block {
            Block::Line(line) => units.extend(line_units(&line, limit)),
            Block::Code { fence, lang, lines } => {
                units.extend(code_units(&fence, &lang, &lines, limit))
            }
        }
    }
    // Pack units into messages, joined by newlines.
    let mut out: Vec<Chunk> = Vec::new();
    let mut current: Option<Chunk> = None;
    for u in units {
        current = Some(match current.take() {
            None => u,
            Some(mut c) => {
                if tg_len(&c.html) + 1 + tg_len(&u.html) <= limit
                    && tg_len(&c.plain) + 1 + tg_len(&u.plain) <= limit
                {
                    c.html.push('\n');
                    c.html.push_str(&u.html);
                    c.plain.push('\n');
                    c.plain.push_str(&u.plain);
                    c
                } else {
                    out.push(c);
                    u
                }
            }
        });
    }
    out.extend(current);
    // Leading/trailing blank lines are not worth a message.
    out.retain(|c| !c.plain.trim().is_empty() || !c.html.trim().is_empty());
    for c in &mut out {
        let trimmed_html = c.html.trim_matches('\n').to_string();
        let trimmed_plain = c.plain.trim_matches('\n').to_string();
        c.html = trimmed_html;
        c.plain = trimmed_plain;
    }
    out
}

/// Plain text cut into pieces of at most `limit` UTF-16 units, preferring line breaks,
/// then spaces.
pub fn split_plain(text: &str, limit: usize) -> Vec<String> {
    let limit = limit.max(16);
    let mut out = Vec::new();
    let mut rest = text;
    while tg_len(rest) > limit {
        // The longest prefix within the limit.
        let mut end = 0;
        let mut units = 0;
        for (i, c) in rest.char_indices() {
            units += c.len_utf16();
            if units > limit {
                break;
            }
            end = i + c.len_utf8();
        }
        let window = &rest[..end];
        let cut = window
            .rfind('\n')
            .filter(|&i| i > end / 2)
            .or_else(|| window.rfind(' ').filter(|&i| i > end / 2))
            .map(|i| i + 1)
            .unwrap_or(end);
        out.push(rest[..cut].trim_end_matches('\n').to_string());
        rest = &rest[cut..];
    }
    if !rest.is_empty() || out.is_empty() {
        out.push(rest.to_string());
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Block {
    Line(String),
    Code {
        /// The opening fence (```` ``` ```` or `~~~`, possibly longer).
        fence: String,
        lang: String,
        lines: Vec<String>,
    },
}

/// Lines and fenced code blocks. An unclosed fence runs to the end of the text.
fn blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = md.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let fence_char = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let fence_len = fence_char
            .map(|f| trimmed.chars().take_while(|c| *c == f).count())
            .unwrap_or(0);
        if let (Some(f), true) = (fence_char, fence_len >= 3) {
            let fence: String = std::iter::repeat_n(f, fence_len).collect();
            let info = trimmed[fence.len()..].trim();
            if f == '`' && info.contains('`') {
                // Not a fence: inline code on one line (```x```).
                out.push(Block::Line(line.to_string()));
                continue;
            }
            let lang: String = info
                .split_whitespace()
                .next()
                .unwrap_or("")
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '_' | '#' | '.'))
                .collect();
            let mut body = Vec::new();
            for l in lines.by_ref() {
                let t = l.trim();
                if t.len() >= fence.len() && t.chars().all(|c| c == f) {
                    break;
                }
                body.push(l.to_string());
            }
            out.push(Block::Code {
                fence,
                lang,
                lines: body,
            });
        } else {
            out.push(Block::Line(line.to_string()));
        }
    }
    out
}

fn code_open(lang: &str) -> String {
    if lang.is_empty() {
        "<pre><code>".to_string()
    } else {
        format!("<pre><code class=\"language-{}\">", escape_attr(lang))
    }
}

const CODE_CLOSE: &str = "</code></pre>";

fn code_html(lang: &str, code: &str) -> String {
    format!("{}{}{CODE_CLOSE}", code_open(lang), escape_html(code))
}

fn fence_plain(fence: &str, lang: &str, code: &str) -> String {
    format!("{fence}{lang}\n{code}\n{fence}")
}

/// A code block as one or more self-contained units, each within `limit`.
fn code_units(fence: &str, lang: &str, lines: &[String], limit: usize) -> Vec<Chunk> {
    let whole = lines.join("\n");
    let html = code_html(lang, &whole);
    let plain = fence_plain(fence, lang, &whole);
    if tg_len(&html) <= limit && tg_len(&plain) <= limit {
        return vec![Chunk { html, plain }];
    }
    // Room for code per piece, in escaped (HTML) units; the plain form is never longer
    // than the HTML form for the same code, except for its fences.
    let overhead =
        (tg_len(&code_open(lang)) + tg_len(CODE_CLOSE)).max(tg_len(&fence_plain(fence, lang, "")));
    let room = limit.saturating_sub(overhead).max(16);
    // Cut the code into pieces whose escaped length fits `room`, at line ends where
    // possible.
    let mut pieces: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut current_len = 0usize;
    for line in lines {
        let esc = tg_len(&escape_html(line));
        let sep = usize::from(!current.is_empty());
        if current_len + sep + esc <= room {
            if sep == 1 {
                current.push('\n');
            }
            current.push_str(line);
            current_len += sep + esc;
            continue;
        }
        if !current.is_empty() {
            pieces.push(std::mem::take(&mut current));
            current_len = 0;
        }
        if esc <= room {
            current.push_str(line);
            current_len = esc;
            continue;
        }
        // A single line longer than a message: cut it by characters.
        for c in line.chars() {
            let w = tg_len(&escape_html(c.encode_utf8(&mut [0u8; 4])));
            if current_len + w > room {
                pieces.push(std::mem::take(&mut current));
                current_len = 0;
            }
            current.push(c);
            current_len += w;
        }
    }
    if !current.is_empty() || pieces.is_empty() {
        pieces.push(current);
    }
    pieces
        .into_iter()
        .map(|code| Chunk {
            html: code_html(lang, &code),
            plain: fence_plain(fence, lang, &code),
        })
        .collect()
}

/// One Markdown line (outside code blocks) as units within `limit`.
fn line_units(line: &str, limit: usize) -> Vec<Chunk> {
    let html = render_line(line);
    if tg_len(&html) <= limit && tg_len(line) <= limit {
        return vec![Chunk {
            html,
            plain: line.to_string(),
        }];
    }
    // Too long: split between words, rendering each piece on its own.
    let mut out = Vec::new();
    let mut piece = String::new();
    for word in line.split_inclusive(' ') {
        let candidate = format!("{piece}{word}");
        if tg_len(&render_line(candidate.trim_end())) <= limit && tg_len(&candidate) <= limit {
            piece = candidate;
            continue;
        }
        if !piece.trim().is_empty() {
            let p = piece.trim_end().to_string();
            out.push(Chunk {
                html: render_line(&p),
                plain: p,
            });
        }
        let w = word.trim_end();
        if tg_len(&render_line(w)) <= limit && tg_len(w) <= limit {
            piece = word.to_string();
            continue;
        }
        // One "word" longer than a message: plain escaped text, cut by characters.
        let mut part = String::new();
        let mut part_len = 0usize;
        for c in w.chars() {
            let cl = tg_len(&escape_html(c.encode_utf8(&mut [0u8; 4])));
            if part_len + cl > limit {
                out.push(Chunk {
                    html: escape_html(&part),
                    plain: std::mem::take(&mut part),
                });
                part_len = 0;
            }
            part.push(c);
            part_len += cl;
        }
        piece = String::new();
        if !part.is_empty() {
            out.push(Chunk {
                html: escape_html(&part),
                plain: part,
            });
        }
    }
    if !piece.trim().is_empty() {
        let p = piece.trim_end().to_string();
        out.push(Chunk {
            html: render_line(&p),
            plain: p,
        });
    }
    out
}

/// One line outside code blocks: headings, bullets, rules, then inline formatting.
fn render_line(line: &str) -> String {
    let trimmed = line.trim_start();
    let indent = &line[..line.len() - trimmed.len()];
    // Horizontal rule.
    let compact: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.len() >= 3
        && (compact.chars().all(|c| c == '-')
            || compact.chars().all(|c| c == '*')
            || compact.chars().all(|c| c == '_'))
    {
        return "──────────".to_string();
    }
    // Heading.
    let hashes = trimmed.chars().take_while(|c| *c == '#').count();
    if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
        let text = trimmed[hashes..].trim().trim_end_matches('#').trim_end();
        return format!("<b>{}</b>", inline(text));
    }
    // Bullet.
    for marker in ["- ", "* ", "+ "] {
        if let Some(rest) = trimmed.strip_prefix(marker) {
            return format!("{indent}• {}", inline(rest));
        }
    }
    format!("{indent}{}", inline(trimmed))
}

/// Inline Markdown of one line as Telegram HTML.
pub fn inline(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 16);
    render_inline(&chars, &mut out, 0, false);
    out
}

fn is_word(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric())
}

fn is_space(c: Option<&char>) -> bool {
    c.is_none_or(|c| c.is_whitespace())
}

/// Length of the run of `ch` starting at `i`.
fn run_len(c: &[char], i: usize, ch: char) -> usize {
    c[i..].iter().take_while(|x| **x == ch).count()
}

/// Where the code span starting with a run of `n` backticks at `i` closes (the index of
/// the closing run), if it does.
fn code_span_end(c: &[char], i: usize, n: usize) -> Option<usize> {
    let mut j = i + n;
    while j < c.len() {
        if c[j] == '`' {
            let r = run_len(c, j, '`');
            if r == n {
                return Some(j);
            }
            j += r;
        } else {
            j += 1;
        }
    }
    None
}

/// Find the closing delimiter `delim` (a run of exactly `delim.len()` of its char) for
/// content starting at `from`, skipping code spans. `underscore` applies the word rule.
fn find_closer(c: &[char], from: usize, ch: char, n: usize, underscore: bool) -> Option<usize> {
    let mut j = from;
    while j < c.len() {
        if c[j] == '`' {
            let r = run_len(c, j, '`');
            j = code_span_end(c, j, r).map(|e| e + r).unwrap_or(j + r);
            continue;
        }
        if c[j] == '\\' {
            j += 2;
            continue;
        }
        if c[j] == ch {
            let r = run_len(c, j, ch);
            let before = j.checked_sub(1).and_then(|k| c.get(k));
            let after = c.get(j + r);
            let closes =
                r == n && j > from && !is_space(before) && (!underscore || !is_word(after));
            if closes {
                return Some(j);
            }
            // A run of three closes both bold and italic (`***x***`).
            if r == 3 && (n == 1 || n == 2) && j > from && !is_space(before) {
                return Some(if n == 2 { j + 1 } else { j + 2 });
            }
            j += r;
            continue;
        }
        j += 1;
    }
    None
}

fn link_at(c: &[char], i: usize) -> Option<(usize, usize, String)> {
    // [text](url): returns (end of text, index after ')', url)
    let mut depth = 0usize;
    let mut j = i + 1;
    let text_end = loop {
        match c.get(j)? {
            '[' => depth += 1,
            ']' if depth == 0 => break j,
            ']' => depth -= 1,
            '`' => {
                let r = run_len(c, j, '`');
                j = code_span_end(c, j, r)
                    .map(|e| e + r - 1)
                    .unwrap_or(j + r - 1);
            }
            _ => {}
        }
        j += 1;
    };
    if text_end == i + 1 || c.get(text_end + 1) != Some(&'(') {
        return None;
    }
    let mut k = text_end + 2;
    let mut parens = 0usize;
    let url_end = loop {
        match c.get(k)? {
            '(' => parens += 1,
            ')' if parens == 0 => break k,
            ')' => parens -= 1,
            w if w.is_whitespace() => return None,
            _ => {}
        }
        k += 1;
    };
    let url: String = c[text_end + 2..url_end].iter().collect();
    let lower = url.to_ascii_lowercase();
    let allowed = ["http://", "https://", "tg://", "mailto:"]
        .iter()
        .any(|p| lower.starts_with(p));
    if !allowed || url.len() <= 8 {
        return None;
    }
    Some((text_end, url_end + 1, url))
}

fn render_inline(c: &[char], out: &mut String, depth: usize, in_link: bool) {
    if depth > MAX_DEPTH {
        for ch in c {
            push_escaped(out, *ch);
        }
        return;
    }
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        match ch {
            '\\' if c.get(i + 1).is_some_and(|n| n.is_ascii_punctuation()) => {
                push_escaped(out, c[i + 1]);
                i += 2;
            }
            '`' => {
                let n = run_len(c, i, '`');
                match code_span_end(c, i, n) {
                    Some(end) => {
                        let mut code: String = c[i + n..end].iter().collect();
                        if code.len() >= 2
                            && code.starts_with(' ')
                            && code.ends_with(' ')
                            && !code.trim().is_empty()
                        {
                            code = code[1..code.len() - 1].to_string();
                        }
                        if code.is_empty() {
                            (0..2 * n).for_each(|_| out.push('`'));
                        } else {
                            out.push_str("<code>");
                            out.push_str(&escape_html(&code));
                            out.push_str("</code>");
                        }
                        i = end + n;
                    }
                    None => {
                        (0..n).for_each(|_| out.push('`'));
                        i += n;
                    }
                }
            }
            '[' if !in_link => match link_at(c, i) {
                Some((text_end, after, url)) => {
                    out.push_str("<a href=\"");
                    out.push_str(&escape_attr(&url));
                    out.push_str("\">");
                    render_inline(&c[i + 1..text_end], out, depth + 1, true);
                    out.push_str("</a>");
                    i = after;
                }
                None => {
                    out.push('[');
                    i += 1;
                }
            },
            '*' | '_' | '~' => {
                let run = run_len(c, i, ch);
                let before = i.checked_sub(1).and_then(|k| c.get(k));
                let underscore = ch == '_';
                let opener_ok =
                    |n: usize| !is_space(c.get(i + n)) && (!underscore || !is_word(before));
                let mut handled = false;
                // (width of the delimiter, tags)
                let options: &[(usize, &str, &str)] = match (ch, run) {
                    ('~', 2) => &[(2, "<s>", "</s>")],
                    ('~', _) => &[],
                    (_, 1) => &[(1, "<i>", "</i>")],
                    (_, 2) => &[(2, "<b>", "</b>")],
                    (_, 3) => &[(3, "<b><i>", "</i></b>"), (2, "<b>", "</b>")],
                    _ => &[],
                };
                for &(n, open, close) in options {
                    if !opener_ok(run) {
                        break;
                    }
                    let start = i + n;
                    if let Some(end) = find_closer(c, start + (run - n), ch, n, underscore) {
                        if end > start {
                            out.push_str(open);
                            render_inline(&c[start..end], out, depth + 1, in_link);
                            out.push_str(close);
                            i = end + n;
                            handled = true;
                            break;
                        }
                    }
                }
                if !handled {
                    (0..run).for_each(|_| out.push(ch));
                    i += run;
                }
            }
            _ => {
                push_escaped(out, ch);
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_the_three_characters() {
        assert_eq!(
            escape_html("a < b && c > d"),
            "a &lt; b &amp;&amp; c &gt; d"
        );
        assert_eq!(
            markdown_to_html("if x < 3 && y > 2 { \"ok\" }"),
            "if x &lt; 3 &amp;&amp; y &gt; 2 { \"ok\" }"
        );
    }

    #[test]
    fn inline_styles() {
        assert_eq!(inline("**bold** and *it*"), "<b>bold</b> and <i>it</i>");
        assert_eq!(inline("__bold__ _it_"), "<b>bold</b> <i>it</i>");
        assert_eq!(inline("***both***"), "<b><i>both</i></b>");
        assert_eq!(inline("~~gone~~"), "<s>gone</s>");
        assert_eq!(
            inline("use `a<b>` here"),
            "use <code>a&lt;b&gt;</code> here"
        );
        assert_eq!(inline("``a ` b``"), "<code>a ` b</code>");
        assert_eq!(
            inline("**bold with `code`**"),
            "<b>bold with <code>code</code></b>"
        );
        assert_eq!(
            inline("*a **b** c*"),
            "<i>a <b>b</b> c</i>",
            "bold inside italic"
        );
    }

    #[test]
    fn unmatched_and_intra_word_markers_stay_literal() {
        assert_eq!(inline("snake_case_name"), "snake_case_name");
        assert_eq!(inline("2 * 3 * 4"), "2 * 3 * 4");
        assert_eq!(inline("a **b"), "a **b");
        assert_eq!(inline("`open"), "`open");
        assert_eq!(inline("~single~"), "~single~");
        assert_eq!(inline(r"\*not italic\*"), "*not italic*");
        assert_eq!(inline("_"), "_");
        assert_eq!(inline("****"), "****");
    }

    #[test]
    fn links() {
        assert_eq!(
            inline("see [the docs](https://example.com/a?b=1&c=\"2\")"),
            "see <a href=\"https://example.com/a?b=1&amp;c=&quot;2&quot;\">the docs</a>"
        );
        assert_eq!(
            inline("[**bold** link](https://x.org)"),
            "<a href=\"https://x.org\"><b>bold</b> link</a>"
        );
        // Not a link: bad scheme, spaces.
        assert_eq!(
            inline("[x](javascript:alert(1))"),
            "[x](javascript:alert(1))"
        );
        assert_eq!(inline("[x](not a url)"), "[x](not a url)");
    }

    #[test]
    fn blocks_headings_bullets_and_code() {
        let md = "# Title\n- one\n* two\n\n```rust\nfn main() { if a < b {} }\n```\n---";
        assert_eq!(
            markdown_to_html(md),
            "<b>Title</b>\n• one\n• two\n\n<pre><code class=\"language-rust\">fn main() { if a &lt; b {} }</code></pre>\n──────────"
        );
        // Markers inside code blocks are not formatting.
        assert_eq!(
            markdown_to_html("```\n**x** _y_ <z>\n```"),
            "<pre><code>**x** _y_ &lt;z&gt;</code></pre>"
        );
        // An unclosed fence runs to the end.
        assert_eq!(
            markdown_to_html("```py\nprint(1)"),
            "<pre><code class=\"language-py\">print(1)</code></pre>"
        );
    }

    /// Tags are balanced and only allowed ones are used.
    fn balanced(html: &str) -> bool {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = html;
        while let Some(start) = rest.find('<') {
            let Some(end) = rest[start..].find('>') else {
                return false;
            };
            let tag = &rest[start + 1..start + end];
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop().as_deref() != Some(name) {
                    return false;
                }
            } else {
                let name = tag.split_whitespace().next().unwrap_or("");
                if !["b", "i", "s", "code", "pre", "a"].contains(&name) {
                    return false;
                }
                stack.push(name.to_string());
            }
            rest = &rest[start + end + 1..];
        }
        stack.is_empty() && !rest.contains('>')
    }

    #[test]
    fn output_is_balanced_for_awkward_input() {
        for md in [
            "**a *b** c*",
            "*a **b* c**",
            "_a __b_ c__",
            "[a **b](https://x.org) c**",
            "`a **b` c**",
            "***a** b*",
            "**a ***b*** c**",
            "~~a **b~~ c**",
            "<b>not html</b> & more",
        ] {
            let html = markdown_to_html(md);
            assert!(balanced(&html), "{md:?} → {html:?}");
        }
    }

    #[test]
    fn short_answers_are_one_chunk() {
        let chunks = render_chunks("hello **world**", MAX_MESSAGE_LEN);
        assert_eq!(
            chunks,
            vec![Chunk {
                html: "hello <b>world</b>".into(),
                plain: "hello **world**".into()
            }]
        );
        assert!(render_chunks("", MAX_MESSAGE_LEN).is_empty());
    }

    #[test]
    fn long_answers_split_without_breaking_code_blocks() {
        let mut md = String::new();
        for i in 0..40 {
            md.push_str(&format!(
                "Paragraph {i} with **bold** text & a <tag> to escape, and some more words.\n"
            ));
            if i % 10 == 0 {
                md.push_str("```rust\n");
                for j in 0..60 {
                    md.push_str(&format!("let x{j} = a < b && c > d; // line {j}\n"));
                }
                md.push_str("```\n");
            }
        }
        assert!(md.len() > 10_000);
        let chunks = render_chunks(&md, MAX_MESSAGE_LEN);
        assert!(chunks.len() >= 3, "{}", chunks.len());
        let mut code = String::new();
        for c in &chunks {
            assert!(tg_len(&c.html) <= MAX_MESSAGE_LEN, "{}", tg_len(&c.html));
            assert!(tg_len(&c.plain) <= MAX_MESSAGE_LEN);
            assert!(balanced(&c.html), "{}", c.html);
            assert_eq!(
                c.html.matches("<pre>").count(),
                c.html.matches("</pre>").count()
            );
            assert_eq!(
                c.plain.matches("```").count() % 2,
                0,
                "fences close in the same message"
            );
            for block in c.html.split("<pre><code class=\"language-rust\">").skip(1) {
                code.push_str(block.split("</code></pre>").next().unwrap());
                code.push('\n');
            }
        }
        // Every code line arrives exactly once.
        for j in 0..60 {
            let line = format!("let x{j} = a &lt; b &amp;&amp; c &gt; d; // line {j}");
            assert_eq!(code.matches(&format!("{line}\n")).count(), 4, "{line}");
        }
    }

    #[test]
    fn an_oversized_code_block_is_closed_and_reopened() {
        let body: String = (0..400).map(|i| format!("echo {i} '&<>'\n")).collect();
        let md = format!("Intro\n```sh\n{body}```\nOutro");
        let chunks = render_chunks(&md, 1000);
        assert!(chunks.len() > 5);
        for c in &chunks[1..chunks.len() - 1] {
            assert!(
                c.html.starts_with("<pre><code class=\"language-sh\">"),
                "{}",
                c.html
            );
            assert!(c.html.ends_with("</code></pre>"));
            assert!(c.plain.starts_with("```sh\n") && c.plain.ends_with("\n```"));
            assert!(tg_len(&c.html) <= 1000);
        }
        let joined: String = chunks.iter().map(|c| c.html.clone()).collect();
        assert_eq!(joined.matches("echo 399 '&amp;&lt;&gt;'").count(), 1);
    }

    #[test]
    fn huge_lines_and_words_are_cut() {
        let word = "x".repeat(9000);
        let chunks = render_chunks(&word, MAX_MESSAGE_LEN);
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| tg_len(&c.html) <= MAX_MESSAGE_LEN));
        let line = "word & ".repeat(2000);
        let chunks = render_chunks(&line, MAX_MESSAGE_LEN);
        assert!(chunks.iter().all(|c| tg_len(&c.html) <= MAX_MESSAGE_LEN));
        assert_eq!(
            chunks
                .iter()
                .map(|c| c.html.matches("&amp;").count())
                .sum::<usize>(),
            2000
        );
        // Emoji count twice (UTF-16).
        let emoji = "😀".repeat(3000);
        let chunks = render_chunks(&emoji, MAX_MESSAGE_LEN);
        assert!(chunks.iter().all(|c| tg_len(&c.html) <= MAX_MESSAGE_LEN));
        assert_eq!(chunks.len(), 2);
    }

    #[test]
    fn plain_split_prefers_line_breaks() {
        let text = format!("{}\n{}", "a".repeat(30), "b".repeat(30));
        assert_eq!(split_plain(&text, 40), vec!["a".repeat(30), "b".repeat(30)]);
        assert_eq!(split_plain("short", 40), vec!["short".to_string()]);
    }
}
