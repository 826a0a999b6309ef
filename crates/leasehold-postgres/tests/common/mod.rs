//! Helpers shared by this crate's integration tests; the PostgreSQL admin SQL itself lives in
//! `leasehold_test_support::postgres`.
#![allow(dead_code, unreachable_pub, unused_imports)]

use leasehold_postgres::{PostgresBackend, PostgresConfig};
pub use leasehold_test_support::BoxError;
pub use leasehold_test_support::postgres::{
    admin, connect as client, holders, sessions_of, terminate_holders,
};
use tokio_postgres::Client;

/// A config for `url` whose sessions carry `app` as application_name, so a test can count
/// its own locks while other tests run in the same database.
pub fn config(url: &str, app: &str) -> Result<PostgresConfig, BoxError> {
    Ok(PostgresConfig::from_url(url)?.with_application_name(app))
}

/// Advisory locks (granted or awaited) of sessions named `app`.
pub async fn advisory_locks_of(admin: &Client, app: &str) -> Result<usize, BoxError> {
    let locks = leasehold_test_support::postgres::advisory_locks_of(admin, app).await?;
    Ok(usize::try_from(locks.total())?)
}

/// Two independent backends of one unique application name.
pub fn pair(cfg: &PostgresConfig) -> (PostgresBackend, PostgresBackend) {
    (
        PostgresBackend::new(cfg.clone()),
        PostgresBackend::new(cfg.clone()),
    )
}

/// `url` with the query parameters `params` (`a=1&b=2`) added.
pub fn url_with(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// `url` whose sessions start with the server setting `name` = `value` (libpq's `options`,
/// `-c name=value`).
pub fn with_setting(url: &str, name: &str, value: impl std::fmt::Display) -> String {
    url_with(url, &format!("options=-c%20{name}%3D{value}"))
}
