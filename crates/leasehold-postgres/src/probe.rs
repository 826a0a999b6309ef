//! A session's prepared statements, and the handles that run its health check without
//! owning it.

use std::sync::Arc;

use tokio_postgres::{Client, Statement};

/// The prepared statements every session carries.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('<seq>') END`
    pub(crate) try_lock: Statement,
    /// `SELECT pg_advisory_unlock($1)`
    pub(crate) unlock: Statement,
    /// `SELECT nextval('<seq>')`
    pub(crate) nextval: Statement,
    /// `SELECT 1`
    pub(crate) ping: Statement,
    /// `SELECT CASE WHEN pg_try_advisory_lock($1::int4, $2::int4) THEN nextval('<seq>') END`,
    /// sent unprepared (elections only).
    pub(crate) try_pair: String,
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
