//! The Redis-protocol keyspace in the data file: the handle the RESP
//! listener uses. Writes go through the writer (a pipeline's writes can
//! share one commit); reads take small values from the in-memory index
//! (`kv_index`) and larger ones from their rows.

use std::sync::Arc;

use super::engine::{Engine, Fresh};
use super::error::EngineError;
use super::kv;
use super::ops::Response;
use super::record::Request;
use crate::clock::Millis;
use crate::store::StoreError;
use crate::store::keyspace::{KvEntry, KvRequest, KvResponse};

/// The keyspace of the data file; a handle on its engine (cheap to clone).
#[derive(Debug, Clone)]
pub struct Keyspace {
    engine: Arc<Engine>,
}

impl Keyspace {
    /// The keyspace of the file `engine` has open.
    pub(super) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    /// Hands a write to the writer without waiting for it, so a connection
    /// can queue a pipeline's writes into one commit; the returned future
    /// answers after the commit (in queue order).
    pub async fn submit(
        &self,
        request: KvRequest,
        now: Millis,
    ) -> Result<impl Future<Output = Result<KvResponse, StoreError>> + Send + 'static, StoreError>
    {
        let answer = self.engine.submit(Request::Kv(request), now).await?;
        Ok(async move {
            match answer.await? {
                Response::Kv(r) => Ok(r),
                _ => Err(EngineError::Unexpected("a keyspace write").into()),
            }
        })
    }

    /// The live entry of `key` at `now`.
    pub async fn get(&self, key: Vec<u8>, now: Millis) -> Result<Option<KvEntry>, StoreError> {
        let key = Arc::new(key);
        // A pending row's batch is on disk (so committed) by the time
        // `read_seen` returns: the next look finds the row, or a newer state.
        for attempt in 0..kv::PENDING_TRIES {
            let key = key.clone();
            // A small value is in the index; a row not committed yet is
            // waited for on the next attempt.
            let fresh = if attempt == 0 {
                Fresh::Shown
            } else {
                Fresh::Acknowledged
            };
            let found = self
                .engine
                .read_seen(fresh, move |db, shared| {
                    kv::get(
                        db,
                        &shared.kv,
                        kv::Space::Kv,
                        || shared.watermark.visible(),
                        || shared.watermark.last_committed(),
                        &key,
                        now,
                    )
                })
                .await?;
            if let kv::Lookup::Found(entry) = found {
                return Ok(entry);
            }
        }
        Err(EngineError::NotCommitted.into())
    }

    /// How many of `keys` exist at `now`, a repeated key each time.
    pub async fn count(&self, keys: Vec<Vec<u8>>, now: Millis) -> Result<u64, StoreError> {
        let count = self.engine.read_seen(Fresh::Shown, move |_, shared| {
            kv::count_live(&shared.kv, &keys, now)
        });
        Ok(count.await?)
    }
}
