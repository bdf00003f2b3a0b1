//! The file's schema: creating the tables of a new file, checking an old
//! one's version, and migrating older versions in place (each in the same
//! transaction as its version bump, so a crash leaves the old version).

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableHandle};

use super::OpenError;
use super::tables::{
    self, CLAIM_ROW_EXPIRY, CLAIM_ROWS, EVENT_EXPIRY, HEAD_EXPIRY, HEADS, META, META_FILE_ID,
    META_KV_NEXT_ID, META_SCHEMA_VERSION, SCHEMA_VERSION,
};

/// The data file's id, and whether it had one before this open (a file of
/// a build before logs were bound gets one now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    /// The id its log must carry.
    pub id: u128,
    /// It was there before this open.
    pub bound: bool,
}

/// Reads the file's id, giving it one if it has none.
fn file_id(meta: &mut redb::Table<&str, u64>) -> Result<FileId, redb::Error> {
    let [hi, lo] = META_FILE_ID;
    let stored = (
        meta.get(hi)?.map(|g| g.value()),
        meta.get(lo)?.map(|g| g.value()),
    );
    if let (Some(hi), Some(lo)) = stored {
        return Ok(FileId {
            id: u128::from(hi) << 64 | u128::from(lo),
            bound: true,
        });
    }
    let id: u128 = rand::random();
    meta.insert(hi, (id >> 64) as u64)?;
    meta.insert(lo, id as u64)?;
    Ok(FileId { id, bound: false })
}

/// The id of an open file (it has one once [`init_schema`] ran).
pub(super) fn stored_file_id(db: &Database) -> Result<u128, redb::Error> {
    let tx = db.begin_read()?;
    let meta = tx.open_table(META)?;
    let [hi, lo] = META_FILE_ID;
    let half = |k| -> Result<u64, redb::Error> {
        meta.get(k)?
            .map(|g| g.value())
            .ok_or_else(|| redb::Error::Corrupted("the data file has no id".into()))
    };
    Ok(u128::from(half(hi)?) << 64 | u128::from(half(lo)?))
}

/// Refuses a file a newer release wrote before it is opened for writing:
/// redb changes a file it opened for writing even when nothing is written
/// (it keeps its allocator state at close), and the newer release must
/// find its file byte for byte as it left it. A file that cannot be opened
/// read-only (not closed cleanly, or open elsewhere) goes on to the usual
/// open, which says what is wrong with it (and checks the version again).
/// A file a crash left cannot be opened read-only: redb must repair it
/// first, and a repair writes. Its schema is read through an
/// [`Overlay`](super::overlay::Overlay), the repair kept in memory, so a
/// newer release's file is refused unchanged after a crash too (the
/// repair is made twice when the file is ours: once in memory, then by
/// the open).
pub(super) fn refuse_newer(path: &Path) -> Result<(), OpenError> {
    let schema = match redb::ReadOnlyDatabase::open(path) {
        Ok(db) => stored_schema(&db),
        Err(redb::DatabaseError::RepairAborted) => {
            let Some(db) = std::fs::File::open(path)
                .ok()
                .and_then(|file| super::overlay::Overlay::new(file).ok())
                .and_then(|overlay| redb::Builder::new().create_with_backend(overlay).ok())
            else {
                return Ok(());
            };
            stored_schema(&db)
        }
        Err(_) => return Ok(()),
    };
    match schema {
        Ok(Some(found)) if found > SCHEMA_VERSION => Err(OpenError::UnknownSchema {
            path: path.to_owned(),
            found,
        }),
        _ => Ok(()),
    }
}

/// The schema version a file records, read without writing: none in a new
/// file (or a foreign one).
fn stored_schema(db: &impl redb::ReadableDatabase) -> Result<Option<u64>, redb::Error> {
    let tx = db.begin_read()?;
    let meta = match tx.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(meta.get(META_SCHEMA_VERSION)?.map(|g| g.value()))
}

/// Creates the tables of a new file, or checks the schema of an old one;
/// returns the file's id.
pub(super) fn init_schema(db: &Database, path: &Path) -> Result<FileId, OpenError> {
    let other = |e: redb::Error| OpenError::Other {
        path: path.to_owned(),
        source: e,
    };
    // A newer schema is refused before any write: a write transaction,
    // even one dropped unfinished, grows the file, and the newer release
    // must find it as it left it.
    if let Some(found) = stored_schema(db).map_err(other)?
        && found > SCHEMA_VERSION
    {
        return Err(OpenError::UnknownSchema {
            path: path.to_owned(),
            found,
        });
    }
    let tx = db.begin_write().map_err(|e| other(e.into()))?;
    let id;
    {
        let has_tables = tx
            .list_tables()
            .map_err(|e| other(e.into()))?
            .next()
            .is_some();
        let mut meta = tx.open_table(META).map_err(|e| other(e.into()))?;
        let version = meta
            .get(META_SCHEMA_VERSION)
            .map_err(|e| other(e.into()))?
            .map(|g| g.value());
        match version {
            Some(SCHEMA_VERSION) => {}
            // Version 3 adds the write-ahead log beside the file (a version
            // 2 file has none), version 4 the keyspace tables (created
            // below), version 5 the inbox body table, version 6 keys the
            // keyspace's rows by row id, version 7 adds the dedupe records
            // of reaped inbox events, version 8 the attempt timelines,
            // version 9 the replay marks and bulk jobs, and the erased
            // status (their tables are created below; a file without them
            // simply has none; an older build must not read an erased
            // row, which has no body), version 10 keys the claims' rows
            // by row id. Version 11 changes no table: its log is two
            // files (`.wal` and `.wal2`), and a build of version 10 or
            // before, which reads only the first, must refuse the file
            // rather than replay half of its log. Logged requests keep
            // their encoding, so an older log replays. Version 12 seals
            // each new inbox row's headers and body (table `inbox_seals`,
            // created below; the keys in `dedupd.redb.keys`): a build of
            // version 11 or before would deliver a seal as the body.
            // Version 13 changes no table: a done record may keep a result
            // (its claim value's state byte 2), which a build of version 12
            // or before would read as done without it, silently. Version
            // 14 changes no table: a bulk job's record may be a seal, which
            // a build of version 13 or before would not read, and whose
            // key its open would shred (it keeps the slots of inbox rows
            // only): the job gone, silently.
            Some(old @ 1..=13) => {
                if old == 1 {
                    migrate_v1(&tx).map_err(other)?;
                }
                if old <= 6 {
                    split_bodies(&tx).map_err(other)?;
                    keyspace_by_row_id(&tx).map_err(other)?;
                }
                drop(meta);
                if old <= 9 {
                    claims_by_row_id(&tx).map_err(other)?;
                }
                meta = tx.open_table(META).map_err(|e| other(e.into()))?;
                meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)
                    .map_err(|e| other(e.into()))?;
            }
            Some(found) => {
                return Err(OpenError::UnknownSchema {
                    path: path.to_owned(),
                    found,
                });
            }
            None if has_tables => return Err(OpenError::Foreign(path.to_owned())),
            None => {
                meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)
                    .map_err(|e| other(e.into()))?;
            }
        }
        id = file_id(&mut meta).map_err(other)?;
        // Create every table now, so readers never meet a missing one.
        tx.open_table(CLAIM_ROWS).map_err(|e| other(e.into()))?;
        tx.open_table(CLAIM_ROW_EXPIRY)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::EVENTS).map_err(|e| other(e.into()))?;
        tx.open_table(EVENT_EXPIRY).map_err(|e| other(e.into()))?;
        tx.open_table(HEADS).map_err(|e| other(e.into()))?;
        tx.open_table(HEAD_EXPIRY).map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX).map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_BODIES)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_DUE)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_QUEUE)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_STATUS)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_EXPIRY)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_DEDUPE)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_ATTEMPTS)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_DEDUPE_EXPIRY)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_REPLAY)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_JOBS)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::INBOX_SEALS)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::KV_ROWS)
            .map_err(|e| other(e.into()))?;
        tx.open_table(tables::KV_ROW_EXPIRY)
            .map_err(|e| other(e.into()))?;
    }
    tx.commit().map_err(|e| other(e.into()))?;
    Ok(id)
}

/// Schema 1 → 2: the runnable index is keyed by source first. Its entries
/// move to the new table; every other table is unchanged.
fn migrate_v1(tx: &redb::WriteTransaction) -> Result<(), redb::Error> {
    // The first releases of schema 1 stored inbox rows without the lease
    // generation; later ones added it without a version bump. Both are
    // version 1: tell them apart by the table's stored type.
    match tx.open_table(tables::INBOX_V4) {
        Ok(_) => {}
        Err(redb::TableError::TableTypeMismatch { .. }) => add_lease_generation(tx)?,
        Err(e) => return Err(e.into()),
    }
    {
        let old = tx.open_table(tables::INBOX_DUE_V1)?;
        let mut new = tx.open_table(tables::INBOX_DUE)?;
        for entry in old.iter()? {
            let (k, _) = entry?;
            let (at, source, id) = k.value();
            new.insert((source, at, id), ())?;
        }
    }
    tx.delete_table(tables::INBOX_DUE_V1)?;
    tracing::info!("data file migrated from schema version 1 to 2");
    Ok(())
}

/// Rewrites inbox rows of the earliest schema 1 format (no lease
/// generation) with generation 0.
fn add_lease_generation(tx: &redb::WriteTransaction) -> Result<(), redb::Error> {
    type Key = (String, String);
    type Old = (
        u8,
        u64,
        i128,
        Option<String>,
        u32,
        u64,
        Option<String>,
        bool,
        String,
        Vec<u8>,
        u64,
    );
    let rows: Vec<(Key, Old)> = {
        let old = tx.open_table(tables::INBOX_NO_LEASE)?;
        old.iter()?
            .map(|e| {
                e.map(|(k, v)| {
                    let (s, id) = k.value();
                    let (a, b, c, d, e, f, g, h, i, j, k) = v.value();
                    (
                        (s.to_owned(), id.to_owned()),
                        (
                            a,
                            b,
                            c,
                            d.map(str::to_owned),
                            e,
                            f,
                            g.map(str::to_owned),
                            h,
                            i.to_owned(),
                            j.to_vec(),
                            k,
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()?
    };
    tx.delete_table(tables::INBOX_NO_LEASE)?;
    let mut new = tx.open_table(tables::INBOX_V4)?;
    for ((s, id), (a, b, c, d, e, f, g, h, i, j, k)) in &rows {
        new.insert(
            (s.as_str(), id.as_str()),
            (
                *a,
                *b,
                *c,
                d.as_deref(),
                *e,
                *f,
                g.as_deref(),
                *h,
                i.as_str(),
                j.as_slice(),
                *k,
                0u64,
            ),
        )?;
    }
    tracing::info!(rows = rows.len(), "inbox rows given a lease generation");
    Ok(())
}

/// Schema 4 → 5: each inbox row's body moves to the body table, so a
/// delivery attempt rewrites a small row instead of the body.
/// Done in one transaction with the version bump: a crash leaves the file
/// at version 4, and the next open migrates it again.
fn split_bodies(tx: &redb::WriteTransaction) -> Result<(), redb::Error> {
    if !tx
        .list_tables()?
        .any(|t| t.name() == tables::INBOX_V4.name())
    {
        return Ok(());
    }
    let mut moved = 0usize;
    {
        let old = tx.open_table(tables::INBOX_V4)?;
        let mut rows = tx.open_table(tables::INBOX)?;
        let mut bodies = tx.open_table(tables::INBOX_BODIES)?;
        for entry in old.iter()? {
            let (k, v) = entry?;
            let (source, id) = k.value();
            let (
                status,
                received,
                created,
                stream,
                attempts,
                due,
                error,
                force,
                headers,
                body,
                expires,
                lease,
            ) = v.value();
            let row = tables::InboxRow {
                status,
                received_at_ms: received,
                created_at_ns: created,
                stream,
                attempts,
                due_at_ms: due,
                last_error: error,
                force,
                headers,
                expires_at_ms: expires,
                lease,
                body_bytes: body.len() as u64,
            };
            rows.insert((source, id), row)?;
            bodies.insert((source, id), body)?;
            moved += 1;
        }
    }
    tx.delete_table(tables::INBOX_V4)?;
    if moved > 0 {
        tracing::info!(
            events = moved,
            "inbox bodies moved to their own table (schema 5)"
        );
    }
    Ok(())
}

/// Schema 5 → 6: the keyspace's rows move from a table keyed by the key to
/// one keyed by row id (handed out in key order here), with their expiry
/// index. Done in the transaction of the version bump, like the others.
fn keyspace_by_row_id(tx: &redb::WriteTransaction) -> Result<(), redb::Error> {
    if !tx.list_tables()?.any(|t| t.name() == tables::KV_V5.name()) {
        return Ok(());
    }
    let mut moved = 0u64;
    {
        let old = tx.open_table(tables::KV_V5)?;
        let mut rows = tx.open_table(tables::KV_ROWS)?;
        let mut expiry = tx.open_table(tables::KV_ROW_EXPIRY)?;
        for entry in old.iter()? {
            let (k, v) = entry?;
            let (value, expires) = v.value();
            moved += 1;
            rows.insert(moved, (k.value(), value, expires))?;
            if let Some(at) = expires {
                expiry.insert((at, moved), ())?;
            }
        }
    }
    tx.delete_table(tables::KV_V5)?;
    tx.delete_table(tables::KV_EXPIRY_V5)?;
    if moved > 0 {
        tracing::info!(keys = moved, "keyspace rows keyed by row id (schema 6)");
    }
    Ok(())
}

/// Schema 9 → 10: the claims move from a table keyed by the key to one
/// keyed by row id (handed out in key order here, after the keyspace's
/// ids: both draw from one counter), with their expiry index. Done in the
/// transaction of the version bump, like the others.
fn claims_by_row_id(tx: &redb::WriteTransaction) -> Result<(), redb::Error> {
    if !tx
        .list_tables()?
        .any(|t| t.name() == tables::CLAIMS_V9.name())
    {
        return Ok(());
    }
    let mut meta = tx.open_table(META)?;
    let after_kv = tx
        .open_table(tables::KV_ROWS)?
        .last()?
        .map_or(1, |(id, _)| id.value() + 1);
    let stored = meta.get(META_KV_NEXT_ID)?.map_or(1, |g| g.value());
    let mut next = after_kv.max(stored);
    let mut moved = 0u64;
    {
        let old = tx.open_table(tables::CLAIMS_V9)?;
        let mut rows = tx.open_table(CLAIM_ROWS)?;
        let mut expiry = tx.open_table(CLAIM_ROW_EXPIRY)?;
        for entry in old.iter()? {
            let (k, v) = entry?;
            let record = tables::claim_from_row(v.value());
            let value = tables::claim_value(&record);
            rows.insert(
                next,
                (
                    k.value().as_bytes(),
                    value.as_slice(),
                    Some(record.expires_at_ms),
                ),
            )?;
            expiry.insert((record.expires_at_ms, next), ())?;
            next += 1;
            moved += 1;
        }
    }
    meta.insert(META_KV_NEXT_ID, next)?;
    drop(meta);
    tx.delete_table(tables::CLAIMS_V9)?;
    tx.delete_table(tables::CLAIM_EXPIRY_V9)?;
    if moved > 0 {
        tracing::info!(claims = moved, "claims keyed by row id (schema 10)");
    }
    Ok(())
}
