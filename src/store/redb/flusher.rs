//! Background write-back of the data file between checkpoints.
//!
//! Batches reach redb without a sync (the write-ahead log holds them), and
//! redb writes pages out of its write buffer into the kernel's page cache as
//! the buffer fills. Left alone, the kernel would keep those pages dirty
//! until the next checkpoint's `fsync`, which would then write them all
//! while every writer waits. This thread syncs the file every so often
//! through a handle of its own, so a checkpoint finds little left to write.
//! Extra syncs only make data durable earlier; redb's commit protocol never
//! depends on a page staying unwritten.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the file is synced in the background.
const EVERY: Duration = Duration::from_millis(200);

/// The running flusher; stopped (and joined) on drop.
#[derive(Debug)]
pub struct Flusher {
    /// Set to stop the thread.
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts syncing the file at `path` in the background.
    pub fn start(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dedupd-flusher".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(EVERY);
                    // A failure here is the writer's to see and handle at
                    // its next sync; this thread only tries again.
                    let _ = file.sync_data();
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
