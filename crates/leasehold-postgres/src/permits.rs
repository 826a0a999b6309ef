//! Semaphores on PostgreSQL: [`PostgresPermits`], N advisory locks per key.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_core::{
    Capabilities, Error, ErrorKind, Grant, HolderInfo, LockBackend, LockKey, LockRequest,
    PermitBackend, PermitLimit, View, WaitKind, Waited, async_trait, semaphore::limit_mismatch,
};
use rand::Rng;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::NAME;
use crate::backend::PostgresBackend;
use crate::config::quote_ident;
use crate::error::pg_error;
use crate::key::{AdvisoryId, semaphore_key};

/// The table of agreed limits, in the fencing sequence's schema.
pub const SEMAPHORE_TABLE: &str = "leasehold_semaphores";
/// How many checked limits a view remembers (then it checks again).
const CHECKED_CACHE: usize = 1024;

/// PostgreSQL's permit view: at most N holders of a key, each holding one of N session-level
/// advisory locks in the two-`int4` key space.
///
/// - **Slots.** Permit `i` (0 ≤ i < N) of `key` is `pg_try_advisory_lock(s, i)`, where `s` is
///   [`semaphore_key`](crate::semaphore_key)`(prefix + key)`. That key space (`objsubid` 2 in
///   `pg_locks`) never overlaps the `bigint` one of locks (`objsubid` 1). An acquisition tries
///   the slots from a random start, one statement each, on the backend's shared sessions
///   (`max_sessions` bounds them as for locks), so a try costs up to N round trips when every
///   permit is taken.
/// - **Everything else is a lock's**: the token comes from the same sequence as lock tokens
///   (so it is strictly increasing and durable), the permit lives as long as its session
///   (health-checked; a crashed holder's permit ends with its connection), and release,
///   cancellation and loss work as for a lock.
/// - **Limit.** The first use of a key stores N in the table `<fence_schema>.leasehold_semaphores`
///   (created on first use); every view checks its N against it and refuses another
///   ([`limit_mismatch`]). The stored limit stays until deleted by hand:
///   `DELETE FROM leasehold_semaphores WHERE key = '<prefix><key>'`, with no holder left.
/// - **Waiting** polls: no server-side wait exists for "any of N". The `Locker` retries with
///   its jittered backoff ([`WaitKind::Poll`]).
#[derive(Clone)]
pub struct PostgresPermits {
    backend: PostgresBackend,
    limit: PermitLimit,
    table: Arc<OnceCell<()>>,
    checked: Arc<Mutex<HashSet<LockKey>>>,
}

impl std::fmt::Debug for PostgresPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresPermits")
            .field("backend", &self.backend)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl PostgresPermits {
    pub(crate) fn new(backend: PostgresBackend, limit: PermitLimit) -> Self {
        Self {
            backend,
            limit,
            table: Arc::new(OnceCell::new()),
            checked: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// The name a key's semaphore goes by: the backend's prefix and the key.
    fn name(&self, key: &LockKey) -> String {
        format!("{}{}", self.backend.config().prefix, key.as_str())
    }

    fn table_sql(&self) -> String {
        format!(
            "{}.{}",
            quote_ident(&self.backend.config().fence_schema),
            quote_ident(SEMAPHORE_TABLE)
        )
    }

    /// Stores our limit for `key` if none is, and refuses a different stored one.
    async fn check_limit(&self, key: &LockKey) -> Result<(), Error> {
        if self.cache().contains(key) {
            return Ok(());
        }
        let pool = &self.backend.shared.pool;
        let lent = pool.shared(None).await?;
        let table = self.table_sql();
        self.table
            .get_or_try_init(|| {
                let create = format!(
                    "CREATE TABLE IF NOT EXISTS {table} \
                     (key text PRIMARY KEY, permits integer NOT NULL CHECK (permits > 0))"
                );
                let (client, table) = (lent.session.client(), &table);
                async move { crate::ddl::ensure(client, table, &create).await }
            })
            .await?;
        let name = self.name(key);
        let asked = i32::try_from(self.limit.get()).unwrap_or(i32::MAX);
        let sql = format!(
            "WITH ins AS (INSERT INTO {table} (key, permits) VALUES ($1, $2) \
             ON CONFLICT (key) DO NOTHING RETURNING permits) \
             SELECT permits FROM ins UNION ALL SELECT permits FROM {table} WHERE key = $1"
        );
        let rows = lent
            .session
            .client()
            .query(&sql, &[&name, &asked])
            .await
            .map_err(|e| pg_error("semaphore limit", e))?;
        drop(lent);
        let stored: i32 = rows
            .first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error("semaphore limit", e))?
            .unwrap_or(asked);
        if stored != asked {
            return Err(limit_mismatch(
                NAME,
                key,
                u32::try_from(stored).unwrap_or(0),
                self.limit.get(),
            ));
        }
        let mut cache = self.cache();
        if cache.len() >= CHECKED_CACHE {
            cache.clear();
        }
        cache.insert(key.clone());
        Ok(())
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashSet<LockKey>> {
        self.checked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn live(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error> {
        let s = semaphore_key(&self.name(key));
        let pool = &self.backend.shared.pool;
        let lent = pool.shared(None).await?;
        let rows = lent
            .session
            .client()
            .query(
                "SELECT pid, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND objsubid = 2 AND classid = $1 AND objid::bigint < $2 ORDER BY objid",
                &[&s.cast_unsigned(), &i64::from(self.limit.get())],
            )
            .await
            .map_err(|e| pg_error("pg_locks", e))?;
        drop(lent);
        rows.iter()
            .map(|r| {
                let pid: Option<i32> = r.try_get(0).map_err(|e| pg_error("pg_locks", e))?;
                let slot: i64 = r.try_get(1).map_err(|e| pg_error("pg_locks", e))?;
                Ok(HolderInfo::unknown().with_detail(format!(
                    "permit slot ({s}, {slot}) held by backend pid {}",
                    pid.map_or_else(|| "?".to_owned(), |p| p.to_string())
                )))
            })
            .collect()
    }
}

#[async_trait]
impl View for PostgresPermits {
    type Grants = PostgresBackend;
    const REFUSAL: &'static str = "a permit view is already a semaphore";

    /// Each permit is an advisory lock of the backend's sessions: release, renewal (each
    /// permit's session in turn) and loss as for locks.
    fn grants(&self) -> &PostgresBackend {
        &self.backend
    }

    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities().with_wait(WaitKind::Poll)
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.check_limit(req.key).await?;
        let s = semaphore_key(&self.name(req.key));
        let n = self.limit.get();
        let start = rand::rng().random_range(0..n);
        for i in 0..n {
            let slot = i32::try_from((start + i) % n).unwrap_or(0);
            // The gate lets one local contender try a slot: a session would take its own
            // advisory lock twice.
            let id = AdvisoryId::Pair(s, slot);
            if let Some(grant) = self.backend.try_at(id, req).await? {
                return Ok(Some(grant));
            }
        }
        Ok(None)
    }

    async fn wait_lock(&self, _req: LockRequest<'_>, _deadline: Instant) -> Result<Waited, Error> {
        Err(Error::new(
            ErrorKind::Unsupported,
            NAME,
            "a PostgreSQL semaphore waits by polling (no server-side wait for any of N locks)",
        ))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        Ok(self.live(key).await?.into_iter().next())
    }
}

#[async_trait]
impl PermitBackend for PostgresPermits {
    fn limit(&self) -> PermitLimit {
        self.limit
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error> {
        self.live(key).await
    }
}
