//! The renewal engine: one task per [`Locker`](crate::Locker) (shared by its clones) renews
//! every lease it handed out, in batches, through [`LockBackend::extend_many`].
//!
//! Leases wait in a queue ordered by their next renewal instant. When the first is due, the
//! engine takes every lease due within a window after it (an eighth of its renewal interval),
//! up to [`MAX_BATCH`], and hands them to the backend in one call: a Redis backend sends one
//! script over many keys instead of one round trip per lease. Each lease still gets its own
//! outcome:
//!
//! - renewed: its validity counts from the instant taken *before* the batch was sent, and its
//!   next renewal is one interval later, minus a random jitter of up to a tenth of the interval
//!   (leases acquired together drift apart instead of renewing in lockstep forever; the jitter
//!   only ever renews earlier);
//! - not held any more: it alone is reported lost ([`LossReason::NotHeld`]);
//! - a fault, or a batch that failed or did not answer in time as a whole: each lease is retried
//!   before its own deadline, and reported lost when that deadline passes.
//!
//! A batch runs in a task of its own, so a batch stuck on a dead connection never delays the
//! leases of the next one; the engine's task exits when no lease is left, and is started again
//! by the next one. A released or dropped lease leaves the queue at once (its [`Ticket`] goes).
//!
//! The queue ([`queue`]) is a slab of entries and a due list of coarse buckets: queuing,
//! taking and leaving cost a push or a swap-remove per lease, not tree and hash-table work.
//! Each entry keeps a handle on its lease's status word (its deadline and loss, packed with
//! other leases' words), so that after a batch's round trip a renewal moves the deadline
//! without touching the lease's own memory: at 10,000 leases that memory is out of the cache
//! by the time the answer comes, and reading it was the renewal path's largest cost.

mod queue;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use rand::Rng as _;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::backend::LockBackendExt as _;
use crate::backend::{ExtendRequest, Extended, Held, LockBackend};
use crate::error::{Error, ErrorKind};
use crate::key::LockKey;
use crate::loss::LossReason;
use crate::metrics;
use crate::policy::{Drift, Renewal};
use crate::signal::{self, Shared, WordRef};

use self::queue::{Entry, Id, Queue};

/// The most leases handed to the backend in one [`LockBackend::extend_many`] call; the backend
/// splits them further as its protocol needs (the Redis backends send scripts of at most a few
/// hundred keys).
pub const MAX_BATCH: usize = 2_000;

/// What the engine needs of a lease; implemented by the lease's shared state.
pub(crate) trait Renewable: Send + Sync {
    /// The grant, as handed to the backend.
    fn held(&self) -> Held<'_>;
    /// The TTL to renew with.
    fn ttl(&self) -> Duration;
    /// The lease's status: its deadline and loss.
    fn status(&self) -> &Shared;
    /// The key, for logs.
    fn key(&self) -> &LockKey;
    /// A renewal request for the grant is under way and may re-arm its TTL until `until` (the
    /// instant its batch ends at the latest): a release's horizon counts from then.
    fn renewing(&self, until: Instant);
    /// A renewal answered after the holder had let the lease go: it may have armed the grant
    /// again (a Redlock extend sets a missing key again), so the grant is released again, in
    /// the background.
    fn release_again(self: Arc<Self>);
}

/// The renewal engine of one [`Locker`](crate::Locker) and its clones.
#[derive(Clone)]
pub(crate) struct Renewer {
    engine: Arc<Engine>,
}

impl fmt::Debug for Renewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.engine.lock();
        f.debug_struct("Renewer")
            .field("leases", &queue.len())
            .field("running", &queue.task.is_some())
            .finish()
    }
}

struct Engine {
    backend: Arc<dyn LockBackend>,
    queue: Mutex<Queue>,
    wake: Notify,
}

/// A lease's place in the engine's queue; dropping it takes the lease out.
pub(crate) struct Ticket {
    engine: Arc<Engine>,
    id: Id,
    /// How the lease is renewed, to re-plan its interval when it is extended to another TTL.
    pub(crate) policy: Renewal,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut q = self.engine.lock();
        q.remove(self.id);
        let empty = q.len() == 0;
        drop(q);
        if empty {
            // Lets the engine's task see the queue empty and end.
            self.engine.wake.notify_one();
        }
    }
}

impl Ticket {
    /// Renews the lease every `interval` from now on (an `extend` with another TTL): due at
    /// once by the new interval if that comes before the renewal already planned.
    pub(crate) fn rearm(&self, interval: Duration) {
        let mut q = self.engine.lock();
        q.set_interval(self.id, interval);
        let Some(planned) = q.due(self.id) else {
            // In a batch now (its answer is planned with the new interval), or gone.
            return;
        };
        let sooner = Instant::now() + interval;
        if sooner < planned {
            q.schedule(self.id, sooner);
            drop(q);
            self.engine.wake.notify_one();
        }
    }
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn LockBackend>) -> Self {
        Self {
            engine: Arc::new(Engine {
                backend,
                queue: Mutex::new(Queue::default()),
                wake: Notify::new(),
            }),
        }
    }

    /// Queues `lease` (whose status is `status`) for renewal every `interval`, the first one
    /// `interval` from now. `None` without a Tokio runtime (then nothing renews it).
    pub(crate) fn register(
        &self,
        lease: Weak<dyn Renewable>,
        status: &Shared,
        interval: Duration,
        policy: Renewal,
    ) -> Option<Ticket> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let due = Instant::now() + interval;
        let mut q = self.engine.lock();
        let first = q.may_be_first(due);
        let entry = Entry {
            lease,
            word: status.word().clone(),
            drift: q.drift_index(*status.drift()),
        };
        let id = q.insert(entry, interval, due);
        if q.task.as_ref().is_none_or(AbortHandle::is_finished) {
            let engine = Arc::clone(&self.engine);
            q.task = Some(rt.spawn(engine.run()).abort_handle());
        } else if first {
            drop(q);
            self.engine.wake.notify_one();
        }
        Some(Ticket {
            engine: Arc::clone(&self.engine),
            id,
            policy,
        })
    }
}

/// One lease in a batch, with what the batch reads of it, read once when it was taken (each
/// pass over thousands of leases costs a cache miss per lease). After the round trip only its
/// status word is touched, unless the lease is lost or watched.
struct Member {
    id: Id,
    lease: Arc<dyn Renewable>,
    word: WordRef,
    drift: Drift,
    interval: Duration,
    ttl: Duration,
    valid_until: Option<Instant>,
}

/// What a batch decided for one lease.
enum Next {
    At(Instant),
    Done,
}

impl Engine {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The engine's task: waits for the first due lease, hands a batch to a task of its own,
    /// and ends when the queue is empty.
    async fn run(self: Arc<Self>) {
        loop {
            let wait = {
                let mut q = self.lock();
                if q.len() == 0 {
                    q.task = None;
                    return;
                }
                match q.first() {
                    None => None,
                    Some((first, _)) if first > Instant::now() => Some(first),
                    Some(_) => {
                        let batch = take_batch(&mut q);
                        drop(q);
                        if !batch.is_empty() {
                            tokio::spawn(Arc::clone(&self).renew(batch));
                        }
                        continue;
                    }
                }
            };
            match wait {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = self.wake.notified() => {}
                    }
                }
                // Every lease is in a batch: wait for one to come back.
                None => self.wake.notified().await,
            }
        }
    }

    /// Renews `batch` in one call (in a span of its own), then queues each lease again (or
    /// lets it go).
    async fn renew(self: Arc<Self>, batch: Vec<Member>) {
        let span = tracing::debug_span!(
            "leasehold.renew_batch",
            backend = self.backend.name(),
            size = batch.len()
        );
        self.renew_batch(batch).instrument(span).await;
    }

    async fn renew_batch(&self, batch: Vec<Member>) {
        let started = Instant::now();
        let bound = batch_bound(&batch, started);
        let reqs: Vec<ExtendRequest<'_>> = batch
            .iter()
            .map(|m| ExtendRequest::new(m.lease.held(), m.ttl, started))
            .collect();
        // Apart from the pass above (plain reads, whose misses overlap): each mark is a locked
        // instruction, which would wait for the lease before it.
        for m in &batch {
            m.lease.renewing(started + bound);
        }
        let name = self.backend.name();
        let outcomes = match tokio::time::timeout(bound, self.backend.extend_many(&reqs)).await {
            Ok(out) if out.len() == reqs.len() => out,
            Ok(out) => {
                let msg = format!(
                    "extend_many answered {} outcomes for {} leases",
                    out.len(),
                    reqs.len()
                );
                batch_error(&reqs, name, ErrorKind::Backend, &msg)
            }
            Err(_) => {
                let msg = format!("a renewal batch got no answer within {bound:?}");
                batch_error(&reqs, name, ErrorKind::Unavailable, &msg)
            }
        };
        drop(reqs);
        let failed = outcomes.iter().filter(|o| o.is_err()).count();
        metrics::renewal_batch(name, batch.len(), failed, started);
        tracing::debug!(
            failed,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "leasehold.renew_batch"
        );
        // The leases' words, counts and slots were last read before the round trip, long enough
        // ago to have left the cache. Each is read first in a pass that does nothing else, whose
        // misses overlap, rather than one at a time inside the longer work on each lease (whose
        // locked instructions would wait for each miss in turn).
        touch(&batch);
        let next: Vec<Next> = {
            let mut rng = rand::rng();
            batch
                .iter()
                .zip(outcomes)
                .map(|(m, outcome)| settle(m, outcome, started, name, &mut rng))
                .collect()
        };
        let mut q = self.lock();
        // A lease re-armed with a shorter interval while this batch ran (`Ticket::rearm`) is
        // due by its new interval; a lease no longer queued has none.
        let intervals: Vec<Option<Duration>> = batch
            .iter()
            .map(|m| q.get(m.id).map(|s| s.interval))
            .collect();
        for ((m, next), interval) in batch.iter().zip(next).zip(intervals) {
            match (next, interval) {
                (Next::At(at), Some(interval)) => q.schedule(m.id, at.min(started + interval)),
                (Next::At(_), None) => {}
                (Next::Done, _) => {
                    q.remove(m.id);
                }
            }
        }
        drop(q);
        self.wake.notify_one();
        // The leases (`batch`) are dropped here, outside the queue's lock: the last reference
        // to a lease may go with them, and its ticket takes that lock.
    }
}

/// Takes every lease due within the window after the first one (at most [`MAX_BATCH`]), out of
/// the queue and into a batch. Leases already dropped leave the queue.
fn take_batch(q: &mut Queue) -> Vec<Member> {
    let Some((first, first_id)) = q.first() else {
        return Vec::new();
    };
    let window = q.get(first_id).map_or(Duration::ZERO, |e| e.interval / 8);
    let now = Instant::now();
    let horizon = first.max(now) + window;
    let ids = q.take_due(horizon, MAX_BATCH);
    let now_code = signal::encode(now);
    // Plain reads of every lease first, its status word and its reference count: their cache
    // misses overlap in a pass that does nothing else, where the locked instruction of each
    // `upgrade` below would wait for them one lease at a time.
    let seen: Vec<(u64, usize)> = ids
        .iter()
        .map(|&id| {
            q.get(id)
                .and_then(|s| s.entry.as_ref())
                .map_or((0, 0), |e| (e.word.load(), e.lease.strong_count()))
        })
        .collect();
    let mut batch = Vec::with_capacity(ids.len());
    for (id, (word, strong)) in ids.into_iter().zip(seen) {
        let Some((entry, interval)) = q
            .get(id)
            .and_then(|s| Some((s.entry.as_ref()?, s.interval)))
        else {
            continue;
        };
        // Gone or lost: nothing left to renew. (An `Arc` dropped here is not the last one: the
        // lease's own handle holds another while its ticket exists.)
        let lease = (strong > 0 && !signal::over(word, now_code))
            .then(|| entry.lease.upgrade())
            .flatten();
        match lease {
            Some(lease) => batch.push(Member {
                id,
                ttl: lease.ttl(),
                word: entry.word.clone(),
                drift: q.drift(entry),
                lease,
                interval,
                valid_until: signal::decode(word),
            }),
            None => {
                q.remove(id);
            }
        }
    }
    batch
}

/// Reads every lease's status word and reference count in `batch`, for the cache: see
/// `renew_batch`.
fn touch(batch: &[Member]) {
    let folded = batch.iter().fold(0u64, |acc, m| {
        acc ^ m.word.load() ^ Arc::strong_count(&m.lease) as u64
    });
    std::hint::black_box(folded);
}

/// How long a batch may take: its leases' shortest interval, and at most half the time left
/// before the earliest deadline among them (so a batch that hangs still leaves time to retry).
/// The deadlines are those read when the batch was taken, a task switch before it is sent: an
/// `extend` in between counts from the next batch on, as one made while the batch runs does.
fn batch_bound(batch: &[Member], started: Instant) -> Duration {
    let interval = batch
        .iter()
        .map(|m| m.interval)
        .min()
        .unwrap_or(Duration::from_secs(1));
    let left = batch
        .iter()
        .filter_map(|m| m.valid_until)
        .min()
        .map_or(interval, |d| d.saturating_duration_since(started) / 2);
    interval.min(left).max(Duration::from_millis(1))
}

/// The same fault for every lease of a batch.
fn batch_error(
    reqs: &[ExtendRequest<'_>],
    backend: &'static str,
    kind: ErrorKind,
    msg: &str,
) -> Vec<Extended> {
    reqs.iter()
        .map(|_| Err(Error::new(kind, backend, msg.to_owned())))
        .collect()
}

/// Applies one lease's outcome: its next renewal, or the end of its renewals.
fn settle(
    m: &Member,
    outcome: Extended,
    started: Instant,
    backend: &'static str,
    rng: &mut rand::rngs::ThreadRng,
) -> Next {
    let lease = &m.lease;
    match outcome {
        Ok(Some(v)) => {
            // The status word alone, unless the lease is watched or lost (then its status).
            let renewed = match m.word.renew(m.drift.deadline(v), Instant::now()) {
                Ok(before) if before & signal::WATCHED == 0 => Ok(()),
                outcome => lease.status().renewed(outcome),
            };
            if let Err(reason) = renewed {
                // The batch was sent before the lease was released or dropped, and its answer
                // came after: the grant it re-armed must not outlive the release.
                if matches!(reason, LossReason::Released) {
                    Arc::clone(&m.lease).release_again();
                }
                return Next::Done;
            }
            tracing::trace!(key = %lease.key(), backend, "leasehold.renew");
            let jitter = m.interval.mul_f64(rng.random_range(0.0..0.1));
            Next::At(started + m.interval - jitter)
        }
        Ok(None) => {
            let status = lease.status();
            if status.loss().is_none() {
                tracing::warn!(key = %lease.key(), backend,
                    "leasehold.lost: renewal found the grant gone");
                status.lose(LossReason::NotHeld);
            }
            Next::Done
        }
        Err(e) => {
            metrics::renewal_failed(backend);
            let status = lease.status();
            if status.loss().is_some() {
                return Next::Done;
            }
            let now = Instant::now();
            let deadline = status.valid_until().unwrap_or(now);
            if now >= deadline {
                tracing::warn!(key = %lease.key(), backend, error = %e,
                    "leasehold.lost: renewal failed until the deadline");
                status.lose(LossReason::RenewalFailed(Arc::from(e.to_string())));
                return Next::Done;
            }
            tracing::debug!(key = %lease.key(), backend, error = %e,
                "leasehold.renew failed; retrying before the deadline");
            let retry = (m.interval / 4)
                .min((deadline - now) / 2)
                .max(Duration::from_millis(1));
            Next::At(now + retry)
        }
    }
}

/// [`LockBackend::extend_many`] for a backend that has no batch request: each grant in turn,
/// through [`LockBackend::extend`]. Session backends (whose `extend` only confirms a grant the
/// session keeps alive) and in-process backends use it.
pub async fn extend_each<B: LockBackend + ?Sized>(
    backend: &B,
    reqs: &[ExtendRequest<'_>],
) -> Vec<Extended> {
    let mut out = Vec::with_capacity(reqs.len());
    for req in reqs {
        out.push(backend.extend(*req).await);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockOptions, Locker, MemoryBackend, Renewal};

    /// An `extend` to a shorter TTL re-arms the renewal interval from it: a lease renewed every
    /// 10 s (TTL 30 s) and extended to 300 ms used to keep the 10 s interval and expire
    /// between two renewals.
    #[tokio::test(start_paused = true)]
    async fn extending_to_a_shorter_ttl_renews_by_the_new_ttl() {
        let locker = Locker::new(MemoryBackend::new())
            .with_options(LockOptions::default().with_ttl(Duration::from_secs(30)))
            .unwrap();
        let lease = locker.try_acquire("k").await.unwrap().unwrap();
        lease.extend(Duration::from_millis(300)).await.unwrap();
        let (_, due) = queued(&locker);
        assert!(
            due.iter()
                .all(|&d| d <= Instant::now() + Duration::from_millis(100)),
            "{due:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!lease.is_lost(), "expired between two renewals");
        assert!(lease.valid_until() > Instant::now());
        // And back to a longer TTL: the interval grows again.
        lease.extend(Duration::from_secs(30)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!lease.is_lost());
        assert!(lease.release().await.unwrap());
    }

    fn queued(locker: &Locker) -> (usize, Vec<Instant>) {
        let q = locker.renewer.engine.lock();
        (q.len(), q.dues())
    }

    /// Leases taken together renew together, then come due at jittered instants (never later
    /// than one interval after the batch); released and dropped leases leave the queue, and
    /// the engine's task ends with the last one.
    #[tokio::test(start_paused = true)]
    async fn leases_renew_in_batches_then_drift_apart_and_leave_the_queue() {
        let interval = Duration::from_secs(1);
        let options = LockOptions::default()
            .with_ttl(Duration::from_secs(3))
            .with_renewal(Renewal::Every(interval));
        let locker = Locker::new(MemoryBackend::new())
            .with_options(options)
            .unwrap();
        let mut leases = Vec::new();
        for i in 0..100 {
            leases.push(locker.try_acquire(format!("k{i}")).await.unwrap().unwrap());
        }
        let t0 = Instant::now();
        let (n, due) = queued(&locker);
        assert_eq!(n, 100);
        assert!(
            due.iter().all(|&d| d == t0 + interval),
            "first renewal one interval on"
        );

        tokio::time::sleep(interval + Duration::from_millis(10)).await;
        let (n, due) = queued(&locker);
        assert_eq!(n, 100, "every lease still queued");
        let distinct: std::collections::BTreeSet<_> = due.iter().collect();
        assert!(
            distinct.len() > 90,
            "jitter spread the next renewals: {distinct:?}"
        );
        let renewed = t0 + interval;
        for d in &due {
            assert!(*d <= renewed + interval && *d >= renewed + interval.mul_f64(0.9));
        }
        assert!(
            leases
                .iter()
                .all(|l| l.valid_until() > t0 + Duration::from_secs(3))
        );

        assert!(leases.pop().unwrap().release().await.unwrap());
        drop(leases.pop());
        assert_eq!(queued(&locker).0, 98, "released and dropped leases left");
        leases.clear();
        assert_eq!(queued(&locker).0, 0);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            locker.renewer.engine.lock().task.is_none(),
            "the engine's task ended"
        );
    }
}
