//! The core-tool calls a client can make through [`Gateway::call_tool`](crate::Gateway)
//! and what they return: [`CoreToolCall`] and its parameters, [`InvalidCall`],
//! [`ToolOutput`] with its [`ContentBlock`]s and [`Transport`], and the caller's
//! [`ToolContext`] (beige-core re-exports them from `tools` and `sandbox`).
//!
//! Names and parameters are the original's, because models and prompts rely on them.
//! Running a call (the shim operation, policy, hooks, audit) is the gateway's.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::principal::Principal;

/// A parsed core-tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tool", content = "params", rename_all = "lowercase")]
pub enum CoreToolCall {
    /// `read {path, offset?, limit?}`.
    Read(ReadParams),
    /// `write {path, content}`.
    Write(WriteParams),
    /// `patch {path, oldText, newText}`.
    Patch(PatchParams),
    /// `exec {command, timeout?}`.
    Exec(ExecParams),
}

/// Parameters of `read`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadParams {
    /// File path, relative to `/workspace` or absolute.
    pub path: String,
    /// 1-based line to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Number of lines to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// Parameters of `write`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WriteParams {
    /// File path, relative to `/workspace` or absolute.
    pub path: String,
    /// The complete file content.
    pub content: String,
}

/// Parameters of `patch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchParams {
    /// File path, relative to `/workspace` or absolute.
    pub path: String,
    /// The exact text to replace; must occur exactly once.
    pub old_text: String,
    /// The replacement text.
    pub new_text: String,
}

/// Parameters of `exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecParams {
    /// The shell command (`sh -c`).
    pub command: String,
    /// Seconds; default 900, capped by `sandbox.maxExecTimeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// A call that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidCall {
    /// The tool named by the call.
    pub tool: String,
    /// What is wrong, and the expected parameters.
    pub message: String,
}

impl CoreToolCall {
    /// Parse a call from the tool name and its JSON parameters.
    pub fn parse(tool: &str, params: serde_json::Value) -> Result<Self, InvalidCall> {
        let invalid = |message: String| InvalidCall {
            tool: tool.to_string(),
            message,
        };
        let usage = match tool {
            "read" => "read {path, offset?, limit?}",
            "write" => "write {path, content}",
            "patch" => "patch {path, oldText, newText}",
            "exec" => "exec {command, timeout?}",
            other => {
                return Err(invalid(format!(
                    "unknown core tool '{other}'; the core tools are read, write, patch and exec"
                )))
            }
        };
        let tagged = serde_json::json!({ "tool": tool, "params": params });
        serde_json::from_value(tagged).map_err(|e| {
            invalid(format!(
                "invalid parameters for {tool}: {e}. Expected {usage}."
            ))
        })
    }

    /// The tool's name: `read`, `write`, `patch` or `exec`.
    pub fn name(&self) -> &'static str {
        match self {
            CoreToolCall::Read(_) => "read",
            CoreToolCall::Write(_) => "write",
            CoreToolCall::Patch(_) => "patch",
            CoreToolCall::Exec(_) => "exec",
        }
    }

    /// The parameters as JSON (for audit records and events).
    pub fn params(&self) -> serde_json::Value {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(mut m)) => m.remove("params").unwrap_or_default(),
            _ => serde_json::Value::Null,
        }
    }
}

/// One block of a tool result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// An image.
    Image {
        /// Base64 of the image's bytes.
        data: String,
        /// e.g. `image/png`.
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
}

/// A tool result as the model (and the HTTP API) sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolOutput {
    /// What the tool returned, in order.
    pub content: Vec<ContentBlock>,
    /// The call failed or was refused (the content says why).
    pub is_error: bool,
    /// How a core tool reached the sandbox (`link-unix`, `link-attach`,
    /// `docker-exec`); absent for plugin tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    /// Whether the call ran, was refused or failed; not part of the JSON (see
    /// [`ToolOutput::outcome`]).
    #[serde(skip)]
    outcome: ToolOutcome,
}

/// What became of a tool call on the gateway's guarded path: it ran (its result may
/// still be an error, e.g. a non-zero exit code), it was refused before running
/// (policy, a `preToolExec` hook, low disk space) or running it failed (the sandbox
/// or the tool could not carry it out).
///
/// Only the gateway that ran the call knows it: the HTTP API's JSON does not carry it,
/// so an output read back over HTTP says [`ToolOutcome::Ran`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ToolOutcome {
    /// The call ran; `is_error` says whether its result is an error.
    #[default]
    Ran,
    /// The call was refused before it ran; the content says why.
    Denied,
    /// The call was allowed but could not be carried out; the content says why.
    Failed,
}

impl ToolOutput {
    /// A result of the given blocks, with no transport, that [`ran`](ToolOutcome::Ran).
    pub fn new(content: Vec<ContentBlock>, is_error: bool) -> Self {
        Self {
            content,
            is_error,
            transport: None,
            outcome: ToolOutcome::Ran,
        }
    }

    /// A successful result of one text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(vec![ContentBlock::Text { text: text.into() }], false)
    }

    /// A failed result of one text block.
    pub fn error(text: impl Into<String>) -> Self {
        Self::new(vec![ContentBlock::Text { text: text.into() }], true)
    }

    /// Whether the call ran, was denied or failed ([`ToolOutcome::Ran`] unless the
    /// gateway's guarded path said otherwise).
    pub fn outcome(&self) -> ToolOutcome {
        self.outcome
    }

    /// The same output with `outcome` (for gateways and tests).
    pub fn with_outcome(mut self, outcome: ToolOutcome) -> Self {
        self.outcome = outcome;
        self
    }

    /// All text blocks joined (images left out).
    pub fn joined_text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                ContentBlock::Image { .. } => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One of an agent's tools, called for an outside client (the MCP server):
/// [`Admin::call_agent_tool`](crate::Admin::call_agent_tool).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentToolCall {
    /// A core tool, run in the agent's sandbox.
    Core(CoreToolCall),
    /// A plugin tool the agent may use, run in the gateway like a script's call.
    Plugin {
        /// The tool's name.
        tool: String,
        /// Its arguments, as a script would pass them.
        args: Vec<String>,
        /// Data piped in.
        stdin: Option<Vec<u8>>,
    },
}

/// Who is calling, for the environment of `exec` and for image support.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolContext {
    /// The session the call belongs to.
    pub session_key: Option<String>,
    /// The channel it came from.
    pub channel: Option<String>,
    /// The channel's chat.
    pub chat_id: Option<String>,
    /// The channel's thread in the chat.
    pub thread_id: Option<String>,
    /// The current model as `provider/model`, when a model is involved.
    pub model: Option<String>,
    /// Whether the current model accepts image input.
    pub model_accepts_images: bool,
    /// Who the call comes from, for policy: the prompt's principal for a model's calls,
    /// set by the channel for its own (default `Unverified`).
    pub principal: Principal,
    /// Whether a person answers approvals for this call (the prompt was sent with
    /// `approvals: stream`); when not, a call that needs approval is denied at once.
    pub attended: bool,
}

/// How an operation reached the sandbox: a name a backend chooses (`link-unix`,
/// `link-attach` and `docker-exec` for Docker, `direct` for one that runs operations
/// itself), serialised as that string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Transport(Cow<'static, str>);

impl Transport {
    /// The shim link over `run/<agent>/ctl.sock`.
    pub const LINK_UNIX: Transport = Transport(Cow::Borrowed("link-unix"));
    /// The shim link over the container's attached stdin/stdout.
    pub const LINK_ATTACH: Transport = Transport(Cow::Borrowed("link-attach"));
    /// A `docker exec` per operation (no link, or the link was down).
    pub const DOCKER_EXEC: Transport = Transport(Cow::Borrowed("docker-exec"));
    /// A sandbox that runs operations itself (tests, embedders).
    pub const DIRECT: Transport = Transport(Cow::Borrowed("direct"));

    /// A transport of another backend, e.g. `k8s-exec`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Transport(name.into())
    }

    /// The name in results and audit records (`link-unix`, …).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<beige_protocol::link::Carrier> for Transport {
    fn from(c: beige_protocol::link::Carrier) -> Self {
        match c {
            beige_protocol::link::Carrier::Unix => Transport::LINK_UNIX,
            beige_protocol::link::Carrier::Attach => Transport::LINK_ATTACH,
        }
    }
}
