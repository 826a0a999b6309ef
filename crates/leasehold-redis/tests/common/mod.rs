//! Shared by the test binaries of this crate (each includes it with `mod common;`).

#![allow(dead_code)]

pub(crate) mod commandstats;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::LockBackend;
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::conformance::Target;
use leasehold_test_support::harness;
use leasehold_test_support::services::Endpoints;

/// A fresh key prefix, so tests never see each other's keys.
pub(crate) fn prefix(test: &str) -> String {
    harness::key_prefix(test, ":")
}

pub(crate) async fn redis(url: &str, prefix: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .and_then(|c| c.with_prefix(prefix))
        .unwrap_or_else(|e| panic!("config: {e}"));
    RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// A single-node backend reached through a fresh fault proxy in front of the server at `ep`
/// (kept alive by the caller), with a short response timeout so that a black hole shows soon.
pub(crate) async fn redis_behind_proxy(
    ep: &Endpoints,
    prefix: &str,
    response_timeout: Duration,
) -> (RedisBackend, leasehold_test_support::proxy::FaultProxy) {
    let upstream = ep
        .addr()
        .unwrap_or_else(|| panic!("{} has no tcp address", ep.raw()));
    let proxy = leasehold_test_support::proxy::FaultProxy::start(upstream)
        .await
        .unwrap_or_else(|e| panic!("proxy: {e}"));
    let config = RedisConfig::from_url(&format!("redis://{}", proxy.addr()))
        .and_then(|c| c.with_prefix(prefix))
        .unwrap_or_else(|e| panic!("config: {e}"))
        .with_timeouts(Duration::from_secs(1), response_timeout);
    let backend = RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    (backend, proxy)
}

/// A backend of its own (as another process would have) whose fallback backoff is 30 s: only a
/// release message wakes its waiters sooner.
pub(crate) async fn redis_slow_fallback(url: &str, prefix: &str) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .and_then(|c| c.with_prefix(prefix))
        .unwrap_or_else(|e| panic!("config: {e}"))
        .with_wait_backoff(leasehold_core::Backoff {
            initial: Duration::from_secs(30),
            max: Duration::from_secs(30),
        });
    RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// The messages published on `channel`, or on any channel whose name begins with it (a lock's
/// waiters each have their own, `<channel>:<owner>`), of the server at `url`, from now on.
pub(crate) async fn messages(
    url: &str,
    channel: &str,
) -> impl futures_util::Stream<Item = redis::Msg> + Unpin + use<> {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("client: {e}"));
    let mut sub = client
        .get_async_pubsub()
        .await
        .unwrap_or_else(|e| panic!("pubsub: {e}"));
    sub.psubscribe(format!("{channel}*"))
        .await
        .unwrap_or_else(|e| panic!("subscribe: {e}"));
    sub.into_on_message()
}

/// Polls the servers at `urls` until a majority of them (all of one) list `n` waiters
/// announced on the key `k` under `prefix` (its `waiters` set, written in either mode by an
/// attempt that found the lock held), 10 s at most: in place of a sleep that assumes a waiter
/// came by. A majority, not all: a Redlock holder may hold the key on only a quorum of nodes
/// (a node slow to answer its first request gets it given back), and a waiter announces
/// itself only where it finds the key held.
pub(crate) async fn until_waiting(urls: &[String], prefix: &str, n: usize) {
    let mut conns = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("client: {e}"));
        let c = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        conns.push(c);
    }
    let set = format!("{prefix}{{k}}:waiters");
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut listed = Vec::new();
        for c in &mut conns {
            let l: usize = redis::cmd("ZCARD")
                .arg(&set)
                .query_async(c)
                .await
                .unwrap_or_else(|e| panic!("ZCARD: {e}"));
            listed.push(l);
        }
        if listed.iter().filter(|&&l| l >= n).count() > urls.len() / 2 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "waiters listed per node {listed:?}, {n} on a majority expected after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls the Redlock nodes `urls` until none holds a lock key under `prefix`, `within` at most
/// (a release returns once a quorum let go; the other nodes' deletes may still be on the way).
pub(crate) async fn no_lock_keys_left(urls: &[String], prefix: &str, within: Duration) {
    let counter = redlock(urls, prefix);
    let until = tokio::time::Instant::now() + within;
    loop {
        let left = counter
            .count_lock_keys("")
            .await
            .unwrap_or_else(|e| panic!("count: {e}"));
        if left.iter().all(|&n| n == 0) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "lock keys left after {within:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hands the key `k` from `holder` to a waiting `waiter` `rounds` times: each round the holder
/// keeps it for `hold` while the waiter waits, then releases. Per round, how long after the
/// release the waiter had it.
pub(crate) async fn handoff_lags(
    holder: &leasehold_core::Locker,
    waiter: &leasehold_core::Locker,
    hold: Duration,
    rounds: usize,
) -> Vec<Duration> {
    let mut lags = Vec::new();
    for round in 0..rounds {
        let lease = holder
            .try_acquire("k")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("round {round}: the key is held"));
        let w = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let l = waiter.acquire("k", Duration::from_secs(20)).await;
                (l, tokio::time::Instant::now())
            })
        };
        tokio::time::sleep(hold).await;
        let released = tokio::time::Instant::now();
        assert!(lease.release().await.unwrap_or_else(|e| panic!("{e}")));
        let (got, at) = w.await.unwrap_or_else(|e| panic!("{e}"));
        let got = got.unwrap_or_else(|e| panic!("round {round}: {e}"));
        let lag = at - released;
        eprintln!("round {round}: woken {lag:?} after release");
        lags.push(lag);
        assert!(got.release().await.unwrap_or_else(|e| panic!("{e}")));
    }
    lags
}

/// `holder` takes `k`; `waiters` (each its own backend, as separate processes) start waiting
/// for it one after another, each once the one before has announced itself on the servers at
/// `watch` (keys under `prefix`; see [`until_waiting`]). Each release hands the lock on: to
/// the waiters in the order they came, and never back to the releaser asking again at once
/// (the lock is the woken waiter's to claim). After the last waiter's release nobody waits, and the lock is free again.
// Fails the test by panicking, like the tests themselves.
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) async fn handed_on_in_arrival_order(
    holder: leasehold_core::Locker,
    waiters: Vec<leasehold_core::Locker>,
    watch: &[String],
    prefix: &str,
) {
    let lease = holder.try_acquire("k").await.unwrap().expect("free");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let n = waiters.len();
    for (i, w) in waiters.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            let got = w.acquire("k", Duration::from_secs(30)).await;
            tx.send((i, got, w)).unwrap();
        });
        until_waiting(watch, prefix, i + 1).await;
    }
    let (mut lease, mut releaser) = (lease, holder);
    for expected in 0..n {
        assert!(lease.release().await.unwrap());
        let again = releaser.try_acquire("k").await.unwrap();
        assert!(
            again.is_none(),
            "the releaser took the lock straight back from waiter {expected}"
        );
        let (i, got, w) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no waiter got the lock")
            .unwrap();
        assert_eq!(
            i, expected,
            "handed to waiter {i}, not {expected}, the first in line"
        );
        (lease, releaser) = (got.unwrap(), w);
    }
    assert!(lease.release().await.unwrap());
    let free = releaser.try_acquire("k").await.unwrap();
    assert!(
        free.is_some(),
        "with nobody waiting a release frees the lock"
    );
    assert!(free.unwrap().release().await.unwrap());
}

/// A locker with a 10 s TTL and no renewal, for tests that hold locks briefly.
pub(crate) fn locker(backend: RedisBackend) -> leasehold_core::Locker {
    harness::locker(
        backend,
        Duration::from_secs(10),
        leasehold_core::Renewal::Off,
    )
}

/// A single-node backend in fair mode (server-side queue of waiters).
pub(crate) async fn redis_fair(url: &str, prefix: &str, grace: Duration) -> RedisBackend {
    let config = RedisConfig::from_url(url)
        .and_then(|c| c.with_prefix(prefix))
        .and_then(|c| c.with_fair_queue(grace))
        .unwrap_or_else(|e| panic!("config: {e}"));
    RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

pub(crate) fn redlock(urls: &[String], prefix: &str) -> RedlockBackend {
    let config = RedlockConfig::from_urls(urls)
        .and_then(|c| c.with_prefix(prefix))
        .map(|c| c.with_node_timeout(Duration::from_millis(50)))
        .unwrap_or_else(|e| panic!("config: {e}"));
    RedlockBackend::new(config).unwrap_or_else(|e| panic!("redlock: {e}"))
}

/// The single-node conformance target: two independent connections, one prefix per target.
pub(crate) async fn single_target(ep: &Endpoints) -> Target {
    let prefix = prefix("conformance");
    let primary = redis(ep.url(), &prefix).await;
    let other = redis(ep.url(), &prefix).await;
    single_node_target(primary, other)
}

/// A conformance target of two single-node backends on one prefix; the held hook counts lock
/// keys under it.
pub(crate) fn single_node_target(primary: RedisBackend, other: RedisBackend) -> Target {
    let counter = primary.clone();
    Target::new(
        Arc::new(primary),
        Arc::new(other),
        Duration::from_millis(300),
    )
    .with_held(Arc::new(move || {
        let counter = counter.clone();
        Box::pin(async move { counter.count_lock_keys("").await })
    }))
}

/// The Redlock conformance target over the given node URLs.
pub(crate) fn redlock_target(urls: &[String]) -> Target {
    let prefix = prefix("conformance");
    let primary = redlock(urls, &prefix);
    let other = redlock(urls, &prefix);
    let counter = primary.clone();
    let primary: Arc<dyn LockBackend> = Arc::new(primary);
    Target::new(primary, Arc::new(other), Duration::from_millis(500)).with_held(Arc::new(
        move || {
            let counter = counter.clone();
            Box::pin(async move { Ok(counter.count_lock_keys("").await?.into_iter().sum()) })
        },
    ))
}

/// A backend on the Redis Cluster whose nodes are `urls`.
pub(crate) async fn redis_cluster(urls: &[String], prefix: &str) -> RedisBackend {
    let config = RedisConfig::cluster(urls)
        .and_then(|c| c.with_prefix(prefix))
        .unwrap_or_else(|e| panic!("config: {e}"));
    RedisBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// The Redis Cluster conformance target: two cluster clients; the held hook counts lock keys
/// on every master through direct connections.
pub(crate) async fn cluster_target(urls: &[String]) -> Target {
    let prefix = prefix("conformance");
    let primary = redis_cluster(urls, &prefix).await;
    let other = redis_cluster(urls, &prefix).await;
    let mut masters = Vec::new();
    for url in urls {
        masters.push(redis(url, &prefix).await);
    }
    Target::new(
        Arc::new(primary),
        Arc::new(other),
        Duration::from_millis(300),
    )
    .with_held(Arc::new(move || {
        let masters = masters.clone();
        Box::pin(async move {
            let mut n = 0;
            for m in &masters {
                n += m.count_lock_keys("").await?;
            }
            Ok(n)
        })
    }))
}
