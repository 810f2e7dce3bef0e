//! OpenTelemetry traces of warm-up, exported over OTLP/HTTP (`[traces]`, off unless
//! `otlp_endpoint` is set; `docs/traces.md` lists the spans and their attributes).
//!
//! The gateway's spans are `tracing` spans with target [`TARGET`]; the OpenTelemetry layer
//! exports only that target, whatever `PREWARM_LOG` says, so logging stays as it was and no
//! other span leaves the process. Export is the SDK's batch processor: spans queue in a bounded
//! channel (`max_queue` — when it is full new spans are dropped, never waited for) and a thread
//! of its own posts them every `export_delay_ms`, so a slow or dead collector costs the gateway
//! no request and no runtime thread. A pod call made inside a span carries its W3C trace context
//! (`traceparent`, [`trace_headers`]), so an engine that traces (vLLM's `--otlp-traces-endpoint`)
//! joins the same trace.

pub mod warmup;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use crate::config::TracesConfig;

/// The target of every span the gateway exports.
pub const TARGET: &str = "prewarm::warmup";

/// The OTLP protocol `[traces] protocol` names (`None` for a name `validate` refuses).
fn protocol_kind(config: &TracesConfig) -> Option<Protocol> {
    match config.protocol.as_str() {
        "http/protobuf" => Some(Protocol::HttpBinary),
        "http/json" => Some(Protocol::HttpJson),
        _ => None,
    }
}

/// The exporting side: keep it until exit, then [`TraceExport::shutdown`] flushes what is queued.
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// The exporter for `config`, or `None` when traces are off. Call it outside the async
    /// runtime: the blocking HTTP client it builds runs on the SDK's own thread.
    pub fn start(config: &TracesConfig) -> Result<Option<Self>, String> {
        if !config.enabled() {
            return Ok(None);
        }
        let protocol = protocol_kind(config)
            .ok_or_else(|| format!("traces.protocol: {:?}: unknown", config.protocol))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .with_endpoint(config.otlp_endpoint.clone())
            .with_timeout(Duration::from_millis(config.timeout_ms))
            .build()
            .map_err(|e| format!("traces.otlp_endpoint: {e}"))?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(Duration::from_millis(config.export_delay_ms))
            .with_max_queue_size(config.max_queue)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        Ok(Some(Self {
            provider: provider(processor, config),
        }))
    }

    /// The `tracing` layer that hands [`TARGET`]'s spans to this exporter.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        layer(&self.provider)
    }

    /// Flushes the queue and stops the export thread.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("prewarm-gateway: traces: shutdown: {e}");
        }
    }
}

/// A provider over `processor` with the resource and sampler of `config`; also installs the W3C
/// trace-context propagator [`trace_headers`] uses.
pub fn provider(
    processor: impl opentelemetry_sdk::trace::SpanProcessor + 'static,
    config: &TracesConfig,
) -> SdkTracerProvider {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sample_ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build()
}

/// The layer exporting [`TARGET`]'s spans through `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("prewarm-gateway"))
        .with_filter(
            tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::INFO),
        )
}

/// The W3C trace-context headers (`traceparent`, `tracestate`) of the current span, for a call
/// to a pod; none when traces are off or the span is not sampled.
pub fn trace_headers() -> Vec<(String, String)> {
    let context = tracing::Span::current().context();
    let mut headers = std::collections::HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut headers));
    headers.into_iter().collect()
}
