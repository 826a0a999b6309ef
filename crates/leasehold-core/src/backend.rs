//! The trait every backend implements: a handful of primitives, nothing more.
//!
//! Conveniences (retrying with backoff, waiting with a budget, the renewal watchdog, the
//! lost-lease signal, release on drop, cancellation safety) are implemented once, in
//! [`Locker`](crate::Locker) and [`Lease`](crate::Lease), on top of these primitives. The trait
//! has no default methods, so a wrapper cannot silently skip an override.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::caps::Capabilities;
use crate::election::{Candidate, ElectionBackend};
use crate::error::Error;
use crate::key::LockKey;
use crate::release::ReleaseGate;
use crate::semaphore::{PermitBackend, PermitLimit};
use crate::signal::LeaseMonitor;
use crate::token::{FencingToken, Owner};
use crate::validity::Validity;

/// A lock backend: Redis, Redlock, PostgreSQL, etcd, in-memory, or a wrapper around one.
///
/// Implementations are shared as `Arc<dyn LockBackend>`. Every method may be cancelled (its
/// future dropped) at any await point; the [`Locker`](crate::Locker) then cleans up with
/// [`release`](LockBackend::release) by owner (see [`Held::state`]), so a backend must make an
/// abandoned acquisition releasable by its owner value alone, or release it itself (for example
/// by closing a session whose fate is unknown).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// What this backend is (its [name](Capabilities::name)), guarantees and supports. Must
    /// not change over the backend's life.
    fn capabilities(&self) -> Capabilities;

    /// One attempt to take `req.key` for `req.owner`: `Ok(None)` when someone else holds it,
    /// `Err` only for faults.
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error>;

    /// Waits natively until the lock is granted or `deadline` passes (then `grant` is `None`).
    ///
    /// Backends whose [`Capabilities::wait`] is [`WaitKind::Poll`](crate::WaitKind::Poll)
    /// return [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error>;

    /// Releases our grant only (compare-and-delete on the owner value). `Ok(true)` if we still
    /// held it, `Ok(false)` if it was already gone (expired, taken over, released).
    async fn release(&self, held: Held<'_>) -> Result<bool, Error>;

    /// The gate that bounds this backend's [`release`](LockBackend::release) calls in flight
    /// (see [`ReleaseGate`]): a backend that sends each release to a server keeps one, so that
    /// a burst of thousands of releases does not build all their requests at once. `None` (the
    /// default): no bound, for in-process backends.
    fn release_gate(&self) -> Option<&ReleaseGate> {
        None
    }

    /// Re-arms our grant for `req.ttl`, only if we still hold it. `Ok(None)` if we don't; else
    /// the new validity. [`RenewalKind::Session`](crate::RenewalKind::Session) backends only
    /// confirm the grant is still held and return its current validity.
    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error>;

    /// Re-arms many grants at once: one outcome per request, in the order given, each as
    /// [`extend`](LockBackend::extend) would return it. The renewal engine of the
    /// [`Locker`](crate::Locker) calls it with every lease due within a window, each request's
    /// `started` taken before the batch was sent. A grant that is no longer ours is `Ok(None)`
    /// on its own; a fault may be one request's or the whole batch's.
    ///
    /// Backends that can renew many grants in one request do (Redis: one script over many
    /// keys); the others call [`extend_each`](crate::extend_each).
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<Extended>;

    /// What the backend can tell about the current holder of `key`, if anyone holds it.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error>;

    /// This backend's permit view for semaphores of `limit` permits per key (see
    /// [`semaphore`](crate::semaphore)), or [`Error::unsupported_primitive`] when
    /// [`Capabilities::semaphores`] is `false`.
    fn semaphore(self: Arc<Self>, limit: PermitLimit) -> Result<Arc<dyn PermitBackend>, Error>;

    /// This backend's election view for `candidate` (see [`election`](crate::election)), or
    /// [`Error::unsupported_primitive`] when [`Capabilities::elections`] is `false`.
    fn election(self: Arc<Self>, candidate: Candidate) -> Result<Arc<dyn ElectionBackend>, Error>;
}

/// Implements [`LockBackend::semaphore`] for a backend that gives no semaphores, refusing them
/// with [`Error::unsupported_primitive`] and the reason given (its `capabilities()` must then
/// leave [`Capabilities::semaphores`] off). Use it inside the `impl LockBackend` block.
#[macro_export]
macro_rules! refuse_semaphores {
    ($why:expr) => {
        fn semaphore(
            self: ::std::sync::Arc<Self>,
            _limit: $crate::PermitLimit,
        ) -> ::std::result::Result<::std::sync::Arc<dyn $crate::PermitBackend>, $crate::Error> {
            ::std::result::Result::Err($crate::Error::unsupported_primitive(
                $crate::LockBackend::capabilities(&*self).name,
                "semaphores",
                $why,
            ))
        }
    };
}

/// Implements [`LockBackend::election`] for a backend that gives no elections, refusing them
/// with [`Error::unsupported_primitive`] and the reason given (its `capabilities()` must then
/// leave [`Capabilities::elections`] off). Use it inside the `impl LockBackend` block.
#[macro_export]
macro_rules! refuse_elections {
    ($why:expr) => {
        fn election(
            self: ::std::sync::Arc<Self>,
            _candidate: $crate::Candidate,
        ) -> ::std::result::Result<::std::sync::Arc<dyn $crate::ElectionBackend>, $crate::Error> {
            ::std::result::Result::Err($crate::Error::unsupported_primitive(
                $crate::LockBackend::capabilities(&*self).name,
                "elections",
                $why,
            ))
        }
    };
}

/// Implements both [`LockBackend::semaphore`] and [`LockBackend::election`] for a backend that
/// gives neither ([`refuse_semaphores!`] and [`refuse_elections!`] with one reason): test
/// backends, wrappers, and the views of primitives themselves.
#[macro_export]
macro_rules! refuse_primitives {
    ($why:expr) => {
        $crate::refuse_semaphores!($why);
        $crate::refuse_elections!($why);
    };
}

/// What every [`LockBackend`] offers on top of the trait, implemented once for all of them.
pub trait LockBackendExt: LockBackend {
    /// The backend's short, stable name: its [`Capabilities::name`].
    fn name(&self) -> &'static str {
        self.capabilities().name
    }
}

impl<B: LockBackend + ?Sized> LockBackendExt for B {}

/// One acquisition attempt, as the [`Locker`](crate::Locker) hands it to a backend.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LockRequest<'a> {
    /// The key to lock.
    pub key: &'a LockKey,
    /// Our owner value for this acquisition (fresh, random).
    pub owner: &'a Owner,
    /// The requested lease duration.
    pub ttl: Duration,
    /// The monotonic instant taken just *before* the first request was sent: the lease's
    /// validity is counted from here, never from when the answer arrived.
    pub started: Instant,
    /// Where a backend that watches its grants (a session health check, a keep-alive stream)
    /// reports renewed validity or loss. Backends that don't may ignore it.
    pub monitor: &'a LeaseMonitor,
}

impl<'a> LockRequest<'a> {
    /// A request; [`Locker`](crate::Locker) builds these, tests of a backend may too.
    pub fn new(
        key: &'a LockKey,
        owner: &'a Owner,
        ttl: Duration,
        started: Instant,
        monitor: &'a LeaseMonitor,
    ) -> Self {
        Self {
            key,
            owner,
            ttl,
            started,
            monitor,
        }
    }

    /// The validity of a grant that lasts `ttl` from `started`: what a TTL-based backend
    /// returns.
    pub fn ttl_validity(&self) -> Validity {
        Validity::new(self.started, self.ttl)
    }
}

/// A request to re-arm a held grant.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ExtendRequest<'a> {
    /// The grant to extend.
    pub held: Held<'a>,
    /// The new lease duration, counted from `started`.
    pub ttl: Duration,
    /// The monotonic instant taken just before the request was sent.
    pub started: Instant,
}

impl<'a> ExtendRequest<'a> {
    /// A request; [`Lease`](crate::Lease) builds these, tests of a backend may too.
    pub fn new(held: Held<'a>, ttl: Duration, started: Instant) -> Self {
        Self { held, ttl, started }
    }

    /// The validity of a grant re-armed for `ttl` from `started`.
    pub fn ttl_validity(&self) -> Validity {
        Validity::new(self.started, self.ttl)
    }
}

/// One outcome of [`LockBackend::extend`] or of a request in [`LockBackend::extend_many`]:
/// the new validity, `None` when the grant is no longer ours, or a fault.
pub type Extended = Result<Option<Validity>, Error>;

/// Backend-private state of a grant (a database session, a lease id), kept by the
/// [`Lease`](crate::Lease) and handed back to `release` and `extend` through [`Held::state`].
pub type GrantState = Box<dyn Any + Send + Sync>;

/// A successful acquisition, as a backend reports it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token, for backends that mint one.
    pub fencing: Option<FencingToken>,
    /// How long the grant is good for.
    pub validity: Validity,
    /// Backend-private state.
    pub state: Option<GrantState>,
}

impl Grant {
    /// A grant valid for `validity`, without token or state.
    pub fn new(validity: Validity) -> Self {
        Self {
            fencing: None,
            validity,
            state: None,
        }
    }

    /// Adds a fencing token.
    pub fn with_fencing(self, token: FencingToken) -> Self {
        Self {
            fencing: Some(token),
            ..self
        }
    }

    /// Adds backend-private state.
    pub fn with_state(mut self, state: impl Any + Send + Sync) -> Self {
        self.state = Some(Box::new(state));
        self
    }
}

/// A grant we hold (or may hold), as handed to `release` and `extend`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Held<'a> {
    /// The locked key.
    pub key: &'a LockKey,
    /// Our owner value.
    pub owner: &'a Owner,
    /// The grant's fencing token, if any.
    pub fencing: Option<FencingToken>,
    /// The backend-private state returned in the [`Grant`], or `None` when the
    /// [`Locker`](crate::Locker) is cleaning up an acquisition whose outcome it never saw (the
    /// acquire future was dropped, or failed after the request may have reached the server).
    /// The backend must then release whatever it granted to `owner`, if anything.
    pub state: Option<&'a (dyn Any + Send + Sync)>,
}

impl<'a> Held<'a> {
    /// A held grant; [`Lease`](crate::Lease) builds these, tests of a backend may too.
    pub fn new(
        key: &'a LockKey,
        owner: &'a Owner,
        fencing: Option<FencingToken>,
        state: Option<&'a (dyn Any + Send + Sync)>,
    ) -> Self {
        Self {
            key,
            owner,
            fencing,
            state,
        }
    }

    /// The backend-private state, downcast to the backend's own type.
    pub fn state<T: Any>(&self) -> Option<&'a T> {
        self.state.and_then(|s| s.downcast_ref::<T>())
    }
}

/// The outcome of a native wait.
#[derive(Debug)]
#[non_exhaustive]
pub struct Waited {
    /// The grant, or `None` if the deadline passed first.
    pub grant: Option<Grant>,
    /// How many attempts the backend made (1 for a single server-side wait).
    pub attempts: u32,
}

impl Waited {
    /// A wait outcome.
    pub fn new(grant: Option<Grant>, attempts: u32) -> Self {
        Self { grant, attempts }
    }
}

/// What a backend can tell about the current holder of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's owner value, if the backend stores it.
    pub owner: Option<Owner>,
    /// The holder's fencing token, if known.
    pub fencing: Option<FencingToken>,
    /// How long the grant has left, if it expires by TTL.
    pub remaining: Option<Duration>,
    /// Anything else the backend knows (a session's pid, a lease id), for display.
    pub detail: Option<String>,
}

impl HolderInfo {
    /// Holder information with every field unknown.
    pub fn unknown() -> Self {
        Self {
            owner: None,
            fencing: None,
            remaining: None,
            detail: None,
        }
    }

    /// Sets the owner value.
    pub fn with_owner(self, owner: Owner) -> Self {
        Self {
            owner: Some(owner),
            ..self
        }
    }

    /// Sets the fencing token.
    pub fn with_fencing(mut self, token: FencingToken) -> Self {
        self.fencing = Some(token);
        self
    }

    /// Sets the remaining TTL.
    pub fn with_remaining(self, remaining: Duration) -> Self {
        Self {
            remaining: Some(remaining),
            ..self
        }
    }

    /// Sets the free-form detail.
    pub fn with_detail(self, detail: impl Into<String>) -> Self {
        Self {
            detail: Some(detail.into()),
            ..self
        }
    }
}
