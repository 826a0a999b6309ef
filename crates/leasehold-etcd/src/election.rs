//! Elections on etcd, in the layout of etcd's own election recipe (the one `etcdctl elect`
//! and the v3election API use), so our candidates and theirs compete in one queue.
//!
//! Election `key` is the etcd election name [`election_name`](crate::election_name)
//! (`{prefix}%elect/{escaped key}`). Each candidate writes `{name}/{lease id in hex}` on its
//! lease (the session lease, or a lease of its own in per-lock mode) with its value; the
//! candidate whose key has the lowest create revision leads, and that create revision is its
//! term. The others wait for the deletion of their predecessor, exactly as for a lock (the
//! same queue code). Resigning deletes the leader's key; a crashed leader's key goes with its
//! lease. Observing watches the name's range.

use std::sync::Arc;

use etcd_client::{EventType, WatchOptions};
use leasehold_core::{
    Candidate, Capabilities, ElectionBackend, Error, ErrorKind, ExtendRequest, Grant, Held,
    HolderInfo, Leader, LockBackend, LockKey, LockRequest, Owner, ReleaseGate, Validity, Waited,
    async_trait,
};
use tokio::time::Instant;

use crate::NAME;
use crate::client::{Inner, checked_revision, first_created, token};
use crate::held::{EtcdGrant, confirm};
use crate::job::{Mode, first_holder, lock_under};

/// The election view of an etcd backend for one candidate.
pub(crate) struct EtcdElection {
    inner: Arc<Inner>,
    caps: Capabilities,
    candidate: Candidate,
    /// The candidate value as the queue code's "owner": the value our key carries.
    value: Owner,
}

impl std::fmt::Debug for EtcdElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdElection")
            .field("candidate", &self.candidate)
            .finish_non_exhaustive()
    }
}

impl EtcdElection {
    pub(crate) fn new(inner: Arc<Inner>, caps: Capabilities, candidate: Candidate) -> Self {
        let value = Owner::from_raw(candidate.as_str());
        Self {
            inner,
            caps: caps.without_primitives(),
            candidate,
            value,
        }
    }

    /// The range of `key`'s candidates: `{election name}/`.
    fn range(&self, key: &LockKey) -> String {
        format!("{}/", crate::election_name(&self.inner.config.prefix, key))
    }

    async fn campaign(&self, req: LockRequest<'_>, mode: Mode) -> Result<Option<Grant>, Error> {
        let ours = LockRequest::new(req.key, &self.value, req.ttl, req.started, req.monitor);
        lock_under(&self.inner, self.range(req.key).into_bytes(), ours, mode).await
    }

    /// The leader now, and the revision it was read at.
    async fn read(&self, key: &LockKey) -> Result<(Option<Leader>, i64), Error> {
        let resp = self
            .inner
            .get(
                "leader",
                self.range(key).into_bytes(),
                Some(first_created()),
            )
            .await
            .map_err(|e| e.into_core("leader"))?;
        let rev = checked_revision(resp.header().map_or(0, |h| h.revision()))?;
        let Some(kv) = resp.kvs().first() else {
            return Ok((None, rev));
        };
        let value = Candidate::new(String::from_utf8_lossy(kv.value())).map_err(|e| {
            Error::new(
                ErrorKind::Backend,
                NAME,
                format!("the leader's key holds no valid candidate value: {e}"),
            )
        })?;
        let term = token(kv.create_revision())?;
        Ok((Some(Leader::new(value, term)), rev))
    }

    /// Returns after the first change under `range` past revision `rev` (or the watch ends).
    async fn changed(&self, range: String, rev: i64) -> Result<(), etcd_client::Error> {
        let mut watch = self.inner.client.watch_client();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        let mut stream = watch.watch(range, Some(opts)).await?;
        while let Some(resp) = stream.message().await? {
            let events = resp.events();
            if resp.canceled()
                || events
                    .iter()
                    .any(|e| matches!(e.event_type(), EventType::Delete | EventType::Put))
            {
                break;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl LockBackend for EtcdElection {
    leasehold_core::refuse_primitives!("an election view gives leaderships only");

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.campaign(req, Mode::Try).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let grant = self.campaign(req, Mode::Wait(deadline)).await?;
        Ok(Waited::new(grant, 1))
    }

    /// The lock backend's gate: its releases and these share the bound.
    fn release_gate(&self) -> Option<&ReleaseGate> {
        Some(&self.inner.releases)
    }

    /// Without the grant's state there is nothing to do: the campaign's own task deletes what
    /// it wrote when its caller is gone (candidate values are not unique, so we never delete
    /// by value).
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        match held.state::<EtcdGrant>() {
            Some(g) => g.release().await,
            None => Ok(false),
        }
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        match req.held.state::<EtcdGrant>() {
            Some(g) => {
                let session = Some(Arc::clone(&g.session));
                confirm(
                    &self.inner,
                    g.key.to_vec(),
                    g.owner.as_str(),
                    session,
                    req.ttl,
                )
                .await
            }
            None => Ok(None),
        }
    }

    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<leasehold_core::Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        first_holder(&self.inner, self.range(key)).await
    }
}

#[async_trait]
impl ElectionBackend for EtcdElection {
    fn candidate(&self) -> &Candidate {
        &self.candidate
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>, Error> {
        Ok(self.read(key).await?.0)
    }

    /// A native watch on the candidates' range: woken by any write there, then reads again.
    async fn observe(
        &self,
        key: &LockKey,
        last: Option<&Leader>,
        deadline: Instant,
    ) -> Result<Option<Leader>, Error> {
        loop {
            let (now, rev) = self.read(key).await?;
            if now.as_ref() != last || Instant::now() >= deadline {
                return Ok(now);
            }
            tokio::select! {
                r = self.changed(self.range(key), rev) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "leasehold.etcd: election watch failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}
