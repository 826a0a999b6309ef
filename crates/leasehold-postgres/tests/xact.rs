//! Transaction mode: `pg_advisory_xact_lock` inside the caller's transaction.

mod common;

use std::time::Duration;

use leasehold_core::{LockKey, Locker};
use leasehold_postgres::PostgresBackend;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xact_lock_lives_and_dies_with_the_transaction() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-xact");
    let backend = PostgresBackend::new(common::config(pg.url(), &app)?);
    let key = LockKey::new(format!("{app}/k"))?;
    let (mut c1, mut c2) = (
        common::client(pg.url()).await?,
        common::client(pg.url()).await?,
    );

    let tx1 = c1.transaction().await?;
    let t1 = backend
        .lock_xact(&tx1, &key, Duration::ZERO)
        .await?
        .ok_or("free key not granted")?;
    // Same key space as session-mode leases.
    assert!(
        Locker::new(backend.clone())
            .try_acquire(&key)
            .await?
            .is_none()
    );

    // A timed-out wait leaves the other transaction usable, with its own timeouts.
    let tx2 = c2.transaction().await?;
    tx2.batch_execute("SET LOCAL lock_timeout = '7s'; SET LOCAL statement_timeout = '250ms'")
        .await?;
    let timeouts = || async {
        let row = tx2
            .query_one(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')",
                &[],
            )
            .await?;
        Ok::<_, tokio_postgres::Error>((row.get::<_, String>(0), row.get::<_, String>(1)))
    };
    let none = backend
        .lock_xact(&tx2, &key, Duration::from_millis(200))
        .await?;
    assert!(none.is_none());
    assert_eq!(timeouts().await?, ("7s".to_owned(), "250ms".to_owned()));

    // A waiter is granted when the holder's transaction ends (after the transaction's own
    // statement_timeout: the wait is bounded by its budget alone), and restores both timeouts.
    let commit_later = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        tx1.commit().await
    };
    let (got, committed) = tokio::join!(
        backend.lock_xact(&tx2, &key, Duration::from_secs(10)),
        commit_later
    );
    committed?;
    let t2 = got?.ok_or("waiter not granted after commit")?;
    assert!(t2 > t1, "token {t2} not above {t1}");
    assert_eq!(timeouts().await?, ("7s".to_owned(), "250ms".to_owned()));
    assert!(
        Locker::new(backend.clone())
            .try_acquire(&key)
            .await?
            .is_none()
    );
    tx2.rollback().await?;
    let lease = Locker::new(backend.clone())
        .try_acquire(&key)
        .await?
        .ok_or("the xact lock outlived its transaction")?;
    assert!(lease.fencing_token().map(|t| t.get()) > Some(t2.get()));
    assert!(lease.release().await?);
    Ok(())
}

/// The fencing sequence's name is bound (`$n::text::regclass`), never spliced into an SQL
/// string literal: with `standard_conforming_strings = off` a backslash in a quoted literal is
/// an escape, so a name ending in `\` used to turn `nextval('"public"."s\"')` into another
/// name (and a crafted name into SQL of its choosing). Session and transaction mode both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sequence_name_is_bound_not_spliced() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-regclass");
    let url = common::with_setting(pg.url(), "standard_conforming_strings", "off");
    let sequence = format!("{}\\", app.replace('-', "_"));
    let cfg = common::config(&url, &app)?.with_fence_sequence("public", sequence.as_str())?;
    let backend = PostgresBackend::new(cfg);
    let key = LockKey::new(format!("{app}/k"))?;
    let lease = Locker::new(backend.clone())
        .try_acquire(&key)
        .await?
        .ok_or("free key not granted")?;
    let first = lease.fencing_token().ok_or("no token")?;
    assert!(lease.release().await?);

    let mut client = common::client(&url).await?;
    let tx = client.transaction().await?;
    let second = backend
        .lock_xact(&tx, &key, Duration::ZERO)
        .await?
        .ok_or("free key not granted")?;
    assert!(second > first, "{second} after {first}");
    tx.rollback().await?;
    client
        .batch_execute(&format!("DROP SEQUENCE \"public\".\"{sequence}\""))
        .await?;
    Ok(())
}
