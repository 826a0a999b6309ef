//! The idle pool: a burst of concurrent holders leaves up to `max_idle_sessions` sessions for
//! reuse (so the next burst opens none), and sessions idle past the idle timeout are closed on
//! the server, without waiting for another release.

mod common;

use std::time::Duration;

use leasehold_core::Locker;
use leasehold_postgres::PostgresBackend;
use leasehold_test_support::postgres::sessions_of;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

/// Waits (up to 5 s: closing is asynchronous) until `app` has `n` sessions on the server.
async fn until_server_sessions(
    admin: &tokio_postgres::Client,
    app: &str,
    n: u64,
) -> Result<(), common::BoxError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = sessions_of(admin, app).await?;
        if now == n {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} sessions of {app} on the server, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds `n` leases on distinct keys at once, then releases them all.
async fn burst(locker: &Locker, prefix: &str, n: usize) -> Result<(), common::BoxError> {
    let mut leases = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}/{i}");
        leases.push(locker.try_acquire(key).await?.ok_or("not granted")?);
    }
    for lease in leases {
        assert!(lease.release().await?);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_reused_then_the_idle_sessions_close() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-pool");
    let admin = common::admin(pg.url()).await?;
    let idle_timeout = Duration::from_millis(500);
    let backend = PostgresBackend::new(
        common::config(pg.url(), &app)?
            .with_max_idle_sessions(4)
            .with_idle_timeout(idle_timeout),
    );
    let locker = Locker::new(backend.clone());

    // Six at once need six sessions; four stay idle, the other two close.
    burst(&locker, &app, 6).await?;
    assert_eq!(backend.sessions_opened(), 6);
    assert_eq!(backend.idle_sessions(), 4);
    until_server_sessions(&admin, &app, 4).await?;

    // The next burst of four opens nothing.
    burst(&locker, &app, 4).await?;
    assert_eq!(
        backend.sessions_opened(),
        6,
        "the idle sessions were not reused"
    );

    // Past the idle timeout, with no release at all, the backend closes its idle sessions.
    let deadline = tokio::time::Instant::now() + idle_timeout * 6;
    while backend.idle_sessions() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "idle sessions outlived the idle timeout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_server_sessions(&admin, &app, 0).await?;

    // And the pool fills again on demand.
    burst(&locker, &app, 1).await?;
    assert_eq!(backend.sessions_opened(), 7);
    assert_eq!(backend.idle_sessions(), 1);
    Ok(())
}
