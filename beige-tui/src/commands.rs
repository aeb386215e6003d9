//! Slash commands: parsing what was typed into a [`Command`], and the help text that
//! `/help` and the docs show.

/// One slash command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help,
    New,
    Sessions,
    /// `/resume <n|id>`; no argument lists the sessions.
    Resume(Option<String>),
    /// `/agent <name>`; no argument lists the agents.
    Agent(Option<String>),
    /// `/model <provider/model>`; no argument lists the allowed models; `default` clears
    /// the override.
    Model(Option<String>),
    /// `/verbose on|off` (`/v`); no argument shows the state.
    Verbose(Option<String>),
    Cancel,
    Clear,
    Compact,
    Quit,
    /// Anything else starting with `/` (the word as typed).
    Unknown(String),
}

/// The commands with their arguments and what they do (for `/help`).
pub const COMMANDS: &[(&str, &str)] = &[
    ("/new", "start a new session (the old one is kept)"),
    ("/sessions", "list this agent's sessions"),
    (
        "/resume <n|id>",
        "continue session n of /sessions (or by id)",
    ),
    (
        "/agent [name]",
        "switch to another agent (no name: list them)",
    ),
    ("/model [p/model]", "set the session's model (no arg: list)"),
    ("/verbose on|off", "show the model's thinking (alias /v)"),
    ("/cancel", "stop the running answer"),
    ("/clear", "clear the screen (the session is kept)"),
    ("/help · /quit", "this help · leave the TUI"),
];

/// The keys (for `/help`).
pub const KEYS: &[(&str, &str)] = &[
    ("Enter", "send · Shift+Enter or Alt+Enter: new line"),
    ("Up / Down", "previous / next message (single-line input)"),
    ("PgUp / PgDn", "scroll (also the mouse wheel)"),
    ("Tab", "expand/collapse the last tool call"),
    ("Shift+Tab", "expand/collapse all tool calls"),
    ("Esc", "clear the input · close this view"),
    ("Ctrl+C", "cancel the answer · twice within 2 s: quit"),
    ("Ctrl+D", "quit (on an empty input)"),
];

/// Parse a line that starts with `/`. `None` for ordinary messages, including `//text`
/// (sent as `/text`).
pub fn parse(input: &str) -> Option<Command> {
    let input = input.trim();
    let rest = input.strip_prefix('/')?;
    if rest.starts_with('/') {
        return None;
    }
    let mut parts = rest.splitn(2, char::is_whitespace);
    let name = parts.next().unwrap_or("");
    let arg = parts
        .next()
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string);
    Some(match name {
        "help" | "h" | "?" => Command::Help,
        "new" => Command::New,
        "sessions" => Command::Sessions,
        "resume" => Command::Resume(arg),
        "agent" | "agents" => Command::Agent(arg),
        "model" | "models" => Command::Model(arg),
        "verbose" | "v" => Command::Verbose(arg),
        "cancel" | "stop" => Command::Cancel,
        "clear" => Command::Clear,
        "compact" => Command::Compact,
        "quit" | "exit" | "q" => Command::Quit,
        _ => Command::Unknown(format!("/{name}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_arguments() {
        assert_eq!(parse("/help"), Some(Command::Help));
        assert_eq!(parse("/resume 2"), Some(Command::Resume(Some("2".into()))));
        assert_eq!(parse("/agent   "), Some(Command::Agent(None)));
        assert_eq!(parse("/v on"), Some(Command::Verbose(Some("on".into()))));
        assert_eq!(
            parse("/model openai/gpt-4o"),
            Some(Command::Model(Some("openai/gpt-4o".into())))
        );
        assert_eq!(parse("/foo bar"), Some(Command::Unknown("/foo".into())));
        assert_eq!(parse("hello /new"), None);
        assert_eq!(parse("//etc/hosts?"), None);
    }
}
