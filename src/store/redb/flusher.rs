//! Background write-back of the data file between checkpoints, and the
//! checkpoints' syncs handed over by the writer.
//!
//! Batches reach redb without a sync (the write-ahead log holds them), and
//! redb writes pages out of its write buffer into the kernel's page cache as
//! the buffer fills. Left alone, the kernel would keep those pages dirty
//! until the next checkpoint's `fsync`, which would then write them all
//! while every writer waits. This thread syncs the file every so often
//! through a handle of its own, so a checkpoint finds little left to write.
//! Extra syncs only make data durable earlier; redb's commit protocol never
//! depends on a page staying unwritten.
//!
//! It also makes the page writes and the sync of a checkpoint the writer
//! handed over ([`SyncGate`]): writes to the file wait for them at the
//! gate, while the writer goes on running and logging batches. They go
//! through a handle of their own: the kernel reports a failed write-back once per
//! open file, and a periodic sync that met it (and ignores it) must not
//! leave a checkpoint's sync on the same handle reporting success.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::faults::FaultPlan;
use super::sync_gate::{Next, SyncGate};

/// How often the file is synced in the background.
const EVERY: Duration = Duration::from_millis(200);

/// The running flusher; stopped (and joined) on drop, after it made a
/// handed-over sync still pending.
#[derive(Debug)]
pub struct Flusher {
    gate: Arc<SyncGate>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts syncing the file at `path` in the background, and making the
    /// syncs handed over at `gate` (which meet the test's `faults`).
    pub fn start(
        path: &Path,
        gate: Arc<SyncGate>,
        faults: Option<Arc<FaultPlan>>,
    ) -> std::io::Result<Self> {
        let periodic = File::open(path)?;
        // Writes the checkpoints' pages, too.
        let checkpoints = OpenOptions::new().read(true).write(true).open(path)?;
        let shared = gate.clone();
        let thread = std::thread::Builder::new()
            .name("dedupd-flusher".into())
            .spawn(move || run(&periodic, &checkpoints, &shared, faults.as_deref()))?;
        Ok(Self {
            gate,
            thread: Some(thread),
        })
    }
}

fn run(periodic: &File, checkpoints: &File, gate: &SyncGate, faults: Option<&FaultPlan>) {
    loop {
        let next = gate.next_request(EVERY);
        if next == Next::Sync {
            let started = std::time::Instant::now();
            if let Some(plan) = faults {
                plan.wait_handed_over();
            }
            let mut pages = 0;
            let made = gate
                .write_held(|offset, data| checkpoints.write_all_at(data, offset))
                .and_then(|n| {
                    pages = n;
                    match faults {
                        // The pages are in the page cache; the sync fails.
                        Some(plan) if plan.trip_handed_over() => Err(FaultPlan::disk_full()),
                        _ => checkpoints.sync_data(),
                    }
                });
            tracing::debug!(
                ms = started.elapsed().as_millis() as u64,
                pages,
                "a checkpoint's page writes and sync of the data file, made beside new writes"
            );
            if let Err(e) = &made {
                tracing::error!(error = %e, "a checkpoint's sync of the data file failed: writes answer 503 until the file is reopened");
            }
            // Writes waiting at the gate go on (or fail, and the writer
            // reopens the file).
            gate.finish(made);
        } else if next == Next::Stop {
            return;
        } else {
            // A failure here is seen again by the syncs a checkpoint relies
            // on (the writer's handle, and the other one here): this
            // thread only tries again.
            let _ = periodic.sync_data();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.gate.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
