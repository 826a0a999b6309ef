//! Semaphores: at most `limit` holders of a key at once, one lease per permit.
//!
//! A backend that can count holders gives a **permit view** of itself
//! ([`LockBackend::semaphore`]): a [`PermitBackend`], which is a [`LockBackend`] whose
//! `try_lock` takes one of `limit` permits of the key instead of the key itself. Everything a
//! lock lease has — validity deadline, renewal, lost signal, cancellation safety, release on
//! drop, fencing token where the backend mints one — comes from the same
//! [`Locker`] and [`Lease`] code, run over that view.
//!
//! A backend that cannot keep a count safely (Redlock: a majority of independent nodes does not
//! preserve one) refuses with [`Error::unsupported_primitive`], and its
//! [`Capabilities::semaphores`](crate::Capabilities::semaphores) is `false`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{HolderInfo, LockBackend};
use crate::error::{Error, ErrorKind};
use crate::key::{IntoLockKey, LockKey};
use crate::lease::Lease;
use crate::locker::Locker;
use crate::policy::LockOptions;

/// The largest permit count a semaphore accepts.
pub const MAX_PERMITS: u32 = 1024;

/// A validated permit count: 1 to [`MAX_PERMITS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PermitLimit(u32);

impl PermitLimit {
    /// One permit: a semaphore that is a lock.
    pub const ONE: Self = Self(1);

    /// `n` permits, or an [`ErrorKind::InvalidArgument`] error when `n` is 0 or above
    /// [`MAX_PERMITS`].
    pub fn new(n: u32) -> Result<Self, Error> {
        if n == 0 || n > MAX_PERMITS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "semaphore",
                format!("a semaphore needs 1 to {MAX_PERMITS} permits, got {n}"),
            ));
        }
        Ok(Self(n))
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// A backend's permit view: a [`LockBackend`] whose grants are permits of a semaphore of
/// [`limit`](PermitBackend::limit) permits per key.
///
/// `try_lock` takes one permit (`Ok(None)` when all are taken), `release` frees ours, `extend`
/// renews ours, `inspect` answers with one holder when at least one permit is held.
#[async_trait]
pub trait PermitBackend: LockBackend {
    /// The number of permits per key this view grants.
    fn limit(&self) -> PermitLimit;

    /// Every current holder of a permit of `key` (empty when none is held).
    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error>;
}

/// The error every permit view returns when a key's semaphore is in use with another limit:
/// [`ErrorKind::InvalidConfig`], naming both limits. Two clients that disagree on N would
/// otherwise each believe their own bound, and the key could have more holders than either
/// allows.
pub fn limit_mismatch(backend: &'static str, key: &LockKey, stored: u32, asked: u32) -> Error {
    Error::new(
        ErrorKind::InvalidConfig,
        backend,
        format!(
            "the semaphore {key:?} is in use with {stored} permits; this client asks for {asked} \
             (every client of a key must use the same limit)"
        ),
    )
}

/// At most [`limit`](Semaphore::limit) holders of a key at once: a [`Locker`] over a backend's
/// permit view. Each permit is a [`Lease`], with the validity, renewal, lost signal,
/// cancellation safety, release on drop and fencing token of a lock lease. Cheap to clone.
///
/// ```
/// # async fn demo() -> Result<(), leasehold_core::Error> {
/// use std::time::Duration;
/// use leasehold_core::{MemoryBackend, semaphore::Semaphore};
///
/// let sem = Semaphore::new(MemoryBackend::new(), 2)?;
/// let a = sem.acquire("uploads", Duration::from_secs(5)).await?;
/// let b = sem.try_acquire("uploads").await?.expect("a second permit is free");
/// assert!(sem.try_acquire("uploads").await?.is_none()); // both taken: not an error
/// assert_eq!(sem.holders("uploads").await?.len(), 2);
/// assert!(a.release().await? && b.release().await?);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    locker: Locker,
    permits: Arc<dyn PermitBackend>,
}

impl Semaphore {
    /// A semaphore of `limit` permits per key over `backend`, with default [`LockOptions`];
    /// [`Error::unsupported_primitive`] when the backend gives no semaphores, and
    /// [`ErrorKind::InvalidArgument`] for a limit outside 1 to [`MAX_PERMITS`].
    pub fn new(backend: impl LockBackend, limit: u32) -> Result<Self, Error> {
        Self::from_arc(Arc::new(backend), PermitLimit::new(limit)?)
    }

    /// A semaphore over a shared backend (for example one chosen by configuration).
    pub fn from_arc(backend: Arc<dyn LockBackend>, limit: PermitLimit) -> Result<Self, Error> {
        let permits = backend.semaphore(limit)?;
        let view: Arc<dyn LockBackend> = Arc::clone(&permits) as Arc<dyn LockBackend>;
        Ok(Self {
            locker: Locker::from_arc(view),
            permits,
        })
    }

    /// A semaphore over `locker`'s backend, with its options.
    pub fn from_locker(locker: &Locker, limit: PermitLimit) -> Result<Self, Error> {
        Self::from_arc(Arc::clone(locker.backend()), limit)?.with_options(locker.options().clone())
    }

    /// The same semaphore with other options (TTL, renewal, backoff), checked as for a lock.
    pub fn with_options(self, options: LockOptions) -> Result<Self, Error> {
        Ok(Self {
            locker: self.locker.with_options(options)?,
            permits: self.permits,
        })
    }

    /// The number of permits per key.
    pub fn limit(&self) -> PermitLimit {
        self.permits.limit()
    }

    /// The locker over the permit view: `try_acquire`, `acquire` and `with_lock` on it take
    /// permits.
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// The permit view itself.
    pub fn permits(&self) -> &Arc<dyn PermitBackend> {
        &self.permits
    }

    /// One attempt at a permit: `Ok(None)` when all are taken.
    pub async fn try_acquire(&self, key: impl IntoLockKey) -> Result<Option<Lease>, Error> {
        self.locker.try_acquire(key).await
    }

    /// A permit, waiting at most `wait` (as [`Locker::acquire`]).
    pub async fn acquire(&self, key: impl IntoLockKey, wait: Duration) -> Result<Lease, Error> {
        self.locker.acquire(key, wait).await
    }

    /// Every current holder of a permit of `key`.
    pub async fn holders(&self, key: impl IntoLockKey) -> Result<Vec<HolderInfo>, Error> {
        let key = key
            .into_lock_key()
            .map_err(|e| Error::invalid_key(self.permits.capabilities().name, e))?;
        self.permits.holders(&key).await
    }
}
