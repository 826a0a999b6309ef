//! Tower middleware for **leasehold**: hold a lease around a request on the client side, and
//! reject stale fencing tokens on the resource side.
//!
//! A lease can always be lost while its holder works: a pause (GC, SIGSTOP), a slow network,
//! an expired TTL. So a lock alone does not protect a resource; the pair of layers here does:
//!
//! 1. [`LockLayer`] (client side) takes a lease on a key picked from each request, puts the
//!    [`LeaseInfo`](leasehold_core::LeaseInfo) — key, **fencing token**, lost signal — into the
//!    request (for `http::Request`: its extensions), holds the lease until the response is
//!    ready, and aborts the request if the lease is lost first (or, by policy, lets it finish
//!    and reports the loss).
//! 2. The handler sends the fencing token with every write.
//! 3. [`FenceLayer`] (resource side) admits a write only if its token is not lower than the
//!    highest already accepted for the resource, so a holder that lost its lease while paused
//!    cannot overwrite the work of the holder after it.
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::{LeaseInfo, Locker, MemoryBackend};
//! use leasehold_tower::{LockLayer, OnLost};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let locker = Locker::new(MemoryBackend::new());
//! let svc = ServiceBuilder::new()
//!     .layer(
//!         LockLayer::new(locker, |req: &http::Request<()>| {
//!             Some(format!("invoice:{}", req.uri().path()))
//!         })
//!         .wait(Duration::from_secs(2))
//!         .on_lost(OnLost::Abort),
//!     )
//!     .service(service_fn(|req: http::Request<()>| async move {
//!         let lease = req.extensions().get::<LeaseInfo>().cloned();
//!         let token = lease.and_then(|l| l.fencing);
//!         // ... write to storage with `token` ...
//!         Ok::<_, std::convert::Infallible>(token)
//!     }));
//! let token = svc.oneshot(http::Request::new(())).await?;
//! assert!(token.is_some());
//! # Ok(()) }
//! ```
//!
//! # `http` services
//!
//! [`ErrorResponseLayer`], put outside the `LockLayer`, answers lock failures with responses
//! by a configurable [`StatusMap`]: 409 Conflict on contention and on an exhausted wait budget,
//! 503 Service Unavailable when the backend is unreachable or the lease was lost mid-request,
//! 500 for an invalid key. The inner service's own errors pass through, so an infallible
//! handler stays infallible (as axum requires). [`LockError::status`] gives the default status
//! for code that renders errors itself, and [`FenceError::status`] the status of a fence's
//! refusal (409 for a stale token).
//!
//! # Metrics
//!
//! With the `metrics` feature, every request through a [`Lock`] service increments
//! `leasehold_requests_total{route, outcome}`. `outcome` is `ok`, `service_error` (the
//! handler failed under the lock), `unlocked` (no key: passed through), `contended`,
//! `timeout`, `unavailable`, `lease_lost` or `lock_error`. `route` is the layer's
//! [`route`](LockLayer::route), or what [`KeyExtractor::route`] derives from the request, or
//! `unnamed`. The feature also turns on leasehold-core's metrics (acquisition latency,
//! contention, leases held and lost, renewal failures, by backend): the full table is in
//! `leasehold_core::metrics`.
//!
//! # What this guarantees, and what it does not
//!
//! - A request whose key is picked runs only after its lease is granted, and its response is
//!   returned as a success only if the lease was still valid when the response was ready.
//! - With [`OnLost::Abort`] the inner future is dropped as soon as the lease is lost. Dropping
//!   a future stops it at its next await point: a write already sent may still land. That is
//!   what the fencing token and [`FenceLayer`] are for.
//! - [`FenceLayer`] checks tokens when a request arrives. A request admitted with token 5 can
//!   still be slower than one admitted later with token 6; if the resource must never apply 5
//!   after 6, make the write itself conditional on the token, in the same transaction as the
//!   data:
//!
//! ```sql
//! -- the protected rows carry the token of their last writer
//! ALTER TABLE invoices ADD COLUMN fence bigint NOT NULL DEFAULT 0;
//! -- every write is guarded by the token it was sent with
//! UPDATE invoices SET amount = $1, fence = $2 WHERE id = $3 AND fence <= $2;
//! -- 0 rows updated: a newer holder wrote first; this writer's lease is gone. Use `fence < $2`
//! -- if each token may write only once.
//! ```
//!
//! - An efficiency backend (Redis, Redlock) without monotonic fencing tokens gives no such
//!   protection: `LeaseInfo::fencing` is `None` (Redlock) or best effort (Redis).
//!
//! # Cancellation and drop
//!
//! - Dropping a [`Lock`] response future while it acquires cancels the acquisition; the
//!   `Locker` cleans up a grant that may have reached the backend.
//! - Once granted, the lease lives in the response future. When the response is ready (or the
//!   future is dropped, or the lease is lost), the lease is dropped, which releases it **in the
//!   background**: release on drop is not immediate, another client may see the lock held for
//!   one more round trip.
//! - With an `http` response, the lease ends by default when the response *head* is ready, not
//!   when a streaming body has finished. [`LockLayer::hold_body`] moves the lease into the
//!   response body ([`LeaseBody`]), which drops it when the body ends, fails, or is dropped
//!   (the client went away); a lease lost mid-stream under [`OnLost::Abort`] ends the body with
//!   a [`LeaseLostError`].
//! - Dropping a [`Fence`] response future before the token check finishes may still record
//!   the token as accepted.

mod error;
pub mod fence;
pub mod limit;
pub mod lock;
mod meter;
mod once;
pub mod respond;

pub use error::{Completed, FenceError, LeaseLostError, LockError};
pub use fence::{Admission, Fence, FenceExtractor, FenceLayer, FenceStore, MemoryFenceStore};
pub use limit::ConcurrencyLimitLayer;
pub use lock::{
    HeldLease, Hold, InsertLease, KeyExtractor, LeaseBody, Lock, LockLayer, Mode, OnLost,
    UntilBodyEnd, UntilResponse,
};
pub use respond::{ErrorResponse, ErrorResponseLayer, StatusMap};
