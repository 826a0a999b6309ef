//! Redlock's timing rules as shipped, on real nodes slowed through the fault proxy: the per-node
//! timeout derived from the TTL (`ttl / 200`, within 5–50 ms) when none is configured, the
//! round that reaches a quorum with too little validity left, and the keys of requests that
//! land after their timeout, given back rather than left until their TTL.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{ErrorKind, Locker, Renewal};
use leasehold_redis::{RedlockBackend, RedlockConfig};
use leasehold_test_support::harness::locker;
use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::time::Instant;

/// One proxy in front of each Redlock node, and the `redis://` URL of each proxy.
async fn proxies(
    ep: &leasehold_test_support::services::Endpoints,
) -> (Vec<FaultProxy>, Vec<String>) {
    let mut proxies = Vec::new();
    for addr in ep.addrs() {
        proxies.push(FaultProxy::start(*addr).await.unwrap());
    }
    let urls = proxies
        .iter()
        .map(|p| format!("redis://{}", p.addr()))
        .collect();
    (proxies, urls)
}

fn shipped(urls: &[String], prefix: &str, ttl: Duration) -> Locker {
    // No with_node_timeout: the derivation from the TTL is what is tested.
    let config = RedlockConfig::from_urls(urls)
        .unwrap()
        .with_prefix(prefix)
        .unwrap();
    locker(RedlockBackend::new(config).unwrap(), ttl, Renewal::Off)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_node_timeout_follows_the_ttl_and_late_keys_are_given_back() {
    let ep = require_service!(Service::Redlock);
    let (proxies, urls) = proxies(&ep).await;
    let prefix = common::prefix("timing");
    let shipped_timeouts = [
        (Duration::from_millis(500), Duration::from_millis(5)), // ttl / 200 = 2.5 ms: at least 5
        (Duration::from_secs(2), Duration::from_millis(10)),    // ttl / 200
        (Duration::from_secs(20), Duration::from_millis(50)),   // ttl / 200 = 100 ms: at most 50
    ];
    // Each locker granted once first, so that its connections are open (at least a quorum's)
    // and the rounds below time requests alone (a first round waits for its connects before
    // the per-node timers start: see the last test).
    let mut lockers = Vec::new();
    for (ttl, _) in shipped_timeouts {
        let l = shipped(&urls, &prefix, ttl);
        let t0 = Instant::now();
        loop {
            match l.try_acquire("warm").await {
                Ok(Some(lease)) => {
                    lease.release().await.unwrap();
                    break;
                }
                outcome => assert!(t0.elapsed() < Duration::from_secs(10), "{outcome:?}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        lockers.push(l);
    }
    // Three of five nodes answer only after 800 ms or more: no quorum within any shipped
    // per-node timeout.
    for p in &proxies[..3] {
        p.latency(Duration::from_millis(400));
    }
    for ((ttl, per_node), l) in shipped_timeouts.into_iter().zip(lockers) {
        let key = format!("k{}", ttl.as_millis());
        let t0 = Instant::now();
        let err = l.try_acquire(&key).await.expect_err("2 of 5 nodes in time");
        let took = t0.elapsed();
        assert_eq!(err.kind(), ErrorKind::QuorumNotReached, "{err}");
        let causes: Vec<String> = err
            .node_errors()
            .iter()
            .map(|n| n.error.message().to_owned())
            .collect();
        // The slowed nodes, and a healthy one that a stall kept past so short a timeout.
        assert!(
            (3..=5).contains(&causes.len()),
            "one cause per slowed node: {err}"
        );
        for cause in &causes {
            assert_eq!(
                cause,
                &format!("no answer within {per_node:?}"),
                "ttl {ttl:?}: {err}"
            );
        }
        // It gave up at the node timeout, not when the slow answers came (800 ms).
        assert!(
            took < Duration::from_millis(600),
            "ttl {ttl:?}: took {took:?}"
        );
    }
    // The slowed nodes' SETs land 400 ms after they were sent, after the rounds gave up; each
    // is given back (its delete follows it on the connection), long before the longest TTL
    // (20 s) would remove it. Looked at after 1 s: before they land there is nothing to see
    // (a stall of more than ~600 ms would make this look too early, and pass, as before).
    tokio::time::sleep(Duration::from_secs(1)).await;
    common::no_lock_keys_left(ep.urls(), &prefix, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_with_too_little_validity_left_is_no_grant_and_leaves_no_key() {
    let ep = require_service!(Service::Redlock);
    let (proxies, urls) = proxies(&ep).await;
    let prefix = common::prefix("validity");
    // TTL 20 s, drift 20 s × 0.01 + 2 ms = 202 ms: a grant needs 19.7 s left, so the round
    // may take at most ~98 ms. The node timeout (1 s) lets slow answers count.
    let url = format!(
        "redlock://{}?prefix={prefix}&node_timeout_ms=1000&min_validity_ms=19700",
        urls.iter()
            .map(|u| u.trim_start_matches("redis://"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let backend = RedlockBackend::new(RedlockConfig::from_url(&url).unwrap()).unwrap();
    let l = locker(backend, Duration::from_secs(20), Renewal::Off);

    // Fast nodes: the validity left is well above the minimum. Tried a few times: the first
    // round also connects to every node, which a loaded machine can stretch past ~98 ms.
    let mut tries = Vec::new();
    let lease = loop {
        match l.try_acquire("fast").await {
            Ok(Some(lease)) => break lease,
            outcome if tries.len() < 4 => tries.push(outcome),
            outcome => panic!("no grant in time in 5 tries: {tries:?}, {outcome:?}"),
        }
    };
    assert!(lease.release().await.unwrap());

    // Every answer takes 200 ms or more: a quorum, but too late.
    for p in &proxies {
        p.latency(Duration::from_millis(100));
    }
    let err = l.try_acquire("slow").await.expect_err("no validity left");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("quorum reached"), "{err}");
    for p in &proxies {
        p.pass();
    }
    common::no_lock_keys_left(ep.urls(), &prefix, Duration::from_secs(5)).await;
}

/// A new backend's first round connects to each node before that node's timer starts: the
/// per-node timeout bounds the request, not a connect made once. Every node answers 300 ms
/// after a request (150 ms each way), so connecting (one round trip at least) and then
/// requesting takes 600 ms or more, against a per-node timeout of 450 ms: counted together,
/// no node would answer in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_backends_first_round_connects_outside_the_node_timeout() {
    let ep = require_service!(Service::Redlock);
    let (proxies, urls) = proxies(&ep).await;
    for p in &proxies {
        p.latency(Duration::from_millis(150));
    }
    let config = RedlockConfig::from_urls(&urls)
        .unwrap()
        .with_prefix(common::prefix("first-round"))
        .unwrap()
        .with_node_timeout(Duration::from_millis(450));
    let l = locker(
        RedlockBackend::new(config).unwrap(),
        Duration::from_secs(10),
        Renewal::Off,
    );
    let t0 = Instant::now();
    let lease = l.try_acquire("k").await.unwrap();
    let took = t0.elapsed();
    let lease = lease.expect("the first try of a new backend found the lock held");
    // The connect and the request, each at least one slowed round trip.
    assert!(took >= Duration::from_millis(600), "took {took:?}");
    assert!(
        lease.release().await.unwrap(),
        "the release found the lock gone"
    );
}
