//! The renewal engine's queue: a slab of entries, one per lease, and a due list of coarse
//! buckets.
//!
//! Every lease renews about once per interval, so at 10,000 leases the queue is where the
//! engine spends its time: a hash map plus an ordered set cost two tree or table operations and
//! several cache misses per renewal, and five heap objects per lease. Here an entry is one slot
//! of a `Vec` (reused through a free list; a generation tells a reused slot from the one a stale
//! id named), and the due list keeps slot indices in buckets of [`TICK`] by due instant, each
//! entry knowing its place in its bucket: queuing, leaving and taking a lease are a push or a
//! swap-remove in a small vector. Each entry keeps its exact due instant, so the engine takes
//! leases exactly when they are due (the bucket is only where it is found).

use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::Renewable;
use crate::policy::Drift;
use crate::signal::WordRef;

/// The width of a due bucket.
const TICK: Duration = Duration::from_millis(4);

/// A lease's entry in the queue: its slot and the slot's generation when it was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Id {
    index: u32,
    generation: u32,
}

/// What the engine keeps of a queued lease.
pub(super) struct Entry {
    pub(super) lease: Weak<dyn Renewable>,
    /// The lease's status word: its deadline read and moved here, without touching the lease.
    pub(super) word: WordRef,
    /// The lease's drift margin (fixed for its life), to turn a renewal's validity into a
    /// deadline: its place in [`Queue::drifts`].
    pub(super) drift: usize,
}

/// One lease in the queue.
pub(super) struct Slot {
    /// `None` while the slot is free.
    pub(super) entry: Option<Entry>,
    pub(super) interval: Duration,
    /// `None` while a batch renews it (or the slot is free).
    due: Option<Instant>,
    /// Its place in the bucket of `due`.
    pos: u32,
    generation: u32,
}

/// The leases of one engine, and its task.
pub(super) struct Queue {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    /// Slot indices by due bucket (the due instant's [`TICK`] since `epoch`).
    buckets: BTreeMap<u64, Vec<u32>>,
    /// Emptied buckets' vectors, reused.
    spare: Vec<Vec<u32>>,
    epoch: Instant,
    /// The distinct drift margins of the queued leases (one per set of options the locker's
    /// clones used: a handful), so that a slot names its lease's by a number.
    drifts: Vec<Drift>,
    pub(super) task: Option<AbortHandle>,
}

impl Default for Queue {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            buckets: BTreeMap::new(),
            spare: Vec::new(),
            epoch: Instant::now(),
            drifts: Vec::new(),
            task: None,
        }
    }
}

impl Queue {
    /// How many leases are queued (due or in a batch).
    pub(super) fn len(&self) -> usize {
        self.live
    }

    fn tick(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.epoch);
        u64::try_from(since.as_nanos() / TICK.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Queues a lease, due at `due`.
    pub(super) fn insert(&mut self, entry: Entry, interval: Duration, due: Instant) -> Id {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Slot {
                    entry: None,
                    interval,
                    due: None,
                    pos: 0,
                    generation: 0,
                });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.entry = Some(entry);
        slot.interval = interval;
        let id = Id {
            index,
            generation: slot.generation,
        };
        self.live += 1;
        self.schedule(id, due);
        id
    }

    /// The number [`Entry::drift`] names `drift` by.
    pub(super) fn drift_index(&mut self, drift: Drift) -> usize {
        self.drifts
            .iter()
            .position(|d| *d == drift)
            .unwrap_or_else(|| {
                self.drifts.push(drift);
                self.drifts.len() - 1
            })
    }

    /// The drift margin an entry names (every number handed out names one: the table only
    /// grows).
    pub(super) fn drift(&self, entry: &Entry) -> Drift {
        self.drifts[entry.drift]
    }

    /// The entry of `id`, if it is still queued.
    pub(super) fn get(&self, id: Id) -> Option<&Slot> {
        self.slots
            .get(id.index as usize)
            .filter(|s| s.generation == id.generation && s.entry.is_some())
    }

    /// Takes `id` out of the queue (due or in a batch); `false` if it already left.
    pub(super) fn remove(&mut self, id: Id) -> bool {
        if self.get(id).is_none() {
            return false;
        }
        self.unschedule(id);
        let slot = &mut self.slots[id.index as usize];
        slot.entry = None;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(id.index);
        self.live -= 1;
        true
    }

    /// Renews `id` every `interval` from now on.
    pub(super) fn set_interval(&mut self, id: Id, interval: Duration) {
        if self.get(id).is_some() {
            self.slots[id.index as usize].interval = interval;
        }
    }

    /// When `id` is due; `None` while a batch renews it (or once it left).
    pub(super) fn due(&self, id: Id) -> Option<Instant> {
        self.get(id).and_then(|s| s.due)
    }

    /// Makes `id` due at `at` (whether it was due at another instant or in a batch).
    pub(super) fn schedule(&mut self, id: Id, at: Instant) {
        if self.get(id).is_none() {
            return;
        }
        self.unschedule(id);
        let tick = self.tick(at);
        let spare = &mut self.spare;
        let bucket = self
            .buckets
            .entry(tick)
            .or_insert_with(|| spare.pop().unwrap_or_default());
        let slot = &mut self.slots[id.index as usize];
        slot.pos = u32::try_from(bucket.len()).unwrap_or(u32::MAX);
        slot.due = Some(at);
        bucket.push(id.index);
    }

    /// Takes `id` out of its bucket (it stays queued, not due).
    fn unschedule(&mut self, id: Id) {
        let slot = &mut self.slots[id.index as usize];
        let Some(due) = slot.due.take() else {
            return;
        };
        let pos = slot.pos as usize;
        let tick = self.tick(due);
        let Some(bucket) = self.buckets.get_mut(&tick) else {
            return;
        };
        bucket.swap_remove(pos);
        if let Some(&moved) = bucket.get(pos) {
            self.slots[moved as usize].pos = pos as u32;
        }
        if bucket.is_empty()
            && let Some(empty) = self.buckets.remove(&tick)
        {
            self.spare.push(empty);
        }
    }

    /// Whether a lease due at `at` may be the first due: nothing is due, or `at` falls in the
    /// first bucket or before it. (Cheap: used on every registration.)
    pub(super) fn may_be_first(&self, at: Instant) -> bool {
        self.buckets
            .first_key_value()
            .is_none_or(|(&first, _)| self.tick(at) <= first)
    }

    /// The first due lease and when it is due.
    pub(super) fn first(&self) -> Option<(Instant, Id)> {
        let (_, bucket) = self.buckets.first_key_value()?;
        bucket
            .iter()
            .filter_map(|&i| {
                let s = &self.slots[i as usize];
                let id = Id {
                    index: i,
                    generation: s.generation,
                };
                s.due.map(|d| (d, id))
            })
            .min_by_key(|&(d, _)| d)
    }

    /// Takes every lease due at or before `horizon` (at most `max`, the earliest buckets
    /// first) out of the due list: they are in a batch now.
    pub(super) fn take_due(&mut self, horizon: Instant, max: usize) -> Vec<Id> {
        let last = self.tick(horizon);
        let mut out = Vec::new();
        while out.len() < max {
            let Some(mut entry) = self.buckets.first_entry() else {
                break;
            };
            if *entry.key() > last {
                break;
            }
            let bucket = entry.get_mut();
            let mut kept = 0;
            for pos in 0..bucket.len() {
                let i = bucket[pos];
                let slot = &mut self.slots[i as usize];
                let due = slot.due.filter(|&d| d <= horizon);
                if due.is_some() && out.len() < max {
                    slot.due = None;
                    out.push(Id {
                        index: i,
                        generation: slot.generation,
                    });
                } else {
                    slot.pos = kept as u32;
                    bucket[kept] = i;
                    kept += 1;
                }
            }
            bucket.truncate(kept);
            if kept > 0 {
                // The rest is due after the horizon, or past `max`.
                break;
            }
            let empty = entry.remove();
            self.spare.push(empty);
        }
        out
    }

    /// Every due instant, for tests.
    #[cfg(test)]
    pub(super) fn dues(&self) -> Vec<Instant> {
        self.buckets
            .values()
            .flatten()
            .filter_map(|&i| self.slots[i as usize].due)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::backend::Held;
    use crate::key::LockKey;
    use crate::signal::Shared;

    struct Dummy;

    impl Renewable for Dummy {
        fn held(&self) -> Held<'_> {
            unreachable!()
        }
        fn ttl(&self) -> Duration {
            unreachable!()
        }
        fn status(&self) -> &Shared {
            unreachable!()
        }
        fn key(&self) -> &LockKey {
            unreachable!()
        }
        fn renewing(&self, _: Instant) {}
        fn release_again(self: Arc<Self>) {}
    }

    /// An entry of no lease (its status word that of a status dropped at the end).
    fn weak() -> Entry {
        let status = Shared::new(Drift::default(), "test");
        Entry {
            lease: Weak::<Dummy>::new(),
            word: status.word().clone(),
            drift: 0,
        }
    }

    /// Leases come out in due order, bucket by bucket, exactly up to the horizon; removed
    /// ones never come out, and a stale id (its slot reused) changes nothing.
    #[test]
    fn takes_due_leases_in_order_and_forgets_removed_ones() {
        let mut q = Queue::default();
        let t0 = q.epoch;
        let ms = Duration::from_millis;
        let ids: Vec<Id> = (0..100u64)
            .map(|i| q.insert(weak(), ms(1000), t0 + ms(i * 3)))
            .collect();
        assert_eq!(q.len(), 100);
        assert_eq!(q.first(), Some((t0, ids[0])));
        assert!(q.remove(ids[0]));
        assert!(!q.remove(ids[0]), "removed once");
        assert_eq!(q.first(), Some((t0 + ms(3), ids[1])));
        let taken = q.take_due(t0 + ms(30), usize::MAX);
        assert_eq!(taken, ids[1..=10].to_vec());
        assert_eq!(q.due(ids[1]), None, "in a batch");
        assert_eq!(q.first(), Some((t0 + ms(33), ids[11])));
        // Back in the queue, and a removed slot reused: the stale id names nothing.
        q.schedule(ids[1], t0 + ms(1));
        assert!(q.remove(ids[2]));
        let reused = q.insert(weak(), ms(1000), t0 + ms(2));
        assert_ne!(reused, ids[2]);
        assert!(!q.remove(ids[2]));
        assert_eq!(q.due(ids[2]), None);
        assert_eq!(q.take_due(t0 + ms(2), 1), vec![ids[1]]);
        assert_eq!(q.take_due(t0 + ms(2), 10), vec![reused]);
        // A lease removed from the middle of a bucket leaves the others in it.
        assert!(q.remove(ids[12]));
        let taken = q.take_due(t0 + ms(300), 5);
        assert_eq!(taken, [11, 13, 14, 15, 16].map(|i| ids[i]).to_vec());
        assert_eq!(q.len(), 98);
        // In a batch: ids 1 and 3..=10, the reused slot and the last five taken.
        assert_eq!(q.dues().len(), 98 - 15);
        let mut dues = q.dues();
        dues.sort();
        assert_eq!(dues.first(), Some(&(t0 + ms(17 * 3))));
    }
}
