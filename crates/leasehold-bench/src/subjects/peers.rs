//! The peer crates, each used the way its documentation shows: rslock 0.10,
//! distributed-lock-redis and distributed-lock-postgres 0.2, sqlx 0.9's `PgAdvisoryLock`.

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use sqlx::postgres::{PgAdvisoryLock, PgConnectOptions, PgPool, PgPoolOptions};
use tokio::time::Instant;
use tokio_postgres::config::Host;

use super::{Held, Hold, Lock, TTL, acquire_hold_release};
use crate::harness::BoxError;

/// Connections in each peer's PostgreSQL pool (sqlx's default).
pub(crate) const POOL: u32 = 10;

fn err(what: &str, e: impl std::fmt::Display) -> BoxError {
    format!("{what}: {e}").into()
}

/// rslock's `LockManager` over one or more nodes.
pub(crate) struct Rslock {
    mgr: rslock::LockManager,
    prefix: String,
}

impl Rslock {
    pub(crate) fn new(urls: &[String], prefix: String) -> Self {
        Self {
            mgr: rslock::LockManager::new(urls.to_vec()),
            prefix,
        }
    }
}

impl Lock for Rslock {
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        let key = format!("{}{key}", self.prefix);
        let lock = self.mgr.lock(key.as_bytes(), TTL).await;
        let lock = lock.map_err(|e| format!("rslock: {e:?}"))?;
        self.mgr.unlock(&lock).await;
        Ok(())
    }

    async fn hold(&self, h: Hold<'_>) -> Held {
        let key = format!("{}{}", self.prefix, h.key);
        let acquire = async {
            let guard = self.mgr.acquire(key.as_bytes(), TTL).await;
            guard.map_err(|e| format!("rslock: {e:?}").into())
        };
        acquire_hold_release("rslock", h, acquire, |guard| async move {
            guard.release().await;
            Ok(())
        })
        .await
    }
}

/// A distributed-lock provider (`what` names the crate in errors): distributed-lock-redis
/// over one or more nodes (its keys: `distributed-lock:<name>`), distributed-lock-postgres
/// (a sqlx 0.8 pool of its own).
pub(crate) struct Dl<P> {
    provider: P,
    prefix: String,
    what: &'static str,
}

/// distributed-lock-redis's provider.
pub(crate) type DlRedis = Dl<distributed_lock_redis::RedisLockProvider>;
/// distributed-lock-postgres's provider.
pub(crate) type DlPostgres = Dl<distributed_lock_postgres::PostgresLockProvider>;

impl<P> Dl<P> {
    /// The provider `made` (`what` names the crate in errors).
    fn new(
        made: Result<P, impl std::fmt::Display>,
        prefix: String,
        what: &'static str,
    ) -> Result<Self, BoxError> {
        let provider = made.map_err(|e| err(what, e))?;
        Ok(Self {
            provider,
            prefix,
            what,
        })
    }
}

impl DlRedis {
    pub(crate) async fn connect(urls: Vec<String>, prefix: String) -> Result<Self, BoxError> {
        let builder = distributed_lock_redis::RedisLockProvider::builder().urls(&urls);
        let made = builder.expiry(TTL).build().await;
        Self::new(made, prefix, "distributed-lock-redis")
    }
}

impl DlPostgres {
    /// `url`: a `postgres://` URL (with `?host=<dir>` for the unix socket).
    pub(crate) async fn connect(url: &str, prefix: String) -> Result<Self, BoxError> {
        let made = distributed_lock_postgres::PostgresLockProvider::new(url).await;
        Self::new(made, prefix, "distributed-lock-postgres")
    }
}

impl<P: LockProvider> Lock for Dl<P> {
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        let lock = self.provider.create_lock(&format!("{}{key}", self.prefix));
        let handle = lock.try_acquire().await.map_err(|e| err(self.what, e))?;
        let handle = handle.ok_or("an uncontended key was not granted")?;
        handle.release().await.map_err(|e| err(self.what, e))
    }

    async fn hold(&self, h: Hold<'_>) -> Held {
        let lock = self
            .provider
            .create_lock(&format!("{}{}", self.prefix, h.key));
        let asked = Instant::now();
        let acquire = async {
            lock.acquire(Some(h.wait)).await.map_err(|e| {
                let waited = asked.elapsed();
                if waited < h.wait / 2 {
                    // distributed-lock-redis makes one attempt and reports a timeout at once.
                    format!(
                        "{}: acquire(Some({:?})) on a held key gave up after {waited:.1?} \
                         without waiting ({e})",
                        self.what, h.wait
                    )
                    .into()
                } else {
                    err(self.what, e)
                }
            })
        };
        // Its own wait bounds the acquire; ours only catches a hang.
        let bound = Hold {
            wait: h.wait * 2,
            ..h
        };
        acquire_hold_release(self.what, bound, acquire, |handle| async move {
            handle.release().await.map_err(|e| err(self.what, e))
        })
        .await
    }
}

/// sqlx 0.9's `PgAdvisoryLock` on connections of a `PgPool`.
pub(crate) struct SqlxAdvisory {
    pool: PgPool,
    prefix: String,
}

impl SqlxAdvisory {
    pub(crate) async fn connect(
        conninfo: &str,
        app: &str,
        prefix: String,
    ) -> Result<Self, BoxError> {
        let opts = sqlx_options(conninfo)?.application_name(app);
        let pool = PgPoolOptions::new()
            .max_connections(POOL)
            .connect_with(opts)
            .await?;
        Ok(Self { pool, prefix })
    }
}

impl Lock for SqlxAdvisory {
    async fn cycle(&self, key: &str) -> Result<(), BoxError> {
        let lock = PgAdvisoryLock::new(format!("{}{key}", self.prefix));
        let conn = self.pool.acquire().await?;
        match lock.try_acquire(conn).await? {
            sqlx::Either::Left(guard) => {
                guard.release_now().await?;
                Ok(())
            }
            sqlx::Either::Right(_) => Err("an uncontended key was not granted".into()),
        }
    }

    async fn hold(&self, h: Hold<'_>) -> Held {
        let lock = PgAdvisoryLock::new(format!("{}{}", self.prefix, h.key));
        let conn = self.pool.acquire().await?;
        let acquire = async { Ok(lock.acquire(conn).await?) };
        acquire_hold_release("sqlx", h, acquire, |guard| async move {
            guard.release_now().await?;
            Ok(())
        })
        .await
    }
}

/// sqlx connect options from a URL or a libpq key=value string (via tokio-postgres' parser).
pub(crate) fn sqlx_options(conninfo: &str) -> Result<PgConnectOptions, BoxError> {
    let pg: tokio_postgres::Config = conninfo.parse()?;
    let mut opts = PgConnectOptions::new_without_pgpass();
    match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => opts = opts.host(h),
        Some(Host::Unix(dir)) => opts = opts.socket(dir),
        None => return Err("no host in the connection string".into()),
    }
    if let Some(port) = pg.get_ports().first() {
        opts = opts.port(*port);
    }
    if let Some(user) = pg.get_user() {
        opts = opts.username(user);
    }
    if let Some(password) = pg.get_password() {
        opts = opts.password(std::str::from_utf8(password)?);
    }
    if let Some(db) = pg.get_dbname() {
        opts = opts.database(db);
    }
    Ok(opts)
}

/// A `postgres://` URL for sqlx 0.8 (distributed-lock-postgres) from a URL or a libpq
/// key=value string, naming the sessions `app`.
pub(crate) fn sqlx08_url(conninfo: &str, app: &str) -> Result<String, BoxError> {
    let pg: tokio_postgres::Config = conninfo.parse()?;
    let user = pg.get_user().unwrap_or("postgres");
    let password = pg
        .get_password()
        .map(std::str::from_utf8)
        .transpose()?
        .map(|p| format!(":{p}"))
        .unwrap_or_default();
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let db = pg.get_dbname().unwrap_or(user);
    let (host, socket) = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => (h.clone(), String::new()),
        Some(Host::Unix(dir)) => ("localhost".to_owned(), format!("&host={}", dir.display())),
        None => return Err("no host in the connection string".into()),
    };
    Ok(format!(
        "postgres://{user}{password}@{host}:{port}/{db}?application_name={app}{socket}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlx08_urls_for_tcp_and_the_unix_socket() -> Result<(), BoxError> {
        assert_eq!(
            sqlx08_url("postgres://u:p@127.0.0.1:17432/db", "app")?,
            "postgres://u:p@127.0.0.1:17432/db?application_name=app"
        );
        assert_eq!(
            sqlx08_url(
                "host=/tmp/sock port=17432 user=u password=p dbname=db",
                "app"
            )?,
            "postgres://u:p@localhost:17432/db?application_name=app&host=/tmp/sock"
        );
        Ok(())
    }
}
