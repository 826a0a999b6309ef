//! Semaphores: at most `limit` holders of a key at once, one lease per permit.
//!
//! A backend that can count holders gives a **permit view** of itself
//! ([`LockBackend::semaphore`]): a [`PermitBackend`], which is a [`LockBackend`] whose
//! `try_lock` takes one of `limit` permits of the key instead of the key itself. Everything a
//! lock lease has — validity deadline, renewal, lost signal, cancellation safety, release on
//! drop, fencing token where the backend mints one — comes from the same
//! [`Locker`](crate::Locker) and [`Lease`](crate::Lease) code, run over that view.
//!
//! A backend that cannot keep a count safely (Redlock: a majority of independent nodes does not
//! preserve one) refuses with [`Error::unsupported_primitive`], and its
//! [`Capabilities::semaphores`](crate::Capabilities::semaphores) is `false`.

use async_trait::async_trait;

use crate::backend::{HolderInfo, LockBackend};
use crate::error::{Error, ErrorKind};
use crate::key::LockKey;

/// The largest permit count a semaphore accepts.
pub const MAX_PERMITS: u32 = 1024;

/// A validated permit count: 1 to [`MAX_PERMITS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PermitLimit(u32);

impl PermitLimit {
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
