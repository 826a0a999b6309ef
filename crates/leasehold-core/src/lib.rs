//! The lock contract of **leasehold**: one API over several lock backends.
//!
//! A distributed lock is a **lease**: it expires, and its holder can be paused or delayed past
//! the expiry and then act on a lock it no longer has. This crate gives every backend the same
//! shape and makes the hazards explicit:
//!
//! - [`LockBackend`] is the small trait a backend implements: try once, wait natively (or say it
//!   can't), release, extend, inspect, and declare its [`Capabilities`] (safety class, fencing
//!   kind, native wait, renewal).
//! - [`Locker`] implements everything else once, for every backend: waiting with a budget
//!   (native or capped exponential backoff with full jitter), fresh 160-bit owner values from
//!   the OS CSPRNG, validity deadlines counted from before the request minus a drift margin, a
//!   renewal watchdog, and cancellation safety.
//! - [`Lease`] is the guard: key, owner, optional [`FencingToken`], validity deadline, a
//!   [lost signal](Lease::lost) that fires when the lease is gone, and release on drop.
//! - [`FenceStore`] is the resource side of fencing: it admits a token only if it is not lower
//!   than the highest seen ([`MemoryFenceStore`] in one process; [`fence`] explains the rule).
//! - [`redact`] hides passwords and tokens in URLs, option strings and messages: every crate of
//!   leasehold shows configuration through it (the rules are in [`redaction`]).
//! - [`MemoryBackend`] is the in-process default.
//! - [`driver::Driver`] is the table each driver crate exports, so that a registry opens
//!   backends by URL scheme.
//!
//! # The contract every backend honours
//!
//! The drivers, the tower middleware and the conformance suite of `leasehold-test-support` all
//! rely on these rules; the suite checks each of them against every backend.
//!
//! - **Efficiency or correctness.** Locks serve either efficiency (a lost lock costs duplicate
//!   work) or correctness (a lost lock corrupts data). Each backend declares its
//!   [`SafetyClass`]; only consensus (etcd) or a transactional database (PostgreSQL), together
//!   with fencing checks at the resource, is fit for correctness.
//! - **Fencing tokens.** A [`FencingToken`] strictly increases on every grant of the same key
//!   (for backends whose [`FencingKind`] says they mint one). It goes with every write, and the
//!   resource rejects a token lower than one it has accepted ([`FenceStore`]). A random owner
//!   value is not a fencing token: it identifies, it does not order.
//! - **Keys.** A [`LockKey`] is validated once (non-empty, at most [`MAX_KEY_LEN`] bytes, no
//!   NUL); each backend maps it, under a configurable prefix, in a documented and stable way,
//!   so another client (`redis-cli`, `psql`, `etcdctl`) can take the same lock.
//! - **Acquire.** A grant carries the key, our [`Owner`] value, the optional token and a
//!   [`Validity`]; the lease's deadline is counted from the instant *before* the request was
//!   sent, minus a [`Drift`] margin. `try_acquire` makes one attempt and returns `Ok(None)`
//!   when someone else holds the key (contention is not an error); `acquire` waits within a
//!   budget, natively or with jittered backoff, and gives up cleanly at the deadline.
//! - **Cancellation.** Dropping an acquisition at any point leaks nothing: a grant that may
//!   have reached the server is released in the background ([`settle`] waits for those).
//! - **Release** deletes only our own grant (compare-and-delete), says whether we still held
//!   it, and is idempotent; dropping a [`Lease`] releases it in the background. What a caller
//!   gets is stated below.
//!
//! # Release and drop: the contract
//!
//! - [`Lease::release`] answers `Ok(true)` (held, now deleted) or `Ok(false)` (already gone:
//!   expired, taken over, released; after a retry it may also be an earlier attempt of ours,
//!   whose answer was lost, that deleted it). Later calls answer `Ok(false)` without I/O.
//! - A **transient fault** ([`Error::is_retryable`]: etcd's `too many requests`, Redis
//!   `BUSY`/`LOADING`/`TRYAGAIN`, a timeout, a dropped connection) is retried with capped, fully
//!   jittered backoff within [`RELEASE_BUDGET`] (5 s, every attempt's own time included), so
//!   one call succeeds through a burst. If the fault outlasts it, the call returns that
//!   retryable error after at most the budget; the lease is let go all the same (its lost
//!   signal says [`LossReason::Released`]; do not act as the holder any more) and the release
//!   **continues in the background**.
//! - A fault that **cannot be transient** is returned at once, never retried; the lease is
//!   still held: call again, or drop it.
//! - **Drop** never blocks: it releases in the background on the current Tokio runtime (with
//!   none, the grant ends by TTL or session). So does the clean-up of an acquisition cut short.
//! - A **background release** retries transient faults with jittered backoff (at most 5 s
//!   apart) until the backend answers; it stops earlier only when the grant is gone by itself
//!   (the [`Horizon`]): on a TTL backend ([`RenewalKind::Extend`]) once the TTL last armed,
//!   plus the drift margin, has passed; on a session backend ([`RenewalKind::Session`]: etcd,
//!   PostgreSQL) never while the session carrying the grant lives, since such a backend
//!   answers `Ok(false)` once that session is gone. A fault that cannot be transient ends it,
//!   counted in [`metrics::RELEASES_GIVEN_UP`]. [`settle`] waits for these releases.
//! - Backends that release on their own use the same two functions: [`retry_release`] and
//!   [`release_in_background`].
//! - **A burst of releases** (thousands of leases released or dropped at once) goes to the
//!   server at most [`RELEASES_IN_FLIGHT`] calls at a time per backend by default, the rest
//!   waiting their turn in order before their request is built ([`ReleaseGate`],
//!   [`LockBackend::release_gate`]): each request in flight costs the client a few KiB, and
//!   a burst sent all at once would hold every one of them together. The wait counts within
//!   the budget above, as waiting for an answer does. Every driver that keeps a gate takes
//!   its size as `releases_in_flight=N` ([`RELEASES_IN_FLIGHT_OPTION`]) in its URL and as a
//!   setting of its configuration.
//! - **Extend and loss.** Extending re-arms the TTL only while we hold the grant; a watchdog
//!   can do it: one renewal engine per [`Locker`] renews its leases in batches
//!   ([`LockBackend::extend_many`]), each lease with its own outcome. When renewal fails, the deadline passes or the backend reports the loss, the
//!   lease's [lost signal](Lease::lost) fires: the holder is told, not left to find out on its
//!   next write.
//!
//! # Tracing
//!
//! Every operation runs in a `tracing` span at DEBUG level, with the backend's name:
//! `leasehold.try_acquire` and `leasehold.acquire` (and `key`), `leasehold.extend` and `leasehold.release` (and `key`),
//! `leasehold.release.background` (a release retried in the background, a dropped lease's or
//! an abandoned acquisition's) and `leasehold.renew_batch` (one batch of the renewal engine,
//! and its `size`); each ends with a DEBUG event that says how it went and how long it took.
//! Losses are WARN events (`leasehold.lost`). Metrics: the [`metrics`] module.
//!
//! # What this does not promise
//!
//! A lease can always be lost while its holder is paused; only a **fencing token** checked by
//! the resource (which rejects a token lower than one it has seen) makes that harmless. Backends
//! declare whether they mint one; [`Capabilities::correctness_gap`] explains what a backend
//! lacks for correctness-critical use.
//!
//! This crate depends on no driver: drivers live in `leasehold-redis`, `leasehold-postgres`,
//! `leasehold-etcd` and `leasehold-file`, and the facade `leasehold` re-exports them.

/// Implements `Debug` (the string, quoted) and `Display` (the string) for a string newtype
/// through its `as_str`: keys and owner values show as what backends store.
macro_rules! fmt_as_str {
    ($ty:ty) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(self.as_str(), f)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

mod backend;
mod caps;
mod detach;
pub mod driver;
pub mod election;
mod elector;
mod error;
pub mod fence;
mod key;
mod lease;
mod lock_election;
mod locker;
mod loss;
mod memory;
mod memory_election;
mod memory_permits;
pub mod metrics;
mod policy;
pub mod redaction;
mod release;
mod renewal;
pub mod semaphore;
mod signal;
mod token;
pub mod transport;
mod validity;
mod view;

pub use backend::{
    ExtendRequest, Extended, Grant, GrantState, Held, HolderInfo, LockBackend, LockBackendExt,
    LockRequest, Waited,
};
pub use caps::{
    Capabilities, CrashRelease, DEFAULT_MAX_TTL, FencingKind, RenewalKind, SafetyClass, WaitKind,
};
pub use detach::{settle, spawn_detached};
pub use election::{Candidate, ElectionBackend, Leader, poll_leader};
pub use elector::{Elector, Leadership};
pub use error::{Error, ErrorKind, NodeError};
pub use fence::{Admission, FenceStore, MemoryFenceStore};
pub use key::{IntoLockKey, KeyError, LockKey, MAX_KEY_LEN};
pub use lease::{Lease, LeaseInfo};
pub use lock_election::{LeaderStore, LockElection};
pub use locker::Locker;
pub use loss::LossReason;
pub use memory::MemoryBackend;
pub use memory_permits::MemoryPermits;
pub use policy::{Backoff, Drift, LockOptions, MIN_RENEWAL_SLACK, Renewal};
pub use redaction::{Redacted, redact};
pub use release::{
    Horizon, RELEASE_BUDGET, RELEASES_IN_FLIGHT, RELEASES_IN_FLIGHT_OPTION, ReleaseGate,
    release_in_background, retry_release,
};
pub use renewal::{MAX_BATCH, extend_each};
pub use semaphore::{PermitBackend, PermitLimit, Semaphore};
pub use signal::{LeaseMonitor, LostSignal};
pub use token::{FencingToken, OWNER_BYTES, Owner};
pub use validity::Validity;
pub use view::View;

/// Re-exported so backends can implement [`LockBackend`] without depending on it themselves.
pub use async_trait::async_trait;
