//! The shared status of one lease: its validity deadline and loss, seen by the lease, its
//! [`LostSignal`]s (the holder's side) and its [`LeaseMonitor`] (the backend's side).

mod word;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::loss::LossReason;
use crate::policy::Drift;
use crate::validity::Validity;

use self::word::{LOST, StatusWord, has_deadline};
pub(crate) use self::word::{Refused, WATCHED, WordRef, decode, encode, over};

/// The status of one lease, shared by the lease, its lost signals and its monitor.
///
/// Its deadline and whether it is lost live in a status word ([`word`]) that the renewal engine
/// also reaches directly; the reason of a loss is kept here, set before the word says lost.
///
/// The lost signals hold it strongly, so it can outlive the lease: a dropped lease is known
/// here by the [`LossReason::Released`] its drop records, not by its absence. The monitor holds
/// it weakly.
#[derive(Debug)]
pub(crate) struct Shared {
    word: StatusWord,
    /// Why the lease is lost: set once, under this lock, before the word's lost bit.
    reason: Mutex<Option<LossReason>>,
    /// Wakes the waiting lost signals after a change of the word, if it is watched. Until a
    /// [`LostSignal`] was handed out a change wakes nobody: most leases never hand one out,
    /// and waking costs as much as the rest of the bookkeeping.
    changed: Notify,
    drift: Drift,
    /// The backend's name, for the metrics' `backend` label.
    #[cfg(feature = "metrics")]
    backend: &'static str,
}

impl Shared {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(drift: Drift, backend: &'static str) -> Arc<Self> {
        Arc::new(Self {
            word: StatusWord::new(),
            reason: Mutex::new(None),
            changed: Notify::new(),
            drift,
            #[cfg(feature = "metrics")]
            backend,
        })
    }

    /// The status word, for the renewal engine (valid while the lease lives).
    pub(crate) fn word(&self) -> &WordRef {
        self.word.word()
    }

    /// Sets the first deadline, from the grant's validity.
    pub(crate) fn start(&self, v: Validity) {
        let before = self.word().start(self.drift.deadline(v));
        // Wakes nobody yet (signals come from the lease); kept so the rule has no exception.
        self.wake(before);
    }

    /// The drift margin this lease's deadlines are computed with.
    pub(crate) fn drift(&self) -> &Drift {
        &self.drift
    }

    /// A lost signal on this status. From now on every change wakes signals.
    pub(crate) fn signal(self: &Arc<Self>) -> LostSignal {
        // Set before the signal can read the status.
        self.word().set(WATCHED);
        LostSignal {
            shared: Arc::clone(self),
        }
    }

    fn reason_lock(&self) -> MutexGuard<'_, Option<LossReason>> {
        // Nothing panics while holding it; recover the reason if something ever did.
        self.reason.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the waiting lost signals after a change of the word, if a signal was ever handed
    /// out; `before`: the word before the change (its atomic operation). A signal sets the
    /// watched bit, registers for a wake-up, then reads the word: either the change comes
    /// after the bit in the word's order (and `before` has it), or the signal's read sees the
    /// change. No wake-up is lost.
    fn wake(&self, before: u64) {
        if before & WATCHED != 0 {
            self.changed.notify_waiters();
        }
    }

    /// The loss a word shows now, reading the clock only when the answer depends on it (a
    /// lease not lost, with a deadline).
    fn loss_of(&self, word: u64) -> Option<LossReason> {
        if word & LOST != 0 {
            // Set before the bit, so present (a released lease if it ever were not).
            return Some(self.reason_lock().clone().unwrap_or(LossReason::Released));
        }
        let expired = has_deadline(word) && over(word, encode(Instant::now()));
        expired.then_some(LossReason::Expired)
    }

    /// Why the lease is over, if it is.
    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.loss_of(self.word().load())
    }

    /// The loss, if any, and the validity deadline, from one read of the word: what a waiting
    /// signal needs.
    fn loss_and_deadline(&self) -> (Option<LossReason>, Option<Instant>) {
        let w = self.word().load();
        (self.loss_of(w), decode(w))
    }

    pub(crate) fn valid_until(&self) -> Option<Instant> {
        decode(self.word().load())
    }

    /// Counts a loss in the metrics (`lost` is the first terminal state of the lease).
    #[cfg(feature = "metrics")]
    fn count_loss(&self, lost: &LossReason) {
        crate::metrics::lost(self.backend, lost);
    }

    /// Moves the deadline to match `v`, unless the lease is already lost (loss is final, and a
    /// deadline that has passed is a loss even if a late renewal arrives).
    pub(crate) fn renew(&self, v: Validity) -> Result<(), LossReason> {
        let refused = self.word().renew(self.drift.deadline(v), Instant::now());
        self.renewed(refused)
    }

    /// What a renewal of the word answered ([`WordRef::renew`], by the lease or by the renewal
    /// engine): the wake-up after a change, or the loss it found (an expiry is recorded).
    pub(crate) fn renewed(&self, outcome: Result<u64, Refused>) -> Result<(), LossReason> {
        match outcome {
            Ok(before) => {
                self.wake(before);
                Ok(())
            }
            Err(Refused::Passed) => {
                self.lose(LossReason::Expired);
                Err(self.loss().unwrap_or(LossReason::Expired))
            }
            Err(Refused::Lost) => Err(self.loss().unwrap_or(LossReason::Released)),
        }
    }

    pub(crate) fn lose(&self, reason: LossReason) {
        let mut r = self.reason_lock();
        if r.is_some() {
            return;
        }
        // A release after the deadline passed unnoticed is still a loss, by expiry.
        #[cfg(feature = "metrics")]
        match self.loss_of(self.word().load()) {
            Some(expired) if reason == LossReason::Released => self.count_loss(&expired),
            _ => self.count_loss(&reason),
        }
        *r = Some(reason);
        let before = self.word().set(LOST);
        drop(r);
        self.wake(before);
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
