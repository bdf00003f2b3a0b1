//! The reaper's deletions: expired rows of every table, in expiry order,
//! reading only the index entries that are due.

use redb::{ReadableTable, Table, Value};

use super::Tables;
use crate::clock::Millis;
use crate::store::PurgeReport;

impl Tables<'_> {
    /// Deletes up to `limit` expired rows, claims first (then applied
    /// events, stream heads, keyspace keys, settled inbox events, dedupe
    /// records of reaped inbox events), each table in expiry order. Reads
    /// only index entries that are due. An inbox event received less than
    /// `dedupe_window_ms` ago leaves a dedupe record (written, not counted:
    /// at most one per event deleted).
    pub(super) fn purge(
        &mut self,
        now: Millis,
        limit: u64,
        dedupe_window_ms: u64,
    ) -> Result<PurgeReport, redb::Error> {
        let mut report = PurgeReport::default();
        let mut budget = limit;
        report.claims = self.claims.purge(now, budget)?;
        budget -= report.claims;
        let events = self.events.open()?;
        report.events = purge_table(self.event_expiry.open()?, now, budget, |k, at| {
            remove_expiring(events, k, at, |r| r.3)
        })?;
        budget -= report.events;
        let heads = self.heads.open()?;
        report.heads = purge_table(self.head_expiry.open()?, now, budget, |k, at| {
            remove_expiring(heads, k, at, |r| r.2)
        })?;
        budget -= report.heads;
        report.kv = self.kv.purge(now, budget)?;
        budget -= report.kv;
        report.inbox = self.inbox.purge(now, budget, dedupe_window_ms)?;
        budget -= report.inbox;
        report.dedupe = self.inbox.purge_dedupe(now, budget)?;
        let mut more =
            self.inbox.has_due_expiry(now)? || self.kv.has_due(now)? || self.claims.has_due(now)?;
        for index in [&mut self.event_expiry, &mut self.head_expiry] {
            more |= index
                .open()?
                .first()?
                .is_some_and(|(k, _)| k.value().0 <= now);
        }
        report.more = more;
        Ok(report)
    }
}

/// Removes up to `limit` due entries of one expiry index, calling `remove_row`
/// for each so the indexed row goes too.
///
/// The due entries are the index's first ones (it sorts by expiry): one
/// cursor pass takes them off. Their rows then go in key order, so walks to
/// neighbouring keys share the upper pages of the table.
fn purge_table(
    index: &mut Table<'_, (u64, &'static str), ()>,
    now: Millis,
    limit: u64,
    mut remove_row: impl FnMut(&str, Millis) -> Result<(), redb::Error>,
) -> Result<u64, redb::Error> {
    if limit == 0 {
        return Ok(0);
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut due: Vec<(String, u64)> = Vec::new();
    let mut taken = index.extract_from_if(..(now.saturating_add(1), ""), |_, _| true)?;
    for entry in taken.by_ref().take(limit) {
        let (k, _) = entry?;
        let (at, key) = k.value();
        due.push((key.to_owned(), at));
    }
    taken.close()?;
    due.sort_unstable();
    for (key, at) in &due {
        remove_row(key, *at)?;
    }
    Ok(due.len() as u64)
}

/// Removes `key`'s row if it still expires at `at`: an index entry is never
/// trusted over its row. One walk of the table: the row is taken out, and
/// put back in the rare case that it was rewritten with another expiry.
fn remove_expiring<V: Value + 'static>(
    table: &mut Table<'_, &'static str, V>,
    key: &str,
    at: Millis,
    expires_at: impl for<'a> Fn(V::SelfType<'a>) -> u64,
) -> Result<(), redb::Error> {
    let rewritten = match table.remove(key)? {
        Some(old) if expires_at(old.value()) != at => {
            Some(V::as_bytes(&old.value()).as_ref().to_vec())
        }
        _ => None,
    };
    if let Some(bytes) = rewritten {
        table.insert(key, V::from_bytes(&bytes))?;
    }
    Ok(())
}
