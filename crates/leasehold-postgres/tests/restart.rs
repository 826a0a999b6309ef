//! Server restart: leases on the old server are reported lost, and the same backend (its
//! idle pool full of dead sessions) acquires again once the server is back, with fencing
//! tokens that kept increasing across the restart.
//!
//! Alone in its own test binary (cargo runs test binaries one after another), so no other
//! test of this crate sees the restart. The restart is brief (`pg_ctl -m fast` stop + start,
//! about a second), but other crates' tests running *at the same time* against this server
//! would see their connections end.

mod common;

use std::time::Duration;

use leasehold_core::Locker;
use leasehold_postgres::PostgresBackend;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{NodeAction, Service, node_ctl, unique_prefix};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_work_again_after_a_server_restart() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-restart");
    let backend = PostgresBackend::new(common::config(pg.url(), &app)?);
    let locker = Locker::new(backend.clone());
    let key = format!("{app}/k");
    // Fill the idle pool, then hold one lease across the restart.
    for i in 0..3 {
        let l = locker
            .try_acquire(format!("{key}-{i}"))
            .await?
            .ok_or("not granted")?;
        assert!(l.release().await?);
    }
    assert!(backend.sessions() >= 1);
    let before = locker.try_acquire(&key).await?.ok_or("not granted")?;
    let opened_before = backend.sessions_opened();

    let t0 = Instant::now();
    node_ctl("postgres", NodeAction::Restart).await?;
    let restart = t0.elapsed();
    let reason = tokio::time::timeout(Duration::from_secs(5), before.lost().wait())
        .await
        .map_err(|_| "the lease survived a server restart without being reported lost")?;
    eprintln!("restart took {restart:?}; lease lost: {reason}");

    // Same backend, not rebuilt: the dead pooled sessions are skipped or retried.
    let after = locker.acquire(&key, Duration::from_secs(30)).await?;
    assert!(
        after.fencing_token() > before.fencing_token(),
        "tokens went back across the restart: {:?} then {:?}",
        before.fencing_token(),
        after.fencing_token()
    );
    assert!(backend.sessions_opened() > opened_before);
    assert!(
        !before.release().await?,
        "a lease from before the restart said held"
    );
    assert!(after.release().await?);
    // And again through the (now healthy) pool.
    let again = locker
        .try_acquire(&key)
        .await?
        .ok_or("not granted after restart")?;
    assert!(again.release().await?);
    Ok(())
}
