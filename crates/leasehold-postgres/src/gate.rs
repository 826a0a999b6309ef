//! The in-process gate: one local holder (or attempt) per advisory-lock key and backend.
//!
//! Sessions are shared by many locks and PostgreSQL's advisory locks are re-entrant within a
//! session, so the server alone cannot keep two tasks of this process apart: the gate does.
//! It also keeps local contenders off the server: 32 tasks of one process waiting for one key
//! queue here (FIFO) and only the head talks to the server, instead of 32 waits each blocking
//! a session in `pg_advisory_lock`.

use crate::key::AdvisoryId;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use tokio::time::Instant;

#[derive(Debug, Default)]
pub(crate) struct Gates {
    /// foldhash: two lookups per acquisition, of ids that are our own.
    map: Mutex<foldhash::HashMap<AdvisoryId, Arc<AsyncMutex<()>>>>,
}

/// A passed gate; dropping it lets the next local contender in.
#[derive(Debug)]
pub(crate) struct Gate {
    gates: Arc<Gates>,
    id: AdvisoryId,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Gates {
    fn map(&self) -> MutexGuard<'_, foldhash::HashMap<AdvisoryId, Arc<AsyncMutex<()>>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entry(&self, id: AdvisoryId) -> Arc<AsyncMutex<()>> {
        Arc::clone(self.map().entry(id).or_default())
    }

    /// Passes the gate of `id` at once, or `None` if a local contender is in.
    pub(crate) fn try_enter(self: &Arc<Self>, id: AdvisoryId) -> Option<Gate> {
        let guard = self.entry(id).try_lock_owned().ok();
        match guard {
            Some(guard) => Some(Gate {
                gates: Arc::clone(self),
                id,
                guard: Some(guard),
            }),
            None => {
                self.tidy(id);
                None
            }
        }
    }

    /// Waits (first come, first served) to pass the gate of `id` until `deadline`.
    pub(crate) async fn enter_until(
        self: &Arc<Self>,
        id: AdvisoryId,
        deadline: Instant,
    ) -> Option<Gate> {
        let m = self.entry(id);
        // The guard drops the queued lock future first and then tidies, also when this future
        // is dropped while queued.
        let mut waiting = Waiting {
            gates: self,
            id,
            fut: Some(Box::pin(tokio::time::timeout_at(deadline, m.lock_owned()))),
        };
        let guard = match waiting.fut.as_mut() {
            Some(fut) => fut.await.ok(),
            None => None,
        };
        drop(waiting);
        guard.map(|guard| Gate {
            gates: Arc::clone(self),
            id,
            guard: Some(guard),
        })
    }

    /// Removes the entry of `id` when nobody holds or waits for it.
    fn tidy(&self, id: AdvisoryId) {
        let mut map = self.map();
        if map.get(&id).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&id);
        }
    }

    /// How many keys have a gate entry (held or waited for): for tests of the cleanup.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

struct Waiting<'a, F> {
    gates: &'a Gates,
    id: AdvisoryId,
    fut: Option<Pin<Box<F>>>,
}

impl<F> Drop for Waiting<'_, F> {
    fn drop(&mut self) {
        drop(self.fut.take());
        self.gates.tidy(self.id);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.gates.tidy(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_local_holder_and_no_leftover_entries() {
        let gates = Arc::new(Gates::default());
        let a = gates.try_enter(AdvisoryId::Big(1));
        assert!(a.is_some());
        assert!(gates.try_enter(AdvisoryId::Big(1)).is_none());
        assert!(gates.try_enter(AdvisoryId::Big(2)).is_some());
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(gates.enter_until(AdvisoryId::Big(1), soon).await.is_none());
        let waiter = {
            let gates = Arc::clone(&gates);
            tokio::spawn(async move {
                gates
                    .enter_until(AdvisoryId::Big(1), Instant::now() + Duration::from_secs(5))
                    .await
                    .is_some()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(a);
        assert!(waiter.await.unwrap_or(false));
        assert_eq!(gates.len(), 0);
    }
}
