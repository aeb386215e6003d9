//! Shared HTTP and SSE plumbing of the provider clients: building the `reqwest` client,
//! sending a request (a non-2xx answer becomes a typed [`LlmError::Api`] built from the
//! provider's JSON error body and `retry-after`), turning a streamed response into
//! `eventsource-stream` events with a per-event idle timeout, and driving a per-API
//! `SseDecoder` into an [`EventStream`] that ends with exactly one `Completed` or one
//! error. It knows no wire format beyond the common error-body shapes, never retries
//! anything, and never puts request headers (so never an API key) into an error; clients
//! pass every error through `redact` as a second line of defence.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::de::DeserializeOwned;

use super::{parse_retry_after, ApiKey, EventStream, LlmError, ModelResponse, StreamEvent};

/// Default per-event idle timeout: no SSE event for this long abandons the stream.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long to wait for a TCP/TLS connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of an error body we read and quote.
const MAX_ERROR_BODY: usize = 64 * 1024;
const MAX_QUOTED: usize = 500;

/// A boxed stream of SSE events.
pub(crate) type SseEvents = Pin<Box<dyn Stream<Item = Result<Event, LlmError>> + Send>>;

/// What every provider client holds: the provider's name, its normalized base URL,
/// the key, the fixed headers (with the key in them where the API authenticates by
/// header), the HTTP client and the stream idle timeout. Its `Debug` shows neither the
/// key nor any header value.
pub(crate) struct Endpoint {
    pub name: String,
    pub base_url: String,
    pub api_key: ApiKey,
    pub headers: HeaderMap,
    pub http: reqwest::Client,
    pub idle: Duration,
}

impl Endpoint {
    /// Checks `base_url`, builds the HTTP client and parses the configured `headers`.
    pub(crate) fn new(
        name: &str,
        base_url: &str,
        api_key: ApiKey,
        headers: &[(String, String)],
    ) -> Result<Self, LlmError> {
        let base = self::base_url(name, base_url)?;
        Ok(Self {
            name: name.to_string(),
            http: http_client(name, &base)?,
            base_url: base,
            api_key,
            headers: extra_headers(name, headers)?,
            idle: DEFAULT_IDLE_TIMEOUT,
        })
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

/// Build the HTTP client for one provider. Loopback base URLs (local servers such as
/// Ollama, and the test servers) bypass any configured proxy.
pub(crate) fn http_client(provider: &str, base_url: &str) -> Result<reqwest::Client, LlmError> {
    let url = reqwest::Url::parse(base_url).map_err(|e| LlmError::Config {
        provider: provider.to_string(),
        message: format!("invalid base URL {base_url:?}: {e}"),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(LlmError::Config {
            provider: provider.to_string(),
            message: format!("base URL {base_url:?} must be http or https"),
        });
    }
    let loopback = url.host_str().is_some_and(|h| {
        let h = h.trim_start_matches('[').trim_end_matches(']');
        h.eq_ignore_ascii_case("localhost")
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("beige/", env!("CARGO_PKG_VERSION")));
    if loopback {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|e| LlmError::Config {
        provider: provider.to_string(),
        message: format!("cannot build the HTTP client: {}", error_chain(&e)),
    })
}

/// The base URL without trailing slashes, validated.
pub(crate) fn base_url(provider: &str, base_url: &str) -> Result<String, LlmError> {
    let trimmed = base_url.trim().trim_end_matches('/');
    reqwest::Url::parse(trimmed).map_err(|e| LlmError::Config {
        provider: provider.to_string(),
        message: format!("invalid base URL {base_url:?}: {e}"),
    })?;
    Ok(trimmed.to_string())
}

/// Parse configured extra headers. Errors name the header, never its value (it may be a
/// secret).
pub(crate) fn extra_headers(
    provider: &str,
    headers: &[(String, String)],
) -> Result<HeaderMap, LlmError> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let bad = |what: &str| LlmError::Config {
            provider: provider.to_string(),
            message: format!("header {name:?}: invalid {what}"),
        };
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("name"))?;
        let mut v = HeaderValue::from_str(value).map_err(|_| bad("value"))?;
        v.set_sensitive(true);
        map.append(n, v);
    }
    Ok(map)
}

/// A header value holding a secret (marked sensitive so it never shows in `Debug`).
pub(crate) fn secret_header(provider: &str, value: &str) -> Result<HeaderValue, LlmError> {
    let mut v = HeaderValue::from_str(value).map_err(|_| LlmError::Config {
        provider: provider.to_string(),
        message: "the API key contains characters not allowed in an HTTP header".to_string(),
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// Send a request and wait (at most `idle`) for the response head. A non-2xx status
/// becomes [`LlmError::Api`] via [`api_error`]; nothing is retried.
pub(crate) async fn send(
    provider: &str,
    request: reqwest::RequestBuilder,
    idle: Duration,
) -> Result<reqwest::Response, LlmError> {
    let resp = match tokio::time::timeout(idle, request.send()).await {
        Err(_) => {
            return Err(LlmError::IdleTimeout {
                provider: provider.to_string(),
                idle,
            })
        }
        Ok(Err(e)) => return Err(transport(provider, &e)),
        Ok(Ok(resp)) => resp,
    };
    if resp.status().is_success() {
        Ok(resp)
    } else {
        Err(api_error(provider, resp).await)
    }
}

/// Turn a non-2xx response into [`LlmError::Api`]: the status, `retry-after` (seconds or
/// HTTP date) and the provider's error type and message from its JSON body
/// (see [`error_from_body`]). Reads at most 64 KiB of the body, for at most 30 s.
pub(crate) async fn api_error(provider: &str, resp: reqwest::Response) -> LlmError {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    let body = tokio::time::timeout(Duration::from_secs(30), read_limited(resp))
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    error_from_body(provider, status, retry_after, &text)
}

async fn read_limited(resp: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY {
            body.truncate(MAX_ERROR_BODY);
            break;
        }
    }
    body
}

/// Build [`LlmError::Api`] from an error body. Understands Anthropic
/// `{"type":"error","error":{"type","message"}}`, OpenAI `{"error":{"type"|"code","message"}}`
/// and Google `{"error":{"code","message","status"}}` (also inside a one-element array);
/// anything else is quoted (shortened) as the message.
pub(crate) fn error_from_body(
    provider: &str,
    status: u16,
    retry_after: Option<Duration>,
    body: &str,
) -> LlmError {
    let (error_type, message) = match serde_json::from_str::<serde_json::Value>(body) {
        Ok(v) => parse_error_value(&v),
        Err(_) => (None, None),
    };
    let message = message.unwrap_or_else(|| {
        let t = body.trim();
        if t.is_empty() {
            reason_phrase(status)
        } else {
            shorten(t)
        }
    });
    let error_type = match overflow(status, &message) {
        true => Some("context_overflow".to_string()),
        false => error_type,
    };
    LlmError::Api {
        provider: provider.to_string(),
        status,
        retry_after,
        error_type,
        message,
    }
}

/// Anthropic and Gemini report an over-long prompt only as a generic 400 with a
/// documented sentence; this is the one place where such a sentence is turned into the
/// typed `context_overflow` error type, so nothing downstream looks at message text.
fn overflow(status: u16, message: &str) -> bool {
    const SENTENCES: [&str; 3] = [
        "prompt is too long",                    // Anthropic
        "exceeds the maximum number of tokens",  // Gemini
        "input token count exceeds the maximum", // Gemini
    ];
    status == 400 && {
        let m = message.to_ascii_lowercase();
        SENTENCES.iter().any(|s| m.contains(s))
    }
}

/// `(error type, message)` from a JSON error value, for the common provider shapes. The
/// type is the first of `error.type`, `error.code` (string), `error.status`.
pub(crate) fn parse_error_value(v: &serde_json::Value) -> (Option<String>, Option<String>) {
    let v = match v {
        serde_json::Value::Array(items) if !items.is_empty() => &items[0],
        other => other,
    };
    let err = match v.get("error") {
        Some(e) if e.is_object() => e,
        Some(serde_json::Value::String(s)) => return (None, Some(shorten(s))),
        _ => v,
    };
    let text = |key: &str| {
        err.get(key)
            .and_then(|x| x.as_str())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    // A specific code (OpenAI's `context_length_exceeded`) says more than the generic
    // type it comes with (`invalid_request_error`).
    let code = text("code").filter(|c| {
        matches!(
            c.as_str(),
            "context_length_exceeded" | "rate_limit_exceeded" | "insufficient_quota"
        )
    });
    let error_type = code
        .or_else(|| text("type").filter(|t| t != "error"))
        .or_else(|| text("code"))
        .or_else(|| text("status"));
    let message = text("message").map(|m| shorten(&m));
    (error_type, message)
}

fn reason_phrase(status: u16) -> String {
    reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("error")
        .to_string()
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= MAX_QUOTED {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(MAX_QUOTED).collect();
        out.push('…');
        out
    }
}

/// A transport error, described without the URL (which could carry a query-string key).
pub(crate) fn transport(provider: &str, e: &reqwest::Error) -> LlmError {
    LlmError::Transport {
        provider: provider.to_string(),
        message: error_chain(e),
    }
}

fn error_chain(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut msg = if e.is_connect() {
        "connection failed".to_string()
    } else if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_body() || e.is_decode() {
        "error reading the response body".to_string()
    } else if e.is_request() {
        "error sending the request".to_string()
    } else {
        "HTTP error".to_string()
    };
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// The SSE events of a streamed response. Each event must arrive within `idle` of the
/// previous one (else one [`LlmError::IdleTimeout`]); a body that breaks off mid-stream
/// yields one [`LlmError::Truncated`]. The stream ends after its first error.
pub(crate) fn events(provider: &str, resp: reqwest::Response, idle: Duration) -> SseEvents {
    let inner = resp.bytes_stream().eventsource();
    let state = (Box::pin(inner), provider.to_string(), false);
    Box::pin(futures_util::stream::unfold(
        state,
        move |(mut inner, provider, done)| async move {
            if done {
                return None;
            }
            let item = match tokio::time::timeout(idle, inner.next()).await {
                Err(_) => Err(LlmError::IdleTimeout {
                    provider: provider.clone(),
                    idle,
                }),
                Ok(None) => return None,
                Ok(Some(Ok(event))) => Ok(event),
                Ok(Some(Err(EventStreamError::Transport(e)))) => {
                    tracing::warn!(provider = %provider, error = %error_chain(&e), "model stream broke off");
                    Err(LlmError::Truncated {
                        provider: provider.clone(),
                    })
                }
                Ok(Some(Err(EventStreamError::Utf8(e)))) => Err(LlmError::Decode {
                    provider: provider.clone(),
                    message: format!("stream is not UTF-8: {e}"),
                }),
                Ok(Some(Err(EventStreamError::Parser(e)))) => Err(LlmError::Decode {
                    provider: provider.clone(),
                    message: format!("malformed SSE: {e}"),
                }),
            };
            let done = item.is_err();
            Some((item, (inner, provider, done)))
        },
    ))
}

/// Decode one SSE event's JSON data.
pub(crate) fn decode<T: DeserializeOwned>(provider: &str, data: &str) -> Result<T, LlmError> {
    serde_json::from_str(data).map_err(|e| LlmError::Decode {
        provider: provider.to_string(),
        message: format!("unexpected event data ({e}): {}", shorten(data)),
    })
}

/// A per-API state machine from SSE events to [`StreamEvent`]s.
pub(crate) trait SseDecoder: Send + 'static {
    /// Handle one event, pushing what the caller should see onto `out`. Pushing a
    /// `StreamEvent::Completed` ends the stream (later events are not read); an error
    /// ends it too.
    fn event(&mut self, event: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError>;

    /// The body ended without a `Completed`. APIs whose completion is the end of the body
    /// return the response here; the default (`Ok(None)`) means the stream was cut off
    /// ([`LlmError::Truncated`]).
    fn end_of_stream(&mut self) -> Result<Option<ModelResponse>, LlmError> {
        Ok(None)
    }
}

/// Drive `decoder` over the events of `resp` (see [`events`]): the result yields deltas
/// and then exactly one `Completed` or one error, and drops the connection as soon as it
/// ends.
pub(crate) fn decode_stream<D: SseDecoder>(
    provider: &str,
    resp: reqwest::Response,
    idle: Duration,
    decoder: D,
) -> EventStream {
    decode_events(provider, events(provider, resp, idle), decoder)
}

/// [`decode_stream`] over any event stream (for tests and unusual transports).
pub(crate) fn decode_events<D: SseDecoder>(
    provider: &str,
    events: SseEvents,
    decoder: D,
) -> EventStream {
    struct State<D> {
        provider: String,
        events: Option<SseEvents>,
        decoder: D,
        pending: VecDeque<Result<StreamEvent, LlmError>>,
    }
    let state = State {
        provider: provider.to_string(),
        events: Some(events),
        decoder,
        pending: VecDeque::new(),
    };
    Box::pin(futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.pending.pop_front() {
                return Some((item, st));
            }
            let events = st.events.as_mut()?;
            match events.next().await {
                Some(Ok(event)) => {
                    let mut out = Vec::new();
                    let res = st.decoder.event(&event, &mut out);
                    for ev in out {
                        let last = matches!(ev, StreamEvent::Completed(_));
                        st.pending.push_back(Ok(ev));
                        if last {
                            st.events = None;
                            break;
                        }
                    }
                    if let Err(e) = res {
                        if st.events.is_some() {
                            st.pending.push_back(Err(e));
                            st.events = None;
                        }
                    }
                }
                Some(Err(e)) => {
                    st.pending.push_back(Err(e));
                    st.events = None;
                }
                None => {
                    st.events = None;
                    let item = match st.decoder.end_of_stream() {
                        Ok(Some(resp)) => Ok(StreamEvent::Completed(resp)),
                        Ok(None) => Err(LlmError::Truncated {
                            provider: st.provider.clone(),
                        }),
                        Err(e) => Err(e),
                    };
                    st.pending.push_back(item);
                }
            }
        }
    }))
}

/// Replace every occurrence of the API key in an error's text fields with `***`. The
/// clients never put the key in an error; this guards against a provider or proxy that
/// echoes it back in an error body.
pub(crate) fn redact(err: LlmError, key: &ApiKey) -> LlmError {
    let Some(secret) = key.expose().filter(|k| k.len() >= 4) else {
        return err;
    };
    let scrub = |s: String| {
        if s.contains(secret) {
            s.replace(secret, "***")
        } else {
            s
        }
    };
    match err {
        LlmError::Api {
            provider,
            status,
            retry_after,
            error_type,
            message,
        } => LlmError::Api {
            provider,
            status,
            retry_after,
            error_type: error_type.map(scrub),
            message: scrub(message),
        },
        LlmError::Transport { provider, message } => LlmError::Transport {
            provider,
            message: scrub(message),
        },
        LlmError::Decode { provider, message } => LlmError::Decode {
            provider,
            message: scrub(message),
        },
        LlmError::Config { provider, message } => LlmError::Config {
            provider,
            message: scrub(message),
        },
        other => other,
    }
}

/// [`redact`] over every error of a stream.
pub(crate) fn redact_stream(stream: EventStream, key: &ApiKey) -> EventStream {
    let key = key.clone();
    Box::pin(stream.map(move |item| item.map_err(|e| redact(e, &key))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_of_each_provider() {
        let anthropic =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        match error_from_body("a", 529, None, anthropic) {
            LlmError::Api {
                status,
                error_type,
                message,
                ..
            } => {
                assert_eq!(status, 529);
                assert_eq!(error_type.as_deref(), Some("overloaded_error"));
                assert_eq!(message, "Overloaded");
            }
            other => panic!("{other:?}"),
        }
        let openai = r#"{"error":{"message":"Rate limit reached","type":null,"code":"rate_limit_exceeded","param":null}}"#;
        let (t, m) = parse_error_value(&serde_json::from_str(openai).unwrap());
        assert_eq!(t.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(m.as_deref(), Some("Rate limit reached"));
        let google = r#"[{"error":{"code":429,"message":"Quota","status":"RESOURCE_EXHAUSTED"}}]"#;
        let (t, m) = parse_error_value(&serde_json::from_str(google).unwrap());
        assert_eq!(t.as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(m.as_deref(), Some("Quota"));
        let e = error_from_body(
            "p",
            502,
            Some(Duration::from_secs(3)),
            "<html>bad gateway</html>",
        );
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert!(e.to_string().contains("bad gateway"), "{e}");
        let e = error_from_body("p", 503, None, "");
        assert!(e.to_string().contains("Service Unavailable"), "{e}");
    }

    #[test]
    fn redact_scrubs_the_key() {
        let key = ApiKey::new(Some("sk-very-secret".into()));
        let e = error_from_body(
            "p",
            401,
            None,
            r#"{"error":{"message":"bad key sk-very-secret"}}"#,
        );
        let e = redact(e, &key);
        assert!(!e.to_string().contains("sk-very-secret"));
        assert!(!format!("{e:?}").contains("sk-very-secret"));
    }

    #[tokio::test]
    async fn decoder_stops_at_completed_and_reports_truncation() {
        struct Echo;
        impl SseDecoder for Echo {
            fn event(&mut self, ev: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
                if ev.data == "end" {
                    out.push(StreamEvent::Completed(ModelResponse {
                        content: vec![],
                        stop_reason: super::super::StopReason::EndTurn,
                        usage: Default::default(),
                    }));
                    out.push(StreamEvent::TextDelta("after".into()));
                } else {
                    out.push(StreamEvent::TextDelta(ev.data.clone()));
                }
                Ok(())
            }
        }
        let ev = |d: &str| {
            Ok(Event {
                data: d.to_string(),
                ..Default::default()
            })
        };
        let events: SseEvents = Box::pin(futures_util::stream::iter(vec![
            ev("a"),
            ev("end"),
            ev("b"),
        ]));
        let got: Vec<_> = decode_events("p", events, Echo).collect().await;
        assert_eq!(got.len(), 2);
        assert!(matches!(got[1], Ok(StreamEvent::Completed(_))));

        let events: SseEvents = Box::pin(futures_util::stream::iter(vec![ev("a")]));
        let got: Vec<_> = decode_events("p", events, Echo).collect().await;
        assert_eq!(got.len(), 2);
        assert!(matches!(got[1], Err(LlmError::Truncated { .. })));
    }

    #[tokio::test]
    async fn events_of_a_cut_body_end_in_truncated_and_a_clean_end_just_ends() {
        use beige_testkit::llm::{FakeLlmServer, Reply};
        let s = FakeLlmServer::start().await;
        s.push(Reply::sse("data: one\n\ndata: tw").cut());
        s.push(Reply::sse("data: one\n\ndata: tw"));
        let http = http_client("p", &s.url()).unwrap();
        for cut in [true, false] {
            let resp = send("p", http.post(s.url()), DEFAULT_IDLE_TIMEOUT)
                .await
                .unwrap();
            let got: Vec<_> = events("p", resp, DEFAULT_IDLE_TIMEOUT).collect().await;
            assert!(matches!(&got[0], Ok(e) if e.data == "one"), "{got:?}");
            if cut {
                assert_eq!(got.len(), 2, "{got:?}");
                assert!(matches!(got[1], Err(LlmError::Truncated { .. })), "{got:?}");
            } else {
                assert_eq!(got.len(), 1, "{got:?}");
            }
        }
    }

    #[tokio::test]
    async fn fake_server_counts_requests_in_flight() {
        use beige_testkit::llm::{FakeLlmServer, Reply};
        let s = FakeLlmServer::start().await;
        s.push(Reply::hang()).push(Reply::hang());
        let http = http_client("p", &s.url()).unwrap();
        let idle = Duration::from_secs(600);
        let a = tokio::spawn(send("p", http.post(s.url()), idle));
        let b = tokio::spawn(send("p", http.post(s.url()), idle));
        s.wait_for_requests(2).await;
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.max_in_flight(), 2);
        a.abort();
        b.abort();
    }
}
