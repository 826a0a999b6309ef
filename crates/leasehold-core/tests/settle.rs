//! `settle`: a program can wait for the releases leasehold runs in the background (a lease
//! dropped without `release`, an acquisition cut short) before its runtime shuts down.
//!
//! Alone in its own test binary: the count of background releases is process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use leasehold_core::{
    Capabilities, Error, ExtendRequest, Grant, Held, HolderInfo, LockBackend, LockKey, LockRequest,
    Locker, MemoryBackend, Validity, Waited, async_trait, settle,
};
use tokio::time::Instant;

/// The memory backend, with releases that take `DELAY`.
#[derive(Debug, Clone, Default)]
struct SlowRelease {
    inner: MemoryBackend,
}

const DELAY: Duration = Duration::from_millis(300);

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
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        tokio::time::sleep(DELAY).await;
        self.inner.release(held).await
    }
    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        self.inner.extend(req).await
    }
    async fn extend_many(
        &self,
        reqs: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<leasehold_core::Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inner.inspect(key).await
    }
}

#[tokio::test]
async fn settle_waits_for_the_release_of_a_dropped_lease() {
    let backend = SlowRelease::default();
    let locker = Locker::new(backend.clone());
    let other = Locker::new(backend);
    assert!(settle(Duration::ZERO).await, "nothing in flight yet");

    let lease = locker.try_acquire("k").await.unwrap().expect("free");
    drop(lease); // released in the background, which takes DELAY
    assert!(
        other.try_acquire("k").await.unwrap().is_none(),
        "the background release cannot have finished yet"
    );
    assert!(
        !settle(Duration::from_millis(50)).await,
        "settle said done while a release was still running"
    );
    let t0 = Instant::now();
    assert!(settle(Duration::from_secs(5)).await);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "settle waited for its bound, not for the release"
    );
    let again = other.try_acquire("k").await.unwrap();
    assert!(again.is_some(), "settle returned before the lock was freed");
    again.unwrap().release().await.unwrap();
}
