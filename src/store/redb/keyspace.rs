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
        Ok(kv::read_key(&self.engine, kv::Space::Kv, key, now).await?)
    }

    /// How many of `keys` exist at `now`, a repeated key each time.
    pub async fn count(&self, keys: Vec<Vec<u8>>, now: Millis) -> Result<u64, StoreError> {
        let count = self.engine.read_seen(Fresh::Shown, move |_, shared| {
            kv::count_live(&shared.kv, &keys, now)
        });
        Ok(count.await?)
    }
}
