//! Sessions: one PostgreSQL connection each, owned by the backend's pool and never handed to
//! application code; one session carries any number of the backend's locks.

use std::sync::Arc;

use leasehold_core::Error;
use tokio::sync::{OnceCell, watch};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{CancelToken, Client, NoTls, Socket, Statement};

use crate::NAME;
use crate::config::PostgresConfig;
use crate::ddl;
use crate::error::{connect_error, pg_error};
use crate::key::AdvisoryId;
use crate::probe::{Probe, Statements, WeakProbe};
use crate::tls::{Tls, TlsMode};
use crate::watch::Watcher;

/// `try_lock`: the lock if free, with a token from the sequence named by `$2` (its quoted,
/// qualified name, [`PostgresConfig::fence_sequence_sql`], bound as a parameter and cast to
/// `regclass`: never spliced into the SQL text, so no quoting rule of the server's
/// (`standard_conforming_strings`) can change what it names).
pub(crate) const TRY_LOCK_SQL: &str =
    "SELECT CASE WHEN pg_try_advisory_lock($1::bigint) THEN nextval($2::text::regclass) END";
/// `try_lock` on a two-key advisory lock (`$1`, `$2`: elections and semaphore permits), the
/// sequence named by `$3` as in [`TRY_LOCK_SQL`]; prepared on first use.
pub(crate) const TRY_PAIR_SQL: &str = "SELECT CASE WHEN pg_try_advisory_lock($1::int4, $2::int4) \
     THEN nextval($3::text::regclass) END";
/// `pg_advisory_unlock` of a two-key advisory lock.
const UNLOCK_PAIR_SQL: &str = "SELECT pg_advisory_unlock($1::int4, $2::int4)";
/// `nextval` of the sequence named by `$1` (as in [`TRY_LOCK_SQL`]).
pub(crate) const NEXTVAL_SQL: &str = "SELECT nextval($1::text::regclass)";

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
    /// The two-`int4` statements ([`TRY_PAIR_SQL`] and its unlock, for elections and
    /// semaphores), prepared on first use so that sessions of lock-only users never do.
    pair: OnceCell<(Statement, Statement)>,
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
///
/// `prefer` tries TLS first and, as libpq does, connects again without TLS if the server
/// refuses it or the handshake fails. Before a password goes out without TLS to a host that
/// is not loopback, [`check_plaintext`] warns or refuses.
pub(crate) async fn connect(
    cfg: &PostgresConfig,
) -> Result<(Client, watch::Receiver<bool>), Error> {
    let connected = match &cfg.tls {
        Some(tls) if tls.mode == TlsMode::Prefer => {
            match connect_with(&cfg.pg, tls.connector.clone()).await {
                Err(e) if is_tls_failure(&e) => {
                    tracing::debug!(error = %e,
                        "leasehold-postgres: sslmode=prefer: TLS failed, connecting without it");
                    check_plaintext(cfg, "sslmode=prefer, and the server refused TLS")?;
                    let mut plain = cfg.pg.clone();
                    plain.ssl_mode(SslMode::Disable);
                    connect_with(&plain, NoTls).await
                }
                other => other,
            }
        }
        Some(tls) => connect_with(&cfg.pg, tls.connector.clone()).await,
        None => {
            check_plaintext(cfg, "sslmode=disable")?;
            connect_with(&cfg.pg, NoTls).await
        }
    };
    connected.map_err(|e| connect_error(cfg, e))
}

/// Whether connecting failed in the TLS negotiation (the server said it has no TLS, or the
/// handshake failed): tokio-postgres reports these, and only these, as a TLS error.
fn is_tls_failure(e: &tokio_postgres::Error) -> bool {
    e.to_string().starts_with("error performing TLS handshake")
}

/// A password is about to go without TLS to each TCP host of `cfg` (`how`, for the message):
/// warns for a host that is not loopback, or refuses with `allow_plaintext_password=false`.
/// Unix sockets never leave the host.
pub(crate) fn check_plaintext(cfg: &PostgresConfig, how: &str) -> Result<(), Error> {
    if cfg.pg.get_password().is_none() {
        return Ok(());
    }
    let addrs = cfg.pg.get_hostaddrs();
    for (i, host) in cfg.pg.get_hosts().iter().enumerate() {
        let Host::Tcp(name) = host else { continue };
        // With `hostaddr`, that address is where the connection goes.
        let target = addrs
            .get(i)
            .map_or_else(|| name.clone(), ToString::to_string);
        leasehold_core::transport::check_plaintext_password(
            NAME,
            &target,
            &format!("PostgreSQL password without TLS: {how}"),
            cfg.allow_plaintext_password,
        )?;
    }
    Ok(())
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
        let (try_lock, unlock, nextval, ping) = tokio::try_join!(
            client.prepare(TRY_LOCK_SQL),
            client.prepare("SELECT pg_advisory_unlock($1::bigint)"),
            client.prepare(NEXTVAL_SQL),
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
                sequence: seq_sql.to_owned(),
            }),
            closed,
            tls,
            watcher: None,
            pair: OnceCell::new(),
        })
    }

    /// The connection, for the election table's statements.
    pub(crate) fn client(&self) -> &Client {
        &self.client
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
    pub(crate) async fn try_lock(
        &self,
        id: AdvisoryId,
    ) -> Result<Option<i64>, tokio_postgres::Error> {
        let seq = &self.stmts.sequence;
        let row = match id {
            AdvisoryId::Big(id) => {
                self.client
                    .query_one(&self.stmts.try_lock, &[&id, seq])
                    .await?
            }
            AdvisoryId::Pair(a, b) => {
                let (try_pair, _) = self.pair().await?;
                self.client.query_one(try_pair, &[&a, &b, seq]).await?
            }
        };
        row.try_get::<_, Option<i64>>(0)
    }

    /// Waits in `pg_advisory_lock` for at most `timeout_ms` (≥ 1) milliseconds.
    ///
    /// The wait is bounded by `lock_timeout` alone: `statement_timeout` is turned off for it,
    /// since a server, database or role default shorter than the budget (a common setting)
    /// would otherwise cancel the wait early (PostgreSQL 13 and later time each statement of a
    /// message on its own, so the `SET` applies to the lock that follows it).
    ///
    /// The statements go in one simple-protocol message, which PostgreSQL runs as one implicit
    /// transaction: if the lock times out (or is cancelled) the transaction aborts and the
    /// `SET`s are rolled back with it; if it is granted, the `RESET`s restore the session's
    /// defaults. Either way neither setting is left on the session, and the session-level
    /// lock, once granted, outlives the implicit transaction.
    pub(crate) async fn wait_lock(
        &self,
        id: AdvisoryId,
        timeout_ms: u64,
    ) -> Result<(), tokio_postgres::Error> {
        // lock_timeout = 0 would mean "no timeout": never send it.
        let ms = timeout_ms.clamp(1, i32::MAX as u64);
        let sql = format!(
            "SET lock_timeout = {ms}; SET statement_timeout = 0; SELECT pg_advisory_lock({id}); \
             RESET statement_timeout; RESET lock_timeout"
        );
        self.client.simple_query(&sql).await.map(drop)
    }

    /// A fencing token minted after the grant; its round trip also proves the session alive.
    pub(crate) async fn nextval(&self) -> Result<i64, tokio_postgres::Error> {
        let row = self
            .client
            .query_one(&self.stmts.nextval, &[&self.stmts.sequence])
            .await?;
        row.try_get::<_, i64>(0)
    }

    /// `pg_advisory_unlock`: `true` if this session held the lock.
    pub(crate) async fn unlock(&self, id: AdvisoryId) -> Result<bool, tokio_postgres::Error> {
        let row = match id {
            AdvisoryId::Big(id) => self.client.query_one(&self.stmts.unlock, &[&id]).await?,
            AdvisoryId::Pair(a, b) => {
                let (_, unlock_pair) = self.pair().await?;
                self.client.query_one(unlock_pair, &[&a, &b]).await?
            }
        };
        row.try_get::<_, bool>(0)
    }

    /// The two-`int4` statements, prepared on first use.
    async fn pair(&self) -> Result<&(Statement, Statement), tokio_postgres::Error> {
        self.pair
            .get_or_try_init(|| async {
                tokio::try_join!(
                    self.client.prepare(TRY_PAIR_SQL),
                    self.client.prepare(UNLOCK_PAIR_SQL),
                )
            })
            .await
    }

    /// Runs `SELECT pid FROM pg_locks …` for the holder of `id` (any session).
    pub(crate) async fn holder_pid(
        &self,
        id: AdvisoryId,
    ) -> Result<Option<i32>, tokio_postgres::Error> {
        let (classid, objid, objsubid) = id.pg_locks();
        let row = self
            .client
            .query_opt(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND classid = $1 AND objid = $2 AND objsubid = $3 AND mode = 'ExclusiveLock' \
                 LIMIT 1",
                &[&classid, &objid, &objsubid],
            )
            .await?;
        row.map(|r| r.try_get::<_, Option<i32>>(0))
            .transpose()
            .map(Option::flatten)
    }
}

/// The fencing sequence `seq_sql`, created if missing (see [`ddl::ensure`]).
async fn create_sequence(client: &Client, seq_sql: &str) -> Result<(), Error> {
    ddl::ensure(
        client,
        seq_sql,
        &format!("CREATE SEQUENCE IF NOT EXISTS {seq_sql}"),
    )
    .await
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

    /// Neither timeout a wait sets stays on the session: `lock_timeout` goes back to 0 and
    /// `statement_timeout` to the session's own default (5 s here, longer than every wait).
    #[tokio::test]
    async fn lock_timeout_never_stays_on_the_session() {
        let pg = require_service!(Service::Postgres);
        let url = format!("{}?options=-c%20statement_timeout%3D5000", pg.url());
        let cfg = PostgresConfig::from_url(&url).unwrap();
        let (ready, seq) = (OnceCell::new(), cfg.fence_sequence_sql());
        let a = Session::open(&cfg, &seq, &ready).await.unwrap();
        let b = Session::open(&cfg, &seq, &ready).await.unwrap();
        let id = AdvisoryId::Big(rand::random());
        assert!(b.try_lock(id).await.unwrap().is_some());
        let defaults = || async {
            let lock = a.show("lock_timeout").await.unwrap();
            let statement = a.show("statement_timeout").await.unwrap();
            assert_eq!((lock.as_str(), statement.as_str()), ("0", "5s"));
        };
        defaults().await;

        // Timed out: not granted, and the SETs were rolled back with the implicit transaction.
        let e = a.wait_lock(id, 100).await.unwrap_err();
        assert!(is_lock_timeout(&e), "{e}");
        defaults().await;
        assert!(!a.unlock(id).await.unwrap(), "a timed-out wait left a lock");

        // A budget of 0 ms waits 1 ms: it must not mean "lock_timeout = 0 = forever".
        let r = tokio::time::timeout(Duration::from_secs(5), a.wait_lock(id, 0)).await;
        assert!(matches!(&r, Ok(Err(e)) if is_lock_timeout(e)), "{r:?}");

        // Granted while waiting: RESET ran, the session lock outlives the implicit transaction.
        let waiting = a.wait_lock(id, 5_000);
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            b.unlock(id).await
        };
        let (w, r) = tokio::join!(waiting, release);
        w.unwrap();
        assert!(r.unwrap());
        defaults().await;
        assert!(
            b.try_lock(id).await.unwrap().is_none(),
            "the granted lock is not held"
        );
        assert!(a.unlock(id).await.unwrap());
        assert!(!a.unlock(id).await.unwrap(), "held twice");
    }
}
