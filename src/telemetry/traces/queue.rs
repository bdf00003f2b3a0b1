//! Finished spans on their way to the collector: a bounded queue the
//! request and delivery paths never wait on (a push under a lock, no
//! wake-up but one per full batch), and one thread of its own that sends
//! them in batches through the OTLP exporter. A collector that hangs or
//! refuses costs spans (dropped, counted, and warned about once a minute),
//! never time on the paths that made them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{Notify, mpsc, oneshot};

/// Most spans per export request.
const MAX_BATCH: usize = 512;
/// Longest a finished span waits for a full batch.
const INTERVAL: Duration = Duration::from_secs(1);
/// Longest one export may take, whatever the exporter's own timeout.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(15);
/// At most one warning per this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Spans exported, and dropped (the queue was full, or the collector
/// failed them), since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanCounts {
    pub exported: u64,
    pub dropped_queue_full: u64,
    pub dropped_export_failed: u64,
}

static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED_QUEUE_FULL: AtomicU64 = AtomicU64::new(0);
static DROPPED_EXPORT_FAILED: AtomicU64 = AtomicU64::new(0);

/// The process's span counts.
pub fn counts() -> SpanCounts {
    SpanCounts {
        exported: EXPORTED.load(Ordering::Relaxed),
        dropped_queue_full: DROPPED_QUEUE_FULL.load(Ordering::Relaxed),
        dropped_export_failed: DROPPED_EXPORT_FAILED.load(Ordering::Relaxed),
    }
}

/// Warns at most once per [`WARN_EVERY`] when spans were dropped since
/// the last look. Only the export thread warns: a span's end is inside the
/// logging machinery, which must not log.
#[derive(Default)]
struct Warner {
    last: Option<Instant>,
    seen: u64,
}

impl Warner {
    fn look(&mut self) {
        let c = counts();
        let dropped = c.dropped_queue_full + c.dropped_export_failed;
        if dropped == self.seen || self.last.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        tracing::warn!(
            dropped = dropped - self.seen,
            dropped_queue_full = c.dropped_queue_full,
            dropped_export_failed = c.dropped_export_failed,
            "trace spans dropped: the collector is down, slow or refusing; \
             ingest and delivery go on (dedupd_trace_spans_dropped_total counts them; \
             at most one such warning a minute)"
        );
        self.seen = dropped;
    }
}

enum Control {
    Flush(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Flush(_) => "Flush",
            Self::Shutdown(_) => "Shutdown",
        })
    }
}

/// The spans waiting: a vector behind a lock the span's end holds for a
/// push. The export thread is woken only when a batch is full (or by its
/// own timer): never once per span, whose hand-off would cost more than
/// the span.
#[derive(Debug)]
struct Waiting {
    spans: Mutex<Vec<SpanData>>,
    capacity: usize,
    full_batch: Notify,
    closed: AtomicBool,
}

/// The span processor: `on_end` puts a sampled span on the queue, or
/// drops it when the queue is full.
#[derive(Debug)]
pub struct QueueProcessor {
    waiting: Arc<Waiting>,
    control: mpsc::UnboundedSender<Control>,
}

impl QueueProcessor {
    /// A queue of `capacity` spans, exported by `exporter` on a thread of
    /// its own.
    pub fn start<E: SpanExporter + 'static>(exporter: E, capacity: usize) -> std::io::Result<Self> {
        let waiting = Arc::new(Waiting {
            spans: Mutex::new(Vec::with_capacity(MAX_BATCH)),
            capacity,
            full_batch: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let (control, control_rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = waiting.clone();
        std::thread::Builder::new()
            .name("dedupd-traces".into())
            .spawn(move || {
                runtime.block_on(run(exporter, shared.clone(), control_rx));
                shared.closed.store(true, Ordering::Relaxed);
            })?;
        Ok(Self { waiting, control })
    }

    fn ask(
        &self,
        make: impl FnOnce(oneshot::Sender<()>) -> Control,
        within: Duration,
    ) -> OTelSdkResult {
        let (done, wait) = oneshot::channel();
        self.control
            .send(make(done))
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        // Called from the serving runtime's threads too: wait on a thread
        // of its own, so no runtime is blocked in.
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
                rt.block_on(async { tokio::time::timeout(within, wait).await })
                    .map_err(|_| OTelSdkError::Timeout(within))?
                    .map_err(|_| OTelSdkError::AlreadyShutdown)
            })
            .join()
            .unwrap_or(Err(OTelSdkError::InternalFailure("panicked".into())))
        })
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let w = &self.waiting;
        if w.closed.load(Ordering::Relaxed) {
            // Shut down (or its thread died): nothing is exported any more.
            DROPPED_EXPORT_FAILED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut spans = w.spans.lock().unwrap_or_else(PoisonError::into_inner);
        if spans.len() >= w.capacity {
            drop(spans);
            DROPPED_QUEUE_FULL.fetch_add(1, Ordering::Relaxed);
            return;
        }
        spans.push(span);
        let full = spans.len() == MAX_BATCH;
        drop(spans);
        if full {
            w.full_batch.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, EXPORT_TIMEOUT)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Control::Shutdown, timeout)
    }
}

/// The export thread: what waits, when a batch is full or every
/// [`INTERVAL`], in requests of at most [`MAX_BATCH`].
async fn run<E: SpanExporter>(
    exporter: E,
    waiting: Arc<Waiting>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut warner = Warner::default();
    loop {
        let asked = tokio::select! {
            biased;
            c = control.recv() => Some(c),
            () = waiting.full_batch.notified() => None,
            () = tokio::time::sleep(INTERVAL) => None,
        };
        let batch = {
            let mut spans = waiting.spans.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *spans, Vec::with_capacity(MAX_BATCH))
        };
        export_all(&exporter, batch).await;
        warner.look();
        match asked {
            None => {}
            Some(Some(Control::Flush(done))) => {
                let _ = done.send(());
            }
            Some(Some(Control::Shutdown(done))) => {
                let _ = exporter.shutdown();
                let _ = done.send(());
                return;
            }
            Some(None) => return,
        }
    }
}

/// Exports `batch` in requests of at most [`MAX_BATCH`]. A batch that
/// fits goes as it is, not copied.
async fn export_all<E: SpanExporter>(exporter: &E, batch: Vec<SpanData>) {
    if batch.len() <= MAX_BATCH {
        return export(exporter, batch).await;
    }
    let mut spans = batch.into_iter();
    loop {
        let sent: Vec<SpanData> = spans.by_ref().take(MAX_BATCH).collect();
        if sent.is_empty() {
            return;
        }
        export(exporter, sent).await;
    }
}

/// Sends one request's spans; counts them as exported or as dropped.
async fn export<E: SpanExporter>(exporter: &E, sent: Vec<SpanData>) {
    if sent.is_empty() {
        return;
    }
    let n = sent.len() as u64;
    match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(sent)).await {
        Ok(Ok(())) => {
            EXPORTED.fetch_add(n, Ordering::Relaxed);
        }
        Ok(Err(e)) => {
            DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed);
            tracing::debug!(error = %e, spans = n, "the collector did not take spans");
        }
        Err(_) => {
            DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed);
        }
    }
}
