//! Scans over a source's events for the operator: a count (the dry run of
//! a bulk job), and each pass of a bulk job. A scan reads a source's
//! listing (its status index, in receive order) and reads and parses a
//! body only for rows that match on everything else, when the filter has a
//! body field. Parsing bodies is the one thing here that costs: a read-only
//! token's count over a million 64 KB bodies would be a minute of CPU.
//!
//! So a scan is bounded and kept off the request path:
//! - **a budget** ([`Budget`]): rows read, body bytes parsed and time. A
//!   count over it answers with what it found and a cursor to continue
//!   from (`complete: false`); a job's pass stops there and goes on at its
//!   next pass.
//! - **threads of its own** ([`Scanner`]): a scan runs on `dedupd-scan`
//!   (the data file's reads on its one blocking thread), never on an HTTP
//!   worker or the runtime that delivers, and the bodies it reads are
//!   parsed on `dedupd-scan-parse`, which does nothing else (a Redis
//!   connection a scan had to make again is served by the first, which
//!   never parses). The parser gives up its core after each body
//!   (`sched_yield`): a whole page parsed at once held a core for tens of
//!   milliseconds, and each step of an ingest waiting for that core
//!   added up to a p99 three times its idle one;
//! - **turns** (`gateway.max_scans`, 1 by default): more wait for a turn,
//!   and past [`MAX_WAITING`] waiting a count is refused with 429 (a job's
//!   pass waits its turn).
//!
//! What is indexed is used: the status picks the index; `received_from`
//! starts the read at that time and `received_to` ends it; a job reads
//! nothing received after it started. Stream, `created_at` and error text
//! are read from the rows, without a body.
//!
//! A source with destinations keeps each destination's copy in a lane of
//! its own (`SOURCE.DESTINATION`): a scan of the source reads every lane,
//! one after the other, and an event whose copy matched in an earlier lane
//! is not counted again.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::filter::EventFilter;
use crate::clock::Millis;
use crate::store::StoreError;
use crate::store::inbox::{Cursor, Inbox, InboxEvent, ListOrder};

/// Matches a count names (the first ones).
pub const NAMED: usize = 10;
/// Scans waiting for a turn past which a count is refused (429).
pub const MAX_WAITING: usize = 64;
/// Rows per listing page read.
const PAGE: usize = 500;
/// Body bytes read at once.
const READ_BYTES: u64 = 256 * 1024;

/// How much one count, dry run or job pass may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Rows read.
    pub rows: u64,
    /// Body bytes read and parsed (a body is read only for a filter on a
    /// body field).
    pub bytes: u64,
    /// Time spent.
    pub time: Duration,
}

/// Where a scan stands: the lane it reads (an index into its lanes) and
/// the last row it read there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    pub lane: usize,
    pub after: Option<Cursor>,
}

/// How a scan keeps from taking an event twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedupe {
    /// A count: a copy whose copy in an earlier lane matches was counted
    /// there.
    EarlierLanes,
    /// A job: each id once per scan (its window holds what it took
    /// before); an erasure reaches every copy of what it takes anyway.
    Taken,
}

/// What a scan reads.
#[derive(Debug, Clone)]
pub struct ScanRequest {
    /// The lanes of the source, in the order read.
    pub lanes: Vec<String>,
    pub filter: EventFilter,
    /// Where to start.
    pub from: Position,
    pub budget: Budget,
    /// Stop after this many matches.
    pub max_matches: u64,
    /// Keep the first this many (the others are counted).
    pub keep: usize,
    /// Rows received after this are not read (a job takes what was there
    /// when it started).
    pub until: Option<Millis>,
    /// Events not to take: those a job holds already.
    pub skip: HashSet<String>,
    /// Events replayed by this job already are not taken again.
    pub skip_replayed_by: Option<String>,
    pub dedupe: Dedupe,
}

/// What a scan found.
#[derive(Debug, Clone, Default)]
pub struct Scanned {
    /// The first matches (as many as the request keeps), each once however
    /// many lanes hold it (its `source` is the lane it matched in; its body
    /// filled in when the filter read it).
    pub matches: Vec<InboxEvent>,
    /// Matches in all.
    pub matched: u64,
    /// Rows read.
    pub rows: u64,
    /// Body bytes read and parsed.
    pub bytes: u64,
    /// Where to go on from; `None` once every lane was read to its end.
    pub next: Option<Position>,
}

/// Why a scan did not run.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// [`MAX_WAITING`] counts wait for a turn already.
    #[error("{MAX_WAITING} scans wait for a turn already; retry in a moment")]
    Busy,
    /// The scan thread is gone (the server stops).
    #[error("the scan thread has stopped")]
    Stopped,
}

/// Where scans parse bodies, and their turns.
#[derive(Debug)]
pub struct Scanner {
    /// Where bodies are parsed: a thread that does nothing else.
    parse: tokio::runtime::Handle,
    /// Where scans run and read (the data file's reads on its one
    /// blocking thread): a thread that parses nothing, so a Redis
    /// connection a scan (re)made there keeps being served.
    home: tokio::runtime::Handle,
    turns: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// Each count's and each job pass's budget.
    pub budget: Budget,
    /// Dropped with the scanner: the threads end.
    _stop: (oneshot::Sender<()>, oneshot::Sender<()>),
}

/// A thread of its own running a current-thread runtime (`reads`: with
/// one blocking thread for the data file's reads, and a driver for I/O),
/// until the sender returned is dropped.
fn thread(
    name: &str,
    reads: bool,
) -> std::io::Result<(tokio::runtime::Handle, oneshot::Sender<()>)> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    if reads {
        builder
            .enable_all()
            .max_blocking_threads(1)
            .thread_name(format!("{name}-read"));
    }
    let runtime = builder.build()?;
    let handle = runtime.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            });
        })?;
    Ok((handle, stop))
}

/// A count waiting for a turn, counted while it waits (however its wait
/// ends: a client gone drops it).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Scanner {
    /// Starts the scan thread: `max_scans` scans at once, each within
    /// `budget`.
    pub fn start(budget: Budget, max_scans: usize) -> std::io::Result<Self> {
        let (home, stop_home) = thread("dedupd-scan", true)?;
        let (parse, stop_parse) = thread("dedupd-scan-parse", false)?;
        Ok(Self {
            parse,
            home,
            turns: Arc::new(Semaphore::new(max_scans.max(1))),
            waiting: AtomicUsize::new(0),
            budget,
            _stop: (stop_home, stop_parse),
        })
    }

    /// A turn to scan, held until dropped. A count (`capped`) is refused
    /// when [`MAX_WAITING`] wait already; a job's pass waits its turn.
    pub async fn turn(&self, capped: bool) -> Result<OwnedSemaphorePermit, ScanError> {
        let waited = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        if capped && waited >= MAX_WAITING {
            return Err(ScanError::Busy);
        }
        self.turns
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ScanError::Stopped)
    }

    /// Runs `work` (CPU only: parsing, matching) on the scan thread.
    pub async fn compute<T, F>(&self, work: F) -> Result<T, ScanError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.parse
            .spawn(async move { work() })
            .await
            .map_err(|_| ScanError::Stopped)
    }

    /// Counts what `filter` matches in `lanes` from `from` on, within the
    /// budget: a count, or the dry run of a job.
    pub async fn count(
        &self,
        inbox: Arc<dyn Inbox>,
        lanes: Vec<String>,
        filter: EventFilter,
        from: Position,
    ) -> Result<Scanned, ScanError> {
        let turn = self.turn(true).await?;
        let request = ScanRequest {
            lanes,
            filter,
            from,
            budget: self.budget,
            max_matches: u64::MAX,
            keep: NAMED,
            until: None,
            skip: HashSet::new(),
            skip_replayed_by: None,
            dedupe: Dedupe::EarlierLanes,
        };
        self.run(turn, inbox, request).await
    }

    /// A job's pass (see [`scan`]), once it has a turn.
    pub async fn job_pass(
        &self,
        inbox: Arc<dyn Inbox>,
        request: ScanRequest,
    ) -> Result<Scanned, ScanError> {
        let turn = self.turn(false).await?;
        self.run(turn, inbox, request).await
    }

    /// Runs `request` on the scan thread, not on the task that asked (an
    /// HTTP worker, the job runner): the turn goes with it, and ends with
    /// the scan (a client that went away meanwhile does not free it early).
    async fn run(
        &self,
        turn: OwnedSemaphorePermit,
        inbox: Arc<dyn Inbox>,
        request: ScanRequest,
    ) -> Result<Scanned, ScanError> {
        let parse = self.parse.clone();
        self.home
            .spawn(async move {
                let _turn = turn;
                scan(&parse, inbox.as_ref(), &request).await
            })
            .await
            .map_err(|_| ScanError::Stopped)?
    }
}

/// Reads `request.lanes` on from `request.from`, in each lane's listing
/// order, until `max_matches` matches, the budget, or the end of the last
/// lane. It reads at least one row, so a scan always moves on. A page's
/// bodies are read 256 KiB at a time, and parsed on `parse` (the parse
/// thread), a body at a time.
pub async fn scan(
    parse: &tokio::runtime::Handle,
    inbox: &dyn Inbox,
    request: &ScanRequest,
) -> Result<Scanned, ScanError> {
    let started = Instant::now();
    let filter = &request.filter;
    let budget = &request.budget;
    let mut out = Scanned::default();
    let mut at = request.from.clone();
    let mut taken: HashSet<String> = HashSet::new();
    while at.lane < request.lanes.len() {
        let lane = &request.lanes[at.lane];
        // The index is in receive order: start at `received_from` (ids are
        // never empty, so every row received then comes after this).
        if at.after.is_none()
            && let Some(from) = filter.received_from
        {
            at.after = Some((from, String::new()));
        }
        let (page, more) = inbox
            .list_events(
                lane,
                filter.status,
                ListOrder::OldestFirst,
                at.after.clone(),
                PAGE,
            )
            .await?;
        let mut lane_done = more.is_none();
        if page.is_empty()
            && let Some(next) = more
        {
            // Rows that were gone by the time the page was read.
            at.after = Some(next);
            continue;
        }
        let mut candidates = Vec::new();
        let mut stop = false;
        for listed in page {
            let spent =
                out.rows > 0 && (out.rows >= budget.rows || started.elapsed() >= budget.time);
            if spent || out.matched + candidates.len() as u64 >= request.max_matches {
                stop = true;
                break;
            }
            // Nothing past these is read: the lane is done.
            let past = filter
                .received_to
                .is_some_and(|t| listed.received_at_ms >= t)
                || request.until.is_some_and(|t| listed.received_at_ms > t);
            if past {
                lane_done = true;
                break;
            }
            let size = listed.body_bytes as u64;
            if filter.needs_body() && out.bytes > 0 && out.bytes.saturating_add(size) > budget.bytes
            {
                // The next scan reads this row, with a budget of its own (a
                // body over the budget is read alone).
                stop = true;
                break;
            }
            out.rows += 1;
            at.after = Some((listed.received_at_ms, listed.event_id.clone()));
            if request.skip.contains(&listed.event_id)
                || request
                    .skip_replayed_by
                    .as_ref()
                    .is_some_and(|job| listed.replay.as_ref().is_some_and(|m| m.job == *job))
                || !filter.matches_without_body(&listed)
            {
                continue;
            }
            if filter.needs_body() {
                out.bytes = out.bytes.saturating_add(size);
            }
            candidates.push(listed);
        }
        // The page's bodies in one read, parsed on the scan thread.
        let matched = if filter.needs_body() && !candidates.is_empty() {
            let mut full = Vec::with_capacity(candidates.len());
            let mut chunk: Vec<String> = Vec::new();
            let mut chunk_bytes = 0u64;
            let last = candidates.len();
            for (i, e) in candidates.into_iter().enumerate() {
                chunk_bytes += e.body_bytes as u64;
                chunk.push(e.event_id);
                if chunk_bytes >= READ_BYTES || i + 1 == last {
                    full.extend(inbox.inbox_bodies(lane, std::mem::take(&mut chunk)).await?);
                    chunk_bytes = 0;
                }
            }
            let filter = filter.clone();
            parse
                .spawn(async move {
                    full.into_iter()
                        .flatten()
                        .filter(|e| {
                            let matched = filter.matches(e);
                            // A body at a time: the cores go to whoever
                            // waits (an ingest's next step), not to the
                            // rest of the page.
                            std::thread::yield_now();
                            matched
                        })
                        .collect::<Vec<_>>()
                })
                .await
                .map_err(|_| ScanError::Stopped)?
        } else {
            candidates
        };
        for event in matched {
            let again = match request.dedupe {
                Dedupe::EarlierLanes => {
                    at.lane > 0
                        && matched_before(inbox, &request.lanes[..at.lane], filter, &event).await?
                }
                Dedupe::Taken => !taken.insert(event.event_id.clone()),
            };
            if again {
                continue;
            }
            out.matched += 1;
            if out.matches.len() < request.keep {
                out.matches.push(event);
            }
        }
        if stop {
            out.next = Some(at);
            return Ok(out);
        }
        if lane_done {
            at = Position {
                lane: at.lane + 1,
                after: None,
            };
        }
    }
    Ok(out)
}

/// Whether `event`'s copy in one of `lanes` (read before its own) matches
/// `filter`, so it was counted there. Its body, times and stream are its
/// event's, the same in every lane: its copy's status and last error
/// decide.
async fn matched_before(
    inbox: &dyn Inbox,
    lanes: &[String],
    filter: &EventFilter,
    event: &InboxEvent,
) -> Result<bool, StoreError> {
    for lane in lanes {
        let states = inbox
            .replay_states(lane, vec![event.event_id.clone()])
            .await?;
        if let Some(Some(state)) = states.into_iter().next()
            && state.status == filter.status
            && filter.error_matches(state.last_error.as_deref())
        {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget {
            rows: 10,
            bytes: 10,
            time: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn bodies_are_parsed_on_the_scan_thread() {
        let scanner = Scanner::start(budget(), 1).expect("a scan thread");
        let name = scanner
            .compute(|| std::thread::current().name().map(str::to_owned))
            .await
            .expect("runs");
        assert_eq!(name.as_deref(), Some("dedupd-scan-parse"));
    }

    #[tokio::test]
    async fn counts_take_turns_too_many_waiting_are_refused_and_one_that_gives_up_leaves() {
        let scanner = Arc::new(Scanner::start(budget(), 1).expect("a scan thread"));
        // The one turn is taken...
        let held = scanner.turn(true).await.expect("a turn");
        // ...so the others wait, none of them with a turn meanwhile.
        let got = Arc::new(AtomicUsize::new(0));
        let mut waiting = Vec::new();
        for _ in 0..MAX_WAITING {
            let (scanner, got) = (scanner.clone(), got.clone());
            waiting.push(tokio::spawn(async move {
                let turn = scanner.turn(true).await;
                got.fetch_add(1, Ordering::SeqCst);
                turn.map(drop)
            }));
        }
        while scanner.waiting.load(Ordering::SeqCst) < MAX_WAITING {
            tokio::task::yield_now().await;
        }
        assert_eq!(got.load(Ordering::SeqCst), 0);
        // One more count is refused at once; a job's pass waits.
        assert!(matches!(scanner.turn(true).await, Err(ScanError::Busy)));
        let job = tokio::spawn({
            let scanner = scanner.clone();
            async move { scanner.turn(false).await.map(drop) }
        });
        // Clients that go away while they wait leave the queue.
        for w in waiting.drain(..) {
            w.abort();
            let _ = w.await;
        }
        while scanner.waiting.load(Ordering::SeqCst) > 1 {
            tokio::task::yield_now().await;
        }
        let next = tokio::spawn({
            let scanner = scanner.clone();
            async move { scanner.turn(true).await.map(drop) }
        });
        while scanner.waiting.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        drop(held);
        assert!(job.await.expect("joins").is_ok());
        assert!(next.await.expect("joins").is_ok());
        assert_eq!(scanner.waiting.load(Ordering::SeqCst), 0);
    }
}
