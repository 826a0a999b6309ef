//! Semaphores on etcd: [`EtcdPermits`], the permit view of an [`EtcdBackend`](crate::EtcdBackend).
//!
//! Semaphore `key` is the range [`semaphore_prefix`](crate::semaphore_prefix)
//! (`{prefix}%sem/{escaped key}/`). Each permit request puts one key
//! `{range}{lease id in hex}_{owner}` on its lease (the session lease, or a lease of its own in
//! per-lock mode) with its owner value; the `limit` keys with the **lowest create revisions**
//! under the range hold permits, and a permit's fencing token is its key's create revision.
//! A waiter watches the deletion of the `limit` keys created just before its own (one watch
//! stream): it holds once fewer than `limit` older keys remain, and only a release among those
//! can make that so, so a release wakes at most `limit` waiters, never the whole queue.
//! Waiters are served in the order they queued. Releasing, dropping and cancelling delete the
//! key as for a lock; a lost session lease deletes every key on it and fires the lost signal
//! of every permit it carried.
//!
//! The limit is stored in [`semaphore_limit_key`](crate::semaphore_limit_key)
//! (`{prefix}%sem/{escaped key}`, no lease): a client that finds the range empty writes its
//! limit there in the same transaction as its key; every other client joins only if the stored
//! limit is its own, and is refused ([`limit_mismatch`](leasehold_core::semaphore::limit_mismatch))
//! otherwise. Once every permit is released (or gone with its lease) and nobody waits, the
//! next client may set another limit. The limit key stays behind, as one small key per
//! semaphore name (`etcdctl del` removes it when nobody uses the semaphore).

use std::sync::Arc;

use leasehold_core::{
    Capabilities, Error, ExtendRequest, Grant, Held, HolderInfo, LockBackend, LockKey, LockRequest,
    PermitBackend, PermitLimit, ReleaseGate, Validity, Waited, async_trait,
};
use tokio::time::Instant;

use crate::client::Inner;
use crate::job::{Limit, Mode, Queue, first_holder, holders, queue_under};

/// The permit view of an etcd backend: grants are permits of semaphores of `limit` permits.
pub(crate) struct EtcdPermits {
    inner: Arc<Inner>,
    caps: Capabilities,
    limit: PermitLimit,
}

impl std::fmt::Debug for EtcdPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdPermits")
            .field("limit", &self.limit.get())
            .finish_non_exhaustive()
    }
}

impl EtcdPermits {
    /// A view declares no primitives of its own (permits of permits are not a thing).
    pub(crate) fn new(inner: Arc<Inner>, caps: Capabilities, limit: PermitLimit) -> Self {
        let caps = caps.without_primitives();
        Self { inner, caps, limit }
    }

    /// The range of `key`'s permit requests.
    fn range(&self, key: &LockKey) -> String {
        crate::semaphore_prefix(&self.inner.config.prefix, key)
    }

    async fn take(&self, req: LockRequest<'_>, mode: Mode) -> Result<Option<Grant>, Error> {
        let limit = Limit {
            key: req.key.clone(),
            permits: self.limit.get(),
            stored_at: crate::semaphore_limit_key(&self.inner.config.prefix, req.key).into_bytes(),
        };
        let range = self.range(req.key).into_bytes();
        queue_under(&self.inner, range, Queue::Permits(limit), req, mode).await
    }
}

#[async_trait]
impl LockBackend for EtcdPermits {
    leasehold_core::refuse_primitives!("a permit view gives permits only");

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.take(req, Mode::Try).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let grant = self.take(req, Mode::Wait(deadline)).await?;
        Ok(Waited::new(grant, 1))
    }

    /// The lock backend's gate: its releases and these share the bound.
    fn release_gate(&self) -> Option<&ReleaseGate> {
        Some(&self.inner.releases)
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        crate::held::release(&self.inner, self.range(held.key), held).await
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        crate::held::extend(&self.inner, self.range(req.held.key), req).await
    }

    /// No batch request here: each grant in turn.
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<leasehold_core::Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    /// The oldest holder of a permit of `key`.
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        first_holder(&self.inner, self.range(key)).await
    }
}

#[async_trait]
impl PermitBackend for EtcdPermits {
    fn limit(&self) -> PermitLimit {
        self.limit
    }

    /// The `limit` oldest keys of the range (the keys after them are waiters).
    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error> {
        holders(&self.inner, self.range(key), self.limit.get()).await
    }
}
