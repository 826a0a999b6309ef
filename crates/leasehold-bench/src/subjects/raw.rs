//! The raw protocol clients, one per protocol: what a careful user of the server's own
//! commands would write, the physical limit our backends are measured against.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::Owner;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::{Held, Hold, Lock, TTL, acquire_hold_release};
use crate::harness::{BoxError, held_for};
// -------------------------------------------------------------------------- raw Redis

/// The raw Redis cycle: `SET key owner NX PX` on every node concurrently (each bounded by
/// `node_timeout`), success at a majority, then the compare-and-delete script on every node.
/// With one node this is the plain single-node cycle.
pub(crate) struct RawRedis {
    conns: Vec<MultiplexedConnection>,
    prefix: String,
    node_timeout: Duration,
}

const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

impl RawRedis {
    pub(crate) async fn connect(
        urls: Vec<String>,
        prefix: String,
        node_timeout: Duration,
    ) -> Result<Self, BoxError> {
        let mut conns = Vec::new();
        for u in &urls {
            conns.push(
                redis::Client::open(u.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        Ok(Self {
            conns,
            prefix,
            node_timeout,
        })
    }

    /// One attempt: true when a majority granted it; releases everywhere when not.
    async fn attempt(&self, key: &str, owner: &Owner) -> Result<bool, BoxError> {
        let quorum = self.conns.len() / 2 + 1;
        let sets = join_all(self.conns.iter().cloned().map(|mut c| async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key)
                .arg(owner.as_str())
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64);
            let set = cmd.query_async::<Option<String>>(&mut c);
            matches!(
                tokio::time::timeout(self.node_timeout, set).await,
                Ok(Ok(Some(_)))
            )
        }))
        .await;
        let granted = sets.iter().filter(|&&ok| ok).count() >= quorum;
        if !granted {
            self.release(key, owner).await;
        }
        Ok(granted)
    }

    async fn release(&self, key: &str, owner: &Owner) {
        let script = redis::Script::new(RELEASE_LUA);
        join_all(self.conns.iter().cloned().map(|mut c| {
            let script = &script;
            async move {
                let mut invocation = script.key(key);
                invocation.arg(owner.as_str());
                let call = invocation.invoke_async::<i64>(&mut c);
                let _ = tokio::time::timeout(self.node_timeout, call).await;
            }
        }))
        .await;
    }
}

impl Lock for RawRedis {
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        let key = format!("{}{key}", self.prefix);
        let owner = Owner::random()?;
        if !self.attempt(&key, &owner).await? {
            return Err("an uncontended key was not granted".into());
        }
        self.release(&key, &owner).await;
        Ok(())
    }

    async fn hold(&self, h: Hold<'_>) -> Held {
        let key = format!("{}{}", self.prefix, h.key);
        let owner = Owner::random()?;
        let deadline = Instant::now() + h.wait;
        // What a plain user of SET NX does: poll, with a short sleep.
        while !self.attempt(&key, &owner).await? {
            if Instant::now() >= deadline {
                return Err("not granted within the wait budget".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let held = held_for(h.hold).await;
        self.release(&key, &owner).await;
        Ok(held)
    }
}

// ----------------------------------------------------------------------- raw PostgreSQL

/// The raw PostgreSQL cycle on one connection: prepared `pg_try_advisory_lock` +
/// `pg_advisory_unlock`; waiting is `pg_advisory_lock` under `lock_timeout`. With a fencing
/// sequence, also the try-lock that mints a token in the same statement (the pinned
/// PostgreSQL groups).
pub(crate) struct RawPg {
    client: tokio_postgres::Client,
    try_lock: tokio_postgres::Statement,
    /// `CASE WHEN pg_try_advisory_lock($1) THEN nextval(<seq>) END`, if a sequence was given.
    try_lock_token: Option<tokio_postgres::Statement>,
    lock: tokio_postgres::Statement,
    unlock: tokio_postgres::Statement,
    prefix: String,
    task: tokio::task::JoinHandle<()>,
}

impl RawPg {
    pub(crate) async fn connect(
        conninfo: &str,
        app: &str,
        prefix: String,
    ) -> Result<Self, BoxError> {
        Self::connect_with_token(conninfo, app, prefix, None).await
    }

    /// Also prepares the try-lock with a token from `seq` (a sequence, as SQL).
    pub(crate) async fn connect_with_token(
        conninfo: &str,
        app: &str,
        prefix: String,
        seq: Option<&str>,
    ) -> Result<Self, BoxError> {
        let mut cfg: tokio_postgres::Config = conninfo.parse()?;
        cfg.application_name(app);
        let (client, conn) = cfg.connect(tokio_postgres::NoTls).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        let prepare = |sql: &'static str| client.prepare(sql);
        let (try_lock, lock, unlock) = tokio::try_join!(
            prepare("SELECT pg_try_advisory_lock($1::bigint)"),
            prepare("SELECT pg_advisory_lock($1::bigint)"),
            prepare("SELECT pg_advisory_unlock($1::bigint)"),
        )?;
        let try_lock_token = match seq {
            Some(seq) => Some(
                client
                    .prepare(&format!(
                        "SELECT CASE WHEN pg_try_advisory_lock($1::bigint) THEN nextval('{}') END",
                        seq.replace('\'', "''")
                    ))
                    .await?,
            ),
            None => None,
        };
        Ok(Self {
            client,
            try_lock,
            try_lock_token,
            lock,
            unlock,
            prefix,
            task,
        })
    }

    /// One uncontended cycle on advisory-lock id `id`: try-lock (minting a token if `token`;
    /// an error without a sequence) + unlock.
    pub(crate) async fn cycle_id(&self, id: i64, token: bool) -> Result<(), BoxError> {
        let granted = if token {
            let stmt = self
                .try_lock_token
                .as_ref()
                .ok_or("no fencing sequence was given for the cycle with a token")?;
            self.client
                .query_one(stmt, &[&id])
                .await?
                .try_get::<_, Option<i64>>(0)?
                .is_some()
        } else {
            self.client
                .query_one(&self.try_lock, &[&id])
                .await?
                .try_get::<_, bool>(0)?
        };
        if !granted {
            return Err("an uncontended key was not granted".into());
        }
        self.unlock(id).await
    }

    /// The advisory-lock id of `key`: one SipHash of prefix and key, as an application with
    /// its own numbering might do. Not leasehold's sqlx-compatible derivation
    /// (`advisory_key`, two HMAC-SHA256s, some 28k instructions), which the raw cycle paid on
    /// every cycle until 2026-11-30 while leasehold remembers its ids.
    fn id(&self, key: &str) -> i64 {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::hash::DefaultHasher::new();
        (self.prefix.as_str(), key).hash(&mut h);
        i64::from_ne_bytes(h.finish().to_ne_bytes())
    }

    async fn unlock(&self, id: i64) -> Result<(), BoxError> {
        let unlocked: bool = self
            .client
            .query_one(&self.unlock, &[&id])
            .await?
            .try_get(0)?;
        if !unlocked {
            return Err("pg_advisory_unlock: the lock was not held".into());
        }
        Ok(())
    }
}

impl Drop for RawPg {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Lock for RawPg {
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        self.cycle_id(self.id(key), false).await
    }

    /// Waits in the server's queue: `pg_advisory_lock` under `lock_timeout`.
    async fn hold(&self, h: Hold<'_>) -> Held {
        let id = self.id(h.key);
        let timeout = format!("SET lock_timeout = {}", h.wait.as_millis().max(1));
        self.client.batch_execute(&timeout).await?;
        self.client.execute(&self.lock, &[&id]).await?;
        let held = held_for(h.hold).await;
        self.unlock(id).await?;
        Ok(held)
    }
}

// ---------------------------------------------------------------------------- raw etcd

/// etcd's Lock + Unlock RPCs on one lease: granted when the client is made and kept for its
/// life (the physical limit: no lease traffic per lock), or, with `leases` given, granted
/// before each lock and revoked after it, as etcd-client's examples do (every id kept, so a
/// run can check none is left alive).
pub(crate) struct RawEtcd {
    client: etcd_client::Client,
    prefix: String,
    /// The lease every lock sits on, or none for a lease per lock.
    shared: Option<i64>,
    /// The leases granted per lock.
    leases: Option<Arc<std::sync::Mutex<Vec<i64>>>>,
}

/// TTL of the raw client's shared lease; longer than any run of one client.
const RAW_LEASE_TTL: i64 = 120;

impl RawEtcd {
    /// Locks on one lease granted now.
    pub(crate) async fn connect(endpoints: Vec<String>, prefix: String) -> Result<Self, BoxError> {
        let client = etcd_client::Client::connect(endpoints, None).await?;
        let lease = client.lease_client().grant(RAW_LEASE_TTL, None).await?.id();
        Ok(Self {
            client,
            prefix,
            shared: Some(lease),
            leases: None,
        })
    }

    /// A lease granted per lock, its id pushed to `leases`.
    pub(crate) async fn lease_per_lock(
        endpoints: Vec<String>,
        prefix: String,
        leases: Arc<std::sync::Mutex<Vec<i64>>>,
    ) -> Result<Self, BoxError> {
        Ok(Self {
            client: etcd_client::Client::connect(endpoints, None).await?,
            prefix,
            shared: None,
            leases: Some(leases),
        })
    }

    /// The shared lease, or a lease granted for this lock (and remembered).
    async fn lease(&self) -> Result<i64, BoxError> {
        if let Some(id) = self.shared {
            return Ok(id);
        }
        let ttl = i64::try_from(TTL.as_secs())?;
        let id = self.client.lease_client().grant(ttl, None).await?.id();
        if let Some(Ok(mut v)) = self.leases.as_ref().map(|l| l.lock()) {
            v.push(id);
        }
        Ok(id)
    }
}

impl Drop for RawEtcd {
    fn drop(&mut self) {
        let Some(id) = self.shared else { return };
        let mut leases = self.client.lease_client();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = leases.revoke(id).await;
            });
        }
    }
}

impl Lock for RawEtcd {
    /// A hold of zero, waiting up to 5 s (the Lock RPC has no try).
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        let h = Hold {
            key,
            wait: Duration::from_secs(5),
            hold: Duration::ZERO,
        };
        Lock::hold(self, h).await.map(drop)
    }

    async fn hold(&self, h: Hold<'_>) -> Held {
        let lease = self.lease().await?;
        let name = format!("{}{}", self.prefix, h.key);
        let opts = etcd_client::LockOptions::new().with_lease(lease);
        let held = acquire_hold_release(
            "etcd Lock",
            h,
            async { Ok(self.client.lock_client().lock(name, Some(opts)).await?) },
            |held| async move {
                self.client
                    .lock_client()
                    .unlock(held.key().to_vec())
                    .await?;
                Ok(())
            },
        )
        .await;
        if self.shared.is_none() {
            // Revoked whatever happened: a lease left alive would hold the key.
            let revoked = self.client.lease_client().revoke(lease).await;
            let held = held?;
            revoked?;
            return Ok(held);
        }
        held
    }
}
