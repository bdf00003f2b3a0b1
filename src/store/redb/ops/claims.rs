//! Claims: each request of the state table applied to the stored row, with
//! its expiry index entry kept in step and the fence counter moved.

use redb::ReadableTable;

use super::Tables;
use crate::clock::Millis;
use crate::domain::{Fingerprint, ScopedKey, Token, Ttl};
use crate::store::claims::{self, Change, ClaimRecord};
use crate::store::redb::tables::{claim_from_row, claim_to_row};
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
        let live = stored.as_ref().filter(|r| !r.is_expired(now));
        let fence = &mut self.fence;
        let dirty = &mut self.fence_dirty;
        let (outcome, change) = claims::claim(live, ttl, fingerprint.clone(), now, token, || {
            *fence += 1;
            *dirty = true;
            *fence
        });
        self.change_claim(key, stored.as_ref(), change)?;
        Ok(outcome)
    }

    /// See [`crate::store::Store::done`].
    pub(super) fn done(
        &mut self,
        key: &ScopedKey,
        token: Token,
        ttl: Ttl,
        now: Millis,
    ) -> Result<DoneOutcome, redb::Error> {
        let stored = self.load_claim(key)?;
        let live = stored.as_ref().filter(|r| !r.is_expired(now));
        let fence = &mut self.fence;
        let dirty = &mut self.fence_dirty;
        let (outcome, change) = claims::done(live, token, ttl, now, || {
            *fence += 1;
            *dirty = true;
            *fence
        });
        self.change_claim(key, stored.as_ref(), change)?;
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
        let live = stored.as_ref().filter(|r| !r.is_expired(now));
        let (outcome, change) = claims::release(live, token);
        self.change_claim(key, stored.as_ref(), change)?;
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
        let live = stored.as_ref().filter(|r| !r.is_expired(now));
        let (outcome, change) = claims::extend(live, token, ttl, now);
        self.change_claim(key, stored.as_ref(), change)?;
        Ok(outcome)
    }

    fn load_claim(&mut self, key: &ScopedKey) -> Result<Option<ClaimRecord>, redb::Error> {
        Ok(self
            .claims
            .open()?
            .get(key.as_str())?
            .map(|g| claim_from_row(g.value())))
    }

    /// Applies `change`; `stored` is the row as stored (expired or not), whose
    /// index entry must go when the row is replaced or removed.
    fn change_claim(
        &mut self,
        key: &ScopedKey,
        stored: Option<&ClaimRecord>,
        change: Change,
    ) -> Result<(), redb::Error> {
        let k = key.as_str();
        match change {
            Change::Keep => {}
            Change::Put(new) => {
                if let Some(old) = stored {
                    self.claim_expiry.open()?.remove((old.expires_at_ms, k))?;
                }
                self.claims.open()?.insert(k, claim_to_row(&new))?;
                self.claim_expiry
                    .open()?
                    .insert((new.expires_at_ms, k), ())?;
            }
            Change::Delete => {
                if let Some(old) = stored {
                    self.claim_expiry.open()?.remove((old.expires_at_ms, k))?;
                }
                self.claims.open()?.remove(k)?;
            }
        }
        Ok(())
    }
}
