//! The in-memory backend's permit view: semaphores within one process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{ExtendRequest, Grant, Held, HolderInfo, LockBackend, LockRequest, Waited};
use crate::caps::Capabilities;
use crate::error::Error;
use crate::key::LockKey;
use crate::semaphore::{PermitBackend, PermitLimit, limit_mismatch};
use crate::token::{FencingToken, Owner};
use crate::validity::Validity;

/// The permits of every semaphore of one [`MemoryBackend`](crate::MemoryBackend), shared by its
/// clones and by every view made from them; the backend keeps its locks in a table of their own
/// (one permit per key).
#[derive(Debug, Default)]
pub(crate) struct PermitTable {
    slots: Mutex<HashMap<LockKey, Slot>>,
    fence: AtomicU64,
}

#[derive(Debug)]
struct Slot {
    /// The limit the slot's holders and waiters agreed on; reset when the slot is tidied away.
    limit: PermitLimit,
    holders: Vec<Holder>,
    released: Arc<Notify>,
    waiters: usize,
}

#[derive(Debug, Clone)]
struct Holder {
    owner: Owner,
    fencing: FencingToken,
    expires: Instant,
}

impl Slot {
    fn sweep(&mut self, now: Instant) {
        self.holders.retain(|h| now < h.expires);
    }
}

/// [`MemoryBackend::semaphore`](crate::LockBackend::semaphore)'s view: at most `limit` holders
/// of a key among the users of one backend.
///
/// - Permits are exact within the process, like the backend's locks, and expire by TTL on
///   Tokio's clock.
/// - Tokens come from one counter for every semaphore of the backend: they strictly increase
///   per key across all grants.
/// - Waiters are woken when a permit is released or its holder's TTL runs out.
/// - The limit lives with the key while anyone holds or waits for a permit; a view with
///   another limit is refused ([`limit_mismatch`]) until the key is free again.
#[derive(Debug, Clone)]
pub struct MemoryPermits {
    table: Arc<PermitTable>,
    limit: PermitLimit,
    caps: Capabilities,
}

impl MemoryPermits {
    pub(crate) fn new(table: Arc<PermitTable>, limit: PermitLimit, caps: Capabilities) -> Self {
        let caps = caps.without_primitives();
        Self { table, limit, caps }
    }

    /// How many permits are held right now, over every key (the leak check).
    pub fn held_count(&self) -> usize {
        let now = Instant::now();
        self.slots()
            .values()
            .map(|s| s.holders.iter().filter(|h| now < h.expires).count())
            .sum()
    }

    /// How many keys have a slot (held, or waited on): nothing is left behind once none is.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.slots().len()
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<LockKey, Slot>> {
        // No code path panics while holding the lock; recover the map if one ever did.
        self.table
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot of `key`, made or checked against our limit: the caller holds the map.
    fn slot<'m>(
        &self,
        slots: &'m mut HashMap<LockKey, Slot>,
        key: &LockKey,
        now: Instant,
    ) -> Result<&'m mut Slot, Error> {
        let slot = slots.entry(key.clone()).or_insert_with(|| Slot {
            limit: self.limit,
            holders: Vec::new(),
            released: Arc::new(Notify::new()),
            waiters: 0,
        });
        slot.sweep(now);
        if slot.holders.is_empty() && slot.waiters == 0 {
            slot.limit = self.limit;
        }
        if slot.limit != self.limit {
            return Err(limit_mismatch(
                self.caps.name,
                key,
                slot.limit.get(),
                self.limit.get(),
            ));
        }
        Ok(slot)
    }

    /// The synchronous core of `try_lock`: a grant, or when the first permit expires.
    fn take(&self, req: &LockRequest<'_>) -> Result<Result<Grant, Instant>, Error> {
        let now = Instant::now();
        let mut slots = self.slots();
        let slot = self.slot(&mut slots, req.key, now)?;
        if slot.holders.len() >= self.limit.get() as usize {
            let first = slot.holders.iter().map(|h| h.expires).min();
            return Ok(Err(first.unwrap_or(now)));
        }
        let fencing = FencingToken::new(self.table.fence.fetch_add(1, Ordering::Relaxed) + 1);
        slot.holders.push(Holder {
            owner: req.owner.clone(),
            fencing,
            expires: now + req.ttl,
        });
        Ok(Ok(Grant::new(req.ttl_validity()).with_fencing(fencing)))
    }

    /// Removes `key`'s slot if nobody holds or waits on it.
    fn tidy(slots: &mut HashMap<LockKey, Slot>, key: &LockKey, now: Instant) {
        if let Some(slot) = slots.get_mut(key) {
            slot.sweep(now);
            if slot.waiters == 0 && slot.holders.is_empty() {
                slots.remove(key);
            }
        }
    }

    fn live(&self, key: &LockKey) -> Vec<HolderInfo> {
        let now = Instant::now();
        let slots = self.slots();
        let mut holders: Vec<_> = slots
            .get(key)
            .map(|s| s.holders.iter().filter(|h| now < h.expires).collect())
            .unwrap_or_default();
        holders.sort_by_key(|h| h.fencing);
        holders
            .into_iter()
            .map(|h| {
                HolderInfo::unknown()
                    .with_owner(h.owner.clone())
                    .with_fencing(h.fencing)
                    .with_remaining(h.expires.saturating_duration_since(now))
            })
            .collect()
    }
}

/// Keeps a slot alive while a waiter waits on it.
struct WaiterGuard<'a> {
    view: &'a MemoryPermits,
    key: &'a LockKey,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        let mut slots = self.view.slots();
        if let Some(slot) = slots.get_mut(self.key) {
            slot.waiters = slot.waiters.saturating_sub(1);
        }
        MemoryPermits::tidy(&mut slots, self.key, Instant::now());
    }
}

#[async_trait]
impl LockBackend for MemoryPermits {
    crate::refuse_primitives!("a permit view is already a semaphore");

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let grant = self.take(&req)?.ok();
        if grant.is_none() {
            Self::tidy(&mut self.slots(), req.key, Instant::now());
        }
        Ok(grant)
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let released = {
            let mut slots = self.slots();
            let slot = self.slot(&mut slots, req.key, Instant::now())?;
            slot.waiters += 1;
            Arc::clone(&slot.released)
        };
        let _guard = WaiterGuard {
            view: self,
            key: req.key,
        };
        let mut attempts = 0;
        loop {
            // Register for the wake-up before looking, so a release in between is not missed.
            let notified = released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            attempts += 1;
            let req = LockRequest::new(req.key, req.owner, req.ttl, Instant::now(), req.monitor);
            match self.take(&req)? {
                Ok(grant) => return Ok(Waited::new(Some(grant), attempts)),
                Err(expires) => {
                    if Instant::now() >= deadline {
                        return Ok(Waited::new(None, attempts));
                    }
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(expires.min(deadline)) => {}
                    }
                }
            }
        }
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let now = Instant::now();
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(held.key) else {
            return Ok(false);
        };
        let Some(at) = slot.holders.iter().position(|h| h.owner == *held.owner) else {
            return Ok(false);
        };
        let live = now < slot.holders.swap_remove(at).expires;
        slot.released.notify_waiters();
        Self::tidy(&mut slots, held.key, now);
        Ok(live)
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let now = Instant::now();
        let mut slots = self.slots();
        let holder = slots.get_mut(req.held.key).and_then(|s| {
            s.holders
                .iter_mut()
                .find(|h| h.owner == *req.held.owner && now < h.expires)
        });
        Ok(holder.map(|h| {
            h.expires = now + req.ttl;
            req.ttl_validity()
        }))
    }

    /// No batch request here: each permit in turn.
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<crate::Extended> {
        crate::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        Ok(self.live(key).into_iter().next())
    }
}

#[async_trait]
impl PermitBackend for MemoryPermits {
    fn limit(&self) -> PermitLimit {
        self.limit
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error> {
        Ok(self.live(key))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{ErrorKind, LockOptions, MemoryBackend, Renewal, Semaphore};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn n_holders_then_none_and_expiry_frees_a_permit() -> Result<(), Error> {
        let sem = Semaphore::new(MemoryBackend::new(), 2)?.with_options(
            LockOptions::default()
                .with_ttl(Duration::from_secs(1))
                .with_renewal(Renewal::Off),
        )?;
        let a = sem.try_acquire("k").await?;
        let b = sem.try_acquire("k").await?;
        assert!(a.is_some() && b.is_some());
        assert!(sem.try_acquire("k").await?.is_none());
        assert_eq!(sem.holders("k").await?.len(), 2);
        tokio::time::advance(Duration::from_millis(1_001)).await;
        let c = sem.try_acquire("k").await?;
        assert!(c.is_some(), "an expired permit is free again");
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn another_limit_is_refused_while_the_key_is_in_use() -> Result<(), Error> {
        let backend = MemoryBackend::new();
        let three = Semaphore::new(backend.clone(), 3)?;
        let five = Semaphore::new(backend, 5)?;
        let a = three.try_acquire("k").await?;
        let err = five.try_acquire("k").await.err();
        assert_eq!(
            err.as_ref().map(Error::kind),
            Some(ErrorKind::InvalidConfig)
        );
        assert!(format!("{err:?}").contains("3 permits"), "{err:?}");
        drop(a);
        tokio::task::yield_now().await;
        assert!(
            five.try_acquire("k").await?.is_some(),
            "a free key takes any limit"
        );
        Ok(())
    }
}
