//! The file's durable state against the log: checkpoints (a durable commit
//! recording the last batch the file holds) and the replay of the logged
//! batches after it, when the file is opened and when the writer reopens
//! it after a disk fault.

use redb::{Database, Durability, ReadableDatabase};

use super::batch::apply;
use crate::store::redb::kv_index::KvIndex;
use crate::store::redb::record::Batch;
use crate::store::redb::tables::{META, META_LOG_OPEN, META_LOG_SEGMENTS, META_WAL_SEQ};

/// A durable commit recording that the file holds every batch up to `seq`,
/// and whether its log may hold more (`open`: anything but the clean
/// shutdown's last checkpoint, after which nothing more is logged).
pub fn checkpoint(db: &Database, seq: u64, open: bool) -> Result<(), redb::Error> {
    let mut tx = db.begin_write()?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
    {
        let mut meta = tx.open_table(META)?;
        meta.insert(META_WAL_SEQ, seq)?;
        meta.insert(META_LOG_OPEN, u64::from(open))?;
        meta.insert(META_LOG_SEGMENTS, 2)?;
    }
    tx.commit()?;
    Ok(())
}

/// Whether the file was left open with its log (see
/// [`META_LOG_OPEN`]): not closed cleanly.
pub fn log_open(db: &Database) -> Result<bool, redb::Error> {
    let tx = db.begin_read()?;
    let meta = tx.open_table(META)?;
    Ok(meta.get(META_LOG_OPEN)?.is_some_and(|g| g.value() != 0))
}

/// How many segments the file's log is kept in (see
/// [`META_LOG_SEGMENTS`]): 1 for a file a build with one log file wrote.
pub fn log_segments(db: &Database) -> Result<u64, redb::Error> {
    let tx = db.begin_read()?;
    let meta = tx.open_table(META)?;
    Ok(meta.get(META_LOG_SEGMENTS)?.map_or(1, |g| g.value()))
}

/// The last write-ahead-log batch the file holds.
pub fn stored_seq(db: &Database) -> Result<u64, redb::Error> {
    let tx = db.begin_read()?;
    let meta = tx.open_table(META)?;
    Ok(meta.get(META_WAL_SEQ)?.map_or(0, |g| g.value()))
}

/// Builds the keyspace index `kv` from the file, then applies the logged
/// batches the file does not hold yet (those after its `wal_seq`), in
/// order, each as it ran; then a checkpoint makes them durable. Returns
/// the sequence number of the last batch.
pub fn replay(db: &Database, kv: &KvIndex, batches: Vec<Batch>) -> Result<u64, redb::Error> {
    replay_up_to(db, kv, batches, u64::MAX)
}

/// [`replay`], leaving out batches after `last` (ones that were refused).
pub(super) fn replay_up_to(
    db: &Database,
    kv: &KvIndex,
    batches: Vec<Batch>,
    last: u64,
) -> Result<u64, redb::Error> {
    let mut seq = stored_seq(db)?;
    kv.rebuild(db, seq)?;
    let mut replayed = 0usize;
    let durable = seq;
    for batch in batches
        .into_iter()
        .filter(|b| b.seq > durable && b.seq <= last)
    {
        let mut tx = db.begin_write()?;
        tx.set_durability(Durability::None)
            .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
        // The counts are taken once the file is ready.
        let _ = apply(&tx, kv, batch.seq, &batch.ops)?;
        tx.commit()?;
        kv.keep();
        seq = batch.seq;
        replayed += 1;
    }
    // From here on the log may hold batches the file does not.
    checkpoint(db, seq, true)?;
    if replayed > 0 {
        tracing::info!(batches = replayed, "replayed the write-ahead log");
    }
    Ok(seq)
}
