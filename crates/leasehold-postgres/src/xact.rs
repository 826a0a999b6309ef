//! Transaction mode: `pg_advisory_xact_lock` inside the caller's own transaction.

use std::time::Duration;

use leasehold_core::{Error, FencingToken, LockKey};
use tokio::time::Instant;
use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

use crate::PostgresBackend;
use crate::error::{is_lock_timeout, pg_error};

impl PostgresBackend {
    /// Takes `key` as a **transaction-level** advisory lock inside the caller's transaction
    /// `tx`, waiting at most `wait` (zero: one try). Returns the fencing token, minted in the
    /// same transaction, or `None` if the lock stayed held elsewhere.
    ///
    /// The lock is released when `tx` commits or rolls back, never earlier: there is no lease,
    /// no health check and no release call. The key mapping, the fencing sequence and mutual
    /// exclusion with session-mode leases are the same as for [`LockBackend`] acquisitions
    /// (`pg_advisory_xact_lock` and `pg_advisory_lock` share one key space).
    ///
    /// Everything runs in `tx` with unnamed statements, so it works behind a pooler in
    /// transaction mode (pgbouncer `pool_mode = transaction`), where session locks do not.
    /// Through such a pooler, use only this method of the backend (its session-mode methods
    /// would open sessions through the pooler; see the crate documentation).
    ///
    /// The fencing sequence must exist: it is created by the first session the backend opens
    /// (e.g. [`PostgresBackend::connect`] on a direct connection), not by this method, which
    /// runs no DDL in your transaction.
    ///
    /// Waiting uses `SAVEPOINT` + `SET LOCAL lock_timeout` (the remaining budget) +
    /// `SET LOCAL statement_timeout = 0` (so that a shorter one of `tx` does not cut the wait
    /// short) + `pg_advisory_xact_lock`; a timeout rolls back to the savepoint, so `tx` stays
    /// usable, and either way `tx` keeps its previous `lock_timeout` and `statement_timeout`.
    ///
    /// # Cancellation and drop
    ///
    /// Dropping the future while it waits sends no cancel request (it could hit a later
    /// statement of your transaction): the server keeps waiting until the lock is granted or
    /// the remaining budget runs out, and `tx` may be left inside the savepoint or aborted.
    /// Roll `tx` back after dropping this future; that also ends any lock it took.
    ///
    /// [`LockBackend`]: leasehold_core::LockBackend
    pub async fn lock_xact(
        &self,
        tx: &Transaction<'_>,
        key: &LockKey,
        wait: Duration,
    ) -> Result<Option<FencingToken>, Error> {
        let id = self.lock_id(key);
        // The sequence's name is bound and cast to regclass, never spliced into the SQL.
        let seq = self.config().fence_sequence_sql();
        let deadline = Instant::now().checked_add(wait);
        let row = tx
            .query_typed_one(
                "SELECT CASE WHEN pg_try_advisory_xact_lock($1) \
                 THEN nextval($2::text::regclass) END",
                &[(&id, Type::INT8), (&seq, Type::TEXT)],
            )
            .await
            .map_err(|e| pg_error("pg_try_advisory_xact_lock", e))?;
        let token: Option<i64> = row.try_get(0).map_err(|e| pg_error("decode", e))?;
        if let Some(t) = token {
            return token_of(t).map(Some);
        }
        let remaining = deadline.map_or(wait, |d| d.saturating_duration_since(Instant::now()));
        if remaining.is_zero() {
            return Ok(None);
        }
        let ms = remaining
            .as_micros()
            .div_ceil(1000)
            .clamp(1, i32::MAX as u128);
        let (prev_lock, prev_statement): (String, String) = tx
            .query_typed_one(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')",
                &[],
            )
            .await
            .and_then(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .map_err(|e| pg_error("current_setting", e))?;
        // The wait is bounded by the budget alone: a `statement_timeout` of the transaction
        // shorter than it would cut the wait short (see `Session::wait_lock`).
        let waited = tx
            .batch_execute(&format!(
                "SAVEPOINT leasehold_xact_wait; SET LOCAL lock_timeout = {ms}; \
                 SET LOCAL statement_timeout = 0; SELECT pg_advisory_xact_lock({id})"
            ))
            .await;
        match waited {
            Ok(()) => {
                // Keep the lock (a released savepoint's locks belong to the transaction) and
                // put the caller's timeouts back.
                tx.batch_execute("RELEASE SAVEPOINT leasehold_xact_wait")
                    .await
                    .map_err(|e| pg_error("release savepoint", e))?;
                let row = tx
                    .query_typed_one(
                        "SELECT set_config('lock_timeout', $1, true), \
                         set_config('statement_timeout', $2, true), \
                         nextval($3::text::regclass)",
                        &[
                            (&prev_lock, Type::TEXT),
                            (&prev_statement, Type::TEXT),
                            (&seq, Type::TEXT),
                        ],
                    )
                    .await
                    .map_err(|e| pg_error("nextval", e))?;
                let t: i64 = row.try_get(2).map_err(|e| pg_error("decode", e))?;
                token_of(t).map(Some)
            }
            Err(e) if is_lock_timeout(&e) => {
                tx.batch_execute(
                    "ROLLBACK TO SAVEPOINT leasehold_xact_wait; RELEASE SAVEPOINT leasehold_xact_wait",
                )
                .await
                .map_err(|e| pg_error("rollback to savepoint", e))?;
                Ok(None)
            }
            Err(e) => Err(pg_error("pg_advisory_xact_lock", e)),
        }
    }
}

fn token_of(t: i64) -> Result<FencingToken, Error> {
    match u64::try_from(t) {
        Ok(t) if t > 0 => Ok(FencingToken::new(t)),
        _ => Err(Error::new(
            leasehold_core::ErrorKind::Backend,
            crate::NAME,
            "the fencing sequence returned a non-positive value",
        )),
    }
}
