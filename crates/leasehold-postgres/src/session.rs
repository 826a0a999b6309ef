//! Sessions: one PostgreSQL connection each, owned by the backend's pool and never handed to
//! application code; one session carries any number of the backend's locks.

use std::sync::Arc;

use leasehold_core::Error;
use tokio::sync::{OnceCell, watch};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{CancelToken, Client, NoTls, Socket, Statement};

use crate::config::PostgresConfig;
use crate::error::{connect_error, pg_error};
use crate::key::LockId;
use crate::probe::{Probe, Statements, WeakProbe};
use crate::tls::Tls;
use crate::watch::Watcher;

/// One connection. Dropping it closes the connection, which ends the server session and with
/// it every advisory lock the session holds.
#[derive(Debug)]
pub(crate) struct Session {
    client: Arc<Client>,
    stmts: Arc<Statements>,
    closed: watch::Receiver<bool>,
    /// The TLS connector the session was opened with (cancel requests need it too).
    tls: Option<Tls>,
    /// The health-check task of this session (see [`Watcher`]); it stops when the
    /// session is dropped.
    pub(crate) watcher: Option<Watcher>,
    /// The semaphore slot statements (two-`int4` try and unlock), prepared on first use so
    /// that sessions of lock-only users never prepare them.
    pair: OnceCell<(Statement, Statement)>,
    /// The quoted fencing sequence, for those statements.
    seq_sql: String,
}

/// Sends a cancel request for a session's running statement, over TLS if the session uses it.
pub(crate) struct Canceller {
    token: CancelToken,
    tls: Option<Tls>,
}

impl Canceller {
    pub(crate) async fn cancel(self) -> Result<(), tokio_postgres::Error> {
        match self.tls {
            Some(tls) => self.token.cancel_query(tls.connector).await,
            None => self.token.cancel_query(NoTls).await,
        }
    }
}

/// Connects with `cfg`'s settings (TLS as its `sslmode` says) and spawns the connection task;
/// the receiver turns `true` when it ends.
pub(crate) async fn connect(
    cfg: &PostgresConfig,
) -> Result<(Client, watch::Receiver<bool>), Error> {
    let connected = match &cfg.tls {
        Some(tls) => connect_with(&cfg.pg, tls.connector.clone()).await,
        None => connect_with(&cfg.pg, NoTls).await,
    };
    connected.map_err(|e| connect_error(cfg, e))
}

async fn connect_with<T>(
    pg: &tokio_postgres::Config,
    tls: T,
) -> Result<(Client, watch::Receiver<bool>), tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = pg.connect(tls).await?;
    let (tx, closed) = watch::channel(false);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "leasehold-postgres: session ended with an error");
        }
        tx.send_replace(true);
    });
    Ok((client, closed))
}

impl Session {
    /// Opens a session and prepares its statements (one pipelined round trip after login).
    /// The first session of a backend creates the fencing sequence if it is missing.
    pub(crate) async fn open(
        cfg: &PostgresConfig,
        seq_sql: &str,
        sequence_ready: &OnceCell<()>,
    ) -> Result<Self, Error> {
        let tls = cfg.tls.clone();
        let (client, closed) = connect(cfg).await?;
        sequence_ready
            .get_or_try_init(|| create_sequence(&client, seq_sql))
            .await?;
        let try_sql = format!(
            "SELECT CASE WHEN pg_try_advisory_lock($1::bigint) THEN nextval('{}') END",
            seq_sql.replace('\'', "''")
        );
        let nextval_sql = format!("SELECT nextval('{}')", seq_sql.replace('\'', "''"));
        let (try_lock, unlock, nextval, ping) = tokio::try_join!(
            client.prepare(&try_sql),
            client.prepare("SELECT pg_advisory_unlock($1::bigint)"),
            client.prepare(&nextval_sql),
            client.prepare("SELECT 1"),
        )
        .map_err(|e| pg_error("prepare", e))?;
        Ok(Self {
            client: Arc::new(client),
            stmts: Arc::new(Statements {
                try_lock,
                unlock,
                nextval,
                ping,
            }),
            closed,
            tls,
            watcher: None,
            pair: OnceCell::new(),
            seq_sql: seq_sql.to_owned(),
        })
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed() || *self.closed.borrow()
    }

    /// Completes when the connection has ended.
    pub(crate) fn closed(&self) -> watch::Receiver<bool> {
        self.closed.clone()
    }

    pub(crate) fn probe(&self) -> Probe {
        Probe {
            client: Arc::clone(&self.client),
            stmts: Arc::clone(&self.stmts),
        }
    }

    pub(crate) fn weak_probe(&self) -> WeakProbe {
        WeakProbe {
            client: Arc::downgrade(&self.client),
            stmts: Arc::clone(&self.stmts),
        }
    }

    pub(crate) fn canceller(&self) -> Canceller {
        Canceller {
            token: self.client.cancel_token(),
            tls: self.tls.clone(),
        }
    }

    /// One round trip: the lock if free, with its fencing token; `None` if held elsewhere.
    pub(crate) async fn try_lock(&self, id: LockId) -> Result<Option<i64>, tokio_postgres::Error> {
        let row = match id {
            LockId::Key(k) => self.client.query_one(&self.stmts.try_lock, &[&k]).await?,
            LockId::Pair(a, b) => {
                let (try_pair, _) = self.pair().await?;
                self.client.query_one(try_pair, &[&a, &b]).await?
            }
        };
        row.try_get::<_, Option<i64>>(0)
    }

    /// Waits in `pg_advisory_lock` for at most `timeout_ms` (≥ 1) milliseconds.
    ///
    /// The three statements go in one simple-protocol message, which PostgreSQL runs as one
    /// implicit transaction: if the lock times out (or is cancelled) the transaction aborts
    /// and the `SET` is rolled back with it; if it is granted, `RESET` restores the session's
    /// default. Either way `lock_timeout` is not left on the session, and the session-level
    /// lock, once granted, outlives the implicit transaction.
    pub(crate) async fn wait_lock(
        &self,
        id: i64,
        timeout_ms: u64,
    ) -> Result<(), tokio_postgres::Error> {
        // lock_timeout = 0 would mean "no timeout": never send it.
        let ms = timeout_ms.clamp(1, i32::MAX as u64);
        let sql =
            format!("SET lock_timeout = {ms}; SELECT pg_advisory_lock({id}); RESET lock_timeout");
        self.client.simple_query(&sql).await.map(drop)
    }

    /// A fencing token minted after the grant; its round trip also proves the session alive.
    pub(crate) async fn nextval(&self) -> Result<i64, tokio_postgres::Error> {
        let row = self.client.query_one(&self.stmts.nextval, &[]).await?;
        row.try_get::<_, i64>(0)
    }

    /// `pg_advisory_unlock`: `true` if this session held the lock.
    pub(crate) async fn unlock(&self, id: LockId) -> Result<bool, tokio_postgres::Error> {
        let row = match id {
            LockId::Key(k) => self.client.query_one(&self.stmts.unlock, &[&k]).await?,
            LockId::Pair(a, b) => {
                let (_, unlock_pair) = self.pair().await?;
                self.client.query_one(unlock_pair, &[&a, &b]).await?
            }
        };
        row.try_get::<_, bool>(0)
    }

    /// The semaphore slot statements, prepared on first use.
    async fn pair(&self) -> Result<&(Statement, Statement), tokio_postgres::Error> {
        self.pair
            .get_or_try_init(|| async {
                let try_sql = format!(
                    "SELECT CASE WHEN pg_try_advisory_lock($1::int4, $2::int4) \
                     THEN nextval('{}') END",
                    self.seq_sql.replace('\'', "''")
                );
                tokio::try_join!(
                    self.client.prepare(&try_sql),
                    self.client
                        .prepare("SELECT pg_advisory_unlock($1::int4, $2::int4)"),
                )
            })
            .await
    }

    /// Runs a statement that is not prepared on every session (the semaphore helpers).
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.client.query(sql, params).await
    }

    /// Runs statements without parameters (the semaphore table's creation).
    pub(crate) async fn batch(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute(sql).await
    }

    /// Runs `SELECT pid FROM pg_locks …` for the holder of `id` (any session).
    pub(crate) async fn holder_pid(&self, id: i64) -> Result<Option<i32>, tokio_postgres::Error> {
        let (classid, objid) = crate::key::pg_locks_ids(id);
        let row = self
            .client
            .query_opt(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND classid = $1 AND objid = $2 AND objsubid = 1 AND mode = 'ExclusiveLock' \
                 LIMIT 1",
                &[&classid, &objid],
            )
            .await?;
        row.map(|r| r.try_get::<_, Option<i32>>(0))
            .transpose()
            .map(Option::flatten)
    }
}

/// `CREATE SEQUENCE IF NOT EXISTS`, tolerating a concurrent creator (which makes PostgreSQL
/// report a duplicate even with `IF NOT EXISTS`).
async fn create_sequence(client: &Client, seq_sql: &str) -> Result<(), Error> {
    match client
        .batch_execute(&format!("CREATE SEQUENCE IF NOT EXISTS {seq_sql}"))
        .await
    {
        Ok(()) => Ok(()),
        Err(e)
            if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                || e.code() == Some(&SqlState::DUPLICATE_TABLE) =>
        {
            Ok(())
        }
        Err(e) => Err(pg_error("creating the fencing sequence", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PostgresConfig;
    use crate::error::is_lock_timeout;
    use leasehold_test_support::require_service;
    use leasehold_test_support::services::Service;
    use std::time::Duration;

    impl Session {
        async fn show(&self, name: &str) -> Result<String, tokio_postgres::Error> {
            let row = self
                .client
                .query_one("SELECT current_setting($1)", &[&name])
                .await?;
            row.try_get(0)
        }
    }

    #[tokio::test]
    async fn lock_timeout_never_stays_on_the_session() {
        let pg = require_service!(Service::Postgres);
        let cfg = PostgresConfig::from_url(pg.url()).unwrap();
        let (ready, seq) = (OnceCell::new(), cfg.fence_sequence_sql());
        let a = Session::open(&cfg, &seq, &ready).await.unwrap();
        let b = Session::open(&cfg, &seq, &ready).await.unwrap();
        let id: i64 = rand::random();
        assert!(b.try_lock(LockId::Key(id)).await.unwrap().is_some());
        assert_eq!(a.show("lock_timeout").await.unwrap(), "0");

        // Timed out: not granted, and the SET was rolled back with the implicit transaction.
        let e = a.wait_lock(id, 100).await.unwrap_err();
        assert!(is_lock_timeout(&e), "{e}");
        assert_eq!(a.show("lock_timeout").await.unwrap(), "0");
        assert!(
            !a.unlock(LockId::Key(id)).await.unwrap(),
            "a timed-out wait left a lock"
        );

        // A budget of 0 ms waits 1 ms: it must not mean "lock_timeout = 0 = forever".
        let r = tokio::time::timeout(Duration::from_secs(5), a.wait_lock(id, 0)).await;
        assert!(matches!(&r, Ok(Err(e)) if is_lock_timeout(e)), "{r:?}");

        // Granted while waiting: RESET ran, the session lock outlives the implicit transaction.
        let waiting = a.wait_lock(id, 5_000);
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            b.unlock(LockId::Key(id)).await
        };
        let (w, r) = tokio::join!(waiting, release);
        w.unwrap();
        assert!(r.unwrap());
        assert_eq!(a.show("lock_timeout").await.unwrap(), "0");
        assert!(
            b.try_lock(LockId::Key(id)).await.unwrap().is_none(),
            "the granted lock is not held"
        );
        assert!(a.unlock(LockId::Key(id)).await.unwrap());
        assert!(!a.unlock(LockId::Key(id)).await.unwrap(), "held twice");
    }
}
