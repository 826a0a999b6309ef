//! How tests find the real servers that `scripts/services up` starts.
//!
//! `scripts/services up` starts Redis, five Redlock nodes, a Redis Cluster, a
//! TLS-only Redis, PostgreSQL (TLS and plain on one port) with pgbouncer in
//! front of it, and etcd (single member, a three-member cluster, and a member
//! with TLS and auth) on loopback ports and writes their addresses to an env
//! file of `KEY=VALUE` lines:
//!
//! * `$LEASEHOLD_SERVICES_DIR/env` if that variable is set, else
//! * `<workspace root>/target/services/env`.
//!
//! Variables of the same names in the process environment override the
//! file's values, so a developer can point a test at any server by hand.
//!
//! The TLS servers use a throwaway CA whose certificate is at [`tls_ca`]
//! (`LEASEHOLD_TEST_TLS_CA`); their certificate names `127.0.0.1` (IP SAN)
//! and `localhost`. The etcd member with auth takes the user and password in
//! `LEASEHOLD_TEST_ETCD_USER` / `LEASEHOLD_TEST_ETCD_PASSWORD` (see [`var`]); the plain
//! Redis also knows an ACL user with a password, `LEASEHOLD_TEST_REDIS_ACL_USER` /
//! `LEASEHOLD_TEST_REDIS_ACL_PASSWORD`, and the Redis Cluster's nodes also listen for TLS
//! clients ([`Service::RedisClusterTls`]).
//!
//! # The policy: [`require`] and [`require_service!`](crate::require_service)
//!
//! A test asks for the service it needs with [`require_service!`](crate::require_service):
//!
//! ```no_run
//! use leasehold_test_support::require_service;
//! use leasehold_test_support::services::Service;
//!
//! #[tokio::test]
//! async fn redis_roundtrip() {
//!     let redis = require_service!(Service::Redis);
//!     let url: &str = redis.url(); // "redis://127.0.0.1:17400"
//!     # let _ = url;
//!     // ... talk to Redis ...
//! }
//! ```
//!
//! * The service is **available** when its variable is set (file or process
//!   environment) and every address in it accepts a TCP (or, for the
//!   PostgreSQL socket, unix) connection within [`PROBE_TIMEOUT`]. A stale env
//!   file left behind by `scripts/services down` therefore counts as missing.
//! * When it is missing, the test **panics** with a message saying to run
//!   `scripts/services up`: nothing silently skips, whatever `CI` says (a `CI=false`
//!   inherited from a parent environment included).
//! * Only with `LEASEHOLD_ALLOW_SKIP=1` (an explicit opt-out, ignored when `CI` is
//!   `true` or `1`) does a missing service skip: a line
//!   `SKIPPED: <service> not available (run scripts/services up)` is written
//!   straight to the process's stderr (past libtest's output capture, so it
//!   shows up in a plain `cargo test`) and the macro `return`s from the test.
//!
//! Tests returning a `Result` pass the value to return as a second argument:
//! `require_service!(Service::Postgres, Ok(()))`.
//!
//! # Fault injection
//!
//! [`node_ctl`] runs `scripts/services ACTION NODE` (e.g. pause `redlock5`) to
//! stop, start, restart, pause or resume one server. For faults between the
//! client and a server see [`crate::proxy::FaultProxy`].

mod env;
mod kind;
mod lookup;
mod nodes;
mod pg_socket;

pub use env::{
    ALLOW_SKIP_VAR, ETCD_PASSWORD_VAR, ETCD_USER_VAR, REDIS_ACL_PASSWORD_VAR, REDIS_ACL_USER_VAR,
    SERVICES_DIR_VAR, SERVICES_SCRIPT_VAR, TLS_CA_VAR, config, env_file, is_ci, may_skip, tls_ca,
    var, workspace_root,
};
pub use kind::Service;
pub use lookup::{Endpoints, PROBE_TIMEOUT, Unavailable, lookup, require};
pub use nodes::{NODES, NodeAction, node_ctl, pin_node, services_script};

/// Gets a service's [`Endpoints`] or leaves the test early.
///
/// `require_service!(service)` evaluates to the [`Endpoints`] of `service`
/// when it is available. When it is not, it panics under CI and otherwise
/// prints a `SKIPPED: …` line and `return`s from the enclosing function; see
/// [`services::require`](crate::services::require).
///
/// In a function that returns a value, give the value to return on skip as
/// the second argument: `require_service!(Service::Redis, Ok(()))`.
///
/// ```no_run
/// use leasehold_test_support::require_service;
/// use leasehold_test_support::services::Service;
///
/// #[tokio::test]
/// async fn needs_redlock() -> Result<(), Box<dyn std::error::Error>> {
///     let nodes = require_service!(Service::Redlock, Ok(()));
///     assert_eq!(nodes.urls().len(), 5);
///     Ok(())
/// }
/// ```
#[macro_export]
macro_rules! require_service {
    ($service:expr $(,)?) => {
        match $crate::services::require($service) {
            ::std::option::Option::Some(endpoints) => endpoints,
            ::std::option::Option::None => return,
        }
    };
    ($service:expr, $on_skip:expr $(,)?) => {
        match $crate::services::require($service) {
            ::std::option::Option::Some(endpoints) => endpoints,
            ::std::option::Option::None => return $on_skip,
        }
    };
}

/// A random namespace for one test's keys, lock names, etc.:
/// `lh-test-<8 hex digits>-<test>`, different on every call, so runs (and
/// concurrent tests) never see each other's data.
pub fn unique_prefix(test: &str) -> String {
    let tag: u32 = rand::random();
    let test: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("lh-test-{tag:08x}-{test}")
}

/// A private folder (mode 0700) for one test under the system's temporary folder, named by
/// [`unique_prefix`]; removed with everything in it when dropped, so runs leave nothing behind.
/// Keep it alive as long as anything uses the path (a backend, a child process).
#[derive(Debug)]
pub struct TempFolder {
    path: std::path::PathBuf,
}

impl TempFolder {
    /// Creates the folder; panics if it cannot (a test cannot go on without it).
    pub fn new(test: &str) -> Self {
        use std::os::unix::fs::DirBuilderExt as _;
        let path = std::env::temp_dir().join(unique_prefix(test));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .unwrap_or_else(|e| panic!("test folder {}: {e}", path.display()));
        Self { path }
    }

    /// The folder's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl std::ops::Deref for TempFolder {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for TempFolder {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for TempFolder {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_prefixes_differ() {
        let a = unique_prefix("my::test");
        let b = unique_prefix("my::test");
        assert_ne!(a, b);
        assert!(a.starts_with("lh-test-"), "{a}");
        assert!(a.ends_with("-my__test"), "{a}");
        assert_eq!(a.len(), "lh-test-".len() + 8 + "-my__test".len());
    }

    /// A test folder is private, and goes with what is in it when dropped.
    #[test]
    fn a_test_folder_is_private_and_removed_when_dropped() {
        use std::os::unix::fs::PermissionsExt as _;
        let folder = TempFolder::new("folder");
        let path = folder.path().to_owned();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::create_dir(path.join("inner")).unwrap();
        std::fs::write(path.join("inner/file"), b"x").unwrap();
        drop(folder);
        assert!(!path.exists(), "{} left behind", path.display());
    }
}
