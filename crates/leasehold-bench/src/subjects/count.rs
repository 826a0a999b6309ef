//! Counting what a subject left on the servers after a scenario: lock keys with a TTL on
//! Redis, advisory locks of its sessions on PostgreSQL, keys and live leases on etcd.

use std::sync::Arc;

use futures_util::TryStreamExt as _;
use futures_util::future::join_all;
use redis::AsyncCommands as _;

use crate::harness::BoxError;

/// How to count the locks a subject left behind.
pub(crate) enum Count {
    /// A closure (in-process backends: memory, file).
    Local(Box<dyn Fn() -> usize + Send + Sync>),
    /// Keys containing `needle` that still carry a TTL (lock keys; fencing counters carry
    /// none), summed over these Redis servers (reached directly, not through a proxy).
    Redis { urls: Vec<String>, needle: String },
    /// Advisory locks held by sessions whose `application_name` is `app`.
    Postgres { conninfo: String, app: String },
    /// Keys under `prefix`, plus those of `leases` still alive.
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
        leases: Option<Arc<std::sync::Mutex<Vec<i64>>>>,
    },
}

impl Count {
    /// What the subject left, or `None` when that cannot be counted.
    pub(crate) async fn leftovers(&self) -> Result<Option<u64>, BoxError> {
        Ok(Some(match self {
            Self::Local(f) => f() as u64,
            Self::Redis { urls, needle } => {
                let mut n = 0;
                for u in urls {
                    n += redis_keys_with_ttl(u, needle).await?;
                }
                n
            }
            Self::Postgres { conninfo, app } => pg_advisory_locks(conninfo, app).await?,
            Self::Etcd {
                endpoints,
                prefix,
                leases,
            } => etcd_leftovers(endpoints, prefix, leases.as_deref()).await?,
        }))
    }
}

/// How the Redis backend's keys that carry a TTL but are no lock end: a semaphore's limit
/// (`<prefix>{<key>}:sem:limit`, it expires with its last permit) and the waiters' keys
/// (`<prefix>{<key>}:waitlist`, `:waiters` and the fair `:queue`, they expire seconds after
/// the last waiter asked). A lock's name always ends with `}`.
const REDIS_NOT_LOCKS: [&str; 4] = [":sem:limit", ":waitlist", ":waiters", ":queue"];

/// Whether a Redis key with a TTL is no grant (see [`REDIS_NOT_LOCKS`]).
fn redis_not_lock(key: &str) -> bool {
    REDIS_NOT_LOCKS.iter().any(|s| key.ends_with(s))
}

/// Whether an etcd key is a semaphore's stored limit (`<prefix>%sem/<escaped key>`, which
/// stays behind by design; its permits live under it and a `/`).
fn etcd_permit_limit(key: &[u8]) -> bool {
    let key = String::from_utf8_lossy(key);
    key.split_once("%sem/")
        .is_some_and(|(_, rest)| !rest.contains('/'))
}

async fn redis_keys_with_ttl(url: &str, needle: &str) -> Result<u64, BoxError> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let keys: Vec<String> = {
        let iter = c.scan_match::<_, String>(format!("*{needle}*")).await?;
        iter.try_collect().await?
    };
    let mut n = 0;
    for k in keys {
        // Lock keys carry a TTL; fencing counters carry none (-1). A semaphore's stored limit
        // expires with its last permit, after the release: no permit; a waiter's announcement
        // is no grant either.
        if redis_not_lock(&k) {
            continue;
        }
        if c.pttl::<_, i64>(&k).await? >= 0 {
            n += 1;
        }
    }
    Ok(n)
}

async fn pg_advisory_locks(conninfo: &str, app: &str) -> Result<u64, BoxError> {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(conn);
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1",
            &[&app],
        )
        .await?
        .try_get(0)?;
    drop(client);
    task.abort();
    Ok(u64::try_from(n)?)
}

async fn etcd_leftovers(
    endpoints: &[String],
    prefix: &str,
    leases: Option<&std::sync::Mutex<Vec<i64>>>,
) -> Result<u64, BoxError> {
    let client = etcd_client::Client::connect(endpoints, None).await?;
    let resp = client
        .kv_client()
        .get(
            prefix,
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await?;
    let held = resp.kvs().iter().filter(|kv| !etcd_permit_limit(kv.key()));
    let mut n = held.count() as u64;
    let ids: Vec<i64> = leases
        .map(|l| l.lock().map(|v| v.clone()).unwrap_or_default())
        .unwrap_or_default();
    for chunk in ids.chunks(64) {
        let alive = join_all(chunk.iter().map(|&id| {
            let mut lc = client.lease_client();
            async move {
                lc.time_to_live(id, None)
                    .await
                    .map(|r| r.ttl() > 0)
                    .unwrap_or(false)
            }
        }))
        .await;
        n += alive.into_iter().filter(|&a| a).count() as u64;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A semaphore's stored limit is skipped; its permits, and locks, are counted.
    #[test]
    fn etcd_limit_keys_are_not_counted_as_held() {
        assert!(etcd_permit_limit(b"lh-perf:%sem/u"));
        assert!(!etcd_permit_limit(b"lh-perf:%sem/u/694d7a1b2c"));
        assert!(!etcd_permit_limit(b"lh-perf:u/694d7a1b2c"));
        assert!(!etcd_permit_limit(b"lh-perf:%elect/u/694d7a1b2c"));
    }

    /// A waiter's announcement and a semaphore's limit are no grants; locks (whatever their
    /// key) and permits are.
    #[test]
    fn redis_waiting_markers_are_not_counted_as_held() {
        assert!(redis_not_lock("lh-perf:{u}:waitlist"));
        assert!(redis_not_lock("lh-perf:{u}:elect:waitlist"));
        assert!(redis_not_lock("lh-perf:{u}:waiters"));
        assert!(redis_not_lock("lh-perf:{u}:sem:limit"));
        assert!(!redis_not_lock("lh-perf:{u}"));
        assert!(!redis_not_lock("lh-perf:{u}:waitlist}"));
        assert!(!redis_not_lock("lh-perf:{u}:sem"));
    }
}
