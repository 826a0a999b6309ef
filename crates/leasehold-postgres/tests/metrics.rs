//! leasehold-core's metrics on real PostgreSQL: the lease metrics every backend records, and
//! the bounded pool's sessions and waits.

mod common;

use std::time::Duration;

use leasehold_core::metrics::{POOL_SESSIONS, POOL_WAIT_SECONDS, POOL_WAITERS};
use leasehold_core::{LockBackend, LockKey, Locker, ReleaseGate};
use leasehold_postgres::PostgresBackend;
use leasehold_test_support::metrics::{check_lease_metrics, record_here, recorded};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};
use tokio::time::Instant;

#[tokio::test]
async fn leases_are_counted_on_postgres() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    // A release gate of another size than the default: the burst waits at that one.
    let cfg =
        common::config(pg.url(), &unique_prefix("pg-metrics"))?.with_releases_in_flight(16)?;
    let backend = PostgresBackend::new(cfg);
    assert_eq!(backend.release_gate().map(ReleaseGate::size), Some(16));
    let r = check_lease_metrics(backend, Duration::from_secs(3)).await;
    let sessions = r.gauge(POOL_SESSIONS).ok_or("no pool gauge")?;
    assert!(
        sessions >= 1.0,
        "the pool's sessions are counted: {sessions}"
    );
    Ok(())
}

/// A pool of one session, lent whole to a wait in the server: a second acquisition waits
/// for it (counted among the waiters while it waits, its wait timed), and gets it once the
/// first wait ends. The gauge counts the one session, never more.
#[tokio::test]
async fn the_pool_counts_its_sessions_and_its_waiters() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let (snapshotter, _local) = record_here();
    let app = unique_prefix("pg-pool-metrics");
    let cfg = common::config(pg.url(), &app)?.with_max_sessions(1)?;
    let backend = PostgresBackend::new(cfg);
    let locker = Locker::new(backend.clone());
    let admin = common::admin(pg.url()).await?;
    let busy = format!("{app}/busy");
    let busy_id = backend.lock_id(&LockKey::new(&busy)?);
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&busy_id])
        .await?;
    // Our first acquisition waits in the server on the pool's only session.
    let first = {
        let (l, key) = (locker.clone(), busy.clone());
        tokio::spawn(async move { l.acquire(key, Duration::from_secs(20)).await })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while common::advisory_locks_of(&admin, &app).await? == 0 {
        assert!(Instant::now() < deadline, "the first waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The second waits inside leasehold for a session.
    let second = {
        let (l, key) = (locker.clone(), format!("{app}/other"));
        tokio::spawn(async move { l.acquire(key, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = recorded(&snapshotter);
    assert_eq!(during.gauge(POOL_WAITERS), Some(1.0), "one waiter");
    assert_eq!(during.gauge(POOL_SESSIONS), Some(1.0), "one session");

    // The busy key is freed: the first gets it, the session is shared again, the second
    // gets its lock on it.
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&busy_id])
        .await?;
    let a = first.await??;
    let b = second.await??;
    assert!(a.release().await? && b.release().await?);
    // A snapshot resets what it read: the gauges now are the sums of both.
    let after = recorded(&snapshotter);
    let now = |name| during.gauge(name).unwrap_or(0.0) + after.gauge(name).unwrap_or(0.0);
    assert_eq!(now(POOL_WAITERS), 0.0, "nobody waits");
    assert_eq!(now(POOL_SESSIONS), 1.0, "still one session");
    let waits = after.samples(POOL_WAIT_SECONDS);
    assert!(
        waits.iter().any(|&w| w >= 0.2),
        "the second acquisition's wait was timed: {waits:?}"
    );
    Ok(())
}
