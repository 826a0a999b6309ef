//! A Redis at its `maxmemory` (policy `noeviction`, the services' default): held leases and
//! semaphore permits keep renewing (leases in their usual batches) and releases go through,
//! since those scripts only re-arm or delete keys; a lock acquisition fails with the server's
//! `OOM` message.
//!
//! A binary of its own: each test makes its servers refuse every write that could grow memory,
//! which would fail any other test using them at the same time (test binaries run one at a
//! time; the two tests here use different servers).

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{ErrorKind, Lease, Locker, PermitLimit, Renewal, Semaphore};
use leasehold_redis::RedisBackend;
use leasehold_test_support::harness;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

const TTL: Duration = Duration::from_millis(1_500);
const LEASES: usize = 300;
const PERMITS: u32 = 3;

/// The servers `urls` at a `maxmemory` of 1 byte (so at it at once) while this lives; each
/// gets its own setting back when it is dropped, even if the test panicked.
struct Full {
    servers: Vec<(redis::Connection, String)>,
}

impl Full {
    fn set(urls: &[String]) -> Self {
        let servers = urls
            .iter()
            .map(|url| {
                let mut conn = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection())
                    .unwrap_or_else(|e| panic!("{url}: {e}"));
                let (_, was): (String, String) = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("maxmemory")
                    .query(&mut conn)
                    .unwrap();
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("maxmemory")
                    .arg(1)
                    .query::<()>(&mut conn)
                    .unwrap();
                (conn, was)
            })
            .collect();
        Self { servers }
    }
}

impl Drop for Full {
    fn drop(&mut self) {
        for (conn, was) in &mut self.servers {
            let back = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(&*was)
                .query::<()>(conn);
            if let Err(e) = back {
                eprintln!("could not set maxmemory back to {was}: {e}");
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
    let full = Full::set(urls);
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
    let prefix = common::prefix("oom-cluster");
    let backend = common::redis_cluster(ep.urls(), &prefix).await;
    renews_and_releases_when_full(backend, ep.urls()).await;
}
