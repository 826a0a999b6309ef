use std::sync::Arc;

use leasehold_core::Locker;
use tower_layer::Layer;

use super::hold::{UntilBodyEnd, UntilResponse};
use super::settings::Settings;
use super::{Lock, Mode, OnLost};

/// Wraps a service in [`Lock`]: each request whose key the extractor picks runs under a lease
/// of that key, taken from `locker`.
///
/// Defaults: [`Mode::Try`] (fail fast on contention), [`OnLost::Abort`], and the lease held
/// until the response is ready ([`UntilResponse`]; see [`hold_body`](Self::hold_body)).
#[derive(Debug, Clone)]
pub struct LockLayer<K, H = UntilResponse> {
    settings: Settings<K, H>,
}

impl<K> LockLayer<K> {
    /// A layer taking leases from `locker`, on the keys `extractor` picks.
    pub fn new(locker: Locker, extractor: K) -> Self {
        Self {
            settings: Settings::new(locker, extractor, Mode::Try, OnLost::default()),
        }
    }
}

impl<K, H> LockLayer<K, H> {
    /// One attempt per request; contention fails the request.
    pub fn try_lock(mut self) -> Self {
        self.settings.mode = Mode::Try;
        self
    }

    /// Wait at most `budget` per request for the lock.
    pub fn wait(mut self, budget: std::time::Duration) -> Self {
        self.settings.mode = Mode::Wait(budget);
        self
    }

    /// Sets the acquisition mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// Sets what happens when the lease is lost mid-request.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.settings.on_lost = on_lost;
        self
    }

    /// Names the route of these requests in the metrics (`route` label of
    /// `leasehold_requests_total`, with the `metrics` feature). A
    /// [`KeyExtractor::route`](super::KeyExtractor::route) that derives one per request wins.
    pub fn route(mut self, route: impl Into<Arc<str>>) -> Self {
        self.settings.route = Some(route.into());
        self
    }

    /// For `http` services: hold each lease until the response **body** has finished
    /// streaming (or is dropped), not just until the response head is ready. The response body
    /// becomes a [`LeaseBody`](super::LeaseBody).
    pub fn hold_body(self) -> LockLayer<K, UntilBodyEnd> {
        self.hold(UntilBodyEnd)
    }

    /// Sets what is done with the lease when the response is ready (see [`Hold`](super::Hold)).
    pub fn hold<H2>(self, hold: H2) -> LockLayer<K, H2> {
        LockLayer {
            settings: self.settings.with_hold(hold),
        }
    }
}

impl<S, K: Clone, H: Clone> Layer<S> for LockLayer<K, H> {
    type Service = Lock<S, K, H>;

    fn layer(&self, inner: S) -> Self::Service {
        Lock::with_settings(inner, self.settings.clone())
    }
}
