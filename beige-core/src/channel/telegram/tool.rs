//! The built-in `telegram` plugin: its tool lets an agent send a message or a photo to
//! Telegram — to the chat its session belongs to by default, to other chats only when
//! the config lists them.
//!
//! ```text
//! telegram send [--chat <id>] [--thread <id>] [--plain] <text…>   (or the text on stdin)
//! telegram photo [--chat <id>] [--thread <id>] <path> [caption…]
//! telegram sendMessage <chatId> [--thread <id>] <text…>           (the original's form)
//! telegram sendPhoto <chatId> [--thread <id>] <path> [caption…]   (the original's form)
//! ```
//!
//! Reachable chats, checked on every send: the current chat (when the call comes from a
//! Telegram session — the gateway's own record of it, whatever a script writes into its
//! request — and that session's key is the chat), the chats in `allowedChats`, and the
//! chats `agentMapping` gives to the calling agent. The
//! config is the one of the call (`plugins.telegram.config` merged with the agent's
//! `pluginConfigs.telegram`), so `allowedChats` can differ per agent. Photos are files of
//! the agent's workspace (read beneath a handle on it with [`crate::fsutil::Beneath`]:
//! no symlink is followed, only regular files are opened, at most 10 MB), uploaded with
//! `sendPhoto`. Everything goes through the channel's outbox — same retry, same order —
//! and the tool waits up to 20 s for Telegram to accept it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde_json::Value;

use super::config::TelegramConfig;
use super::format::{render_chunks, split_plain, Chunk, MAX_MESSAGE_LEN};
use super::outbox::{self, Delivery, OutItem};
use crate::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use crate::store::{ChannelState, PluginData};

/// Largest photo Telegram accepts for upload.
pub const MAX_PHOTO_BYTES: u64 = 10 * 1024 * 1024;
/// Longest photo caption.
pub const MAX_CAPTION_CHARS: usize = 1024;

/// The longest text one `telegram send` takes: 16 Telegram messages. A sandbox cannot
/// make one call queue megabytes in the outbox (which fills the store while Telegram is
/// unreachable); the per-agent audit budget bounds how many calls it makes.
pub const MAX_SEND_CHARS: usize = 16 * MAX_MESSAGE_LEN;
/// How long the tool waits for Telegram to accept a message.
const WAIT: Duration = Duration::from_secs(20);

const USAGE: &str = "Usage:
  telegram send [--chat <id>] [--thread <id>] [--plain] <text...>   send a message (Markdown; stdin if no text)
  telegram photo [--chat <id>] [--thread <id>] <path> [caption...]  send a photo from the workspace
Without --chat the message goes to the chat of the current Telegram session. Other chats
must be listed in plugins.telegram.config.allowedChats or mapped to this agent.";

/// The built-in `telegram` plugin. Enable it with `plugins: { telegram: { config: {…} } }`
/// and give agents the tool with `tools: ["telegram"]`.
#[derive(Debug, Default)]
pub struct TelegramPlugin {
    config: Option<TelegramConfig>,
}

impl TelegramPlugin {
    /// The plugin; its config is read from `plugins.telegram.config` when it registers
    /// (a wrong config stops the gateway from starting, with the field named).
    pub fn new() -> Self {
        Self::default()
    }

    /// The plugin with a config already parsed.
    pub fn with_config(config: TelegramConfig) -> Self {
        Self {
            config: Some(config),
        }
    }
}

#[async_trait]
impl Plugin for TelegramPlugin {
    fn name(&self) -> &str {
        "telegram"
    }

    async fn register(&self, ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        // Parse now so that a wrong config fails at start, not at the first call.
        if self.config.is_none() {
            TelegramConfig::from_value(&ctx.config).map_err(|e| PluginError::Failed {
                plugin: "telegram".into(),
                message: e.to_string(),
            })?;
        }
        reg.tool(Arc::new(TelegramTool {
            state: ctx.channel_state.clone(),
            data: ctx.store.clone(),
            fixed: self.config.clone(),
        }))
    }
}

/// The `telegram` tool.
#[derive(Debug)]
struct TelegramTool {
    /// The channel's outbox, where every message goes.
    state: Arc<dyn ChannelState>,
    /// Where the sender records a message Telegram refused.
    data: Arc<dyn PluginData>,
    /// A config given in code (else the call's config is used).
    fixed: Option<TelegramConfig>,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Send {
        chat: Option<i64>,
        thread: Option<i64>,
        plain: bool,
        text: String,
    },
    Photo {
        chat: Option<i64>,
        thread: Option<i64>,
        path: String,
        caption: Option<String>,
    },
    Help,
}

fn id_arg(flag: &str, v: Option<&String>) -> Result<i64, String> {
    let v = v.ok_or_else(|| format!("telegram: {flag} needs a value\n{USAGE}\n"))?;
    v.trim()
        .parse()
        .map_err(|_| format!("telegram: {flag} must be a numeric Telegram id, not {v:?}\n"))
}

impl Command {
    fn parse(args: &[String], stdin: Option<&[u8]>) -> Result<Self, String> {
        let Some((sub, rest)) = args.split_first() else {
            return Ok(Command::Help);
        };
        let original = matches!(
            sub.as_str(),
            "sendMessage" | "send_message" | "sendPhoto" | "send_photo"
        );
        let photo = matches!(sub.as_str(), "photo" | "sendPhoto" | "send_photo");
        if !photo
            && !matches!(
                sub.as_str(),
                "send" | "message" | "sendMessage" | "send_message"
            )
        {
            return match sub.as_str() {
                "help" | "--help" | "-h" => Ok(Command::Help),
                other => Err(format!("telegram: unknown command '{other}'\n{USAGE}\n")),
            };
        }
        let mut i = 0;
        let mut chat = None;
        let mut thread = None;
        let mut plain = false;
        if original {
            chat = Some(id_arg("the chat id", rest.first())?);
            i = 1;
        }
        while let Some(a) = rest.get(i) {
            match a.as_str() {
                "--chat" => {
                    chat = Some(id_arg("--chat", rest.get(i + 1))?);
                    i += 2;
                }
                "--thread" => {
                    thread = Some(id_arg("--thread", rest.get(i + 1))?);
                    i += 2;
                }
                "--plain" if !photo => {
                    plain = true;
                    i += 1;
                }
                "--" => {
                    i += 1;
                    break;
                }
                _ => break,
            }
        }
        let words = &rest[i.min(rest.len())..];
        if photo {
            let Some((path, caption)) = words.split_first() else {
                return Err(format!("telegram: photo needs a file path\n{USAGE}\n"));
            };
            let caption = caption.join(" ");
            if caption.chars().count() > MAX_CAPTION_CHARS {
                return Err(format!(
                    "telegram: the caption is longer than Telegram's {MAX_CAPTION_CHARS} characters\n"
                ));
            }
            return Ok(Command::Photo {
                chat,
                thread,
                path: path.clone(),
                caption: (!caption.is_empty()).then_some(caption),
            });
        }
        let mut text = words.join(" ");
        if text.trim().is_empty() {
            if let Some(bytes) = stdin {
                text = String::from_utf8_lossy(bytes).trim_end().to_string();
            }
        }
        if text.trim().is_empty() {
            return Err(format!("telegram: send needs some text\n{USAGE}\n"));
        }
        let chars = text.chars().count();
        if chars > MAX_SEND_CHARS {
            return Err(format!(
                "telegram: the text is {chars} characters; one send takes at most {MAX_SEND_CHARS} (16 messages) — send a summary, or the details as a file with `telegram photo` or in several sends\n"
            ));
        }
        Ok(Command::Send {
            chat,
            thread,
            plain,
            text,
        })
    }
}

/// Chat ids in `config[key]` (numbers or numeric strings, lists or comma-separated).
fn config_ids(config: &Value, key: &str) -> Vec<i64> {
    let mut out = Vec::new();
    let mut push = |v: &Value| match v {
        Value::Number(n) => out.extend(n.as_i64()),
        Value::String(s) => out.extend(
            s.split(|c: char| c == ',' || c.is_whitespace())
                .filter_map(|x| x.parse::<i64>().ok()),
        ),
        _ => {}
    };
    match config.get(key) {
        Some(Value::Array(items)) => items.iter().for_each(&mut push),
        Some(v) => push(v),
        None => {}
    }
    out
}

impl TelegramTool {
    /// May `agent` reach `chat`?
    fn reachable(&self, config: &Value, agent: &str, chat: i64) -> bool {
        if let Some(fixed) = &self.fixed {
            return fixed.allowed_chats.contains(&chat)
                || fixed.agent_mapping.by_id.get(&chat).map(String::as_str) == Some(agent);
        }
        if config_ids(config, "allowedChats").contains(&chat) {
            return true;
        }
        config
            .get("agentMapping")
            .and_then(|m| m.get(chat.to_string()))
            .and_then(Value::as_str)
            == Some(agent)
    }

    /// The chat and thread a message goes to, or the reason it may not. Every send is
    /// checked: a chat is reachable when it is in `allowedChats`, mapped to the agent, or
    /// the chat of the call's session — and only when the session is a Telegram session
    /// whose key is that very chat (`telegram:<chat>[:<thread>]`), so a session record
    /// that disagrees with its key reaches nothing beyond the config's chats.
    fn target(
        &self,
        call: &ToolCall,
        chat: Option<i64>,
        thread: Option<i64>,
    ) -> Result<(i64, Option<i64>), String> {
        let current = session_chat(&call.session);
        let chat = match (chat, current) {
            (Some(c), _) => c,
            (None, Some((c, _))) => c,
            (None, None) => {
                return Err(format!(
                    "telegram: this session ({}) is not a Telegram chat; name one with --chat <id> (it must be listed in plugins.telegram.config.allowedChats)\n",
                    call.session.key
                ))
            }
        };
        match current {
            Some((c, current_thread)) if c == chat => Ok((chat, thread.or(current_thread))),
            _ if self.reachable(&call.config, &call.session.agent, chat) => Ok((chat, thread)),
            _ => Err(format!(
                "telegram: agent '{}' may not send to chat {chat}; add it to plugins.telegram.config.allowedChats (or the agent's pluginConfigs.telegram.allowedChats)\n",
                call.session.agent
            )),
        }
    }

    async fn deliver(
        &self,
        item: OutItem,
        what: &str,
        chat: i64,
        thread: Option<i64>,
    ) -> ToolResult {
        let id = match outbox::enqueue(&*self.state, &item).await {
            Ok(id) => id,
            Err(e) => {
                return ToolResult::fail(format!("telegram: cannot queue the {what}: {e}\n"), 1)
            }
        };
        let place = match thread {
            Some(t) => format!("chat {chat} (thread {t})"),
            None => format!("chat {chat}"),
        };
        match outbox::wait_settled(&*self.state, &*self.data, id, WAIT).await {
            Ok(Delivery::Sent) => ToolResult::ok(format!("{what} sent to {place}\n")),
            Ok(Delivery::Failed(e)) => {
                ToolResult::fail(format!("telegram: Telegram did not accept the {what}: {e}\n"), 1)
            }
            Ok(Delivery::Pending) => ToolResult::ok(format!(
                "{what} queued for {place}; Telegram has not accepted it yet, it is retried automatically\n"
            )),
            Err(e) => ToolResult::fail(format!("telegram: queued, but its state is unknown: {e}\n"), 1),
        }
    }
}

/// The chat (and thread) of a Telegram session, when its chat and thread agree with its
/// key; `None` for any other session.
fn session_chat(session: &crate::plugin::SessionInfo) -> Option<(i64, Option<i64>)> {
    if session.channel != "telegram" {
        return None;
    }
    let chat = session.chat_id.as_deref()?.trim().parse::<i64>().ok()?;
    let thread = match session.thread_id.as_deref() {
        Some(t) => Some(t.trim().parse::<i64>().ok()?),
        None => None,
    };
    (session.key == super::session_key(chat, thread)).then_some((chat, thread))
}

fn mime_of(path: &str) -> Option<&'static str> {
    let ext = path.rsplit('.').next()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "gif" => "image/gif",
        "webp" => "image/webp",
        _ => return None,
    })
}

#[async_trait]
impl Tool for TelegramTool {
    fn name(&self) -> &str {
        "telegram"
    }

    fn description(&self) -> &str {
        "Send a message or a photo to Telegram: the current chat, or a chat the config allows."
    }

    fn commands(&self) -> Vec<String> {
        [
            "telegram send [--chat <id>] [--thread <id>] [--plain] <text...>",
            "telegram photo [--chat <id>] [--thread <id>] <path> [caption...]",
        ]
        .map(String::from)
        .to_vec()
    }

    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        let command = match Command::parse(&call.args, call.stdin.as_deref()) {
            Ok(c) => c,
            Err(usage) => return Ok(ToolResult::fail(usage, 2)),
        };
        match command {
            Command::Help => Ok(ToolResult::ok(format!(
                "telegram — {}\n\n{USAGE}\n",
                self.description()
            ))),
            Command::Send {
                chat,
                thread,
                plain,
                text,
            } => {
                let (chat, thread) = match self.target(&call, chat, thread) {
                    Ok(t) => t,
                    Err(e) => return Ok(ToolResult::fail(e, 1)),
                };
                let chunks = if plain {
                    split_plain(&text, MAX_MESSAGE_LEN)
                        .into_iter()
                        .map(|p| Chunk {
                            html: super::format::escape_html(&p),
                            plain: p,
                        })
                        .collect()
                } else {
                    render_chunks(&text, MAX_MESSAGE_LEN)
                };
                let item = OutItem::text(chat, thread, chunks);
                Ok(self.deliver(item, "Message", chat, thread).await)
            }
            Command::Photo {
                chat,
                thread,
                path,
                caption,
            } => {
                let (chat, thread) = match self.target(&call, chat, thread) {
                    Ok(t) => t,
                    Err(e) => return Ok(ToolResult::fail(e, 1)),
                };
                let Some(mime) = mime_of(&path) else {
                    return Ok(ToolResult::fail(
                        format!("telegram: {path} is not a photo (jpg, png, gif or webp)\n"),
                        1,
                    ));
                };
                let rel = match call.cwd.as_deref().filter(|c| !c.is_empty()) {
                    Some(cwd) if !path.starts_with('/') => format!("{cwd}/{path}"),
                    _ => path.clone(),
                };
                let rel = rel.strip_prefix("/workspace/").unwrap_or(&rel).to_string();
                // Read beneath a handle on the workspace: no symlink followed, nothing
                // but a regular file opened, never more than Telegram's limit read.
                let workspace = call.workspace.clone();
                let cap = usize::try_from(MAX_PHOTO_BYTES).unwrap_or(usize::MAX);
                let what = rel.clone();
                let read = crate::fsutil::blocking(move || {
                    crate::fsutil::Beneath::open(&workspace)?.read(&what, cap)
                })
                .await;
                let data = match read {
                    Ok(c) if c.truncated => {
                        return Ok(ToolResult::fail(
                            format!(
                            "telegram: {path} is {} bytes; Telegram accepts photos up to 10 MB\n",
                            c.size
                        ),
                            1,
                        ))
                    }
                    Ok(c) => c.bytes,
                    Err(e) => {
                        return Ok(ToolResult::fail(
                            format!("telegram: cannot send {path}: {e}\n"),
                            1,
                        ))
                    }
                };
                let file_name = std::path::Path::new(&rel)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "photo".into());
                let item = OutItem::Photo {
                    chat_id: chat,
                    thread_id: thread,
                    file_name,
                    mime: mime.to_string(),
                    data: base64::engine::general_purpose::STANDARD.encode(&data),
                    caption,
                };
                Ok(self.deliver(item, "Photo", chat, thread).await)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn command_lines() {
        assert_eq!(
            Command::parse(&args("send hello there"), None).unwrap(),
            Command::Send {
                chat: None,
                thread: None,
                plain: false,
                text: "hello there".into()
            }
        );
        assert_eq!(
            Command::parse(&args("send --chat -100 --thread 7 hi"), None).unwrap(),
            Command::Send {
                chat: Some(-100),
                thread: Some(7),
                plain: false,
                text: "hi".into()
            }
        );
        assert_eq!(
            Command::parse(&args("sendMessage 42 hi --chat x"), None).unwrap(),
            Command::Send {
                chat: Some(42),
                thread: None,
                plain: false,
                text: "hi --chat x".into()
            }
        );
        assert_eq!(
            Command::parse(&args("send"), Some(b"from stdin\n")).unwrap(),
            Command::Send {
                chat: None,
                thread: None,
                plain: false,
                text: "from stdin".into()
            }
        );
        assert_eq!(
            Command::parse(&args("photo out/chart.png the chart"), None).unwrap(),
            Command::Photo {
                chat: None,
                thread: None,
                path: "out/chart.png".into(),
                caption: Some("the chart".into())
            }
        );
        assert!(Command::parse(&args("send"), None).is_err());
        let huge = "x".repeat(MAX_SEND_CHARS + 1);
        let e = Command::parse(&args("send"), Some(huge.as_bytes())).unwrap_err();
        assert!(e.contains("one send takes at most 65536"), "{e}");
        let most = "x".repeat(MAX_SEND_CHARS);
        assert!(Command::parse(&args("send"), Some(most.as_bytes())).is_ok());
        assert!(Command::parse(&args("send --chat abc hi"), None).is_err());
        assert!(Command::parse(&args("frobnicate"), None).is_err());
        assert_eq!(Command::parse(&[], None).unwrap(), Command::Help);
    }

    #[test]
    fn only_a_session_whose_chat_matches_its_key_has_a_chat() {
        let s = |key: &str, channel: &str, chat: Option<&str>, thread: Option<&str>| {
            session_chat(&crate::plugin::SessionInfo {
                agent: "a".into(),
                key: key.into(),
                channel: channel.into(),
                chat_id: chat.map(String::from),
                thread_id: thread.map(String::from),
            })
        };
        assert_eq!(
            s("telegram:42", "telegram", Some("42"), None),
            Some((42, None))
        );
        assert_eq!(
            s("telegram:-100:7", "telegram", Some("-100"), Some("7")),
            Some((-100, Some(7)))
        );
        assert_eq!(s("telegram:42", "telegram", Some("-999"), None), None);
        assert_eq!(s("telegram:42", "telegram", Some("42"), Some("7")), None);
        assert_eq!(s("api:a:default", "telegram", Some("42"), None), None);
        assert_eq!(s("telegram:42", "api", Some("42"), None), None);
        assert_eq!(s("telegram:42", "telegram", None, None), None);
    }

    #[test]
    fn ids_from_config() {
        let c = json!({"allowedChats": [-100, "7", "8, 9"]});
        assert_eq!(config_ids(&c, "allowedChats"), [-100, 7, 8, 9]);
        assert!(config_ids(&c, "missing").is_empty());
        assert_eq!(mime_of("a/b.JPG"), Some("image/jpeg"));
        assert_eq!(mime_of("a/b.txt"), None);
    }
}
