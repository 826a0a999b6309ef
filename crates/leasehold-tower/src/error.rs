//! The errors of the two layers.

use std::fmt;
use std::sync::{Mutex, PoisonError};

use leasehold_core::{Error, FencingToken, LockKey, LossReason};

/// What the inner service returned after the lease was lost
/// ([`LockError::LeaseLost`]): the work ran to completion, but not (all of it) under the lock.
///
/// Held behind a mutex so the error stays `Sync` (and converts into tower's `BoxError`) even
/// when the response type is not.
pub struct Completed<T>(Mutex<Option<T>>);

impl<T> Completed<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Mutex::new(Some(value)))
    }

    /// Takes the inner service's result out (`None` if already taken).
    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl<T> fmt::Debug for Completed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Completed(..)")
    }
}

/// The error of [`Lock`](crate::Lock): why a request did not run (or did not finish) under its
/// lease, or the inner service's own error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError<E, R> {
    /// The lock is held by someone else ([`Mode::Try`](crate::Mode::Try)). The request was not
    /// run. HTTP: 409 Conflict.
    #[error("lock {key} is held elsewhere")]
    Contended {
        /// The contended key.
        key: LockKey,
    },
    /// The wait budget ran out before the lock was granted ([`Mode::Wait`](crate::Mode::Wait)).
    /// The request was not run. HTTP: 409 or 503, by taste.
    #[error("timed out waiting for lock {key}")]
    Timeout {
        /// The key.
        key: LockKey,
        /// The lock API's timeout error (attempts, last fault).
        source: Error,
    },
    /// The backend could not be reached (or a Redlock quorum not formed), including a wait
    /// budget spent on nothing but such faults. The request was not run. HTTP: 503.
    #[error("lock backend unavailable")]
    Unavailable(#[source] Error),
    /// The lease was lost while the request ran. With [`OnLost::Abort`](crate::OnLost::Abort)
    /// the inner future was dropped mid-way (`completed` is `None`, unless it finished in the
    /// same instant); with [`OnLost::Finish`](crate::OnLost::Finish) it ran to the end and
    /// `completed` holds its result.
    #[error("lease on {key} lost during the request: {reason}")]
    LeaseLost {
        /// The key.
        key: LockKey,
        /// How it was lost.
        reason: LossReason,
        /// The inner service's result, if it finished.
        completed: Option<Completed<Result<R, E>>>,
    },
    /// Any other lock error (an invalid key from the extractor, a backend error).
    #[error("lock error")]
    Lock(#[source] Error),
    /// The inner service's error.
    #[error("inner service error")]
    Service(#[source] E),
}

/// The error of [`Fence`](crate::Fence): a stale or missing token, a store fault, or the inner
/// service's own error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError<E> {
    /// A token higher than this one was already accepted for the resource: the sender's lease
    /// has been superseded. The request was not run. HTTP: 409 Conflict.
    #[error("stale fencing token {token} for {resource}: {highest} already accepted")]
    Stale {
        /// The resource.
        resource: String,
        /// The rejected token.
        token: FencingToken,
        /// The highest token accepted so far.
        highest: FencingToken,
    },
    /// The request carries no resource and token. The request was not run.
    #[error("request carries no fencing token")]
    MissingToken,
    /// The store of highest tokens failed. The request was not run.
    #[error("fence store error")]
    Store(#[source] Error),
    /// The inner service's error.
    #[error("inner service error")]
    Service(#[source] E),
}

/// The error a [`LeaseBody`](crate::lock::LeaseBody) ends with when the lease is lost while the
/// body streams (under [`OnLost::Abort`](crate::OnLost::Abort)): the response is incomplete.
#[derive(Debug, Clone, thiserror::Error)]
#[error("lease on {key} lost while the response body streamed: {reason}")]
pub struct LeaseLostError {
    /// The key.
    pub key: LockKey,
    /// How it was lost.
    pub reason: LossReason,
}
