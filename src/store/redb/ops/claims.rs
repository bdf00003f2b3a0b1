//! Claims: each request of the state table applied to the stored row (in
//! the claims' space of the tables keyed by row id, which keep its expiry
//! index entry and the in-memory index in step), and the fence counter
//! moved.

use super::Tables;
use crate::clock::Millis;
use crate::domain::{ClaimResult, Fingerprint, ScopedKey, Token, Ttl};
use crate::store::claims::{self, Change, ClaimRecord};
use crate::store::redb::kv_index::Slot;
use crate::store::redb::tables::{claim_from_value, claim_value};
use crate::store::{ClaimOutcome, DoneOutcome, ExtendOutcome, ReleaseOutcome};

impl Tables<'_> {
    /// See [`crate::store::Store::claim`].
    pub(super) fn claim(
        &mut self,
        key: &ScopedKey,
        ttl: Ttl,
        fingerprint: &Option<Fingerprint>,
        token: Token,
        now: Millis,
    ) -> Result<ClaimOutcome, redb::Error> {
        let stored = self.load_claim(key)?;
        let live = stored
            .as_ref()
            .map(|(_, r)| r)
            .filter(|r| !r.is_expired(now));
        let fence = &mut self.fence;
        let dirty = &mut self.fence_dirty;
        let (outcome, change) = claims::claim(live, ttl, fingerprint.clone(), now, token, || {
            *fence = fence.saturating_add(1);
            *dirty = true;
            *fence
        });
        self.change_claim(key, stored.as_ref().map(|(s, _)| s), change)?;
        Ok(outcome)
    }

    /// See [`crate::store::Store::done`].
    pub(super) fn done(
        &mut self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        result: Option<ClaimResult>,
        now: Millis,
    ) -> Result<DoneOutcome, redb::Error> {
        let stored = self.load_claim(key)?;
        let live = stored
            .as_ref()
            .map(|(_, r)| r)
            .filter(|r| !r.is_expired(now));
        let fence = &mut self.fence;
        let dirty = &mut self.fence_dirty;
        let (outcome, change) = claims::done(live, token, ttl, result, now, || {
            *fence = fence.saturating_add(1);
            *dirty = true;
            *fence
        });
        self.change_claim(key, stored.as_ref().map(|(s, _)| s), change)?;
        Ok(outcome)
    }

    /// See [`crate::store::Store::release`].
    pub(super) fn release(
        &mut self,
        key: &ScopedKey,
        token: Token,
        now: Millis,
    ) -> Result<ReleaseOutcome, redb::Error> {
        let stored = self.load_claim(key)?;
        let live = stored
            .as_ref()
            .map(|(_, r)| r)
            .filter(|r| !r.is_expired(now));
        let (outcome, change) = claims::release(live, token);
        self.change_claim(key, stored.as_ref().map(|(s, _)| s), change)?;
        Ok(outcome)
    }

    /// See [`crate::store::Store::extend`].
    pub(super) fn extend(
        &mut self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<ExtendOutcome, redb::Error> {
        let stored = self.load_claim(key)?;
        let live = stored
            .as_ref()
            .map(|(_, r)| r)
            .filter(|r| !r.is_expired(now));
        let (outcome, change) = claims::extend(live, token, ttl, now);
        self.change_claim(key, stored.as_ref().map(|(s, _)| s), change)?;
        Ok(outcome)
    }

    /// The stored claim of `key` (expired or not), with its slot.
    fn load_claim(&mut self, key: &ScopedKey) -> Result<Option<(Slot, ClaimRecord)>, redb::Error> {
        let Some((slot, value)) = self.claims.load(key.as_str().as_bytes())? else {
            return Ok(None);
        };
        let expires_at_ms = slot.expires_at_ms.unwrap_or(0);
        let record = claim_from_value(&value, expires_at_ms).ok_or_else(|| {
            redb::Error::Corrupted(format!("the claim in row {} cannot be read", slot.id))
        })?;
        Ok(Some((slot, record)))
    }

    /// Applies `change`; `stored` is the slot as stored (expired or not),
    /// which the new row replaces, keeping its row id.
    fn change_claim(
        &mut self,
        key: &ScopedKey,
        stored: Option<&Slot>,
        change: Change,
    ) -> Result<(), redb::Error> {
        let k = key.as_str().as_bytes();
        match change {
            Change::Keep => {}
            Change::Put(new) => {
                self.claims
                    .store(k, stored, &claim_value(&new), Some(new.expires_at_ms))?;
            }
            Change::Delete => self.claims.delete(k, stored)?,
        }
        Ok(())
    }
}
