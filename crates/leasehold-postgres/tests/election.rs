//! Elections on the real PostgreSQL of `scripts/services`: the election checks, the key
//! spaces (an election never takes the lock of its key), and the leaders table.
//!
//! The `expire` hook terminates the session holding the election's advisory lock
//! (two-`int4` space, first key `ELECTION_SPACE`) among this test's sessions.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Candidate, Elector, LockBackend, Locker};
use leasehold_postgres::ELECTION_SPACE;
use leasehold_test_support::conformance::election::ElectionTarget;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

const TERMINATE: &str = "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
     JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted \
     AND l.objsubid = 2 AND l.classid = $1 AND a.application_name = $2";

async fn target() -> Option<ElectionTarget> {
    let pg = require_service!(Service::Postgres, None);
    let app = unique_prefix("pg-elect");
    let cfg = common::config(pg.url(), &app).unwrap_or_else(|e| panic!("config: {e}"));
    let admin = common::admin(pg.url())
        .await
        .unwrap_or_else(|e| panic!("admin connection: {e}"));
    let (primary, other) = common::pair(&cfg);
    let primary: Arc<dyn LockBackend> = Arc::new(primary);
    let other: Arc<dyn LockBackend> = Arc::new(other);
    // A native wait (the server's queue): the hand-over is one wake-up.
    Some(
        ElectionTarget::new(
            primary,
            other,
            Duration::from_secs(5),
            Duration::from_secs(2),
        )
        .with_expire(Arc::new(move |_lease| {
            let (admin, app) = (Arc::clone(&admin), app.clone());
            Box::pin(async move {
                let space = ELECTION_SPACE as u32;
                match admin.query(TERMINATE, &[&space, &app]).await {
                    Ok(rows) if rows.len() == 1 => {}
                    Ok(rows) => panic!("terminated {} sessions, expected 1", rows.len()),
                    Err(e) => panic!("pg_terminate_backend: {e}"),
                }
            })
        })),
    )
}

leasehold_test_support::election_tests!(target);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_and_the_lock_of_its_key_never_collide() {
    let pg = require_service!(Service::Postgres);
    let cfg = common::config(pg.url(), &unique_prefix("pg-elect-space"))
        .unwrap_or_else(|e| panic!("config: {e}"));
    let backend: Arc<dyn LockBackend> = Arc::new(common::pair(&cfg).0);
    let key = unique_prefix("shared-key");
    let candidate = Candidate::new("me").unwrap_or_else(|e| panic!("{e}"));
    let elector = Elector::new(
        Arc::clone(&backend),
        key.as_str(),
        candidate,
        leasehold_test_support::harness::options(
            Duration::from_secs(5),
            leasehold_core::Renewal::Auto,
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let lead = elector
        .campaign_for(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let locker = Locker::from_arc(backend);
    let lock = locker
        .try_acquire(key.as_str())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lock.is_some(), "the election took the lock of its key");
    let term = lead.term();
    let lock_token = lock.as_ref().and_then(|l| l.fencing_token());
    assert!(
        lock_token > Some(term),
        "terms and tokens share one sequence"
    );
    let seen = elector.leader().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        seen.map(|l| (l.value.as_str().to_owned(), l.term)),
        Some(("me".into(), term))
    );
    assert!(lead.resign().await.unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(
        elector.leader().await.unwrap_or_else(|e| panic!("{e}")),
        None
    );
}
