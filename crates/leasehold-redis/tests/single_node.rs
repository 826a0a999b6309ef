//! Single-node behaviour beyond the suite: wake-ups on release, local FIFO order, interop with
//! redis-cli, the best-effort nature of the fencing counter.

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
async fn waiters_are_woken_by_the_release_message_not_by_polling() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("wake");
    // A fallback backoff of 30 s: only the release message can wake the waiter sooner.
    let holder = common::locker(common::redis(ep.url(), &prefix).await);
    let waiter = slow_polling(ep.url(), &prefix).await;
    let lags = common::handoff_lags(&holder, &waiter, Duration::from_millis(100), 5).await;
    // Polling would take ~30 s; 5 s leaves room for a stall of the loaded machine.
    for lag in lags {
        assert!(
            lag < Duration::from_secs(5),
            "waiter took {lag:?}: polled, not woken"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_process_are_served_in_arrival_order() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("fifo");
    let l = common::locker(common::redis(ep.url(), &prefix).await);
    let first = l.try_acquire("k").await.unwrap().expect("free");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (l, order) = (l.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let lease = l.acquire("k", Duration::from_secs(30)).await.unwrap();
            order.lock().await.push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(lease.release().await.unwrap());
        }));
        // Let each waiter queue before the next arrives.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(first.release().await.unwrap());
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().await, (0..8).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_with_redis_cli_excludes_ours_and_the_other_way_round() {
    let ep = require_service!(Service::Redis);
    let addr = ep.addr().expect("tcp address");
    let prefix = common::prefix("interop");
    let l = common::locker(common::redis(ep.url(), &prefix).await);
    let key = format!("{prefix}{{nightly}}");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(cli(&["SET", &key, "by-hand", "NX", "PX", "30000"]), "OK");
    assert!(l.try_acquire("nightly").await.unwrap().is_none());
    assert_eq!(cli(&["DEL", &key]), "1");
    let lease = l.try_acquire("nightly").await.unwrap().expect("free again");
    assert_eq!(cli(&["SET", &key, "by-hand", "NX", "PX", "30000"]), "");
    assert_eq!(cli(&["GET", &key]), lease.owner().as_str());
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_per_key_in_one_round_trip() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("fence");
    let backend = common::redis(ep.url(), &prefix).await;
    let l = common::locker(backend.clone());
    let mut last = 0;
    for _ in 0..20 {
        let lease = l.try_acquire("k").await.unwrap().expect("free");
        let t = lease.fencing_token().expect("token").get();
        assert!(t > last, "{t} after {last}");
        last = t;
        let info = l.inspect("k").await.unwrap().expect("held");
        assert_eq!(info.owner.as_ref(), Some(lease.owner()));
        assert_eq!(info.fencing.map(|f| f.get()), Some(t));
        assert!(lease.release().await.unwrap());
    }
    assert!(l.inspect("k").await.unwrap().is_none());
    assert_eq!(backend.count_lock_keys("").await.unwrap(), 0);
}

/// However many wait, a release wakes one waiter: one message, on that waiter's own channel
/// (no herd of attempts). Each waiter is on its own connection, polling every 30 s, so each
/// grant within seconds was the work of a release message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_however_many_wait() {
    use futures_util::StreamExt as _;
    const WAITERS: usize = 8;
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("herd");
    let holder = common::locker(common::redis(ep.url(), &prefix).await);
    let mut messages = common::messages(ep.url(), &format!("{prefix}{{k}}:released")).await;
    let raw = redis::Client::open(ep.url()).unwrap();
    let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
    let lease = holder.try_acquire("k").await.unwrap().expect("free");
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let w = slow_polling(ep.url(), &prefix).await;
        let done_tx = done_tx.clone();
        // Each keeps the lock until the test releases it, so each release is watched alone.
        tasks.push(Some(tokio::spawn(async move {
            let l = w.acquire("k", Duration::from_secs(60)).await.unwrap();
            done_tx.send(i).unwrap();
            l
        })));
    }
    let listed = Instant::now() + Duration::from_secs(10);
    loop {
        let n: usize = redis::cmd("ZCARD")
            .arg(format!("{prefix}{{k}}:waitlist"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if n == WAITERS {
            break;
        }
        assert!(
            Instant::now() < listed,
            "{n} of {WAITERS} waiters on the list"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut current = lease;
    let mut woken = std::collections::HashSet::new();
    for handoff in 0..WAITERS {
        assert!(current.release().await.unwrap());
        let msg = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .unwrap_or_else(|_| panic!("handoff {handoff}: no wake-up published"))
            .unwrap();
        let channel = msg.get_channel_name().to_owned();
        assert!(
            channel.starts_with(&format!("{prefix}{{k}}:released:")),
            "woke on {channel}"
        );
        assert!(woken.insert(channel.clone()), "{channel} woken twice");
        let i = tokio::time::timeout(Duration::from_secs(10), done.recv())
            .await
            .unwrap_or_else(|_| panic!("handoff {handoff}: the woken waiter never took the lock"))
            .unwrap();
        // That release published once: the other waiters heard nothing.
        let more = tokio::time::timeout(Duration::from_millis(200), messages.next()).await;
        assert!(
            more.is_err(),
            "handoff {handoff}: a second wake-up for one release"
        );
        let task = tasks[i].take().expect("each waiter is granted once");
        current = task.await.unwrap();
    }
    assert!(current.release().await.unwrap());
}

async fn slow_polling(url: &str, prefix: &str) -> leasehold_core::Locker {
    common::locker(common::redis_slow_fallback(url, prefix).await)
}

/// A release publishes only while some waiter has announced itself (its attempt found the lock
/// held). Many waiters, each on its own connection, arriving while the lock changes hands: each
/// is woken by a release message, none is left to its 30 s fallback. Were a waiter lost (a
/// release skipping the publish although it waited), the chain would take about a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_waiter_is_lost_when_releases_publish_only_to_announced_waiters() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("announce");
    let holder = common::locker(common::redis(ep.url(), &prefix).await);
    let mut waiters = Vec::new();
    for _ in 0..16 {
        waiters.push(slow_polling(ep.url(), &prefix).await);
    }
    let started = Instant::now();
    for round in 0..3 {
        let lease = holder.try_acquire("k").await.unwrap().expect("free");
        let tasks: Vec<_> = waiters
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let w = w.clone();
                tokio::spawn(async move {
                    // Staggered: some arrive while the lock is passed from waiter to waiter.
                    tokio::time::sleep(Duration::from_millis(3 * i as u64)).await;
                    let l = w.acquire("k", Duration::from_secs(60)).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    assert!(l.release().await.unwrap());
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(lease.release().await.unwrap());
        for t in tasks {
            t.await.unwrap();
        }
        eprintln!("round {round}: done after {:?}", started.elapsed());
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "48 handoffs took {took:?}: some waiter was left to its fallback backoff"
    );
}

/// With nobody waiting a release publishes nothing (the uncontended cycle costs the server no
/// wake-up); with a waiter it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_when_someone_waits() {
    use futures_util::StreamExt as _;
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("quiet");
    let l = common::locker(common::redis(ep.url(), &prefix).await);
    let mut messages = common::messages(ep.url(), &format!("{prefix}{{k}}:released")).await;
    for _ in 0..20 {
        let lease = l.try_acquire("k").await.unwrap().expect("free");
        assert!(lease.release().await.unwrap());
    }
    let quiet = tokio::time::timeout(Duration::from_millis(300), messages.next()).await;
    assert!(quiet.is_err(), "an uncontended release published a wake-up");
    let lease = l.try_acquire("k").await.unwrap().expect("free");
    let waiter = slow_polling(ep.url(), &prefix).await;
    let w = tokio::spawn(async move { waiter.acquire("k", Duration::from_secs(20)).await });
    common::until_waiting(&[ep.url().to_owned()], &prefix, 1).await;
    assert!(lease.release().await.unwrap());
    let woke = tokio::time::timeout(Duration::from_secs(5), messages.next()).await;
    assert!(
        matches!(woke, Ok(Some(_))),
        "no wake-up published for a waiter"
    );
    let got = w.await.unwrap().unwrap();
    assert!(got.release().await.unwrap());
}

/// An `acquire` that finds the lock free takes it in one attempt, with no subscription (in
/// either mode); one that finds it held subscribes to its wake-up channel. Watched with
/// `MONITOR`, filtered to this test's names (other tests share the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_acquire_that_finds_the_lock_held_subscribes() {
    use futures_util::StreamExt as _;
    let ep = require_service!(Service::Redis);
    for fair in [false, true] {
        let prefix = common::prefix(if fair { "nosub-fair" } else { "nosub" });
        let backend = if fair {
            common::redis_fair(ep.url(), &prefix, Duration::from_secs(2)).await
        } else {
            common::redis(ep.url(), &prefix).await
        };
        let l = common::locker(backend);
        let monitor = redis::Client::open(ep.url())
            .unwrap()
            .get_async_monitor()
            .await
            .unwrap();
        let mut lines = monitor.into_on_message::<String>();
        let subscribes = |lines: &[String]| {
            lines
                .iter()
                .filter(|l| l.to_ascii_uppercase().contains("\"SUBSCRIBE\"") && l.contains(&prefix))
                .count()
        };
        let mut seen = Vec::new();
        let mut drain = async |seen: &mut Vec<String>, marker: &str| {
            // Until a marker sent after the acquisitions comes by: every command before it.
            let marker = format!("{prefix}{marker}");
            let mut c = redis::Client::open(ep.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let _: Option<String> = redis::cmd("GET")
                .arg(&marker)
                .query_async(&mut c)
                .await
                .unwrap();
            while let Some(line) = tokio::time::timeout(Duration::from_secs(10), lines.next())
                .await
                .expect("MONITOR went quiet")
            {
                if line.contains(&marker) {
                    return;
                }
                seen.push(line);
            }
            panic!("MONITOR ended");
        };

        for _ in 0..5 {
            let lease = l.acquire("k", Duration::from_secs(5)).await.unwrap();
            assert!(lease.release().await.unwrap());
        }
        drain(&mut seen, "free").await;
        assert_eq!(
            subscribes(&seen),
            0,
            "fair: {fair}; an uncontended acquire subscribed"
        );
        assert!(
            seen.iter().any(|l| l.contains(&prefix)),
            "fair: {fair}; MONITOR saw none of the acquisitions"
        );

        let holder = l.try_acquire("k").await.unwrap().expect("free");
        let waiter = common::locker(if fair {
            common::redis_fair(ep.url(), &prefix, Duration::from_secs(2)).await
        } else {
            common::redis(ep.url(), &prefix).await
        });
        let w = tokio::spawn(async move { waiter.acquire("k", Duration::from_secs(20)).await });
        common::until_waiting(&[ep.url().to_owned()], &prefix, 1).await;
        assert!(holder.release().await.unwrap());
        let got = w.await.unwrap().unwrap();
        assert!(got.release().await.unwrap());
        seen.clear();
        drain(&mut seen, "held").await;
        assert_eq!(
            subscribes(&seen),
            1,
            "fair: {fair}; the waiter's subscription"
        );
    }
}

/// A release hands the lock to the waiter that came first, and the releaser asking again at
/// once does not jump ahead of it. The waiters sit 80 ms further away (a proxy's round trip),
/// so a releaser that could take a freed lock would always come first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_on_in_arrival_order() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("order");
    let holder = common::locker(common::redis(ep.url(), &prefix).await);
    let (mut waiters, mut proxies) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let (backend, proxy) =
            common::redis_behind_proxy(&ep, &prefix, Duration::from_secs(5)).await;
        proxy.latency(Duration::from_millis(40));
        waiters.push(common::locker(backend));
        proxies.push(proxy);
    }
    common::handed_on_in_arrival_order(holder, waiters, &[ep.url().to_owned()], &prefix).await;
}

/// A waiter marks a leasehold holder's value (`~` appended) when it announces itself, so that
/// the holder's release hands the lock on; a holder nobody waits for keeps its bare value,
/// which its release deletes as a bare compare-and-delete does. A marked lease still renews,
/// and reads back as its owner. A by-hand holder's value is never touched: its own
/// compare-and-delete still gives the lock back, and the waiter then takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_marks_our_holders_value_and_never_a_by_hand_holders() {
    let ep = require_service!(Service::Redis);
    let prefix = common::prefix("mark");
    let key = format!("{prefix}{{k}}");
    let raw = redis::Client::open(ep.url()).unwrap();
    let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
    let c = conn.clone();
    let value = || {
        let (mut c, key) = (c.clone(), key.clone());
        async move {
            redis::AsyncCommands::get::<_, Option<String>>(&mut c, &key)
                .await
                .unwrap()
        }
    };
    let ttl = Duration::from_millis(900);
    let renewed = leasehold_test_support::harness::locker(
        common::redis(ep.url(), &prefix).await,
        ttl,
        leasehold_core::Renewal::Auto,
    );
    let lease = renewed.try_acquire("k").await.unwrap().expect("free");
    let owner = lease.owner().as_str().to_owned();
    assert_eq!(value().await.as_deref(), Some(owner.as_str()));

    let waiter = slow_polling(ep.url(), &prefix).await;
    let w = tokio::spawn(async move { waiter.acquire("k", Duration::from_secs(30)).await });
    common::until_waiting(&[ep.url().to_owned()], &prefix, 1).await;
    assert_eq!(value().await, Some(format!("{owner}~")), "not marked");
    // Renewed past three TTLs with the mark on, and read back as its owner.
    tokio::time::sleep(ttl * 3).await;
    assert!(!lease.is_lost(), "the marked lease was not renewed");
    let info = renewed.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.owner.as_ref(), Some(lease.owner()));
    // Marked: the release hands the lock to the waiter and wakes it (it polls every 30 s).
    assert!(lease.release().await.unwrap());
    let handed = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    // Nobody else waits: the new holder's value is bare, and its release deletes it.
    assert_eq!(value().await.as_deref(), Some(handed.owner().as_str()));
    assert!(handed.release().await.unwrap());
    assert_eq!(value().await, None);

    // By hand, with a value a waiter must not touch.
    let set: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg("by-hand")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let polling = common::locker(common::redis(ep.url(), &prefix).await);
    let w = tokio::spawn(async move { polling.acquire("k", Duration::from_secs(30)).await });
    common::until_waiting(&[ep.url().to_owned()], &prefix, 1).await;
    assert_eq!(value().await.as_deref(), Some("by-hand"));
    let deleted: i64 = redis::Script::new(
        "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0",
    )
    .key(&key)
    .arg("by-hand")
    .invoke_async(&mut conn)
    .await
    .unwrap();
    assert_eq!(deleted, 1, "the by-hand release failed");
    let got = tokio::time::timeout(Duration::from_secs(5), w)
        .await
        .expect("the waiter did not take the lock given back by hand")
        .unwrap()
        .unwrap();
    assert!(got.release().await.unwrap());
}
