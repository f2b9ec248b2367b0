//! OpenTelemetry traces (docs/operations.md, "Traces"): with `[telemetry]
//! otlp_endpoint` set, the daemon records a span per gateway request (the
//! gateway's own, and its request to the bundle), per bundle start (its
//! sandbox, spawn and initialize), per host-resources request and per
//! OAuth token refresh, and exports them over OTLP (HTTP/protobuf) in
//! batches, from the batch processor's own thread: a call only hands its
//! finished span to a bounded queue (full: the span is dropped, the call
//! never waits).
//!
//! Trace context comes from the agent (the request's `_meta.traceparent`
//! and `tracestate`, SEP-414, else the HTTP `traceparent` header) and goes
//! to the bundle in the `_meta` of the request the gateway sends it, so
//! one trace spans agent, daemon and bundle. With tracing off the agent's
//! context is still passed on unchanged, so the bundle's spans join the
//! agent's trace; the daemon just records none of its own.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, TraceId, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer};

use crate::config::TelemetrySettings;

pub use opentelemetry::trace::SpanKind as Kind;
pub use opentelemetry::KeyValue as Attribute;

/// How long one export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the daemon waits, when it stops, for the spans not yet sent.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Finished spans waiting for their batch; beyond, new ones are dropped.
const QUEUE: usize = 8192;
/// Spans sent in one request.
const BATCH: usize = 512;
/// How often a batch goes, however small.
const DELAY: Duration = Duration::from_millis(1000);

/// Where the daemon's spans go: nowhere (tracing off, the default), or a
/// tracer whose batches are exported to the configured endpoint. Cheap to
/// clone.
#[derive(Clone, Default)]
pub struct Telemetry {
    tracer: Option<SdkTracer>,
    /// The traces of recorded requests to bundles still in flight (how
    /// many of each): the only contexts a bundle's own requests may
    /// continue.
    handed: Arc<Mutex<HashMap<TraceId, usize>>>,
}

/// The exporting side of [`Telemetry`], kept by the daemon to send what is
/// left when it stops.
pub struct Exporter {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

impl Telemetry {
    /// Tracing as `settings` say: off without an endpoint. The exporter
    /// builds its blocking HTTP client on a thread of its own.
    pub fn start(settings: &TelemetrySettings) -> Result<(Telemetry, Option<Exporter>), String> {
        let Some(endpoint) = &settings.otlp_endpoint else {
            return Ok((Telemetry::default(), None));
        };
        let headers: HashMap<String, String> = settings
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(traces_url(endpoint))
            .with_timeout(EXPORT_TIMEOUT)
            .with_headers(headers)
            .build()
            .map_err(|e| format!("telemetry.otlp_endpoint {endpoint:?}: {e}"))?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE)
            .with_max_export_batch_size(BATCH)
            .with_scheduled_delay(DELAY)
            .build();
        let exporter = Reported {
            inner: exporter,
            failing: Default::default(),
        };
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batches)
            .build();
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio)));
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .with_sampler(sampler)
            .build();
        let scope = opentelemetry::InstrumentationScope::builder("bundlevisor")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        Ok((
            Telemetry {
                tracer: Some(tracer),
                handed: Default::default(),
            },
            Some(Exporter { provider }),
        ))
    }

    /// Whether spans are recorded.
    pub fn is_on(&self) -> bool {
        self.tracer.is_some()
    }

    /// A trace of its own (no parent): a bundle's start.
    pub fn root(&self) -> Trace {
        Trace {
            telemetry: self.clone(),
            context: Context::new(),
        }
    }

    /// The trace a bundle's own request came with, continued only when it
    /// is one the daemon handed a bundle with a request still in flight:
    /// else a trace of its own, sampled by `sample_ratio` (a bundle cannot
    /// have its requests recorded by marking them sampled).
    pub fn continued_by_bundle(
        &self,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Trace {
        let trace = self.continued(traceparent, tracestate);
        let id = trace.context.span().span_context().trace_id();
        let handed = self.handed.lock().unwrap_or_else(|p| p.into_inner());
        match handed.contains_key(&id) {
            true => trace,
            false => self.root(),
        }
    }

    /// The trace a request came with: W3C `traceparent` and `tracestate`
    /// (malformed or absent: a trace of its own).
    pub fn continued(&self, traceparent: Option<&str>, tracestate: Option<&str>) -> Trace {
        let context = match traceparent {
            Some(traceparent) => TraceContextPropagator::new().extract(&Carrier {
                traceparent,
                tracestate,
            }),
            None => Context::new(),
        };
        Trace {
            telemetry: self.clone(),
            context,
        }
    }
}

impl Exporter {
    /// Sends the spans not yet sent and stops the batch thread. Blocks (up
    /// to a few seconds): run it on the blocking pool.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!("traces: the last spans could not be sent: {e}");
        }
    }
}

/// The OTLP exporter, its failures logged: the first of a run of them (a
/// collector down, a wrong endpoint, a refused key), and when exports work
/// again.
#[derive(Debug)]
struct Reported {
    inner: opentelemetry_otlp::SpanExporter,
    failing: std::sync::atomic::AtomicBool,
}

impl opentelemetry_sdk::trace::SpanExporter for Reported {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        use std::sync::atomic::Ordering;
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        match &result {
            Err(e) if !self.failing.swap(true, Ordering::Relaxed) => tracing::warn!(
                spans,
                "traces: an export to the collector failed ({e}); its spans are dropped, and so are the next ones until an export works"
            ),
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!("traces: exports to the collector work again")
            }
            _ => {}
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The URL spans are posted to: `endpoint` as given, or, when it names no
/// path, its `/v1/traces` (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read).
pub fn traces_url(endpoint: &str) -> String {
    match url::Url::parse(endpoint) {
        Ok(url) if url.path() == "/" && url.query().is_none() => {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        }
        _ => endpoint.to_string(),
    }
}

/// `traceparent` and `tracestate` read from one request.
struct Carrier<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(self.traceparent),
            "tracestate" => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// W3C trace context to pass on: `traceparent`, and `tracestate` if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct W3c {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl Injector for W3c {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = value,
            "tracestate" if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

/// Where new spans go in a trace: under the span (ours or the agent's)
/// this holds, or at the root of a new trace. Cheap to clone; what a
/// request carries along to the bundle.
#[derive(Clone, Default)]
pub struct Trace {
    telemetry: Telemetry,
    context: Context,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("trace_id", &self.trace_id())
            .field("recording", &self.telemetry.is_on())
            .finish()
    }
}

impl Trace {
    /// Whether spans of this trace are recorded at all (tracing on): a
    /// caller skips building names and attributes when not.
    pub fn is_on(&self) -> bool {
        self.telemetry.is_on()
    }

    /// [`Trace::span`], its name and attributes made by `make` only when
    /// the span is recorded (tracing on): nothing is built per request
    /// when tracing is off.
    pub fn span_with(
        &self,
        kind: SpanKind,
        make: impl FnOnce() -> (String, Vec<KeyValue>),
    ) -> Span {
        if !self.is_on() {
            return self.quiet();
        }
        let (name, attributes) = make();
        self.span(name, kind, attributes)
    }

    /// A span that records nothing and passes this trace's context on.
    pub fn quiet(&self) -> Span {
        Span {
            span: None,
            trace: self.clone(),
            handed: None,
        }
    }

    /// A span under this one, from now, with `attributes`: recorded when
    /// tracing is on (and the trace sampled), else a span that records
    /// nothing and passes this trace's context on.
    pub fn span(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let Some(tracer) = &self.telemetry.tracer else {
            return self.quiet();
        };
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(tracer, &self.context);
        let context = self
            .context
            .with_remote_span_context(span.span_context().clone());
        Span {
            span: Some(span),
            trace: Trace {
                telemetry: self.telemetry.clone(),
                context,
            },
            handed: None,
        }
    }

    /// Whether there is a trace (ours, or one a request came with).
    pub fn has_context(&self) -> bool {
        self.context.span().span_context().is_valid()
    }

    /// The trace's id (lowercase hex), when there is a trace.
    pub fn trace_id(&self) -> Option<String> {
        let span = self.context.span();
        let context = span.span_context();
        context.is_valid().then(|| context.trace_id().to_string())
    }

    /// The context to pass on to a bundle, when there is a trace.
    pub fn w3c(&self) -> Option<W3c> {
        if !self.context.span().span_context().is_valid() {
            return None;
        }
        let mut out = W3c::default();
        TraceContextPropagator::new().inject_context(&self.context, &mut out);
        (!out.traceparent.is_empty()).then_some(out)
    }
}

/// One span being recorded (or, tracing off, nothing), ended by
/// [`Span::end`] or when dropped.
pub struct Span {
    span: Option<opentelemetry_sdk::trace::Span>,
    trace: Trace,
    /// Handed to a bundle ([`Span::hand_over`]): its trace is vouched for
    /// until the span ends.
    handed: Option<TraceId>,
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(id) = self.handed.take() else {
            return;
        };
        let mut handed = self
            .trace
            .telemetry
            .handed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = handed.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                handed.remove(&id);
            }
        }
    }
}

impl Span {
    /// This recorded span's context goes to a bundle with a request: until
    /// the span ends, the bundle's own requests in its trace continue it
    /// ([`Telemetry::continued_by_bundle`]).
    pub fn hand_over(&mut self) {
        if !self.is_recording() || self.handed.is_some() {
            return;
        }
        let id = self.trace.context.span().span_context().trace_id();
        *self
            .trace
            .telemetry
            .handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default() += 1;
        self.handed = Some(id);
    }

    /// The trace under this span: its children's parent, and what goes to
    /// a bundle.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Whether this span is recorded (tracing on and the trace sampled).
    pub fn is_recording(&self) -> bool {
        self.span.as_ref().is_some_and(|s| s.is_recording())
    }

    /// Sets one more attribute.
    pub fn set(&mut self, attribute: KeyValue) {
        if let Some(span) = &mut self.span {
            span.set_attribute(attribute);
        }
    }

    /// Ends the span, `outcome` recorded as `bundlevisor.outcome`; an error
    /// (`why`) sets its status.
    pub fn end(mut self, outcome: &'static str, why: Option<&str>) {
        if let Some(mut span) = self.span.take() {
            span.set_attribute(KeyValue::new("bundlevisor.outcome", outcome));
            match why {
                Some(why) => {
                    span.set_attribute(KeyValue::new("error.type", outcome));
                    span.set_status(Status::error(why.to_string()));
                }
                None => span.set_status(Status::Ok),
            }
            span.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn an_agents_context_is_passed_on_unchanged_when_tracing_is_off() {
        let off = Telemetry::default();
        let trace = off.continued(Some(PARENT), Some("vendor=1"));
        assert_eq!(
            trace.trace_id().as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        let span = trace.span("tools/call x", SpanKind::Client, Vec::new());
        assert!(!span.is_recording());
        assert_eq!(
            span.trace().w3c(),
            Some(W3c {
                traceparent: PARENT.to_string(),
                tracestate: Some("vendor=1".to_string()),
            })
        );
    }

    /// Tracing on, sampling nothing of its own, exporting nowhere.
    fn sampling_nothing() -> Telemetry {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                0.0,
            ))))
            .build();
        Telemetry {
            tracer: Some(provider.tracer("test")),
            handed: Default::default(),
        }
    }

    #[test]
    fn a_bundle_continues_only_a_trace_handed_to_it_and_only_while_in_flight() {
        let on = sampling_nothing();
        // A sampled context the bundle made up: a trace of the daemon's
        // own, which samples nothing here.
        let made_up = on.continued_by_bundle(Some(PARENT), None);
        assert_ne!(
            made_up.trace_id().as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert!(!made_up
            .span("host-resources x", SpanKind::Server, Vec::new())
            .is_recording());
        // The agent's sampled trace, handed to the bundle with a request.
        let agents = on.continued(Some(PARENT), None);
        let mut request = agents.span("tools/call x", SpanKind::Client, Vec::new());
        assert!(request.is_recording());
        request.hand_over();
        let given = request.trace().w3c().unwrap().traceparent;
        let read = on.continued_by_bundle(Some(&given), None);
        let span = read.span("host-resources x", SpanKind::Server, Vec::new());
        assert!(span.is_recording());
        assert_eq!(
            span.trace().trace_id().as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        // Its request answered: the trace is no longer the bundle's to use.
        request.end("ok", None);
        let late = on.continued_by_bundle(Some(&given), None);
        assert!(!late
            .span("host-resources x", SpanKind::Server, Vec::new())
            .is_recording());
        assert!(on.handed.lock().unwrap().is_empty());
    }

    #[test]
    fn a_malformed_or_absent_traceparent_starts_no_trace() {
        let off = Telemetry::default();
        for bad in [None, Some("garbage"), Some("00-xyz-00f067aa0ba902b7-01")] {
            let trace = off.continued(bad, None);
            assert_eq!(trace.trace_id(), None, "{bad:?}");
            assert_eq!(trace.w3c(), None, "{bad:?}");
        }
        let zero = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
        assert_eq!(off.continued(Some(&zero), None).trace_id(), None);
    }

    #[test]
    fn an_endpoint_without_a_path_posts_to_v1_traces() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://127.0.0.1:6006/v1/traces"),
            "http://127.0.0.1:6006/v1/traces"
        );
        assert_eq!(
            traces_url("https://collector/otlp/v1/traces"),
            "https://collector/otlp/v1/traces"
        );
    }
}
