//! A session's prepared statements, and the handles that run its health check without
//! owning it.

use std::sync::Arc;

use tokio_postgres::{Client, Statement};

/// The prepared statements every session carries.
#[derive(Debug)]
pub(crate) struct Statements {
    /// [`TRY_LOCK_SQL`](crate::session::TRY_LOCK_SQL)
    pub(crate) try_lock: Statement,
    /// `SELECT pg_advisory_unlock($1)`
    pub(crate) unlock: Statement,
    /// [`NEXTVAL_SQL`](crate::session::NEXTVAL_SQL)
    pub(crate) nextval: Statement,
    /// `SELECT 1`
    pub(crate) ping: Statement,
    /// The quoted, qualified name of the fencing sequence, bound to `try_lock` and `nextval`.
    pub(crate) sequence: String,
}

/// A probe that does not keep the session's connection open: a session's watcher holds this,
/// so dropping the session still closes the connection (and ends its locks) at once.
#[derive(Debug, Clone)]
pub(crate) struct WeakProbe {
    pub(crate) client: std::sync::Weak<Client>,
    pub(crate) stmts: Arc<Statements>,
}

impl WeakProbe {
    /// A probe, while the session still exists.
    pub(crate) fn upgrade(&self) -> Option<Probe> {
        Some(Probe {
            client: self.client.upgrade()?,
            stmts: Arc::clone(&self.stmts),
        })
    }
}

/// A handle for running health checks without owning the session.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub(crate) client: Arc<Client>,
    pub(crate) stmts: Arc<Statements>,
}

impl Probe {
    pub(crate) async fn ping(&self) -> Result<(), tokio_postgres::Error> {
        self.client.query_one(&self.stmts.ping, &[]).await.map(drop)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}
