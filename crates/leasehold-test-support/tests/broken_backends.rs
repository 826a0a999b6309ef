//! The suite can fail: each deliberately broken wrapper around the in-memory backend breaks one
//! rule of the contract, and the check for that rule must catch it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    Capabilities, Error, ExtendRequest, FencingKind, FencingToken, Grant, Held, HolderInfo,
    LockBackend, LockKey, LockRequest, MemoryBackend, Validity, WaitKind, Waited, async_trait,
};
use leasehold_test_support::conformance::{self, Target};
use tokio::time::Instant;

/// Which rule the wrapper breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// breaks nothing: the control.
    None,
    /// release deletes whoever holds the key.
    ReleaseAny,
    /// try_lock grants even when the key is held.
    NoExclusion,
    /// claims fencing but always hands out the same token.
    FlatTokens,
    /// counts validity from after the answer arrived.
    LateValidity,
    /// extend says yes without re-arming anything.
    FakeExtend,
    /// ignores the cleanup of an acquisition whose answer was never seen.
    IgnoreCleanup,
}

#[derive(Debug)]
struct Broken {
    inner: MemoryBackend,
    fault: Fault,
}

#[async_trait]
impl LockBackend for Broken {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> Capabilities {
        // Poll, so the Locker goes through try_lock (where most faults live).
        let caps = self
            .inner
            .capabilities()
            .with_wait(WaitKind::Poll)
            .with_name("broken-memory")
            .without_primitives();
        if self.fault == Fault::NoExclusion {
            // Fabricated grants carry no token; claim none, so only the overlap can give it away.
            let mut caps = caps;
            caps.fencing = FencingKind::None;
            return caps;
        }
        caps
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let grant = self.inner.try_lock(req).await?;
        match self.fault {
            Fault::NoExclusion => Ok(Some(
                grant.unwrap_or_else(|| Grant::new(req.ttl_validity())),
            )),
            Fault::FlatTokens => Ok(grant.map(|g| {
                let mut flat = Grant::new(g.validity).with_fencing(FencingToken::new(1));
                flat.state = g.state;
                flat
            })),
            Fault::LateValidity => Ok(grant.map(|g| {
                let mut late = Grant::new(Validity::new(
                    Instant::now() + Duration::from_secs(1),
                    g.validity.ttl,
                ));
                late.fencing = g.fencing;
                late
            })),
            Fault::IgnoreCleanup => {
                // The answer takes a while to come back: a dropped future leaves the grant behind.
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok(grant)
            }
            _ => Ok(grant),
        }
    }

    async fn wait_lock(&self, _req: LockRequest<'_>, _deadline: Instant) -> Result<Waited, Error> {
        Err(Error::new(
            leasehold_core::ErrorKind::Unsupported,
            "broken-memory",
            "no native wait",
        ))
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        match self.fault {
            Fault::ReleaseAny => {
                let Some(owner) = self.inner.inspect(held.key).await?.and_then(|h| h.owner) else {
                    return Ok(false);
                };
                self.inner
                    .release(Held::new(held.key, &owner, None, None))
                    .await
            }
            Fault::IgnoreCleanup if held.fencing.is_none() => Ok(false),
            Fault::NoExclusion => {
                // Lies consistently: every release "succeeds".
                self.inner.release(held).await?;
                Ok(true)
            }
            _ => self.inner.release(held).await,
        }
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        match self.fault {
            Fault::FakeExtend => Ok(Some(req.ttl_validity())),
            _ => self.inner.extend(req).await,
        }
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

fn target(fault: Fault) -> Target {
    let inner = MemoryBackend::new();
    let counter = inner.clone();
    let backend: Arc<dyn LockBackend> = Arc::new(Broken { inner, fault });
    Target::new(Arc::clone(&backend), backend, Duration::from_millis(300)).with_held(Arc::new(
        move || {
            let n = counter.held_count();
            Box::pin(async move { Ok(n) })
        },
    ))
}

async fn assert_fails(fault: Fault, check: &str, because: &str) {
    let t = target(fault);
    let outcome = conformance::run(check, &t).await;
    let Err(failure) = outcome else {
        panic!("{fault:?} passed `{check}`");
    };
    assert_eq!(failure.check, check, "{failure}");
    assert!(failure.message.contains(because), "{failure}");
    eprintln!("{fault:?} fails as it should: {failure}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_any_holder_fails_own_grant_only() {
    assert_fails(
        Fault::ReleaseAny,
        "own_grant_only",
        "our release said we held",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_exclusion_fails_mutual_exclusion() {
    assert_fails(
        Fault::NoExclusion,
        "mutual_exclusion",
        "overlapping holders",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flat_tokens_fail_fencing_tokens() {
    assert_fails(Fault::FlatTokens, "fencing_tokens", "strictly increase").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_validity_fails_validity_deadline() {
    assert_fails(
        Fault::LateValidity,
        "validity_deadline",
        "counted from the answer",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_extend_fails_watchdog() {
    assert_fails(Fault::FakeExtend, "watchdog", "acquired a renewed lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_cleanup_fails_cancellation() {
    let mut t = target(Fault::IgnoreCleanup);
    t.settle = Duration::from_secs(1);
    let failure = conformance::cancellation(&t)
        .await
        .expect_err("IgnoreCleanup passed `cancellation`");
    assert_eq!(failure.check, "cancellation", "{failure}");
    assert!(failure.message.contains("still held"), "{failure}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrapper_without_a_fault_passes_every_check() {
    // The control: the failures above come from the faults, not from the wrapper.
    conformance::run_all(&target(Fault::None)).await.unwrap();
}
