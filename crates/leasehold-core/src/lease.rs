//! Leases: the guard of a held lock, and its renewal watchdog.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::LockBackendExt as _;
use crate::backend::{ExtendRequest, Grant, GrantState, Held, LockBackend};
use crate::error::Error;
use crate::key::LockKey;
use crate::loss::LossReason;
use crate::metrics;
use crate::policy::{Renewal, check_ttl};
use crate::release::{
    Horizon, RELEASE_BUDGET, gated_release, release_in_background, retry_release,
};
use crate::renewal::{Renewable, Renewer, Ticket};
use crate::signal::{self, LostSignal, Shared};
use crate::token::{FencingToken, Owner};

/// A cloneable description of a held lease, for handing to code that must not own the guard:
/// a request handler that sends the fencing token to storage, a task that watches for loss.
#[derive(Debug, Clone)]
pub struct LeaseInfo {
    /// The locked key.
    pub key: LockKey,
    /// Our owner value.
    pub owner: Owner,
    /// The fencing token, for backends that mint one.
    pub fencing: Option<FencingToken>,
    /// The backend's name.
    pub backend: &'static str,
    /// Completes when the lease is lost.
    pub lost: LostSignal,
}

/// The fields a renewal reads come first, in declaration order (`repr(C)`), next to the
/// reference counts the renewal engine touches as it takes the lease into a batch: a batch
/// walks thousands of leases in no particular order, and each cache line of a lease it touches
/// is a miss.
#[repr(C)]
struct Inner {
    /// The TTL of the last grant or `extend`, in nanoseconds: an atomic, not a mutex, as it is
    /// kept by every lease (a fleet's thousands) and read by every renewal.
    ttl: AtomicU64,
    /// The latest instant a renewal request of the grant may still re-arm its TTL (the end, or
    /// the bound, of the last batch or `extend` sent for it), as a status-word code (0: none):
    /// an atomic, as every renewal sets it.
    renewing_until: AtomicU64,
    key: LockKey,
    owner: Owner,
    fencing: Option<FencingToken>,
    state: Option<GrantState>,
    /// Its [`capabilities`](LockBackend::capabilities) are asked again when needed (a
    /// release's horizon, an `extend`'s TTL check) rather than copied into every lease.
    backend: Arc<dyn LockBackend>,
    shared: Arc<Shared>,
    released: AtomicBool,
    /// The lease's place in the renewal engine's queue, while it renews.
    watchdog: Mutex<Option<Ticket>>,
}

impl Inner {
    fn held(&self) -> Held<'_> {
        Held::new(
            &self.key,
            &self.owner,
            self.fencing,
            self.state.as_deref().map(|s| s as _),
        )
    }

    fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl.load(Ordering::Acquire))
    }

    fn set_ttl(&self, ttl: Duration) {
        self.ttl.store(nanos(ttl), Ordering::Release);
    }

    /// How long a background release of this grant may go on, the grant last re-armed by a
    /// request sent no later than `armed`, or by a renewal still under way then: the horizon
    /// counts from the last request that could have armed the TTL.
    fn horizon(&self, armed: Instant) -> Horizon {
        let renewing = signal::decode(self.renewing_until.load(Ordering::Acquire));
        let armed = renewing.map_or(armed, |r| r.max(armed));
        Horizon::of(
            &self.backend.capabilities(),
            armed,
            self.ttl(),
            self.shared.drift(),
        )
    }

    /// A renewal request may re-arm the grant until `until`.
    fn note_renewal(&self, until: Instant) {
        self.renewing_until
            .fetch_max(signal::encode(until), Ordering::AcqRel);
    }

    fn stop_watchdog(&self) {
        let ticket = self
            .watchdog
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // Dropped outside the lock: leaving the engine's queue takes the engine's lock.
        drop(ticket);
    }
}

/// `ttl` in whole nanoseconds, as [`Inner`] keeps it (saturating past 584 years).
fn nanos(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX)
}

impl Renewable for Inner {
    fn held(&self) -> Held<'_> {
        Inner::held(self)
    }

    fn ttl(&self) -> Duration {
        Inner::ttl(self)
    }

    fn status(&self) -> &Shared {
        &self.shared
    }

    fn key(&self) -> &LockKey {
        &self.key
    }

    fn renewing(&self, until: Instant) {
        self.note_renewal(until);
    }

    fn release_again(self: Arc<Self>) {
        let horizon = self.horizon(Instant::now());
        background_release(self, horizon, false);
    }
}

/// A held lock: the guard returned by [`Locker`](crate::Locker).
///
/// It carries the key, our owner value, the fencing token (for backends that mint one) and a
/// validity deadline on the monotonic clock, counted from the instant *before* the request was
/// sent, minus the drift margin. Past that deadline the lease must be treated as lost even if
/// nobody said so: use [`lost`](Self::lost) (a future to `select!` on), [`is_lost`](Self::is_lost)
/// (a cheap check) or [`run`](Self::run) (cancels work when the lease is lost).
///
/// # Cancellation and drop
///
/// - [`release`](Self::release) is the way to let go: it tells you whether you still held the
///   lock. If its future is dropped before it finishes, the lease counts as not released and the
///   drop below still happens.
/// - Dropping a `Lease` without releasing it starts a **background release** on the current
///   Tokio runtime and returns at once: it never blocks and never panics. Release on drop is
///   therefore *not immediate*: another client may find the lock held for one more round trip.
///   Transient faults are retried (jittered backoff, up to 5 s apart) until the backend
///   answers: on a TTL backend (Redis, Redlock) until the TTL has passed, since the grant is
///   gone by then; on a session backend (etcd, PostgreSQL) as long as the session that carries
///   the grant lives. Only a fault that retrying cannot fix ends it earlier (the grant then
///   ends by TTL or session). [`settle`](crate::settle) waits for these releases. With no
///   runtime left (the runtime is shutting down, or the lease is dropped outside one), nothing
///   can be sent; the grant then ends by TTL, session end or lease expiry, as the backend's
///   liveness rule says.
/// - The renewal watchdog stops when the lease is released or dropped.
pub struct Lease {
    inner: Arc<Inner>,
}

impl Lease {
    /// The lease of `grant`, taken by `owner` on `key` through `backend` for `ttl`.
    pub(crate) fn new(
        key: LockKey,
        owner: Owner,
        grant: Grant,
        backend: Arc<dyn LockBackend>,
        shared: Arc<Shared>,
        ttl: Duration,
    ) -> Self {
        shared.start(grant.validity);
        metrics::held(backend.name(), 1.0);
        Self {
            inner: Arc::new(Inner {
                ttl: AtomicU64::new(nanos(ttl)),
                renewing_until: AtomicU64::new(0),
                key,
                owner,
                fencing: grant.fencing,
                state: grant.state,
                backend,
                shared,
                released: AtomicBool::new(false),
                watchdog: Mutex::new(None),
            }),
        }
    }

    /// Queues the lease in the locker's renewal engine: renewed as `policy` says (every
    /// `interval` now, in batches with the locker's other leases) until released, dropped or
    /// lost.
    pub(crate) fn start_watchdog(&self, renewer: &Renewer, policy: Renewal, interval: Duration) {
        let lease: Weak<dyn Renewable> = Arc::downgrade(&self.inner) as Weak<Inner>;
        let Some(ticket) = renewer.register(lease, &self.inner.shared, interval, policy) else {
            tracing::warn!(key = %self.inner.key, "no Tokio runtime: lease renewal is off");
            return;
        };
        *self
            .inner
            .watchdog
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(ticket);
    }

    /// The locked key.
    pub fn key(&self) -> &LockKey {
        &self.inner.key
    }

    /// Our owner value for this acquisition.
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// The fencing token: send it with every write and have the resource reject lower ones.
    /// `None` for backends that mint none ([`FencingKind::None`](crate::FencingKind::None)).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.inner.fencing
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// The validity deadline on the monotonic clock: act as the holder only before it.
    pub fn valid_until(&self) -> Instant {
        self.inner.shared.valid_until().unwrap_or_else(Instant::now)
    }

    /// Time left before the validity deadline (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether the lease is lost now: cheap, no I/O.
    pub fn is_lost(&self) -> bool {
        self.loss_reason().is_some()
    }

    /// Why the lease is lost, if it is.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.inner.shared.loss()
    }

    /// A future that completes when the lease is lost (see [`LostSignal`]).
    pub fn lost(&self) -> LostSignal {
        self.inner.shared.signal()
    }

    /// A cloneable description of this lease.
    pub fn info(&self) -> LeaseInfo {
        LeaseInfo {
            key: self.inner.key.clone(),
            owner: self.inner.owner.clone(),
            fencing: self.inner.fencing,
            backend: self.backend_name(),
            lost: self.lost(),
        }
    }

    /// Runs `work` under the lease: if the lease is lost first, `work` is dropped (cancelled)
    /// and the result is an [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) error that
    /// says why.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        let lost = self.lost();
        tokio::select! {
            biased;
            reason = lost.wait() => Err(self.lost_error(reason)),
            out = work => Ok(out),
        }
    }

    /// An `extend` to `ttl` succeeded: the watchdog (if one runs) renews by the new TTL from
    /// now on (`ttl / 3` with [`Renewal::Auto`]), so a shorter TTL is not left on the old,
    /// longer interval to expire between two renewals.
    fn rearm_watchdog(&self, ttl: Duration) {
        let watchdog = self
            .inner
            .watchdog
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(ticket) = watchdog.as_ref()
            && let Some(interval) = ticket.policy.interval_for(ttl, self.inner.shared.drift())
        {
            ticket.rearm(interval);
        }
    }

    /// Re-arms the lease for `ttl` if we still hold it, moving the validity deadline to
    /// `now + ttl − drift`; the renewal watchdog then renews by the new TTL. If the backend says we no longer hold it, the lost signal fires and
    /// the error is [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost). A fault (the backend
    /// unreachable) is returned as is: the lease stays valid until its current deadline.
    pub async fn extend(&self, ttl: Duration) -> Result<(), Error> {
        check_ttl(
            ttl,
            self.inner.shared.drift(),
            &self.inner.backend.capabilities(),
        )?;
        if let Some(reason) = self.loss_reason() {
            return Err(self.lost_error(reason));
        }
        let span = tracing::debug_span!("leasehold.extend", backend = self.backend_name(), key = %self.inner.key);
        async {
            let started = Instant::now();
            // Until it answers (or is dropped unanswered), this request may re-arm the grant.
            let _sent = ExtendSent(&self.inner);
            let outcome = self
                .inner
                .backend
                .extend(ExtendRequest::new(self.inner.held(), ttl, started))
                .await;
            let result = match outcome {
                Ok(Some(v)) => match self.inner.shared.renew(v) {
                    Ok(()) => {
                        self.inner.set_ttl(ttl);
                        self.rearm_watchdog(ttl);
                        Ok(())
                    }
                    Err(reason) => Err(self.lost_error(reason)),
                },
                Ok(None) => {
                    self.inner.shared.lose(LossReason::NotHeld);
                    Err(self.lost_error(LossReason::NotHeld))
                }
                Err(e) => {
                    metrics::renewal_failed(self.backend_name());
                    Err(e)
                }
            };
            tracing::debug!(
                outcome = if result.is_ok() { "extended" } else { "failed" },
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "leasehold.extend"
            );
            result
        }
        .instrument(span)
        .await
    }

    /// Stops the renewal watchdog, if one runs: the lease then lasts until its current deadline.
    pub fn stop_renewal(&self) {
        self.inner.stop_watchdog();
    }

    /// Releases the lock: `Ok(true)` if we still held it, `Ok(false)` if it was already gone
    /// (expired, taken over, released before). Idempotent: after a release that answered,
    /// further calls return `Ok(false)` without contacting the backend.
    ///
    /// A transient fault (a server answering "too many requests", "busy" or "loading", a
    /// timeout, a dropped connection) is retried with capped, jittered backoff for up to
    /// [`RELEASE_BUDGET`](crate::RELEASE_BUDGET) (5 s), so one call succeeds through a burst.
    /// An attempt that timed out may still have released the lock on the server; the retry
    /// then finds it gone and the call answers `Ok(false)`: `false` means "not confirmed as
    /// ours at release", never "still held". On `Err`:
    ///
    /// - [`Error::is_retryable`] (the fault outlasted the budget): the lease is let go all the
    ///   same (its lost signal says [`Released`](LossReason::Released), further calls return
    ///   `Ok(false)`), and the release goes on in the background until the backend confirms it
    ///   or the grant is gone by itself: on a TTL backend until its TTL has passed, on a
    ///   session backend as long as the session that carries the grant lives. Do not act as
    ///   the holder any more.
    /// - otherwise (a fault that retrying cannot fix, sent at once, never retried): the lease
    ///   is still considered held; call again, or drop it to release in the background.
    pub async fn release(&self) -> Result<bool, Error> {
        if self.inner.released.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.inner.stop_watchdog();
        let name = self.backend_name();
        let span = tracing::debug_span!("leasehold.release", backend = name, key = %self.inner.key);
        async {
            // No renewal is sent after this instant (the watchdog is stopped); one already under
            // way moves the horizon on by itself (`renewing_until`).
            let armed = Instant::now();
            let inner = &*self.inner;
            let result = retry_release(name, RELEASE_BUDGET, || {
                gated_release(&*inner.backend, inner.held())
            })
            .await;
            match &result {
                Ok(_) => {
                    self.let_go();
                }
                Err(e) if e.is_retryable() && self.let_go() => {
                    let inner = Arc::clone(&self.inner);
                    let horizon = inner.horizon(armed);
                    background_release(inner, horizon, true);
                }
                Err(_) => {}
            }
            tracing::debug!(
                outcome = match &result {
                    Ok(true) => "released",
                    Ok(false) => "not held",
                    Err(e) if e.is_retryable() => "continued in the background",
                    Err(_) => "failed",
                },
                elapsed_ms = armed.elapsed().as_secs_f64() * 1e3,
                "leasehold.release"
            );
            result
        }
        .instrument(span)
        .await
    }

    /// Marks the lease released (once): `true` for the call that did.
    fn let_go(&self) -> bool {
        if self.inner.released.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.inner.shared.lose(LossReason::Released);
        metrics::held(self.backend_name(), -1.0);
        true
    }

    fn lost_error(&self, reason: LossReason) -> Error {
        Error::lease_lost(self.backend_name(), &self.inner.key, reason)
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.inner.key)
            .field("backend", &self.backend_name())
            .field("owner", &self.inner.owner)
            .field("fencing", &self.inner.fencing)
            .field("remaining", &self.remaining())
            .field("lost", &self.loss_reason())
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.let_go() {
            return;
        }
        self.inner.stop_watchdog();
        let inner = Arc::clone(&self.inner);
        let horizon = inner.horizon(Instant::now());
        if !background_release(inner, horizon, false) {
            tracing::warn!(
                key = %self.inner.key,
                "lease dropped outside a Tokio runtime; the grant ends by its TTL or session"
            );
        }
    }
}

/// An `extend` request under way: when it ends (answered, failed or dropped unanswered), the
/// grant may have been re-armed until then.
struct ExtendSent<'a>(&'a Inner);

impl Drop for ExtendSent<'_> {
    fn drop(&mut self) {
        self.0.note_renewal(Instant::now());
    }
}

/// Releases `inner`'s grant in the background, retrying transient faults until `horizon`.
fn background_release(inner: Arc<Inner>, horizon: Horizon, handed_over: bool) -> bool {
    let name = inner.backend.name();
    let key = inner.key.clone();
    let spawned = release_in_background(name, horizon, handed_over, move || {
        let inner = Arc::clone(&inner);
        async move { gated_release(&*inner.backend, inner.held()).await }
    });
    if spawned {
        tracing::debug!(key = %key, backend = name, "leasehold.release: in the background");
    }
    spawned
}

#[cfg(test)]
mod tests {
    use tokio::task::JoinHandle;

    use super::*;
    use crate::signal::LeaseMonitor;
    use crate::validity::Validity;
    use crate::{Locker, MemoryBackend};

    /// Status changes wake nobody while no lost signal exists; a signal taken before or after
    /// a change still sees it.
    #[tokio::test]
    async fn lost_signals_see_changes_made_while_nobody_watched() {
        let locker = Locker::new(MemoryBackend::new());
        let wait = Duration::from_secs(1);

        // Released with no signal out: a signal taken afterwards reports it at once.
        let lease = locker.acquire("a", wait).await.unwrap();
        assert!(lease.valid_until() > Instant::now(), "the deadline was set");
        assert!(lease.release().await.unwrap());
        let late = lease.lost();
        assert_eq!(late.reason(), Some(LossReason::Released));
        let reason = tokio::time::timeout(wait, late.wait()).await;
        assert_eq!(reason.unwrap(), LossReason::Released);

        // A signal taken first is woken by the release.
        let lease = locker.acquire("b", wait).await.unwrap();
        let early = lease.lost();
        assert!(!early.is_lost());
        let waiter = tokio::spawn(early.wait());
        tokio::task::yield_now().await;
        assert!(lease.release().await.unwrap());
        let reason = tokio::time::timeout(wait, waiter).await.unwrap().unwrap();
        assert_eq!(reason, LossReason::Released);

        // Dropped instead of released: the signal handed out with the info sees it.
        let lease = locker.acquire("c", wait).await.unwrap();
        let info = lease.info();
        drop(lease);
        assert_eq!(info.lost.reason(), Some(LossReason::Released));
    }

    /// A lease of 1 s without renewal (for paused-clock tests), the monitor a backend would
    /// hold on it, and a task already waiting on its lost signal.
    async fn watched_lease() -> (Lease, LeaseMonitor, JoinHandle<LossReason>) {
        let locker = Locker::new(MemoryBackend::new())
            .with_options(
                crate::LockOptions::default()
                    .with_ttl(Duration::from_secs(1))
                    .with_renewal(crate::Renewal::Off),
            )
            .unwrap();
        let lease = locker.try_acquire("k").await.unwrap().unwrap();
        let monitor = LeaseMonitor::new(&lease.inner.shared);
        let waiter = tokio::spawn(lease.lost().wait());
        tokio::task::yield_now().await;
        (lease, monitor, waiter)
    }

    /// A signal outlives its lease: a waiter taken before the drop wakes with `Released`, the
    /// signal keeps saying so, and the monitor (which now finds the status still alive, kept
    /// by the signal) reports the lease closed and released.
    #[tokio::test(start_paused = true)]
    async fn a_signal_outliving_its_dropped_lease_reports_released() {
        let (lease, monitor, waiter) = watched_lease().await;
        let signal = lease.lost();
        assert!(!waiter.is_finished());
        assert!(!monitor.is_closed());

        let t0 = Instant::now();
        drop(lease);
        assert_eq!(waiter.await.unwrap(), LossReason::Released);
        assert_eq!(Instant::now(), t0, "woken by the drop, not by the deadline");
        assert_eq!(signal.reason(), Some(LossReason::Released));
        assert!(monitor.is_closed());
        assert_eq!(monitor.loss_reason(), Some(LossReason::Released));
        assert!(!monitor.renewed(Validity::new(Instant::now(), Duration::from_secs(9))));
        // Long after the deadline the reason is still the first one, not an expiry.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(signal.clone().wait().await, LossReason::Released);

        // With the signal gone too, the monitor still says released.
        drop(signal);
        assert!(monitor.is_closed());
        assert_eq!(monitor.loss_reason(), Some(LossReason::Released));
    }

    /// A waiting signal follows renewals: it does not fire at the deadline a renewal moved, it
    /// fires at the new one, with `Expired`; a renewal arriving after that is refused.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_signal_follows_renewals_to_the_new_deadline() {
        let (lease, monitor, waiter) = watched_lease().await;
        let first = lease.valid_until();

        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(monitor.renewed(Validity::new(Instant::now(), Duration::from_secs(1))));
        let second = lease.valid_until();
        assert!(second > first, "the renewal moved the deadline");

        // Past the first deadline, before the second: still held, the waiter still waits.
        tokio::time::sleep_until(first + Duration::from_millis(10)).await;
        assert!(!lease.is_lost());
        assert!(
            !waiter.is_finished(),
            "the signal fired at the old deadline"
        );

        // Past the second: lost by expiry, and the waiter wakes with it.
        tokio::time::sleep_until(second).await;
        let reason = tokio::time::timeout(Duration::from_millis(10), waiter).await;
        assert_eq!(reason.unwrap().unwrap(), LossReason::Expired);
        assert_eq!(lease.loss_reason(), Some(LossReason::Expired));

        // A late renewal does not revive it, and loss is final through release and drop.
        assert!(!monitor.renewed(Validity::new(Instant::now(), Duration::from_secs(1))));
        assert!(
            !lease.release().await.unwrap(),
            "the grant had expired on the server"
        );
        let signal = lease.lost();
        drop(lease);
        assert_eq!(signal.reason(), Some(LossReason::Expired));
        assert_eq!(signal.clone().wait().await, LossReason::Expired);
        assert_eq!(monitor.loss_reason(), Some(LossReason::Expired));
        assert!(monitor.is_closed());
        // Once the last trace of the lease is gone, the monitor says it was let go.
        drop(signal);
        assert_eq!(monitor.loss_reason(), Some(LossReason::Released));
    }

    /// A loss the backend reports wakes every waiting signal, on other tasks too, and a signal
    /// taken afterwards sees it at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reported_loss_wakes_every_waiting_signal() {
        let locker = Locker::new(MemoryBackend::new());
        let lease = locker.try_acquire("k").await.unwrap().unwrap();
        let monitor = LeaseMonitor::new(&lease.inner.shared);
        let waiters: Vec<_> = (0..8).map(|_| tokio::spawn(lease.lost().wait())).collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()));

        monitor.lost("session died");
        let gone = LossReason::Backend(Arc::from("session died"));
        for w in waiters {
            let reason = tokio::time::timeout(Duration::from_secs(5), w).await;
            assert_eq!(reason.unwrap().unwrap(), gone);
        }
        assert_eq!(lease.lost().reason(), Some(gone.clone()));
        assert!(monitor.is_closed());
        // Release after the loss still reaches the backend, and the reason stays.
        assert!(lease.release().await.unwrap());
        assert_eq!(lease.loss_reason(), Some(gone));
    }
}
