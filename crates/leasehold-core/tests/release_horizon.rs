//! How long a background release goes on: until the TTL last armed has passed, counted from
//! the last request that could have armed it. A renewal batch still under way when the lease
//! is let go, and a waiting acquisition whose last attempt may have granted, both move that
//! instant later than the release or the acquisition's start.
//!
//! Alone in its own test binary: `settle` counts background releases process-wide (the two
//! tests take turns through `SERIAL`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use leasehold_core::{
    Capabilities, Error, ErrorKind, ExtendRequest, Grant, Held, HolderInfo, LockBackend, LockKey,
    LockOptions, LockRequest, Locker, MemoryBackend, Renewal, Validity, WaitKind, Waited,
    async_trait, settle,
};
use tokio::time::Instant;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TTL: Duration = Duration::from_secs(30);
const INTERVAL: Duration = Duration::from_secs(10);
/// The longest pause between two background attempts: a background release stops at most
/// this long before its horizon.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// The memory backend whose renewals and native waits never answer, and whose releases
/// always meet a transient fault: a background release goes on until its horizon.
#[derive(Debug, Clone, Default)]
struct Unanswered {
    inner: MemoryBackend,
}

fn refused() -> Error {
    Error::new(ErrorKind::Unavailable, "unanswered", "too many requests")
}

#[async_trait]
impl LockBackend for Unanswered {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> Capabilities {
        self.inner
            .capabilities()
            .with_name("unanswered")
            .with_wait(WaitKind::Native)
            .without_primitives()
    }
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.inner.try_lock(req).await
    }
    async fn wait_lock(&self, _: LockRequest<'_>, _: Instant) -> Result<Waited, Error> {
        std::future::pending().await
    }
    async fn release(&self, _: Held<'_>) -> Result<bool, Error> {
        Err(refused())
    }
    async fn extend(&self, _: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        std::future::pending().await
    }
    async fn extend_many(&self, _: &[ExtendRequest<'_>]) -> Vec<leasehold_core::Extended> {
        std::future::pending().await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inner.inspect(key).await
    }
}

fn locker() -> Locker {
    let options = LockOptions::default()
        .with_ttl(TTL)
        .with_renewal(Renewal::Every(INTERVAL));
    Locker::new(Unanswered::default())
        .with_options(options)
        .unwrap()
}

/// A lease dropped while its renewal batch (sent at 10 s, bounded to 10 s) is unanswered:
/// the batch may re-arm the TTL until 20 s, so the background release goes on until about
/// 20 s + TTL, not 10.5 s + TTL.
#[tokio::test(start_paused = true)]
async fn a_release_during_a_renewal_counts_from_the_end_of_the_batch() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let lease = locker().try_acquire("k").await.unwrap().expect("free");
    tokio::time::sleep(INTERVAL + Duration::from_millis(500)).await;
    drop(lease);
    assert!(settle(Duration::from_secs(3600)).await);
    let batch_end = 2 * INTERVAL;
    assert!(
        t0.elapsed() + MAX_PAUSE >= batch_end + TTL,
        "the background release stopped at {:?}, before the TTL the renewal under way may \
         have armed (until {:?}) could pass",
        t0.elapsed(),
        batch_end + TTL
    );
}

/// A waiting acquisition cut short after 20 s: its last attempt may have granted just
/// before, so the clean-up goes on until about 20 s + TTL, not 0 s + TTL.
#[tokio::test(start_paused = true)]
async fn a_waiting_acquisition_cleans_up_from_its_last_attempt() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let cut = Duration::from_secs(20);
    let locker = locker();
    let waiting = locker.acquire("k", Duration::from_secs(60));
    assert!(tokio::time::timeout(cut, waiting).await.is_err());
    assert!(settle(Duration::from_secs(3600)).await);
    assert!(
        t0.elapsed() + MAX_PAUSE >= cut + TTL,
        "the clean-up stopped at {:?}, before a grant of the last attempt could expire ({:?})",
        t0.elapsed(),
        cut + TTL
    );
}
