//! The composer: a small multi-line text editor (cursor, insert, delete, paste) and the
//! history of sent messages that Up/Down walk through.
//!
//! Pure data: key handling lives in `update`, drawing in `render`.

/// Multi-line input with a cursor. Lines never contain `\n`; the cursor column counts
/// chars, not bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composer {
    lines: Vec<String>,
    row: usize,
    col: usize,
}

impl Default for Composer {
    fn default() -> Self {
        Self {
            lines: vec![String::new()],
            row: 0,
            col: 0,
        }
    }
}

fn byte_at(s: &str, col: usize) -> usize {
    s.char_indices().nth(col).map(|(i, _)| i).unwrap_or(s.len())
}

impl Composer {
    /// The whole text, lines joined with `\n`.
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }

    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// (row, column in chars).
    pub fn cursor(&self) -> (usize, usize) {
        (self.row, self.col)
    }

    pub fn is_empty(&self) -> bool {
        self.lines.len() == 1 && self.lines[0].is_empty()
    }

    pub fn is_multiline(&self) -> bool {
        self.lines.len() > 1
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Replace the text; the cursor goes to the end.
    pub fn set_text(&mut self, text: &str) {
        self.clear();
        self.insert_str(text);
    }

    pub fn insert_char(&mut self, c: char) {
        if c == '\n' {
            self.newline();
            return;
        }
        let line = &mut self.lines[self.row];
        let at = byte_at(line, self.col);
        line.insert(at, c);
        self.col += 1;
    }

    /// Insert text at the cursor (pastes: `\r\n` and `\r` become line breaks, tabs four
    /// spaces, other control characters are dropped).
    pub fn insert_str(&mut self, text: &str) {
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        for c in text.chars() {
            match c {
                '\n' => self.newline(),
                '\t' => {
                    for _ in 0..4 {
                        self.insert_char(' ');
                    }
                }
                c if c.is_control() => {}
                c => self.insert_char(c),
            }
        }
    }

    pub fn newline(&mut self) {
        let line = &mut self.lines[self.row];
        let at = byte_at(line, self.col);
        let tail = line.split_off(at);
        self.row += 1;
        self.lines.insert(self.row, tail);
        self.col = 0;
    }

    pub fn backspace(&mut self) {
        if self.col > 0 {
            let line = &mut self.lines[self.row];
            let at = byte_at(line, self.col - 1);
            line.remove(at);
            self.col -= 1;
        } else if self.row > 0 {
            let line = self.lines.remove(self.row);
            self.row -= 1;
            self.col = self.lines[self.row].chars().count();
            self.lines[self.row].push_str(&line);
        }
    }

    pub fn delete(&mut self) {
        let len = self.lines[self.row].chars().count();
        if self.col < len {
            let line = &mut self.lines[self.row];
            let at = byte_at(line, self.col);
            line.remove(at);
        } else if self.row + 1 < self.lines.len() {
            let next = self.lines.remove(self.row + 1);
            self.lines[self.row].push_str(&next);
        }
    }

    /// Delete the word before the cursor (Ctrl+W).
    pub fn delete_word(&mut self) {
        while self.col > 0 && self.char_before().is_some_and(char::is_whitespace) {
            self.backspace();
        }
        while self.col > 0 && self.char_before().is_some_and(|c| !c.is_whitespace()) {
            self.backspace();
        }
    }

    fn char_before(&self) -> Option<char> {
        self.col
            .checked_sub(1)
            .and_then(|i| self.lines[self.row].chars().nth(i))
    }

    pub fn left(&mut self) {
        if self.col > 0 {
            self.col -= 1;
        } else if self.row > 0 {
            self.row -= 1;
            self.col = self.lines[self.row].chars().count();
        }
    }

    pub fn right(&mut self) {
        if self.col < self.lines[self.row].chars().count() {
            self.col += 1;
        } else if self.row + 1 < self.lines.len() {
            self.row += 1;
            self.col = 0;
        }
    }

    /// Move up a line; `false` when already on the first.
    pub fn up(&mut self) -> bool {
        if self.row == 0 {
            return false;
        }
        self.row -= 1;
        self.col = self.col.min(self.lines[self.row].chars().count());
        true
    }

    /// Move down a line; `false` when already on the last.
    pub fn down(&mut self) -> bool {
        if self.row + 1 >= self.lines.len() {
            return false;
        }
        self.row += 1;
        self.col = self.col.min(self.lines[self.row].chars().count());
        true
    }

    pub fn home(&mut self) {
        self.col = 0;
    }

    pub fn end(&mut self) {
        self.col = self.lines[self.row].chars().count();
    }
}

/// Sent messages, oldest first, and where Up/Down currently are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    entries: Vec<String>,
    /// Index into `entries` while browsing.
    pos: Option<usize>,
    /// What was in the composer before browsing started.
    draft: String,
}

/// At most this many entries are kept.
pub const HISTORY_MAX: usize = 500;

impl History {
    pub fn push(&mut self, entry: &str) {
        self.pos = None;
        if entry.trim().is_empty() || self.entries.last().is_some_and(|l| l == entry) {
            return;
        }
        self.entries.push(entry.to_string());
        if self.entries.len() > HISTORY_MAX {
            self.entries.remove(0);
        }
    }

    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// The previous entry (Up); `current` is saved as the draft when browsing starts.
    pub fn older(&mut self, current: &str) -> Option<&str> {
        let next = match self.pos {
            None => {
                if self.entries.is_empty() {
                    return None;
                }
                self.draft = current.to_string();
                self.entries.len() - 1
            }
            Some(0) => return None,
            Some(p) => p - 1,
        };
        self.pos = Some(next);
        self.entries.get(next).map(String::as_str)
    }

    /// The next entry (Down), or the saved draft after the newest.
    pub fn newer(&mut self) -> Option<String> {
        let p = self.pos?;
        if p + 1 < self.entries.len() {
            self.pos = Some(p + 1);
            self.entries.get(p + 1).cloned()
        } else {
            self.pos = None;
            Some(std::mem::take(&mut self.draft))
        }
    }

    /// Stop browsing (the composer was edited).
    pub fn reset(&mut self) {
        self.pos = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_across_lines() {
        let mut c = Composer::default();
        c.insert_str("héllo");
        c.newline();
        c.insert_str("wörld");
        assert_eq!(c.text(), "héllo\nwörld");
        assert_eq!(c.cursor(), (1, 5));
        c.home();
        c.backspace();
        assert_eq!(c.text(), "héllowörld");
        assert_eq!(c.cursor(), (0, 5));
        c.delete();
        assert_eq!(c.text(), "hélloörld");
        c.end();
        c.delete_word();
        assert!(c.is_empty());
    }

    #[test]
    fn paste_normalises_line_breaks() {
        let mut c = Composer::default();
        c.insert_str("a\r\nb\rc\td\x07");
        assert_eq!(c.text(), "a\nb\nc    d");
        assert!(c.is_multiline());
    }

    #[test]
    fn history_walks_and_restores_the_draft() {
        let mut h = History::default();
        h.push("one");
        h.push("two");
        h.push("two");
        assert_eq!(h.older("draft"), Some("two"));
        assert_eq!(h.older("ignored"), Some("one"));
        assert_eq!(h.older("ignored"), None);
        assert_eq!(h.newer().as_deref(), Some("two"));
        assert_eq!(h.newer().as_deref(), Some("draft"));
        assert_eq!(h.newer(), None);
    }
}
