//! Taking a backup of the open data file while the writer goes on.
//!
//! 1. **Everything acknowledged is in it.** A write is acknowledged once
//!    its batch's log record is synced; the writer may hold such batches
//!    in its open transaction (`storage.commit_hold`). The snapshot asks
//!    the writer to commit them first, as every read does
//!    (`Watermark::committed_through`): one redb commit, without a sync,
//!    the only thing writes wait for.
//! 2. **Nothing that is not on disk is in it.** The read transaction may
//!    see batches committed but not yet synced; the backup waits for their
//!    sync (one at most), and is refused if the file was reopened after a
//!    disk fault meanwhile (those batches are gone).
//! 3. **The keys are those of its rows.** The key file is read as the
//!    transaction begins, with shreds held off (see `Seals::keys_for`), so
//!    a row the snapshot holds has its key; only the keys of the rows it
//!    holds are written. An event erased before the backup began is not
//!    in it, nor is its key. A bulk job's record is written opened, as
//!    the job runner wrote it (its seal's key is not in the backup).
//! 4. **Then the copy**, table by table on the caller's thread, from the
//!    read transaction (redb's MVCC: the writer never waits for it; pages
//!    it frees meanwhile are reused only once the copy ends, so the file
//!    grows by what is written during the copy). It stops at once when
//!    the server stops ([`super::Backups::stop`]: between two frames, or
//!    while a stream waits on its reader), the store is closing or meets a
//!    disk fault (the reopen waits for no backup).

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::{Database, MultimapTableHandle, ReadTransaction, ReadableDatabase, TableHandle};

use super::format::{self, FrameWriter, Header, Kind};
use super::raw::{CopyError, SEALS, TABLES, index_of};
use super::{BackupError, Turns, Written};
use crate::clock::Millis;
use crate::store::redb::engine::{Engine, Shared};
use crate::store::redb::error::EngineError;
use crate::store::redb::migrate::stored_file_id;
use crate::store::redb::seal::{self, KEY_LEN};
use crate::store::redb::tables::{
    INBOX_JOBS, JobValue, META, META_FENCE, META_SCHEMA_VERSION, META_WAL_SEQ,
};

/// A consistent view of the data file, ready to be written out.
pub struct Snapshot {
    /// Before `_db`: the transaction is dropped first.
    tx: ReadTransaction,
    /// Held for the length of the copy: a reopen or a close sees a reader.
    _db: Arc<Database>,
    /// Every key of the key file when the transaction began.
    keys: Vec<u8>,
    shared: Arc<Shared>,
    /// Whether backups were told to stop.
    turns: Arc<Turns>,
    header: Header,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// A snapshot of every write acknowledged before this call, taken at
    /// `now` (see the module doc).
    pub(in crate::store::redb) async fn snapshot(
        &self,
        now: Millis,
    ) -> Result<Snapshot, BackupError> {
        if self.shared.closing.load(Ordering::SeqCst) {
            return Err(EngineError::Closed.into());
        }
        if !self.shared.is_healthy() {
            return Err(EngineError::DiskRefused.into());
        }
        let deadline = tokio::time::Instant::now() + self.read_reopen_wait;
        let epoch = self.shared.watermark.epoch();
        let shared = self.shared.clone();
        let runtime = tokio::runtime::Handle::current();
        let taken = tokio::task::spawn_blocking(move || {
            let seals = shared.seals.clone();
            let (taken, keys) = seals.keys_for(|| {
                runtime.block_on(shared.watermark.committed_through(epoch, deadline))?;
                let db = shared.db().ok_or(EngineError::DiskRefused)?;
                let tx = db.begin_read().map_err(redb::Error::from)?;
                // Any batch the transaction sees is at or below this.
                let seen = shared.watermark.visible();
                Ok::<_, BackupError>((db, tx, seen))
            });
            let (db, tx, seen) = taken?;
            let keys = keys.map_err(BackupError::Keys)?;
            Ok::<_, BackupError>((db, tx, seen, keys, shared))
        })
        .await
        .map_err(|e| BackupError::from(EngineError::ReadTask(Arc::new(e))))?;
        let (db, tx, seen, keys, shared) = taken?;
        shared.watermark.wait(epoch, seen, deadline).await?;
        let header = header_of(&db, &tx, now)?;
        Ok(Snapshot {
            tx,
            _db: db,
            keys,
            shared,
            turns: self.backups.clone(),
            header,
        })
    }
}

/// What a backup of the snapshot `tx` of `db` says about itself.
fn header_of(db: &Database, tx: &ReadTransaction, now: Millis) -> Result<Header, BackupError> {
    let meta = tx.open_table(META).map_err(redb::Error::from)?;
    let get = |k: &str| -> Result<u64, BackupError> {
        Ok(meta
            .get(k)
            .map_err(redb::Error::from)?
            .map_or(0, |g| g.value()))
    };
    // Every table of the file is one the backup copies: one it would leave
    // out is refused, not dropped.
    let known: Vec<&str> = TABLES.iter().map(|t| t.name()).collect();
    for table in tx.list_tables().map_err(redb::Error::from)? {
        if !known.contains(&table.name()) {
            return Err(BackupError::UnknownTable(table.name().to_owned()));
        }
    }
    if let Some(table) = tx.list_multimap_tables().map_err(redb::Error::from)?.next() {
        return Err(BackupError::UnknownTable(table.name().to_owned()));
    }
    Ok(Header {
        format: format::FORMAT,
        written_by: concat!("dedupd ", env!("CARGO_PKG_VERSION")).to_owned(),
        schema: get(META_SCHEMA_VERSION)?,
        taken_at_ms: now,
        data_file: format!("{:032x}", stored_file_id(db)?),
        batch: get(META_WAL_SEQ)?,
        fence: get(META_FENCE)?,
        tables: TABLES.iter().map(|t| t.info()).collect(),
    })
}

impl Snapshot {
    /// What the backup will say about itself.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Writes the backup to `out` (blocking: call it off the async
    /// threads). Stops with an error as soon as the server stops or the
    /// store closes ([`BackupError::Closing`], whatever failed first: a
    /// write the stop broke off), the store meets a disk fault, or `out`
    /// fails.
    pub fn write_to<W: Write>(self, out: W) -> Result<(W, Written), BackupError> {
        let written = self.copy(out);
        match written {
            Err(_) if self.stopping() => Err(BackupError::Closing),
            written => written,
        }
    }

    fn copy<W: Write>(&self, out: W) -> Result<(W, Written), BackupError> {
        // A read: redb's reclaims of its buffer from this thread never wait
        // for a checkpoint's sync (nor hold its locks meanwhile).
        let _reading = crate::store::redb::guard::reading();
        let started = std::time::Instant::now();
        let mut w = FrameWriter::new(out).map_err(BackupError::Write)?;
        w.header(&self.header).map_err(BackupError::Write)?;
        let mut rows = vec![0u64; TABLES.len()];
        let mut slots = BTreeSet::new();
        let mut stopped: Option<BackupError> = None;
        let mut payload = Vec::with_capacity(format::FRAME_TARGET + 64 * 1024);
        let jobs = index_of(INBOX_JOBS.name());
        // Jobs' records left out (see `opened_job`).
        let mut unopenable = 0u64;
        for (i, table) in TABLES.iter().enumerate() {
            let index =
                u16::try_from(i).map_err(|_| BackupError::UnknownTable(table.name().into()))?;
            payload.clear();
            payload.extend_from_slice(&index.to_le_bytes());
            let copied = table.each_row(&self.tx, &mut |k, v| {
                if i == SEALS {
                    slots.insert(slot_of(v)?);
                }
                let opened = if Some(i) == jobs {
                    match self.opened_job(v) {
                        JobRow::AsStored => None,
                        JobRow::Opened(row) => Some(row),
                        JobRow::Unopenable => {
                            unopenable += 1;
                            return Ok(());
                        }
                    }
                } else {
                    None
                };
                format::push_row(&mut payload, k, opened.as_deref().unwrap_or(v))?;
                if payload.len() >= format::FRAME_TARGET {
                    w.frame(Kind::Rows, &payload)?;
                    payload.truncate(2);
                    if let Some(why) = self.interrupted() {
                        stopped = Some(why);
                        return Err(std::io::Error::other("interrupted"));
                    }
                }
                Ok(())
            });
            rows[i] = match copied {
                Ok(n) if Some(i) == jobs => n - std::mem::take(&mut unopenable),
                Ok(n) => n,
                Err(_) if stopped.is_some() => return Err(stopped.unwrap_or(BackupError::Closing)),
                Err(CopyError::Io(e)) => return Err(BackupError::Write(e)),
                Err(CopyError::Redb(e)) => return Err(e.into()),
            };
            if payload.len() > 2 {
                w.frame(Kind::Rows, &payload).map_err(BackupError::Write)?;
            }
            if i == SEALS {
                self.write_keys(&mut w, &slots)?;
            }
            if let Some(why) = self.interrupted() {
                return Err(why);
            }
        }
        let (out, end, bytes) = w
            .finish(rows, slots.len() as u64)
            .map_err(BackupError::Write)?;
        Ok((
            out,
            Written {
                header: self.header.clone(),
                end,
                bytes,
                took: started.elapsed(),
            },
        ))
    }

    /// Writes the keys of `slots` (the slots of the rows copied).
    fn write_keys<W: Write>(
        &self,
        w: &mut FrameWriter<W>,
        slots: &BTreeSet<u64>,
    ) -> Result<(), BackupError> {
        let have = (self.keys.len() / KEY_LEN) as u64;
        let mut payload = Vec::with_capacity(format::FRAME_TARGET);
        for &slot in slots {
            let key = usize::try_from(slot)
                .ok()
                .and_then(|s| self.keys.get(s * KEY_LEN..(s + 1) * KEY_LEN))
                .ok_or(BackupError::ShortKeys { slot, slots: have })?;
            payload.extend_from_slice(&slot.to_le_bytes());
            payload.extend_from_slice(key);
            if payload.len() >= format::FRAME_TARGET {
                w.frame(Kind::Keys, &payload).map_err(BackupError::Write)?;
                payload.clear();
            }
        }
        if !payload.is_empty() {
            w.frame(Kind::Keys, &payload).map_err(BackupError::Write)?;
        }
        Ok(())
    }

    /// Whether the server is stopping or the store closing.
    fn stopping(&self) -> bool {
        self.shared.closing.load(Ordering::SeqCst) || self.turns.stopping()
    }

    /// Why the copy must stop now, if it must.
    fn interrupted(&self) -> Option<BackupError> {
        if self.stopping() {
            Some(BackupError::Closing)
        } else if !self.shared.is_healthy() {
            Some(EngineError::DiskRefused.into())
        } else {
            None
        }
    }
}

/// A slot as `inbox_seals` stores it (a `u64`, little-endian).
impl Snapshot {
    /// A bulk job's stored value (its record, its cancel mark) with the
    /// record's seal opened (see `InboxRequest::PutJob`): a backup holds
    /// the keys of its events' seals only, so it holds a job's record as
    /// the job runner wrote it, as it holds the events the job reads.
    /// A record stored as it is (before schema 14) is copied so; one that
    /// does not open (its key file is not the one it was sealed with: the
    /// store does not list it either) is left out, with a warning, as no
    /// restore could read it.
    fn opened_job(&self, value: &[u8]) -> JobRow {
        let (record, cancelled) = <JobValue<'_> as redb::Value>::from_bytes(value);
        let Some((slot, _)) = seal::seal_header(record) else {
            return JobRow::AsStored;
        };
        let key = usize::try_from(slot)
            .ok()
            .and_then(|s| s.checked_mul(KEY_LEN))
            .and_then(|at| self.keys.get(at..at.checked_add(KEY_LEN)?));
        match key.map(|key| seal::open_with(record, key)) {
            Some(Ok(opened)) => JobRow::Opened(<JobValue<'_> as redb::Value>::as_bytes(&(
                opened.body.as_slice(),
                cancelled,
            ))),
            _ => {
                tracing::warn!(
                    slot,
                    "a bulk job's record does not open with its key: left out of the backup"
                );
                JobRow::Unopenable
            }
        }
    }
}

/// What a backup holds of a bulk job's stored row.
enum JobRow {
    /// The row as stored.
    AsStored,
    /// The row with its record opened.
    Opened(Vec<u8>),
    /// Nothing.
    Unopenable,
}

fn slot_of(value: &[u8]) -> std::io::Result<u64> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| std::io::Error::other("a key slot that is not 8 bytes"))?;
    Ok(u64::from_le_bytes(bytes))
}
