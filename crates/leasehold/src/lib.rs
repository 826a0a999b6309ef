//! **leasehold**: one lock API over several lock backends, with fencing tokens and a
//! lost-lease signal.
//!
//! A distributed lock is a *lease*: it expires, and a holder that is paused or delayed past the
//! expiry can go on acting as if it still held it. leasehold makes that explicit instead of
//! hiding it:
//!
//! - every [`Lease`] has a validity deadline counted conservatively from *before* the request,
//!   and a [lost signal](Lease::lost) that fires when renewal fails, the backend reports the
//!   loss, or the deadline passes;
//! - backends that can mint them give a [`FencingToken`], a number that strictly increases on
//!   every grant of a key; send it with each write and have the resource reject lower ones;
//! - every backend declares its [`Capabilities`]: *efficiency* locks (cheap, occasionally wrong:
//!   single-node Redis, Redlock) or *correctness* locks (consensus or a transactional database,
//!   with durable fencing tokens: etcd, PostgreSQL).
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{Locker, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), leasehold::Error> {
//! let locker = Locker::new(MemoryBackend::new());
//! let lease = locker.acquire("invoices/2026-11", Duration::from_secs(5)).await?;
//! let token = lease.fencing_token().expect("the memory backend mints tokens");
//! // ... write to storage, sending `token`; storage rejects tokens lower than it has seen ...
//! lease.release().await?;
//! # let _ = token; Ok(()) }
//! ```
//!
//! # Backends
//!
//! | backend | URL schemes | safety class | fencing token | crate feature |
//! |---|---|---|---|---|
//! | [`MemoryBackend`] | `memory://` | exact within one process | process-wide counter | always |
//! | file locks (Unix) | `file:///path/to/dir` | one host | durable counter file | `file` (default) |
//! | Redis (single node, Cluster) | `redis`, `redis+unix`, `unix`, `redis-cluster` | efficiency | best-effort counter | `redis` |
//! | Redlock | `redlock://h1,h2,h3` or `urls = [...]` | efficiency (timing assumptions) | none | `redis` |
//! | PostgreSQL advisory locks | `postgres`, `postgresql` | correctness | durable sequence | `postgres` |
//! | etcd leases | `etcd` (`etcds` with `etcd-tls`) | correctness | key revision | `etcd` |
//!
//! With a driver's feature on, its crate is re-exported as a module: `leasehold::file`,
//! `leasehold::redis`, `leasehold::postgres`, `leasehold::etcd`. Every driver crate exports
//! the same surface: its backend(s) and config, `SCHEMES`, `DEFAULT_PREFIX`, and `DRIVER`, the
//! [`driver::Driver`] table this crate's registry chains to open URLs.
//!
//! # Other features
//!
//! - `tower`: the middleware, as `leasehold::tower` — `LockLayer` holds a lease around each
//!   request (with ready `http` error responses and an option to hold it while a response body
//!   streams), `FenceLayer` rejects stale fencing tokens at the resource.
//! - `metrics`: acquisitions, contention, timeouts, leases held and lost, and renewal failures
//!   through the `metrics` facade, by backend; with `tower`, request outcomes by route. The
//!   names are in one table in [`metrics`].
//!
//! # Choosing the backend by configuration
//!
//! [`LockConfig`] reads a TOML file (overridable by `LEASEHOLD_*` environment variables) and
//! [builds](LockConfig::build) a [`Locker`]; moving between efficiency and correctness locks is
//! then a configuration change. `require = "correctness"` refuses, at construction, a backend
//! that cannot give consensus-grade safety and monotonic fencing tokens, and says why:
//!
//! ```
//! use leasehold::{ErrorKind, LockConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), leasehold::Error> {
//! let config = LockConfig::from_toml_str(r#"
//!     url = "memory://"
//!     ttl = "10s"
//!     wait = "2s"
//! "#)?;
//! let locker = config.build().await?;
//! let lease = locker.acquire("reports/daily", config.wait_budget()).await?;
//! lease.release().await?;
//!
//! let strict = config.clone().with_require(leasehold::Require::Correctness);
//! let err = strict.build().await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::InvalidConfig);
//! assert!(err.to_string().contains("only within one process"));
//! # Ok(()) }
//! ```
//!
//! An unknown URL scheme, or one whose feature is not compiled in, is an error that lists the
//! [available schemes](available_schemes) and the feature to enable.
//!
//! This crate re-exports [`leasehold_core`], the contract every backend implements; see it for
//! the details of each type.

mod config;
mod env;
mod registry;
mod table;

pub use config::{BackoffConfig, DEFAULT_WAIT, DriftConfig, LockConfig, RenewalSetting, Require};
pub use env::ENV_VARS;
pub use leasehold_core::*;
pub use registry::{available_schemes, connect, scheme_feature};
pub use table::BackendTable;

/// The file-lock driver (`file` feature, on by default; Unix only): see [`leasehold_file`].
#[cfg(all(feature = "file", unix))]
pub use leasehold_file as file;
#[cfg(all(feature = "file", unix))]
pub use leasehold_file::{FileBackend, FileConfig};

/// The Redis and Redlock driver (`redis` feature): see [`leasehold_redis`].
#[cfg(feature = "redis")]
pub use leasehold_redis as redis;

/// The PostgreSQL driver (`postgres` feature): see [`leasehold_postgres`].
#[cfg(feature = "postgres")]
pub use leasehold_postgres as postgres;

/// The etcd driver (`etcd` feature): see [`leasehold_etcd`].
#[cfg(feature = "etcd")]
pub use leasehold_etcd as etcd;

/// The tower middleware (`tower` feature): see [`leasehold_tower`].
#[cfg(feature = "tower")]
pub use leasehold_tower as tower;
