//! A renewal batch already sent when its lease is released, and answered after: a backend
//! whose extend sets a missing key again (Redlock does, for nodes that restarted empty) has then
//! armed the grant anew, and the renewal engine must release it again rather than leave the
//! lock held for a whole TTL by a lease its holder let go.
//!
//! Alone in its own test binary: `settle` counts background releases process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    Capabilities, Error, ExtendRequest, Grant, Held, HolderInfo, LockBackend, LockKey, LockOptions,
    LockRequest, Locker, MemoryBackend, Renewal, Validity, Waited, async_trait, settle,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The memory backend, whose batch renewal waits for `gate` and then, like a Redlock extend,
/// sets the key again for its owner even if it was deleted meanwhile (kept in `reset`).
#[derive(Debug, Clone, Default)]
struct ResettingExtend {
    inner: MemoryBackend,
    entered: Arc<Notify>,
    gate: Arc<Notify>,
    reset: Arc<Mutex<Option<String>>>,
}

impl ResettingExtend {
    fn reset_by_other(&self, owner: &str) -> bool {
        self.reset
            .lock()
            .unwrap()
            .as_deref()
            .is_some_and(|o| o != owner)
    }
}

#[async_trait]
impl LockBackend for ResettingExtend {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_name("resetting-extend")
            .without_primitives()
    }
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        if self.reset_by_other(req.owner.as_str()) {
            return Ok(None);
        }
        self.inner.try_lock(req).await
    }
    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        self.inner.wait_lock(req, deadline).await
    }
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let was_reset = {
            let mut reset = self.reset.lock().unwrap();
            let ours = reset.as_deref() == Some(held.owner.as_str());
            if ours {
                *reset = None;
            }
            ours
        };
        Ok(self.inner.release(held).await? || was_reset)
    }
    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        self.inner.extend(req).await
    }
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<leasehold_core::Extended> {
        self.entered.notify_one();
        self.gate.notified().await;
        let mut answers = Vec::new();
        for req in reqs {
            *self.reset.lock().unwrap() = Some(req.held.owner.as_str().to_owned());
            answers.push(Ok(Some(req.ttl_validity())));
        }
        answers
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inner.inspect(key).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_after_the_release_is_released_again() {
    let backend = ResettingExtend::default();
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(30))
        .with_renewal(Renewal::Every(Duration::from_millis(100)));
    let locker = Locker::new(backend.clone()).with_options(options).unwrap();
    let other = Locker::new(backend.clone());

    let lease = locker.try_acquire("k").await.unwrap().expect("free");
    // The engine's batch is under way (sent, not answered) ...
    tokio::time::timeout(Duration::from_secs(5), backend.entered.notified())
        .await
        .expect("the renewal batch started");
    // ... when the holder releases.
    assert!(lease.release().await.unwrap());
    // The batch answers now, having set the key again.
    backend.gate.notify_one();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(settle(Duration::from_secs(5)).await, "background releases");
    let again = other.try_acquire("k").await.unwrap();
    assert!(
        again.is_some(),
        "the grant the late renewal armed again was left held"
    );
}
