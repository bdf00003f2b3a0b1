//! Finished spans on their way to the collector: a bounded queue the
//! request and delivery paths never wait on (a push under a lock, no
//! wake-up but one per full batch), and one thread of its own that sends
//! them in batches through the OTLP exporter. A collector that hangs or
//! refuses costs spans (dropped, counted, and warned about once a minute),
//! never time on the paths that made them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::Dispatch;
use tracing::subscriber::NoSubscriber;

use super::recorded::Recorded;

/// An ended span on its way to the collector: as its task recorded it,
/// moved into the batch (its box freed on the task's thread, where the
/// next span reuses it), made into span data on the export thread.
pub type Finished = Recorded;

/// Most spans per export request: half the queue, up to this many (the
/// OpenTelemetry SDK's own default). Each request costs the export thread
/// time of its own (the HTTP exchange, its wake-ups, the URL parsed again:
/// about 60 µs measured alone against nginx, up to 0.2 ms estimated inside
/// the loaded server), so larger batches cost less a span: 2048 saved
/// about 0.2 µs a claim (at `4d338c2`, docs/performance.md). But a batch
/// is exported in one go, and with the server on one core, batches of 2048
/// (3 ms or more of work) raised the ingest p99 from 28–31 ms to 34–38 ms
/// and lowered its rate, in three runs each.
const MAX_BATCH: usize = 512;
/// Spans staged before they are moved into their batch together (5 KiB
/// of claims spans).
const STAGED: usize = 32;
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
    /// The process's logging (the export thread's own logs nothing).
    log: Dispatch,
}

impl Warner {
    fn look(&mut self) {
        let c = counts();
        let dropped = c.dropped_queue_full + c.dropped_export_failed;
        if dropped == self.seen || self.last.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        tracing::dispatcher::with_default(&self.log, || {
            tracing::warn!(
                dropped = dropped - self.seen,
                dropped_queue_full = c.dropped_queue_full,
                dropped_export_failed = c.dropped_export_failed,
                "trace spans dropped: the collector is down, slow or refusing; \
                 ingest and delivery go on (dedupd_trace_spans_dropped_total counts them; \
                 at most one such warning a minute)"
            );
        });
        self.seen = dropped;
    }
}

/// A request to stop: answered once what waited is exported.
type Stop = oneshot::Sender<()>;

/// The spans waiting, behind a lock the span's end holds for a push. The
/// export thread is woken only when a batch is full (or by its own timer):
/// never once per span, whose hand-off would cost more than the span.
#[derive(Debug)]
struct Waiting {
    spans: Mutex<Batches>,
    capacity: usize,
    full_batch: Notify,
    closed: AtomicBool,
}

/// The spans waiting, in batches of `size` as the exporter takes them: a
/// span is moved into its batch with the few staged beside it, and never
/// again (a batch that grew past its size would be copied whole, then
/// split).
#[derive(Debug)]
struct Batches {
    /// Spans per batch.
    size: usize,
    /// Full batches, oldest first.
    full: Vec<Vec<Finished>>,
    /// The batch being filled: allocated at its first span, never grown.
    filling: Vec<Finished>,
    /// The last few spans, on their way into `filling` in one copy: a
    /// few kilobytes written again and again, so always in the cache,
    /// where a span written straight into the batch (memory last touched
    /// a batch ago) cost its request about 0.15 µs of cache misses.
    staged: Vec<Finished>,
    /// Emptied batches the export thread gave back, filled again before
    /// any is allocated: memory the spans were just in, not fresh.
    spare: Vec<Vec<Finished>>,
    /// Spans the export thread took and has not given back: still in
    /// memory (a collector that hangs holds them up to the export's
    /// timeout), so they count against the queue's capacity.
    taken: usize,
}

impl Batches {
    /// Batches for a queue of `capacity` spans: half of it each, so one
    /// fills while the one before is sent, and at most [`MAX_BATCH`].
    fn for_queue(capacity: usize) -> Self {
        Self {
            size: (capacity / 2).clamp(1, MAX_BATCH),
            full: Vec::new(),
            filling: Vec::new(),
            staged: Vec::new(),
            spare: Vec::new(),
            taken: 0,
        }
    }

    /// The spans held: waiting, and taken by the export thread.
    fn len(&self) -> usize {
        self.full.len() * self.size + self.filling.len() + self.staged.len() + self.taken
    }

    /// Moves the staged spans into the batch being filled (which has room
    /// for them: they are staged only while it has).
    fn unstage(&mut self) {
        if self.filling.capacity() == 0 {
            match self.spare.pop() {
                Some(spare) => self.filling = spare,
                None => self.filling.reserve_exact(self.size),
            }
        }
        self.filling.append(&mut self.staged);
    }

    /// Adds `span`; true when that filled a batch.
    fn push(&mut self, span: Finished) -> bool {
        if self.staged.capacity() == 0 {
            self.staged.reserve_exact(STAGED);
        }
        self.staged.push(span);
        let filled = self.filling.len() + self.staged.len();
        if self.staged.len() < STAGED && filled < self.size {
            return false;
        }
        self.unstage();
        if filled < self.size {
            return false;
        }
        self.full.push(std::mem::take(&mut self.filling));
        true
    }

    /// The full batches, oldest first; the one being filled stays.
    fn take_full(&mut self) -> Vec<Vec<Finished>> {
        let full = std::mem::take(&mut self.full);
        self.taken += full.iter().map(Vec::len).sum::<usize>();
        full
    }

    /// Takes back an exported batch's buffer, emptied (two at most: one
    /// filling while one is sent), and the `sent` spans it held.
    fn give_back(&mut self, mut batch: Vec<Finished>, sent: usize) {
        self.taken = self.taken.saturating_sub(sent);
        batch.clear();
        if batch.capacity() == self.size && self.spare.len() < 2 {
            self.spare.push(batch);
        }
    }

    /// Every batch waiting, oldest first (the last one maybe not full).
    fn take_all(&mut self) -> Vec<Vec<Finished>> {
        if !self.staged.is_empty() {
            self.unstage();
        }
        let mut all = self.take_full();
        if !self.filling.is_empty() {
            self.taken += self.filling.len();
            all.push(std::mem::take(&mut self.filling));
        }
        all
    }
}

impl Waiting {
    /// Queues `span`, or drops it when the queue is full or closed.
    fn push(&self, span: Finished) {
        if self.closed.load(Ordering::Relaxed) {
            // Shut down (or its thread died): nothing is exported any more.
            DROPPED_EXPORT_FAILED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        if spans.len() >= self.capacity {
            drop(spans);
            DROPPED_QUEUE_FULL.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let full = spans.push(span);
        drop(spans);
        if full {
            self.full_batch.notify_one();
        }
    }
}

/// The queue, where an ended span goes.
#[derive(Debug, Clone)]
pub struct Handle(Arc<Waiting>);

impl Handle {
    pub fn push(&self, span: Finished) {
        self.0.push(span);
    }
}

/// A stop that did not export every span in time: why, and how many
/// spans were left (counted as dropped).
#[derive(Debug)]
pub struct Unsent {
    pub error: OTelSdkError,
    pub spans: u64,
}

/// The export thread and its queue.
#[derive(Debug)]
pub struct QueueProcessor {
    waiting: Arc<Waiting>,
    stop: mpsc::UnboundedSender<Stop>,
}

impl QueueProcessor {
    /// A queue of `capacity` spans, exported by `exporter` on a thread of
    /// its own.
    pub fn start<E: SpanExporter + 'static>(exporter: E, capacity: usize) -> std::io::Result<Self> {
        let waiting = Arc::new(Waiting {
            spans: Mutex::new(Batches::for_queue(capacity)),
            capacity,
            full_batch: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let (stop, stop_rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = waiting.clone();
        // The exporter's libraries log on this thread at every try of a
        // failing export (rustls's verifier an ERROR line per request to a
        // collector whose certificate fails: a hundred a second under
        // load). Dropped: the thread logs through the process's own
        // logging only the warning, once a minute, and its debug lines.
        let log = tracing::dispatcher::get_default(Clone::clone);
        std::thread::Builder::new()
            .name("dedupd-traces".into())
            .spawn(move || {
                tracing::subscriber::with_default(NoSubscriber::default(), || {
                    runtime.block_on(run(exporter, shared.clone(), stop_rx, log));
                });
                shared.closed.store(true, Ordering::Relaxed);
            })?;
        Ok(Self { waiting, stop })
    }

    /// The queue.
    pub fn handle(&self) -> Handle {
        Handle(self.waiting.clone())
    }

    /// Exports what waits and stops the thread, waiting at most `within`.
    pub fn shutdown(&self, within: Duration) -> Result<(), Unsent> {
        let (done, wait) = oneshot::channel();
        let stopped = self
            .stop
            .send(done)
            .map_err(|_| OTelSdkError::AlreadyShutdown)
            .and_then(|()| {
                // Called from the serving runtime's threads too: wait on a
                // thread of its own, so no runtime is blocked in.
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
            });
        stopped.map_err(|error| {
            // Nobody sends them now: counted as dropped, as are spans
            // that end from now on.
            self.waiting.closed.store(true, Ordering::Relaxed);
            let left = self
                .waiting
                .spans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len() as u64;
            DROPPED_EXPORT_FAILED.fetch_add(left, Ordering::Relaxed);
            Unsent { error, spans: left }
        })
    }
}

/// The export thread: what waits, when a batch is full or every
/// [`INTERVAL`], in requests of a batch each.
async fn run<E: SpanExporter>(
    exporter: E,
    waiting: Arc<Waiting>,
    mut stop: mpsc::UnboundedReceiver<Stop>,
    log: Dispatch,
) {
    /// Why the export thread woke.
    enum Woke {
        /// Asked to stop (or every sender gone).
        Stop(Option<Stop>),
        Full,
        Timer,
    }
    let mut warner = Warner {
        log: log.clone(),
        ..Warner::default()
    };
    let mut pause = Pause::default();
    // Batches taken but not tried when an export before them failed: the
    // first sent once the pause is over (their spans still count against
    // the queue meanwhile).
    let mut held: Vec<Vec<Finished>> = Vec::new();
    loop {
        let woke = match pause.until {
            // Nothing is sent meanwhile: the spans wait in the queue (those
            // past it are dropped as they end, at the cost of a lock).
            Some(until) => tokio::select! {
                biased;
                // The stop tries once more (within its own bound).
                s = stop.recv() => {
                    pause.until = None;
                    Woke::Stop(s)
                }
                () = tokio::time::sleep_until(until) => {
                    pause.until = None;
                    Woke::Timer
                }
            },
            None => tokio::select! {
                biased;
                s = stop.recv() => Woke::Stop(s),
                () = waiting.full_batch.notified() => Woke::Full,
                () = tokio::time::sleep(INTERVAL) => Woke::Timer,
            },
        };
        let mut batches = std::mem::take(&mut held);
        {
            let mut spans = waiting.spans.lock().unwrap_or_else(PoisonError::into_inner);
            // A full batch woke it: the spans after it wait to fill the
            // next one. Sent now, they would be a request of their own
            // (60 µs to 0.2 ms of this thread's time) for a handful of spans,
            // once per batch at a high rate. The timer sends what waited.
            batches.extend(match woke {
                Woke::Full => spans.take_full(),
                Woke::Stop(_) | Woke::Timer => spans.take_all(),
            });
        }
        for mut batch in batches {
            let sent = batch.len();
            if pause.until.is_some() {
                // An export of this wake failed: the rest would fail too,
                // each taking its time. They wait for the pause's end; at
                // the stop, they are dropped.
                if !matches!(woke, Woke::Stop(_)) {
                    held.push(batch);
                    continue;
                }
                DROPPED_EXPORT_FAILED.fetch_add(sent as u64, Ordering::Relaxed);
                batch.clear();
            } else {
                let started = tokio::time::Instant::now();
                if !export(&exporter, &mut batch, &log).await {
                    pause.failed(started.elapsed());
                } else if sent > 0 {
                    pause = Pause::default();
                }
            }
            let mut spans = waiting.spans.lock().unwrap_or_else(PoisonError::into_inner);
            spans.give_back(batch, sent);
            drop(spans);
            // Between batches too: each may take the export's timeout.
            warner.look();
        }
        warner.look();
        match woke {
            Woke::Full | Woke::Timer => {}
            Woke::Stop(done) => {
                let _ = exporter.shutdown();
                if let Some(done) = done {
                    let _ = done.send(());
                }
                return;
            }
        }
    }
}

/// The wait after a failed export before the next: each failure in a row
/// doubles it, from [`FIRST_PAUSE`] to [`LONGEST_PAUSE`], and it is at
/// least four times as long as the failed export took; an export that
/// succeeds ends it, and a failure long after the last starts it again
/// from the first. A collector that fails every export at once costs one
/// request a pause, not one per batch; one that keeps the exporter busy
/// until its timeout (an endless stream of `103` answers, each parsed and
/// skipped, took 0.7 of a core for as long as spans came) costs at most a
/// fifth of the thread's time.
#[derive(Debug, Default)]
struct Pause {
    /// No export before this.
    until: Option<tokio::time::Instant>,
    /// The last pause.
    last: Duration,
    /// When the last failure was.
    failed_at: Option<tokio::time::Instant>,
}

/// The first pause after a failed export.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause (but for four times an export's [`EXPORT_TIMEOUT`]).
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

impl Pause {
    /// An export failed, after `took`.
    fn failed(&mut self, took: Duration) {
        let now = tokio::time::Instant::now();
        if self
            .failed_at
            .is_some_and(|at| now.duration_since(at) > 2 * LONGEST_PAUSE)
        {
            self.last = Duration::ZERO;
        }
        self.last = (self.last * 2)
            .clamp(FIRST_PAUSE, LONGEST_PAUSE)
            .max(took.saturating_mul(4));
        self.until = Some(now + self.last);
        self.failed_at = Some(now);
    }
}

/// Sends one request's spans (emptying `batch`); counts them as exported
/// or as dropped. False when the collector did not take them.
async fn export<E: SpanExporter>(exporter: &E, batch: &mut Vec<Finished>, log: &Dispatch) -> bool {
    if batch.is_empty() {
        return true;
    }
    let sent: Vec<SpanData> = batch.drain(..).map(Finished::into_data).collect();
    let n = sent.len() as u64;
    match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(sent)).await {
        Ok(Ok(())) => {
            EXPORTED.fetch_add(n, Ordering::Relaxed);
            true
        }
        Ok(Err(e)) => {
            DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed);
            tracing::dispatcher::with_default(log, || {
                tracing::debug!(error = %e, spans = n, "the collector did not take spans");
            });
            false
        }
        Err(_) => {
            DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::KeyValue;
    use opentelemetry::trace::SpanKind;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::Sampler;

    fn span(n: u64) -> Finished {
        let mut span =
            Recorded::root("claim", SpanKind::Server, &Sampler::AlwaysOn).expect("sampled");
        span.set_attribute(KeyValue::new("n", i64::try_from(n).unwrap()));
        *span
    }

    #[test]
    fn spans_wait_in_batches_the_exporter_takes_whole_and_in_order() {
        let mut b = Batches::for_queue(1024);
        let filled: Vec<u64> = (0..1300).filter(|&n| b.push(span(n))).collect();
        assert_eq!(filled, [511, 1023], "a wake-up per full batch, no more");
        assert_eq!(b.len(), 1300);
        // A full batch's wake-up sends the full ones only: the rest wait
        // to fill a batch of their own, not a request for a few spans.
        let mut batches = b.take_full();
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [512, 512]);
        assert_eq!(b.len(), 1300, "those the export thread holds count too");
        assert!(b.take_full().is_empty());
        // The timer (or the end) sends what waited.
        batches.extend(b.take_all());
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [512, 512, 276]
        );
        // Never grown, so never copied.
        assert!(batches.iter().all(|v| v.capacity() == 512));
        let order: Vec<KeyValue> = batches
            .iter_mut()
            .flat_map(|batch| batch.drain(..))
            .map(|s| s.into_data().attributes.remove(0))
            .collect();
        let pushed = (0..1300).map(|n| KeyValue::new("n", n));
        assert_eq!(order, pushed.collect::<Vec<_>>());
        assert_eq!(b.len(), 1300);
        // The emptied buffers are filled again, not allocated anew.
        for (batch, sent) in batches.into_iter().zip([512, 512, 276]) {
            b.give_back(batch, sent);
        }
        assert_eq!(b.spare.len(), 2, "two kept: one filling, one sent");
        assert_eq!(b.len(), 0);
        assert!(b.take_all().is_empty(), "nothing left, no empty batch sent");
        assert!(!b.push(span(0)));
        assert_eq!(b.len(), 1);
        assert!(
            b.take_full().is_empty(),
            "a staged span waits for its batch"
        );
        let last = b.take_all();
        assert_eq!(last.len(), 1);
        assert_eq!((last[0].len(), last[0].capacity()), (1, 512));
        assert_eq!(b.spare.len(), 1, "its batch was a spare one");
    }

    /// A collector that hangs keeps the batches the export thread took in
    /// memory: they count, so the queue's capacity bounds every span held,
    /// not only those waiting.
    #[test]
    fn spans_the_export_thread_holds_count_against_the_capacity() {
        let waiting = Waiting {
            spans: Mutex::new(Batches::for_queue(64)),
            capacity: 64,
            full_batch: Notify::new(),
            closed: AtomicBool::new(false),
        };
        let held = |w: &Waiting| w.spans.lock().unwrap().len();
        for n in 0..64 {
            waiting.push(span(n));
        }
        let taken = waiting.spans.lock().unwrap().take_full();
        assert_eq!(taken.iter().map(Vec::len).sum::<usize>(), 64);
        waiting.push(span(64));
        assert_eq!(held(&waiting), 64, "dropped: the thread still holds 64");
        let mut spans = waiting.spans.lock().unwrap();
        for batch in taken {
            let sent = batch.len();
            spans.give_back(batch, sent);
        }
        drop(spans);
        assert_eq!(held(&waiting), 0);
        waiting.push(span(65));
        assert_eq!(held(&waiting), 1, "room again once they are sent");
    }

    /// What the exporter's libraries log on the export thread (rustls's
    /// verifier logs an ERROR at every export to a collector whose
    /// certificate fails) reaches no log; the warning about the spans
    /// dropped does, through the logging the process had.
    #[test]
    fn only_the_drop_warning_is_logged_from_the_export_thread() {
        #[derive(Debug)]
        struct Failing;
        impl SpanExporter for Failing {
            async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
                tracing::error!("invalid peer certificate");
                Err(OTelSdkError::InternalFailure("refused".into()))
            }
        }
        let lines = crate::telemetry::TestLines::default();
        let logging = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        // The process's logging, as `serve` sets it: the one test here
        // that sets it (the export thread would log to it otherwise).
        tracing::subscriber::set_global_default(logging).expect("the only global logging");
        let queue = QueueProcessor::start(Failing, 64).expect("started");
        for n in 0..3 {
            queue.handle().push(span(n));
        }
        // The stop exports what waited, and looks at the drops.
        queue
            .shutdown(Duration::from_secs(10))
            .map_err(|u| u.error)
            .expect("stopped");
        let text = lines.take().join("\n");
        assert!(text.contains("trace spans dropped"), "{text}");
        assert!(text.contains("the collector did not take spans"), "{text}");
        assert!(!text.contains("invalid peer certificate"), "{text}");
    }

    /// A stop whose collector never answers says how many spans it
    /// leaves, and counts them as dropped (they were counted nowhere), as
    /// it does a span that ends after it.
    #[test]
    fn the_spans_a_stop_leaves_are_counted_as_dropped() {
        #[derive(Debug)]
        struct Hanging;
        impl SpanExporter for Hanging {
            async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
                std::future::pending().await
            }
        }
        let before = counts().dropped_export_failed;
        let queue = QueueProcessor::start(Hanging, 64).expect("started");
        for n in 0..40 {
            queue.handle().push(span(n));
        }
        let unsent = queue
            .shutdown(Duration::from_millis(100))
            .expect_err("the collector never answers");
        assert_eq!(unsent.spans, 40);
        queue.handle().push(span(40));
        // Other tests count too: at least these.
        assert!(counts().dropped_export_failed - before >= 41);
    }

    /// After a failed export the next waits 1 s, after another 2 s, and
    /// so on up to a minute, and at least four times what the failed one
    /// took; one that succeeds ends the pause. A collector that kept each
    /// export busy until its timeout (endless `103` answers) cost a core
    /// for as long as spans came. The spans that end meanwhile wait in the
    /// queue, and the batches taken with a failed one wait for the pause's
    /// end: none is dropped that was not tried.
    #[tokio::test(start_paused = true)]
    async fn a_failed_export_pauses_the_next_doubling_until_one_succeeds() {
        #[derive(Debug, Clone, Default)]
        struct Flaky {
            /// Each export's first span's `n`.
            sent: Arc<Mutex<Vec<i64>>>,
            up: Arc<AtomicBool>,
            /// How long an export takes before it fails.
            slow: Arc<Mutex<Duration>>,
        }
        impl SpanExporter for Flaky {
            async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
                let first = batch[0].attributes[0].value.as_str().parse().unwrap_or(-1);
                self.sent.lock().unwrap().push(first);
                if self.up.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let slow = *self.slow.lock().unwrap();
                tokio::time::sleep(slow).await;
                Err(OTelSdkError::InternalFailure("refused".into()))
            }
        }
        let exporter = Flaky::default();
        let waiting = Arc::new(Waiting {
            spans: Mutex::new(Batches::for_queue(128)),
            capacity: 128,
            full_batch: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let (stop, stop_rx) = mpsc::unbounded_channel();
        let thread = tokio::spawn(run(
            exporter.clone(),
            waiting.clone(),
            stop_rx,
            Dispatch::none(),
        ));
        let sent = || exporter.sent.lock().unwrap().clone();
        let batch = |from: u64| {
            for n in from..from + 64 {
                waiting.push(span(n));
            }
        };
        let wait = |ms: u64| tokio::time::sleep(Duration::from_millis(ms));
        let dropped = counts().dropped_export_failed;
        batch(0);
        wait(10).await;
        assert_eq!(sent(), [0], "a full batch is sent at once");
        // Paused 1 s: the next two full batches wait.
        batch(100);
        batch(200);
        wait(900).await;
        assert_eq!(sent(), [0], "within the first pause");
        wait(200).await;
        assert_eq!(sent(), [0, 100], "sent once the pause is over");
        // It failed again: 2 s now, and 200's batch, not tried, waits.
        wait(1800).await;
        assert_eq!(sent(), [0, 100], "within the second pause");
        exporter.up.store(true, Ordering::SeqCst);
        wait(300).await;
        assert_eq!(sent(), [0, 100, 200], "the batch held is sent first");
        // It succeeded: no pause.
        batch(300);
        wait(10).await;
        assert_eq!(sent(), [0, 100, 200, 300], "sent at once again");
        // An export that fails after 10 s pauses the next 40 s.
        exporter.up.store(false, Ordering::SeqCst);
        *exporter.slow.lock().unwrap() = Duration::from_secs(10);
        batch(400);
        wait(10_010).await;
        batch(500);
        wait(39_000).await;
        assert_eq!(sent().len(), 5, "within four times the export's time");
        wait(2_000).await;
        assert_eq!(sent().len(), 6);
        // Other tests count too: at least the three batches that failed.
        assert!(counts().dropped_export_failed - dropped >= 3 * 64);
        let (done, _stopped) = oneshot::channel();
        stop.send(done).expect("running");
        thread.await.expect("stopped");
    }

    #[test]
    fn a_batch_is_half_the_queue_up_to_the_most_a_request_carries() {
        assert_eq!(Batches::for_queue(4096).size, MAX_BATCH);
        assert_eq!(Batches::for_queue(100_000).size, MAX_BATCH);
        // The smallest queue the settings take still fills batches, so it
        // is sent when half full, not only by the timer.
        assert_eq!(Batches::for_queue(64).size, 32);
    }
}
