//! Fault injection on the 3-member etcd cluster: losing the leader keeps leases; losing quorum
//! loses them, and nobody acquires until quorum returns. Every member is started again at the
//! end of each test, even when it fails (see `Restore`). Own test binary: these tests stop
//! cluster members, which must not disturb other tests.

mod common;

use std::time::Duration;

use leasehold_etcd::LeaseMode;
use leasehold_test_support::etcd::leader_index;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{self, Endpoints, NodeAction, Service};
use tokio::time::{Instant, sleep, timeout};

const NODES: [&str; 3] = ["etcd-c1", "etcd-c2", "etcd-c3"];

/// One fault test at a time.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts every cluster member again when dropped (a no-op for members that run).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        for node in NODES {
            let out = std::process::Command::new("bash")
                .arg(services::services_script())
                .arg("start")
                .arg(node)
                .output();
            if let Err(e) = out {
                eprintln!("could not restart {node}: {e}");
            }
        }
    }
}

/// The node name of the current leader (endpoints are in etcd-c1..3 order).
async fn leader(ep: &Endpoints) -> &'static str {
    let i = leader_index(ep.urls())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    NODES[i]
}

async fn ctl(node: &str, action: NodeAction) {
    if let Err(e) = services::node_ctl(node, action).await {
        panic!("{action} {node}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_the_lease_and_the_exclusion() {
    let ep = require_service!(Service::EtcdCluster);
    let _serial = CLUSTER.lock().await;
    let _restore = Restore;
    let prefix = common::prefix("leader-kill");
    let holder = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let other = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let lease = holder.try_acquire("job").await.unwrap().expect("free lock");
    let leader = leader(&ep).await;
    ctl(leader, NodeAction::Stop).await;
    let t0 = Instant::now();
    let (mut refused, mut failed) = (0, 0);
    // Two session TTLs: the lease must be renewed through the new leader.
    while t0.elapsed() < common::SESSION_TTL * 2 {
        assert!(
            !lease.is_lost(),
            "lease lost after the leader died: {:?}",
            lease.loss_reason()
        );
        match timeout(Duration::from_secs(4), other.try_acquire("job")).await {
            Ok(Ok(Some(_))) => panic!("a second holder appeared after the leader died"),
            Ok(Ok(None)) => refused += 1,
            Ok(Err(_)) | Err(_) => failed += 1,
        }
        sleep(Duration::from_millis(250)).await;
    }
    eprintln!("leader {leader} stopped: {refused} refused, {failed} failed tries");
    assert!(refused > 0, "no try was answered while a member was down");
    assert!(!lease.is_lost());
    ctl(leader, NodeAction::Start).await;
    assert!(
        lease.release().await.unwrap(),
        "the lease did not survive the leader's death"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_quorum_fires_lost_and_blocks_until_quorum_returns() {
    let ep = require_service!(Service::EtcdCluster);
    let _serial = CLUSTER.lock().await;
    let _restore = Restore;
    let prefix = common::prefix("quorum");
    let holder = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let other = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let lease = holder.try_acquire("job").await.unwrap().expect("free lock");
    let survivor = leader(&ep).await; // keep the leader up; stop the two followers
    let stopped: Vec<&str> = NODES.into_iter().filter(|n| *n != survivor).collect();
    for node in &stopped {
        ctl(node, NodeAction::Stop).await;
    }
    let t0 = Instant::now();
    let lost = timeout(
        common::SESSION_TTL + Duration::from_secs(3),
        lease.lost().wait(),
    )
    .await;
    let after = t0.elapsed();
    let reason = lost.expect("the lost signal did not fire without quorum");
    eprintln!("quorum lost: lost signal after {after:?}: {reason}");
    // Nobody can acquire without quorum.
    for _ in 0..3 {
        let tried = timeout(Duration::from_secs(5), other.try_acquire("job")).await;
        assert!(!matches!(tried, Ok(Ok(Some(_)))), "acquired without quorum");
    }
    let waited = other.acquire("job", Duration::from_secs(2)).await;
    assert!(waited.is_err(), "acquired without quorum");
    for node in &stopped {
        ctl(node, NodeAction::Start).await;
    }
    // With quorum back, the old lease expires (nobody renews it) and the lock is free again.
    let t1 = Instant::now();
    let next = other.acquire("job", Duration::from_secs(30)).await.unwrap();
    eprintln!(
        "quorum back: acquired {:?} after the members restarted",
        t1.elapsed()
    );
    assert!(next.fencing_token() > lease.fencing_token());
    assert!(!lease.release().await.unwrap());
    assert!(next.release().await.unwrap());
    // The holder's backend serves new locks on a new session.
    let again = holder
        .acquire("job", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(again.release().await.unwrap());
}
