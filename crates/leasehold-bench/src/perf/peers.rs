//! The peer crates, each used the way its documentation shows: rslock 0.10,
//! distributed-lock-redis and distributed-lock-postgres 0.2, sqlx 0.9's `PgAdvisoryLock`.

use std::time::Duration;

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use sqlx::postgres::{PgAdvisoryLock, PgPool, PgPoolOptions};
use tokio::time::Instant;

use super::subject::{BoxFut, Client, TTL};
use crate::harness::{BoxError, held_for};

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

impl Client for Rslock {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            let lock = self
                .mgr
                .lock(key.as_bytes(), TTL)
                .await
                .map_err(|e| format!("rslock: {e:?}"))?;
            self.mgr.unlock(&lock).await;
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
            let guard = tokio::time::timeout(wait, self.mgr.acquire(key.as_bytes(), TTL))
                .await
                .map_err(|_| "rslock: not granted within the wait budget")?
                .map_err(|e| format!("rslock: {e:?}"))?;
            let (got, freed) = held_for(hold).await;
            guard.release().await;
            Ok((got, freed))
        })
    }
}

/// One try-acquire + release of lock `name` through a distributed-lock provider (`what` names
/// the crate in errors).
async fn dl_cycle<P: LockProvider>(provider: &P, name: String, what: &str) -> Result<(), BoxError> {
    let lock = provider.create_lock(&name);
    let handle = lock
        .try_acquire()
        .await
        .map_err(|e| err(what, e))?
        .ok_or("an uncontended key was not granted")?;
    handle.release().await.map_err(|e| err(what, e))
}

/// distributed-lock-redis's provider over one or more nodes (its keys:
/// `distributed-lock:<name>`).
pub(crate) struct DlRedis {
    provider: distributed_lock_redis::RedisLockProvider,
    prefix: String,
}

impl DlRedis {
    pub(crate) async fn connect(urls: &[String], prefix: String) -> Result<Self, BoxError> {
        let provider = distributed_lock_redis::RedisLockProvider::builder()
            .urls(urls)
            .expiry(TTL)
            .build()
            .await
            .map_err(|e| err("distributed-lock-redis", e))?;
        Ok(Self { provider, prefix })
    }
}

impl Client for DlRedis {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(dl_cycle(
            &self.provider,
            format!("{}{key}", self.prefix),
            "distributed-lock-redis",
        ))
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>> {
        Box::pin(async move {
            let lock = self.provider.create_lock(&format!("{}{key}", self.prefix));
            let asked = Instant::now();
            let handle = lock.acquire(Some(wait)).await.map_err(|e| {
                let waited = asked.elapsed();
                if waited < wait / 2 {
                    // It makes one attempt and reports a timeout at once.
                    format!(
                        "distributed-lock-redis: acquire(Some({wait:?})) on a held key gave up \
                         after {waited:.1?} without waiting ({e})"
                    )
                    .into()
                } else {
                    err("distributed-lock-redis", e)
                }
            })?;
            let (got, freed) = held_for(hold).await;
            handle
                .release()
                .await
                .map_err(|e| err("distributed-lock-redis", e))?;
            Ok((got, freed))
        })
    }
}

/// distributed-lock-postgres's provider (a sqlx 0.8 pool of its own).
pub(crate) struct DlPostgres {
    provider: distributed_lock_postgres::PostgresLockProvider,
    prefix: String,
}

impl DlPostgres {
    /// `url`: a `postgres://` URL (with `?host=<dir>` for the unix socket).
    pub(crate) async fn connect(url: &str, prefix: String) -> Result<Self, BoxError> {
        let provider = distributed_lock_postgres::PostgresLockProvider::new(url)
            .await
            .map_err(|e| err("distributed-lock-postgres", e))?;
        Ok(Self { provider, prefix })
    }
}

impl Client for DlPostgres {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(dl_cycle(
            &self.provider,
            format!("{}{key}", self.prefix),
            "distributed-lock-postgres",
        ))
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>> {
        Box::pin(async move {
            let lock = self.provider.create_lock(&format!("{}{key}", self.prefix));
            let handle = lock
                .acquire(Some(wait))
                .await
                .map_err(|e| err("distributed-lock-postgres", e))?;
            let (got, freed) = held_for(hold).await;
            handle
                .release()
                .await
                .map_err(|e| err("distributed-lock-postgres", e))?;
            Ok((got, freed))
        })
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
        let opts = crate::pg_bench::sqlx_options(conninfo)?.application_name(app);
        let pool = PgPoolOptions::new()
            .max_connections(POOL)
            .connect_with(opts)
            .await?;
        Ok(Self { pool, prefix })
    }
}

impl Client for SqlxAdvisory {
    fn cycle<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let lock = PgAdvisoryLock::new(format!("{}{key}", self.prefix));
            let conn = self.pool.acquire().await?;
            match lock.try_acquire(conn).await? {
                sqlx::Either::Left(guard) => {
                    guard.release_now().await?;
                    Ok(())
                }
                sqlx::Either::Right(_) => Err("an uncontended key was not granted".into()),
            }
        })
    }

    fn hold<'a>(
        &'a self,
        key: &'a str,
        wait: Duration,
        hold: Duration,
    ) -> BoxFut<'a, Result<(Instant, Instant), BoxError>> {
        Box::pin(async move {
            let lock = PgAdvisoryLock::new(format!("{}{key}", self.prefix));
            let conn = self.pool.acquire().await?;
            let guard = tokio::time::timeout(wait, lock.acquire(conn))
                .await
                .map_err(|_| "sqlx: not granted within the wait budget")??;
            let (got, freed) = held_for(hold).await;
            guard.release_now().await?;
            Ok((got, freed))
        })
    }
}

/// A `postgres://` URL for sqlx 0.8 (distributed-lock-postgres) from a URL or a libpq
/// key=value string, naming the sessions `app`.
pub(crate) fn sqlx08_url(conninfo: &str, app: &str) -> Result<String, BoxError> {
    use tokio_postgres::config::Host;
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
