use std::mem;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::{Admitting, ResponseFuture};
use super::{FenceExtractor, FenceStore};
use crate::FenceError;

/// Admits a request only if its fencing token is not stale (see
/// [`FenceLayer`](super::FenceLayer)). `poll_ready` is the inner service's; the readied service
/// moves into the response future, a clone stays behind.
#[derive(Debug)]
pub struct Fence<S, X, St> {
    inner: S,
    extractor: X,
    store: Arc<St>,
}

impl<S: Clone, X: Clone, St> Clone for Fence<S, X, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            extractor: self.extractor.clone(),
            store: Arc::clone(&self.store),
        }
    }
}

impl<S, X, St> Fence<S, X, St> {
    /// Wraps `inner`.
    pub fn new(inner: S, extractor: X, store: Arc<St>) -> Self {
        Self {
            inner,
            extractor,
            store,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, X, St, Req> Service<Req> for Fence<S, X, St>
where
    S: Service<Req> + Clone,
    X: FenceExtractor<Req>,
    St: FenceStore,
{
    type Response = S::Response;
    type Error = FenceError<S::Error>;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(FenceError::Service)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Some((resource, token)) = self.extractor.extract(&req) else {
            return ResponseFuture::failed(FenceError::MissingToken);
        };
        let clone = self.inner.clone();
        let ready = mem::replace(&mut self.inner, clone);
        let store = Arc::clone(&self.store);
        let r = resource.clone();
        let admitting: Admitting = Box::pin(async move { store.admit(&r, token).await });
        ResponseFuture::admit(admitting, ready, req, resource, token)
    }
}
