//! Redlock under real faults: stopped nodes, a black-holed node, random cancellation, and the
//! crash-recovery hazard. These tests stop and restart the Redlock nodes (which loses their
//! keys), so they run one at a time and always bring every node back, even on failure.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use leasehold_core::{ErrorKind, Locker, Renewal};
use leasehold_test_support::harness::locker;
use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{NodeAction, Service, node_ctl};
use rand::Rng;
use tokio::sync::Mutex;
use tokio::time::Instant;

static SERIAL: Mutex<()> = Mutex::const_new(());

const NODES: [&str; 5] = ["redlock1", "redlock2", "redlock3", "redlock4", "redlock5"];

async fn ctl(node: &str, action: NodeAction) {
    node_ctl(node, action)
        .await
        .unwrap_or_else(|e| panic!("{action} {node}: {e}"));
}

/// Runs `body`, then starts every Redlock node again, even if `body` panicked.
async fn restoring_nodes<F: Future<Output = ()>>(body: F) {
    let outcome = AssertUnwindSafe(body).catch_unwind().await;
    for node in NODES {
        ctl(node, NodeAction::Start).await;
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_two_of_five_nodes_is_survived_and_three_is_a_clear_error() {
    let ep = require_service!(Service::Redlock);
    let _serial = SERIAL.lock().await;
    let backend = common::redlock(ep.urls(), &common::prefix("node_loss"));
    let l = locker(backend, Duration::from_secs(5), Renewal::Off);
    restoring_nodes(async {
        ctl("redlock4", NodeAction::Stop).await;
        let a = l
            .try_acquire("k1")
            .await
            .unwrap()
            .expect("4 of 5 nodes grant");
        assert!(a.release().await.unwrap());
        ctl("redlock5", NodeAction::Stop).await;
        let b = l
            .try_acquire("k2")
            .await
            .unwrap()
            .expect("3 of 5 nodes grant");
        assert!(b.release().await.unwrap());

        ctl("redlock3", NodeAction::Stop).await;
        let t0 = Instant::now();
        let err = l
            .try_acquire("k3")
            .await
            .expect_err("2 of 5 nodes cannot grant");
        let took = t0.elapsed();
        assert_eq!(err.kind(), ErrorKind::QuorumNotReached, "{err}");
        assert_eq!(err.node_errors().len(), 3, "one cause per lost node: {err}");
        assert!(
            err.to_string().contains("granted"),
            "per-node outcomes: {err}"
        );
        assert!(took < Duration::from_millis(500), "took {took:?}");

        for node in ["redlock3", "redlock4", "redlock5"] {
            ctl(node, NodeAction::Start).await;
        }
        // The same backend, not rebuilt, reaches all five nodes again.
        let c = l
            .try_acquire("k4")
            .await
            .unwrap()
            .expect("all nodes are back");
        assert!(c.release().await.unwrap());
    })
    .await;
}

/// p50 of `n` acquire+release cycles.
async fn cycle_p50(l: &Locker, n: usize) -> Duration {
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t0 = Instant::now();
        let lease = l
            .try_acquire(format!("bh-{i}"))
            .await
            .unwrap()
            .expect("free key");
        assert!(lease.release().await.unwrap());
        times.push(t0.elapsed());
    }
    times.sort();
    times[n / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_node_costs_no_latency_and_leaves_no_key() {
    let ep = require_service!(Service::Redlock);
    let _serial = SERIAL.lock().await;
    let addrs = ep.addrs();
    let proxy = FaultProxy::start(addrs[4]).await.unwrap();
    let mut urls: Vec<String> = ep.urls()[..4].to_vec();
    urls.push(format!("redis://{}", proxy.addr()));
    let prefix = common::prefix("blackhole");
    let backend = common::redlock(&urls, &prefix);
    let l = locker(backend.clone(), Duration::from_secs(10), Renewal::Off);

    cycle_p50(&l, 50).await; // warm up connections and scripts
    let healthy = cycle_p50(&l, 300).await;
    proxy.blackhole();
    let holed = cycle_p50(&l, 300).await;
    proxy.pass();
    eprintln!("redlock cycle p50: healthy {healthy:?}, one node black-holed {holed:?}");
    // What this guards against is a cycle that waits for the black-holed node: its per-node
    // timeout (50 ms for this TTL) on every cycle. The slack is for two loaded cores (1.5× +
    // 0.5 ms failed once at 3.9 against 2.2 ms, in a VM losing a third of its CPU to steal).
    assert!(
        holed <= healthy * 2 + Duration::from_millis(10),
        "black-holed p50 {holed:?} vs healthy {healthy:?}"
    );

    // No key left behind on the healthy nodes (their releases completed before we returned or
    // in background tasks right after).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let direct = common::redlock(ep.urls(), &prefix);
    let counts = direct.count_lock_keys("").await.unwrap();
    assert_eq!(&counts[..4], &[0, 0, 0, 0], "lock keys left: {counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_cycles_with_random_cancellation_leave_zero_keys() {
    let ep = require_service!(Service::Redlock);
    let _serial = SERIAL.lock().await;
    let prefix = common::prefix("leaks");
    let backend = common::redlock(ep.urls(), &prefix);
    let l = locker(backend.clone(), Duration::from_secs(10), Renewal::Off);
    let mut tasks = Vec::new();
    for t in 0..4 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..2_500 {
                let key = format!("k{}", (t * 7 + i) % 16);
                let cancel_after = Duration::from_micros(rand::rng().random_range(0..1_500));
                if let Ok(Ok(Some(lease))) =
                    tokio::time::timeout(cancel_after, l.try_acquire(&key)).await
                {
                    if i % 3 == 0 {
                        drop(lease); // released in the background
                    } else {
                        let _ = lease.release().await;
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let counts = backend.count_lock_keys("").await.unwrap();
        if counts.iter().all(|&c| c == 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "lock keys left after 10,000 cycles: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarting_empty_breaks_mutual_exclusion_and_a_delayed_restart_does_not() {
    let ep = require_service!(Service::Redlock);
    let _serial = SERIAL.lock().await;
    restoring_nodes(async {
        // The hazard: A holds on 3 of 5; one of those restarts empty; B gets a majority too.
        let prefix = common::prefix("crash");
        let a_side = locker(
            common::redlock(ep.urls(), &prefix),
            Duration::from_secs(30),
            Renewal::Off,
        );
        let b_side = locker(
            common::redlock(ep.urls(), &prefix),
            Duration::from_secs(30),
            Renewal::Off,
        );
        ctl("redlock4", NodeAction::Stop).await;
        ctl("redlock5", NodeAction::Stop).await;
        let a = a_side
            .try_acquire("resource")
            .await
            .unwrap()
            .expect("A on 1,2,3");
        ctl("redlock3", NodeAction::Restart).await; // comes back without A's key
        ctl("redlock4", NodeAction::Start).await;
        ctl("redlock5", NodeAction::Start).await;
        let b = b_side
            .try_acquire("resource")
            .await
            .unwrap()
            .expect("B reaches 3,4,5: the documented hazard");
        assert!(!a.is_lost() && !b.is_lost(), "two holders at once");
        drop((a, b));

        // The mitigation: the crashed node stays down for longer than the TTL.
        let prefix = common::prefix("delayed");
        let ttl = Duration::from_millis(1_500);
        let a_side = locker(common::redlock(ep.urls(), &prefix), ttl, Renewal::Off);
        let b_side = locker(common::redlock(ep.urls(), &prefix), ttl, Renewal::Off);
        ctl("redlock4", NodeAction::Stop).await;
        ctl("redlock5", NodeAction::Stop).await;
        let a = a_side
            .try_acquire("resource")
            .await
            .unwrap()
            .expect("A on 1,2,3");
        ctl("redlock3", NodeAction::Stop).await; // crashed, kept down
        ctl("redlock4", NodeAction::Start).await;
        ctl("redlock5", NodeAction::Start).await;
        while !a.is_lost() {
            let b = b_side.try_acquire("resource").await;
            assert!(
                matches!(b, Ok(None)),
                "B must not acquire while A's lease is valid: {b:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // past the server-side TTL too
        ctl("redlock3", NodeAction::Start).await;
        let b = b_side.try_acquire("resource").await.unwrap();
        assert!(
            b.is_some(),
            "after A's TTL and the delayed restart, B acquires"
        );
    })
    .await;
}

/// A grant held on a bare majority (3 of 5: another owner has the key on two nodes), one of
/// whose nodes answers the release later than the acquisition's per-node timeout: the release
/// (which waits for a node up to 1 s) still says the grant was ours, and leaves no key of ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_a_bare_majority_counts_a_late_answer() {
    let ep = require_service!(Service::Redlock);
    let _serial = SERIAL.lock().await;
    let proxy = FaultProxy::start(ep.addrs()[4]).await.unwrap();
    let mut urls: Vec<String> = ep.urls()[..4].to_vec();
    urls.push(format!("redis://{}", proxy.addr()));
    let prefix = common::prefix("late");
    let name = format!("{prefix}{{k}}");
    for url in &ep.urls()[..2] {
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("SET")
            .arg(&name)
            .arg("someone-else")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let l = locker(
        common::redlock(&urls, &prefix),
        Duration::from_secs(10),
        Renewal::Off,
    );
    let lease = l.try_acquire("k").await.unwrap().expect("a bare majority");
    // Node timeout 50 ms: the fifth node's answer now comes after it.
    proxy.latency(Duration::from_millis(300));
    let released = lease.release().await;
    proxy.pass();
    assert!(
        released.unwrap(),
        "a release whose third node answered late said the grant was not ours"
    );
    let counts = common::redlock(ep.urls(), &prefix)
        .count_lock_keys("")
        .await
        .unwrap();
    assert_eq!(
        counts,
        vec![1, 1, 0, 0, 0],
        "only the other owner's keys stay"
    );
}
