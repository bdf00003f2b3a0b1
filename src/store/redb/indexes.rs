//! The maps the store keeps in memory beside tables keyed by row id: the
//! Redis-protocol keyspace's ([`KvIndex`]) and the claims' ([`RowIndex`]).
//! The writer changes them batch by batch with the tables, keeps or undoes
//! each batch's changes with its commit, and rebuilds them from the file
//! whenever it opens it.

use redb::Database;

use super::claim_rows;
use super::kv_index::KvIndex;
use super::row_index::RowIndex;

/// Every map in memory.
#[derive(Debug, Default)]
pub struct Indexes {
    /// The keyspace's keys.
    pub kv: KvIndex,
    /// Which row holds each claim.
    pub claims: RowIndex,
}

impl Indexes {
    /// Replaces every map with what `db` holds; `seq` is the last batch
    /// the file holds.
    pub fn rebuild(&self, db: &Database, seq: u64) -> Result<(), redb::Error> {
        self.kv.rebuild(db, seq)?;
        claim_rows::rebuild(&self.claims, db, seq)
    }

    /// Batch `seq` begins.
    pub fn begin(&self, seq: u64) {
        self.kv.begin(seq);
        self.claims.begin(seq);
    }

    /// The running batch was committed.
    pub fn keep(&self) {
        self.kv.keep();
        self.claims.keep();
    }

    /// The running batch failed: undoes it in every map. True if a read may
    /// have seen a change that is now undone.
    pub fn rollback(&self) -> bool {
        let kv = self.kv.rollback();
        let claims = self.claims.rollback();
        kv || claims
    }
}
