//! The etcd backend of **leasehold**: consensus-backed locks on etcd v3 leases, with the lock
//! key's create revision as fencing token.
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold_core::Error> {
//! use std::time::Duration;
//! use leasehold_core::Locker;
//! use leasehold_etcd::{EtcdBackend, EtcdConfig};
//!
//! let backend = EtcdBackend::connect(EtcdConfig::from_url("etcd://127.0.0.1:2379")?).await?;
//! let locker = Locker::new(backend);
//! let lease = locker.acquire("billing/export", Duration::from_secs(5)).await?;
//! let token = lease.fencing_token(); // the key's create revision: send it with every write
//! lease.release().await?;
//! # let _ = token; Ok(()) }
//! ```
//!
//! Building needs `protoc` and the protobuf well-known types (Debian: `protobuf-compiler` and
//! `libprotobuf-dev`), for the gRPC code of `etcd-client`.
//!
//! # Guarantees
//!
//! - **Mutual exclusion by consensus.** A lock is an etcd key attached to a lease; creating it,
//!   queueing for it and deleting it are Raft-replicated transactions. Two clients never both
//!   hold a lock while etcd keeps quorum ([`SafetyClass::Correctness`]).
//! - **Fencing tokens.** A grant's token is its key's *create revision*: etcd's cluster-wide
//!   revision counter at the moment the key was created, which strictly increases across every
//!   grant of every key ([`FencingKind::Monotonic`]). Queued waiters are granted in create
//!   revision order, so tokens also increase in grant order.
//! - **Never without a lease.** Every key is written with a lease: a lock can't outlive its
//!   process by more than the lease's TTL, and that TTL is the lock's own, rounded up to whole
//!   seconds and at least 2 s (etcd grants whole seconds, and raises shorter leases to its own
//!   minimum): after a SIGKILL, a lock of `--ttl 3s` is free again within about 3 s
//!   ([`CrashRelease::TtlRoundedUp`](leasehold_core::CrashRelease::TtlRoundedUp)). (A key written without one lives forever, and one
//!   on etcd's default lease disappears after 60 s: both are bugs we don't have.)
//! - **Told when lost.** Leases are kept alive in the background (a third of the shortest
//!   validity promised, over one keep-alive stream per lease, reopened on another member if it
//!   fails). Each acknowledgement renews the validity of every grant on the lease, counted from
//!   the instant *before* the keep-alive was sent, capped at the request's TTL (the `Locker`
//!   then subtracts the drift margin). A keep-alive answered with TTL 0 (the lease was revoked
//!   or expired), "lease not found", or keep-alives failing until the TTL since the last
//!   acknowledgement has run out fire the lost signal of **every** grant on that lease
//!   ([`RenewalKind::Session`]). The backend then grants a fresh session lease for new
//!   acquisitions.
//! - **Native, fair waiting.** Waiting uses etcd's queued-lock recipe: our key joins the queue
//!   and we watch for the deletion of the key just before ours, so waiters are served in the
//!   order they queued, without polling ([`WaitKind::Native`]).
//!
//! # What it does not guarantee
//!
//! - A lease can be lost while its holder is paused (GC, SIGSTOP) or partitioned; the lost
//!   signal tells it as soon as the process runs again, but only the fencing check at the
//!   resource makes a late write harmless.
//! - Without quorum nobody can acquire, renew or release; leases then run out on the
//!   survivors' clocks and holders are told they lost them. Locks come back with quorum.
//! - A crashed process's locks last until their session lease expires: the lock's TTL rounded
//!   up to whole seconds, at least 2 s (a 300 ms TTL keeps a crashed holder's lock for 2 s); the
//!   validity we *report* is never longer than the request's TTL.
//! - In-process waiters on a lock held by a task of the same backend queue locally (FIFO) and
//!   join etcd's queue only when the local holder is done, so a remote client that queues in
//!   the meantime goes first.
//!
//! # Key mapping
//!
//! Lock `K` with prefix `P` (default `"leasehold/"`, see [`EtcdConfig::prefix`]) is the etcd key
//! range `P K /` — every key starting with `"{P}{K}/"`, where `K` is the key with `%` written
//! `%25` and `/` written `%2F` (nothing else changes), so that the ranges of two locks never
//! contain each other: a holder of `a/b` does not make `a` look held. Semaphores and elections
//! have namespaces of their own under the prefix (`%sem/`, `%elect/`), which no escaped key can
//! produce. Each contender puts one key
//! `"{P}{K}/{lease}"`, where `{lease}` is its etcd lease id in lower-case hex without padding,
//! attached to that lease; the key with the **lowest create revision** under the range holds
//! the lock and the others wait for their predecessor's deletion. This is exactly the layout
//! of etcd's v3 concurrency recipe, which `etcdctl lock` and etcd's Lock RPC use, so they
//! exclude each other with this backend:
//!
//! ```text
//! ETCDCTL_API=3 etcdctl --endpoints 127.0.0.1:2379 lock leasehold/billing%2Fexport
//! ```
//!
//! holds our lock `billing/export` (prefix `leasehold/`) until you stop it, and queues behind
//! us while we hold it. Our keys' value is the acquisition's owner value (40 hex digits);
//! `etcdctl lock` writes an empty value. To see who holds a lock:
//! `etcdctl get --prefix leasehold/billing%2Fexport/ --sort-by=CREATE --order=ASCEND --limit=1`.
//!
//! `try_acquire` creates its key only if the range is empty (a transaction comparing the range's
//! create revision to 0), so it never queues: a lock with waiters counts as held.
//!
//! # Semaphores
//!
//! [`LockBackend::semaphore`](leasehold_core::LockBackend::semaphore) gives a permit view
//! (`Semaphore::new(backend, n)`): at most `n` holders of a key, each permit a lease with the
//! guarantees above (consensus, session renewal and loss, crash release by the lease TTL, the
//! same cancellation and drop behaviour). Semaphore `K` is the range
//! [`semaphore_prefix`] `"{P}%sem/{K}/"` (`K` escaped as for locks). Each permit request puts
//! one key `"{P}%sem/{K}/{lease}_{owner}"` on its lease, valued with its owner; the `n` keys
//! with the **lowest create revisions** hold the permits, and a permit's fencing token is its
//! key's create revision (unique, and increasing in the order permits are granted: later keys
//! queue behind earlier ones). `try_acquire` creates its key only while fewer than `n` keys
//! exist (a transaction that fails if any key was created under the range since it counted;
//! it counts again, and answers "all taken" if that keeps happening four times), so it never
//! queues.
//! A waiter watches the deletion of the `n` keys created just before its own (over one watch
//! stream): it holds once fewer than `n` older keys remain, which only a deletion among those
//! can bring about, so a release wakes at most `n` waiters, not the whole queue, and waiters
//! are served in the order they queued.
//!
//! The limit is stored in [`semaphore_limit_key`] `"{P}%sem/{K}"`, without a lease (it is in
//! no range of any primitive). The first client to find the range empty writes its `n` there in
//! the transaction that creates its key; every other client joins only if the stored value is
//! its own `n`, and is refused with [`ErrorKind::InvalidConfig`] naming both limits otherwise.
//! Once every permit is released or gone with its lease and nobody waits, the next client may
//! set another limit. The limit key stays behind (one small key per semaphore name); `etcdctl
//! del` removes it while nobody uses the semaphore. By hand:
//!
//! ```text
//! etcdctl get --prefix 'leasehold/%sem/jobs/' --sort-by=CREATE --order=ASCEND --limit=N  # the holders
//! etcdctl get 'leasehold/%sem/jobs' --print-value-only                                 # the limit
//! ```
//!
//! # Sessions and in-process exclusion
//!
//! In [`LeaseMode::Session`] one lease per distinct TTL (in whole seconds, at least 2 s)
//! serves every acquisition of that TTL of a backend instance (and its clones): one write per
//! lock, one keep-alive stream per TTL in use. A lease per lock would cost a grant and a revoke
//! more per lock; a single lease for all TTLs would keep a crashed holder's short locks as long
//! as the longest. Up to 8 TTLs keep their lease; beyond that, a lease no grant uses any more
//! is revoked when another TTL needs one. etcd counts keys on the same lease as the
//! same owner (`etcdctl lock` would re-enter), so the backend adds in-process exclusion: one
//! local permit per waiter key, taken before touching etcd and given back only after our key is
//! deleted (a semaphore's keys carry their owner value, so its permits share a session lease
//! without it). In [`LeaseMode::PerLock`] every acquisition has a lease of its own (its TTL is the
//! request's, rounded up to whole seconds), revoked on release: independent expiry, two more
//! writes per lock (grant and revoke).
//!
//! While it is merely held, a lock costs this process no task, stream or timer of its own: its
//! state is its key (stored once, shared by the grant and the in-process table), its
//! in-process permit and one word in its session lease's list of grants; the session's one
//! keep-alive stream renews them all (`leasehold-bench perf --groups fleet` measures the
//! resident memory per lease).
//!
//! The session lease costs one write per lock; a lease per lock adds a grant and a revoke
//! (`cargo run --release -p leasehold-bench -- perf` measures both against etcd's raw Lock
//! and Unlock RPCs).
//!
//! # Cancellation and drop
//!
//! - The etcd part of every acquisition runs in a task of its own, so a request that was sent is
//!   never abandoned half-way (the task checks, before each first write, that its caller is
//!   still there, and sends nothing if not; a write sent before the drop may still land). If the acquire future is dropped, the task finishes the
//!   request, then deletes the key it created (waiting or granted), and only then frees the
//!   in-process permit. The [`Locker`](leasehold_core::Locker) also releases by owner value.
//! - Dropping a waiting acquire therefore deletes our waiter key in the background; the waiter
//!   behind us is then woken by the deletion.
//! - Release on drop is not immediate: the key is deleted by a background task a round trip
//!   later. With no Tokio runtime left, nothing can be sent, and the key goes when the lease
//!   expires.
//! - A release that etcd refuses (`too many requests` under a burst, no answer in time, no
//!   leader) is retried as `leasehold_core::Lease::release` describes, and in the background
//!   never given up while the session lease that carries the key is kept alive: a release
//!   answers `Ok(false)` once that lease is lost (the key went with it), and the clean-up of a
//!   grant nobody released deletes its key, retrying with jittered backoff up to 5 s apart,
//!   until it is gone or the session lease is.
//! - Dropping the backend (and every lease from it) revokes its session lease in the background.
//!
//! # Configuration
//!
//! `etcd://[user[:password]@]host:port[,host:port…][?prefix=…&lease=session|per-lock&session_ttl=SECS&timeout_ms=MS]`,
//! see [`EtcdConfig::from_url`]. `etcds://` uses TLS through rustls and needs the crate
//! feature `tls`. Passwords never appear in `Debug` output or error messages.
//!
//! With a user, the backend authenticates again when etcd refuses its token: when etcd calls
//! it invalid or expired, and when etcd says it was issued before the last change to the
//! cluster's users or roles ("revision of auth store is old"). A JWT token goes stale that
//! way after any such change. With simple tokens, a request that crosses such a change in
//! flight is refused the same way. A request refused like this was not applied, and goes
//! again with the new token, up to 8 times if the users keep changing in between. However
//! many requests find the token stale at once, they trigger one authentication. Should it
//! still be refused, the error is `Unavailable`, so retryable, and releases retry it.
//!
//! A `user:password` sent to an endpoint that is not loopback over plain gRPC (`etcd://`)
//! crosses the network in clear: connecting logs a `warn!` (target `leasehold.plaintext`), or
//! fails with `allow_plaintext_password=false` (see [`leasehold_core::transport`]). Use
//! `etcds://`.
//!
//! [`SafetyClass::Correctness`]: leasehold_core::SafetyClass::Correctness
//! [`ErrorKind::InvalidConfig`]: leasehold_core::ErrorKind::InvalidConfig
//! [`FencingKind::Monotonic`]: leasehold_core::FencingKind::Monotonic
//! [`RenewalKind::Session`]: leasehold_core::RenewalKind::Session
//! [`WaitKind::Native`]: leasehold_core::WaitKind::Native

mod backend;
mod client;
mod config;
mod election;
mod error;
mod held;
mod job;
mod local;
mod names;
mod semaphore;
mod session;

pub use backend::EtcdBackend;
#[cfg(feature = "tls")]
pub use config::TlsConfig;
pub use config::{DEFAULT_PREFIX, EtcdConfig, LeaseMode, SCHEMES};
pub use names::{election_name, lock_prefix, semaphore_limit_key, semaphore_prefix};

use leasehold_core::Error;
use leasehold_core::driver::{Driver, Opening, Target, connecting};

/// The backend's name, as errors and leases report it.
pub(crate) const NAME: &str = "etcd";

/// The driver's entry for a registry (the `leasehold` facade's): opens `etcd://`, and
/// `etcds://` with the crate feature `tls`.
pub static DRIVER: Driver = Driver::new(NAME, OPENS, open);

/// The schemes this build opens: `etcds` needs the `tls` feature.
#[cfg(feature = "tls")]
const OPENS: &[&str] = SCHEMES;
#[cfg(not(feature = "tls"))]
const OPENS: &[&str] = &["etcd"];

fn open(target: &Target<'_>) -> Result<Opening, Error> {
    let config = target.prefixed(EtcdConfig::from_url(target.url)?, |c, p| c.with_prefix(p))?;
    Ok(connecting(EtcdBackend::connect(config)))
}

#[doc(hidden)]
pub mod fuzzing {
    //! Internal entry points for the fuzz targets in `fuzz/`; not part of the API.

    use leasehold_core::LockKey;

    /// The etcd key prefix of `key`'s lock under `prefix`, as
    /// [`EtcdBackend::lock_prefix`](crate::EtcdBackend::lock_prefix) names it.
    pub fn lock_prefix(prefix: &str, key: &LockKey) -> String {
        crate::lock_prefix(prefix, key)
    }

    /// The key a waiter with session lease `lease` writes under a lock's prefix.
    pub fn waiter_key(lock_prefix: &str, lease: i64) -> Vec<u8> {
        crate::client::waiter_key(lock_prefix.as_bytes(), lease)
    }

    /// A lease TTL (seconds) as a server granted it, if the driver accepts it.
    pub fn lease_ttl(ttl: i64) -> Option<std::time::Duration> {
        crate::session::granted_ttl(ttl).ok()
    }

    /// The fencing token of a key created at revision `rev`, if the driver accepts it.
    pub fn token(rev: i64) -> Option<u64> {
        crate::client::token(rev).ok().map(|t| t.get())
    }
}
