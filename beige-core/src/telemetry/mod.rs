//! OpenTelemetry traces of the gateway's work (observability.md §1): one span tree per
//! prompt — `invoke_agent` → `chat` (a model call, with token usage) → `execute_tool` →
//! `beige.sandbox.op` → the `execute_tool` spans of the plugin calls a script made —
//! exported over OTLP/HTTP with protobuf when `telemetry.otlp` turns it on.
//!
//! This module owns the tracer of one gateway (no global provider: two gateways in one
//! process stay apart), the names of spans and attributes ([`names`]), the binding of a
//! running exec to its span (so a script's call joins its exec's span from the kernel's
//! attribution, never from anything the sandbox sends), and the stamping of trace ids
//! on audit records ([`TracedAudit`]). Spans are deliberate: they are made here and in
//! the call paths that ask for them, never from `tracing` events, and carry no prompt
//! text, tool arguments or command lines unless `telemetry.otlp.capture` opts in (then
//! redacted like the audit log and cut at 4 KiB). Without the `otel` feature, or with
//! export off, every span is a no-op and costs a branch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use opentelemetry::trace::{SpanKind, TraceContextExt as _};
use opentelemetry::{Context, KeyValue};

use crate::audit::{AuditError, AuditRecord, AuditSink};
use crate::config::Config;

pub mod names;

#[cfg(feature = "otel")]
mod export;
#[cfg(feature = "otel")]
pub use export::ExportHealth;

/// What the captured strings are cut to.
const CAPTURE_LIMIT: usize = 4096;

/// Why traces could not be set up from the config.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `telemetry.otlp` asks for traces, and this build has no `otel` feature.
    #[error(
        "telemetry.otlp.traces is on, but this beige was built without the `otel` feature; \
         rebuild with it, or set telemetry.otlp.traces to false"
    )]
    NotBuilt,
    /// `telemetry.otlp.endpoint` is not an http(s) URL.
    #[error("telemetry.otlp.endpoint '{endpoint}' is not an http:// or https:// URL: {reason}")]
    Endpoint {
        /// The configured value.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The exporter could not be built.
    #[error("telemetry.otlp: the OTLP exporter could not be set up: {0}")]
    Exporter(String),
}

/// The tracer of one gateway, shared by every reload of its config.
#[derive(Debug)]
pub struct Traces {
    #[cfg(feature = "otel")]
    exporting: Option<export::Exporting>,
    capture_prompts: bool,
    capture_tool_args: bool,
    /// Configured secret values, replaced by `***` in captured strings.
    secrets: Vec<String>,
    /// The `beige.sandbox.op` span of each running exec, by exec id.
    execs: Mutex<HashMap<String, Context>>,
    /// Spans that end in a later call (an egress stream's, from its `started` record to
    /// its `finished` one), by key; at most [`MAX_OPEN`].
    open: Mutex<HashMap<String, Context>>,
}

/// Most spans kept open across calls; past it a stream's span ends with its start.
const MAX_OPEN: usize = 4096;

impl Default for Traces {
    fn default() -> Self {
        Self::off()
    }
}

impl Traces {
    /// No export: every span is a no-op.
    pub fn off() -> Self {
        Self {
            #[cfg(feature = "otel")]
            exporting: None,
            capture_prompts: false,
            capture_tool_args: false,
            secrets: Vec::new(),
            execs: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The tracer `telemetry.otlp` asks for (off when it is absent or `traces: false`).
    ///
    /// # Errors
    ///
    /// A bad endpoint, or traces asked of a build without the `otel` feature.
    pub fn from_config(config: &Config) -> Result<Self, TelemetryError> {
        let Some(otlp) = config
            .telemetry
            .as_ref()
            .and_then(|t| t.otlp.as_ref())
            .filter(|o| o.traces)
        else {
            return Ok(Self::off());
        };
        let capture = otlp.capture.clone().unwrap_or_default();
        let mut traces = Self {
            capture_prompts: capture.prompts,
            capture_tool_args: capture.tool_args,
            secrets: crate::audit::secrets_of(config),
            ..Self::off()
        };
        #[cfg(feature = "otel")]
        {
            traces.exporting = Some(export::Exporting::new(otlp)?);
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = &mut traces;
            return Err(TelemetryError::NotBuilt);
        }
        #[allow(unreachable_code)]
        Ok(traces)
    }

    /// Whether spans are exported.
    pub fn is_on(&self) -> bool {
        #[cfg(feature = "otel")]
        {
            self.exporting.is_some()
        }
        #[cfg(not(feature = "otel"))]
        {
            false
        }
    }

    /// A new root span — one per turn, never a child of whatever context is current.
    pub fn root(&self, name: String, attributes: Vec<KeyValue>) -> Context {
        self.start(&Context::new(), name, SpanKind::Internal, attributes)
    }

    /// A span under `parent` (a no-op context when export is off).
    pub fn child(&self, parent: &Context, name: String, attributes: Vec<KeyValue>) -> Context {
        self.start(parent, name, SpanKind::Internal, attributes)
    }

    /// A client span (a model call) under `parent`.
    pub fn client(&self, parent: &Context, name: String, attributes: Vec<KeyValue>) -> Context {
        self.start(parent, name, SpanKind::Client, attributes)
    }

    fn start(
        &self,
        parent: &Context,
        name: String,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Context {
        #[cfg(feature = "otel")]
        if let Some(exporting) = &self.exporting {
            use opentelemetry::trace::Tracer as _;
            let span = exporting
                .tracer
                .span_builder(name)
                .with_kind(kind)
                .with_attributes(attributes)
                .start_with_context(&exporting.tracer, parent);
            return parent.with_span(span);
        }
        let _ = (parent, name, kind, attributes);
        Context::new()
    }

    /// Binds the running exec `exec` to `cx` (its `beige.sandbox.op` span) until the
    /// returned guard is dropped: a script's plugin calls attributed to the exec become
    /// children of it.
    pub fn bind_exec(self: &Arc<Self>, exec: &str, cx: &Context) -> Option<ExecBinding> {
        if !self.is_on() {
            return None;
        }
        self.lock().insert(exec.to_string(), cx.clone());
        Some(ExecBinding {
            traces: self.clone(),
            exec: exec.to_string(),
        })
    }

    /// The span a call attributed to `exec` joins; an empty context (a new root) when
    /// the exec is unknown or has ended.
    pub fn exec_context(&self, exec: Option<&str>) -> Context {
        exec.and_then(|e| self.lock().get(e).cloned())
            .unwrap_or_default()
    }

    /// Keeps `cx` open under `key` until [`Traces::take_open`]; `false` when too many
    /// are open already.
    pub fn keep_open(&self, key: String, cx: &Context) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= MAX_OPEN {
            return false;
        }
        open.insert(key, cx.clone());
        true
    }

    /// The span kept open under `key`, if any.
    pub fn take_open(&self, key: &str) -> Option<Context> {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Context>> {
        self.execs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `beige.prompt` with the redacted prompt, when `capture.prompts` opts in.
    pub fn prompt_attribute(&self, text: &str) -> Option<KeyValue> {
        (self.is_on() && self.capture_prompts)
            .then(|| KeyValue::new(names::PROMPT, self.captured(text)))
    }

    /// `beige.tool.args` with the redacted arguments, when `capture.toolArgs` opts in.
    pub fn args_attribute(&self, args: &[String]) -> Option<KeyValue> {
        (self.is_on() && self.capture_tool_args)
            .then(|| KeyValue::new(names::TOOL_ARGS, self.captured(&args.join(" "))))
    }

    fn captured(&self, text: &str) -> String {
        let mut s = text.to_string();
        for secret in self.secrets.iter().filter(|s| !s.is_empty()) {
            if s.contains(secret.as_str()) {
                s = s.replace(secret.as_str(), "***");
            }
        }
        if s.len() > CAPTURE_LIMIT {
            let mut end = CAPTURE_LIMIT;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
        }
        s
    }

    /// The exporter's last success and failure; `None` when export is off.
    #[cfg(feature = "otel")]
    pub fn health(&self) -> Option<ExportHealth> {
        self.exporting
            .as_ref()
            .map(|e| e.health.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Exports what is queued (at most 5 s); called when the gateway stops.
    pub fn flush(&self) {
        #[cfg(feature = "otel")]
        if let Some(exporting) = &self.exporting {
            exporting.flush();
        }
    }
}

/// Sets `attributes` on the span of `cx` and ends it.
pub fn end(cx: &Context, attributes: Vec<KeyValue>) {
    let span = cx.span();
    if span.span_context().is_valid() {
        span.set_attributes(attributes);
        span.end();
    }
}

/// Sets `attributes` on the span of `cx`.
pub fn annotate(cx: &Context, attributes: Vec<KeyValue>) {
    let span = cx.span();
    if span.span_context().is_valid() {
        span.set_attributes(attributes);
    }
}

/// The binding of a running exec to its span; dropped when the exec ends.
#[derive(Debug)]
pub struct ExecBinding {
    traces: Arc<Traces>,
    exec: String,
}

impl Drop for ExecBinding {
    fn drop(&mut self) {
        self.traces.lock().remove(&self.exec);
    }
}

/// Stamps every record written under a span with that span's `traceId` and `spanId`
/// before the sink (and its hash chain) sees it; records outside any span pass as they
/// are, without a copy.
#[derive(Debug)]
pub struct TracedAudit {
    inner: Arc<dyn AuditSink>,
}

impl TracedAudit {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn AuditSink>) -> Self {
        Self { inner }
    }
}

#[async_trait::async_trait]
impl AuditSink for TracedAudit {
    async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let cx = Context::current();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() || record.trace_id.is_some() {
            return self.inner.record(record).await;
        }
        let mut stamped = record.clone();
        stamped.trace_id = Some(sc.trace_id().to_string());
        stamped.span_id = Some(sc.span_id().to_string());
        self.inner.record(&stamped).await
    }
}

#[cfg(test)]
mod tests;
