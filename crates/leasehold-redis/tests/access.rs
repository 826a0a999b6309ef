//! Ways in that the other suites do not take: an ACL user with a password, a Redis Cluster
//! over TLS, and keys whose braces would move the hash tag on a Redis Cluster.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{Candidate, Elector, LockOptions, Locker, PermitLimit, Renewal, Semaphore};
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

/// Creates the ACL user `user` (password `least-pw`) with the key and channel patterns
/// `patterns`, runs `body` with a URL logging in as it (in a task of its own, so that a failure
/// still removes the user), then removes the user.
async fn as_acl_user<F, Fut>(ep: &services::Endpoints, user: &str, patterns: &[String], body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let admin = redis::Client::open(ep.url()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg("on")
        .arg(">least-pw")
        .arg(patterns)
        .arg("+@all")
        .arg("-@dangerous")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let url = ep
        .url()
        .replacen("redis://", &format!("redis://{user}:least-pw@"), 1);
    let outcome = tokio::spawn(body(url)).await;
    redis::cmd("ACL")
        .arg("DELUSER")
        .arg(user)
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A backend for `url` under `prefix`.
async fn connect_as(url: &str, prefix: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .and_then(|c| c.with_prefix(prefix))
        .unwrap();
    RedisBackend::connect(config).await.unwrap()
}

/// An ACL user limited to the backend's prefix, for keys and channels alike (least
/// privilege), locks with a token, is woken by the release message, counts permits and
/// elects: the backend touches no key and no channel outside its prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_limited_to_its_prefix_locks_waits_counts_permits_and_elects() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("acl-prefix");
    let user = prefix.trim_end_matches(':').to_owned();
    let patterns = [format!("~{prefix}*"), format!("&{prefix}*")];
    as_acl_user(&ep, &user, &patterns, |url| async move {
        let (one, other) = (
            locker(connect_as(&url, &prefix).await),
            locker(connect_as(&url, &prefix).await),
        );
        exclusive_and_woken(&one, &other, "k").await;
        let sem = Semaphore::from_locker(&one, PermitLimit::new(2).unwrap()).unwrap();
        let permit = sem.try_acquire("s").await.unwrap().expect("a free permit");
        assert!(permit.release().await.unwrap());
        let elector = Elector::new(
            std::sync::Arc::clone(one.backend()),
            "e",
            Candidate::new("me").unwrap(),
            LockOptions::default(),
        )
        .unwrap();
        let lead = elector.campaign_for(Duration::from_secs(5)).await.unwrap();
        assert!(lead.resign().await.unwrap());
    })
    .await;
}

/// An ACL user with the prefix's keys but no channel (what Redis 7 gives a new user unless
/// `acl-pubsub-default allchannels` is set) still waits, for a lock and for a permit: by
/// polling, with a warning that says what to grant. Every waiting acquisition used to fail
/// with the refused `SUBSCRIBE`, and a release that handed the lock to a waiter failed at its
/// refused `PUBLISH` (after the hand-over was written).
#[tokio::test]
async fn an_acl_user_without_channels_waits_by_polling_with_a_warning() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("acl-no-channels");
    let user = prefix.trim_end_matches(':').to_owned();
    let logs = leasehold_test_support::logs::capture();
    let patterns = [format!("~{prefix}*"), "resetchannels".to_owned()];
    as_acl_user(&ep, &user, &patterns, |url| async move {
        let (one, other) = (
            locker(connect_as(&url, &prefix).await),
            locker(connect_as(&url, &prefix).await),
        );
        exclusive_and_woken(&one, &other, "k").await;
        // A semaphore's waiter too: the release's message is refused, the release is not.
        let limit = PermitLimit::new(1).unwrap();
        let (a, b) = (
            Semaphore::from_locker(&one, limit).unwrap(),
            Semaphore::from_locker(&other, limit).unwrap(),
        );
        let permit = a.try_acquire("s").await.unwrap().expect("a free permit");
        let waiter = tokio::spawn(async move { b.acquire("s", Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(permit.release().await.unwrap());
        let next = waiter.await.unwrap().unwrap();
        assert!(next.release().await.unwrap());
    })
    .await;
    let text = logs.text();
    assert_eq!(
        text.matches("may not subscribe to the wake-up channels")
            .count(),
        1,
        "{text}"
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
