//! [`LockLayer`]: hold a lease around each request (the client side).

mod future;
mod hold;
mod layer;
mod service;
mod settings;

use std::time::Duration;

use leasehold_core::LeaseInfo;

pub use future::ResponseFuture;
pub use hold::{HeldLease, Hold, LeaseBody, UntilBodyEnd, UntilResponse};
pub use layer::LockLayer;
pub use service::Lock;

/// How [`Lock`] acquires the lease of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One attempt: a held lock fails the request at once with
    /// [`LockError::Contended`](crate::LockError::Contended) (the default).
    Try,
    /// Wait at most this long (the backend's native wait, or jittered retries); then
    /// [`LockError::Timeout`](crate::LockError::Timeout).
    Wait(Duration),
}

/// What [`Lock`] does when the lease is lost while the inner service is still working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Drop (cancel) the inner future at once and fail with
    /// [`LockError::LeaseLost`](crate::LockError::LeaseLost) (the default).
    #[default]
    Abort,
    /// Let the inner future finish; the outcome is still
    /// [`LockError::LeaseLost`](crate::LockError::LeaseLost), carrying what the inner service
    /// returned. Use it for work that must not be interrupted half-way, and fence its writes.
    Finish,
}

/// Picks the lock key of a request; `None` lets the request through without a lock.
///
/// Any `Fn(&Req) -> Option<String>` is one:
///
/// ```
/// use leasehold_tower::KeyExtractor;
/// let by_path = |req: &http::Request<()>| Some(format!("route:{}", req.uri().path()));
/// assert_eq!(
///     by_path.extract(&http::Request::new(())).as_deref(),
///     Some("route:/")
/// );
/// ```
pub trait KeyExtractor<Req> {
    /// The key to lock for `req`, or `None` to pass it through unlocked.
    fn extract(&self, req: &Req) -> Option<String>;

    /// The `route` label of `req` in the metrics (the `metrics` feature), when it is derived
    /// from the request; `None` (the default) uses the layer's
    /// [`route`](super::LockLayer::route). Keep the number of distinct routes small: each is a
    /// time series.
    fn route(&self, req: &Req) -> Option<String> {
        let _ = req;
        None
    }
}

impl<F, Req> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<String>,
{
    fn extract(&self, req: &Req) -> Option<String> {
        self(req)
    }
}

/// Request types that can carry the lease to the handler.
///
/// For `http::Request<B>` the [`LeaseInfo`] (key, fencing token, lost signal) goes into the
/// request's extensions: a handler reads it with
/// `req.extensions().get::<LeaseInfo>()` (axum: `Extension<LeaseInfo>`) and sends the token
/// with its writes. Other request types implement it to receive the lease, or with the default
/// (empty) method to ignore it: `impl InsertLease for MyRequest {}`.
pub trait InsertLease {
    /// Stores the lease in the request. The default does nothing.
    fn insert_lease(&mut self, lease: LeaseInfo) {
        let _ = lease;
    }
}

impl<B> InsertLease for http::Request<B> {
    fn insert_lease(&mut self, lease: LeaseInfo) {
        self.extensions_mut().insert(lease);
    }
}
