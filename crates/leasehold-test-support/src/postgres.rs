//! PostgreSQL administration for tests and fault injection: a plain session of the test's own,
//! the advisory locks and sessions of one application name, and the sessions holding one of
//! leasehold's locks, to inspect or end (`pg_terminate_backend`).
//!
//! Lock ids are leasehold's 64-bit advisory keys. `pg_locks` shows one as two `oid`s with
//! `objsubid = 1` (the two-`int4` form of `pg_advisory_lock(bigint)`): the high 32 bits in
//! `classid`, the low 32 bits in `objid`. [`HOLDERS`] recombines them, so the same SQL works from
//! `psql` with the key written in.

use std::sync::Arc;

use tokio_postgres::{Client, NoTls};

use crate::BoxError;

// The text of `HOLDERS`, as a macro so that `concat!` can build the statements on it.
macro_rules! holders {
    () => {
        "locktype = 'advisory' AND granted AND objsubid = 1 \
         AND ((classid::bigint << 32) | objid::bigint) = $1"
    };
}

/// The condition on `pg_locks` that selects the granted advisory lock of leasehold key `$1`
/// (a `bigint`).
pub const HOLDERS: &str = holders!();

/// Ends every session holding leasehold key `$1`; one row per session ended.
pub const TERMINATE_HOLDERS_SQL: &str = concat!(
    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE ",
    holders!()
);

const HOLDER_PIDS_SQL: &str = concat!("SELECT pid FROM pg_locks WHERE ", holders!());

/// [`TERMINATE_HOLDERS_SQL`] with the key written in, for `psql -c`.
pub fn terminate_holders_sql(id: i64) -> String {
    TERMINATE_HOLDERS_SQL.replace("$1", &id.to_string())
}

/// A plain connection of the test's own (never one of a backend's), its connection task spawned.
pub async fn connect(url: &str) -> Result<Client, BoxError> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// [`connect`], shareable between tasks (for inspecting and killing sessions from hooks).
pub async fn admin(url: &str) -> Result<Arc<Client>, BoxError> {
    Ok(Arc::new(connect(url).await?))
}

/// The advisory locks of the sessions of one application name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdvisoryLocks {
    /// Locks granted.
    pub granted: u64,
    /// Locks requested and still waiting.
    pub waiting: u64,
}

impl AdvisoryLocks {
    /// Granted and waiting together.
    pub fn total(self) -> u64 {
        self.granted + self.waiting
    }
}

/// Advisory locks of the sessions whose `application_name` is `app`.
pub async fn advisory_locks_of(admin: &Client, app: &str) -> Result<AdvisoryLocks, BoxError> {
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted) \
             FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND a.application_name = $1",
            &[&app],
        )
        .await?;
    Ok(AdvisoryLocks {
        granted: u64::try_from(row.try_get::<_, i64>(0)?)?,
        waiting: u64::try_from(row.try_get::<_, i64>(1)?)?,
    })
}

/// Sessions whose `application_name` is `app` open on the server.
pub async fn sessions_of(admin: &Client, app: &str) -> Result<u64, BoxError> {
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await?;
    Ok(u64::try_from(row.try_get::<_, i64>(0)?)?)
}

/// Backend pids holding leasehold key `id`.
pub async fn holders(admin: &Client, id: i64) -> Result<Vec<i32>, BoxError> {
    let rows = admin.query(HOLDER_PIDS_SQL, &[&id]).await?;
    Ok(rows
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?)
}

/// Ends every session holding leasehold key `id` (`pg_terminate_backend`); returns how many.
pub async fn terminate_holders(admin: &Client, id: i64) -> Result<usize, BoxError> {
    Ok(admin.query(TERMINATE_HOLDERS_SQL, &[&id]).await?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_psql_form_writes_the_key_in() {
        let sql = terminate_holders_sql(-42);
        assert!(sql.ends_with("objid::bigint) = -42"), "{sql}");
        assert!(!sql.contains('$'));
    }
}
