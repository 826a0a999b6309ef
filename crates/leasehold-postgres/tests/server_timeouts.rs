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
    let url = format!(
        "{url}{}options=-c%20statement_timeout%3D{STATEMENT_TIMEOUT_MS}",
        if url.contains('?') { '&' } else { '?' }
    );
    let backend = leasehold_postgres::PostgresBackend::new(common::config(&url, app)?);
    Ok(Locker::new(backend))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_outlasts_the_sessions_statement_timeout() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = leasehold_test_support::services::unique_prefix("pg-statement-timeout");
    let (holder, waiter) = (locker(pg.url(), &app)?, locker(pg.url(), &app)?);
    let held = holder.acquire("k", Duration::from_secs(5)).await?;

    // Released after 4 statement timeouts: the waiter is granted then, in the server's queue.
    let hold = Duration::from_millis(4 * STATEMENT_TIMEOUT_MS);
    let release = async {
        tokio::time::sleep(hold).await;
        held.release().await
    };
    let t0 = Instant::now();
    let (got, released) = tokio::join!(waiter.acquire("k", Duration::from_secs(10)), release);
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
        .acquire("k", Duration::from_millis(3 * STATEMENT_TIMEOUT_MS))
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
