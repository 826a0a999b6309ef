use std::mem;
use std::task::{Context, Poll};

use leasehold_core::{Error, LockKey, Locker};
use tower_service::Service;

use super::future::{Acquiring, ResponseFuture};
use super::{InsertLease, KeyExtractor, Mode, OnLost};
use crate::LockError;

/// Runs each request under a lease of its key (see [`LockLayer`](super::LockLayer)).
///
/// `poll_ready` is the inner service's. `call` moves the service that was driven to readiness
/// into the response future (leaving a fresh clone behind, as tower's guidance asks), so the
/// request reaches exactly the service instance that said it was ready, after the lease is
/// granted.
#[derive(Debug, Clone)]
pub struct Lock<S, K> {
    inner: S,
    locker: Locker,
    extractor: K,
    mode: Mode,
    on_lost: OnLost,
}

impl<S, K> Lock<S, K> {
    /// Wraps `inner`.
    pub fn new(inner: S, locker: Locker, extractor: K, mode: Mode, on_lost: OnLost) -> Self {
        Self {
            inner,
            locker,
            extractor,
            mode,
            on_lost,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, Req> Service<Req> for Lock<S, K>
where
    S: Service<Req> + Clone,
    K: KeyExtractor<Req>,
    Req: InsertLease,
{
    type Response = S::Response;
    type Error = LockError<S::Error, S::Response>;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(LockError::Service)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some(key) = self.extractor.extract(&req) else {
            return ResponseFuture::pass(self.inner.call(req));
        };
        let key = match LockKey::new(key) {
            Ok(k) => k,
            Err(e) => {
                return ResponseFuture::failed(LockError::Lock(Error::invalid_key(
                    self.locker.backend().name(),
                    e,
                )));
            }
        };
        let clone = self.inner.clone();
        let ready = mem::replace(&mut self.inner, clone);
        let locker = self.locker.clone();
        let k = key.clone();
        let acquiring: Acquiring = match self.mode {
            Mode::Try => Box::pin(async move { locker.try_acquire(k).await }),
            Mode::Wait(budget) => {
                Box::pin(async move { locker.acquire(k, budget).await.map(Some) })
            }
        };
        ResponseFuture::acquire(acquiring, ready, req, key, self.on_lost)
    }
}
