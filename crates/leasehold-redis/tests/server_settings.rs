//! Server settings that bear on locks, each set for one test and put back after it.
//!
//! - At its `maxmemory` (policy `noeviction`, the services' default), a Redis refuses what may
//!   grow memory: held leases and semaphore permits keep renewing (leases in their usual
//!   batches) and releases go through, since those scripts only re-arm or delete keys; a lock
//!   acquisition fails with the server's `OOM` message.
//! - Short of the replicas `min-replicas-to-write` asks for (`NOREPLICAS`, a replica lagging
//!   or reconnecting), a release and a waiting acquisition are retried until the replicas are
//!   back, as for any transient fault.
//! - With a `maxmemory` and a policy that evicts, lock keys may be deleted under memory
//!   pressure: the backend names such a server in a warning once it has connected.
//!
//! A binary of its own: the settings would fail or disturb any other test using the servers at
//! the same time (test binaries run one at a time; the tests here take turns per server).

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{ErrorKind, Lease, Locker, PermitLimit, RELEASE_BUDGET, Renewal, Semaphore};
use leasehold_redis::RedisBackend;
use leasehold_test_support::harness;
use leasehold_test_support::logs::{self, Captured};
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::sync::Mutex;
use tokio::time::Instant;

const TTL: Duration = Duration::from_millis(1_500);
const LEASES: usize = 300;
const PERMITS: u32 = 3;

/// Taken by the tests that change the single server's settings, and the cluster's.
static SINGLE: Mutex<()> = Mutex::const_new(());
static CLUSTER: Mutex<()> = Mutex::const_new(());

/// A setting of the servers `urls` changed while this lives; each gets its own value back when
/// it is dropped, even if the test panicked (through a new connection: the setting may be one
/// that closes idle ones).
struct Setting {
    name: &'static str,
    servers: Vec<(String, String)>,
}

fn config_set(url: &str, name: &str, value: &str) -> redis::RedisResult<()> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut conn)
}

impl Setting {
    fn set(urls: &[String], name: &'static str, value: &str) -> Self {
        let servers = urls
            .iter()
            .map(|url| {
                let mut conn = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection())
                    .unwrap_or_else(|e| panic!("{url}: {e}"));
                let (_, was): (String, String) = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(name)
                    .query(&mut conn)
                    .unwrap();
                config_set(url, name, value).unwrap_or_else(|e| panic!("{url}: {e}"));
                (url.clone(), was)
            })
            .collect();
        Self { name, servers }
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        for (url, was) in &self.servers {
            if let Err(e) = config_set(url, self.name, was) {
                eprintln!("could not set {} back to {was} on {url}: {e}", self.name);
            }
        }
    }
}

/// What the servers `urls` have counted so far: commands refused as out of memory, and
/// top-level script calls.
async fn counts(urls: &[String]) -> (u64, u64) {
    let (mut refused, mut calls) = (0, 0);
    for url in urls {
        refused += common::commandstats::refused_out_of_memory(url).await;
        calls += common::commandstats::script_calls(url).await;
    }
    (refused, calls)
}

/// Takes [`LEASES`] renewing leases and [`PERMITS`] permits of one semaphore, fills the
/// servers `urls`, holds for three renewal periods, and checks what a full server allows: every
/// lease and permit renewed, with no call refused and fewer than one call per lease (batched as
/// usual), a new lock acquisition refused with the server's message, every release through.
async fn renews_and_releases_when_full(backend: RedisBackend, urls: &[String]) {
    let l: Locker = harness::locker(backend, TTL, Renewal::Auto);
    let taken = join_all((0..LEASES).map(|i| l.try_acquire(format!("k{i}")))).await;
    let sem = Semaphore::from_locker(&l, PermitLimit::new(PERMITS).unwrap()).unwrap();
    let permits = join_all((0..PERMITS).map(|_| sem.try_acquire("sem"))).await;
    let leases: Vec<Lease> = taken
        .into_iter()
        .chain(permits)
        .map(|r| r.unwrap().expect("a fresh key is free"))
        .collect();
    // 1 byte: over it at once.
    let full = Setting::set(urls, "maxmemory", "1");
    let before = counts(urls).await;
    tokio::time::sleep(TTL).await;
    let after = counts(urls).await;
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    assert_eq!(lost, 0, "leases or permits lost while the server was full");
    let (refused, calls) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(refused, 0, "renewal calls refused as out of memory");
    // Three periods of a few batches each; one call per slot would be ~3 per lease.
    assert!(
        calls < LEASES as u64,
        "{calls} script calls for {LEASES} leases over 3 periods: not batched"
    );

    let err = l
        .try_acquire("new")
        .await
        .expect_err("a full server grants");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("OOM"), "{err}");

    let released = join_all(leases.iter().map(Lease::release)).await;
    assert!(
        released.iter().all(|r| matches!(r, Ok(true))),
        "a release failed on a full server: {:?}",
        released.iter().find(|r| !matches!(r, Ok(true)))
    );
    drop(full);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_keeps_renewing_and_releasing() {
    let ep = require_service!(Service::Redis);
    let _turn = SINGLE.lock().await;
    let prefix = common::prefix("oom-single");
    let backend = common::redis(ep.url(), &prefix).await;
    renews_and_releases_when_full(backend, &[ep.url().to_owned()]).await;
}

/// On a cluster the batch script (keys of many slots, one call per master) is flagged
/// `allow-oom`: without the flag a full master refused it whole, and each batch fell back to
/// one call per slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cluster_keeps_renewing_and_releasing() {
    let ep = require_service!(Service::RedisCluster);
    let _turn = CLUSTER.lock().await;
    let prefix = common::prefix("oom-cluster");
    let backend = common::redis_cluster(ep.urls(), &prefix).await;
    renews_and_releases_when_full(backend, ep.urls()).await;
}

/// A server short of the replicas it requires (`min-replicas-to-write`; the services' server
/// has none) refuses every write with `NOREPLICAS` for 1 s: a release sent meanwhile is
/// retried and answers `true` once writes are accepted again, well within its budget, and a
/// waiting acquisition is granted then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_short_of_replicas_is_waited_out() {
    let ep = require_service!(Service::Redis);
    let _turn = SINGLE.lock().await;
    let prefix = common::prefix("noreplicas");
    let backend = common::redis(ep.url(), &prefix).await;
    let l = harness::locker(backend, Duration::from_secs(30), Renewal::Off);
    let held = l.try_acquire("a").await.unwrap().expect("free");

    let short = Setting::set(&[ep.url().to_owned()], "min-replicas-to-write", "1");
    let refusing = Duration::from_secs(1);
    let t0 = Instant::now();
    let back = async {
        tokio::time::sleep(refusing).await;
        drop(short);
    };
    let release = async {
        let released = held.release().await;
        (released, t0.elapsed())
    };
    let ((released, took), taken, ()) =
        tokio::join!(release, l.acquire("b", Duration::from_secs(10)), back);
    assert!(released.unwrap(), "the release was not retried to the end");
    assert!(took < RELEASE_BUDGET, "released after {took:?}");
    let taken = taken.expect("the waiting acquisition was not retried to the end");
    assert!(taken.release().await.unwrap());
}

/// The warning about eviction, once `backend` has connected (one lock taken and given back)
/// and its check had time to answer; `None` if there was none.
async fn eviction_warning(backend: RedisBackend, logs: &Captured) -> Option<String> {
    let l = harness::locker(backend, Duration::from_secs(10), Renewal::Off);
    let lease = l.try_acquire("k").await.unwrap().expect("free");
    assert!(lease.release().await.unwrap());
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        if let Some(line) = logs.text().lines().find(|l| l.contains("may evict")) {
            return Some(line.to_owned());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A server with a limit and an evicting policy is named in a warning; with `noeviction`, or
/// with no limit, it is not.
#[tokio::test]
async fn a_server_that_may_evict_lock_keys_is_named_in_a_warning() {
    let ep = require_service!(Service::Redis);
    let _turn = SINGLE.lock().await;
    let urls = [ep.url().to_owned()];
    let logs = logs::capture();
    let prefix = common::prefix("evict");
    let backend = || common::redis(ep.url(), &prefix);
    let policy = Setting::set(&urls, "maxmemory-policy", "volatile-lru");
    assert_eq!(
        eviction_warning(backend().await, &logs).await,
        None,
        "no limit"
    );
    let limit = Setting::set(&urls, "maxmemory", "1gb");
    let line = eviction_warning(backend().await, &logs)
        .await
        .expect("no warning for an evicting server");
    assert!(line.contains("maxmemory-policy volatile-lru"), "{line}");
    drop(policy);
    let quiet = Setting::set(&urls, "maxmemory-policy", "noeviction");
    let logs = logs::capture();
    assert_eq!(eviction_warning(backend().await, &logs).await, None);
    drop((quiet, limit));
}

/// On a cluster each master answers for itself: the one that may evict is named.
#[tokio::test]
async fn a_cluster_master_that_may_evict_is_named() {
    let ep = require_service!(Service::RedisCluster);
    let _turn = CLUSTER.lock().await;
    let evicting = &ep.urls()[..1];
    let logs = logs::capture();
    let _limit = Setting::set(evicting, "maxmemory", "1gb");
    let _policy = Setting::set(evicting, "maxmemory-policy", "allkeys-lru");
    let backend = common::redis_cluster(ep.urls(), &common::prefix("evict")).await;
    let line = eviction_warning(backend, &logs)
        .await
        .expect("no warning for an evicting master");
    // Named by the address its answer came from, not by the cluster's seed list.
    let port = evicting[0].rsplit(':').next().unwrap();
    assert!(
        line.contains(&format!("node=\"127.0.0.1:{port}\"")),
        "{line}"
    );
    assert_eq!(
        logs.text().matches("may evict").count(),
        1,
        "{}",
        logs.text()
    );
}

/// A server that closes idle connections (`timeout`, often set to a few minutes): the first
/// requests after an idle spell still succeed. (`CLIENT LIST` shows the backend's connection
/// closed and made again during the test.)
#[tokio::test]
async fn requests_after_the_servers_idle_timeout_succeed() {
    let ep = require_service!(Service::Redis);
    let _turn = SINGLE.lock().await;
    let _idle = Setting::set(&[ep.url().to_owned()], "timeout", "1");
    let backend = common::redis(ep.url(), &common::prefix("idle")).await;
    let l = harness::locker(backend, Duration::from_secs(10), Renewal::Off);
    for round in 0..2 {
        let lease = l
            .try_acquire("k")
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let lease = lease.expect("free");
        assert!(lease.release().await.unwrap());
        // Idle past the server's timeout (checked about once a second).
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
}
