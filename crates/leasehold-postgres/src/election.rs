//! Elections on PostgreSQL: the leadership is an advisory lock in the two-`int4` key space,
//! the leader's value and term live in a small table.
//!
//! - **Lock**: `pg_try_advisory_lock(ELECTION_SPACE, k)` / `pg_advisory_lock(…)` on the
//!   driver's shared sessions, exactly as a lock is taken (same gate, health check and
//!   release), where [`ELECTION_SPACE`](crate::ELECTION_SPACE) is the fixed first `int4` of every election and `k`
//!   the low 32 bits of [`advisory_key`](crate::advisory_key)`(prefix + key)`. The two-`int4` space never overlaps
//!   the `bigint` one locks use; semaphores in that space never take `ELECTION_SPACE` as first
//!   `int4` (see [`semaphore_key`](crate::semaphore_key)).
//!   Two election keys whose `k` coincide (1 in 2³² per pair) share one leader.
//! - **Term**: the fencing token of the grant, from the same sequence as lock tokens.
//! - **Value**: the row `(key, value, term, pid)` of table `leasehold_leaders` (created on
//!   first use), written by the leader on the session that holds the lock; the leader is the
//!   row whose `pid` holds the advisory lock now (`pg_locks`), so a crashed leader's row is
//!   never reported. Between a grant and its row (one round trip) `leader()` may still name
//!   the previous row's holder if it is the same session.
//! - **Watch**: polling `leader()` every [`POLL`].

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    Candidate, ElectionBackend, Error, Grant, HolderInfo, Leader, LockBackend, LockKey,
    LockRequest, View, Waited, async_trait, poll_leader,
};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::error::pg_error;
use crate::grant::PgGrant;
use crate::key::AdvisoryId;
use crate::pool::Pool;
use crate::session::Session;
use crate::watch::lock;

/// The table of leaders' values and terms.
pub const LEADERS_TABLE: &str = "leasehold_leaders";

/// How often an observer reads the leader.
pub(crate) const POLL: Duration = Duration::from_millis(100);

const CREATE: &str = "CREATE TABLE IF NOT EXISTS leasehold_leaders (key text PRIMARY KEY, \
     value text NOT NULL, term bigint NOT NULL, pid int4 NOT NULL)";
const PUBLISH: &str = "INSERT INTO leasehold_leaders AS l (key, value, term, pid) \
     VALUES ($1, $2, $3, pg_backend_pid()) ON CONFLICT (key) DO UPDATE \
     SET value = EXCLUDED.value, term = EXCLUDED.term, pid = EXCLUDED.pid \
     WHERE l.term < EXCLUDED.term";
const LEADER: &str = "SELECT l.value, l.term FROM leasehold_leaders l WHERE l.key = $1 \
     AND EXISTS (SELECT 1 FROM pg_locks p WHERE p.locktype = 'advisory' AND p.granted \
     AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND p.classid = $2 AND p.objid = $3 AND p.objsubid = 2 AND p.pid = l.pid)";

/// What the election view needs of the backend (implemented by `PostgresBackend`).
#[async_trait]
pub(crate) trait Advisory: LockBackend + Clone {
    /// The name a key is hashed from (the configured prefix and the key).
    fn name(&self, key: &LockKey) -> String;
    async fn try_at(&self, id: AdvisoryId, req: LockRequest<'_>) -> Result<Option<Grant>, Error>;
    async fn wait_at(
        &self,
        id: AdvisoryId,
        req: LockRequest<'_>,
        deadline: Instant,
    ) -> Result<Waited, Error>;
    async fn holder_at(&self, id: AdvisoryId) -> Result<Option<HolderInfo>, Error>;
    /// The session pool.
    fn pool(&self) -> &Arc<Pool>;
}

/// The session that holds `grant`, if it is a PostgreSQL grant still held.
fn holder_session(grant: &Grant) -> Option<Arc<Session>> {
    let PgGrant(inner) = grant.state.as_ref()?.downcast_ref::<PgGrant>()?;
    lock(&inner.held).as_ref().map(|on| Arc::clone(&on.session))
}

/// The election view of a PostgreSQL backend for one candidate.
#[derive(Debug, Clone)]
pub(crate) struct PgElection<B> {
    backend: B,
    candidate: Candidate,
    table: Arc<OnceCell<()>>,
}

impl<B: Advisory> PgElection<B> {
    pub(crate) fn new(backend: B, candidate: Candidate) -> Self {
        Self {
            backend,
            candidate,
            table: Arc::new(OnceCell::new()),
        }
    }

    fn id(&self, key: &LockKey) -> AdvisoryId {
        AdvisoryId::election(&self.backend.name(key))
    }

    /// Creates the table once if it is missing (see `ddl::ensure`).
    async fn table(&self, client: &Client) -> Result<(), Error> {
        self.table
            .get_or_try_init(|| crate::ddl::ensure(client, "leasehold_leaders", CREATE))
            .await
            .map(drop)
    }

    /// Writes our row on the holder's session; on failure gives the grant back.
    async fn publish(&self, req: &LockRequest<'_>, grant: Grant) -> Result<Grant, Error> {
        let name = self.backend.name(req.key);
        let term = grant
            .fencing
            .map(|t| i64::try_from(t.get()).unwrap_or(i64::MAX));
        let written = match (holder_session(&grant), term) {
            (Some(session), Some(term)) => {
                let client = session.client();
                match self.table(client).await {
                    Ok(()) => client
                        .execute(PUBLISH, &[&name, &self.candidate.as_str(), &term])
                        .await
                        .map(drop)
                        .map_err(|e| pg_error("publish the leader", e)),
                    Err(e) => Err(e),
                }
            }
            _ => Err(Error::new(
                leasehold_core::ErrorKind::Backend,
                crate::NAME,
                "the leadership's session or term is missing",
            )),
        };
        self.keep_if(req, grant, written).await
    }
}

#[async_trait]
impl<B: Advisory> View for PgElection<B> {
    type Grants = B;
    const REFUSAL: &'static str = "an election view gives leaderships only";

    /// The backend's sessions keep the leaderships: release, renewal and loss as for locks.
    fn grants(&self) -> &B {
        &self.backend
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        match self.backend.try_at(self.id(req.key), req).await? {
            Some(grant) => self.publish(&req, grant).await.map(Some),
            None => Ok(None),
        }
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let waited = self
            .backend
            .wait_at(self.id(req.key), req, deadline)
            .await?;
        let attempts = waited.attempts;
        match waited.grant {
            Some(grant) => Ok(Waited::new(
                Some(self.publish(&req, grant).await?),
                attempts,
            )),
            None => Ok(Waited::new(None, attempts)),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.backend.holder_at(self.id(key)).await
    }
}

#[async_trait]
impl<B: Advisory> ElectionBackend for PgElection<B> {
    fn candidate(&self) -> &Candidate {
        &self.candidate
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>, Error> {
        let name = self.backend.name(key);
        let (classid, objid, _) = self.id(key).pg_locks();
        let lent = self.backend.pool().shared(None).await?;
        let client = lent.session.client();
        self.table(client).await?;
        let rows = client
            .query(LEADER, &[&name, &classid, &objid])
            .await
            .map_err(|e| pg_error("leader", e))?;
        drop(lent);
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let value: String = row.try_get(0).map_err(|e| pg_error("leader", e))?;
        let term: i64 = row.try_get(1).map_err(|e| pg_error("leader", e))?;
        let value = Candidate::new(value)?;
        let term = leasehold_core::FencingToken::new(u64::try_from(term).unwrap_or(0));
        Ok(Some(Leader::new(value, term)))
    }

    async fn observe(
        &self,
        key: &LockKey,
        last: Option<&Leader>,
        deadline: Instant,
    ) -> Result<Option<Leader>, Error> {
        poll_leader(self, key, last, deadline, POLL).await
    }
}
