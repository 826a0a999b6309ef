//! What `leasehold-bench perf` measures: implementations ("subjects") that make lock clients,
//! and how to count what each left on the servers.
//!
//! A [`Client`] is what one task (or one process) holds: a `Locker`, a connection, a peer
//! crate's manager. A [`Subject`] makes clients: one shared by every task when the
//! implementation multiplexes (a `Locker`, a redis-rs multiplexed connection), one per task when
//! it holds a session per lock or is meant to model separate processes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{LockBackend, Locker, Owner};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::harness::{BoxError, held_for};

/// A boxed, sendable future.
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// TTL of every lease taken by the benchmark.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// One lock client.
pub(crate) trait Client: Send + Sync {
    /// One try-acquire + release of an uncontended `key`; an error if it was not granted.
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>>;

    /// Waits up to `wait` for `key`, holds it for `hold`, releases it; returns the instants
    /// it was granted and released.
    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>>;
}

/// A client with one way to take a lock, [`Client::hold`]; its cycle is a hold of zero
/// (waiting up to 5 s).
trait HoldOnly: Send + Sync {
    /// Waits up to `wait` for `key`, holds it for `hold`, releases it.
    fn lock_hold_unlock<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> impl Future<Output = Result<(Instant, Instant), BoxError>> + Send + 'a;
}

impl<T: HoldOnly> Client for T {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(async move {
            self.lock_hold_unlock(key, Duration::from_secs(5), Duration::ZERO)
                .await?;
            Ok(())
        })
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>> {
        Box::pin(self.lock_hold_unlock(key, wait, hold))
    }
}

/// Which side of a comparison a subject is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A leasehold backend through `Locker`.
    Ours,
    /// The raw protocol cycle: the physical limit.
    Raw,
    /// A peer crate.
    Peer,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ours => "ours",
            Self::Raw => "raw",
            Self::Peer => "peer",
        }
    }
}

/// Makes a client.
pub(crate) type MakeClient =
    Box<dyn Fn() -> BoxFut<'static, Result<Arc<dyn Client>, BoxError>> + Send + Sync>;

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

/// One implementation under test.
pub(crate) struct Subject {
    pub(crate) label: String,
    pub(crate) kind: Kind,
    /// Whether the tasks of one process share one client (else: one client per task).
    pub(crate) shared: bool,
    pub(crate) make: MakeClient,
    pub(crate) count: Count,
}

impl Subject {
    pub(crate) fn new(
        label: impl Into<String>,
        kind: Kind,
        shared: bool,
        make: MakeClient,
        count: Count,
    ) -> Self {
        Self {
            label: label.into(),
            kind,
            shared,
            make,
            count,
        }
    }

    /// What this subject left on the servers, or `None` when that cannot be counted.
    pub(crate) async fn leftovers(&self) -> Result<Option<u64>, BoxError> {
        Ok(match &self.count {
            Count::Local(f) => Some(f() as u64),
            Count::Redis { urls, needle } => {
                let mut n = 0;
                for u in urls {
                    n += redis_keys_with_ttl(u, needle).await?;
                }
                Some(n)
            }
            Count::Postgres { conninfo, app } => Some(pg_advisory_locks(conninfo, app).await?),
            Count::Etcd {
                endpoints,
                prefix,
                leases,
            } => Some(etcd_leftovers(endpoints, prefix, leases.as_deref()).await?),
        })
    }
}

async fn redis_keys_with_ttl(url: &str, needle: &str) -> Result<u64, BoxError> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut cursor: u64 = 0;
    let mut n = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("*{needle}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await?;
        for k in keys {
            let pttl: i64 = redis::cmd("PTTL").arg(&k).query_async(&mut c).await?;
            if pttl >= 0 {
                n += 1;
            }
        }
        if next == 0 {
            return Ok(n);
        }
        cursor = next;
    }
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
                    .with_count_only(),
            ),
        )
        .await?;
    let mut n = u64::try_from(resp.count())?;
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

// ------------------------------------------------------------------------------- ours

/// A leasehold backend through `Locker` (no renewal: cycles are far shorter than the TTL).
pub(crate) struct Ours(pub(crate) Locker);

impl Ours {
    pub(crate) fn locker(backend: Arc<dyn LockBackend>) -> Result<Locker, BoxError> {
        Ok(Locker::from_arc(backend).with_options(
            leasehold_core::LockOptions::default()
                .with_ttl(TTL)
                .with_renewal(leasehold_core::Renewal::Off),
        )?)
    }
}

impl Client for Ours {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let lease = self
                .0
                .try_acquire(key)
                .await?
                .ok_or("an uncontended key was not granted")?;
            if !lease.release().await? {
                return Err("release reported the lease not held".into());
            }
            Ok(())
        })
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>> {
        Box::pin(async move {
            let lease = self.0.acquire(key, wait).await?;
            let (got, freed) = held_for(hold).await;
            if !lease.release().await? {
                return Err("release reported the lease not held".into());
            }
            Ok((got, freed))
        })
    }
}

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
        urls: &[String],
        prefix: String,
        node_timeout: Duration,
    ) -> Result<Self, BoxError> {
        let mut conns = Vec::new();
        for u in urls {
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

    /// [`RawRedis::connect`] with owned arguments (a `'static` future).
    pub(crate) async fn connect_owned(
        urls: Vec<String>,
        prefix: String,
        node_timeout: Duration,
    ) -> Result<Self, BoxError> {
        Self::connect(&urls, prefix, node_timeout).await
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

impl Client for RawRedis {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            let owner = Owner::random()?;
            if !self.attempt(&key, &owner).await? {
                return Err("an uncontended key was not granted".into());
            }
            self.release(&key, &owner).await;
            Ok(())
        })
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            let owner = Owner::random()?;
            let deadline = Instant::now() + wait;
            // What a plain user of SET NX does: poll, with a short sleep.
            while !self.attempt(&key, &owner).await? {
                if Instant::now() >= deadline {
                    return Err("not granted within the wait budget".into());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let (got, freed) = held_for(hold).await;
            self.release(&key, &owner).await;
            Ok((got, freed))
        })
    }
}

// ----------------------------------------------------------------------- raw PostgreSQL

/// The raw PostgreSQL cycle on one connection: prepared `pg_try_advisory_lock` +
/// `pg_advisory_unlock`; waiting is `pg_advisory_lock` under `lock_timeout`. With a fencing
/// sequence, also the try-lock that mints a token in the same statement (`leasehold-bench
/// postgres`).
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

impl Client for RawPg {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let id = self.id(key);
            self.cycle_id(id, false).await
        })
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>> {
        Box::pin(async move {
            let id = self.id(key);
            self.client
                .batch_execute(&format!("SET lock_timeout = {}", wait.as_millis().max(1)))
                .await?;
            self.client.execute(&self.lock, &[&id]).await?;
            let (got, freed) = held_for(hold).await;
            self.unlock(id).await?;
            Ok((got, freed))
        })
    }
}

// ---------------------------------------------------------------------------- raw etcd

/// etcd's Lock + Unlock RPCs on one lease granted when the client is made (the physical
/// limit: no lease traffic per lock).
pub(crate) struct RawEtcd {
    client: etcd_client::Client,
    lease: i64,
    prefix: String,
}

/// TTL of the raw client's lease; longer than any run of one client.
const RAW_LEASE_TTL: i64 = 120;

impl RawEtcd {
    pub(crate) async fn connect(endpoints: &[String], prefix: String) -> Result<Self, BoxError> {
        let client = etcd_client::Client::connect(endpoints, None).await?;
        let lease = client.lease_client().grant(RAW_LEASE_TTL, None).await?.id();
        Ok(Self {
            client,
            lease,
            prefix,
        })
    }

    async fn lock_unlock(
        &self,
        key: &str,
        wait: Duration,
        hold: Duration,
    ) -> Result<(Instant, Instant), BoxError> {
        let mut lock = self.client.lock_client();
        let held = tokio::time::timeout(
            wait,
            lock.lock(
                format!("{}{key}", self.prefix),
                Some(etcd_client::LockOptions::new().with_lease(self.lease)),
            ),
        )
        .await
        .map_err(|_| "not granted within the wait budget")??;
        let (got, freed) = held_for(hold).await;
        lock.unlock(held.key().to_vec()).await?;
        Ok((got, freed))
    }
}

impl Drop for RawEtcd {
    fn drop(&mut self) {
        let (mut leases, id) = (self.client.lease_client(), self.lease);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = leases.revoke(id).await;
            });
        }
    }
}

impl HoldOnly for RawEtcd {
    fn lock_hold_unlock<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> impl Future<Output = Result<(Instant, Instant), BoxError>> + Send + 'a {
        self.lock_unlock(key, wait, hold)
    }
}

/// etcd-client's Lock used the common way: a lease granted per lock, revoked after unlock
/// (every id kept, so the run can check none is left alive).
pub(crate) struct EtcdLeasePerLock {
    client: etcd_client::Client,
    prefix: String,
    leases: Arc<std::sync::Mutex<Vec<i64>>>,
}

impl EtcdLeasePerLock {
    pub(crate) async fn connect(
        endpoints: &[String],
        prefix: String,
        leases: Arc<std::sync::Mutex<Vec<i64>>>,
    ) -> Result<Self, BoxError> {
        Ok(Self {
            client: etcd_client::Client::connect(endpoints, None).await?,
            prefix,
            leases,
        })
    }

    async fn run(
        &self,
        key: &str,
        wait: Duration,
        hold: Duration,
    ) -> Result<(Instant, Instant), BoxError> {
        let mut leases = self.client.lease_client();
        let id = leases
            .grant(i64::try_from(TTL.as_secs())?, None)
            .await?
            .id();
        if let Ok(mut v) = self.leases.lock() {
            v.push(id);
        }
        let mut lock = self.client.lock_client();
        let held = tokio::time::timeout(
            wait,
            lock.lock(
                format!("{}{key}", self.prefix),
                Some(etcd_client::LockOptions::new().with_lease(id)),
            ),
        )
        .await;
        let held = match held {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                let _ = leases.revoke(id).await;
                return Err(e.into());
            }
            Err(_) => {
                let _ = leases.revoke(id).await;
                return Err("not granted within the wait budget".into());
            }
        };
        let (got, freed) = held_for(hold).await;
        lock.unlock(held.key().to_vec()).await?;
        leases.revoke(id).await?;
        Ok((got, freed))
    }
}

impl HoldOnly for EtcdLeasePerLock {
    fn lock_hold_unlock<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> impl Future<Output = Result<(Instant, Instant), BoxError>> + Send + 'a {
        self.run(key, wait, hold)
    }
}
