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
//! | backend | safety class | fencing token | status |
//! |---|---|---|---|
//! | [`MemoryBackend`] | exact within one process | process-wide counter | available |
//! | Redis (single node) | efficiency | best-effort counter | planned (`redis` feature) |
//! | Redlock | efficiency (timing assumptions) | none | planned (`redis` feature) |
//! | PostgreSQL advisory locks | correctness | durable sequence | planned (`postgres` feature) |
//! | etcd leases | correctness | key revision | planned (`etcd` feature) |
//!
//! This crate re-exports [`leasehold_core`], the contract every backend implements; see it for
//! the details of each type.

pub use leasehold_core::*;
