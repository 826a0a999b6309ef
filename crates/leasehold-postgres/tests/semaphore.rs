//! The semaphore checks against the real PostgreSQL of `scripts/services`, and the key spaces
//! of locks and permits kept apart.
//!
//! The two clients carry different application names; the expiry hook terminates the
//! sessions of the first that hold a permit slot of the lease's key.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{ErrorKind, LockBackend, PermitLimit, Semaphore};
use leasehold_postgres::{PostgresBackend, semaphore_key};
use leasehold_test_support::conformance::Target;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

async fn target() -> Option<Target> {
    let pg = require_service!(Service::Postgres, None);
    let app = unique_prefix("pg-sem");
    let cfg = |app: &str| common::config(pg.url(), app).unwrap_or_else(|e| panic!("config: {e}"));
    let admin = common::admin(pg.url())
        .await
        .unwrap_or_else(|e| panic!("admin connection: {e}"));
    let primary = PostgresBackend::new(cfg(&app));
    let other = PostgresBackend::new(cfg(&format!("{app}-other")));
    let prefix = primary.config().prefix().to_owned();
    let primary: Arc<dyn LockBackend> = Arc::new(primary);
    Some(
        Target::new(primary, Arc::new(other), Duration::from_secs(1)).with_expire(Arc::new(
            move |lease| {
                let (admin, app) = (Arc::clone(&admin), app.clone());
                let s = semaphore_key(&format!("{prefix}{}", lease.key().as_str()));
                Box::pin(async move {
                    let killed = admin
                        .query(
                            "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a \
                             WHERE a.application_name = $1 AND EXISTS (SELECT 1 FROM pg_locks l \
                             WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted \
                             AND l.objsubid = 2 AND l.classid = $2)",
                            &[&app, &s.cast_unsigned()],
                        )
                        .await
                        .unwrap_or_else(|e| panic!("pg_terminate_backend: {e}"));
                    assert!(!killed.is_empty(), "no session held the permit");
                })
            },
        )),
    )
}

leasehold_test_support::semaphore_tests!(target);

/// A lock and a one-permit semaphore on one key name are independent (the `bigint` and the
/// two-`int4` advisory key spaces), and the limit stored for a key refuses another one even
/// after every permit is released.
#[tokio::test]
async fn locks_and_permits_use_separate_key_spaces_and_limits_are_stored() {
    let pg = require_service!(Service::Postgres);
    let cfg = common::config(pg.url(), &unique_prefix("pg-sem-space")).unwrap();
    let backend = PostgresBackend::new(cfg);
    let locker = leasehold_core::Locker::new(backend.clone());
    let key = unique_prefix("k");
    let one = Semaphore::from_locker(&locker, PermitLimit::new(1).unwrap()).unwrap();
    let permit = one
        .try_acquire(key.as_str())
        .await
        .unwrap()
        .expect("a free permit");
    let lock = locker
        .try_acquire(key.as_str())
        .await
        .unwrap()
        .expect("the lock is free");
    assert!(one.try_acquire(key.as_str()).await.unwrap().is_none());
    assert_eq!(one.holders(key.as_str()).await.unwrap().len(), 1);
    assert!(permit.release().await.unwrap());
    assert!(lock.release().await.unwrap());
    let two = Semaphore::from_arc(Arc::new(backend), PermitLimit::new(2).unwrap()).unwrap();
    let err = two.try_acquire(key.as_str()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
}
