//! Real faults and interop against the PostgreSQL of `scripts/services`: session kills, a
//! partition, dropped waits, in-process contention, psql and raw-SQL interop, unix sockets.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use common::BoxError;
use leasehold_core::{ErrorKind, Locker, LossReason};
use leasehold_postgres::{KEY_SQL, PostgresBackend, advisory_key, numeric_key};
use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};
use tokio::time::Instant;

type TestResult = Result<(), BoxError>;

fn locker(b: &PostgresBackend) -> Locker {
    Locker::new(b.clone())
}

/// Waits until `cond` holds (polling every 10 ms) or `limit` passes.
async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> Result<bool, BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, BoxError>>,
{
    let end = Instant::now() + limit;
    loop {
        if cond().await? {
            return Ok(true);
        }
        if Instant::now() >= end {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_local_tasks_on_one_key_never_overlap() -> TestResult {
    const TASKS: usize = 32;
    const ROUNDS: usize = 5;
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-reentrancy");
    let backend = PostgresBackend::new(common::config(pg.url(), &app)?);
    let key = format!("{app}/k");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let l = locker(&backend);
        let (key, counter, inside, overlaps, last_token) = (
            key.clone(),
            Arc::clone(&counter),
            Arc::clone(&inside),
            Arc::clone(&overlaps),
            Arc::clone(&last_token),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = l.acquire(&key, Duration::from_secs(60)).await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let token = lease.fencing_token().map_or(0, |t| t.get());
                let prev = last_token.swap(token, Ordering::SeqCst);
                if token <= prev {
                    overlaps.fetch_add(1000, Ordering::SeqCst);
                }
                let v = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                if !lease.release().await? {
                    return Err::<(), BoxError>("release said not held".into());
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "overlap or non-increasing token"
    );
    assert_eq!(counter.load(Ordering::SeqCst), (TASKS * ROUNDS) as u64);
    // Local contenders queue in the process: a handful of sessions, not one per task.
    let opened = backend.sessions_opened();
    eprintln!(
        "32 tasks x {ROUNDS} rounds: {:?} total, {:.2} ms per cycle, {opened} sessions opened",
        elapsed,
        elapsed.as_secs_f64() * 1e3 / (TASKS * ROUNDS) as f64
    );
    assert!(
        opened <= 4,
        "{opened} sessions opened for one contended key"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_session_fires_lost_and_release_says_not_held() -> TestResult {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-terminate");
    let cfg = common::config(pg.url(), &app)?;
    let interval = cfg.health_interval();
    let (a, b) = common::pair(&cfg);
    let admin = common::admin(pg.url()).await?;
    let key = format!("{app}/k");
    let lease = locker(&a)
        .try_acquire(&key)
        .await?
        .ok_or("free key not granted")?;
    let id = a.lock_id(lease.key());
    assert_eq!(common::holders(&admin, id).await?.len(), 1);
    // Let a few health checks pass first: the lease stays valid across them.
    tokio::time::sleep(interval * 4).await;
    assert!(!lease.is_lost(), "{:?}", lease.loss_reason());

    let killed_at = Instant::now();
    assert_eq!(common::terminate_holders(&admin, id).await?, 1);
    let reason = tokio::time::timeout(interval + Duration::from_millis(250), lease.lost().wait())
        .await
        .map_err(|_| "lost signal did not fire within the health interval + 250 ms")?;
    let latency = killed_at.elapsed();
    eprintln!("lost signal {latency:?} after pg_terminate_backend: {reason}");
    assert!(matches!(reason, LossReason::Backend(_)), "{reason:?}");

    let other = locker(&b).acquire(&key, Duration::from_secs(5)).await?;
    assert!(other.fencing_token() > lease.fencing_token());
    assert!(
        !lease.release().await?,
        "release of a killed session said held"
    );
    assert!(!lease.release().await?, "idempotent");
    assert!(other.release().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_is_caught_by_the_health_check() -> TestResult {
    let pg = require_service!(Service::Postgres, Ok(()));
    let upstream = pg.addr().ok_or("no TCP address")?;
    let proxy = FaultProxy::start(upstream).await?;
    let url = pg
        .url()
        .replace(&upstream.to_string(), &proxy.addr().to_string());
    let app = unique_prefix("pg-partition");
    let cfg = common::config(&url, &app)?
        .with_health(Duration::from_millis(200), Duration::from_millis(300))?;
    let a = PostgresBackend::new(cfg);
    let b = PostgresBackend::new(common::config(pg.url(), &app)?);
    let key = format!("{app}/k");
    let lease = locker(&a)
        .try_acquire(&key)
        .await?
        .ok_or("free key not granted")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!lease.is_lost());

    let cut_at = Instant::now();
    proxy.blackhole();
    // Worst case: a check just passed (200 ms to the next) + 300 ms for it to time out.
    let reason = tokio::time::timeout(Duration::from_millis(900), lease.lost().wait())
        .await
        .map_err(|_| "partition not noticed within interval + timeout + 400 ms")?;
    eprintln!(
        "lost signal {:?} after the partition: {reason}",
        cut_at.elapsed()
    );
    assert!(lease.is_lost());
    // The server still has the session (it sees nothing): the lock is only freed once the
    // connection really ends. Cut it, as the server's own keepalive eventually would.
    assert!(locker(&b).try_acquire(&key).await?.is_none());
    proxy.cut();
    let got = locker(&b).acquire(&key, Duration::from_secs(5)).await?;
    assert!(got.fencing_token() > lease.fencing_token());
    assert!(!lease.release().await?);
    assert!(got.release().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_wait_cancels_the_server_side_wait() -> TestResult {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-dropwait");
    let backend = PostgresBackend::new(common::config(pg.url(), &app)?);
    let admin = common::admin(pg.url()).await?;
    let key = format!("{app}/k");
    let id = backend.lock_id(&leasehold_core::LockKey::new(&key)?);
    admin.execute("SELECT pg_advisory_lock($1)", &[&id]).await?;

    let waiter = {
        let (l, key) = (locker(&backend), key.clone());
        tokio::spawn(async move { l.acquire(&key, Duration::from_secs(30)).await })
    };
    let queued = eventually(Duration::from_secs(5), || async {
        Ok(common::advisory_locks_of(&admin, &app).await? == 1)
    })
    .await?;
    assert!(queued, "our wait never showed up in pg_locks");
    waiter.abort();
    let gone = eventually(Duration::from_secs(2), || async {
        Ok(common::advisory_locks_of(&admin, &app).await? == 0)
    })
    .await?;
    assert!(gone, "the aborted wait is still queued on the server");

    // The holder lets go: nobody of ours takes the lock behind its back.
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&id])
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(common::holders(&admin, id).await?.is_empty());
    let lease = locker(&backend)
        .try_acquire(&key)
        .await?
        .ok_or("key not free after the dropped wait")?;
    assert!(lease.release().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_times_out_on_budget_then_succeeds_on_release() -> TestResult {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-wait");
    let backend = PostgresBackend::new(common::config(pg.url(), &app)?);
    let admin = common::admin(pg.url()).await?;
    let key = format!("{app}/k");
    let id = backend.lock_id(&leasehold_core::LockKey::new(&key)?);
    admin.execute("SELECT pg_advisory_lock($1)", &[&id]).await?;

    let t0 = Instant::now();
    let err = locker(&backend)
        .acquire(&key, Duration::from_millis(300))
        .await
        .err()
        .ok_or("acquired a held lock")?;
    let took = t0.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took >= Duration::from_millis(295) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(common::advisory_locks_of(&admin, &app).await?, 0);

    // A waiter gets it when the holder releases, through the server's queue.
    let waiter = {
        let (l, key) = (locker(&backend), key.clone());
        tokio::spawn(async move { l.acquire(&key, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&id])
        .await?;
    let lease = waiter.await??;
    assert_eq!(common::holders(&admin, id).await?.len(), 1);
    assert!(lease.release().await?);
    assert!(common::holders(&admin, id).await?.is_empty());
    // One session served all of it: the timed-out wait left it clean and reusable.
    assert_eq!(backend.sessions_opened(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_sql_matches_and_raw_sql_lock_blocks_us() -> TestResult {
    let pg = require_service!(Service::Postgres, Ok(()));
    let admin = common::admin(pg.url()).await?;
    for name in [
        "my first Postgres advisory lock!",
        "billing/export",
        "ünïcødé 🔒",
        "x",
    ] {
        let row = admin.query_one(KEY_SQL, &[&name]).await?;
        assert_eq!(row.get::<_, i64>(0), advisory_key(name), "{name}");
    }
    let app = unique_prefix("pg-rawsql");
    let backend = PostgresBackend::new(
        common::config(pg.url(), &app)?
            .with_prefix("svc/")?
            .with_advisory_keys(true),
    );
    let key = format!("{app}/k");
    // The documented mapping: advisory_key(prefix + key), computed by the server.
    admin
        .execute(
            &format!("SELECT pg_advisory_lock(({KEY_SQL}))"),
            &[&format!("svc/{key}")],
        )
        .await?;
    assert!(locker(&backend).try_acquire(&key).await?.is_none());
    admin
        .execute("SELECT pg_advisory_unlock_all()", &[])
        .await?;
    let lease = locker(&backend)
        .try_acquire(&key)
        .await?
        .ok_or("not free")?;
    assert!(lease.release().await?);

    // Explicit numeric keys are the number itself, prefix or not.
    let n: i64 = rand::random::<i64>() | 1;
    admin.execute("SELECT pg_advisory_lock($1)", &[&n]).await?;
    assert!(
        locker(&backend)
            .try_acquire(numeric_key(n))
            .await?
            .is_none()
    );
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&n])
        .await?;
    let lease = locker(&backend)
        .try_acquire(numeric_key(n))
        .await?
        .ok_or("numeric key not free")?;
    assert_eq!(common::holders(&admin, n).await?.len(), 1);
    assert!(lease.release().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_lock_blocks_our_try_acquire() -> TestResult {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-psql");
    let backend = PostgresBackend::new(common::config(pg.url(), &app)?);
    let admin = common::admin(pg.url()).await?;
    let key = format!("{app}/k");
    let id = advisory_key(&key);
    assert_eq!(backend.lock_id(&leasehold_core::LockKey::new(&key)?), id);
    // psql takes the lock by number, as the docs show, and holds it for a while.
    let mut psql = tokio::process::Command::new("psql")
        .arg("-X")
        .arg("-q")
        .arg("-c")
        .arg(format!("SELECT pg_advisory_lock({id})"))
        .arg("-c")
        .arg("SELECT pg_sleep(1.5)")
        .arg(pg.url())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let held = eventually(Duration::from_secs(5), || async {
        Ok(!common::holders(&admin, id).await?.is_empty())
    })
    .await?;
    assert!(held, "psql never took the lock");
    assert!(locker(&backend).try_acquire(&key).await?.is_none());
    let status = tokio::time::timeout(Duration::from_secs(10), psql.wait()).await??;
    assert!(status.success(), "psql failed: {status}");
    let lease = locker(&backend)
        .acquire(&key, Duration::from_secs(5))
        .await?;
    assert!(lease.release().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_works() -> TestResult {
    let sock = require_service!(Service::PostgresSocket, Ok(()));
    let app = unique_prefix("pg-socket");
    let a = PostgresBackend::connect(common::config(sock.url(), &app)?).await?;
    let b = PostgresBackend::new(common::config(sock.url(), &app)?);
    let key = format!("{app}/k");
    let lease = locker(&a).try_acquire(&key).await?.ok_or("not granted")?;
    assert!(lease.fencing_token().is_some());
    assert!(locker(&b).try_acquire(&key).await?.is_none());
    let info = locker(&b)
        .inspect(&key)
        .await?
        .ok_or("inspect saw no holder")?;
    assert!(info.detail.is_some_and(|d| d.contains("pid")));
    assert!(lease.release().await?);
    assert!(locker(&b).inspect(&key).await?.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_cycles_reuse_one_session() -> TestResult {
    const CYCLES: u32 = 40;
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-pool");
    let backend = PostgresBackend::new(common::config(pg.url(), &app)?);
    let l = locker(&backend);
    let key = format!("{app}/k");
    // Warm up (first connect creates/checks the sequence).
    l.try_acquire(&key)
        .await?
        .ok_or("not granted")?
        .release()
        .await?;
    let t0 = Instant::now();
    for _ in 0..CYCLES {
        let lease = l.try_acquire(&key).await?.ok_or("not granted")?;
        assert!(lease.release().await?);
    }
    eprintln!("pooled: {:?} per try+release cycle", t0.elapsed() / CYCLES);
    assert_eq!(backend.sessions_opened(), 1, "the session was not reused");
    Ok(())
}
