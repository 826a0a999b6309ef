//! The shared status of one lease: its validity deadline and loss, seen by the lease, its
//! [`LostSignal`]s (the holder's side) and its [`LeaseMonitor`] (the backend's side).

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::loss::LossReason;
use crate::policy::Drift;
use crate::validity::Validity;

#[derive(Debug)]
struct Status {
    /// `None` until the grant is known.
    valid_until: Option<Instant>,
    lost: Option<LossReason>,
}

impl Status {
    fn loss(&self, now: Instant) -> Option<LossReason> {
        if let Some(r) = &self.lost {
            return Some(r.clone());
        }
        match self.valid_until {
            Some(t) if now >= t => Some(LossReason::Expired),
            _ => None,
        }
    }

    /// [`loss`](Self::loss) now, reading the clock only when the answer depends on it. Called
    /// under the lock, so a concurrent renewal is seen either with its new deadline or not at
    /// all.
    fn loss_now(&self) -> Option<LossReason> {
        match (&self.lost, self.valid_until) {
            (Some(r), _) => Some(r.clone()),
            (None, Some(t)) if Instant::now() >= t => Some(LossReason::Expired),
            (None, _) => None,
        }
    }
}

/// The status of one lease, shared by the lease, its lost signals and its monitor.
///
/// The lost signals hold it strongly, so it can outlive the lease: a dropped lease is known
/// here by the [`LossReason::Released`] its drop records, not by its absence. The monitor holds
/// it weakly.
#[derive(Debug)]
pub(crate) struct Shared {
    status: Mutex<Status>,
    /// Wakes the waiting lost signals after a change of `status`.
    changed: Notify,
    /// Whether a [`LostSignal`] was ever handed out. Until then a change wakes nobody: most
    /// leases never hand one out, and waking costs as much as the rest of the bookkeeping.
    watched: AtomicBool,
    drift: Drift,
    /// The backend's name, for the metrics' `backend` label.
    #[cfg(feature = "metrics")]
    backend: &'static str,
}

impl Shared {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(drift: Drift, backend: &'static str) -> Arc<Self> {
        Arc::new(Self {
            status: Mutex::new(Status {
                valid_until: None,
                lost: None,
            }),
            changed: Notify::new(),
            watched: AtomicBool::new(false),
            drift,
            #[cfg(feature = "metrics")]
            backend,
        })
    }

    /// Sets the first deadline, from the grant's validity.
    pub(crate) fn start(&self, v: Validity) {
        self.lock().valid_until = Some(self.drift.deadline(v));
        // Wakes nobody yet (signals come from the lease); kept so the rule has no exception.
        self.wake();
    }

    /// The drift margin this lease's deadlines are computed with.
    pub(crate) fn drift(&self) -> &Drift {
        &self.drift
    }

    /// A lost signal on this status. From now on every change wakes signals.
    pub(crate) fn signal(self: &Arc<Self>) -> LostSignal {
        // Set before the signal can read the status.
        self.watched.store(true, Ordering::Relaxed);
        LostSignal {
            shared: Arc::clone(self),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Status> {
        // Nothing panics while holding it; recover the status if something ever did.
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the waiting lost signals after a change of the status, if a signal was ever handed
    /// out. Called after the change, outside the lock. A signal reads the status under the lock
    /// only after [`Shared::signal`] set `watched` and after it registered for a wake-up, so either
    /// it read the changed status, or its read came first under the lock and this load sees
    /// `watched` set: no wake-up is lost.
    fn wake(&self) {
        if self.watched.load(Ordering::Relaxed) {
            self.changed.notify_waiters();
        }
    }

    /// Why the lease is over, if it is.
    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.lock().loss_now()
    }

    /// The loss as of `now` (an instant the caller read once for many leases), and the
    /// validity deadline, under one lock: what the renewal engine reads of each lease it takes
    /// into a batch.
    pub(crate) fn loss_at(&self, now: Instant) -> (Option<LossReason>, Option<Instant>) {
        let s = self.lock();
        (s.loss(now), s.valid_until)
    }

    /// The loss, if any, and the validity deadline: what a waiting signal needs.
    fn loss_and_deadline(&self) -> (Option<LossReason>, Option<Instant>) {
        let s = self.lock();
        (s.loss_now(), s.valid_until)
    }

    pub(crate) fn valid_until(&self) -> Option<Instant> {
        self.lock().valid_until
    }

    /// Counts a loss in the metrics (`lost` is the first terminal state of the lease).
    #[cfg(feature = "metrics")]
    fn count_loss(&self, lost: &LossReason) {
        crate::metrics::lost(self.backend, lost);
    }

    /// Moves the deadline to match `v`, unless the lease is already lost (loss is final, and a
    /// deadline that has passed is a loss even if a late renewal arrives).
    pub(crate) fn renew(&self, v: Validity) -> Result<(), LossReason> {
        let deadline = self.drift.deadline(v);
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(r) = s.loss(now) {
            if s.lost.is_some() {
                return Err(r);
            }
            #[cfg(feature = "metrics")]
            self.count_loss(&r);
            s.lost = Some(r.clone());
            drop(s);
            self.wake();
            return Err(r);
        }
        s.valid_until = Some(deadline);
        drop(s);
        self.wake();
        Ok(())
    }

    pub(crate) fn lose(&self, reason: LossReason) {
        let mut s = self.lock();
        if s.lost.is_some() {
            return;
        }
        // A release after the deadline passed unnoticed is still a loss, by expiry.
        #[cfg(feature = "metrics")]
        match s.loss(Instant::now()) {
            Some(expired) if reason == LossReason::Released => self.count_loss(&expired),
            _ => self.count_loss(&reason),
        }
        s.lost = Some(reason);
        drop(s);
        self.wake();
    }
}

/// The backend's side of a lease: where a backend that watches its grants reports renewed
/// validity or loss.
///
/// A session-based backend (PostgreSQL's health check, etcd's keep-alive stream) keeps a clone
/// for each grant and calls [`renewed`](Self::renewed) after each successful check and
/// [`lost`](Self::lost) when the grant is gone; the lease's [lost signal](crate::Lease::lost) then
/// fires. It holds the lease weakly: once the lease is dropped, calls do nothing and
/// [`is_closed`](Self::is_closed) turns true, so the backend can stop watching.
#[derive(Debug, Clone)]
pub struct LeaseMonitor {
    shared: Weak<Shared>,
}

impl LeaseMonitor {
    pub(crate) fn new(shared: &Arc<Shared>) -> Self {
        Self {
            shared: Arc::downgrade(shared),
        }
    }

    /// A monitor attached to no lease, for calling a backend directly in tests.
    pub fn detached() -> Self {
        Self {
            shared: Weak::new(),
        }
    }

    /// The grant was confirmed alive; its validity is now `v`. Returns `false` if the lease is
    /// gone or already lost (a passed deadline is final), so the backend can stop watching.
    pub fn renewed(&self, v: Validity) -> bool {
        self.shared.upgrade().is_some_and(|s| s.renew(v).is_ok())
    }

    /// The grant is gone; fires the lease's lost signal with `reason`.
    pub fn lost(&self, reason: impl Into<Arc<str>>) {
        if let Some(s) = self.shared.upgrade() {
            s.lose(LossReason::Backend(reason.into()));
        }
    }

    /// Why the lease is over, if it is: [`LossReason::Released`] once it was released or
    /// dropped (also after the last trace of it is gone), [`LossReason::Expired`] once its
    /// deadline passed unrenewed, and so on. A backend that watches a grant can tell "the holder
    /// let go" (clean up quietly) from "the grant was lost" (it already said so).
    pub fn loss_reason(&self) -> Option<LossReason> {
        match self.shared.upgrade() {
            Some(s) => s.loss(),
            None => Some(LossReason::Released),
        }
    }

    /// Whether the lease has been dropped or lost, so there is nothing left to watch.
    pub fn is_closed(&self) -> bool {
        self.shared.upgrade().is_none_or(|s| s.loss().is_some())
    }
}

/// A future that completes when a lease is lost, with the reason; cheap to clone.
///
/// It completes when renewal fails, when the backend reports the loss, when the validity
/// deadline passes unrenewed, or when the lease is released or dropped
/// ([`LossReason::Released`]) — whichever comes first. It is `'static`, so it can be moved into
/// a task or a response future and used with `tokio::select!`.
///
/// The first loss is final: a signal that outlives its lease keeps reporting the reason the
/// lease ended with ([`LossReason::Released`] for a lease released or dropped while still
/// valid).
#[derive(Debug, Clone)]
pub struct LostSignal {
    shared: Arc<Shared>,
}

impl LostSignal {
    /// Whether the lease is lost now (cheap: no I/O, no await).
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Why the lease is lost, if it is.
    pub fn reason(&self) -> Option<LossReason> {
        self.shared.loss()
    }

    /// Waits until the lease is lost.
    pub async fn wait(self) -> LossReason {
        loop {
            // Register for a wake-up before reading the status, so that a change made after
            // the read wakes us.
            let mut changed = std::pin::pin!(self.shared.changed.notified());
            changed.as_mut().enable();
            let (loss, deadline) = self.shared.loss_and_deadline();
            if let Some(r) = loss {
                return r;
            }
            match deadline {
                Some(deadline) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

impl IntoFuture for LostSignal {
    type Output = LossReason;
    type IntoFuture = Pin<Box<dyn Future<Output = LossReason> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.wait())
    }
}
