//! `Locker::with_lock` on a real Redis: the work runs under the lease and the key is released
//! after; when the lock key is deleted behind the holder's back, the next renewal finds it gone
//! and the work is cancelled with `LeaseLost`.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_core::{ErrorKind, LockOptions, Locker};
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_on_redis_releases_after_and_a_deleted_key_cancels_the_work() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("with-lock");
    // A 1 s TTL, renewed every third of it.
    let locker = Locker::new(common::redis(ep.url(), &prefix).await)
        .with_options(LockOptions::default().with_ttl(Duration::from_secs(1)))
        .unwrap();
    let mut raw = redis::Client::open(ep.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let lock = format!("{prefix}{{k}}");

    let owner: Option<String> = locker
        .with_lock("k", Duration::from_secs(5), |_| {
            let mut raw = raw.clone();
            let lock = lock.clone();
            async move {
                redis::cmd("GET")
                    .arg(&lock)
                    .query_async(&mut raw)
                    .await
                    .unwrap()
            }
        })
        .await
        .unwrap();
    assert!(owner.is_some(), "the lock key exists while the work runs");
    let after: Option<String> = redis::cmd("GET")
        .arg(&lock)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(after, None, "released after the work");

    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    let deleter = {
        let (mut raw, lock) = (raw.clone(), lock.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let n: u64 = redis::cmd("DEL")
                .arg(&lock)
                .query_async(&mut raw)
                .await
                .unwrap();
            n
        })
    };
    let started = Instant::now();
    let err = locker
        .with_lock("k", Duration::from_secs(5), |_| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            done.store(true, Ordering::SeqCst);
        })
        .await
        .unwrap_err();
    assert_eq!(deleter.await.unwrap(), 1, "the key was there to delete");
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(!finished.load(Ordering::SeqCst));
    let again = locker.try_acquire("k").await.unwrap().expect("free");
    assert!(again.release().await.unwrap());
}
