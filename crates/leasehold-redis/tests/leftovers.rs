//! What a key leaves on the server after its lock is released: the fence counter alone, kept for
//! ever by default, or expiring with `fence_ttl` while tokens still increase.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{LockOptions, Locker, Renewal};
use leasehold_redis::{RedisBackend, RedisConfig};
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use redis::aio::MultiplexedConnection;

async fn raw(url: &str) -> MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Every key under `prefix`, sorted.
async fn keys(conn: &mut MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .unwrap();
    keys.sort();
    keys
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

async fn locker(url: &str) -> Locker {
    let backend = RedisBackend::connect(RedisConfig::from_url(url).unwrap())
        .await
        .unwrap();
    Locker::new(backend)
        .with_options(LockOptions::default().with_renewal(Renewal::Off))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lock_leaves_its_fence_counter_alone_and_for_ever() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("leftover");
    let mut conn = raw(ep.url()).await;
    let l = locker(&format!("{}?prefix={prefix}", ep.url())).await;
    for _ in 0..3 {
        let lease = l.try_acquire("k").await.unwrap().expect("free");
        assert!(lease.release().await.unwrap());
    }
    let fence = format!("{prefix}{{k}}:fence");
    assert_eq!(keys(&mut conn, &prefix).await, std::slice::from_ref(&fence));
    assert_eq!(pttl(&mut conn, &fence).await, -1, "no expiry by default");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fence_ttl_the_counter_expires_and_tokens_still_increase() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("fence-ttl");
    let mut conn = raw(ep.url()).await;
    let fence = format!("{prefix}{{k}}:fence");
    // A counter made without the option (tokens 1, 2) goes on when the option is turned on.
    let plain = locker(&format!("{}?prefix={prefix}", ep.url())).await;
    for _ in 0..2 {
        let lease = plain.try_acquire("k").await.unwrap().expect("free");
        assert!(lease.release().await.unwrap());
    }
    let l = locker(&format!("{}?prefix={prefix}&fence_ttl_ms=1000", ep.url())).await;
    let a = l.try_acquire("k").await.unwrap().expect("free");
    assert_eq!(a.fencing_token().map(|t| t.get()), Some(3));
    let left = pttl(&mut conn, &fence).await;
    assert!((1..=1000).contains(&left), "expiry armed: {left}");
    assert!(a.release().await.unwrap());
    // Gone after its expiry: nothing of the key is left.
    let t0 = tokio::time::Instant::now();
    while !keys(&mut conn, &prefix).await.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the counter never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Starting again, the counter starts at the server's clock: above every earlier token.
    let b = l.try_acquire("k").await.unwrap().expect("free");
    let (ta, tb) = (a.fencing_token().unwrap(), b.fencing_token().unwrap());
    assert!(
        tb > ta && tb.get() > 1_000_000_000_000_000,
        "{ta:?} then {tb:?}"
    );
    let c = {
        assert!(b.release().await.unwrap());
        l.try_acquire("k").await.unwrap().expect("free")
    };
    assert_eq!(c.fencing_token().unwrap().get(), tb.get() + 1);
    assert!(c.release().await.unwrap());
    // The option is checked.
    assert!(RedisConfig::from_url(&format!("{}?fence_ttl_ms=10", ep.url())).is_err());
    assert!(RedisConfig::from_url(&format!("{}?fence_ttl_ms=soon", ep.url())).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_arms_the_fence_expiry_too() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("fair-fence-ttl");
    let mut conn = raw(ep.url()).await;
    let l = locker(&format!(
        "{}?prefix={prefix}&fence_ttl_ms=60000&fair_queue_ms=500",
        ep.url()
    ))
    .await;
    let a = l.try_acquire("k").await.unwrap().expect("free");
    let left = pttl(&mut conn, &format!("{prefix}{{k}}:fence")).await;
    assert!((1..=60_000).contains(&left), "expiry armed: {left}");
    assert!(a.fencing_token().unwrap().get() > 1_000_000_000_000_000);
    assert!(a.release().await.unwrap());
}

/// A waiting acquisition mints its token in the script that also announces it (plain mode) or
/// that claims the lock a release handed it (fair mode): both arm the fence expiry, as a try
/// does. The counter's expiry is taken off after the holder's grant, so only the waiter's
/// grant can have armed it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquisition_arms_the_fence_expiry_too() {
    let ep = require_service!(Service::Redis);
    for mode in ["", "&fair_queue_ms=2000"] {
        let prefix = common::prefix("wait-fence-ttl");
        let mut conn = raw(ep.url()).await;
        let fence = format!("{prefix}{{k}}:fence");
        let url = format!("{}?prefix={prefix}&fence_ttl_ms=60000{mode}", ep.url());
        let (holder, waiter) = (locker(&url).await, locker(&url).await);
        let a = holder.try_acquire("k").await.unwrap().expect("free");
        let () = redis::cmd("PERSIST")
            .arg(&fence)
            .query_async::<i64>(&mut conn)
            .await
            .map(drop)
            .unwrap();
        let waiting =
            tokio::spawn(async move { waiter.acquire("k", Duration::from_secs(20)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            pttl(&mut conn, &fence).await,
            -1,
            "{mode}: expiry taken off"
        );
        assert!(a.release().await.unwrap());
        let b = waiting.await.unwrap().unwrap();
        assert_eq!(
            b.fencing_token().unwrap().get(),
            a.fencing_token().unwrap().get() + 1,
            "{mode}"
        );
        let left = pttl(&mut conn, &fence).await;
        assert!((1..=60_000).contains(&left), "{mode}: expiry armed: {left}");
        assert!(b.release().await.unwrap());
    }
}
