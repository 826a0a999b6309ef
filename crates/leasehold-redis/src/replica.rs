//! The optional replica-sync check after an acquisition (`with_replica_sync`): the grant counts
//! only once `n` replicas have it, checked with `WAIT` on connections of their own (`WAIT`
//! blocks its connection, and the backend's connection is shared by every request).
//!
//! `WAIT` waits for the replication of the writes of *its own* connection, so the check writes
//! a key of its own on its connection first (`SET <prefix>replica-sync … PX 1000`), after the
//! grant, and reads the lock back in the same pipeline: if the lock holds our owner value there,
//! the grant came before that write in the replication stream, and a replica that acknowledged
//! the write has the grant too. A lock no longer ours on that server (the master moved between
//! the grant and the check) fails the check as well.

use std::time::Duration;

use leasehold_core::{Error, ErrorKind, Owner};
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use crate::config::REDIS;
use crate::error::redis_error;
use crate::sentinel::SentinelConnector;

/// How the check reaches the master.
pub(crate) enum Source {
    Client(Box<redis::Client>),
    Sentinel(std::sync::Arc<SentinelConnector>),
}

/// The check, with its pool of dedicated connections.
pub(crate) struct ReplicaSync {
    replicas: usize,
    timeout: Duration,
    connect_timeout: Duration,
    sync_key: String,
    source: Source,
    pool: tokio::sync::Mutex<Vec<MultiplexedConnection>>,
    name: String,
}

impl ReplicaSync {
    pub(crate) fn new(
        (replicas, timeout): (usize, Duration),
        connect_timeout: Duration,
        prefix: &str,
        source: Source,
        name: String,
    ) -> Self {
        Self {
            replicas,
            timeout,
            connect_timeout,
            sync_key: format!("{prefix}replica-sync"),
            source,
            pool: tokio::sync::Mutex::new(Vec::new()),
            name,
        }
    }

    async fn connection(&self) -> Result<MultiplexedConnection, redis::RedisError> {
        if let Some(c) = self.pool.lock().await.pop() {
            return Ok(c);
        }
        let client = match &self.source {
            Source::Client(c) => (**c).clone(),
            Source::Sentinel(s) => s.master_client().await?,
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout + Duration::from_secs(1)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// `Ok` once `replicas` replicas have the grant of `owner` on `lock`; an error (retryable)
    /// otherwise. The caller gives the grant back on an error.
    pub(crate) async fn check(&self, lock: &str, owner: &Owner) -> Result<(), Error> {
        let fail = |e: &redis::RedisError| redis_error(REDIS, &self.name, e, "replica sync");
        let mut conn = self.connection().await.map_err(|e| fail(&e))?;
        let mut p = redis::pipe();
        p.cmd("SET")
            .arg(&self.sync_key)
            .arg(owner.as_str())
            .arg("PX")
            .arg(1000)
            .ignore()
            .cmd("GET")
            .arg(lock)
            .cmd("WAIT")
            .arg(self.replicas)
            .arg(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX));
        let (holder, acked): (Option<String>, usize) =
            p.query_async(&mut conn).await.map_err(|e| fail(&e))?;
        self.pool.lock().await.push(conn);
        if holder.as_deref().map(crate::scripts::holder) != Some(owner.as_str()) {
            return Err(Error::new(
                ErrorKind::Unavailable,
                REDIS,
                "replica sync: the grant is not on the server the check reached (a failover?)",
            ));
        }
        if acked < self.replicas {
            return Err(Error::new(
                ErrorKind::Unavailable,
                REDIS,
                format!(
                    "replica sync: {acked} of {} replica(s) acknowledged the grant within {:?}",
                    self.replicas, self.timeout
                ),
            ));
        }
        Ok(())
    }
}
