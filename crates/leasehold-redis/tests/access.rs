//! Ways in that the other suites do not take: an ACL user with a password, a Redis Cluster
//! over TLS, and keys whose braces would move the hash tag on a Redis Cluster.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{LockOptions, Locker, Renewal};
use leasehold_redis::{RedisBackend, RedisConfig};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{self, REDIS_ACL_PASSWORD_VAR, REDIS_ACL_USER_VAR, Service};

fn locker(backend: RedisBackend) -> Locker {
    Locker::new(backend)
        .with_options(LockOptions::default().with_renewal(Renewal::Off))
        .unwrap()
}

/// Takes `key`, sees it held from `other`, waits for it from `other` (woken by the release
/// message), and checks that the second token is larger.
async fn exclusive_and_woken(one: &Locker, other: &Locker, key: &str) {
    let a = one.try_acquire(key).await.unwrap().expect("free");
    assert!(a.fencing_token().is_some(), "{key:?}: a fenced lock");
    assert!(other.try_acquire(key).await.unwrap().is_none(), "{key:?}");
    let waiter = {
        let other = other.clone();
        let key = key.to_owned();
        tokio::spawn(async move { other.acquire(&key, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(a.release().await.unwrap(), "{key:?}");
    let b = waiter.await.unwrap().unwrap();
    assert!(b.fencing_token() > a.fencing_token(), "{key:?}");
    let held = one.inspect(key).await.unwrap();
    assert_eq!(
        held.and_then(|h| h.fencing),
        b.fencing_token(),
        "{key:?}: inspect reads the lock and its counter"
    );
    assert!(b.release().await.unwrap(), "{key:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_a_password_locks_and_a_wrong_password_is_refused_unseen() {
    let ep = require_service!(Service::Redis);
    let user = services::var(REDIS_ACL_USER_VAR).expect("LEASEHOLD_TEST_REDIS_ACL_USER");
    let password = services::var(REDIS_ACL_PASSWORD_VAR).expect("the ACL user's password");
    let with = |pw: &str| {
        ep.url()
            .replacen("redis://", &format!("redis://{user}:{pw}@"), 1)
    };
    let prefix = common::prefix("acl");
    let connect = |url: String| {
        let prefix = prefix.clone();
        async move {
            let config = RedisConfig::from_url(&url)?.with_prefix(&prefix)?;
            RedisBackend::connect(config).await
        }
    };
    let (one, other) = (
        locker(connect(with(&password)).await.unwrap()),
        locker(connect(with(&password)).await.unwrap()),
    );
    exclusive_and_woken(&one, &other, "k").await;

    let wrong = "Wr0ng-pw_shown";
    let config = RedisConfig::from_url(&with(wrong)).unwrap();
    assert!(!format!("{config:?}").contains(wrong), "{config:?}");
    let err = match RedisBackend::connect(config).await {
        Err(e) => e,
        // redis-rs may connect lazily: then the first command is refused.
        Ok(b) => locker(b)
            .try_acquire("k")
            .await
            .expect_err("a wrong password"),
    };
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(wrong), "{shown}");
    assert!(
        shown.contains("WRONGPASS") || shown.to_lowercase().contains("auth"),
        "the error says it is the password: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_over_tls_locks_waits_and_fences() {
    let ep = require_service!(Service::RedisClusterTls);
    assert!(ep.urls().iter().all(|u| u.starts_with("rediss://")));
    let ca = services::tls_ca().expect("the harness's TLS CA");
    let prefix = common::prefix("cluster-tls");
    let backend = || async {
        let config = RedisConfig::cluster(ep.urls())
            .and_then(|c| c.with_prefix(&prefix))
            .and_then(|c| c.with_tls_ca_file(&ca))
            .unwrap();
        RedisBackend::connect(config).await.unwrap()
    };
    // The same cluster from one URL (what `LockConfig` and the CLI take).
    let hosts: Vec<&str> = ep
        .urls()
        .iter()
        .map(|u| u.trim_start_matches("rediss://"))
        .collect();
    let url = format!(
        "rediss-cluster://{}?prefix={prefix}&ca={}",
        hosts.join(","),
        ca.display()
    );
    let by_url = RedisBackend::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let (one, other) = (locker(backend().await), locker(by_url));
    // Keys on each of the three masters' slots.
    for key in ["a", "b", "c", "jobs/nightly"] {
        exclusive_and_woken(&one, &other, key).await;
    }
    // Without the CA the server's certificate is refused.
    let untrusted = RedisConfig::cluster(ep.urls()).unwrap();
    let refused = match RedisBackend::connect(untrusted).await {
        Err(_) => true,
        Ok(b) => locker(b).try_acquire("a").await.is_err(),
    };
    assert!(
        refused,
        "a certificate from an unknown CA must not be trusted"
    );
}

/// A key beginning with `}` gave an empty hash tag: the lock and its fence counter hashed to
/// different slots, and the acquire script failed with CROSSSLOT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_edge_case_braces_lock_on_a_redis_cluster() {
    let ep = require_service!(Service::RedisCluster);
    let prefix = common::prefix("braces");
    let one = locker(common::redis_cluster(ep.urls(), &prefix).await);
    let other = locker(common::redis_cluster(ep.urls(), &prefix).await);
    for key in ["}", "}a", "}}b", "a}", "{}", "}{", "{a}", "a{b}c", "~{~}"] {
        exclusive_and_woken(&one, &other, key).await;
    }
    // `}a` and `a` are two locks.
    let a = one.try_acquire("}a").await.unwrap().expect("free");
    let b = other.try_acquire("a").await.unwrap().expect("another lock");
    assert!(a.release().await.unwrap() && b.release().await.unwrap());
}
