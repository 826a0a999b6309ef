//! Helpers shared by this crate's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use leasehold_postgres::{PostgresBackend, PostgresConfig, pg_locks_ids};
use tokio_postgres::{Client, NoTls};

/// Boxed error for helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A plain connection of our own (never one of the backend's), its connection task spawned.
pub async fn client(url: &str) -> Result<Client, BoxError> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// A plain connection for inspecting and killing sessions, shareable between tasks.
pub async fn admin(url: &str) -> Result<Arc<Client>, BoxError> {
    Ok(Arc::new(client(url).await?))
}

/// A config for `url` whose sessions carry `app` as application_name, so a test can count
/// its own locks while other tests run in the same database.
pub fn config(url: &str, app: &str) -> Result<PostgresConfig, BoxError> {
    Ok(PostgresConfig::from_url(url)?.with_application_name(app))
}

/// Advisory locks (granted or awaited) of sessions named `app`.
pub async fn advisory_locks_of(admin: &Client, app: &str) -> Result<usize, BoxError> {
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND a.application_name = $1",
            &[&app],
        )
        .await?;
    Ok(usize::try_from(row.get::<_, i64>(0))?)
}

/// Backend pids holding the advisory lock `id`.
pub async fn holders(admin: &Client, id: i64) -> Result<Vec<i32>, BoxError> {
    let (classid, objid) = pg_locks_ids(id);
    let rows = admin
        .query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND classid = $1 AND objid = $2 AND objsubid = 1",
            &[&classid, &objid],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get::<_, i32>(0)).collect())
}

/// Terminates every session holding the advisory lock `id`; returns how many.
pub async fn terminate_holders(admin: &Client, id: i64) -> Result<usize, BoxError> {
    let (classid, objid) = pg_locks_ids(id);
    let rows = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
             AND granted AND classid = $1 AND objid = $2 AND objsubid = 1",
            &[&classid, &objid],
        )
        .await?;
    Ok(rows.len())
}

/// Two independent backends of one unique application name.
pub fn pair(cfg: &PostgresConfig) -> (PostgresBackend, PostgresBackend) {
    (
        PostgresBackend::new(cfg.clone()),
        PostgresBackend::new(cfg.clone()),
    )
}
