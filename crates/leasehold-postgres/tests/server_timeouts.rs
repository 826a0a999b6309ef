//! A server whose sessions get a short `statement_timeout` by default (set for the role, the
//! database or the whole server, as many installations do): a waiting acquisition still waits
//! its whole budget in the server's queue, and the timeout stays the session's default for
//! everything else.

mod common;

use std::time::Duration;

use leasehold_core::{ErrorKind, Locker};
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::time::Instant;

/// The sessions' default `statement_timeout`, well under the waits below.
const STATEMENT_TIMEOUT_MS: u64 = 200;

/// A locker whose sessions start with `statement_timeout` = [`STATEMENT_TIMEOUT_MS`].
fn locker(url: &str, app: &str) -> Result<Locker, common::BoxError> {
    let url = common::with_setting(url, "statement_timeout", STATEMENT_TIMEOUT_MS);
    let backend = leasehold_postgres::PostgresBackend::new(common::config(&url, app)?);
    Ok(Locker::new(backend))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_outlasts_the_sessions_statement_timeout() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = leasehold_test_support::services::unique_prefix("pg-statement-timeout");
    let (holder, waiter) = (locker(pg.url(), &app)?, locker(pg.url(), &app)?);
    let k = format!("{app}/k");
    let held = holder.acquire(&k, Duration::from_secs(5)).await?;

    // Released after 4 statement timeouts: the waiter is granted then, in the server's queue.
    let hold = Duration::from_millis(4 * STATEMENT_TIMEOUT_MS);
    let release = async {
        tokio::time::sleep(hold).await;
        held.release().await
    };
    let t0 = Instant::now();
    let (got, released) = tokio::join!(waiter.acquire(&k, Duration::from_secs(10)), release);
    assert!(released?, "the holder still held the lock");
    let got = got?;
    assert!(
        t0.elapsed() >= hold,
        "granted after {:?}, before the release",
        t0.elapsed()
    );

    // A budget that runs out times out at its end, not at the statement timeout.
    let t0 = Instant::now();
    let err = holder
        .acquire(&k, Duration::from_millis(3 * STATEMENT_TIMEOUT_MS))
        .await
        .expect_err("the lock is held");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        t0.elapsed() >= Duration::from_millis(3 * STATEMENT_TIMEOUT_MS),
        "gave up after {:?}",
        t0.elapsed()
    );
    assert!(got.release().await?);
    Ok(())
}

/// A server that ends idle sessions (`idle_session_timeout`, PostgreSQL 14+): a session left
/// in the pool without a lock is ended while unused (the server shows none of ours left), and
/// the next acquisitions are not handed the dead one. A session that carries a lock is never
/// idle that long (a health check every 250 ms): a lease held over the same spells is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_ended_while_idle_are_not_reused() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = leasehold_test_support::services::unique_prefix("pg-idle-session");
    let admin = common::admin(pg.url()).await?;
    let url = common::with_setting(pg.url(), "idle_session_timeout", IDLE_MS);
    let locker = Locker::new(leasehold_postgres::PostgresBackend::new(common::config(
        &url, &app,
    )?));
    // Keys of this test alone (advisory locks are shared by the whole database).
    let (k, kept) = (format!("{app}/k"), format!("{app}/kept"));
    let idle = Duration::from_millis(4 * IDLE_MS);
    for round in 0..3 {
        let lease = locker
            .try_acquire(&k)
            .await
            .map_err(|e| format!("round {round}: {e}"))?
            .ok_or_else(|| format!("round {round}: held"))?;
        assert!(lease.release().await?);
        tokio::time::sleep(idle).await;
        let left = common::sessions_of(&admin, &app).await?;
        assert_eq!(left, 0, "round {round}: the idle session was not ended");
    }
    let kept = locker.try_acquire(&kept).await?.ok_or("kept: held")?;
    tokio::time::sleep(2 * idle).await;
    assert!(
        !kept.is_lost(),
        "a session carrying a lock was ended for idleness"
    );
    assert!(kept.release().await?);
    Ok(())
}

/// The sessions' `idle_session_timeout` in [`sessions_ended_while_idle_are_not_reused`].
const IDLE_MS: u64 = 300;
