//! LLM providers: the provider-neutral message format, the streamed events of one model
//! call, typed provider errors, the model catalogue and the [`LlmProvider`] trait.
//!
//! Owns what a model call *is*, independent of any wire format. Each client module
//! (`anthropic`, `openai_completions`, `openai_responses`, `google`) translates these
//! types to and from one API. Nothing here knows about sessions, fallback or tools'
//! execution — that is the agent loop's business. API keys live inside the clients and
//! never appear in `Debug` output, errors or logs.

#[cfg(feature = "anthropic")]
pub mod anthropic;
pub mod catalog;
#[cfg(feature = "google")]
pub mod google;
pub mod messages;
#[cfg(feature = "openai")]
pub mod openai_completions;
#[cfg(feature = "openai")]
pub mod openai_responses;
pub mod scripted;
#[cfg(any(feature = "anthropic", feature = "openai", feature = "google"))]
// The Google client streams but reads its errors itself.
#[cfg_attr(not(any(feature = "anthropic", feature = "openai")), allow(dead_code))]
pub mod sse;
#[cfg(test)]
#[cfg(any(feature = "anthropic", feature = "openai", feature = "google"))]
mod test_support;

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::Stream;
use serde::{Deserialize, Serialize};

use crate::config::{ProviderApi, ThinkingLevel};

pub use beige_client::llm::{Block, Message, Role, ToolResultPart};
pub use messages::Messages;

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls the tool by (the gateway offers the core tools: `read`,
    /// `write`, `patch`, `exec`).
    pub name: String,
    /// What the tool does, as the model is told.
    pub description: String,
    /// JSON Schema of the input object.
    pub input_schema: serde_json::Value,
}

/// One model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The provider's model id.
    pub model: String,
    /// The system prompt; empty for none.
    pub system: String,
    /// The conversation so far, oldest first; the model continues after the last one.
    /// A [`Messages`] list, not a `Vec`: clones share the messages, so the agent loop
    /// hands each call a long session's history plus the turn's new messages without
    /// copying the history (`vec![..].into()` makes one from a `Vec`).
    pub messages: Messages,
    /// The tools the model may call in its answer; empty for none.
    pub tools: Vec<ToolSpec>,
    /// The most tokens the model may produce in its answer.
    pub max_tokens: u32,
    /// How much the model should reason before answering.
    pub thinking: ThinkingLevel,
    /// Whether the model supports reasoning controls (else `thinking` is ignored).
    pub reasoning: bool,
}

pub use beige_client::llm::Usage;

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its answer.
    EndTurn,
    /// The model stopped to have its tool calls run.
    ToolUse,
    /// The answer hit the request's `max_tokens` and was cut off.
    MaxTokens,
    /// Anything else the provider said.
    Other(String),
}

/// The complete answer of one model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// Text, thinking and tool-use blocks in the order the model produced them.
    pub content: Vec<Block>,
    /// Why the model stopped.
    pub stop_reason: StopReason,
    /// The tokens the call consumed, as the provider reported them.
    pub usage: Usage,
}

/// What a streaming model call yields. Exactly one `Completed` ends a good stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// The next piece of the answer's text.
    TextDelta(String),
    /// The next piece of the model's reasoning, for providers that show it.
    ThinkingDelta(String),
    /// The model started a tool call (its input arrives later, in `Completed`).
    ToolUseStarted {
        /// The call's id, which its tool result answers.
        id: String,
        /// The tool called.
        name: String,
    },
    /// The model is done: the whole response, with the text and thinking of the deltas
    /// before it.
    Completed(ModelResponse),
}

/// A stream of events from one model call.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, LlmError>> + Send>>;

pub use beige_client::llm::ErrorKind;

/// A provider call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The provider answered with an error status (or an error event mid-stream).
    #[error("{provider} answered HTTP {status}{}: {message}", error_type.as_deref().map(|t| format!(" ({t})")).unwrap_or_default())]
    Api {
        /// The configured provider name.
        provider: String,
        /// The HTTP status; for an error event mid-stream, the status its error type
        /// stands for.
        status: u16,
        /// `retry-after`, parsed from seconds or an HTTP date.
        retry_after: Option<Duration>,
        /// The provider's error type or code (`rate_limit_error`, `RESOURCE_EXHAUSTED`,
        /// …), when it gave one; [`LlmError::kind`] classifies by it.
        error_type: Option<String>,
        /// The provider's error message, or the body shortened, or the status's reason
        /// phrase.
        message: String,
    },
    /// The provider's API could not be reached.
    #[error("{provider}: could not reach the API: {message}")]
    Transport {
        /// The configured provider name.
        provider: String,
        /// The HTTP client's error with its causes (DNS, connect, TLS, a dropped
        /// connection, …).
        message: String,
    },
    /// The stream sent nothing for too long and was abandoned.
    #[error("{provider}: no data for {} s; the stream was abandoned", .idle.as_secs())]
    IdleTimeout {
        /// The configured provider name.
        provider: String,
        /// How long the stream had been silent.
        idle: Duration,
    },
    /// The stream ended before the response was complete.
    #[error("{provider}: the stream ended before the response was complete")]
    Truncated {
        /// The configured provider name.
        provider: String,
    },
    /// The provider's response could not be read.
    #[error("{provider}: unreadable response: {message}")]
    Decode {
        /// The configured provider name.
        provider: String,
        /// What could not be parsed.
        message: String,
    },
    /// The provider's configuration is unusable.
    #[error("{provider}: {message}")]
    Config {
        /// The configured provider name.
        provider: String,
        /// What is wrong with it.
        message: String,
    },
    /// The client of the provider's API was left out of this build of beige-core (its
    /// cargo feature is off).
    #[error("provider '{provider}': the {client} provider is not compiled in (cargo feature `{feature}`)")]
    NotCompiledIn {
        /// The configured provider name.
        provider: String,
        /// `anthropic`, `openai` or `google`.
        client: &'static str,
        /// The cargo feature of beige-core that compiles it in.
        feature: &'static str,
    },
}

impl LlmError {
    /// Classify by status and error type — never by searching message text.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LlmError::Api {
                status, error_type, ..
            } => {
                let t = error_type.as_deref().unwrap_or("");
                match (*status, t) {
                    (429, _)
                    | (_, "rate_limit_error" | "rate_limit_exceeded" | "RESOURCE_EXHAUSTED") => {
                        ErrorKind::RateLimit
                    }
                    (529 | 503, _) | (_, "overloaded_error" | "UNAVAILABLE") => {
                        ErrorKind::Overloaded
                    }
                    (_, "context_length_exceeded" | "context_overflow") => {
                        ErrorKind::ContextOverflow
                    }
                    (401 | 403, _) | (_, "authentication_error" | "permission_error") => {
                        ErrorKind::Auth
                    }
                    (413, _) => ErrorKind::ContextOverflow,
                    (400..=499, _) => ErrorKind::InvalidRequest,
                    _ => ErrorKind::Other,
                }
            }
            LlmError::IdleTimeout { .. } => ErrorKind::Timeout,
            _ => ErrorKind::Other,
        }
    }

    /// `retry-after` when the provider gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// One streamed model call in the provider-neutral format.
#[async_trait]
pub trait LlmProvider: Send + Sync + std::fmt::Debug {
    /// The configured provider name (`anthropic`, `ollama`, …).
    fn name(&self) -> &str;

    /// Start the call. Errors before the first byte (HTTP status errors included) are
    /// returned here; errors after it arrive in the stream. Never retried after the
    /// first byte.
    async fn stream(&self, request: ModelRequest) -> Result<EventStream, LlmError>;
}

/// Wrap an API key so it never shows in `Debug` output.
#[derive(Clone, Default)]
pub struct ApiKey(Option<String>);

impl ApiKey {
    /// Wrap `key`; an empty key counts as none.
    pub fn new(key: Option<String>) -> Self {
        Self(key.filter(|k| !k.is_empty()))
    }

    /// The key itself, for the one place that sends it; `None` when there is no key.
    pub fn expose(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ApiKey(***)"
        } else {
            "ApiKey(none)"
        })
    }
}

/// Parse `retry-after`: seconds, or an HTTP date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

/// The default wire format of a provider name, if it is a well-known one.
pub fn default_api(provider: &str) -> Option<ProviderApi> {
    match provider {
        "anthropic" => Some(ProviderApi::AnthropicMessages),
        "openai" => Some(ProviderApi::OpenAiCompletions),
        "google" => Some(ProviderApi::GoogleGenerativeAi),
        _ => None,
    }
}

/// The default base URL of a well-known provider name.
pub fn default_base_url(provider: &str) -> Option<&'static str> {
    match provider {
        "anthropic" => Some("https://api.anthropic.com"),
        "openai" => Some("https://api.openai.com/v1"),
        "google" => Some("https://generativelanguage.googleapis.com"),
        _ => None,
    }
}

/// Build the client of a configured provider: the `api` (or the provider name's
/// default), the base URL (or the default), the key and extra headers. An API whose
/// client is not compiled in is [`LlmError::NotCompiledIn`].
// Without some provider feature, what only its client would use goes unused.
#[cfg_attr(
    not(all(feature = "anthropic", feature = "openai", feature = "google")),
    allow(unused_variables)
)]
pub fn client_for(
    name: &str,
    config: &crate::config::ProviderConfig,
) -> Result<std::sync::Arc<dyn LlmProvider>, LlmError> {
    let api = config.api.or_else(|| default_api(name)).ok_or_else(|| LlmError::Config {
        provider: name.to_string(),
        message: "unknown provider name without `api`: set llm.providers.<name>.api (anthropic-messages, openai-completions, openai-responses or google-generative-ai) and baseUrl".into(),
    })?;
    let base = config
        .base_url
        .clone()
        .or_else(|| default_base_url(name).map(str::to_string))
        .or_else(|| match api {
            ProviderApi::AnthropicMessages => default_base_url("anthropic").map(str::to_string),
            ProviderApi::OpenAiCompletions | ProviderApi::OpenAiResponses => {
                default_base_url("openai").map(str::to_string)
            }
            ProviderApi::GoogleGenerativeAi => default_base_url("google").map(str::to_string),
        })
        .unwrap_or_default();
    let key = ApiKey::new(config.api_key.clone());
    let headers: Vec<(String, String)> = config
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    #[cfg(not(all(feature = "anthropic", feature = "openai", feature = "google")))]
    let not_compiled = |client: &'static str| LlmError::NotCompiledIn {
        provider: name.to_string(),
        client,
        feature: client,
    };
    match api {
        #[cfg(feature = "anthropic")]
        ProviderApi::AnthropicMessages => Ok(std::sync::Arc::new(anthropic::AnthropicClient::new(
            name, &base, key, headers,
        )?)),
        #[cfg(feature = "openai")]
        ProviderApi::OpenAiCompletions => Ok(std::sync::Arc::new(
            openai_completions::OpenAiCompletionsClient::new(name, &base, key, headers)?,
        )),
        #[cfg(feature = "openai")]
        ProviderApi::OpenAiResponses => Ok(std::sync::Arc::new(
            openai_responses::OpenAiResponsesClient::new(name, &base, key, headers)?,
        )),
        #[cfg(feature = "google")]
        ProviderApi::GoogleGenerativeAi => Ok(std::sync::Arc::new(google::GoogleClient::new(
            name, &base, key, headers,
        )?)),
        #[cfg(not(feature = "anthropic"))]
        ProviderApi::AnthropicMessages => Err(not_compiled("anthropic")),
        #[cfg(not(feature = "openai"))]
        ProviderApi::OpenAiCompletions | ProviderApi::OpenAiResponses => {
            Err(not_compiled("openai"))
        }
        #[cfg(not(feature = "google"))]
        ProviderApi::GoogleGenerativeAi => Err(not_compiled("google")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only in a build without `anthropic` (`--no-default-features`).
    #[cfg(not(feature = "anthropic"))]
    #[test]
    fn a_provider_left_out_of_the_build_is_named() {
        let config: crate::config::ProviderConfig =
            serde_json::from_value(serde_json::json!({"api": "anthropic-messages"})).unwrap();
        let e = client_for("claude", &config).unwrap_err();
        assert!(matches!(
            e,
            LlmError::NotCompiledIn {
                feature: "anthropic",
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "provider 'claude': the anthropic provider is not compiled in (cargo feature `anthropic`)"
        );
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
        let future = (chrono::Utc::now() + chrono::Duration::seconds(120)).to_rfc2822();
        let d = parse_retry_after(&future).unwrap();
        assert!(
            d > Duration::from_secs(100) && d <= Duration::from_secs(120),
            "{d:?}"
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn errors_are_classified_by_fields() {
        let api = |status, t: Option<&str>| LlmError::Api {
            provider: "p".into(),
            status,
            retry_after: None,
            error_type: t.map(str::to_string),
            message: "rate limit mentioned in text only".into(),
        };
        assert_eq!(api(429, None).kind(), ErrorKind::RateLimit);
        assert_eq!(
            api(529, Some("overloaded_error")).kind(),
            ErrorKind::Overloaded
        );
        assert_eq!(api(503, None).kind(), ErrorKind::Overloaded);
        assert_eq!(
            api(400, Some("context_length_exceeded")).kind(),
            ErrorKind::ContextOverflow
        );
        assert_eq!(api(401, None).kind(), ErrorKind::Auth);
        assert_eq!(api(400, None).kind(), ErrorKind::InvalidRequest);
        assert_eq!(api(500, None).kind(), ErrorKind::Other);
    }

    #[test]
    fn keys_do_not_leak_through_debug() {
        let k = ApiKey::new(Some("sk-secret".into()));
        assert_eq!(format!("{k:?}"), "ApiKey(***)");
        assert_eq!(k.expose(), Some("sk-secret"));
    }
}
