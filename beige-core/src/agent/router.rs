//! Model routing for one model call: which models an agent may use, which candidate to
//! try next, provider health (cooldowns after rate limits, consecutive failures) and the
//! per-provider FIFO concurrency limit.
//!
//! Owns the fallback rules of `agent.md` §2: candidates in order (session override,
//! primary, fallbacks), up to three passes; a candidate leaves the pool when it cools
//! down or failed three times in this prompt; 429 cools a model down for everyone
//! (`retry-after`, else 300 s); overload is transient. Decisions use the typed error
//! fields, never message text. A request is never retried after content from it reached
//! the user.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use serde::Serialize;
use tokio::sync::Semaphore;

use super::events::AgentEvent;
use crate::config::ModelRef;
use crate::llm::{ErrorKind, LlmError, LlmProvider, ModelRequest, ModelResponse, StreamEvent};

/// Cooldown after a 429 without `retry-after`.
pub(crate) const DEFAULT_COOLDOWN: Duration = Duration::from_secs(300);
/// Passes over the candidate list per model call.
pub(crate) const PASSES: usize = 3;
/// Failures after which a candidate leaves the pool for this prompt.
pub(crate) const MAX_FAILURES: u32 = 3;

/// `provider/model`.
pub(crate) fn model_key(m: &ModelRef) -> String {
    format!("{}/{}", m.provider, m.model)
}

pub(crate) use beige_client::status::ModelHealth;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Called whenever a model's health changes (the gateway persists it in the store).
pub(crate) type HealthSink = Arc<dyn Fn(&str, &ModelHealth) + Send + Sync>;

/// Health of every model, in memory, persisted through a sink.
#[derive(Clone, Default)]
pub(crate) struct HealthTracker {
    map: Arc<Mutex<HashMap<String, ModelHealth>>>,
    sink: Option<HealthSink>,
}

impl std::fmt::Debug for HealthTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthTracker")
            .field("map", &self.map)
            .finish_non_exhaustive()
    }
}

impl HealthTracker {
    pub(crate) fn new(initial: HashMap<String, ModelHealth>, sink: Option<HealthSink>) -> Self {
        Self {
            map: Arc::new(Mutex::new(initial)),
            sink,
        }
    }

    pub(crate) fn get(&self, key: &str) -> ModelHealth {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Every model with recorded health.
    pub(crate) fn all(&self) -> HashMap<String, ModelHealth> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn update(&self, key: &str, f: impl FnOnce(&mut ModelHealth)) {
        let snapshot = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            let h = map.entry(key.to_string()).or_default();
            f(h);
            h.clone()
        };
        if let Some(sink) = &self.sink {
            sink(key, &snapshot);
        }
    }

    fn success(&self, key: &str) {
        let h = self.get(key);
        if h.consecutive_failures != 0 || h.cooldown_until.is_some() {
            self.update(key, |h| {
                h.consecutive_failures = 0;
                h.cooldown_until = None;
            });
        }
    }

    fn failure(&self, key: &str, err: &LlmError) {
        let cooldown = (err.kind() == ErrorKind::RateLimit)
            .then(|| err.retry_after().unwrap_or(DEFAULT_COOLDOWN));
        self.update(key, |h| {
            h.consecutive_failures += 1;
            h.last_error = Some(err.to_string());
            if let Some(d) = cooldown {
                h.cooldown_until = Some(now_ms() + d.as_millis() as u64);
            }
        });
    }
}

/// One failed attempt, for the final error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Attempt {
    pub model: String,
    pub error: String,
}

/// Why routing failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RouteError {
    /// Every candidate failed or is cooling down.
    #[error("no model could answer: {}", attempts.iter().map(|a| format!("{} — {}", a.model, a.error)).collect::<Vec<_>>().join("; "))]
    AllFailed {
        attempts: Vec<Attempt>,
        /// The kind of the last real error, for the user's hint.
        kind: ErrorKind,
    },
    /// The prompt does not fit; the caller compacts and retries.
    #[error("{0}")]
    ContextOverflow(LlmError),
    /// Content already reached the user when the stream failed: not retried.
    #[error("{error}")]
    Interrupted { error: LlmError },
    /// The prompt was cancelled while a model was being tried.
    #[error("cancelled")]
    Cancelled,
}

/// Per-provider clients and concurrency limits.
#[derive(Debug, Clone, Default)]
pub(crate) struct Router {
    providers: HashMap<String, Arc<dyn LlmProvider>>,
    limits: HashMap<String, Arc<Semaphore>>,
    pub health: HealthTracker,
    /// Inactivity watchdog of one model call: no event for this long aborts the attempt
    /// (a timeout for fallback). Tools run between calls, so they never trip it.
    watchdog: Duration,
    /// Counts the calls waiting for a provider's slot.
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

/// Default of [`Router::with_watchdog`].
pub(crate) const DEFAULT_WATCHDOG: Duration = Duration::from_secs(600);

/// The result of one routed call.
#[derive(Debug, Clone)]
pub(crate) struct Routed {
    pub response: ModelResponse,
    /// The candidate that answered.
    pub model: ModelRef,
    /// Set when it is not the first candidate: the reason for `ModelSwitched`.
    pub switched: Option<String>,
}

impl Router {
    pub(crate) fn new(health: HealthTracker) -> Self {
        Self {
            providers: HashMap::new(),
            limits: HashMap::new(),
            health,
            watchdog: DEFAULT_WATCHDOG,
            metrics: None,
        }
    }

    /// Count the calls waiting for a provider's slot in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Set the inactivity watchdog (default 10 minutes).
    pub(crate) fn with_watchdog(mut self, watchdog: Duration) -> Self {
        self.watchdog = watchdog;
        self
    }

    /// Register a provider client with its concurrency (`<= 0`: unlimited).
    pub(crate) fn add(&mut self, provider: Arc<dyn LlmProvider>, concurrency: i64) {
        let name = provider.name().to_string();
        if concurrency > 0 {
            let permits = usize::try_from(concurrency).unwrap_or(usize::MAX);
            self.limits
                .insert(name.clone(), Arc::new(Semaphore::new(permits)));
        } else {
            self.limits.remove(&name);
        }
        self.providers.insert(name, provider);
    }

    pub(crate) fn has(&self, provider: &str) -> bool {
        self.providers.contains_key(provider)
    }

    /// Call the candidates in order until one answers. `request.model` is overwritten
    /// per candidate; `build` adjusts the request for a candidate (max tokens, thinking).
    /// Text and thinking deltas are forwarded to `events`.
    pub(crate) async fn call(
        &self,
        candidates: &[ModelRef],
        failures: &mut HashMap<String, u32>,
        mut build: impl FnMut(&ModelRef) -> ModelRequest,
        events: &tokio::sync::mpsc::UnboundedSender<AgentEvent>,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Routed, RouteError> {
        let mut attempts: Vec<Attempt> = Vec::new();
        let mut first_failure: Option<ErrorKind> = None;
        let mut last_kind = ErrorKind::Other;
        for _pass in 0..PASSES {
            let mut tried_any = false;
            for (i, cand) in candidates.iter().enumerate() {
                let key = model_key(cand);
                if failures.get(&key).copied().unwrap_or(0) >= MAX_FAILURES {
                    continue;
                }
                if let Some(left) = self.health.get(&key).cooling() {
                    if !attempts
                        .iter()
                        .any(|a| a.model == key && a.error.starts_with("cooling down"))
                    {
                        attempts.push(Attempt {
                            model: key.clone(),
                            error: format!(
                                "cooling down after a rate limit for {} more s",
                                left.as_secs().max(1)
                            ),
                        });
                    }
                    if first_failure.is_none() && i == 0 {
                        first_failure = Some(ErrorKind::RateLimit);
                    }
                    continue;
                }
                let Some(provider) = self.providers.get(&cand.provider) else {
                    // A provider whose client could not be built: try the others.
                    failures.insert(key.clone(), MAX_FAILURES);
                    attempts.push(Attempt {
                        model: key,
                        error: format!(
                            "provider '{}' is not available (see the gateway log for why its client could not be built)",
                            cand.provider
                        ),
                    });
                    continue;
                };
                tried_any = true;
                let permit = match self.limits.get(&cand.provider) {
                    Some(sem) => match sem.clone().try_acquire_owned() {
                        Ok(p) => Some(Some(p)),
                        Err(_) => {
                            // Queued behind the provider's `concurrency`: counted while
                            // waiting.
                            let _waiting = self
                                .metrics
                                .as_ref()
                                .map(|m| m.provider_waiting(&cand.provider));
                            Some(tokio::select! {
                                p = sem.clone().acquire_owned() => p.ok(),
                                _ = cancel.cancelled() => return Err(RouteError::Cancelled),
                            })
                        }
                    },
                    None => None,
                };
                let outcome = tokio::select! {
                    r = self.one_call(provider.as_ref(), build(cand), events) => r,
                    _ = cancel.cancelled() => return Err(RouteError::Cancelled),
                };
                drop(permit);
                match outcome {
                    Ok(response) => {
                        self.health.success(&key);
                        let switched = (i > 0 || first_failure.is_some() && !attempts.is_empty())
                            .then(|| {
                                match first_failure {
                                    Some(ErrorKind::RateLimit) => "fallback_rate_limit",
                                    Some(ErrorKind::Timeout) => "fallback_timeout",
                                    _ => "fallback_error",
                                }
                                .to_string()
                            })
                            .filter(|_| i > 0);
                        return Ok(Routed {
                            response,
                            model: cand.clone(),
                            switched,
                        });
                    }
                    Err((err, emitted)) => {
                        let kind = err.kind();
                        if kind == ErrorKind::ContextOverflow {
                            return Err(RouteError::ContextOverflow(err));
                        }
                        self.health.failure(&key, &err);
                        if emitted {
                            return Err(RouteError::Interrupted { error: err });
                        }
                        tracing::warn!(model = %key, error = %err, "model call failed; trying the next candidate");
                        let count = failures.entry(key.clone()).or_default();
                        *count += 1;
                        if matches!(kind, ErrorKind::Auth | ErrorKind::InvalidRequest) {
                            // The same request would fail the same way: do not repeat it.
                            *count = MAX_FAILURES;
                        }
                        if first_failure.is_none() {
                            first_failure = Some(kind);
                        }
                        last_kind = kind;
                        attempts.push(Attempt {
                            model: key,
                            error: err.to_string(),
                        });
                    }
                }
            }
            if !tried_any {
                break;
            }
        }
        if attempts.iter().all(|a| a.error.starts_with("cooling down")) {
            last_kind = ErrorKind::RateLimit;
        }
        Err(RouteError::AllFailed {
            attempts,
            kind: last_kind,
        })
    }

    /// One streamed call. The error carries whether content already reached the user.
    async fn one_call(
        &self,
        provider: &dyn LlmProvider,
        request: ModelRequest,
        events: &tokio::sync::mpsc::UnboundedSender<AgentEvent>,
    ) -> Result<ModelResponse, (LlmError, bool)> {
        let idle = |provider: &dyn LlmProvider| LlmError::IdleTimeout {
            provider: provider.name().to_string(),
            idle: self.watchdog,
        };
        let mut stream = tokio::time::timeout(self.watchdog, provider.stream(request))
            .await
            .map_err(|_| (idle(provider), false))?
            .map_err(|e| (e, false))?;
        let mut emitted = false;
        loop {
            let item = match tokio::time::timeout(self.watchdog, stream.next()).await {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(_) => return Err((idle(provider), emitted)),
            };
            match item {
                Ok(StreamEvent::TextDelta(text)) => {
                    emitted = true;
                    let _ = events.send(AgentEvent::TextDelta { text });
                }
                Ok(StreamEvent::ThinkingDelta(text)) => {
                    emitted = true;
                    let _ = events.send(AgentEvent::ThinkingDelta { text });
                }
                Ok(StreamEvent::ToolUseStarted { .. }) => emitted = true,
                Ok(StreamEvent::Completed(response)) => return Ok(response),
                Err(e) => return Err((e, emitted)),
            }
        }
        Err((
            LlmError::Truncated {
                provider: provider.name().to_string(),
            },
            emitted,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::scripted::ScriptedProvider;
    use crate::llm::EventStream;

    /// A provider whose stream never yields anything.
    #[derive(Debug)]
    struct Silent;

    #[async_trait::async_trait]
    impl LlmProvider for Silent {
        fn name(&self) -> &str {
            "silent"
        }
        async fn stream(&self, _request: ModelRequest) -> Result<EventStream, LlmError> {
            Ok(Box::pin(futures_util::stream::pending()))
        }
    }

    fn model(provider: &str) -> ModelRef {
        serde_json::from_value(serde_json::json!({"provider": provider, "model": "m"})).unwrap()
    }

    #[tokio::test]
    async fn the_watchdog_abandons_a_silent_model_and_falls_back() {
        let mut router =
            Router::new(HealthTracker::default()).with_watchdog(Duration::from_millis(100));
        router.add(Arc::new(Silent), -1);
        router.add(
            Arc::new(ScriptedProvider::new("scripted").then_text("hello")),
            -1,
        );
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let request = |m: &ModelRef| ModelRequest {
            model: m.model.clone(),
            system: String::new(),
            messages: Default::default(),
            tools: Vec::new(),
            max_tokens: 10,
            thinking: crate::config::ThinkingLevel::Off,
            reasoning: false,
        };
        let routed = router
            .call(
                &[model("silent"), model("scripted")],
                &mut HashMap::new(),
                request,
                &tx,
                &tokio_util::sync::CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(routed.model.provider, "scripted");
        assert_eq!(routed.switched.as_deref(), Some("fallback_timeout"));
        assert!(router
            .health
            .get("silent/m")
            .last_error
            .unwrap()
            .contains("no data"));
    }
}
