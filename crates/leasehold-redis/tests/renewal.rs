//! The renewal engine on real Redis: many leases renewed in batches, each with its own outcome.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{Lease, Locker, LossReason, Renewal};
use leasehold_redis::RedisBackend;
use leasehold_test_support::harness;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::time::Instant;

/// A renewing locker with `ttl` over `backend`, and `n` leases taken from it on keys
/// `<tag>0 .. <tag>n`.
async fn renewing(
    backend: RedisBackend,
    ttl: Duration,
    tag: &str,
    n: usize,
) -> (Locker, Vec<Lease>) {
    let l = harness::locker(backend, ttl, Renewal::Auto);
    let leases = take_many(&l, tag, n).await;
    (l, leases)
}

/// Takes `n` leases on keys `<tag>0 .. <tag>n`, 100 requests at a time.
async fn take_many(l: &Locker, tag: &str, n: usize) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(n);
    for start in (0..n).step_by(100) {
        let batch = (start..(start + 100).min(n)).map(|i| l.try_acquire(format!("{tag}{i}")));
        for r in join_all(batch).await {
            leases.push(r.unwrap().expect("a fresh key is free"));
        }
    }
    leases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_2000_leases_only_the_one_whose_key_was_deleted_by_hand_is_lost() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("renew-2k");
    let backend = common::redis(ep.url(), &prefix).await;
    let ttl = Duration::from_secs(3);
    let (_locker, leases) = renewing(backend.clone(), ttl, "k", 2_000).await;
    let taken = Instant::now();

    let victim = &leases[777];
    let client = redis::Client::open(ep.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{prefix}{{{}}}", victim.key());
    let deleted: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the victim's key {key} existed");

    // The next renewal (within one interval, ttl / 3) finds it gone.
    let reason = tokio::time::timeout(ttl, victim.lost().wait()).await;
    assert_eq!(reason.expect("lost within a TTL"), LossReason::NotHeld);

    // Two TTLs after the grants, every other lease is still held: renewed, batch after batch.
    tokio::time::sleep_until(taken + 2 * ttl).await;
    for (i, lease) in leases.iter().enumerate() {
        if i == 777 {
            continue;
        }
        assert_eq!(
            lease.loss_reason(),
            None,
            "lease {i} ({}) was lost",
            lease.key()
        );
        assert!(
            lease.valid_until() > Instant::now(),
            "lease {i} past its deadline"
        );
    }
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("{prefix}{{k1}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        pttl > 0,
        "a renewed key still has its TTL on the server: {pttl}"
    );

    let released = join_all(leases.iter().map(Lease::release)).await;
    let held = released
        .into_iter()
        .filter(|r| *r.as_ref().unwrap())
        .count();
    assert_eq!(held, 1_999, "every lease but the victim was still ours");
    assert_eq!(backend.count_lock_keys("").await.unwrap(), 0);
}

/// Redlock over five nodes with a per-node timeout of 50 ms (the top of the default's range):
/// 2,000 leases renewed batch after batch for three TTLs, none lost, then released all at
/// once, every release answered. Batches and bursts queue behind each other on each node's one
/// connection: with that bound on each request, releases timed out on a loaded machine
/// (`quorum 3 of 5 not reached`, every node "no answer within 50ms").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_2000_leases_stay_renewed_and_go_in_one_release_burst() {
    let ep = require_service!(Service::Redlock);
    let prefix = common::prefix("renew-redlock");
    let ttl = Duration::from_secs(3);
    let l = harness::locker(common::redlock(ep.urls(), &prefix), ttl, Renewal::Auto);
    // Waiting acquisitions: one attempt whose nodes answer late on a loaded machine tries again.
    let mut leases = Vec::with_capacity(2_000);
    for start in (0..2_000).step_by(100) {
        let batch =
            (start..start + 100).map(|i| l.acquire(format!("r{i}"), Duration::from_secs(30)));
        for r in join_all(batch).await {
            leases.push(r.unwrap());
        }
    }
    tokio::time::sleep(3 * ttl).await;
    let lost: Vec<_> = leases
        .iter()
        .filter_map(|l| l.loss_reason().map(|r| (l.key().to_string(), r)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of 2,000 leases lost while held, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    let released = join_all(leases.iter().map(Lease::release)).await;
    assert!(
        released.into_iter().all(|r| r.unwrap()),
        "a lease was not ours any more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_times_out_leaves_each_lease_to_its_own_deadline() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("renew-timeout");
    let (backend, proxy) =
        common::redis_behind_proxy(&ep, &prefix, Duration::from_millis(300)).await;
    let ttl = Duration::from_secs(2);
    let l = harness::locker(backend, ttl, Renewal::Auto);
    // Three groups, 400 ms apart: their renewals (every ttl / 3) fall in different batches.
    let mut leases = Vec::new();
    for g in 0..3 {
        leases.extend(take_many(&l, &format!("g{g}-"), 50).await);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let leases: Vec<Arc<Lease>> = leases.into_iter().map(Arc::new).collect();
    // Held past the first TTL: renewed.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(
        leases.iter().all(|l| !l.is_lost()),
        "lost while the server answered"
    );

    proxy.blackhole();
    let holed = Instant::now();
    let watchers: Vec<_> = leases
        .iter()
        .map(|lease| {
            let lost = lease.lost();
            tokio::spawn(async move {
                let reason = lost.wait().await;
                (reason, Instant::now())
            })
        })
        .collect();
    // Meanwhile no lease may look held past its deadline.
    while watchers.iter().any(|w| !w.is_finished()) {
        let now = Instant::now();
        for lease in &leases {
            if now >= lease.valid_until() {
                assert!(
                    lease.is_lost(),
                    "{} reported held past its deadline",
                    lease.key()
                );
            }
        }
        assert!(
            holed.elapsed() < 3 * ttl,
            "leases still held long after the black hole"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut deadlines = Vec::new();
    for (lease, w) in leases.iter().zip(watchers) {
        let (reason, at) = w.await.unwrap();
        let deadline = lease.valid_until();
        assert!(
            matches!(reason, LossReason::Expired | LossReason::RenewalFailed(_)),
            "{}: {reason:?}",
            lease.key()
        );
        // Lost at its own deadline: not when the batch failed, and not long after.
        assert!(
            at >= deadline,
            "{} lost {:?} early",
            lease.key(),
            deadline - at
        );
        assert!(
            at - deadline < Duration::from_millis(500),
            "{} lost {:?} after its deadline",
            lease.key(),
            at - deadline
        );
        deadlines.push(deadline);
    }
    // The failed batches did not end the leases together: each went at its own deadline.
    let first = *deadlines.iter().min().unwrap();
    let last = *deadlines.iter().max().unwrap();
    assert!(first > holed, "a lease was lost before the black hole");
    assert!(
        last - first >= Duration::from_millis(100),
        "every lease ended within {:?}: together, not at their own deadlines",
        last - first
    );
    proxy.pass();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_leases_of_many_slots_renew_in_one_call_per_master() {
    let ep = require_service!(Service::RedisCluster);
    let prefix = common::prefix("renew-cluster");
    let backend = common::redis_cluster(ep.urls(), &prefix).await;
    // 600 distinct keys: they fall on ~590 slots, spread over every master.
    let (_locker, leases) = renewing(backend, Duration::from_millis(1_500), "c", 600).await;
    let mut before = Vec::new();
    for url in ep.urls() {
        before.push(common::commandstats::script_calls(url).await);
    }
    // Three renewal periods (ttl / 3 each).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut calls = 0;
    for (url, b) in ep.urls().iter().zip(before) {
        calls += common::commandstats::script_calls(url).await - b;
    }
    assert!(leases.iter().all(|l| !l.is_lost()), "a lease was lost");
    // One call per slot would be ~1,800; per master it is a few per batch. Other tests on the
    // cluster add some: the bound has room for them.
    assert!(
        calls < 600,
        "{calls} script calls for 600 leases over 3 periods: not batched per master"
    );
    let released = join_all(leases.iter().map(Lease::release)).await;
    assert!(
        released.iter().all(|r| *r.as_ref().unwrap()),
        "every lease was still ours"
    );
}
