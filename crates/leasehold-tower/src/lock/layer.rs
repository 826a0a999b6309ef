use leasehold_core::Locker;
use tower_layer::Layer;

use super::{Lock, Mode, OnLost};

/// Wraps a service in [`Lock`]: each request whose key the extractor picks runs under a lease
/// of that key, taken from `locker`.
///
/// Defaults: [`Mode::Try`] (fail fast on contention) and [`OnLost::Abort`].
#[derive(Debug, Clone)]
pub struct LockLayer<K> {
    locker: Locker,
    extractor: K,
    mode: Mode,
    on_lost: OnLost,
}

impl<K> LockLayer<K> {
    /// A layer taking leases from `locker`, on the keys `extractor` picks.
    pub fn new(locker: Locker, extractor: K) -> Self {
        Self {
            locker,
            extractor,
            mode: Mode::Try,
            on_lost: OnLost::default(),
        }
    }

    /// One attempt per request; contention fails the request.
    pub fn try_lock(mut self) -> Self {
        self.mode = Mode::Try;
        self
    }

    /// Wait at most `budget` per request for the lock.
    pub fn wait(mut self, budget: std::time::Duration) -> Self {
        self.mode = Mode::Wait(budget);
        self
    }

    /// Sets the acquisition mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets what happens when the lease is lost mid-request.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }
}

impl<S, K: Clone> Layer<S> for LockLayer<K> {
    type Service = Lock<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Lock::new(
            inner,
            self.locker.clone(),
            self.extractor.clone(),
            self.mode,
            self.on_lost,
        )
    }
}
