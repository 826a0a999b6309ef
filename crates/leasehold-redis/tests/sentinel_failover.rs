//! Redis Sentinel (`redis+sentinel://`, the master, two replicas and three sentinels of
//! `scripts/services`): the master is found through the sentinels; killed while clients hold
//! locks (the replicas paused and cut off for the last 300 ms before it, so they miss those
//! grants), a
//! replica is promoted and the same backend finds it and works again. Counts the grants a
//! second client gets again after the failover (double grants) and the fencing tokens that went
//! back: some without the replica-sync check, none with it (`WAIT` for both replicas: a grant
//! the replicas do not have is given back, not counted). The topology is restored
//! (`scripts/services failover-reset`) after each test, even a failed one. Own test binary: one failover at a time.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use leasehold_core::{Lease, Locker, Renewal};
use leasehold_redis::{RedisBackend, RedisConfig};
use leasehold_test_support::harness::locker;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{self, Endpoints, Service};
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

fn services_cmd(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(services::services_script())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/services {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs `body`, then restores the topology, even if `body` panicked.
async fn restoring<F: Future<Output = ()>>(body: F) {
    let outcome = AssertUnwindSafe(body).catch_unwind().await;
    services_cmd(&["failover-reset"]);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn url(ep: &Endpoints, options: &str) -> String {
    format!("redis+sentinel://{}/leasehold{options}", ep.raw())
}

async fn sentinel_locker(url: &str, prefix: &str) -> Locker {
    let cfg = RedisConfig::from_url(url)
        .and_then(|c| c.with_prefix(prefix))
        .unwrap_or_else(|e| panic!("config: {e}"));
    let backend = RedisBackend::connect(cfg)
        .await
        .unwrap_or_else(|e| panic!("connect through the sentinels: {e}"));
    locker(backend, Duration::from_secs(30), Renewal::Off)
}

/// What a failover did to the grants held across it.
#[derive(Debug, Default)]
struct Tally {
    held: usize,
    double_grants: usize,
    token_regressions: usize,
}

/// Holders take locks in a tight loop while the replicas are paused (they miss every write of
/// that time) and the master is killed; once a replica is promoted and `holder` works again,
/// `other` tries every key held at the failover.
async fn failover(options: &str, test: &str) -> Tally {
    let ep = require_service!(Service::RedisSentinel, Tally::default());
    let prefix = common::prefix(test);
    let url = url(&ep, options);
    let holder = sentinel_locker(&url, &prefix).await;
    let other = sentinel_locker(&url, &prefix).await;
    let master = services_cmd(&["sentinel-master"]);
    assert_eq!(master, "smaster", "the topology was not reset");
    replicating(&node_field(&master, "port"), &prefix).await;

    // The replicas restarted by the last reset may not acknowledge a write at once (seen when
    // this test ran right after another one's reset: "1 of 2 replica(s) acknowledged the grant
    // within 500ms", a retryable error): grants are retried for up to 10 s before the test
    // starts, so that it starts from a topology that replicates.
    let ready = Instant::now() + Duration::from_secs(10);
    let mut held: Vec<Lease> = Vec::new();
    for i in 0..20 {
        let lease = loop {
            match holder.try_acquire(format!("w{i}")).await {
                Ok(lease) => break lease.expect("a new key"),
                Err(e) if e.is_retryable() && Instant::now() < ready => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("grant w{i} before the failover: {e}"),
            }
        };
        held.push(lease);
    }
    // Grants go on until the master dies; the replicas miss the last ones.
    let stop = Arc::new(AtomicBool::new(false));
    let taking = {
        let (holder, stop) = (holder.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut held: Vec<Lease> = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                match holder.try_acquire(format!("k{i}")).await {
                    Ok(Some(l)) => held.push(l),
                    Ok(None) => panic!("k{i} is new"),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            held
        })
    };
    // The replicas stop reading, and the master drops their links: the writes from now on
    // reach no replica (a paused replica would still find what was sent in its socket).
    for r in ["sreplica1", "sreplica2"] {
        services_cmd(&["pause", r]);
    }
    let port = node_field(&master, "port");
    let cut = Command::new("redis-cli")
        .args(["-p", &port, "client", "kill", "type", "replica"])
        .output()
        .unwrap();
    assert!(cut.status.success(), "CLIENT KILL TYPE replica: {cut:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SIGKILL: a crash, not a shutdown (which lets the replicas catch up first).
    let pid = node_field(&master, "pid");
    let killed = Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    assert!(killed.success(), "kill {master} ({pid})");
    stop.store(true, Ordering::SeqCst);
    for r in ["sreplica1", "sreplica2"] {
        services_cmd(&["resume", r]);
    }
    held.extend(taking.await.unwrap());
    // Once a replica is promoted, the old master comes back (empty) and is made a replica of
    // it: two replicas again, as the replica-sync check asks for.
    let t0 = Instant::now();
    let promoted = loop {
        let now = services_cmd(&["sentinel-master"]);
        if now != master {
            break now;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no replica was promoted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let promoted_after = t0.elapsed();
    services_cmd(&["start", &master]);

    // The same backend finds the promoted replica by itself.
    let t0 = Instant::now();
    let after = loop {
        match holder.try_acquire("after-failover").await {
            Ok(Some(l)) => break l,
            // An earlier attempt whose grant failed the replica check (or whose answer was
            // lost with the connection) gives the key back in a task: it may not be gone yet.
            outcome if t0.elapsed() > Duration::from_secs(30) => {
                panic!("no grant of a new key 30 s after the failover; the last try: {outcome:?}")
            }
            Ok(None) | Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    eprintln!(
        "{test}: {master} stopped with {} locks held; {promoted} promoted after \
         {promoted_after:?}; the client works again {:?} later",
        held.len(),
        t0.elapsed()
    );
    assert!(after.release().await.unwrap());

    let mut tally = Tally {
        held: held.len(),
        ..Tally::default()
    };
    for lease in &held {
        // `other` meets the dead master on its first request, then finds the new one.
        let mut tried = other.try_acquire(lease.key().as_str()).await;
        for _ in 0..50 {
            if tried.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            tried = other.try_acquire(lease.key().as_str()).await;
        }
        if let Some(again) = tried.unwrap() {
            tally.double_grants += 1;
            if again.fencing_token() <= lease.fencing_token() {
                tally.token_regressions += 1;
            }
            again.release().await.unwrap();
        }
    }
    eprintln!("{test}: {tally:?}");
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_is_found_through_the_sentinels() {
    let ep = require_service!(Service::RedisSentinel);
    let _serial = SERIAL.lock().await;
    let l = sentinel_locker(&url(&ep, ""), &common::prefix("discover")).await;
    let a = l.try_acquire("k").await.unwrap().expect("a free key");
    assert!(l.try_acquire("k").await.unwrap().is_none(), "not exclusive");
    let plain = common::redis(&format!("redis://{}", master_addr()), &common::prefix("x")).await;
    drop(plain);
    assert!(a.release().await.unwrap());
}

/// `pid` or `port` of a running node, from `scripts/services status`.
fn node_field(node: &str, field: &str) -> String {
    let status = services_cmd(&["status"]);
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{node} ")))
        .unwrap();
    let at = format!("{field}=");
    let value = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(at.as_str()));
    value
        .unwrap_or_else(|| panic!("no {field} in {line:?}"))
        .to_owned()
}

/// Waits (up to 15 s) until both replicas acknowledge a write (a key under `prefix`, expiring
/// by itself) on the master at `port`: the test's precondition, checked rather than assumed. A
/// fresh clone's run once saw all 5,168 grants handed out again, the 20 taken before the fault
/// among them, as if the promoted replica had replicated nothing; the cause was not
/// established (the reset already waits for both replicas to report `state=online`), so the
/// test now fails here, with its own message, if the topology does not replicate.
async fn replicating(port: &str, prefix: &str) {
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("{url}: {e}"));
    // One connection: `WAIT` counts the replicas that acknowledged this client's writes.
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, acked): ((), i64) = redis::pipe()
            .cmd("SET")
            .arg(format!("{prefix}replicating"))
            .arg(1)
            .arg("PX")
            .arg(5000)
            .cmd("WAIT")
            .arg(2)
            // Below the connection's response timeout (redis-rs's default, 500 ms): a longer
            // WAIT made a slow acknowledgement a client-side timeout and a panic, instead of
            // another turn of this loop.
            .arg(250)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("SET + WAIT on {url}: {e}"));
        if acked == 2 {
            return;
        }
        assert!(
            Instant::now() < until,
            "the replicas of the master on port {port} do not acknowledge writes ({acked} of 2)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The master's address, as the sentinels name it.
fn master_addr() -> String {
    let node = services_cmd(&["sentinel-master"]);
    format!("127.0.0.1:{}", node_field(&node, "port"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_master_promotes_a_replica_and_the_client_finds_it() {
    let _serial = SERIAL.lock().await;
    restoring(async {
        let tally = failover("", "failover").await;
        // The grants of the last 300 ms never reached a replica: a failover hands them out
        // again, with fencing tokens that went back (Redis is an efficiency lock).
        assert!(
            tally.double_grants > 0,
            "the failover lost nothing: {tally:?}"
        );
        assert!(tally.double_grants < tally.held, "{tally:?}");
        assert!(tally.token_regressions > 0, "{tally:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_sync_no_grant_is_lost_in_a_failover() {
    let _serial = SERIAL.lock().await;
    restoring(async {
        let tally = failover(
            "?replica_sync=2&replica_sync_timeout_ms=500",
            "failover-wait",
        )
        .await;
        assert_eq!(tally.double_grants, 0, "{tally:?}");
        assert_eq!(tally.token_regressions, 0, "{tally:?}");
    })
    .await;
}
