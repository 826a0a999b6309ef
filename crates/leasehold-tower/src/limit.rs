//! [`ConcurrencyLimitLayer`]: at most N requests in flight per key across every process that
//! shares the backend (a fleet-wide `ConcurrencyLimit`).
//!
//! It is a [`LockLayer`] over a [`Semaphore`]'s permit view (each request in flight holds one
//! permit of its key, with the lock layer's holding, loss and cancellation rules), under an
//! [`ErrorResponseLayer`] whose map answers **503 Service Unavailable** with `Retry-After: 1`
//! when no permit came within the wait budget ([`StatusMap::concurrency_limit`]; change it
//! with [`status_map`](ConcurrencyLimitLayer::status_map)).
//!
//! ```
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use leasehold_core::{MemoryBackend, Semaphore};
//! use leasehold_tower::ConcurrencyLimitLayer;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let sem = Semaphore::new(MemoryBackend::new(), 1)?;
//! let busy = sem.try_acquire("exports").await?; // the one permit is taken elsewhere
//! let svc = ServiceBuilder::new()
//!     .layer(ConcurrencyLimitLayer::new(&sem, |_: &Request<String>| Some("exports".to_owned()))
//!         .wait(Duration::from_millis(10)))
//!     .service(service_fn(|_req: Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("done")))
//!     }));
//! let response = svc.oneshot(Request::new(String::new())).await?;
//! assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert_eq!(response.headers()["retry-after"], "1");
//! # drop(busy); Ok(()) }
//! ```

use std::time::Duration;

use leasehold_core::Semaphore;
use tower_layer::Layer;

use crate::lock::{Lock, LockLayer, UntilResponse};
use crate::respond::{ErrorResponse, ErrorResponseLayer, StatusMap};

/// Limits in-flight requests per key to the permits of a [`Semaphore`], answering with a
/// [`StatusMap`] (503 with `Retry-After` by default) when none comes in time. See the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct ConcurrencyLimitLayer<K> {
    lock: LockLayer<K, UntilResponse>,
    respond: ErrorResponseLayer,
}

impl<K> ConcurrencyLimitLayer<K> {
    /// A limit of `semaphore`'s permits per key that `extractor` picks (requests it picks no
    /// key for pass unlimited). One attempt per request until [`wait`](Self::wait) is set.
    pub fn new(semaphore: &Semaphore, extractor: K) -> Self {
        Self {
            lock: LockLayer::new(semaphore.locker().clone(), extractor),
            respond: ErrorResponseLayer::new(StatusMap::concurrency_limit()),
        }
    }

    /// Wait at most `budget` per request for a permit.
    pub fn wait(mut self, budget: Duration) -> Self {
        self.lock = self.lock.wait(budget);
        self
    }

    /// Answers limit failures by `map` instead.
    pub fn status_map(mut self, map: StatusMap) -> Self {
        self.respond = ErrorResponseLayer::new(map);
        self
    }
}

impl<S, K: Clone> Layer<S> for ConcurrencyLimitLayer<K> {
    type Service = ErrorResponse<Lock<S, K, UntilResponse>>;

    fn layer(&self, inner: S) -> Self::Service {
        self.respond.layer(self.lock.layer(inner))
    }
}
