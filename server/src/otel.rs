//! Export of this node's spans over OTLP/gRPC (`kairos serve
//! --otlp-endpoint`): the run spans of `runlog.rs` and the client-write
//! spans of `grpc/api.rs`, through `tracing-opentelemetry` and the
//! OpenTelemetry SDK's batch processor (a thread of its own; the tonic
//! channel it sends on runs on the node's runtime). Without an endpoint
//! nothing here is built and no layer is installed.
//!
//! Export never holds up or fails scheduling: a finished span goes into a
//! queue of at most [`QUEUE_MAX`] spans and is dropped when the queue is
//! full; a batch the collector refused, did not answer within
//! [`EXPORT_TIMEOUT_MS`], or that could not be sent is dropped too. Every
//! dropped span is counted ([`spans_dropped`], `/metrics`
//! `kairos_otel_spans_dropped_total`); the first failed export after a good
//! one is logged as a warning, the first good one after failures as info.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, Span, SpanData,
    SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetryLayer;

/// Finished spans waiting to be exported, at most; more are dropped.
pub const QUEUE_MAX: usize = 2048;
/// One export call's limit, sending included; then the batch is dropped.
pub const EXPORT_TIMEOUT_MS: u64 = 5_000;
/// How long a graceful stop waits for the queued spans to be sent.
pub const SHUTDOWN_MS: u64 = 5_000;
/// Longest `--otlp-endpoint` and `--otlp-service-name`.
pub const ENDPOINT_MAX: usize = 2048;
pub const SERVICE_NAME_MAX: usize = 256;

/// Spans dropped since the process started, by a full queue or a failed export.
static DROPPED: AtomicU64 = AtomicU64::new(0);

pub fn spans_dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

fn dropped(n: usize) {
    DROPPED.fetch_add(n as u64, Ordering::Relaxed);
}

/// Where and as what this node exports its spans.
#[derive(Clone, Debug)]
pub struct Export {
    /// `http://HOST:PORT` of an OTLP/gRPC receiver (a collector).
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// The resource's `kairos.node.id` (and `service.instance.id`).
    pub node_id: u64,
}

impl Export {
    /// Refuses what the exporter could not use, naming the flag and the rule.
    pub fn validate(&self) -> Result<(), String> {
        let e = &self.endpoint;
        let host = e.strip_prefix("http://").unwrap_or_default();
        if e.len() > ENDPOINT_MAX || host.is_empty() || host.starts_with('/') {
            return Err(format!(
                "--otlp-endpoint {e:?}: must be http://HOST:PORT of an OTLP/gRPC receiver, at most {ENDPOINT_MAX} bytes (plaintext gRPC only: send to a local collector for TLS)"
            ));
        }
        let name = &self.service_name;
        if name.is_empty() || name.len() > SERVICE_NAME_MAX || name.chars().any(char::is_control) {
            return Err(format!(
                "--otlp-service-name {name:?}: must be 1 to {SERVICE_NAME_MAX} bytes without control characters"
            ));
        }
        Ok(())
    }

    /// Builds the exporter and the layer that feeds it. Call it inside the
    /// tokio runtime the node runs on: the gRPC channel lives there.
    pub fn start<S>(&self) -> anyhow::Result<(OpenTelemetryLayer<S, SdkTracer>, Flush)>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&self.endpoint)
            .with_timeout(Duration::from_millis(EXPORT_TIMEOUT_MS))
            .build()?;
        let queued = Arc::new(AtomicUsize::new(0));
        let exporter = Counted {
            inner: exporter,
            queued: queued.clone(),
            failing: AtomicBool::new(false),
        };
        // The SDK reads OTEL_BSP_SCHEDULE_DELAY and OTEL_BSP_MAX_EXPORT_BATCH_SIZE
        // (default 5 s, 512 spans); the queue is ours.
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE_MAX)
            .build();
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(config)
            .build();
        let id = self.node_id;
        let resource = Resource::builder()
            .with_service_name(self.service_name.clone())
            .with_attributes([
                KeyValue::new("kairos.node.id", i64::try_from(id).unwrap_or(i64::MAX)),
                KeyValue::new("service.instance.id", id.to_string()),
            ])
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded {
                inner: batch,
                queued,
            })
            .with_resource(resource)
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("kairos"))
            .with_threads(false);
        Ok((layer, Flush(provider)))
    }
}

/// Sends what is queued and stops the exporter; for a graceful stop, while
/// the runtime still runs.
pub struct Flush(SdkTracerProvider);

impl Flush {
    pub fn shutdown(self) {
        if let Err(e) = self
            .0
            .shutdown_with_timeout(Duration::from_millis(SHUTDOWN_MS))
        {
            tracing::warn!("span export did not finish at shutdown: {e}");
        }
    }
}

/// The batch processor behind a queue bound counted here, so that a span
/// the queue has no room for is counted as dropped (the SDK drops it
/// silently). `queued` counts spans handed on and not yet taken by an
/// export, so the processor's own queue (as long) never overflows.
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx)
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= QUEUE_MAX {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            dropped(1);
            return;
        }
        self.inner.on_end(span)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

/// The OTLP exporter, counting the spans of a failed export as dropped.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        self.queued.fetch_sub(n, Ordering::Relaxed);
        let res = self.inner.export(batch).await;
        match &res {
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!("span export works again");
            }
            Ok(()) => {}
            Err(e) => {
                dropped(n);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "span export failed, dropping spans until it works \
                         (kairos_otel_spans_dropped_total): {e}"
                    );
                }
            }
        }
        res
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(endpoint: &str, service_name: &str) -> Export {
        Export {
            endpoint: endpoint.into(),
            service_name: service_name.into(),
            node_id: 1,
        }
    }

    #[test]
    fn an_endpoint_must_be_plain_http_with_a_host() {
        assert_eq!(export("http://127.0.0.1:4317", "kairos").validate(), Ok(()));
        for bad in [
            "https://collector:4317",
            "127.0.0.1:4317",
            "http://",
            "http:///x",
        ] {
            let e = export(bad, "kairos").validate().unwrap_err();
            assert!(
                e.starts_with("--otlp-endpoint") && e.contains("http://HOST:PORT"),
                "{e}"
            );
        }
        let long = format!("http://{}", "h".repeat(ENDPOINT_MAX));
        assert!(export(&long, "kairos").validate().is_err());
    }

    #[test]
    fn a_service_name_is_bounded_and_printable() {
        let long = "k".repeat(SERVICE_NAME_MAX + 1);
        for bad in ["", "kai\nros", long.as_str()] {
            let e = export("http://c:4317", bad).validate().unwrap_err();
            assert!(e.starts_with("--otlp-service-name"), "{e}");
        }
    }
}
