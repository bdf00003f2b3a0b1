//! Applied events and stream heads: the ordering rule applied to the stored
//! rows, with their expiry index entries kept in step.

use redb::ReadableTable;

use super::Tables;
use crate::clock::Millis;
use crate::domain::{CreatedAt, ScopedKey};
use crate::store::ordering::{self, EventRecord};
use crate::store::redb::tables::{event_from_row, event_to_row, head_from_row};
use crate::store::{ApplyResult, Head};

impl Tables<'_> {
    /// See [`crate::store::Store::apply`].
    pub(super) fn apply(
        &mut self,
        stream: &ScopedKey,
        event_id: &ScopedKey,
        created_at: CreatedAt,
        retention_ms: u64,
        now: Millis,
    ) -> Result<ApplyResult, redb::Error> {
        let stored_event = self
            .events
            .open()?
            .get(event_id.as_str())?
            .map(|g| event_from_row(g.value()));
        let seen = stored_event.as_ref().is_some_and(|e| e.expires_at_ms > now);
        let stored_head = self
            .heads
            .open()?
            .get(stream.as_str())?
            .map(|g| head_from_row(g.value()));
        let live_head = stored_head
            .as_ref()
            .filter(|(_, exp)| *exp > now)
            .map(|(h, _)| h.clone());
        let decision = ordering::decide(seen, live_head.as_ref(), created_at);
        let expires_at_ms = now.saturating_add(retention_ms);
        if let Some(outcome) = decision.record {
            if let Some(old) = &stored_event {
                self.event_expiry
                    .open()?
                    .remove((old.expires_at_ms, event_id.as_str()))?;
            }
            let record = EventRecord {
                stream: stream.clone(),
                created_at,
                applied_at_ms: now,
                expires_at_ms,
                outcome,
            };
            self.events
                .open()?
                .insert(event_id.as_str(), event_to_row(&record))?;
            self.event_expiry
                .open()?
                .insert((expires_at_ms, event_id.as_str()), ())?;
        }
        let head = if decision.move_head {
            if let Some((_, old_exp)) = &stored_head {
                self.head_expiry
                    .open()?
                    .remove((*old_exp, stream.as_str()))?;
            }
            self.heads.open()?.insert(
                stream.as_str(),
                (created_at.unix_nanos(), event_id.as_str(), expires_at_ms),
            )?;
            self.head_expiry
                .open()?
                .insert((expires_at_ms, stream.as_str()), ())?;
            Some(Head {
                created_at,
                event_id: event_id.clone(),
            })
        } else {
            live_head
        };
        Ok(ApplyResult {
            outcome: decision.outcome,
            head,
        })
    }
}
