//! Interop with other users of the same advisory locks: sqlx's `PgAdvisoryLock` (same key
//! derivation) and pgbouncer in transaction pooling mode (`lock_xact` works through it,
//! session locks do not belong to their client there).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold_core::{LockKey, Locker};
use leasehold_postgres::PostgresBackend;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};
use sqlx::Connection as _;
use sqlx::postgres::{PgAdvisoryLock, PgConnection};

/// Serialises the pgbouncer tests: one of them terminates a pooled server connection, which
/// pgbouncer may have handed to the other test's client meanwhile.
static BOUNCER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_advisory_lock_and_ours_exclude_each_other() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-sqlx");
    let prefix = format!("{app}/");
    let cfg = common::config(pg.url(), &app)?.with_prefix(prefix.clone())?;
    let backend = PostgresBackend::connect(cfg).await?;
    let locker = Locker::new(backend.clone());
    let key = LockKey::new("billing/export")?;
    let sqlx_lock = PgAdvisoryLock::new(format!("{prefix}billing/export"));
    assert_eq!(sqlx_lock.key().as_bigint(), Some(backend.lock_id(&key)));
    let mut conn = PgConnection::connect(pg.url()).await?;

    // sqlx holds it: ours is refused; after sqlx releases, ours gets it.
    let guard = sqlx_lock.acquire(&mut conn).await?;
    assert!(
        locker.try_acquire(&key).await?.is_none(),
        "our try_acquire got a lock sqlx holds"
    );
    let conn_ref = guard.release_now().await?;
    let _ = conn_ref;
    let lease = locker
        .try_acquire(&key)
        .await?
        .ok_or("not granted after sqlx released")?;

    // We hold it: sqlx's try_acquire is refused; after we release, sqlx gets it.
    match sqlx_lock.try_acquire(&mut conn).await? {
        sqlx::Either::Left(_guard) => panic!("sqlx got a lock we hold"),
        sqlx::Either::Right(_conn) => {}
    }
    assert!(lease.release().await?);
    match sqlx_lock.try_acquire(&mut conn).await? {
        sqlx::Either::Left(guard) => {
            guard.release_now().await?;
        }
        sqlx::Either::Right(_) => panic!("sqlx refused after we released"),
    }
    conn.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_xact_contends_through_pgbouncer_transaction_pooling() -> Result<(), common::BoxError>
{
    let pg = require_service!(Service::Postgres, Ok(()));
    let bouncer = require_service!(Service::PgBouncer, Ok(()));
    let _serial = BOUNCER.lock().await;
    let app = unique_prefix("pg-bouncer");
    // The fencing sequence must exist: any direct session-mode connect creates it.
    drop(PostgresBackend::connect(common::config(pg.url(), &app)?).await?);
    // Through pgbouncer only `lock_xact` is used (no session of the backend is opened).
    let backend = PostgresBackend::new(common::config(bouncer.url(), &app)?);
    let key = LockKey::new(format!("{app}/k"))?;

    // Two clients of pgbouncer: one holds, the other's try is refused, its wait is granted
    // at the holder's commit, with a higher token.
    let (mut c1, mut c2) = (
        common::client(bouncer.url()).await?,
        common::client(bouncer.url()).await?,
    );
    let tx1 = c1.transaction().await?;
    let t1 = backend
        .lock_xact(&tx1, &key, Duration::ZERO)
        .await?
        .ok_or("free key not granted through pgbouncer")?;
    let tx2 = c2.transaction().await?;
    assert!(
        backend
            .lock_xact(&tx2, &key, Duration::ZERO)
            .await?
            .is_none(),
        "two pgbouncer clients both hold the xact lock"
    );
    let commit_later = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx1.commit().await
    };
    let (got, committed) = tokio::join!(
        backend.lock_xact(&tx2, &key, Duration::from_secs(10)),
        commit_later
    );
    committed?;
    let t2 = got?.ok_or("waiter not granted after the holder committed")?;
    assert!(t2 > t1, "token {t2} not above {t1}");
    tx2.commit().await?;

    // Several pgbouncer clients contend in a loop: never two holders, tokens increase in
    // grant order.
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 5;
    let inside = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (backend, key, url) = (backend.clone(), key.clone(), bouncer.url().to_owned());
        let (inside, granted) = (Arc::clone(&inside), Arc::clone(&granted));
        tasks.push(tokio::spawn(async move {
            let mut client = common::client(&url).await?;
            for _ in 0..ROUNDS {
                let tx = client.transaction().await?;
                let token = backend
                    .lock_xact(&tx, &key, Duration::from_secs(20))
                    .await?
                    .ok_or("not granted within 20 s")?;
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                granted.lock().map_err(|_| "poisoned")?.push(token.get());
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.store(false, Ordering::SeqCst);
                tx.commit().await?;
            }
            Ok::<_, common::BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let granted = granted.lock().map_err(|_| "poisoned")?.clone();
    assert_eq!(granted.len(), CLIENTS * ROUNDS);
    assert!(
        granted.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing in grant order: {granted:?}"
    );
    assert!(granted[0] > t2.get());
    Ok(())
}

/// Why the session mode must not go through a transaction pooler: a session lock taken
/// through pgbouncer belongs to a pooled *server* connection, not to the client, so it
/// outlives the client that took it (and another client may later run on that server
/// connection, "holding" it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lock_through_pgbouncer_outlives_its_client() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let bouncer = require_service!(Service::PgBouncer, Ok(()));
    let _serial = BOUNCER.lock().await;
    let admin = common::admin(pg.url()).await?;
    let id: i64 = rand::random();
    let client = common::client(bouncer.url()).await?;
    let rows = client
        .simple_query(&format!("SELECT pg_try_advisory_lock({id})"))
        .await?;
    let took = rows
        .iter()
        .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("t")));
    assert!(took, "pg_try_advisory_lock through pgbouncer failed");
    drop(client); // the client is gone ...
    tokio::time::sleep(Duration::from_millis(300)).await;
    let holders = common::holders(&admin, id).await?;
    // ... the lock is not: pgbouncer keeps the server connection in its pool.
    let cleaned = common::terminate_holders(&admin, id).await?;
    // Give pgbouncer a moment to notice the dead server connection before the next test.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        holders.len(),
        1,
        "the session lock should outlive its pgbouncer client"
    );
    assert_eq!(cleaned, 1);
    Ok(())
}
