//! The conformance suite against the real PostgreSQL of `scripts/services`.
//!
//! Each check gets its own pair of backends whose sessions carry a unique application_name:
//! the `held` hook counts only those sessions' advisory locks, and the `expire` hook
//! terminates the session holding the lease's key (`pg_terminate_backend`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::LockBackend;
use leasehold_test_support::conformance::Target;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

async fn target() -> Option<Target> {
    let pg = require_service!(Service::Postgres, None);
    let app = unique_prefix("pg-conf");
    let cfg = match common::config(pg.url(), &app) {
        Ok(c) => c,
        Err(e) => panic!("config: {e}"),
    };
    let admin = match common::admin(pg.url()).await {
        Ok(a) => a,
        Err(e) => panic!("admin connection: {e}"),
    };
    let (primary, other) = common::pair(&cfg);
    let ids = primary.clone();
    let primary: Arc<dyn LockBackend> = Arc::new(primary);
    let other: Arc<dyn LockBackend> = Arc::new(other);
    let held_admin = Arc::clone(&admin);
    Some(
        Target::new(primary, other, Duration::from_secs(1))
            .with_held(Arc::new(move || {
                let (admin, app) = (Arc::clone(&held_admin), app.clone());
                Box::pin(async move {
                    common::advisory_locks_of(&admin, &app).await.map_err(|e| {
                        leasehold_core::Error::new(
                            leasehold_core::ErrorKind::Backend,
                            "test",
                            e.to_string(),
                        )
                    })
                })
            }))
            .with_expire(Arc::new(move |lease| {
                let admin = Arc::clone(&admin);
                let id = ids.lock_id(lease.key());
                Box::pin(async move {
                    match common::terminate_holders(&admin, id).await {
                        Ok(1) => {}
                        Ok(n) => panic!("expected to terminate 1 session, terminated {n}"),
                        Err(e) => panic!("pg_terminate_backend: {e}"),
                    }
                })
            })),
    )
}

leasehold_test_support::conformance_tests!(target);
