//! Redlock waiters are woken by the release: each waiter subscribes to the key's release
//! channel on every node, announces itself on the nodes that found the key held, and tries
//! again on the first message, instead of polling with backoff.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::time::Instant;

fn locker(backend: leasehold_redis::RedlockBackend) -> leasehold_core::Locker {
    leasehold_test_support::harness::locker(
        backend,
        Duration::from_secs(10),
        leasehold_core::Renewal::Off,
    )
}

/// The holder keeps the key 1.5 s, long enough for the waiter's fallback backoff to reach its
/// cap (1 s, fully jittered): a waiter that polled would take ~0.5 s after the release on
/// average. Woken by the release message it takes a round trip or two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_waiter_is_woken_by_the_release() {
    let ep = require_service!(Service::Redlock);
    let prefix = common::prefix("rlwake");
    let holder = locker(common::redlock(ep.urls(), &prefix));
    let waiter = locker(common::redlock(ep.urls(), &prefix));
    let mut lags = common::handoff_lags(&holder, &waiter, Duration::from_millis(1500), 5).await;
    lags.sort();
    let median = lags[lags.len() / 2];
    assert!(
        median < Duration::from_millis(200),
        "median handoff {median:?} ({lags:?}): polled, not woken"
    );
}

/// Many Redlock waiters, each its own backend, on one key: every one gets the lock in turn,
/// far sooner than fallback polling would hand it round, and no key is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_redlock_waiters_each_get_the_lock() {
    let ep = require_service!(Service::Redlock);
    let prefix = common::prefix("rlmany");
    let holder = locker(common::redlock(ep.urls(), &prefix));
    let lease = holder.try_acquire("k").await.unwrap().expect("free");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let w = locker(common::redlock(ep.urls(), &prefix));
            tokio::spawn(async move {
                let l = w.acquire("k", Duration::from_secs(30)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                assert!(l.release().await.unwrap());
            })
        })
        .collect();
    common::until_waiting(ep.urls(), &prefix, 8).await;
    let started = Instant::now();
    assert!(lease.release().await.unwrap());
    for t in tasks {
        t.await.unwrap();
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "8 handoffs took {took:?}");
    common::no_lock_keys_left(ep.urls(), &prefix, Duration::from_secs(5)).await;
}

/// The nodes hand the lock to the same waiter, the one that came first (its ticket orders
/// every node's wait list alike), and the releaser asking again at once does not jump ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_hands_the_lock_on_in_arrival_order() {
    let ep = require_service!(Service::Redlock);
    let prefix = common::prefix("rlorder");
    let holder = locker(common::redlock(ep.urls(), &prefix));
    let waiters = (0..4)
        .map(|_| locker(common::redlock(ep.urls(), &prefix)))
        .collect();
    common::handed_on_in_arrival_order(holder, waiters, ep.urls(), &prefix).await;
}
