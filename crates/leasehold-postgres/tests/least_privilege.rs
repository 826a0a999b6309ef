//! An application role without `CREATE` on the schema (every role but the schema owner's, by
//! default since PostgreSQL 15) works with the sequence and tables an administrator created
//! and granted to it: locks with fencing tokens, semaphores, elections and the fence store.
//! `CREATE … IF NOT EXISTS` checks that privilege before it looks, so the driver looks first.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Candidate, Elector, LockBackend, Locker, PermitLimit, Renewal, Semaphore};
use leasehold_postgres::{PostgresBackend, PostgresFenceStore};
use leasehold_test_support::harness;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

/// `url` with its user and password replaced by `user` and `password`.
fn as_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}:{password}@{host}")
}

/// Through `url` (sessions named `app`): a lock with a fencing token, a semaphore permit and
/// a leadership, each given back, and the fence store `fence_table` opened. Between them they
/// use everything the driver stores.
async fn use_everything(url: &str, app: &str, fence_table: &str) -> Result<(), common::BoxError> {
    let backend = PostgresBackend::new(common::config(url, app)?);
    let locker = Locker::new(backend.clone());
    let lease = locker
        .try_acquire(format!("{app}/k"))
        .await?
        .ok_or("held")?;
    assert!(lease.fencing_token().is_some(), "no token");
    assert!(lease.release().await?);
    let sem = Semaphore::from_locker(&locker, PermitLimit::new(2)?)?;
    let permit = sem
        .try_acquire(format!("{app}/s"))
        .await?
        .ok_or("no permit")?;
    assert!(permit.release().await?);
    let elector = Elector::new(
        Arc::new(backend) as Arc<dyn LockBackend>,
        format!("{app}/e"),
        Candidate::new("me")?,
        harness::options(Duration::from_secs(5), Renewal::Auto),
    )?;
    let lead = elector.campaign_for(Duration::from_secs(5)).await?;
    assert!(lead.resign().await?);
    PostgresFenceStore::connect(url, fence_table).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_create_uses_what_an_administrator_made() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let app = unique_prefix("pg-least-privilege");
    let admin = common::admin(pg.url()).await?;
    let role = app.replace('-', "_");
    let fence_table = format!("{role}_fence");

    // The administrator's part: every object made once (here by the driver itself, as the
    // owner), then the role, granted their use and nothing more.
    use_everything(pg.url(), &app, &fence_table).await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD 'least'; \
             GRANT USAGE ON SEQUENCE public.leasehold_fence TO \"{role}\"; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON public.leasehold_semaphores, \
                   leasehold_leaders, \"{fence_table}\" TO \"{role}\""
        ))
        .await?;
    let row = admin
        .query_one(
            "SELECT has_schema_privilege($1, 'public', 'CREATE')",
            &[&role],
        )
        .await?;
    assert!(
        !row.get::<_, bool>(0),
        "the role may create: nothing is tested"
    );

    let outcome = use_everything(&as_user(pg.url(), &role, "least"), &app, &fence_table).await;
    admin
        .batch_execute(&format!(
            "DROP TABLE \"{fence_table}\"; DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""
        ))
        .await?;
    outcome
}
