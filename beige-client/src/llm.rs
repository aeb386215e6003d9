//! The provider-neutral message vocabulary: [`Message`] and its [`Block`]s, [`Usage`],
//! the [`ErrorKind`] of a failed model call, a model's catalogue data ([`ModelInfo`]) and
//! [`ThinkingLevel`] (beige-core re-exports them from `llm`, `llm::catalog` and `config`).
//!
//! Sessions store these messages, [`Sessions::session_messages`](crate::Sessions)
//! returns them and prompt events carry usage and error kinds. The model calls
//! themselves (requests, streams, provider errors, clients) are beige-core's.

use serde::{Deserialize, Serialize};

/// Who said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user, and tool results.
    User,
    /// The model.
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Base64 image data.
    Image {
        /// Base64 of the image's bytes.
        data: String,
        /// e.g. `image/png`.
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
    /// Model reasoning. Anthropic's signature must be sent back unchanged.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// The provider's signature of it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// The model asks for a tool call.
    ToolUse {
        /// The call's id, repeated by its result.
        id: String,
        /// The tool.
        name: String,
        /// The tool's parameters.
        input: serde_json::Value,
    },
    /// The result of the tool call with the same id (in a user message).
    ToolResult {
        /// The id of the [`Block::ToolUse`] this answers.
        #[serde(rename = "toolUseId")]
        tool_use_id: String,
        /// What the tool returned.
        content: Vec<ToolResultPart>,
        /// The call failed or was refused.
        #[serde(rename = "isError", default)]
        is_error: bool,
    },
}

/// Content of a tool result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolResultPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// An image (a `read` of an image file).
    Image {
        /// Base64 of the image's bytes.
        data: String,
        /// e.g. `image/png`.
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What was said, in order.
    pub content: Vec<Block>,
}

impl Message {
    /// A user message of one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// An assistant message of one text block.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// All text blocks, joined.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("")
    }

    /// The tool calls in this message, in order.
    pub fn tool_uses(&self) -> Vec<(&str, &str, &serde_json::Value)> {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
                _ => None,
            })
            .collect()
    }
}

/// Token usage of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Tokens sent to the model (cache reads and writes not included).
    pub input_tokens: u64,
    /// Tokens the model produced.
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Input tokens written to the provider's prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// The tokens a budget counts: input + output + cache writes (cache reads are cheap
    /// and left out).
    pub fn budget_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_write_tokens
    }

    /// Add `other` to this usage, field by field.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }
}

/// What kind of failure, for fallback decisions and user-facing hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// 429 or the provider's rate-limit error type: cool the model down.
    RateLimit,
    /// 529 / 503 / overloaded: transient, no global cooldown.
    Overloaded,
    /// The prompt does not fit the context window: compact and retry once.
    ContextOverflow,
    /// 401 / 403: the key is wrong or lacks access.
    Auth,
    /// No event within the idle timeout, or the watchdog fired.
    Timeout,
    /// A 4xx the request itself caused.
    InvalidRequest,
    /// Connection failures, 5xx, malformed or cut-off streams.
    Other,
    /// Not a model failure: a budget (`budgets.*`) was reached and the turn ended before
    /// the next model call.
    BudgetExhausted,
    /// Not a model failure: the prompt's idempotency key was used for another message in
    /// the same session within the last day, so neither is answered with the other.
    IdempotencyConflict,
}

/// What the gateway needs to know about a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    /// The provider's model id.
    pub id: String,
    /// Tokens of context the model accepts.
    pub context_window: u64,
    /// Most tokens the model produces in one call.
    pub max_output_tokens: u32,
    /// Whether it accepts image input.
    pub images: bool,
    /// Whether it supports reasoning controls.
    pub reasoning: bool,
    /// US dollars per million input tokens.
    pub cost_input: f64,
    /// US dollars per million output tokens.
    pub cost_output: f64,
    /// US dollars per million input tokens read from the prompt cache.
    #[serde(default)]
    pub cost_cache_read: f64,
    /// US dollars per million input tokens written to the prompt cache.
    #[serde(default)]
    pub cost_cache_write: f64,
    /// Whether the prices come from the catalogue or the config (`false`: an unknown
    /// model whose prices are all 0 because nobody said what it costs).
    #[serde(default = "yes")]
    pub priced: bool,
}

fn yes() -> bool {
    true
}

impl ModelInfo {
    /// The cost of `usage` in millionths of a US dollar, rounded. A price per million
    /// tokens is a price in micro-dollars per token, so this is exact for whole-cent
    /// prices.
    pub fn cost_micros(&self, usage: &Usage) -> i64 {
        let micros = usage.input_tokens as f64 * self.cost_input
            + usage.output_tokens as f64 * self.cost_output
            + usage.cache_read_tokens as f64 * self.cost_cache_read
            + usage.cache_write_tokens as f64 * self.cost_cache_write;
        micros.round() as i64
    }

    /// The cost of `usage` in US dollars (cache reads and writes included).
    pub fn cost(&self, usage: &Usage) -> f64 {
        self.cost_micros(usage) as f64 / 1_000_000.0
    }
}

// How hard a model thinks: `off` (the default), `minimal`, `low`, `medium`, `high`.
// No doc comments here: they would become descriptions in `config.schema.json`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ThinkingLevel {
    #[default]
    Off,
    Minimal,
    Low,
    Medium,
    High,
}
