//! Set-up that driver tests share: a namespace per test and a [`Locker`] with the options a
//! test asks for.

use std::time::Duration;

use leasehold_core::{LockBackend, LockOptions, Locker, Renewal};

use crate::services::unique_prefix;

/// A fresh key prefix for one test, ending in `separator` (`:` for Redis, `/` for etcd), so
/// runs and concurrent tests never see each other's keys.
pub fn key_prefix(test: &str, separator: &str) -> String {
    format!("{}{separator}", unique_prefix(test))
}

/// A [`Locker`] over `backend` with this TTL and renewal, the defaults otherwise.
///
/// Panics if the backend refuses them: the test's set-up is wrong then.
pub fn locker(backend: impl LockBackend, ttl: Duration, renewal: Renewal) -> Locker {
    Locker::new(backend)
        .with_options(options(ttl, renewal))
        .unwrap_or_else(|e| panic!("locker options rejected: {e}"))
}

/// [`LockOptions`] with this TTL and renewal, the defaults otherwise.
pub fn options(ttl: Duration, renewal: Renewal) -> LockOptions {
    LockOptions::default().with_ttl(ttl).with_renewal(renewal)
}
