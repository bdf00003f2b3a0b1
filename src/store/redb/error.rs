//! Why the engine could not do what it was asked, with the cause kept.
//!
//! Each variant's message is what it means (its cause is its
//! [`source`](std::error::Error::source)); the handles hand it out as the
//! cause of a [`StoreError`], whose variant says whether a retry may work.

use std::sync::Arc;

use crate::store::StoreError;

/// Why a read or a write of the data file did not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The store was closed (or its writer stopped).
    #[error("the store is shut down")]
    Closed,
    /// The data file cannot commit now (disk full or failing): the write
    /// was refused, or failed and did not take effect. The writer reopens
    /// the file until a commit succeeds again.
    #[error("the data file cannot be written now (disk full or failing); nothing was changed")]
    DiskRefused,
    /// A read met a disk fault, and the file was not reopened in time.
    #[error("the data file cannot be read now")]
    DiskRead(#[source] Arc<redb::Error>),
    /// The file was reopened after a disk fault while a read ran: what it
    /// saw may be gone.
    #[error("the data file was reopened after a disk fault while this was read; retry")]
    Reopened,
    /// A keyspace read kept finding a row whose batch was not committed.
    #[error("a value being written was not committed in time; retry")]
    NotCommitted,
    /// The blocking task of a read panicked or was cancelled.
    #[error("read task failed")]
    ReadTask(#[source] Arc<tokio::task::JoinError>),
    /// redb failed, not because of the disk: nothing took effect.
    #[error(transparent)]
    Redb(Arc<redb::Error>),
    /// Free disk space is below the watermark: the write was refused
    /// before it ran (see `space`).
    #[error("disk space low: {free} bytes free, below storage.min_free_bytes ({floor})")]
    LowSpace {
        /// Bytes free.
        free: u64,
        /// The watermark.
        floor: u64,
    },
    /// The in-memory index's keys take `storage.max_key_memory_bytes`: a
    /// client's write that would add one was refused before it ran.
    #[error("keys in memory take about {held} bytes, at storage.max_key_memory_bytes ({cap})")]
    KeysFull {
        /// Bytes they take, estimated.
        held: u64,
        /// The cap.
        cap: u64,
    },
    /// The key file (see `seal`) cannot be written now: a new event could
    /// not be sealed (nothing was stored), or an erased event's key could
    /// not be shredded yet (the erasure is stored; asking again shreds it).
    #[error("the key file cannot be written now (disk full or failing)")]
    Keys(#[source] Arc<std::io::Error>),
    /// The writer answered a request with the answer of another kind (a
    /// bug): `.0` names the request.
    #[error("writer answered {0} with another kind of response")]
    Unexpected(&'static str),
}

impl EngineError {
    /// Whether a retry may work: the error is the disk's or the moment's,
    /// not the request's.
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Closed
            | EngineError::DiskRefused
            | EngineError::DiskRead(_)
            | EngineError::Reopened
            | EngineError::NotCommitted
            | EngineError::LowSpace { .. }
            | EngineError::KeysFull { .. }
            | EngineError::Keys(_) => true,
            EngineError::ReadTask(_) | EngineError::Redb(_) | EngineError::Unexpected(_) => false,
        }
    }
}

impl From<redb::Error> for EngineError {
    fn from(e: redb::Error) -> Self {
        EngineError::Redb(Arc::new(e))
    }
}

impl From<EngineError> for StoreError {
    fn from(e: EngineError) -> Self {
        if let EngineError::LowSpace { free, floor } = e {
            return StoreError::LowSpace { free, floor };
        }
        if let EngineError::KeysFull { held, cap } = e {
            return StoreError::KeysFull { held, cap };
        }
        if e.is_transient() {
            StoreError::Unavailable(Arc::new(e))
        } else {
            StoreError::Failed(Arc::new(e))
        }
    }
}

/// Whether a redb error means the disk refused (full, failing), so the
/// operation may work later: answered as `Unavailable`, and the file is
/// reopened.
pub(crate) fn is_disk_fault(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn disk_full() -> redb::Error {
        redb::Error::Io(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "no space left on device",
        ))
    }

    #[test]
    fn a_store_error_keeps_the_engine_error_and_the_disk_fault_behind_it() {
        let e = StoreError::from(EngineError::DiskRead(Arc::new(disk_full())));
        assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
        assert_eq!(e.to_string(), "store unavailable");
        let engine = e.source().and_then(|s| s.downcast_ref::<EngineError>());
        assert!(matches!(engine, Some(EngineError::DiskRead(_))), "{e:?}");
        let redb = engine.and_then(|e| e.source()).map(ToString::to_string);
        assert_eq!(redb, Some(disk_full().to_string()));
        assert_eq!(
            e.chain().to_string(),
            format!(
                "store unavailable: the data file cannot be read now: {}",
                disk_full()
            )
        );
    }

    /// The words of the releases before (RESP clients and an event's
    /// `last_error` show them).
    #[test]
    fn each_error_reads_as_it_did_before_causes_were_kept() {
        let cases = [
            (
                EngineError::Closed,
                "store unavailable: the store is shut down",
            ),
            (
                EngineError::DiskRefused,
                "store unavailable: the data file cannot be written now (disk full or \
                 failing); nothing was changed",
            ),
            (
                EngineError::Reopened,
                "store unavailable: the data file was reopened after a disk fault while this \
                 was read; retry",
            ),
            (
                EngineError::NotCommitted,
                "store unavailable: a value being written was not committed in time; retry",
            ),
            (
                EngineError::from(redb::Error::Corrupted("a page".into())),
                "storage failure: DB corrupted: a page",
            ),
            (
                EngineError::Unexpected("claim"),
                "storage failure: writer answered claim with another kind of response",
            ),
        ];
        for (engine, text) in cases {
            assert_eq!(StoreError::from(engine).chain().to_string(), text);
        }
    }
}
