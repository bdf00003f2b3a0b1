//! Inbox events counted by source and status, kept in memory so a metrics
//! scrape reads them without scanning the inbox.
//!
//! Invariant: the counts equal the entries of the status index in the
//! committed file. They are taken by one scan when the file is opened
//! (after the log's replay) and again whenever the writer reopens it; in
//! between, each committed transaction adds the changes it made to the
//! index ([`StatusDeltas`]), and a transaction that fails adds nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use redb::{ReadTransaction, ReadableDatabase, ReadableTable};

use super::tables::INBOX_STATUS;
use crate::store::inbox::EventStatus;

/// Changes one transaction made to the count of each (source, status byte).
#[derive(Debug, Default)]
pub struct StatusDeltas(HashMap<(String, u8), i64>);

impl StatusDeltas {
    /// Records that `by` entries of `source` at `status` appeared (or went).
    pub fn add(&mut self, source: &str, status: u8, by: i64) {
        match self.0.get_mut(&(source.to_owned(), status)) {
            Some(n) => *n += by,
            None => {
                self.0.insert((source.to_owned(), status), by);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.values().all(|n| *n == 0)
    }
}

/// Events per source, indexed by [`EventStatus::to_byte`].
pub type Counts = [u64; 6];

/// The counts of the open file.
#[derive(Debug, Default)]
pub struct StatusCounts(Mutex<BTreeMap<String, Counts>>);

impl StatusCounts {
    /// Counts the status index of `db` from scratch.
    pub fn recount(&self, db: &redb::Database) -> Result<(), redb::Error> {
        let fresh = count(&db.begin_read()?)?;
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// Adds a committed transaction's changes.
    pub fn apply(&self, deltas: StatusDeltas) {
        if deltas.is_empty() {
            return;
        }
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for ((source, status), by) in deltas.0 {
            let entry = counts.entry(source).or_default();
            let slot = &mut entry[usize::from(EventStatus::from_byte(status).to_byte())];
            *slot = slot.saturating_add_signed(by);
        }
        counts.retain(|_, c| c.iter().any(|n| *n > 0));
    }

    /// Every source with events, and its counts.
    pub fn snapshot(&self) -> Vec<(String, Counts)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(s, c)| (s.clone(), *c))
            .collect()
    }
}

/// One pass over the status index.
fn count(tx: &ReadTransaction) -> Result<BTreeMap<String, Counts>, redb::Error> {
    let mut out: BTreeMap<String, Counts> = BTreeMap::new();
    for entry in tx.open_table(INBOX_STATUS)?.iter()? {
        let (k, _) = entry?;
        let (source, status, _, _) = k.value();
        let status = EventStatus::from_byte(status).to_byte();
        match out.get_mut(source) {
            Some(c) => c[usize::from(status)] += 1,
            None => {
                let mut c = Counts::default();
                c[usize::from(status)] = 1;
                out.insert(source.to_owned(), c);
            }
        }
    }
    Ok(out)
}
