//! [`ErrorResponseLayer`]: turn [`LockLayer`](crate::LockLayer) failures into `http`
//! responses (409 on contention, 503 when the backend is unavailable, …), so an `http` service
//! (axum, hyper, tonic) gets a response instead of an error it has no way to render.
//!
//! Put it **outside** the `LockLayer`:
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use leasehold_core::{Locker, MemoryBackend};
//! use leasehold_tower::{ErrorResponseLayer, LockLayer, StatusMap};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let locker = Locker::new(MemoryBackend::new());
//! let held = locker.try_acquire("reports").await?;
//! let svc = ServiceBuilder::new()
//!     // 409 on contention (the default), and a timeout answered 503 instead of 409:
//!     .layer(ErrorResponseLayer::new(StatusMap::default().timeout(StatusCode::SERVICE_UNAVAILABLE)))
//!     .layer(LockLayer::new(locker, |_: &Request<String>| Some("reports".to_owned())))
//!     .service(service_fn(|_req: Request<String>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(String::from("done")))
//!     }));
//! let response = svc.oneshot(Request::new(String::new())).await?;
//! assert_eq!(response.status(), StatusCode::CONFLICT);
//! # drop(held); Ok(()) }
//! ```
//!
//! The inner service's own errors pass through unchanged, so with an infallible handler the
//! whole stack is infallible, as axum requires.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{HeaderValue, StatusCode, header};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::LockError;

/// The status code of each [`LockError`] that is not the inner service's own error.
///
/// Defaults: contention and an exhausted wait budget **409 Conflict** (someone else holds the
/// lock), backend unavailable (including a wait budget spent on nothing but faults) **503
/// Service Unavailable**, lease lost mid-request **503** (the work did not finish under the
/// lock; a retry may succeed), any other lock error (an invalid key) **500**.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusMap {
    contended: StatusCode,
    timeout: StatusCode,
    unavailable: StatusCode,
    lease_lost: StatusCode,
    lock_error: StatusCode,
    /// Seconds for a `Retry-After` header on contention and timeout answers, if any.
    retry_after: Option<u32>,
}

impl Default for StatusMap {
    fn default() -> Self {
        Self {
            contended: StatusCode::CONFLICT,
            timeout: StatusCode::CONFLICT,
            unavailable: StatusCode::SERVICE_UNAVAILABLE,
            lease_lost: StatusCode::SERVICE_UNAVAILABLE,
            lock_error: StatusCode::INTERNAL_SERVER_ERROR,
            retry_after: None,
        }
    }
}

/// One setter per status of a [`StatusMap`], each with its doc line.
macro_rules! status_setters {
    ($($(#[$doc:meta])* $name:ident;)+) => {
        impl StatusMap {
            $(
                $(#[$doc])*
                pub fn $name(mut self, status: StatusCode) -> Self {
                    self.$name = status;
                    self
                }
            )+
        }
    };
}

status_setters! {
    /// The status of [`LockError::Contended`] (default 409).
    contended;
    /// The status of [`LockError::Timeout`] (default 409).
    timeout;
    /// The status of [`LockError::Unavailable`] (default 503).
    unavailable;
    /// The status of [`LockError::LeaseLost`] (default 503).
    lease_lost;
    /// The status of [`LockError::Lock`] (default 500).
    lock_error;
}

impl StatusMap {
    /// The map of a concurrency limit ([`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer)):
    /// every permit taken (contention, or a wait budget run out) is **503 Service
    /// Unavailable** with `Retry-After: 1`; the rest as [`StatusMap::default`].
    pub fn concurrency_limit() -> Self {
        Self::default()
            .contended(StatusCode::SERVICE_UNAVAILABLE)
            .timeout(StatusCode::SERVICE_UNAVAILABLE)
            .retry_after(Some(1))
    }

    /// Adds `Retry-After: <secs>` to contention and timeout answers (`None`: no header).
    pub fn retry_after(mut self, secs: Option<u32>) -> Self {
        self.retry_after = secs;
        self
    }

    /// The status of `err`; `None` for the inner service's own error
    /// ([`LockError::Service`]).
    pub fn status<E, R>(&self, err: &LockError<E, R>) -> Option<StatusCode> {
        Some(match err {
            LockError::Contended { .. } => self.contended,
            LockError::Timeout { .. } => self.timeout,
            LockError::Unavailable(_) => self.unavailable,
            LockError::LeaseLost { .. } => self.lease_lost,
            LockError::Lock(_) => self.lock_error,
            LockError::Service(_) => return None,
        })
    }

    /// The response for `err`: its status, and a short plain-text body that names neither the
    /// key nor the backend (they may be internal). `None` for [`LockError::Service`].
    pub fn response<B, E, R>(&self, err: &LockError<E, R>) -> Option<http::Response<B>>
    where
        B: From<String>,
    {
        self.parts(err).map(Parts::response)
    }

    fn parts<E, R>(&self, err: &LockError<E, R>) -> Option<Parts> {
        let status = self.status(err)?;
        let text = match err {
            LockError::Contended { .. } => "the resource is locked by another request",
            LockError::Timeout { .. } => "timed out waiting for the resource's lock",
            LockError::Unavailable(_) => "the lock service is unavailable",
            LockError::LeaseLost { .. } => "the lock was lost before the request finished",
            _ => "lock error",
        };
        let retry_after = match err {
            LockError::Contended { .. } | LockError::Timeout { .. } => self.retry_after,
            _ => None,
        };
        Some(Parts {
            status,
            text,
            retry_after,
        })
    }
}

/// What a lock failure's response is made of.
#[derive(Debug, Clone, Copy)]
struct Parts {
    status: StatusCode,
    text: &'static str,
    retry_after: Option<u32>,
}

impl Parts {
    fn response<B: From<String>>(self) -> http::Response<B> {
        let mut response = http::Response::new(B::from(format!("{}\n", self.text)));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl<E> crate::FenceError<E> {
    /// The HTTP status of this error, for a resource service that answers over `http`:
    /// **409 Conflict** for a stale token (the sender's lease was superseded), **400 Bad
    /// Request** for a request without a token, **503 Service Unavailable** when the store of
    /// highest tokens failed; `None` for the inner service's own error.
    pub fn status(&self) -> Option<StatusCode> {
        Some(match self {
            crate::FenceError::Stale { .. } => StatusCode::CONFLICT,
            crate::FenceError::MissingToken => StatusCode::BAD_REQUEST,
            crate::FenceError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            crate::FenceError::Service(_) => return None,
        })
    }
}

impl<E, R> LockError<E, R> {
    /// The HTTP status of this error under the default [`StatusMap`]; `None` for the inner
    /// service's own error.
    pub fn status(&self) -> Option<StatusCode> {
        StatusMap::default().status(self)
    }
}

/// Wraps a [`Lock`](crate::Lock) service (or anything failing with a [`LockError`]) in
/// [`ErrorResponse`]: lock failures become responses by a [`StatusMap`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorResponseLayer {
    map: StatusMap,
}

impl ErrorResponseLayer {
    /// A layer answering lock failures by `map`.
    pub fn new(map: StatusMap) -> Self {
        Self { map }
    }
}

impl<S> Layer<S> for ErrorResponseLayer {
    type Service = ErrorResponse<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ErrorResponse::new(inner, self.map)
    }
}

/// Answers the [`LockError`]s of the inner service with `http` responses; the inner service's
/// own errors ([`LockError::Service`]) pass through as its error type.
///
/// A lock failure from the inner `poll_ready` (which [`Lock`](crate::Lock) never produces) is
/// answered too: `poll_ready` then reports ready and the next request gets that response.
#[derive(Debug)]
pub struct ErrorResponse<S> {
    inner: S,
    map: StatusMap,
    failed_ready: Option<Parts>,
}

impl<S: Clone> Clone for ErrorResponse<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            map: self.map,
            failed_ready: None,
        }
    }
}

impl<S> ErrorResponse<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, map: StatusMap) -> Self {
        Self {
            inner,
            map,
            failed_ready: None,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, Req, B, E, R> Service<Req> for ErrorResponse<S>
where
    S: Service<Req, Response = http::Response<B>, Error = LockError<E, R>>,
    B: From<String>,
{
    type Response = http::Response<B>;
    type Error = E;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        if self.failed_ready.is_some() {
            return Poll::Ready(Ok(()));
        }
        match ready!(self.inner.poll_ready(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(LockError::Service(e)) => Poll::Ready(Err(e)),
            Err(other) => {
                self.failed_ready = self.map.parts(&other);
                Poll::Ready(Ok(()))
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        if let Some(parts) = self.failed_ready.take() {
            return ResponseFuture {
                fut: None,
                map: self.map,
                failed: Some(parts),
            };
        }
        ResponseFuture {
            fut: Some(self.inner.call(req)),
            map: self.map,
            failed: None,
        }
    }
}

pin_project! {
    /// The response future of [`ErrorResponse`].
    pub struct ResponseFuture<F> {
        #[pin]
        fut: Option<F>,
        map: StatusMap,
        failed: Option<Parts>,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("map", &self.map)
            .finish_non_exhaustive()
    }
}

impl<F, B, E, R> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<B>, LockError<E, R>>>,
    B: From<String>,
{
    type Output = Result<http::Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Some(parts) = this.failed.take() {
            return Poll::Ready(Ok(parts.response()));
        }
        let Some(fut) = this.fut.as_pin_mut() else {
            crate::once::polled_after_completion()
        };
        Poll::Ready(match ready!(fut.poll(cx)) {
            Ok(response) => Ok(response),
            Err(LockError::Service(e)) => Err(e),
            Err(err) => Ok(this
                .map
                .parts(&err)
                .unwrap_or(Parts {
                    status: this.map.lock_error,
                    text: "lock error",
                    retry_after: None,
                })
                .response()),
        })
    }
}
