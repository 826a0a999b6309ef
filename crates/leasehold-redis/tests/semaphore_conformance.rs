//! The semaphore checks on one real Redis server and a real 3-master Redis Cluster; Redlock
//! refuses semaphores with its reason.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{ErrorKind, LockBackend, PermitLimit, Semaphore};
use leasehold_test_support::conformance::Target;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

fn target_of(
    primary: leasehold_redis::RedisBackend,
    other: leasehold_redis::RedisBackend,
) -> Target {
    Target::new(
        Arc::new(primary),
        Arc::new(other),
        Duration::from_millis(300),
    )
}

mod single {
    use super::*;

    async fn target() -> Option<Target> {
        let ep = require_service!(Service::Redis, None);
        let prefix = common::prefix("semaphore");
        let (a, b) = (
            common::redis(ep.url(), &prefix).await,
            common::redis(ep.url(), &prefix).await,
        );
        Some(target_of(a, b))
    }

    leasehold_test_support::semaphore_tests!(target);
}

mod cluster {
    use super::*;

    async fn target() -> Option<Target> {
        let ep = require_service!(Service::RedisCluster, None);
        let prefix = common::prefix("semaphore");
        let a = common::redis_cluster(ep.urls(), &prefix).await;
        let b = common::redis_cluster(ep.urls(), &prefix).await;
        Some(target_of(a, b))
    }

    leasehold_test_support::semaphore_tests!(target);
}

/// A semaphore and a lock on one key name are independent: holding every permit leaves the
/// lock free, and holding the lock leaves the permits free.
#[tokio::test]
async fn a_semaphore_and_a_lock_on_one_key_do_not_collide() {
    let ep = require_service!(Service::Redis);
    let backend = common::redis(ep.url(), &common::prefix("sem-vs-lock")).await;
    let locker = common::locker(backend.clone());
    let sem = Semaphore::from_locker(&locker, PermitLimit::new(1).unwrap()).unwrap();
    let permit = sem.try_acquire("k").await.unwrap().expect("a free permit");
    let lock = locker
        .try_acquire("k")
        .await
        .unwrap()
        .expect("the lock is free");
    assert!(sem.try_acquire("k").await.unwrap().is_none());
    assert_eq!(
        locker.inspect("k").await.unwrap().and_then(|h| h.owner),
        Some(lock.owner().clone())
    );
    assert_eq!(sem.holders("k").await.unwrap().len(), 1);
    assert!(permit.release().await.unwrap());
    assert!(lock.release().await.unwrap());
}

/// Redlock refuses semaphores, saying why, and says so in its capabilities.
#[tokio::test]
async fn redlock_refuses_semaphores_with_its_reason() {
    let ep = require_service!(Service::Redlock);
    let backend: Arc<dyn LockBackend> =
        Arc::new(common::redlock(ep.urls(), &common::prefix("sem")));
    assert!(!backend.capabilities().semaphores);
    let err = Semaphore::from_arc(backend, PermitLimit::new(3).unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    let text = err.to_string();
    assert!(text.contains("redlock does not give semaphores"), "{text}");
    assert!(text.contains("keeps no count"), "{text}");
}

/// Semaphore waiters do not announce themselves (their acquire is a script on the server's
/// clock anyway): a permit's release always publishes on `…:sem:released`, with or without a
/// waiter, so a waiter whose fallback backoff is 30 s gets the permit within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_always_publishes_and_wakes_a_waiter() {
    use futures_util::StreamExt as _;
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("sem-wake");
    let mut messages = common::messages(ep.url(), &format!("{prefix}{{k}}:sem:released")).await;
    let limit = PermitLimit::new(1).unwrap();
    let a = Semaphore::from_locker(
        &common::locker(common::redis(ep.url(), &prefix).await),
        limit,
    )
    .unwrap();
    let b = Semaphore::from_locker(
        &common::locker(common::redis_slow_fallback(ep.url(), &prefix).await),
        limit,
    )
    .unwrap();
    let permit = a.try_acquire("k").await.unwrap().expect("a free permit");
    assert!(permit.release().await.unwrap());
    let alone = tokio::time::timeout(Duration::from_secs(5), messages.next()).await;
    assert!(
        matches!(alone, Ok(Some(_))),
        "a release with nobody waiting published nothing"
    );
    let permit = a.try_acquire("k").await.unwrap().expect("a free permit");
    let waiting = tokio::spawn(async move { b.acquire("k", Duration::from_secs(25)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = tokio::time::Instant::now();
    assert!(permit.release().await.unwrap());
    let got = waiting.await.unwrap().unwrap();
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the waiter took {took:?}: it waited for its fallback"
    );
    assert!(got.release().await.unwrap());
}
