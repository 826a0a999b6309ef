//! `settle`: a program can wait for the releases leasehold runs in the background (a lease
//! dropped without `release`, an acquisition cut short) before its runtime shuts down.
//!
//! Alone in its own test binary: the count of background releases is process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

mod common;

use common::SlowRelease;
use leasehold_core::{Locker, settle};
use tokio::time::Instant;

/// How long each release takes.
const DELAY: Duration = Duration::from_millis(300);

#[tokio::test]
async fn settle_waits_for_the_release_of_a_dropped_lease() {
    let backend = SlowRelease::new(DELAY);
    let locker = Locker::new(backend.clone());
    let other = Locker::new(backend);
    assert!(settle(Duration::ZERO).await, "nothing in flight yet");

    let lease = locker.try_acquire("k").await.unwrap().expect("free");
    drop(lease); // released in the background, which takes DELAY
    assert!(
        other.try_acquire("k").await.unwrap().is_none(),
        "the background release cannot have finished yet"
    );
    assert!(
        !settle(Duration::from_millis(50)).await,
        "settle said done while a release was still running"
    );
    let t0 = Instant::now();
    assert!(settle(Duration::from_secs(5)).await);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "settle waited for its bound, not for the release"
    );
    let again = other.try_acquire("k").await.unwrap();
    assert!(again.is_some(), "settle returned before the lock was freed");
    again.unwrap().release().await.unwrap();
}
