//! The release gate: a backend's releases in flight stay within its `ReleaseGate`, whether
//! they come from `Lease::release`, from dropped leases or from acquisitions cut short; a
//! release waiting for a place ends at its budget like one waiting for its answer.
//!
//! Alone in its own test binary: `settle` counts background releases process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{STUCK, SlowRelease};
use leasehold_core::{Locker, RELEASE_BUDGET, settle};
use tokio::time::Instant;

/// How long each release takes.
const DELAY: Duration = Duration::from_millis(50);

async fn take(locker: &Locker, n: usize) -> Vec<leasehold_core::Lease> {
    let mut leases = Vec::new();
    for i in 0..n {
        let key = format!("k{i}");
        leases.push(locker.try_acquire(key).await.unwrap().expect("free"));
    }
    leases
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_releases_keeps_within_the_gate_and_every_one_lands() {
    let backend = SlowRelease::new(DELAY).gated(3);
    let locker = Locker::new(backend.clone());
    let leases = take(&locker, 20).await;
    let t0 = Instant::now();
    let mut burst = tokio::task::JoinSet::new();
    for l in leases {
        burst.spawn(async move { l.release().await });
    }
    let released = burst.join_all().await;
    assert!(
        released.iter().all(|r| matches!(r, Ok(true))),
        "{released:?}"
    );
    assert_eq!(backend.most(), 3, "the gate's places, all used, no more");
    // Seven turns of three places (20 releases), each taking DELAY.
    assert!(t0.elapsed() >= DELAY * 7, "{:?}", t0.elapsed());
    for l in take(&locker, 20).await {
        l.release().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_leases_and_cut_acquisitions_pass_the_gate_too() {
    let backend = SlowRelease::new(DELAY).gated(2);
    let locker = Locker::new(backend.clone());
    drop(take(&locker, 10).await);
    // An acquisition cut short while it waits: its clean-up releases by owner, in the
    // background, through the same gate.
    let holder = locker.try_acquire("busy").await.unwrap().expect("free");
    let cut = tokio::time::timeout(
        Duration::from_millis(5),
        locker.acquire("busy", Duration::from_secs(1)),
    )
    .await;
    assert!(cut.is_err(), "the acquisition should still be waiting");
    drop(holder);
    assert!(settle(Duration::from_secs(60)).await);
    assert_eq!(backend.most(), 2);
    let again = take(&locker, 10).await;
    assert_eq!(again.len(), 10, "every dropped lease was released");
}

#[tokio::test(start_paused = true)]
async fn a_release_waiting_for_a_place_ends_at_its_budget() {
    let backend = SlowRelease::new(DELAY).gated(1);
    let locker = Locker::new(backend.clone());
    let stuck = locker.try_acquire(STUCK).await.unwrap().expect("free");
    let behind = locker.try_acquire("behind").await.unwrap().expect("free");
    // The stuck release holds the only place until its budget ends.
    let first = tokio::spawn(async move { stuck.release().await });
    tokio::task::yield_now().await;
    let t0 = Instant::now();
    let err = behind
        .release()
        .await
        .expect_err("no place within the budget");
    assert!(err.is_retryable(), "{err}");
    let waited = t0.elapsed();
    assert!(
        waited >= RELEASE_BUDGET - Duration::from_millis(100) && waited <= RELEASE_BUDGET,
        "{waited:?}"
    );
    let first = first.await.unwrap().expect_err("never answered");
    assert!(first.is_retryable(), "{first}");
    assert_eq!(backend.most(), 1);
}
