//! Checks 5–6: the validity deadline, and renewal by the watchdog.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{
    Capabilities, Error, ExtendRequest, Grant, Held, HolderInfo, Lease, LockBackend, LockKey,
    LockRequest, RenewalKind, Validity, Waited, async_trait,
};
use tokio::time::Instant;

use super::target::{Failure, Target, op, unique_key};

/// 5. The validity deadline is never later than send instant + ttl − drift, on acquisition and
///    after extend, even when the answer is slow to arrive.
pub async fn validity_deadline(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "validity_deadline";
    let key = unique_key(CHECK)?;
    let sent_at = Arc::new(Mutex::new(None));
    let slow: Arc<dyn LockBackend> = Arc::new(SlowAnswers {
        inner: Arc::clone(&t.primary),
        sent_at: Arc::clone(&sent_at),
    });
    let ttl = t.long_ttl();
    let locker = t.locker(&slow, ttl, leasehold_core::Renewal::Off)?;
    let margin = locker.options().drift.margin(ttl);
    // The deadline after the last request (`when` names it) is at most send + ttl − drift.
    let deadline_from_send = |lease: &Lease, when: &str| {
        let sent = sent_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| Failure::new(CHECK, "no request was recorded"))?;
        ensure!(
            CHECK,
            lease.valid_until() <= sent + ttl - margin,
            "deadline {when} is {:?} past the send instant, more than ttl − drift ({:?}): \
             counted from the answer, not the request?",
            lease.valid_until() - sent,
            ttl - margin
        );
        Ok(())
    };

    let lease = op(CHECK, "try_acquire", locker.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    deadline_from_send(&lease, "on acquisition")?;
    ensure!(CHECK, !lease.is_lost(), "a fresh lease is already lost");

    op(CHECK, "extend", lease.extend(ttl).await)?;
    deadline_from_send(&lease, "after extend")?;
    op(CHECK, "release", lease.release().await)?;
    Ok(())
}

/// Forwards to a backend, recording when each request was sent and delaying each answer, so a
/// deadline counted from the answer instead of the request shows.
#[derive(Debug)]
struct SlowAnswers {
    inner: Arc<dyn LockBackend>,
    sent_at: Arc<Mutex<Option<Instant>>>,
}

impl SlowAnswers {
    const DELAY: Duration = Duration::from_millis(150);

    fn record(&self) {
        *self.sent_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

#[async_trait]
impl LockBackend for SlowAnswers {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().without_primitives()
    }
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.record();
        let r = self.inner.try_lock(req).await;
        tokio::time::sleep(Self::DELAY).await;
        r
    }
    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        self.record();
        let r = self.inner.wait_lock(req, deadline).await;
        tokio::time::sleep(Self::DELAY).await;
        r
    }
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        self.inner.release(held).await
    }
    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        self.record();
        let r = self.inner.extend(req).await;
        tokio::time::sleep(Self::DELAY).await;
        r
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

/// 6. The watchdog keeps a lease alive across 5× its TTL while another client keeps trying; when
///    renewal stops, the lease's deadline passes (and its lost signal fires) before the other
///    client can acquire. Session-renewed backends must simply keep the lease for 5× the TTL.
pub async fn watchdog(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "watchdog";
    let key = unique_key(CHECK)?;
    // At least 1 s: a renewed lease survives a stall of the loaded test machine shorter than
    // about two thirds of its TTL, and 300 ms TTLs made that a 200 ms stall. A renewal that
    // never happens still loses the lease within one TTL.
    let ttl = t.short_ttl.max(Duration::from_secs(1));
    let l1 = t.locker(&t.primary, ttl, leasehold_core::Renewal::Auto)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Off)?;
    let a = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    let end = Instant::now() + ttl * 5;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 2).await;
        let other = op(CHECK, "try_acquire (other)", l2.try_acquire(&key).await)?;
        ensure!(
            CHECK,
            other.is_none(),
            "another client acquired a renewed lease"
        );
        ensure!(
            CHECK,
            !a.is_lost(),
            "a renewed lease was lost: {:?}",
            a.loss_reason()
        );
    }
    if t.caps().renewal != RenewalKind::Extend {
        ensure!(
            CHECK,
            op(CHECK, "release", a.release().await)?,
            "lease not held at the end"
        );
        return Ok(());
    }
    a.stop_renewal();
    let give_up = Instant::now() + ttl * 10 + Duration::from_secs(5);
    let (b, got_at) = loop {
        if let Some(b) = op(CHECK, "try_acquire (other)", l2.try_acquire(&key).await)? {
            break (b, Instant::now());
        }
        ensure!(
            CHECK,
            Instant::now() < give_up,
            "the unrenewed lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    ensure!(
        CHECK,
        a.valid_until() <= got_at && a.is_lost(),
        "another client acquired {:?} before our deadline",
        a.valid_until().saturating_duration_since(got_at)
    );
    let fired = tokio::time::timeout(Duration::from_millis(100), a.lost().wait()).await;
    ensure!(CHECK, fired.is_ok(), "the lost signal did not complete");
    op(CHECK, "release", b.release().await)?;
    Ok(())
}
