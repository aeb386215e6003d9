//! The OTLP/HTTP exporter behind [`Traces`](super::Traces): a per-gateway
//! `SdkTracerProvider` with a batch processor (its own thread, a bounded queue of 2,048
//! spans, 10 s per export, spans dropped rather than waited for), and the HTTP client
//! the exporter posts with — the workspace's blocking reqwest client, which also keeps
//! the exporter's health (last success, last error) for `beige doctor`.
//!
//! Only `telemetry.otlp` configures it: the endpoint, headers and timeout are set in
//! code, so `OTEL_EXPORTER_OTLP_*` variables do not redirect the spans.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;

use super::TelemetryError;
use crate::config::OtlpConfig;

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a flush at stop may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Spans waiting for export; more are dropped.
const QUEUE: usize = 2048;

/// The exporter's state as `beige doctor` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportHealth {
    /// When an export last succeeded.
    pub last_success: Option<SystemTime>,
    /// The last failure (an HTTP status or a connection error) and when.
    pub last_error: Option<(SystemTime, String)>,
}

/// The provider, its tracer and the health of its exports.
#[derive(Debug)]
pub(super) struct Exporting {
    provider: SdkTracerProvider,
    pub(super) tracer: SdkTracer,
    pub(super) health: Arc<Mutex<ExportHealth>>,
}

impl Exporting {
    pub(super) fn new(config: &OtlpConfig) -> Result<Self, TelemetryError> {
        let endpoint = traces_endpoint(&config.endpoint)?;
        let health = Arc::new(Mutex::new(ExportHealth::default()));
        let client = BlockingClient::new(health.clone());
        let headers: HashMap<String, String> = config
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(endpoint)
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(headers)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(QUEUE)
                    .with_scheduled_delay(Duration::from_millis(500))
                    .build(),
            )
            .build();
        let ratio = config.sample_ratio.clamp(0.0, 1.0);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .with_resource(Resource::builder_empty().with_service_name("beige").build())
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "beige");
        Ok(Self {
            provider,
            tracer,
            health,
        })
    }

    pub(super) fn flush(&self) {
        // The processor's flush blocks on its thread; bounded by the export timeout.
        let provider = self.provider.clone();
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(provider.force_flush());
        });
        match wait.recv_timeout(FLUSH_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "telemetry: flushing spans failed"),
            Err(_) => tracing::warn!("telemetry: flushing spans took over 5 s; gave up"),
        }
    }
}

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_TIMEOUT) {
            tracing::debug!(error = %e, "telemetry: shutting the tracer down");
        }
    }
}

/// `<endpoint>/v1/traces`, or the endpoint as given when it already names the path.
fn traces_endpoint(endpoint: &str) -> Result<String, TelemetryError> {
    let bad = |reason: &str| TelemetryError::Endpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let url = reqwest::Url::parse(endpoint).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("only http and https are supported (OTLP/HTTP)"));
    }
    if url.host_str().is_none() {
        return Err(bad("it names no host"));
    }
    let trimmed = endpoint.trim_end_matches('/');
    Ok(if trimmed.ends_with("/v1/traces") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1/traces")
    })
}

/// The exporter's HTTP client: blocking reqwest on the batch processor's own thread
/// (an async client there would need a runtime the thread does not have). It is made
/// on that thread at the first export: a blocking client may not be made or dropped
/// on an async runtime's thread.
#[derive(Debug)]
struct BlockingClient {
    client: std::sync::OnceLock<Result<reqwest::blocking::Client, String>>,
    health: Arc<Mutex<ExportHealth>>,
}

impl BlockingClient {
    fn new(health: Arc<Mutex<ExportHealth>>) -> Self {
        Self {
            client: std::sync::OnceLock::new(),
            health,
        }
    }

    fn client(&self) -> Result<&reqwest::blocking::Client, HttpError> {
        self.client
            .get_or_init(|| {
                reqwest::blocking::Client::builder()
                    .timeout(EXPORT_TIMEOUT)
                    // Spans go to the configured collector only, never through a proxy
                    // from the environment.
                    .no_proxy()
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| HttpError::from(e.clone()))
    }

    fn note(&self, outcome: Result<(), String>) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(()) => health.last_success = Some(SystemTime::now()),
            Err(e) => health.last_error = Some((SystemTime::now(), e)),
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for BlockingClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let url = parts.uri.to_string();
        let mut builder = self
            .client()?
            .request(parts.method, &url)
            .body(body.to_vec());
        for (name, value) in &parts.headers {
            builder = builder.header(name, value);
        }
        let response = match builder.send() {
            Ok(r) => r,
            Err(e) => {
                let e = e.without_url();
                self.note(Err(format!("{url}: {e}")));
                return Err(Box::new(e));
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().map_err(|e| Box::new(e) as HttpError)?;
        self.note(if status.is_success() {
            Ok(())
        } else {
            Err(format!("{url}: HTTP {status}"))
        });
        let mut out = Response::builder().status(status.as_u16());
        for (name, value) in &headers {
            out = out.header(name, value);
        }
        out.body(body).map_err(|e| Box::new(e) as HttpError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(
            traces_endpoint("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_endpoint("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_endpoint("https://otel.example/v1/traces").unwrap(),
            "https://otel.example/v1/traces"
        );
        let e = traces_endpoint("grpc://127.0.0.1:4317").unwrap_err();
        assert!(e.to_string().contains("only http and https"), "{e}");
        assert!(traces_endpoint("not a url").is_err());
    }
}
