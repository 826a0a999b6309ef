use std::mem;
use std::task::{Context, Poll};

use leasehold_core::{Error, LockKey, Locker};
use tower_service::Service;

use super::future::{Acquiring, ResponseFuture};
use super::hold::{Hold, UntilResponse};
use super::settings::Settings;
use super::{InsertLease, KeyExtractor, Mode, OnLost};
use crate::LockError;
use crate::meter::Meter;

/// Runs each request under a lease of its key (see [`LockLayer`](super::LockLayer)).
///
/// `poll_ready` is the inner service's. `call` moves the service that was driven to readiness
/// into the response future (leaving a fresh clone behind, as tower's guidance asks), so the
/// request reaches exactly the service instance that said it was ready, after the lease is
/// granted.
#[derive(Debug, Clone)]
pub struct Lock<S, K, H = UntilResponse> {
    inner: S,
    settings: Settings<K, H>,
}

impl<S, K> Lock<S, K> {
    /// Wraps `inner`, holding each lease until the response is ready.
    pub fn new(inner: S, locker: Locker, extractor: K, mode: Mode, on_lost: OnLost) -> Self {
        Self::with_settings(inner, Settings::new(locker, extractor, mode, on_lost))
    }
}

impl<S, K, H> Lock<S, K, H> {
    pub(super) fn with_settings(inner: S, settings: Settings<K, H>) -> Self {
        Self { inner, settings }
    }

    /// The same service with another [`Hold`] policy.
    pub fn with_hold<H2>(self, hold: H2) -> Lock<S, K, H2> {
        Lock::with_settings(self.inner, self.settings.with_hold(hold))
    }

    /// The same service with this `route` label on its metrics (the `metrics` feature).
    pub fn with_route(mut self, route: Option<std::sync::Arc<str>>) -> Self {
        self.settings.route = route;
        self
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

    /// The metrics label of one request: the extractor's route, else the layer's.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn meter<Req>(&self, req: &Req) -> Meter
    where
        K: KeyExtractor<Req>,
    {
        #[cfg(feature = "metrics")]
        {
            let route = match self.settings.extractor.route(req) {
                Some(r) => Some(metrics::SharedString::from(r)),
                None => self.settings.route.clone().map(metrics::SharedString::from),
            };
            Meter::new(route)
        }
        #[cfg(not(feature = "metrics"))]
        Meter::default()
    }
}

impl<S, K, H, Req> Service<Req> for Lock<S, K, H>
where
    S: Service<Req> + Clone,
    K: KeyExtractor<Req>,
    Req: InsertLease,
    H: Hold<S::Response> + Clone,
{
    type Response = H::Response;
    type Error = LockError<S::Error, S::Response>;
    type Future = ResponseFuture<S, Req, H>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(LockError::Service)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let meter = self.meter(&req);
        let hold = self.settings.hold.clone();
        let Some(key) = self.settings.extractor.extract(&req) else {
            return ResponseFuture::pass(self.inner.call(req), hold, meter);
        };
        let key = match LockKey::new(key) {
            Ok(k) => k,
            Err(e) => {
                let err = LockError::Lock(Error::invalid_key(
                    self.settings.locker.backend().capabilities().name,
                    e,
                ));
                return ResponseFuture::failed(err, hold, meter);
            }
        };
        let clone = self.inner.clone();
        let ready = mem::replace(&mut self.inner, clone);
        let locker = self.settings.locker.clone();
        let k = key.clone();
        let acquiring: Acquiring = match self.settings.mode {
            Mode::Try => Box::pin(async move { locker.try_acquire(k).await }),
            Mode::Wait(budget) => {
                Box::pin(async move { locker.acquire(k, budget).await.map(Some) })
            }
        };
        ResponseFuture::acquire(
            acquiring,
            ready,
            req,
            key,
            self.settings.on_lost,
            hold,
            meter,
        )
    }
}
