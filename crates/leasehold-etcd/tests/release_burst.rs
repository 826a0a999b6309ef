//! Thousands of leases on one session released in one burst against an overloaded member: the
//! releases meet timeouts (the member is frozen for longer than the request timeout while they
//! are sent) and, when it falls behind applying, `too many requests`; every release still goes
//! through. A binary of its own: the burst loads the shared member, which would slow other
//! tests down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::metrics::{RELEASE_RETRIES, RELEASES_GIVEN_UP};
use leasehold_core::{Lease, Locker, settle};
use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use leasehold_test_support::metrics::{counters, record_here};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{NodeAction, Service, node_ctl};
use metrics_util::debugging::Snapshotter;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Leases in the burst: enough that the member falls behind applying and refuses some.
const LEASES: usize = 10_000;

/// The backend's request timeout in this test, and how long the member is frozen while the
/// releases are sent: longer, so every first attempt meets a transient fault (a timeout)
/// whether or not the member, once resumed, also answers `too many requests`. An unloaded
/// member applies 10,000 deletes without refusing any, so refusals alone prove nothing here.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
const FREEZE: Duration = Duration::from_millis(1_500);

/// Runs `take` on every key `k0` … `k{LEASES - 1}` through `locker`, at most 1,024 requests in
/// flight, and returns the leases it got.
async fn take_all<F, Fut>(locker: &Locker, take: F) -> Vec<Lease>
where
    F: Fn(Locker, String) -> Fut,
    Fut: Future<Output = Result<Option<Lease>, leasehold_core::Error>> + Send + 'static,
{
    let gate = Arc::new(Semaphore::new(1024));
    let mut tasks = JoinSet::new();
    for i in 0..LEASES {
        let gate = Arc::clone(&gate);
        let attempt = take(locker.clone(), format!("k{i}"));
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            attempt.await
        });
    }
    let mut leases = Vec::with_capacity(LEASES);
    while let Some(r) = tasks.join_next().await {
        let taken = r.unwrap().unwrap_or_else(|e| panic!("acquire: {e}"));
        leases.extend(taken);
    }
    leases
}

/// How one burst went.
struct Burst {
    retries: u64,
    given_up: u64,
    /// Calls that answered `Ok(false)`.
    gone: usize,
    /// Calls that failed: whether retryable, and the error.
    failed: Vec<(bool, String)>,
}

/// Takes every key through `locker`, then releases them all at once. The member is frozen for
/// a moment while the releases are sent, so that they reach it together, as one burst,
/// whatever the scheduler of two loaded cores does meanwhile.
async fn burst(locker: &Locker, snapshotter: &Snapshotter) -> Burst {
    let t0 = Instant::now();
    let leases = take_all(locker, |l, key| async move {
        l.acquire(key, Duration::from_secs(60)).await.map(Some)
    })
    .await;
    assert_eq!(leases.len(), LEASES);
    let acquired = t0.elapsed();
    node_ctl("etcd", NodeAction::Pause)
        .await
        .expect("pause etcd");
    let t1 = Instant::now();
    let mut releases = JoinSet::new();
    for lease in leases {
        releases.spawn(async move { lease.release().await });
    }
    tokio::time::sleep(FREEZE).await;
    node_ctl("etcd", NodeAction::Resume)
        .await
        .expect("resume etcd");
    // `Ok(false)` is allowed: a retry finds the key gone when an earlier attempt, whose
    // answer was lost in the overload, deleted it.
    let (mut gone, mut failed) = (0, Vec::new());
    while let Some(r) = releases.join_next().await {
        match r.unwrap() {
            Ok(held) => gone += usize::from(!held),
            Err(e) => failed.push((e.is_retryable(), e.to_string())),
        }
    }
    let released = t1.elapsed();
    assert!(
        settle(Duration::from_secs(20)).await,
        "background releases still running"
    );
    let c = counters(snapshotter);
    let b = Burst {
        retries: c.get(RELEASE_RETRIES),
        given_up: c.get(RELEASES_GIVEN_UP),
        gone,
        failed,
    };
    eprintln!(
        "{LEASES} leases: acquired in {acquired:?}, released in {released:?}, {} release \
         retries, {} found their key gone, {} calls failed",
        b.retries,
        b.gone,
        b.failed.len()
    );
    b
}

/// The burst: every release is started at once. The member refuses or fails to answer some
/// (the retry counter says so; a burst it absorbed is repeated, up to three times); a call
/// either goes through or says that its release goes on in the background; nothing is given
/// up, no key is left under the prefix, and a new session takes every key at once.
#[tokio::test]
async fn a_burst_release_through_too_many_requests_leaves_no_lock_held() {
    let ep = require_service!(Service::Etcd);
    let (snapshotter, _local) = record_here();
    let prefix = common::prefix("release-burst");
    let cfg = EtcdConfig::new(ep.urls().iter().cloned())
        .with_prefix(&prefix)
        .unwrap()
        .with_session_ttl(common::SESSION_TTL)
        .with_request_timeout(REQUEST_TIMEOUT);
    let locker = common::locker(EtcdBackend::connect(cfg).await.unwrap());
    let raw = common::raw(&ep).await;
    let mut refused = false;
    for _ in 0..3 {
        let b = burst(&locker, &snapshotter).await;
        // A member that applies a few thousand deletes a second cannot answer 10,000 within
        // the 5 s budget on two loaded cores: the calls it did not answer in time must say
        // that the release goes on in the background (the key count below shows it did).
        assert!(
            b.failed.iter().all(|(retryable, _)| *retryable),
            "release calls failed for good: {:?}",
            b.failed
        );
        // `gone` is not bounded: a retry after a timeout finds the key its first attempt
        // deleted once the member resumed. On two loaded cores the member may also leave the
        // session's keep-alive unanswered past its TTL (5 s): then the session is lost for
        // good, releases that could not delete answer that their key went with it, and the
        // session lease is revoked — so its keys go at once, and within its TTL at the latest
        // (no keep-alive renews it any more). Either way no key outlives our view of the
        // session.
        assert_eq!(b.given_up, 0);
        let deadline = Instant::now() + common::SESSION_TTL + Duration::from_secs(5);
        loop {
            let left = common::count(&raw, &prefix).await.unwrap();
            if left == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{left} keys left");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if b.retries > 0 {
            refused = true;
            break;
        }
    }
    assert!(
        refused,
        "no release met a transient fault: the burst tested nothing"
    );

    // A new session (its own connection) takes every key without waiting.
    let other = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    // One attempt each; a fault of the loaded member (no answer in time) is tried again.
    let taken = take_all(&other, |l, key| async move {
        loop {
            match l.try_acquire(key.as_str()).await {
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
                taken => return taken,
            }
        }
    })
    .await;
    assert_eq!(taken.len(), LEASES, "keys still held after the burst");
    // Their keys go with the other session's lease at the latest.
    drop(taken);
}
