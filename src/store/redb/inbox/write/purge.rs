//! The inbox's deletions, for the reaper: settled events past their
//! retention (each leaves a dedupe record while its window lasts), dedupe
//! records past their window, and pending events of sources removed from
//! the configuration. Each reads only the index entries that are due.

use redb::ReadableTable;

use super::InboxTables;
use crate::clock::Millis;
use crate::store::inbox::EventStatus;

impl InboxTables<'_> {
    /// Deletes up to `limit` settled events whose retention passed. Each
    /// received less than `dedupe_window_ms` ago leaves a dedupe record
    /// until then (0: none does).
    pub fn purge(
        &mut self,
        now: Millis,
        limit: u64,
        dedupe_window_ms: u64,
    ) -> Result<u64, redb::Error> {
        let due: Vec<(u64, String, String)> = self
            .expiry
            .open()?
            .range(..(now.saturating_add(1), "", ""))?
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|e| {
                e.map(|(k, _)| {
                    let (at, s, id) = k.value();
                    (at, s.to_owned(), id.to_owned())
                })
            })
            .collect::<Result<_, _>>()?;
        for (at, source, id) in &due {
            self.expiry
                .open()?
                .remove((*at, source.as_str(), id.as_str()))?;
            if let Some(e) = self.load(source, id)?
                && e.status != EventStatus::Pending
                && e.expires_at_ms == *at
            {
                self.unindex_status((
                    source.as_str(),
                    e.status.to_byte(),
                    e.received_at_ms,
                    id.as_str(),
                ))?;
                self.delete(source, id)?;
                let until = e.received_at_ms.saturating_add(dedupe_window_ms);
                if until > now {
                    self.remember(source, id, until)?;
                }
            }
        }
        Ok(due.len() as u64)
    }

    /// Writes the dedupe record of a reaped event, valid until `until`.
    fn remember(&mut self, source: &str, id: &str, until: Millis) -> Result<(), redb::Error> {
        // A record never outlives its row's deletion, so there is none to
        // replace; should a file hold one anyway, its index entry goes.
        let old = self
            .dedupe
            .open()?
            .insert((source, id), until)?
            .map(|g| g.value());
        if let Some(old) = old.filter(|old| *old != until) {
            self.dedupe_expiry.open()?.remove((old, source, id))?;
        }
        self.dedupe_expiry.open()?.insert((until, source, id), ())?;
        Ok(())
    }

    /// Deletes up to `limit` dedupe records whose window passed, in expiry
    /// order, reading only due index entries.
    pub fn purge_dedupe(&mut self, now: Millis, limit: u64) -> Result<u64, redb::Error> {
        if limit == 0 {
            return Ok(0);
        }
        let mut due: Vec<(u64, String, String)> = Vec::new();
        {
            let index = self.dedupe_expiry.open()?;
            let mut taken =
                index.extract_from_if(..(now.saturating_add(1), "", ""), |_, _| true)?;
            for entry in taken
                .by_ref()
                .take(usize::try_from(limit).unwrap_or(usize::MAX))
            {
                let (k, _) = entry?;
                let (at, s, id) = k.value();
                due.push((at, s.to_owned(), id.to_owned()));
            }
            taken.close()?;
        }
        let records = self.dedupe.open()?;
        for (at, source, id) in &due {
            let key = (source.as_str(), id.as_str());
            // An index entry is never trusted over its record.
            let rewritten = match records.remove(key)? {
                Some(g) if g.value() != *at => Some(g.value()),
                _ => None,
            };
            if let Some(until) = rewritten {
                records.insert(key, until)?;
            }
        }
        Ok(due.len() as u64)
    }

    /// Deletes up to `limit` pending events of `source` received before
    /// `before`: the events of a source that left the configuration, once
    /// they are older than the dead-event retention. Returns how many.
    pub fn purge_pending(
        &mut self,
        source: &str,
        before: Millis,
        limit: u64,
    ) -> Result<u64, redb::Error> {
        let pending = EventStatus::Pending.to_byte();
        let ids: Vec<(u64, String)> = self
            .status
            .open()?
            .range((source, pending, 0u64, "")..(source, pending, before, ""))?
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|e| {
                e.map(|(k, _)| {
                    let (_, _, at, id) = k.value();
                    (at, id.to_owned())
                })
            })
            .collect::<Result<_, _>>()?;
        for (at, id) in &ids {
            self.unindex_status((source, pending, *at, id.as_str()))?;
            if let Some(e) = self.load(source, id)? {
                self.dequeue(&e)?;
                self.delete(source, id)?;
            }
        }
        Ok(ids.len() as u64)
    }

    /// Whether expired settled events or dedupe records remain at `now`.
    pub fn has_due_expiry(&mut self, now: Millis) -> Result<bool, redb::Error> {
        Ok(self
            .expiry
            .open()?
            .first()?
            .is_some_and(|(k, _)| k.value().0 <= now)
            || self
                .dedupe_expiry
                .open()?
                .first()?
                .is_some_and(|(k, _)| k.value().0 <= now))
    }
}
