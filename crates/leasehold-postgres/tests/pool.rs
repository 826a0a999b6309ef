//! The bounded session pool: many leases share a few sessions (more holders than the server's
//! `max_connections` would allow one connection each), a lost session loses exactly the
//! leases on it, a full pool fails `Unavailable` within the wait budget, and sessions unused
//! for the idle timeout are closed.

mod common;

use std::time::Duration;

use leasehold_core::{
    ErrorKind, LeaseMonitor, LockBackend, LockKey, LockRequest, Locker, LossReason, Owner,
};
use leasehold_postgres::{DEFAULT_APPLICATION_NAME, PostgresBackend, PostgresConfig};
use leasehold_test_support::postgres::sessions_of;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};
use tokio::time::Instant;

/// What each test starts from: its own application name (so it counts only its own sessions
/// and locks), an admin connection, and the server's URL. `None` when the service is missing
/// outside CI.
struct Fixture {
    url: String,
    app: String,
    admin: std::sync::Arc<tokio_postgres::Client>,
    backend: PostgresBackend,
    locker: Locker,
}

/// A [`Fixture`] whose backend has at most `max_sessions` sessions.
async fn fixture(name: &str, max_sessions: usize) -> Result<Option<Fixture>, common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(None));
    let app = unique_prefix(name);
    let cfg = common::config(pg.url(), &app)?.with_max_sessions(max_sessions)?;
    let backend = PostgresBackend::new(cfg);
    Ok(Some(Fixture {
        url: pg.url().to_owned(),
        admin: common::admin(pg.url()).await?,
        locker: Locker::new(backend.clone()),
        backend,
        app,
    }))
}

/// Waits (up to 5 s: closing is asynchronous) until `app` has `n` sessions on the server.
async fn until_server_sessions(
    admin: &tokio_postgres::Client,
    app: &str,
    n: u64,
) -> Result<(), common::BoxError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = sessions_of(admin, app).await?;
        if now == n {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "{now} sessions of {app} on the server, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's `max_connections`.
async fn max_connections(admin: &tokio_postgres::Client) -> Result<u64, common::BoxError> {
    let row = admin.query_one("SHOW max_connections", &[]).await?;
    Ok(row.try_get::<_, String>(0)?.parse()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_holders_than_max_connections_share_eight_sessions() -> Result<(), common::BoxError> {
    let Some(f) = fixture("pg-many", 8).await? else {
        return Ok(());
    };
    let (app, admin, backend, locker) = (f.app, f.admin, f.backend, f.locker);
    let holders = usize::try_from(max_connections(&admin).await?)? + 100;
    // All at once, from many tasks: the pool opens at most 8 sessions.
    let mut tasks = Vec::new();
    for i in 0..holders {
        let (l, key) = (locker.clone(), format!("{app}/{i}"));
        tasks.push(tokio::spawn(async move {
            l.acquire(key, Duration::from_secs(30)).await
        }));
    }
    let mut leases = Vec::new();
    for t in tasks {
        leases.push(t.await??);
    }
    assert_eq!(common::advisory_locks_of(&admin, &app).await?, holders);
    // Our sessions on the server (application_name = app): no admin or sequence session of
    // ours is counted, the backend opens none besides its pool.
    let on_server = sessions_of(&admin, &app).await?;
    eprintln!("{holders} holders on {on_server} sessions");
    assert!(on_server <= 8, "{on_server} sessions for {holders} holders");
    assert!(backend.sessions() <= 8);
    assert!(leases.iter().all(|l| !l.is_lost()));
    for lease in leases {
        assert!(lease.release().await?);
    }
    assert_eq!(common::advisory_locks_of(&admin, &app).await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_loses_its_leases_only() -> Result<(), common::BoxError> {
    const LEASES: usize = 40;
    let Some(f) = fixture("pg-kill-one", 4).await? else {
        return Ok(());
    };
    let (app, admin, backend, locker) = (f.app, f.admin, f.backend, f.locker);
    let interval = backend.config().health_interval();
    let mut tasks = Vec::new();
    for i in 0..LEASES {
        let (l, key) = (locker.clone(), format!("{app}/{i}"));
        tasks.push(tokio::spawn(async move { l.try_acquire(key).await }));
    }
    let mut leases = Vec::new();
    for t in tasks {
        leases.push(t.await??.ok_or("not granted")?);
    }
    // Which server session holds which lease.
    let mut pids = Vec::new();
    for lease in &leases {
        let holders = common::holders(&admin, backend.lock_id(lease.key())).await?;
        assert_eq!(holders.len(), 1);
        pids.push(holders[0]);
    }
    // The session carrying the most leases (40 on at most 4 sessions: 10 or more).
    let count = |pid: i32| pids.iter().filter(|p| **p == pid).count();
    let victim = pids
        .iter()
        .copied()
        .max_by_key(|p| count(*p))
        .ok_or("no lease")?;
    let on_victim = count(victim);
    assert!(on_victim >= LEASES / 4, "{on_victim}");
    assert!(
        on_victim < LEASES,
        "all leases on one session: nothing to leave untouched"
    );
    let killed_at = Instant::now();
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&victim])
        .await?;
    for (lease, pid) in leases.iter().zip(&pids) {
        if *pid != victim {
            continue;
        }
        let limit = (interval + Duration::from_millis(500)).saturating_sub(killed_at.elapsed());
        let reason = tokio::time::timeout(limit, lease.lost().wait())
            .await
            .map_err(|_| "a lease on the terminated session was not reported lost in time")?;
        assert!(matches!(reason, LossReason::Backend(_)), "{reason:?}");
    }
    eprintln!(
        "{on_victim} of {LEASES} leases on the terminated session, all reported lost within {:?}",
        killed_at.elapsed()
    );
    // The others stay held, across a few health checks.
    tokio::time::sleep(interval * 3).await;
    for (lease, pid) in leases.iter().zip(&pids) {
        if *pid == victim {
            assert!(
                !lease.release().await?,
                "a lease of the killed session said held"
            );
        } else {
            assert!(!lease.is_lost(), "{:?}", lease.loss_reason());
        }
    }
    for (lease, pid) in leases.into_iter().zip(pids) {
        if pid != victim {
            assert!(lease.release().await?);
        }
    }
    assert_eq!(common::advisory_locks_of(&admin, &app).await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_fails_unavailable_within_the_budget() -> Result<(), common::BoxError> {
    let Some(f) = fixture("pg-full", 1).await? else {
        return Ok(());
    };
    let (app, admin, backend, locker) = (f.app, f.admin, f.backend, f.locker);
    // Someone else holds `busy`; our waiter takes the one session for its wait in the server.
    let busy = format!("{app}/busy");
    let busy_id = backend.lock_id(&LockKey::new(&busy)?);
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&busy_id])
        .await?;
    let waiter = {
        let (l, key) = (locker.clone(), busy.clone());
        tokio::spawn(async move { l.acquire(key, Duration::from_secs(10)).await })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while common::advisory_locks_of(&admin, &app).await? == 0 {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The pool is full: a try fails at once, a wait after its budget, both `Unavailable`.
    let other = LockKey::new(format!("{app}/other"))?;
    let (owner, monitor) = (Owner::random()?, LeaseMonitor::detached());
    let t0 = Instant::now();
    let req = LockRequest::new(&other, &owner, Duration::from_secs(5), t0, &monitor);
    let err = backend.try_lock(req).await.err().ok_or("granted")?;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    let budget = Duration::from_millis(300);
    let t0 = Instant::now();
    let req = LockRequest::new(&other, &owner, Duration::from_secs(5), t0, &monitor);
    let err = backend
        .wait_lock(req, t0 + budget)
        .await
        .err()
        .ok_or("granted")?;
    let took = t0.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        took >= budget && took < budget + Duration::from_secs(2),
        "{took:?}"
    );
    assert!(!err.to_string().contains("too many clients"), "{err}");
    // Through the Locker, the budget ends with a timeout whose cause is the full pool.
    let err = locker
        .acquire(other.clone(), budget)
        .await
        .err()
        .ok_or("granted")?;
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(sessions_of(&admin, &app).await?, 1);

    // The holder lets go: the waiter gets the lock, its session is shared again.
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&busy_id])
        .await?;
    let lease = waiter.await??;
    let second = locker.try_acquire(other).await?.ok_or("not granted")?;
    assert_eq!(backend.sessions_opened(), 1);
    assert!(second.release().await?);
    assert!(lease.release().await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_sessions_close_after_the_idle_timeout() -> Result<(), common::BoxError> {
    let Some(f) = fixture("pg-idle", 4).await? else {
        return Ok(());
    };
    let Fixture {
        url, app, admin, ..
    } = f;
    let idle_timeout = Duration::from_millis(500);
    let backend = PostgresBackend::new(
        common::config(&url, &app)?
            .with_max_sessions(4)?
            .with_idle_timeout(idle_timeout),
    );
    let locker = Locker::new(backend.clone());
    let lease = locker
        .try_acquire(format!("{app}/k"))
        .await?
        .ok_or("not granted")?;
    until_server_sessions(&admin, &app, 1).await?;
    // A session carrying a lock is never closed for idleness.
    tokio::time::sleep(idle_timeout * 3).await;
    assert_eq!(backend.sessions(), 1);
    assert!(!lease.is_lost());
    assert!(lease.release().await?);
    // Unused now: closed past the idle timeout, with nothing else happening.
    let deadline = Instant::now() + idle_timeout * 8;
    while backend.sessions() > 0 {
        assert!(
            Instant::now() < deadline,
            "an unused session outlived the idle timeout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_server_sessions(&admin, &app, 0).await?;
    Ok(())
}

#[test]
fn application_name_defaults_to_leasehold_and_the_url_overrides_it() -> Result<(), common::BoxError>
{
    let c = PostgresConfig::from_url("postgres://u@127.0.0.1/db")?;
    assert_eq!(
        c.pg_config().get_application_name(),
        Some(DEFAULT_APPLICATION_NAME)
    );
    let c = PostgresConfig::from_url("postgres://u@127.0.0.1/db?application_name=billing")?;
    assert_eq!(c.pg_config().get_application_name(), Some("billing"));
    Ok(())
}

/// A release dropped mid-statement: the unlock goes on in the background on the shared
/// session (closing the session, as one session per lock allowed, would end the other leases
/// on it), and the key comes free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_release_unlocks_in_the_background() -> Result<(), common::BoxError> {
    use std::future::Future;
    use std::task::{Context, Waker};
    let Some(f) = fixture("pg-drop-release", 1).await? else {
        return Ok(());
    };
    let (app, admin, backend, locker) = (f.app, f.admin, f.backend, f.locker);
    let kept = locker
        .try_acquire(format!("{app}/kept"))
        .await?
        .ok_or("not granted")?;
    let key = format!("{app}/dropped");
    for polls in 0..3 {
        let lease = locker.try_acquire(&key).await?.ok_or("not granted")?;
        let id = backend.lock_id(lease.key());
        {
            let mut release = std::pin::pin!(lease.release());
            let mut cx = Context::from_waker(Waker::noop());
            // Dropped after `polls` polls, or sooner if it finished (a finished future must
            // not be polled again).
            for _ in 0..polls {
                if release.as_mut().poll(&mut cx).is_ready() {
                    break;
                }
            }
        }
        drop(lease);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !common::holders(&admin, id).await?.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the dropped release left the lock held"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Ours to take again (the gate opened), and the other lease on the session lives.
        let again = locker.acquire(&key, Duration::from_secs(5)).await?;
        assert!(again.release().await?);
        assert!(!kept.is_lost(), "{:?}", kept.loss_reason());
    }
    assert_eq!(backend.sessions_opened(), 1);
    assert!(kept.release().await?);
    Ok(())
}

/// A wait behind another task of the same process (at the in-process gate) for longer than
/// the validity window ends in a grant whose validity counts from the statement that took the
/// lock, not from when the acquisition began. (It counted from the latter once: the `Locker`
/// then reported such a grant as "arrived after its validity deadline" and had to try again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_a_long_local_wait_is_valid() -> Result<(), common::BoxError> {
    let Some(f) = fixture("pg-long-wait", 4).await? else {
        return Ok(());
    };
    let window = f.backend.config().validity_window();
    let key = LockKey::new(format!("{}/contended", f.app))?;
    let first = f.locker.acquire(&key, Duration::ZERO).await?;
    let (backend, k) = (f.backend.clone(), key.clone());
    let second = tokio::spawn(async move {
        let (owner, monitor) = (Owner::random()?, LeaseMonitor::detached());
        let asked = Instant::now();
        let req = LockRequest::new(&k, &owner, Duration::from_secs(5), asked, &monitor);
        let waited = backend
            .wait_lock(req, asked + Duration::from_secs(30))
            .await?;
        let grant = waited.grant.ok_or("not granted")?;
        Ok::<_, common::BoxError>((asked, grant.validity.from, Instant::now()))
    });
    // Held for twice the window (renewed by the session's health check meanwhile).
    tokio::time::sleep(window * 2).await;
    assert!(!first.is_lost());
    assert!(!second.is_finished(), "the second acquisition did not wait");
    let released = Instant::now();
    assert!(first.release().await?);
    let (asked, from, answered) = second.await??;
    assert!(
        from >= released,
        "validity counted from {:?} before the release (asked {:?} before it)",
        released - from,
        released - asked
    );
    assert!(from <= answered);
    Ok(())
}
