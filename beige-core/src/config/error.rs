//! The one error type of the config layer, written for people.
//!
//! Owns [`ConfigError`]: every variant carries the file and, where there is one, the
//! path inside the config (`agents.intern.tools[1]`). Its `Display` says what is wrong
//! and how to fix it; callers print it as is.

use std::fmt;
use std::path::{Path, PathBuf};

/// What kind of name an [`ConfigError::UnknownName`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameKind {
    /// A key of `llm.providers` (in `model.provider`).
    Provider,
    /// A configured plugin (a key of an agent's `pluginConfigs`).
    Plugin,
    /// A skill of the top-level `skills` or of a plugin (in an agent's `skills`).
    Skill,
    /// A tool registered by a plugin (in an agent's `tools`).
    Tool,
    /// A server of `mcp.servers` (a key of an agent's `mcpConfigs`).
    McpServer,
    /// A configured agent (a key of a user's `roles`).
    Agent,
}

impl NameKind {
    fn noun(self) -> &'static str {
        match self {
            NameKind::Provider => "provider",
            NameKind::Plugin => "plugin",
            NameKind::Skill => "skill",
            NameKind::Tool => "tool",
            NameKind::McpServer => "MCP server",
            NameKind::Agent => "agent",
        }
    }

    /// "configured providers: …" but "registered tools: …".
    fn known_label(self) -> &'static str {
        match self {
            NameKind::Tool => "registered",
            _ => "configured",
        }
    }

    fn fix(self) -> &'static str {
        match self {
            NameKind::Provider => "Add it under llm.providers or fix the name.",
            NameKind::Plugin => "pluginConfigs keys must name a plugin configured under plugins.",
            NameKind::Skill => {
                "Add it under skills (or install a plugin that provides it) or fix the name."
            }
            NameKind::Tool => {
                "Install the plugin that provides it (beige plugins install) or fix the name."
            }
            NameKind::McpServer => {
                "mcpConfigs keys must name a server configured under mcp.servers."
            }
            NameKind::Agent => {
                "A role's key is an agent's name or a pattern with '*' (\"*\" for every agent)."
            }
        }
    }
}

/// A config file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file does not exist.
    NotFound {
        /// The path that was looked at.
        file: PathBuf,
    },
    /// The file exists but cannot be read (permissions, not UTF-8, …). The I/O error is
    /// part of the message rather than a `source`, so printing the chain does not repeat it.
    Read {
        /// The config file.
        file: PathBuf,
        /// The I/O error of reading it.
        error: std::io::Error,
    },
    /// Not valid JSON5. `message` is the parser's expectation; `source_line` the text of
    /// the line it stopped on.
    Syntax {
        /// The config file.
        file: PathBuf,
        /// The line the parser stopped on, from 1, when it said.
        line: Option<usize>,
        /// The column on that line, from 1, when the parser said.
        column: Option<usize>,
        /// What the parser expected there.
        message: String,
        /// That line's text, trimmed and cut at 80 characters.
        source_line: Option<String>,
    },
    /// `${NAME}` without a default, and `NAME` is not set.
    UnsetVariable {
        /// The config file.
        file: PathBuf,
        /// Where in the config the string with `${NAME}` is.
        path: String,
        /// The variable's name.
        variable: String,
    },
    /// A required field is absent.
    MissingField {
        /// The config file.
        file: PathBuf,
        /// Where the field belongs, the field included (`agents.bot.model`).
        path: String,
        /// The field's key (`model`).
        field: String,
    },
    /// A value has the wrong type or is out of range.
    Invalid {
        /// The config file.
        file: PathBuf,
        /// Where in the config, e.g. `agents.intern.tools[1]`.
        path: String,
        /// What is wrong with the value.
        message: String,
    },
    /// `agents` is present but empty.
    NoAgents {
        /// The config file.
        file: PathBuf,
    },
    /// An agent name that is not safe for paths and container names.
    InvalidAgentName {
        /// The config file.
        file: PathBuf,
        /// Where in the config, `agents.<name>`.
        path: String,
        /// The name as written.
        agent: String,
        /// A valid name close to it, offered in the message.
        suggestion: String,
    },
    /// A reference to a provider, plugin, skill or tool that does not exist.
    UnknownName {
        /// The config file.
        file: PathBuf,
        /// Where in the config, e.g. `agents.intern.tools[1]`.
        path: String,
        /// What kind of name it is.
        kind: NameKind,
        /// The name as written.
        name: String,
        /// A known name close to it (`did you mean …?`), if there is one.
        suggestion: Option<String>,
        /// Every name of that kind that exists, listed in the message.
        known: Vec<String>,
    },
    /// A provider whose wire format cannot be guessed from its name.
    ProviderApiRequired {
        /// The config file.
        file: PathBuf,
        /// Where in the config, `llm.providers.<name>`.
        path: String,
        /// The provider's name.
        provider: String,
    },
    /// An `extraMounts` entry that would expose the host or beige itself.
    MountRefused {
        /// The config file.
        file: PathBuf,
        /// Where in the config, `agents.<name>.sandbox.extraMounts.<host>`.
        path: String,
        /// The host path, resolved against the config file's folder (`~` expanded).
        host: String,
        /// The container path as written, `:ro` included.
        container: String,
        /// Why it is refused: the rule it breaks, or that the host path does not exist.
        reason: String,
    },
}

/// What a config needs at least, shown when `agents` is missing or empty.
const AGENTS_EXAMPLE: &str = "e.g. agents: { beige: { model: { provider: \"anthropic\", model: \"claude-sonnet-4-6\" }, tools: [] } }";

fn missing_field_hint(field: &str) -> Option<String> {
    Some(match field {
        "agents" => format!("add at least one agent, {AGENTS_EXAMPLE}"),
        "llm" | "providers" => {
            "add a provider, e.g. llm: { providers: { anthropic: { apiKey: \"${ANTHROPIC_API_KEY}\" } } }"
                .to_string()
        }
        "model" => "e.g. model: { provider: \"anthropic\", model: \"claude-sonnet-4-6\" }".to_string(),
        "tools" => "list the plugin tools the agent may use, or [] for the core tools only".to_string(),
        "path" => "set the folder, relative to this config file or absolute".to_string(),
        _ => return None,
    })
}

/// `<file>: <path>` or just `<file>` at the root.
struct At<'a>(&'a Path, &'a str);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1.is_empty() {
            write!(f, "{}", self.0.display())
        } else {
            write!(f, "{}: {}", self.0.display(), self.1)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NotFound { file } => write!(
                f,
                "{}: no such config file — create one with `beige setup`, or pass another with --config",
                file.display()
            ),
            ConfigError::Read { file, error } => {
                write!(f, "{}: cannot read the config file: {error}", file.display())
            }
            ConfigError::Syntax {
                file,
                line,
                column,
                message,
                source_line,
            } => {
                write!(f, "{}", file.display())?;
                if let (Some(line), Some(column)) = (line, column) {
                    write!(f, ":{line}:{column}")?;
                }
                f.write_str(": invalid JSON5")?;
                if let Some(text) = source_line.as_deref().filter(|t| !t.is_empty()) {
                    write!(f, " in `{text}`")?;
                }
                write!(
                    f,
                    " ({message}) — usually a missing comma, colon, quote or bracket around this spot"
                )
            }
            ConfigError::UnsetVariable {
                file,
                path,
                variable,
            } => write!(
                f,
                "{}: environment variable '{variable}' is not set and has no default. \
                 Set it, or give a default with ${{{variable}:-default}} (${{{variable}:-}} for empty).",
                At(file, path)
            ),
            ConfigError::MissingField { file, path, field } => {
                write!(f, "{}: required but missing", At(file, path))?;
                match missing_field_hint(field) {
                    Some(hint) => write!(f, " — {hint}"),
                    None => Ok(()),
                }
            }
            ConfigError::Invalid {
                file,
                path,
                message,
            } => write!(f, "{}: {message}", At(file, path)),
            ConfigError::NoAgents { file } => write!(
                f,
                "{}: agents: no agents configured — add at least one, {AGENTS_EXAMPLE}",
                file.display()
            ),
            ConfigError::InvalidAgentName {
                file,
                path,
                agent,
                suggestion,
            } => write!(
                f,
                "{}: invalid agent name '{agent}' — names must match ^[a-z0-9][a-z0-9_-]{{0,62}}$ \
                 (lowercase letters, digits, '-' and '_'; at most 63 characters). \
                 Rename the agent, e.g. '{suggestion}'.",
                At(file, path)
            ),
            ConfigError::UnknownName {
                file,
                path,
                kind,
                name,
                suggestion,
                known,
            } => {
                write!(f, "{}: unknown {} '{name}'", At(file, path), kind.noun())?;
                if let Some(s) = suggestion {
                    write!(f, " — did you mean '{s}'?")?;
                } else {
                    f.write_str(" —")?;
                }
                let list = if known.is_empty() {
                    "(none)".to_string()
                } else {
                    known.join(", ")
                };
                write!(
                    f,
                    " {} {}s: {list}. {}",
                    kind.known_label(),
                    kind.noun(),
                    kind.fix()
                )
            }
            ConfigError::ProviderApiRequired {
                file,
                path,
                provider,
            } => write!(
                f,
                "{}: provider '{provider}' needs an 'api' — beige knows the wire format only for \
                 anthropic, openai and google. Set api to one of: anthropic-messages, \
                 openai-completions, openai-responses, google-generative-ai.",
                At(file, path)
            ),
            ConfigError::MountRefused {
                file,
                path,
                host,
                container,
                reason,
            } => write!(
                f,
                "{}: refusing to mount {host} at {container}: {reason}",
                At(file, path)
            ),
        }
    }
}

impl ConfigError {
    /// The config file the error is about.
    pub fn file(&self) -> &Path {
        match self {
            ConfigError::NotFound { file }
            | ConfigError::Read { file, .. }
            | ConfigError::Syntax { file, .. }
            | ConfigError::UnsetVariable { file, .. }
            | ConfigError::MissingField { file, .. }
            | ConfigError::Invalid { file, .. }
            | ConfigError::NoAgents { file }
            | ConfigError::InvalidAgentName { file, .. }
            | ConfigError::UnknownName { file, .. }
            | ConfigError::ProviderApiRequired { file, .. }
            | ConfigError::MountRefused { file, .. } => file,
        }
    }
}
