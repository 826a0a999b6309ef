//! The test backend of the release tests (each test file its own binary: `settle` and the
//! release gate count process-wide or per backend).
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{
    Capabilities, Error, ExtendRequest, Extended, Grant, Held, HolderInfo, LockBackend, LockKey,
    LockRequest, MemoryBackend, ReleaseGate, Validity, Waited, async_trait,
};
use tokio::time::Instant;

/// The key whose release never answers.
pub(crate) const STUCK: &str = "stuck";

/// The memory backend with releases that take a while, counted while in flight (the release
/// of [`STUCK`] never answers), behind a release gate if [`gated`](SlowRelease::gated).
#[derive(Debug, Clone)]
pub(crate) struct SlowRelease {
    inner: MemoryBackend,
    delay: Duration,
    gate: Option<Arc<ReleaseGate>>,
    in_flight: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl SlowRelease {
    /// Releases that take `delay`, no gate.
    pub(crate) fn new(delay: Duration) -> Self {
        Self {
            inner: MemoryBackend::default(),
            delay,
            gate: None,
            in_flight: Arc::default(),
            most: Arc::default(),
        }
    }

    /// The same behind a gate of `places`.
    pub(crate) fn gated(self, places: usize) -> Self {
        Self {
            gate: Some(Arc::new(ReleaseGate::new(places))),
            ..self
        }
    }

    /// The most releases seen in flight at once.
    pub(crate) fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// Counts a release in flight while it lives.
struct Flying<'a>(&'a AtomicUsize);

impl Drop for Flying<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl LockBackend for SlowRelease {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_name("slow-release")
            .without_primitives()
    }
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.inner.try_lock(req).await
    }
    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        self.inner.wait_lock(req, deadline).await
    }
    fn release_gate(&self) -> Option<&ReleaseGate> {
        self.gate.as_deref()
    }
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let _flying = Flying(&self.in_flight);
        self.most.fetch_max(now, Ordering::SeqCst);
        if held.key.as_str() == STUCK {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.delay).await;
        self.inner.release(held).await
    }
    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        self.inner.extend(req).await
    }
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<Extended> {
        leasehold_core::extend_each(self, reqs).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inner.inspect(key).await
    }
}
