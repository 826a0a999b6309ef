//! Elections on one real Redis server and on a real Redis Cluster: the election checks, the
//! names (an election never touches the lock of its key), and Redlock's refusal.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Candidate, Elector, ErrorKind, LockBackend, Locker};
use leasehold_redis::RedisBackend;
use leasehold_test_support::conformance::election::ElectionTarget;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

/// Without an expiry hook the loss check lets an unrenewed leadership expire (1 s TTL); the
/// wait is native (a wake-up on release), so a hand-over is far under the TTL.
fn target_of(primary: RedisBackend, other: RedisBackend) -> ElectionTarget {
    let (primary, other): (Arc<dyn LockBackend>, Arc<dyn LockBackend>) =
        (Arc::new(primary), Arc::new(other));
    ElectionTarget::new(
        primary,
        other,
        Duration::from_secs(1),
        Duration::from_millis(500),
    )
}

mod single {
    use super::*;

    async fn target() -> Option<ElectionTarget> {
        let ep = require_service!(Service::Redis, None);
        let prefix = common::prefix("redis-elect");
        let (a, b) = (
            common::redis(ep.url(), &prefix).await,
            common::redis(ep.url(), &prefix).await,
        );
        Some(target_of(a, b))
    }

    leasehold_test_support::election_tests!(target);
}

mod cluster {
    use super::*;

    async fn target() -> Option<ElectionTarget> {
        let ep = require_service!(Service::RedisCluster, None);
        let prefix = common::prefix("cluster-elect");
        let (a, b) = (
            common::redis_cluster(ep.urls(), &prefix).await,
            common::redis_cluster(ep.urls(), &prefix).await,
        );
        Some(target_of(a, b))
    }

    leasehold_test_support::election_tests!(target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_keeps_to_its_own_names() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("elect-names");
    let backend = common::redis(ep.url(), &prefix).await;
    let raw = redis::Client::open(ep.url()).unwrap_or_else(|e| panic!("{e}"));
    let mut conn = raw
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let shared: Arc<dyn LockBackend> = Arc::new(backend);
    let options =
        leasehold_test_support::harness::options(Duration::from_secs(5), Default::default());
    let me = Candidate::new("10.0.0.1:80").unwrap_or_else(|e| panic!("{e}"));
    let e = Elector::new(Arc::clone(&shared), "job", me, options).unwrap_or_else(|e| panic!("{e}"));
    let lead = e
        .campaign_for(Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let lock = Locker::from_arc(shared).try_acquire("job").await;
    assert!(
        lock.unwrap_or_else(|e| panic!("{e}")).is_some(),
        "the election took the lock"
    );
    let stored: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}{{job}}:elect:leader"))
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(stored.is_some_and(|s| s.ends_with("\n10.0.0.1:80")));
    let fence: Option<u64> = redis::cmd("GET")
        .arg(format!("{prefix}{{job}}:elect:fence"))
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        fence,
        Some(lead.term().get()),
        "the term is the election's fence counter"
    );
    assert!(lead.resign().await.unwrap_or_else(|e| panic!("{e}")));
    let left: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}{{job}}:elect:leader"))
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(left, None, "resigning removes the value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_elections_with_a_reason() {
    let ep = require_service!(Service::Redlock);
    let backend: Arc<dyn LockBackend> =
        Arc::new(common::redlock(ep.urls(), &common::prefix("redlock-elect")));
    assert!(!backend.capabilities().elections);
    let me = Candidate::new("x").unwrap_or_else(|e| panic!("{e}"));
    let err = Elector::new(backend, "k", me, Default::default()).err();
    let err = err.unwrap_or_else(|| panic!("Redlock gave an election"));
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("elections"), "{err}");
}

/// An election waits as a lock does under the release wake-ups that publish only to announced
/// waiters: the waiting candidate puts itself on the wait list under the election's names
/// (`…:elect:waitlist`), and the leader's resignation publishes on its channel
/// (`…:elect:released:<owner>`), so the candidate, whose fallback backoff is 30 s, leads
/// within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_candidate_is_woken_by_the_resignation() {
    use futures_util::StreamExt as _;
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("elect-wake");
    let mut messages = common::messages(ep.url(), &format!("{prefix}{{job}}:elect:released")).await;
    let raw = redis::Client::open(ep.url()).unwrap_or_else(|e| panic!("{e}"));
    let mut conn = raw
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let options =
        leasehold_test_support::harness::options(Duration::from_secs(5), Default::default());
    let elector = |backend: RedisBackend, who: &str| {
        let backend: Arc<dyn LockBackend> = Arc::new(backend);
        let me = Candidate::new(who).unwrap_or_else(|e| panic!("{e}"));
        Elector::new(backend, "job", me, options.clone()).unwrap_or_else(|e| panic!("{e}"))
    };
    let a = elector(common::redis(ep.url(), &prefix).await, "10.0.0.1:80");
    let b = elector(
        common::redis_slow_fallback(ep.url(), &prefix).await,
        "10.0.0.2:80",
    );
    let lead = a
        .campaign_for(Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let waiting = tokio::spawn(async move { b.campaign_for(Duration::from_secs(25)).await });
    let announced = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n: i64 = redis::cmd("EXISTS")
            .arg(format!("{prefix}{{job}}:elect:waitlist"))
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if n == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < announced,
            "the waiting candidate never announced itself"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resigned = tokio::time::Instant::now();
    assert!(lead.resign().await.unwrap_or_else(|e| panic!("{e}")));
    let woke = tokio::time::timeout(Duration::from_secs(5), messages.next()).await;
    assert!(
        matches!(woke, Ok(Some(_))),
        "the resignation published no wake-up"
    );
    let next = waiting
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    let took = resigned.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the hand-over took {took:?}: the candidate waited for its fallback"
    );
    assert!(next.resign().await.unwrap_or_else(|e| panic!("{e}")));
}
