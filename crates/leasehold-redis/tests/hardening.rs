//! Passwords in clear and late extends: a password about to go without TLS to a server that is
//! not loopback is warned about (or refused), and a Redlock extend that lands after the release
//! cannot bring the lock back.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{ErrorKind, ExtendRequest, Held, LockBackend, Renewal};
use leasehold_redis::{RedisConfig, RedlockConfig};
use leasehold_test_support::harness::locker;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::time::Instant;

#[test]
fn a_redis_password_in_clear_to_a_remote_host_warns_or_is_refused() {
    let logs = leasehold_test_support::logs::capture();
    RedisConfig::from_url("redis://app:hunter2@10.1.2.3:6379/0").unwrap();
    RedlockConfig::from_url("redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,192.0.2.7:3").unwrap();
    let text = logs.text();
    assert!(
        text.contains("in clear") && text.contains("10.1.2.3"),
        "{text}"
    );
    assert!(text.contains("192.0.2.7"), "Redlock warns per node: {text}");
    assert!(
        !text.contains("127.0.0.1"),
        "loopback nodes are fine: {text}"
    );
    assert!(!text.contains("hunter2"), "{text}");

    for url in [
        "redis://app:hunter2@10.1.2.3:6379/0?allow_plaintext_password=false",
        "redis-cluster://:hunter2@db1:7000,db2:7001?allow_plaintext_password=false",
    ] {
        let e = RedisConfig::from_url(url).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
        assert!(e.to_string().contains("allow_plaintext_password"), "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
    let e = RedlockConfig::from_url(
        "redlock://:hunter2@127.0.0.1:1,127.0.0.1:2,192.0.2.7:3?allow_plaintext_password=false",
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");

    // Loopback, TLS, a unix socket, or no password at all: nothing to warn about.
    let logs = leasehold_test_support::logs::capture();
    for url in [
        "redis://app:hunter2@localhost:6379/0?allow_plaintext_password=false",
        "redis://app:hunter2@[::1]:6379/0?allow_plaintext_password=false",
        "rediss://app:hunter2@db.example:6380/0?allow_plaintext_password=false",
        "redis+unix:///run/redis.sock?pass=hunter2&allow_plaintext_password=false",
        "redis://db.example:6379/0?allow_plaintext_password=false",
    ] {
        RedisConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    assert!(!logs.text().contains("in clear"), "{}", logs.text());
}

/// The renewal engine's extend is sent to every node at once, and so is a release: on a node
/// the extend may run after the release. It used to set a missing key again ("a node that
/// restarted empty"), so a late extend re-created the lock on every node after its release,
/// and nobody could take it until the TTL ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_extend_landing_after_the_release_does_not_bring_the_lock_back() {
    let ep = require_service!(Service::Redlock);
    let prefix = common::prefix("late-extend");
    let backend = common::redlock(ep.urls(), &prefix);
    let ttl = Duration::from_secs(10);
    let a = locker(backend.clone(), ttl, Renewal::Off);
    let lease = a.try_acquire("k").await.unwrap().expect("free");
    let (key, owner) = (lease.key().clone(), lease.owner().clone());
    assert!(lease.release().await.unwrap());

    // The extend that was in flight, arriving now: one lease, then as a batch.
    let held = || Held::new(&key, &owner, None, None);
    let late = backend
        .extend(ExtendRequest::new(held(), ttl, Instant::now()))
        .await;
    assert!(matches!(late, Ok(None)), "{late:?}");
    let batch = backend
        .extend_many(&[ExtendRequest::new(held(), ttl, Instant::now())])
        .await;
    assert!(matches!(batch.as_slice(), [Ok(None)]), "{batch:?}");
    let keys = backend.count_lock_keys("k").await.unwrap();
    assert_eq!(keys.iter().sum::<usize>(), 0, "keys came back: {keys:?}");

    let b = locker(common::redlock(ep.urls(), &prefix), ttl, Renewal::Off);
    let again = b.try_acquire("k").await.unwrap();
    assert!(again.is_some(), "the released lock stays held");
    assert!(again.unwrap().release().await.unwrap());
}
