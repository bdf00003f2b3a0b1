//! Bulk operations over a filter, run as jobs: **redeliver** (a replay of
//! every matching event) and **erase**. A job is a record in the inbox's
//! store ([`Job`], kept by `Inbox::put_job`): its filter, where its scan
//! is, its counters and its window (the events it queued that have not
//! settled yet). The [`runner`] on every instance runs the jobs it holds
//! the claim of, so in a fleet one instance runs each job and another
//! takes over after a crash; a restart resumes from the record.
//!
//! Design: docs/design/operator-power.md.

pub mod runner;

use serde::{Deserialize, Serialize};

use super::filter::EventFilter;
use crate::clock::Millis;
use crate::store::StoreError;
use crate::store::inbox::{Cursor, Inbox, StoredJob};

pub use runner::Runner;

/// Job records kept: past this many, the oldest finished ones are deleted.
pub const KEPT: usize = 100;
/// Jobs running at once (more are refused until one finishes).
pub const MAX_RUNNING: usize = 8;

/// What a job does to each event its filter matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Sends it again (see `Inbox::replay`), with a `dedupd-replay` header.
    Redeliver,
    /// Deletes its body and headers (see `Inbox::erase`).
    Erase,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Scanning, or waiting for what it queued.
    Running,
    /// Every match was handled.
    Done,
    /// Cancelled by an operator: it queued nothing more, and what it had
    /// queued settled.
    Cancelled,
}

/// A job's record. Stored as JSON: fields are added with defaults only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// `job_` and 16 hex digits.
    pub id: String,
    pub source: String,
    pub kind: JobKind,
    pub filter: EventFilter,
    pub state: JobState,
    /// Unix ms.
    pub created_ms: Millis,
    /// When it finished (done or cancelled), Unix ms.
    #[serde(default)]
    pub finished_ms: Option<Millis>,
    /// The lanes it reads, in order: a source with destinations keeps
    /// each one's copies in a lane of its own (`SOURCE.DESTINATION`).
    /// Empty in records from before: its source's own.
    #[serde(default)]
    pub lanes: Vec<String>,
    /// The lane its scan is in (none: the first).
    #[serde(default)]
    pub lane: Option<String>,
    /// The last row its scan read there, in the listing's order; none
    /// before the first.
    #[serde(default)]
    pub cursor: Option<Cursor>,
    /// The scan reached the end of the listing.
    #[serde(default)]
    pub scanned_all: bool,
    /// Rows read.
    #[serde(default)]
    pub scanned: u64,
    /// Rows the filter matched (and the job took on).
    #[serde(default)]
    pub matched: u64,
    /// Redeliver: replays the destination acknowledged.
    #[serde(default)]
    pub delivered: u64,
    /// Redeliver: replays that ended dead (or stale).
    #[serde(default)]
    pub failed: u64,
    /// Erase: events erased.
    #[serde(default)]
    pub erased: u64,
    /// Matches that were no longer there, or no longer eligible, when the
    /// job came to them (reaped, erased, redelivered by hand meanwhile).
    #[serde(default)]
    pub skipped: u64,
    /// Events taken on and not finished: queued replays not settled yet,
    /// or erasures being written. At most the source's window.
    #[serde(default)]
    pub window: Vec<String>,
    /// Why it stopped early, if it did.
    #[serde(default)]
    pub error: Option<String>,
    /// Marked cancelled (kept by the store apart from the record).
    #[serde(skip)]
    pub cancelled: bool,
}

impl Job {
    /// A new running job.
    pub fn new(source: &str, kind: JobKind, filter: EventFilter, now: Millis) -> Self {
        Self {
            id: format!("job_{:016x}", rand::random::<u64>()),
            source: source.to_owned(),
            kind,
            filter,
            state: JobState::Running,
            created_ms: now,
            finished_ms: None,
            lanes: vec![source.to_owned()],
            lane: None,
            cursor: None,
            scanned_all: false,
            scanned: 0,
            matched: 0,
            delivered: 0,
            failed: 0,
            erased: 0,
            skipped: 0,
            window: Vec::new(),
            error: None,
            cancelled: false,
        }
    }

    /// The record as stored.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A stored record; `None` when it does not decode (a record of a
    /// later build, say).
    pub fn decode(stored: &StoredJob) -> Option<Self> {
        let mut job: Self = serde_json::from_slice(&stored.record).ok()?;
        job.id.clone_from(&stored.id);
        job.cancelled = stored.cancelled;
        Some(job)
    }

    /// Ends the job as `state` at `now`. Its filter keeps its shape, not
    /// its values: an erasure's filter names the person erased.
    pub fn finish(&mut self, state: JobState, now: Millis) {
        self.state = state;
        self.finished_ms = Some(now);
        self.filter = self.filter.without_values();
    }

    /// The lanes it reads.
    pub fn lanes(&self) -> Vec<String> {
        if self.lanes.is_empty() {
            vec![self.source.clone()]
        } else {
            self.lanes.clone()
        }
    }
}

/// Ends `job` as `state` at `now` once `write` stored its last record
/// (the filter without its values: see [`Job::finish`]); `write` is given
/// the job's id, that record, and whether the records before held values
/// (then `Inbox::end_job`, which takes them out of the store's files;
/// otherwise `Inbox::put_job`, which costs no rewrite). On an error `job` is
/// left as it was, running as stored, so the runner's next pass ends it
/// again: taken for ended, it would leave the runner's list while its
/// record still says running, with its filter's values.
pub async fn end<W, F>(
    job: &mut Job,
    state: JobState,
    now: Millis,
    write: W,
) -> Result<(), StoreError>
where
    W: FnOnce(String, Vec<u8>, bool) -> F,
    F: std::future::Future<Output = Result<(), StoreError>>,
{
    let mut ended = job.clone();
    ended.finish(state, now);
    let held_values = ended.filter != job.filter;
    write(ended.id.clone(), ended.encode(), held_values).await?;
    *job = ended;
    Ok(())
}

/// Every job, newest first.
pub async fn list(inbox: &dyn Inbox) -> Result<Vec<Job>, StoreError> {
    let mut jobs: Vec<Job> = inbox.jobs().await?.iter().filter_map(Job::decode).collect();
    jobs.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(b.id.cmp(&a.id)));
    Ok(jobs)
}

/// One job.
pub async fn get(inbox: &dyn Inbox, id: &str) -> Result<Option<Job>, StoreError> {
    Ok(inbox
        .jobs()
        .await?
        .iter()
        .find(|s| s.id == id)
        .and_then(Job::decode))
}

/// Why a job cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// [`MAX_RUNNING`] jobs run already.
    #[error("{MAX_RUNNING} jobs are running already; wait for one to finish or cancel one")]
    TooMany,
}

/// Stores a new job (the runner picks it up), deleting the oldest finished
/// records past [`KEPT`].
pub async fn start(inbox: &dyn Inbox, job: &Job, now: Millis) -> Result<(), StartError> {
    // One start at a time in this process: the count of running jobs and
    // the write of the new one must not interleave with another start's.
    static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = STARTING.lock().await;
    let jobs = list(inbox).await?;
    if jobs.iter().filter(|j| j.state == JobState::Running).count() >= MAX_RUNNING {
        return Err(StartError::TooMany);
    }
    inbox.put_job(&job.id, job.encode(), now).await?;
    let finished: Vec<&Job> = jobs
        .iter()
        .filter(|j| j.state != JobState::Running)
        .collect();
    // `list` is newest first: what is past the newest KEPT - 1 goes.
    for old in finished.iter().skip(KEPT.saturating_sub(1)) {
        inbox.delete_job(&old.id, now).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::inbox::EventStatus;

    #[tokio::test]
    async fn a_job_whose_last_write_fails_is_still_running_with_its_filter_and_ends_next_time() {
        let mut filter = EventFilter::status(EventStatus::Delivered);
        filter.field = Some(("/email".into(), "carol@example.com".into()));
        let mut job = Job::new("sume", JobKind::Erase, filter.clone(), 1);
        let failed = end(&mut job, JobState::Done, 2, |_, _, _| async {
            Err(StoreError::failed("no space left on device"))
        })
        .await;
        assert!(failed.is_err());
        // As stored: running, with its values, so the runner keeps it and
        // its next pass ends it.
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.finished_ms, None);
        assert_eq!(job.filter, filter);

        let mut written = Vec::new();
        end(&mut job, JobState::Done, 3, |id, record, held_values| {
            written.push((id, record, held_values));
            async { Ok(()) }
        })
        .await
        .unwrap();
        assert_eq!((job.state, job.finished_ms), (JobState::Done, Some(3)));
        assert_eq!(job.filter, filter.without_values());
        let [(id, record, held_values)] = written.as_slice() else {
            panic!("one write: {written:?}");
        };
        assert!(held_values, "its filter held a value");
        assert_eq!(id, &job.id);
        assert_eq!(record, &job.encode());
        assert!(!String::from_utf8_lossy(record).contains("carol@"));
    }
}
