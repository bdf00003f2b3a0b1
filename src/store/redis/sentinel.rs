//! A connection to the master that Redis Sentinel names, found again after
//! a failover: the sentinels are asked for the master whenever the
//! connection is lost or the server it reaches has become a replica
//! (`READONLY`), so dedupd follows a promotion without a restart.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind};

/// The master's connection, and how to find the master again.
pub(super) struct SentinelConn {
    /// Asks the sentinels; one question at a time.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The master's connection while it works.
    current: Mutex<Option<MultiplexedConnection>>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
}

impl SentinelConn {
    /// Sentinels at `sentinels`, for the master they call `master`; the
    /// master's credentials and database come from `master_url` (its host
    /// is ignored: the sentinels say where the master is).
    pub fn new(
        sentinels: &[String],
        master: &str,
        master_url: &str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let info = master_url.into_connection_info()?;
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(info.redis_settings().clone());
        let client = SentinelClient::build(
            sentinels.to_vec(),
            master.to_owned(),
            Some(node),
            SentinelServerType::Master,
        )?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(client),
            current: Mutex::new(None),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout)),
            connect_timeout,
        })
    }

    /// The master's connection: the current one, or a new one to the
    /// master the sentinels name now.
    pub async fn get(&self) -> Result<MultiplexedConnection, RedisError> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let mut sentinels = self.sentinels.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let timed_out = || {
            RedisError::from((
                ErrorKind::Io,
                "asking the sentinels for the master timed out",
            ))
        };
        let client = tokio::time::timeout(self.connect_timeout, sentinels.async_get_client())
            .await
            .map_err(|_| timed_out())??;
        tracing::info!(master = %client.get_connection_info().addr(), "connected to the Redis master the sentinels name");
        let conn = tokio::time::timeout(
            self.connect_timeout,
            client.get_multiplexed_async_connection_with_config(&self.config),
        )
        .await
        .map_err(|_| timed_out())??;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    fn current(&self) -> Option<MultiplexedConnection> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// After an error on the master's connection: a lost connection, or a
    /// server that is no longer the master, sends the next call to the
    /// sentinels.
    pub fn saw(&self, e: &RedisError) {
        let lost = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            || e.kind() == ErrorKind::Server(ServerErrorKind::MasterDown);
        if lost {
            *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}
