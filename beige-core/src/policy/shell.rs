//! A small, conservative shell splitter for `exec` rules (governance.md §1.3).
//!
//! Owns turning one `sh -c` line into the simple commands a prefix matcher can check
//! ([`split`]): it splits at `;`, `&&`, `||`, `|`, `&`, newlines and parentheses,
//! honouring single and double quotes and backslashes; drops redirections (`> f`,
//! `2>&1`, `< in`); strips `VAR=value` prefixes and the wrappers `env`, `nohup`, `time`,
//! `nice`, `timeout`, `command` and `exec`; and parses `sh -c` / `bash -lc` / `dash -c` /
//! `zsh -c` strings again, up to [`MAX_DEPTH`] levels. What it cannot see through — `$(…)`,
//! backticks, `<(…)`, `>(…)`, `eval`, `source` / `.`, heredocs, a command word holding
//! `$`, `*` or `?`, an unterminated quote, nesting too deep — marks that command
//! [`opaque`](SimpleCommand::opaque). It never runs anything, never touches the file
//! system and never panics; it is a guardrail for what the model types, not a boundary
//! (`python -c 'os.system("git push")'` is no `git push` to it).

/// How many `sh -c` strings inside each other are parsed again; deeper is opaque.
pub const MAX_DEPTH: usize = 3;

/// One simple command of a shell line: its words as the shell would pass them, with
/// assignments, wrappers and redirections taken away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleCommand {
    /// The command and its arguments (quotes removed; expansions left as written).
    pub argv: Vec<String>,
    /// The shell would expand or read something first that the splitter cannot see
    /// through, so `argv` may not be what runs.
    pub opaque: bool,
}

impl SimpleCommand {
    /// The words joined with spaces, quoting those that need it (for messages).
    pub fn display(&self) -> String {
        display_argv(&self.argv)
    }
}

/// `argv` as one readable line: words with spaces or shell characters are single-quoted.
pub fn display_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.chars()
                    .all(|c| c.is_alphanumeric() || "-_./=:,+@%^~".contains(c));
            if plain {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The simple commands of `line`, in order. Empty commands (blank lines, comments) are
/// left out, unless something opaque happened in them (`X=$(curl …)`).
pub fn split(line: &str) -> Vec<SimpleCommand> {
    let mut out = Vec::new();
    split_into(line, 0, &mut out);
    out
}

fn split_into(line: &str, depth: usize, out: &mut Vec<SimpleCommand>) {
    for raw in lex(line) {
        resolve(raw, depth, out);
    }
}

/// One word as lexed: its text without quotes, and whether the shell would expand it.
#[derive(Debug, Clone, Default)]
struct Word {
    text: String,
    /// An unquoted or double-quoted `$`.
    dollar: bool,
    /// An unquoted `*` or `?`.
    glob: bool,
    /// Some part of it was quoted or escaped.
    quoted: bool,
}

/// A simple command as lexed, before assignments and wrappers are stripped.
#[derive(Debug, Default)]
struct RawCommand {
    words: Vec<Word>,
    opaque: bool,
}

/// The lexer's state over one line.
struct Lexer {
    chars: Vec<char>,
    at: usize,
    commands: Vec<RawCommand>,
    current: RawCommand,
    word: Option<Word>,
    /// The next word is a redirection's target and is dropped.
    redirect_target: bool,
}

fn lex(line: &str) -> Vec<RawCommand> {
    let mut lx = Lexer {
        chars: line.chars().collect(),
        at: 0,
        commands: Vec::new(),
        current: RawCommand::default(),
        word: None,
        redirect_target: false,
    };
    lx.run();
    lx.commands
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn word(&mut self) -> &mut Word {
        self.word.get_or_insert_with(Word::default)
    }

    fn end_word(&mut self) {
        if let Some(w) = self.word.take() {
            if self.redirect_target {
                self.redirect_target = false;
                // A redirection that expands is still only a file name.
            } else {
                self.current.words.push(w);
            }
        }
    }

    fn end_command(&mut self) {
        self.end_word();
        // A separator right after a redirection operator: the target is missing.
        if self.redirect_target {
            self.redirect_target = false;
            self.current.opaque = true;
        }
        let c = std::mem::take(&mut self.current);
        if !c.words.is_empty() || c.opaque {
            self.commands.push(c);
        }
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\r' => {
                    self.end_word();
                    self.at += 1;
                }
                '\n' | ';' | '(' | ')' => {
                    self.end_command();
                    self.at += 1;
                }
                '&' if self.peek(1) == Some('>') => {
                    // `&>file`, `&>>file`: both streams to a file.
                    self.end_word();
                    self.at += if self.peek(2) == Some('>') { 3 } else { 2 };
                    self.redirect_target = true;
                }
                '&' | '|' => {
                    self.end_command();
                    self.at += 1;
                    if matches!(self.peek(0), Some('&' | '|')) {
                        self.at += 1;
                    }
                }
                '<' | '>' => self.redirection(c),
                '#' if self.word.is_none() => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.at += 1;
                    }
                }
                '\'' => self.single_quoted(),
                '"' => self.double_quoted(),
                '\\' => {
                    self.at += 1;
                    match self.peek(0) {
                        // A line continuation joins the lines.
                        Some('\n') => self.at += 1,
                        Some(next) => {
                            let w = self.word();
                            w.text.push(next);
                            w.quoted = true;
                            self.at += 1;
                        }
                        None => {}
                    }
                }
                '$' => self.dollar(),
                '`' => {
                    self.current.opaque = true;
                    let text = self.take_backticks();
                    self.word().text.push_str(&text);
                }
                '*' | '?' => {
                    let w = self.word();
                    w.glob = true;
                    w.text.push(c);
                    self.at += 1;
                }
                _ => {
                    self.word().text.push(c);
                    self.at += 1;
                }
            }
        }
        self.end_command();
    }

    /// `<`, `>`, `>>`, `<>`, `>|`, `<&`, `>&`, `<<` (heredoc), `<<<`, `<(…)`, `>(…)`,
    /// with an optional fd number written just before.
    fn redirection(&mut self, c: char) {
        if self.peek(1) == Some('(') {
            // Process substitution: a command whose output becomes a file name.
            self.current.opaque = true;
            self.at += 1;
            let text = self.take_parens();
            let w = self.word();
            w.text.push(c);
            w.text.push_str(&text);
            return;
        }
        // `2>`: the digits before the operator are its fd, not a word.
        if let Some(w) = &self.word {
            if !w.quoted && !w.text.is_empty() && w.text.chars().all(|d| d.is_ascii_digit()) {
                self.word = None;
            }
        }
        self.end_word();
        self.at += 1;
        if c == '<' && self.peek(0) == Some('<') {
            // Heredoc or here-string: input the splitter does not follow.
            self.current.opaque = true;
            self.at += 1;
            while matches!(self.peek(0), Some('<' | '-')) {
                self.at += 1;
            }
        } else if matches!(self.peek(0), Some('>' | '|' | '&')) {
            self.at += 1;
        }
        // `>&2`, `2>&-`: the target is an fd, a word like any other here.
        self.redirect_target = true;
    }

    fn single_quoted(&mut self) {
        self.at += 1;
        let w = self.word();
        w.quoted = true;
        let mut text = String::new();
        let mut closed = false;
        while let Some(c) = self.peek(0) {
            self.at += 1;
            if c == '\'' {
                closed = true;
                break;
            }
            text.push(c);
        }
        self.word().text.push_str(&text);
        if !closed {
            self.current.opaque = true;
        }
    }

    fn double_quoted(&mut self) {
        self.at += 1;
        self.word().quoted = true;
        loop {
            let Some(c) = self.peek(0) else {
                self.current.opaque = true;
                return;
            };
            match c {
                '"' => {
                    self.at += 1;
                    return;
                }
                '\\' => {
                    self.at += 1;
                    match self.peek(0) {
                        Some('\n') => self.at += 1,
                        Some(next @ ('$' | '`' | '"' | '\\')) => {
                            self.word().text.push(next);
                            self.at += 1;
                        }
                        Some(next) => {
                            let w = self.word();
                            w.text.push('\\');
                            w.text.push(next);
                            self.at += 1;
                        }
                        None => {}
                    }
                }
                '$' => self.dollar(),
                '`' => {
                    self.current.opaque = true;
                    let text = self.take_backticks();
                    self.word().text.push_str(&text);
                }
                _ => {
                    self.word().text.push(c);
                    self.at += 1;
                }
            }
        }
    }

    /// `$name`, `${…}`, `$(…)`, `$((…))`: kept as written; a command substitution makes
    /// the command opaque.
    fn dollar(&mut self) {
        self.word().dollar = true;
        if self.peek(1) == Some('(') {
            self.current.opaque = true;
            self.at += 1;
            let text = self.take_parens();
            let w = self.word();
            w.text.push('$');
            w.text.push_str(&text);
        } else {
            self.word().text.push('$');
            self.at += 1;
        }
    }

    /// From the `(` under the cursor to its matching `)` (or the end), as written.
    fn take_parens(&mut self) -> String {
        let mut text = String::new();
        let mut depth = 0usize;
        let mut quote: Option<char> = None;
        while let Some(c) = self.peek(0) {
            self.at += 1;
            text.push(c);
            match (quote, c) {
                (Some(q), _) if c == q => quote = None,
                (Some('"'), '\\') | (None, '\\') => {
                    if let Some(next) = self.peek(0) {
                        text.push(next);
                        self.at += 1;
                    }
                }
                (Some(_), _) => {}
                (None, '\'' | '"') => quote = Some(c),
                (None, '(') => depth += 1,
                (None, ')') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                (None, _) => {}
            }
        }
        text
    }

    /// From the backtick under the cursor to the next unescaped one (or the end).
    fn take_backticks(&mut self) -> String {
        let mut text = String::from("`");
        self.at += 1;
        while let Some(c) = self.peek(0) {
            self.at += 1;
            text.push(c);
            if c == '\\' {
                if let Some(next) = self.peek(0) {
                    text.push(next);
                    self.at += 1;
                }
            } else if c == '`' {
                break;
            }
        }
        text
    }
}

/// Words that open or continue a compound command; the command proper follows them.
const RESERVED: [&str; 13] = [
    "!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "esac",
];

/// Shells whose `-c` string is parsed again.
const SHELLS: [&str; 5] = ["sh", "bash", "dash", "zsh", "ksh"];

/// The last path segment: `/usr/bin/env` is `env`.
pub(crate) fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn is_assignment(w: &Word) -> bool {
    let Some((name, _)) = w.text.split_once('=') else {
        return false;
    };
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Strip assignments, reserved words and wrappers from `raw`, then either push it or,
/// for a shell's `-c` string, what that string splits into.
fn resolve(raw: RawCommand, depth: usize, out: &mut Vec<SimpleCommand>) {
    let mut opaque = raw.opaque;
    let words = raw.words;
    let mut i = 0;
    while let Some(w) = words.get(i) {
        if is_assignment(w) || (!w.quoted && RESERVED.contains(&w.text.as_str())) {
            i += 1;
            continue;
        }
        match skip_wrapper(&words, i) {
            Wrapper::Skip(next) => i = next,
            Wrapper::Opaque(next) => {
                opaque = true;
                i = next;
            }
            Wrapper::None => break,
        }
    }
    let rest = words.get(i..).unwrap_or_default();
    let Some(first) = rest.first() else {
        if opaque {
            out.push(SimpleCommand {
                argv: Vec::new(),
                opaque,
            });
        }
        return;
    };
    let name = basename(&first.text);
    if first.dollar || first.glob || matches!(name, "eval" | "source" | ".") {
        opaque = true;
    }
    if SHELLS.contains(&name) && !first.dollar {
        if let Some(script) = shell_script(rest) {
            if depth >= MAX_DEPTH {
                opaque = true;
            } else {
                let before = out.len();
                split_into(&script.text, depth + 1, out);
                if opaque {
                    for c in out.iter_mut().skip(before) {
                        c.opaque = true;
                    }
                    if out.len() == before {
                        out.push(SimpleCommand {
                            argv: Vec::new(),
                            opaque,
                        });
                    }
                }
                return;
            }
        }
    }
    out.push(SimpleCommand {
        argv: rest.iter().map(|w| w.text.clone()).collect(),
        opaque,
    });
}

/// The `-c` string of a shell's arguments (`sh -c S`, `bash -lc S`, `bash -e -c S`).
fn shell_script(words: &[Word]) -> Option<&Word> {
    let mut has_c = false;
    let mut i = 1;
    while let Some(w) = words.get(i) {
        let t = w.text.as_str();
        if t == "--" {
            i += 1;
            break;
        }
        if t == "-o" || t == "+o" {
            i += 2;
            continue;
        }
        if let Some(flags) = t.strip_prefix('-').filter(|f| !f.starts_with('-')) {
            has_c |= flags.contains('c');
        } else if t.starts_with("--") || t.starts_with('+') {
            // Long options (`--login`, `--norc`) and `+x` take no argument here.
        } else {
            break;
        }
        i += 1;
    }
    if has_c {
        words.get(i)
    } else {
        None
    }
}

/// What a wrapper at `words[i]` amounts to.
enum Wrapper {
    /// Not a wrapper: the command starts here.
    None,
    /// A wrapper and its own arguments: the command starts at this index.
    Skip(usize),
    /// A wrapper the splitter cannot follow (`env -S`); the command is opaque.
    Opaque(usize),
}

fn skip_wrapper(words: &[Word], i: usize) -> Wrapper {
    let Some(w) = words.get(i) else {
        return Wrapper::None;
    };
    let text = |j: usize| words.get(j).map(|w| w.text.as_str());
    let mut j = i + 1;
    match basename(&w.text) {
        "env" => {
            while let Some(t) = text(j) {
                match t {
                    "--" => return Wrapper::Skip(j + 1),
                    "-S" | "--split-string" => return Wrapper::Opaque(j + 1),
                    _ if t.starts_with("-S") || t.starts_with("--split-string=") => {
                        return Wrapper::Opaque(j + 1)
                    }
                    "-u" | "--unset" | "-C" | "--chdir" => j += 2,
                    _ if t.starts_with('-') => j += 1,
                    _ if words.get(j).is_some_and(is_assignment) => j += 1,
                    _ => break,
                }
            }
            Wrapper::Skip(j)
        }
        "nohup" => {
            if text(j) == Some("--") {
                j += 1;
            }
            Wrapper::Skip(j)
        }
        "time" => {
            while text(j).is_some_and(|t| t == "-p" || t == "--") {
                j += 1;
            }
            Wrapper::Skip(j)
        }
        "nice" => {
            while let Some(t) = text(j) {
                match t {
                    "--" => return Wrapper::Skip(j + 1),
                    "-n" | "--adjustment" => j += 2,
                    _ if t.starts_with('-') => j += 1,
                    _ => break,
                }
            }
            Wrapper::Skip(j)
        }
        "timeout" => {
            while let Some(t) = text(j) {
                match t {
                    "--" => {
                        j += 1;
                        break;
                    }
                    "-s" | "--signal" | "-k" | "--kill-after" => j += 2,
                    _ if t.starts_with('-') => j += 1,
                    _ => break,
                }
            }
            // The duration.
            Wrapper::Skip(j + 1)
        }
        "command" | "exec" | "builtin" => {
            while let Some(t) = text(j) {
                match t {
                    // `command -v git` looks git up; it does not run it.
                    "-v" | "-V" => return Wrapper::None,
                    "--" => return Wrapper::Skip(j + 1),
                    _ if t.starts_with('-') => j += 1,
                    _ => break,
                }
            }
            Wrapper::Skip(j)
        }
        _ => Wrapper::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(argv, opaque)` of each simple command of `line`.
    fn cmds(line: &str) -> Vec<(Vec<String>, bool)> {
        split(line)
            .into_iter()
            .map(|c| (c.argv, c.opaque))
            .collect()
    }

    fn words(argv: &[&str]) -> Vec<String> {
        argv.iter().map(|s| s.to_string()).collect()
    }

    fn plain(argvs: &[&[&str]]) -> Vec<(Vec<String>, bool)> {
        argvs.iter().map(|a| (words(a), false)).collect()
    }

    #[test]
    fn splits_at_operators_and_honours_quotes() {
        assert_eq!(
            cmds("cd x && git push; ls | wc -l || echo no & sleep 1\npwd"),
            plain(&[
                &["cd", "x"],
                &["git", "push"],
                &["ls"],
                &["wc", "-l"],
                &["echo", "no"],
                &["sleep", "1"],
                &["pwd"],
            ])
        );
        assert_eq!(
            cmds(r#"echo 'a; b' "c && d" e\;f"#),
            plain(&[&["echo", "a; b", "c && d", "e;f"]])
        );
        assert_eq!(
            cmds(r#"git commit -m "it's \"done\"""#),
            plain(&[&["git", "commit", "-m", r#"it's "done""#]])
        );
        assert_eq!(cmds("a\\\nb"), plain(&[&["ab"]]));
        assert_eq!(cmds("ls # git push -f"), plain(&[&["ls"]]));
        assert_eq!(
            cmds("(cd x; git push)"),
            plain(&[&["cd", "x"], &["git", "push"]])
        );
        assert_eq!(cmds(""), plain(&[]));
        assert_eq!(cmds(" ;; && "), plain(&[]));
    }

    #[test]
    fn drops_redirections() {
        assert_eq!(cmds("make > out.log 2>&1 < in.txt"), plain(&[&["make"]]));
        assert_eq!(cmds("cmd &>/dev/null arg"), plain(&[&["cmd", "arg"]]));
        assert_eq!(cmds("cmd 2>>err x >|f"), plain(&[&["cmd", "x"]]));
        // A quoted number before `>` is a word, not an fd.
        assert_eq!(cmds("echo '2'>f"), plain(&[&["echo", "2"]]));
    }

    #[test]
    fn strips_assignments_and_wrappers() {
        assert_eq!(cmds("A=1 B=2 git push"), plain(&[&["git", "push"]]));
        assert_eq!(
            cmds("env -i A=1 -u B nohup nice -n 5 timeout -s KILL 30s command git push"),
            plain(&[&["git", "push"]])
        );
        assert_eq!(cmds("/usr/bin/env git push"), plain(&[&["git", "push"]]));
        assert_eq!(cmds("time -p git push"), plain(&[&["git", "push"]]));
        assert_eq!(cmds("nice -10 git push"), plain(&[&["git", "push"]]));
        assert_eq!(
            cmds("timeout --preserve-status 5 git push"),
            plain(&[&["git", "push"]])
        );
        assert_eq!(cmds("command -v git"), plain(&[&["command", "-v", "git"]]));
        assert_eq!(
            cmds("if true; then git push; fi"),
            plain(&[&["true"], &["git", "push"]])
        );
    }

    #[test]
    fn parses_shell_strings_again_up_to_three_levels() {
        assert_eq!(cmds("bash -lc 'git push'"), plain(&[&["git", "push"]]));
        assert_eq!(
            cmds(r#"sh -c "cd x && bash -c 'dash -c \"git push -f\"'""#),
            plain(&[&["cd", "x"], &["git", "push", "-f"]])
        );
        assert_eq!(
            cmds("zsh -e -c 'ls; pwd' arg0"),
            plain(&[&["ls"], &["pwd"]])
        );
        // Four levels deep: the innermost is not read.
        let deep = r#"sh -c "sh -c 'sh -c \"sh -c ls\"'""#;
        assert_eq!(cmds(deep), vec![(words(&["sh", "-c", "ls"]), true)]);
        // A shell running a script file is a command like any other.
        assert_eq!(cmds("bash run.sh"), plain(&[&["bash", "run.sh"]]));
    }

    #[test]
    fn what_the_shell_expands_first_is_opaque() {
        for line in [
            "$(echo git) push",
            "git push $(echo -f)",
            "git push `echo -f`",
            "diff <(ls a) b",
            "tee >(wc -l)",
            "eval git push",
            "source env.sh",
            ". env.sh",
            "cat <<EOF",
            "cat <<< hi",
            "$GIT push",
            "gi* push",
            "g?t push",
            "echo 'unterminated",
            "echo \"unterminated",
            "env -S 'git push' x",
            "X=$(curl x)",
            "sh -c \"$CMD\"",
        ] {
            let c = split(line);
            assert!(c.iter().any(|c| c.opaque), "{line}: {c:?}");
        }
        // Quoted or argument-only `$`, `*` and `?` are what the command gets.
        for line in ["echo '$HOME'", "ls *.rs", "echo $HOME", "grep 'a*b?' f"] {
            let c = split(line);
            assert!(c.iter().all(|c| !c.opaque), "{line}: {c:?}");
        }
        // What can be seen of an opaque command is kept, so a deny rule still matches.
        assert_eq!(
            cmds("git push -f $(echo origin)"),
            vec![(words(&["git", "push", "-f", "$(echo origin)"]), true)]
        );
    }

    #[test]
    fn displays_argv_readably() {
        let c = &split("git commit -m 'a b'")[0];
        assert_eq!(c.display(), "git commit -m 'a b'");
        assert_eq!(display_argv(&["it's".to_string()]), r"'it'\''s'");
    }

    /// Deterministic mutations of shell-ish lines: splitting never panics and never
    /// returns a command that is neither opaque nor has words.
    #[test]
    fn never_panics_on_mutated_input() {
        let seeds = [
            "sh -c \"cd x && bash -lc 'git push -f' \" | tee >(wc) 2>&1",
            "A=1 env -i timeout 5 nice -n 1 $(echo `ls`) <<EOF\n'\"\\",
            "((((''\"\"``$$$<<<>>>&&||;;\n\\",
        ];
        let alphabet: Vec<char> = "ab -c'\"\\$`()<>|&;\n*?#=é\u{0}".chars().collect();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut seen = 0usize;
        for seed in seeds {
            for _ in 0..2000 {
                let mut s: Vec<char> = seed.chars().collect();
                for _ in 0..(next() % 6) {
                    let at = (next() as usize) % (s.len() + 1);
                    let c = alphabet[(next() as usize) % alphabet.len()];
                    match next() % 3 {
                        0 => s.insert(at, c),
                        1 if at < s.len() => {
                            s.remove(at);
                        }
                        _ if at < s.len() => s[at] = c,
                        _ => s.push(c),
                    }
                }
                let line: String = s.into_iter().collect();
                for c in split(&line) {
                    assert!(c.opaque || !c.argv.is_empty(), "{line:?}");
                    seen += 1;
                }
            }
        }
        assert!(seen > 0);
    }
}
