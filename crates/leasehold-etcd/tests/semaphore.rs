//! Semaphores on etcd: the semaphore checks on the single member in both lease modes and on the
//! 3-member cluster, and the layout read back with a raw client: the holders are the keys with
//! the lowest create revisions, a waiter is woken by the release of any holder ahead of it,
//! and the limit is stored next to the range, apart from the lock of the same name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use leasehold_core::{ErrorKind, Lease, LockBackend, LockKey, PermitLimit, Semaphore};
use leasehold_etcd::{EtcdBackend, LeaseMode, semaphore_limit_key, semaphore_prefix};
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

mod session {
    use leasehold_etcd::LeaseMode;
    use leasehold_test_support::conformance::Target;
    use leasehold_test_support::services::Service;

    async fn target() -> Option<Target> {
        super::common::target(Service::Etcd, LeaseMode::Session, "etcd-sem-session").await
    }

    leasehold_test_support::semaphore_tests!(target);
}

mod per_lock {
    use leasehold_etcd::LeaseMode;
    use leasehold_test_support::conformance::Target;
    use leasehold_test_support::services::Service;

    async fn target() -> Option<Target> {
        super::common::target(Service::Etcd, LeaseMode::PerLock, "etcd-sem-per-lock").await
    }

    leasehold_test_support::semaphore_tests!(target);
}

mod cluster {
    use leasehold_etcd::LeaseMode;
    use leasehold_test_support::conformance::Target;
    use leasehold_test_support::services::Service;

    async fn target() -> Option<Target> {
        super::common::target(Service::EtcdCluster, LeaseMode::Session, "etcd-sem-cluster").await
    }

    leasehold_test_support::semaphore_tests!(target);
}

fn semaphore(backend: &EtcdBackend, limit: u32) -> Semaphore {
    let locker = common::locker(backend.clone());
    Semaphore::from_locker(&locker, PermitLimit::new(limit).unwrap()).unwrap()
}

/// Every key under `range`, oldest first: `(owner value, create revision)`.
async fn queue(client: &Client, range: &str) -> Vec<(String, u64)> {
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let resp = client.kv_client().get(range, Some(opts)).await.unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            let owner = String::from_utf8_lossy(kv.value()).into_owned();
            (owner, kv.create_revision().unsigned_abs())
        })
        .collect()
}

/// Waits (at most 10 s) until `range` holds `n` keys.
async fn settle(client: &Client, range: &str, n: usize) -> Vec<(String, u64)> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = queue(client, range).await;
        if now.len() == n || Instant::now() > until {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn owner_and_token(lease: &Lease) -> (String, u64) {
    let token = lease.fencing_token().map(|t| t.get()).unwrap();
    (lease.owner().as_str().to_owned(), token)
}

fn wait_for(sem: &Semaphore, key: &str) -> JoinHandle<Lease> {
    let (sem, key) = (sem.clone(), key.to_owned());
    tokio::spawn(async move {
        sem.acquire(key.as_str(), Duration::from_secs(30))
            .await
            .unwrap()
    })
}

/// With N = 2: the holders are the two oldest keys of the range (their tokens are those keys'
/// create revisions, and `holders` lists exactly them); waiters queue behind them by revision,
/// a cancelled waiter's key is deleted, and a release by the *second* holder (not the one
/// just ahead of the queue's oldest) wakes the first waiter at once, the second staying queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_are_the_lowest_revisions_and_a_release_wakes_the_next_waiter() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("sem-order");
    let client = common::raw(&ep).await;
    let a = common::backend(&ep, &prefix, LeaseMode::Session).await;
    let b = common::backend(&ep, &prefix, LeaseMode::Session).await;
    let (sa, sb) = (semaphore(&a, 2), semaphore(&b, 2));
    let range = semaphore_prefix(&prefix, &LockKey::new("jobs").unwrap());

    let first = sa
        .try_acquire("jobs")
        .await
        .unwrap()
        .expect("a free permit");
    let second = sb
        .try_acquire("jobs")
        .await
        .unwrap()
        .expect("a free permit");
    assert!(sa.try_acquire("jobs").await.unwrap().is_none());
    let held = vec![owner_and_token(&first), owner_and_token(&second)];
    assert_eq!(queue(&client, &range).await, held);
    let listed: Vec<_> = sa.holders("jobs").await.unwrap();
    let listed: Vec<_> = listed
        .iter()
        .map(|h| {
            (
                h.owner.clone().unwrap().as_str().to_owned(),
                h.fencing.unwrap().get(),
            )
        })
        .collect();
    assert_eq!(listed, held);

    // Two waiters queue in order; a third gives up, and its key goes.
    let w1 = wait_for(&sa, "jobs");
    settle(&client, &range, 3).await;
    let w2 = wait_for(&sb, "jobs");
    settle(&client, &range, 4).await;
    let gives_up = wait_for(&sb, "jobs");
    assert_eq!(settle(&client, &range, 5).await.len(), 5);
    gives_up.abort();
    assert!(gives_up.await.unwrap_err().is_cancelled());
    let waiting = settle(&client, &range, 4).await;
    assert_eq!(
        waiting.len(),
        4,
        "the cancelled waiter's key stayed: {waiting:?}"
    );
    assert!(!w1.is_finished() && !w2.is_finished());

    let released = Instant::now();
    assert!(second.release().await.unwrap());
    let p1 = timeout(Duration::from_secs(10), w1).await.unwrap().unwrap();
    let woke = released.elapsed();
    assert!(
        woke < Duration::from_secs(5),
        "woken {woke:?} after a release"
    );
    assert_eq!(owner_and_token(&p1), waiting[2], "not the oldest waiter");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !w2.is_finished(),
        "the second waiter was granted a third permit"
    );
    let now: Vec<_> = sa.holders("jobs").await.unwrap();
    assert_eq!(now.len(), 2);
    assert_eq!(now[1].fencing.map(|t| t.get()), Some(waiting[2].1));

    assert!(first.release().await.unwrap());
    let p2 = timeout(Duration::from_secs(10), w2).await.unwrap().unwrap();
    assert_eq!(owner_and_token(&p2), waiting[3]);
    assert!(p2.fencing_token() > p1.fencing_token());
    assert!(p1.release().await.unwrap() && p2.release().await.unwrap());
    assert!(queue(&client, &range).await.is_empty());
}

/// A lock and a semaphore on one key name are independent; the limit is stored in its own key
/// (readable with etcdctl), refuses another limit while a permit is held, and is replaced by
/// the next client once the range is empty.
#[tokio::test]
async fn the_limit_is_stored_apart_and_replaced_once_nobody_holds() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("sem-limit");
    let client = common::raw(&ep).await;
    let backend = common::backend(&ep, &prefix, LeaseMode::Session).await;
    let locker = common::locker(backend.clone());
    let one = semaphore(&backend, 1);
    let permit = one.try_acquire("k").await.unwrap().expect("a free permit");
    let lock = locker
        .try_acquire("k")
        .await
        .unwrap()
        .expect("the lock is free");
    assert!(one.try_acquire("k").await.unwrap().is_none());
    let limit_key = semaphore_limit_key(&prefix, &LockKey::new("k").unwrap());
    let stored = client
        .kv_client()
        .get(limit_key.as_str(), None)
        .await
        .unwrap();
    assert_eq!(stored.kvs().first().map(|kv| kv.value()), Some(&b"1"[..]));
    assert_eq!(stored.kvs().first().map(|kv| kv.lease()), Some(0));

    let three = semaphore(&backend, 3);
    let err = three.try_acquire("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(permit.release().await.unwrap());
    let again = three
        .try_acquire("k")
        .await
        .unwrap()
        .expect("a free permit");
    let err = one.acquire("k", Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(again.release().await.unwrap() && lock.release().await.unwrap());
}

/// The etcd backend says it gives semaphores, and its permit view is refused nothing.
#[tokio::test]
async fn capabilities_say_semaphores() {
    let ep = require_service!(Service::Etcd);
    let backend: Arc<dyn LockBackend> =
        Arc::new(common::backend(&ep, &common::prefix("sem-caps"), LeaseMode::Session).await);
    assert!(backend.capabilities().semaphores);
    let sem = Semaphore::from_arc(backend, PermitLimit::new(4).unwrap()).unwrap();
    assert_eq!(sem.limit().get(), 4);
}
