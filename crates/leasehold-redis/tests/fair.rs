//! Fair mode across processes: a free lock goes to the head of a line kept on the server, and a
//! waiter that stops asking loses its place after the grace period.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use tokio::sync::Mutex;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_in_separate_backends_take_turns() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("fair_turns");
    const TASKS: usize = 6;
    let run = Duration::from_secs(2);
    let grants = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + run;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        // One backend per task: as separate processes would have.
        let l = common::locker(common::redis_fair(ep.url(), &prefix, Duration::from_secs(2)).await);
        let grants = Arc::clone(&grants);
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let asked = Instant::now();
                let lease = l.acquire("hot", Duration::from_secs(20)).await.unwrap();
                let got = Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
                grants.lock().await.push((task, got, got - asked));
                assert!(lease.release().await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut grants = grants.lock().await.clone();
    grants.sort_by_key(|g| g.1);
    let straight_back = grants.windows(2).filter(|w| w[0].0 == w[1].0).count();
    let longest = grants.iter().map(|g| g.2).max().unwrap();
    eprintln!(
        "{} grants, {straight_back} taken straight back, longest wait {longest:?}",
        grants.len()
    );
    assert!(grants.len() > 50, "too few grants: {}", grants.len());
    assert!(
        straight_back * 20 <= grants.len(),
        "{straight_back} of {} grants went straight back to the releaser",
        grants.len()
    );
    assert!(longest < Duration::from_secs(1), "longest wait {longest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_stopped_asking_loses_its_place() {
    let ep = require_service!(Service::Redis);
    let addr = ep.addr().unwrap();
    let prefix = common::prefix("fair_ghost");
    // 2 s: the ghost must still be alive after the `redis-cli` starts below and the first
    // acquire (a stall of the loaded machine can take hundreds of milliseconds).
    let grace = Duration::from_secs(2);
    let l = common::locker(common::redis_fair(ep.url(), &prefix, grace).await);
    // A waiter that crashed: in line, alive for one more grace period, never asking again.
    let lock = format!("{prefix}{{k}}");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let now_ms: u64 = {
        let t = cli(&["TIME"]);
        let mut parts = t.lines();
        let secs: u64 = parts.next().unwrap().parse().unwrap();
        let micros: u64 = parts.next().unwrap().parse().unwrap();
        secs * 1000 + micros / 1000
    };
    let alive_until = (now_ms + u64::try_from(grace.as_millis()).unwrap()).to_string();
    cli(&["ZADD", &format!("{lock}:waiters"), &alive_until, "ghost"]);
    cli(&["RPUSH", &format!("{lock}:queue"), "ghost"]);

    // The lock is free, but the ghost is ahead of us: a waiting acquire must not jump the line.
    // (A try is a plain `SET NX`: it could take a lock free with a line, which only happens
    // when a holder let its lease expire, never after a release, which hands it to the head.)
    assert!(l.acquire("k", Duration::from_millis(100)).await.is_err());
    let t0 = Instant::now();
    let lease = l.acquire("k", Duration::from_secs(10)).await.unwrap();
    let waited = t0.elapsed();
    eprintln!("granted after {waited:?} behind a dead waiter (grace {grace:?})");
    assert!(
        waited < grace + Duration::from_millis(1500),
        "waited {waited:?}"
    );
    assert!(lease.release().await.unwrap());
    // Nothing of the line is left behind.
    assert_eq!(
        cli(&[
            "EXISTS",
            &format!("{lock}:queue"),
            &format!("{lock}:waiters")
        ]),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_line() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("fair_giveup");
    let a = common::locker(common::redis_fair(ep.url(), &prefix, Duration::from_secs(5)).await);
    let b = common::locker(common::redis_fair(ep.url(), &prefix, Duration::from_secs(5)).await);
    let c = common::locker(common::redis_fair(ep.url(), &prefix, Duration::from_secs(5)).await);
    let held = a.try_acquire("k").await.unwrap().expect("free");
    // b waits briefly and gives up; then c queues. Once a releases, c must not wait for b's
    // stale place (5 s grace) to run out.
    let timed_out = b.acquire("k", Duration::from_millis(200)).await;
    assert!(timed_out.is_err());
    // b's leave-the-line task (in the background) empties the line.
    let mut conn = redis::Client::open(ep.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let t0 = Instant::now();
    loop {
        let queued: usize = redis::cmd("LLEN")
            .arg(format!("{prefix}{{k}}:queue"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if queued == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "b never left the line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiter = tokio::spawn(async move {
        let t0 = Instant::now();
        let lease = c.acquire("k", Duration::from_secs(10)).await.unwrap();
        (t0.elapsed(), lease)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(held.release().await.unwrap());
    let (waited, lease) = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(2),
        "c waited {waited:?}: b's place was not freed"
    );
    assert!(lease.release().await.unwrap());
}
