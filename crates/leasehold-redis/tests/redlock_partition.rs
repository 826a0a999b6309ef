//! Redlock over five Redis nodes, each in a network namespace of its own
//! (`leasehold_test_support::netns`, needs root), the client in the root namespace, under real
//! partitions: two nodes cut off → acquisitions still succeed; three → each acquisition fails
//! cleanly within the per-node timeout, with one cause per unreachable node; healed → the same
//! backend, not rebuilt, reaches all five again. Own test binary: one partition at a time.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{ErrorKind, Renewal};
use leasehold_test_support::harness::locker;
use leasehold_test_support::netns::Net;
use tokio::time::Instant;

/// The per-node timeout of `common::redlock`.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioning_two_of_five_is_survived_and_three_fails_fast_with_causes() {
    let net = Net::create("redlock", 5).unwrap_or_else(|e| panic!("netns: {e}"));
    let mut urls = Vec::new();
    for i in 1..=5 {
        urls.push(
            net.redis(i)
                .await
                .unwrap_or_else(|e| panic!("redis {i}: {e}")),
        );
    }
    let prefix = common::prefix("partition");
    let backend = common::redlock(&urls, &prefix);
    let l = locker(backend.clone(), Duration::from_secs(5), Renewal::Off);
    // Connected to every node before the partition.
    for i in 0..3 {
        let lease = l.try_acquire(format!("warm{i}")).await.unwrap();
        assert!(lease.expect("a free key").release().await.unwrap());
    }

    net.cut(4).unwrap();
    net.cut(5).unwrap();
    for i in 0..5 {
        let a = l
            .try_acquire(format!("k{i}"))
            .await
            .unwrap_or_else(|e| panic!("3 of 5 nodes reachable: {e}"))
            .expect("a free key");
        assert!(a.release().await.unwrap());
    }

    net.cut(3).unwrap();
    for i in 0..5 {
        let t0 = Instant::now();
        let err = l
            .try_acquire(format!("q{i}"))
            .await
            .expect_err("2 of 5 reachable nodes cannot grant");
        let took = t0.elapsed();
        assert_eq!(err.kind(), ErrorKind::QuorumNotReached, "{err}");
        assert_eq!(err.node_errors().len(), 3, "one cause per cut node: {err}");
        for cut in 3..=5 {
            let addr = net.addr(cut).to_string();
            assert!(
                err.node_errors().iter().any(|n| n.node.contains(&addr)),
                "no cause names cut node {addr}: {err}"
            );
        }
        assert!(
            took < NODE_TIMEOUT + Duration::from_millis(450),
            "took {took:?}: {err}"
        );
        if i == 0 {
            eprintln!("3 of 5 cut: failed after {took:?}: {err}");
        }
    }

    for n in 3..=5 {
        net.heal(n).unwrap();
    }
    let t0 = Instant::now();
    let back = loop {
        match l.try_acquire("healed").await {
            Ok(Some(lease)) => break lease,
            Ok(None) => panic!("nobody else holds this key"),
            Err(e) if t0.elapsed() > Duration::from_secs(20) => {
                panic!("the same backend never reached the healed nodes: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    eprintln!("healed: acquired again after {:?}", t0.elapsed());
    // All five nodes have the key: the healed ones serve the same backend again.
    let direct = common::redlock(&urls, &prefix);
    let counts = direct.count_lock_keys("healed").await.unwrap();
    assert!(back.release().await.unwrap());
    assert_eq!(
        counts.iter().filter(|c| **c == 1).count(),
        5,
        "per-node keys: {counts:?}"
    );
}
