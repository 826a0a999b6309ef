//! The in-memory backend: exact semantics within one process.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{
    ExtendRequest, Extended, Grant, Held, HolderInfo, LockBackend, LockRequest, Waited,
};
use crate::caps::{Capabilities, FencingKind, SafetyClass, WaitKind};
use crate::election::{Candidate, ElectionBackend};
use crate::error::Error;
use crate::key::LockKey;
use crate::memory_permits::{MemoryPermits, PermitTable};
use crate::semaphore::{PermitBackend, PermitLimit};

/// Locks held in this process's memory: the embedded default, and the reference the conformance
/// suite is checked against.
///
/// - Mutual exclusion is exact among all users of one `MemoryBackend` (clones share state), and
///   nothing more: two processes, or two separate `MemoryBackend::new()`, never exclude each
///   other ([`SafetyClass::Process`]).
/// - TTLs run on Tokio's clock, so `tokio::time::pause()` drives them in tests.
/// - Fencing tokens come from one process-wide counter per backend, so they strictly increase
///   for every key ([`FencingKind::Monotonic`]).
/// - Waiters are woken when the key is released, or when the holder's TTL runs out: no polling
///   ([`WaitKind::Native`]).
/// - A dropped holder's lease is released in the background (see [`Lease`](crate::Lease)).
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The locks: permits of limit 1, in a table of their own (their own token counter).
    locks: Arc<PermitTable>,
    permits: Arc<PermitTable>,
    /// The locks and values of elections, apart from the locks of the same keys.
    elections: std::sync::OnceLock<crate::memory_election::Elections>,
}

const NAME: &str = "memory";

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many keys are held right now (expired grants don't count): the conformance suite's
    /// leak check.
    pub fn held_count(&self) -> usize {
        self.locks().held_count()
    }

    /// The locks, as the one permit of each key of a table kept for locks.
    fn locks(&self) -> MemoryPermits {
        MemoryPermits::new(
            Arc::clone(&self.inner.locks),
            PermitLimit::ONE,
            self.capabilities(),
        )
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(NAME, SafetyClass::Process, FencingKind::Monotonic)
            .with_wait(WaitKind::Native)
            .with_semaphores()
            .with_elections()
    }

    /// A [`MemoryPermits`] view sharing this backend's permits.
    fn semaphore(self: Arc<Self>, limit: PermitLimit) -> Result<Arc<dyn PermitBackend>, Error> {
        let table = Arc::clone(&self.inner.permits);
        Ok(Arc::new(MemoryPermits::new(
            table,
            limit,
            self.capabilities(),
        )))
    }

    fn election(self: Arc<Self>, candidate: Candidate) -> Result<Arc<dyn ElectionBackend>, Error> {
        let elections = self.inner.elections.get_or_init(Default::default);
        Ok(Arc::new(elections.view(candidate)))
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.locks().try_lock(req).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        self.locks().wait_lock(req, deadline).await
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        self.locks().release(held).await
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Extended {
        self.locks().extend(req).await
    }

    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<Extended> {
        self.locks().extend_many(reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.locks().inspect(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, LockOptions, Locker, LossReason, Renewal};
    use async_trait::async_trait;
    use std::time::Duration;

    fn locker(ttl_ms: u64, renewal: Renewal) -> Result<Locker, Error> {
        Locker::new(MemoryBackend::new()).with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(ttl_ms))
                .with_renewal(renewal),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_expiry_runs_on_tokio_time() -> Result<(), Error> {
        let l = locker(1_000, Renewal::Off)?;
        let a = l.try_acquire("k").await?.ok_or_else(|| missing("a"))?;
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(l.try_acquire("k").await?.is_none());
        assert!(!a.is_lost());
        // The lease is lost at ttl − drift (1000 − 12 ms), before the server-side expiry.
        tokio::time::advance(Duration::from_millis(95)).await;
        assert_eq!(a.loss_reason(), Some(LossReason::Expired));
        assert!(l.try_acquire("k").await?.is_none());
        tokio::time::advance(Duration::from_millis(10)).await;
        let b = l.try_acquire("k").await?.ok_or_else(|| missing("b"))?;
        assert!(b.fencing_token() > a.fencing_token());
        assert!(!a.release().await?);
        assert!(b.release().await?);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn watchdog_renews_and_waiters_wake_on_release() -> Result<(), Error> {
        let l = locker(300, Renewal::Auto)?;
        let a = l.try_acquire("k").await?.ok_or_else(|| missing("a"))?;
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.acquire("k", Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!a.is_lost());
        assert!(!waiter.is_finished());
        let t0 = Instant::now();
        assert!(a.release().await?);
        let b = waiter.await.map_err(|e| missing(&e.to_string()))??;
        assert_eq!(Instant::now(), t0, "woken by the release, not by a poll");
        assert!(b.fencing_token() > a.fencing_token());
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn zero_budget_is_one_try() -> Result<(), Error> {
        let l = locker(1_000, Renewal::Off)?;
        let _a = l.try_acquire("k").await?;
        let err = l
            .acquire("k", Duration::ZERO)
            .await
            .err()
            .ok_or_else(|| missing("timeout"))?;
        assert_eq!(err.kind(), ErrorKind::Timeout);
        assert_eq!(err.attempts(), Some(1));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn the_monitor_tells_release_from_expiry() -> Result<(), Error> {
        // A backend watching its grants sees why a lease ended.
        #[derive(Debug, Clone, Default)]
        struct Watching {
            inner: MemoryBackend,
            monitors: Arc<std::sync::Mutex<Vec<crate::LeaseMonitor>>>,
        }
        #[async_trait]
        impl LockBackend for Watching {
            crate::refuse_primitives!("a test backend");

            fn capabilities(&self) -> Capabilities {
                self.inner
                    .capabilities()
                    .with_name("watching")
                    .without_primitives()
            }
            async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
                if let Ok(mut m) = self.monitors.lock() {
                    m.push(req.monitor.clone());
                }
                self.inner.try_lock(req).await
            }
            async fn wait_lock(&self, req: LockRequest<'_>, d: Instant) -> Result<Waited, Error> {
                self.inner.wait_lock(req, d).await
            }
            async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
                self.inner.release(held).await
            }
            async fn extend(&self, req: ExtendRequest<'_>) -> Extended {
                self.inner.extend(req).await
            }
            /// No batch request here: each grant in turn.
            async fn extend_many(&self, reqs: &[crate::ExtendRequest<'_>]) -> Vec<crate::Extended> {
                crate::extend_each(self, reqs).await
            }

            async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
                self.inner.inspect(key).await
            }
        }
        let backend = Watching::default();
        let l = Locker::new(backend.clone()).with_options(
            LockOptions::default()
                .with_ttl(Duration::from_secs(1))
                .with_renewal(Renewal::Off),
        )?;
        let a = l.try_acquire("a").await?.ok_or_else(|| missing("a"))?;
        let b = l.try_acquire("b").await?.ok_or_else(|| missing("b"))?;
        let monitors = backend
            .monitors
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        assert_eq!(monitors.len(), 2);
        assert_eq!(monitors[0].loss_reason(), None);
        assert!(a.release().await?);
        assert_eq!(monitors[0].loss_reason(), Some(LossReason::Released));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(monitors[1].loss_reason(), Some(LossReason::Expired));
        drop(b);
        assert!(monitors.iter().all(crate::LeaseMonitor::is_closed));
        Ok(())
    }

    #[tokio::test]
    async fn dropped_lease_is_released_in_background() -> Result<(), Error> {
        let backend = MemoryBackend::new();
        let l = Locker::new(backend.clone());
        drop(l.try_acquire("k").await?);
        for _ in 0..100 {
            if backend.held_count() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(backend.held_count(), 0);
        assert_eq!(backend.locks().keys(), 0, "no slot left behind");
        Ok(())
    }

    #[test]
    fn dropping_a_lease_without_a_runtime_does_not_panic() -> Result<(), Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| missing(&e.to_string()))?;
        let lease = rt.block_on(Locker::new(MemoryBackend::new()).try_acquire("k"))?;
        drop(rt);
        drop(lease);
        Ok(())
    }

    fn missing(what: &str) -> Error {
        Error::new(ErrorKind::Backend, "test", format!("expected {what}"))
    }
}
