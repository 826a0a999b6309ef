//! Releases through a frozen Redis: retried within the budget, then finished in the
//! background once the node answers again, leaving no key behind. A binary of its own: it
//! pauses the shared `redis` node, which no other test may use meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::metrics::{RELEASE_RETRIES, RELEASES_BACKGROUNDED, RELEASES_GIVEN_UP};
use leasehold_core::{LossReason, RELEASE_BUDGET, settle};
use leasehold_test_support::metrics::{counters, record_here};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{NodeAction, Service, node_ctl};
use tokio::time::Instant;

/// A release sent while the node is frozen for longer than the budget returns a retryable
/// error at the budget (not when the node comes back), lets the lease go, and finishes in the
/// background once the node answers; so does the release of a lease dropped meanwhile. No key
/// is left, long before the 30 s TTL would have removed it, and nothing was given up.
#[tokio::test]
async fn releases_through_a_frozen_node_finish_once_it_answers() {
    let ep = require_service!(Service::Redis);
    let (snapshotter, _local) = record_here();

    let prefix = common::prefix("release-frozen");
    let backend = common::redis(ep.url(), &prefix).await;
    let locker = leasehold_test_support::harness::locker(
        backend.clone(),
        Duration::from_secs(30),
        leasehold_core::Renewal::Off,
    );
    let released = locker.try_acquire("a").await.unwrap().expect("free");
    let dropped = locker.try_acquire("b").await.unwrap().expect("free");
    assert_eq!(backend.count_lock_keys("").await.unwrap(), 2);

    node_ctl("redis", NodeAction::Pause)
        .await
        .expect("pause redis");
    let t0 = Instant::now();
    drop(dropped);
    let result = released.release().await;
    let took = t0.elapsed();
    let again = released.release().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    node_ctl("redis", NodeAction::Resume)
        .await
        .expect("resume redis");

    let err = result.expect_err("the node is frozen");
    assert!(err.is_retryable(), "{err}");
    assert!(
        took >= RELEASE_BUDGET - Duration::from_millis(600) && took < RELEASE_BUDGET * 2,
        "the call ended at its budget, not after {took:?}"
    );
    assert_eq!(released.loss_reason(), Some(LossReason::Released));
    assert!(!again.unwrap(), "let go: no second try");
    assert!(
        settle(Duration::from_secs(15)).await,
        "background releases still running 15 s after the node came back"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(28),
        "finished before the TTL"
    );
    assert_eq!(
        backend.count_lock_keys("").await.unwrap(),
        0,
        "a key was left"
    );
    let fresh = locker.try_acquire("a").await.unwrap().expect("free again");
    assert!(fresh.release().await.unwrap());

    let c = counters(&snapshotter);
    assert!(c.get(RELEASE_RETRIES) > 0, "retries were counted");
    assert_eq!(
        c.get(RELEASES_BACKGROUNDED),
        2,
        "both releases went to the background"
    );
    assert_eq!(c.get(RELEASES_GIVEN_UP), 0, "nothing was given up");
}
