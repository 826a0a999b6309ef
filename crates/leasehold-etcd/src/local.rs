//! The in-process lock table: at most one local task holds a waiter key (lock prefix + session
//! lease), since etcd would count two tasks on one key as one owner. A key held with nobody
//! else waiting for it costs one table entry and no semaphore (the common case: one per held
//! lock, so thousands in a fleet); the semaphore that queues local waiters first come, first
//! served is made by the first one that waits.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{AcquireError, Semaphore};

use crate::client::Key;

/// What the table keeps for a waiter key someone uses.
enum Slot {
    /// Held, and nobody else waits for it.
    Held,
    /// Waited for: the semaphore that hands the key on, its one permit out while held.
    Queued(Arc<Semaphore>),
}

/// The table, shared by every acquisition of one backend.
#[derive(Default)]
pub(crate) struct LocalTable(Mutex<HashMap<Key, Slot>>);

impl LocalTable {
    fn map(&self) -> MutexGuard<'_, HashMap<Key, Slot>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

/// One in-process lock slot for a waiter key: the key once taken, or our place among its
/// local waiters. Dropping it gives the key back (to the next local waiter, if any) and
/// forgets the table's entry once nobody holds or waits for the key.
pub(crate) struct LocalSlot {
    table: Arc<LocalTable>,
    key: Key,
    /// The key's semaphore, once we waited on it or took the key through it.
    sem: Option<Arc<Semaphore>>,
    /// Whether we hold the key (with a semaphore: its permit, taken and forgotten, so that
    /// the slot carries no permit object of its own; given back on drop).
    held: bool,
}

impl LocalSlot {
    /// A slot for `key` that neither holds nor waits yet.
    pub(crate) fn new(table: &Arc<LocalTable>, key: Key) -> Self {
        Self {
            table: Arc::clone(table),
            key,
            sem: None,
            held: false,
        }
    }

    /// The waiter key this slot guards.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// Takes the key if nobody holds it: whether we hold it now.
    pub(crate) fn try_take(&mut self) -> bool {
        let mut map = self.table.map();
        match map.entry(Arc::clone(&self.key)) {
            Entry::Vacant(free) => {
                free.insert(Slot::Held);
                self.held = true;
            }
            Entry::Occupied(used) => {
                if let Slot::Queued(sem) = used.get()
                    && let Ok(permit) = sem.try_acquire()
                {
                    permit.forget();
                    self.held = true;
                    self.sem = Some(Arc::clone(sem));
                }
            }
        }
        self.held
    }

    /// Waits for the key (first come, first served among local waiters). Cancel-safe: a
    /// wait dropped before it completes holds nothing.
    pub(crate) async fn take(&mut self) -> Result<(), AcquireError> {
        let sem = {
            let mut map = self.table.map();
            match map.entry(Arc::clone(&self.key)) {
                Entry::Vacant(free) => {
                    free.insert(Slot::Held);
                    self.held = true;
                    return Ok(());
                }
                Entry::Occupied(mut used) => match used.get() {
                    Slot::Queued(sem) => Arc::clone(sem),
                    Slot::Held => {
                        // The holder has the one permit: the semaphore starts with none.
                        let sem = Arc::new(Semaphore::new(0));
                        used.insert(Slot::Queued(Arc::clone(&sem)));
                        sem
                    }
                },
            }
        };
        let sem = self.sem.insert(sem);
        sem.acquire().await?.forget();
        self.held = true;
        Ok(())
    }
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        if !self.held && self.sem.is_none() {
            return;
        }
        let mut map = self.table.map();
        // Our own reference goes first, under the table's lock, so that the count below is
        // of the others only, whatever order slots of one key drop in.
        drop(self.sem.take());
        let forget = match map.get(&self.key) {
            // Only a holder that took a free key leaves it so: nobody waits.
            Some(Slot::Held) => true,
            Some(Slot::Queued(sem)) => {
                let others = Arc::strong_count(sem) - 1;
                if self.held && others > 0 {
                    sem.add_permits(1);
                }
                // Nobody else waits, and (a waiter that leaves) nobody holds it either.
                others == 0 && (self.held || sem.available_permits() == 1)
            }
            None => false,
        };
        if forget {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn slot(table: &Arc<LocalTable>) -> LocalSlot {
        LocalSlot::new(table, Arc::from(&b"lock/k/1"[..]))
    }

    /// A slot that holds the key.
    fn holder(table: &Arc<LocalTable>) -> LocalSlot {
        let mut s = slot(table);
        assert!(s.try_take(), "the key is free");
        s
    }

    /// A slot whose wait for the (held) key was cancelled: still registered as a waiter.
    async fn cancelled_waiter(table: &Arc<LocalTable>) -> LocalSlot {
        let mut s = slot(table);
        let waited = tokio::time::timeout(Duration::from_millis(20), s.take()).await;
        assert!(waited.is_err(), "the key is held: the wait times out");
        s
    }

    #[tokio::test]
    async fn a_held_key_without_waiters_makes_no_semaphore_and_is_forgotten() {
        let table = Arc::new(LocalTable::default());
        let a = holder(&table);
        assert!(a.sem.is_none(), "no semaphore for an uncontended key");
        assert!(!slot(&table).try_take(), "a second slot must not take it");
        drop(a);
        assert_eq!(table.len(), 0);
        let mut b = slot(&table);
        b.take().await.expect("the key is free again");
        drop(b);
        assert_eq!(table.len(), 0);
    }

    #[tokio::test]
    async fn waiters_take_the_key_in_order_and_the_entry_goes_with_the_last() {
        let table = Arc::new(LocalTable::default());
        let holder = holder(&table);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (table, tx) = (Arc::clone(&table), tx.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = slot(&table);
                s.take().await.expect("taken");
                tx.send(i).expect("sent");
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(s);
            }));
            // Each waiter is queued before the next one starts.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!slot(&table).try_take(), "held while waiters queue");
        drop(holder);
        for t in tasks {
            t.await.expect("waiter task");
        }
        let order: Vec<i32> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(order, [0, 1, 2], "first come, first served");
        assert_eq!(table.len(), 0, "nobody holds or waits: the entry is gone");
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_key_to_its_holder_and_then_nothing_behind() {
        let table = Arc::new(LocalTable::default());
        let holder = holder(&table);
        drop(cancelled_waiter(&table).await);
        assert!(!slot(&table).try_take(), "still held after the waiter left");
        drop(holder);
        assert_eq!(table.len(), 0);
        assert!(slot(&table).try_take(), "free once its holder is gone");
    }

    #[tokio::test]
    async fn a_waiter_cancelled_after_the_holder_left_frees_the_key() {
        let table = Arc::new(LocalTable::default());
        let holder = holder(&table);
        let waiter = cancelled_waiter(&table).await;
        // A second waiter keeps the entry while the first leaves.
        let second = cancelled_waiter(&table).await;
        drop(holder);
        drop(waiter);
        drop(second);
        assert_eq!(table.len(), 0, "nobody holds or waits");
        assert!(slot(&table).try_take());
    }
}
