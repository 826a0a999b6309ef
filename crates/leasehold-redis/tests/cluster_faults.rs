//! A Redis Cluster with one master stopped: locks on the surviving masters' slots keep working,
//! locks on the lost slots fail with a clear error, quickly; after the master returns, every
//! lock works again with the same backend.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{NodeAction, Service, node_ctl};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_master_fails_only_its_own_slots() {
    let ep = require_service!(Service::RedisCluster);
    let prefix = common::prefix("cluster_fault");
    let backend = common::redis_cluster(ep.urls(), &prefix).await;
    let l = common::locker(backend);
    let keys: Vec<String> = (0..24).map(|i| format!("k{i}")).collect();
    for k in &keys {
        let lease = l
            .try_acquire(k)
            .await
            .unwrap()
            .expect("healthy cluster grants");
        assert!(lease.release().await.unwrap());
    }

    node_ctl("rcluster3", NodeAction::Stop).await.unwrap();
    let outcome = AssertUnwindSafe(async {
        let (mut ok, mut failed) = (0, 0);
        for k in &keys {
            let t0 = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(10), l.try_acquire(k))
                .await
                .unwrap_or_else(|_| panic!("{k}: acquire hung with a master down"));
            let took = t0.elapsed();
            match r {
                Ok(Some(lease)) => {
                    ok += 1;
                    assert!(lease.release().await.unwrap());
                }
                Ok(None) => panic!("{k}: reported as held, but nobody holds it"),
                Err(e) => {
                    failed += 1;
                    assert!(
                        took < Duration::from_secs(5),
                        "{k}: failed only after {took:?}"
                    );
                    assert!(e.to_string().contains("redis"), "{e}");
                    eprintln!("{k}: failed after {took:?}: {e}");
                }
            }
        }
        assert!(
            ok > 0,
            "locks on the surviving masters' slots must keep working"
        );
        assert!(failed > 0, "locks on the stopped master's slots must fail");
    })
    .catch_unwind()
    .await;
    node_ctl("rcluster3", NodeAction::Start).await.unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }

    // The same backend recovers once the master is back (it rejoins with its slots, empty).
    let deadline = Instant::now() + Duration::from_secs(20);
    for k in &keys {
        loop {
            match l.try_acquire(k).await {
                Ok(Some(lease)) => {
                    assert!(lease.release().await.unwrap());
                    break;
                }
                other => {
                    assert!(Instant::now() < deadline, "{k} still failing: {other:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}
