//! Finished spans on their way to the collector: a bounded queue the
//! request and delivery paths never wait on, and one thread of its own
//! that batches them into the OTLP exporter. A collector that hangs or
//! refuses costs spans (dropped, counted, and warned about once a minute),
//! never time on the paths that made them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, oneshot};

/// Most spans per export request.
const MAX_BATCH: usize = 512;
/// Longest a finished span waits for a fuller batch.
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

/// The span processor: `on_end` puts a sampled span on the queue, or
/// drops it when the queue is full.
#[derive(Debug)]
pub struct QueueProcessor {
    spans: mpsc::Sender<SpanData>,
    control: mpsc::UnboundedSender<Control>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Flush(_) => "Flush",
            Self::Shutdown(_) => "Shutdown",
        })
    }
}

impl QueueProcessor {
    /// A queue of `capacity` spans, exported by `exporter` on a thread of
    /// its own.
    pub fn start<E: SpanExporter + 'static>(exporter: E, capacity: usize) -> std::io::Result<Self> {
        let (spans, rx) = mpsc::channel(capacity);
        let (control, control_rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("dedupd-traces".into())
            .spawn(move || runtime.block_on(run(exporter, rx, control_rx)))?;
        Ok(Self { spans, control })
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
        match self.spans.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                DROPPED_QUEUE_FULL.fetch_add(1, Ordering::Relaxed);
            }
            // Shut down (or its thread died): nothing is exported any more.
            Err(mpsc::error::TrySendError::Closed(_)) => {
                DROPPED_EXPORT_FAILED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, EXPORT_TIMEOUT)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.ask(Control::Shutdown, timeout)
    }
}

/// The export thread: batches of up to [`MAX_BATCH`], or what came within
/// [`INTERVAL`].
async fn run<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(MAX_BATCH);
    let mut warner = Warner::default();
    let mut deadline = tokio::time::Instant::now() + INTERVAL;
    loop {
        let room = MAX_BATCH - batch.len();
        tokio::select! {
            biased;
            c = control.recv() => {
                while batch.len() < MAX_BATCH * 8 {
                    match spans.try_recv() {
                        Ok(s) => batch.push(s),
                        Err(_) => break,
                    }
                }
                export_all(&exporter, &mut batch).await;
                match c {
                    Some(Control::Flush(done)) => {
                        let _ = done.send(());
                    }
                    Some(Control::Shutdown(done)) => {
                        let _ = exporter.shutdown();
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                }
            }
            n = spans.recv_many(&mut batch, room), if room > 0 => {
                if n == 0 {
                    export_all(&exporter, &mut batch).await;
                    return;
                }
            }
            () = tokio::time::sleep_until(deadline) => {}
        }
        let now = tokio::time::Instant::now();
        if batch.len() >= MAX_BATCH || now >= deadline {
            export_all(&exporter, &mut batch).await;
            warner.look();
            deadline = now + INTERVAL;
        }
    }
}

/// Exports `batch` in requests of at most [`MAX_BATCH`]; counts what went
/// and what the collector failed.
async fn export_all<E: SpanExporter>(exporter: &E, batch: &mut Vec<SpanData>) {
    while !batch.is_empty() {
        let rest = batch.split_off(batch.len().min(MAX_BATCH));
        let sent = std::mem::replace(batch, rest);
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
}
