//! An inbox row and the event it holds: the row's fields from the event,
//! and the event (its body read from its own table) from the row.

use redb::{ReadOnlyTable, ReadTransaction, ReadableTable};

use crate::domain::CreatedAt;
use crate::store::inbox::{Attempt, EventStatus, InboxEvent};
use crate::store::redb::seal::{self, OpenSealError, Seals};

/// How the error of a sealed body that does not open begins.
pub(super) const SEAL_CLOSED: &str = "a sealed body does not open";
use crate::store::redb::tables::{AttemptRow, INBOX_BODIES, INBOX_SEALS, InboxRow};

/// Encodes an event's row (`headers`: its headers as JSON).
pub(super) fn to_row<'a>(e: &'a InboxEvent, headers: &'a str) -> InboxRow<'a> {
    InboxRow {
        status: e.status.to_byte(),
        received_at_ms: e.received_at_ms,
        created_at_ns: e.created_at.unix_nanos(),
        stream: e.stream.as_deref(),
        attempts: e.attempts,
        due_at_ms: e.due_at_ms,
        last_error: e.last_error.as_deref(),
        force: e.force,
        headers,
        expires_at_ms: e.expires_at_ms,
        lease: e.lease,
        body_bytes: e.body_bytes as u64,
    }
}

/// Decodes a row: the event without its body (see [`with_body`]).
pub(super) fn decode(source: &str, event_id: &str, row: InboxRow<'_>) -> InboxEvent {
    InboxEvent {
        source: source.to_owned(),
        event_id: event_id.to_owned(),
        status: EventStatus::from_byte(row.status),
        stream: row.stream.map(str::to_owned),
        created_at: CreatedAt::from_unix_nanos(row.created_at_ns),
        received_at_ms: row.received_at_ms,
        attempts: row.attempts,
        due_at_ms: row.due_at_ms,
        last_error: row.last_error.map(str::to_owned),
        force: row.force,
        headers: serde_json::from_str(row.headers).unwrap_or_default(),
        body: Vec::new(),
        expires_at_ms: row.expires_at_ms,
        lease: row.lease,
        body_bytes: usize::try_from(row.body_bytes).unwrap_or(usize::MAX),
        timeline: Vec::new(),
        replay: None,
    }
}

/// Decodes an attempt of a stored timeline (status 0: no answer).
pub(super) fn attempt_from_row(row: AttemptRow<'_>) -> Attempt {
    let (attempt, at_ms, status, latency_us, error) = row;
    Attempt {
        attempt,
        at_ms,
        status: (status != 0).then_some(status),
        latency_us,
        error: error.map(str::to_owned),
    }
}

/// The tables an event's body is read from, and the keys its seal opens
/// with.
pub(super) struct BodyTables<'a, B, S> {
    pub bodies: B,
    /// The key slot of each sealed row (see `tables::INBOX_SEALS`).
    pub sealed: S,
    pub seals: &'a Seals,
}

impl<'a>
    BodyTables<
        'a,
        ReadOnlyTable<(&'static str, &'static str), &'static [u8]>,
        ReadOnlyTable<(&'static str, &'static str), u64>,
    >
{
    /// The body tables of a read transaction.
    pub(super) fn open(tx: &ReadTransaction, seals: &'a Seals) -> Result<Self, redb::Error> {
        Ok(Self {
            bodies: tx.open_table(INBOX_BODIES)?,
            sealed: tx.open_table(INBOX_SEALS)?,
            seals,
        })
    }
}

impl<B, S> BodyTables<'_, B, S>
where
    B: ReadableTable<(&'static str, &'static str), &'static [u8]>,
    S: ReadableTable<(&'static str, &'static str), u64>,
{
    /// Fills in an event's body (and a sealed event's headers); an error
    /// for a seal that does not open.
    pub(super) fn with_body(&self, e: InboxEvent) -> Result<InboxEvent, redb::Error> {
        let (source, id) = (e.source.clone(), e.event_id.clone());
        self.try_with_body(e)?.ok_or_else(|| {
            redb::Error::Corrupted(format!(
                "{SEAL_CLOSED}: inbox event {source}/{id} (its key is not in the key file)"
            ))
        })
    }

    /// [`BodyTables::with_body`], `None` for a seal that does not open:
    /// its key was shredded after this read began (an erasure or the
    /// reaper), or the key file is not the one it was sealed with.
    pub(super) fn try_with_body(
        &self,
        mut e: InboxEvent,
    ) -> Result<Option<InboxEvent>, redb::Error> {
        // Every row but an erased one has its body (written together,
        // deleted together): a missing one is never delivered as an empty
        // body.
        if e.status == EventStatus::Erased {
            return Ok(Some(e));
        }
        let key = (e.source.as_str(), e.event_id.as_str());
        let Some(body) = self.bodies.get(key)? else {
            return Err(redb::Error::Corrupted(format!(
                "inbox event {}/{} has no body",
                e.source, e.event_id
            )));
        };
        if self.sealed.get(key)?.is_none() {
            // Stored before bodies were sealed (schema 11 and before).
            e.body = body.value().to_vec();
            return Ok(Some(e));
        }
        match self.seals.open_seal(body.value()) {
            Ok(opened) => {
                e.headers = opened.headers;
                e.body = opened.body;
                Ok(Some(e))
            }
            Err(OpenSealError::Io(err)) => Err(redb::Error::Io(err)),
            Err(err) => {
                let slot = seal::seal_header(body.value()).map(|(slot, _)| slot);
                if slot.is_some_and(|slot| self.seals.damaged(slot)) {
                    // Not a race with an erasure: a damaged key file, or
                    // another copy's. Said once: the event is read again
                    // at every look for due events.
                    tracing::error!(
                        source = %e.source,
                        event_id = %e.event_id,
                        status = ?e.status,
                        error = %err,
                        "an event's sealed body does not open with the key file: it is neither \
                         delivered nor shown, and while it is pending the later events of its \
                         stream wait for it. Is the key file (the data file's path with .keys) \
                         the one this data file was written with? `dedupd verify` checks every \
                         seal; put the right key file back and restart"
                    );
                } else {
                    tracing::debug!(source = %e.source, event_id = %e.event_id, error = %err, "a sealed body does not open");
                }
                Ok(None)
            }
        }
    }

    /// Reads one whole event: its row and its body.
    pub(super) fn read_whole(
        &self,
        rows: &impl ReadableTable<(&'static str, &'static str), InboxRow<'static>>,
        source: &str,
        id: &str,
    ) -> Result<Option<InboxEvent>, redb::Error> {
        match rows.get((source, id))? {
            Some(row) => self.with_body(decode(source, id, row.value())).map(Some),
            None => Ok(None),
        }
    }
}
