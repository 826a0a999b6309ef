//! The [`LockBackend`] implementation of [`PostgresBackend`]: locks, the permit view and the
//! election view.

use std::sync::Arc;

use leasehold_core::{
    Candidate, Capabilities, DEFAULT_MAX_TTL, ElectionBackend, Error, ErrorKind, ExtendRequest,
    Extended, FencingKind, Grant, Held, HolderInfo, LockBackend, LockKey, LockRequest,
    PermitBackend, PermitLimit, ReleaseGate, RenewalKind, SafetyClass, Validity, WaitKind, Waited,
    async_trait,
};
use tokio::time::Instant;

use crate::NAME;
use crate::backend::PostgresBackend;
use crate::election::{Advisory, PgElection};
use crate::error::pg_error;
use crate::grant::PgGrant;
use crate::key::AdvisoryId;
use crate::permits::PostgresPermits;
use crate::pool::Pool;
use crate::watch::lock;

#[async_trait]
impl LockBackend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(NAME, SafetyClass::Correctness, FencingKind::Monotonic)
            .with_semaphores()
            .with_elections()
            .with_wait(WaitKind::Native)
            .with_renewal(RenewalKind::Session)
            .with_ttl_range(
                self.shared.window(),
                DEFAULT_MAX_TTL.max(self.shared.window()),
            )
            .with_crash_release(leasehold_core::CrashRelease::ProcessExit)
    }

    /// A [`PostgresPermits`] view on this backend's sessions.
    fn semaphore(self: Arc<Self>, limit: PermitLimit) -> Result<Arc<dyn PermitBackend>, Error> {
        Ok(Arc::new(PostgresPermits::new((*self).clone(), limit)))
    }

    /// An election view (`PgElection`) on this backend's sessions.
    fn election(self: Arc<Self>, candidate: Candidate) -> Result<Arc<dyn ElectionBackend>, Error> {
        Ok(Arc::new(PgElection::new((*self).clone(), candidate)))
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.try_at(AdvisoryId::Big(self.lock_id(req.key)), req)
            .await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        self.wait_at(AdvisoryId::Big(self.lock_id(req.key)), req, deadline)
            .await
    }

    fn release_gate(&self) -> Option<&ReleaseGate> {
        Some(&self.shared.releases)
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        // No state: an acquisition whose outcome the Locker never saw. Our own guards already
        // unlocked or closed its session (see `Unlocking` and `CancelOnDrop`).
        let Some(PgGrant(inner)) = held.state::<PgGrant>() else {
            return Ok(false);
        };
        inner.release().await
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let Some(PgGrant(inner)) = req.held.state::<PgGrant>() else {
            return Ok(None);
        };
        let Some(probe) = lock(&inner.held).as_ref().map(|on| on.session.probe()) else {
            return Ok(None);
        };
        if probe.is_closed() {
            return Ok(None);
        }
        let timeout = self.shared.pool.cfg.health_timeout;
        match tokio::time::timeout(timeout, probe.ping()).await {
            Ok(Ok(())) => Ok(Some(Validity::new(req.started, self.shared.window()))),
            Ok(Err(e)) if e.is_closed() => Ok(None),
            Ok(Err(e)) => Err(pg_error("health check", e)),
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                NAME,
                "health check timed out",
            )),
        }
    }

    /// No batch request here: each grant in turn.
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.holder_at(AdvisoryId::Big(self.lock_id(key))).await
    }
}

impl PostgresBackend {
    /// What `pg_locks` says of the holder of advisory key `id`.
    pub(crate) async fn holder_at(&self, id: AdvisoryId) -> Result<Option<HolderInfo>, Error> {
        let lent = self.shared.pool.shared(None).await?;
        let pid = lent
            .session
            .holder_pid(id)
            .await
            .map_err(|e| pg_error("pg_locks", e))?;
        drop(lent);
        Ok(pid.map(|pid| {
            HolderInfo::unknown()
                .with_detail(format!("advisory lock {id} held by backend pid {pid}"))
        }))
    }
}

#[async_trait]
impl Advisory for PostgresBackend {
    fn name(&self, key: &LockKey) -> String {
        format!("{}{}", self.shared.pool.cfg.prefix, key.as_str())
    }

    async fn try_at(&self, id: AdvisoryId, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        PostgresBackend::try_at(self, id, req).await
    }

    async fn wait_at(
        &self,
        id: AdvisoryId,
        req: LockRequest<'_>,
        deadline: Instant,
    ) -> Result<Waited, Error> {
        PostgresBackend::wait_at(self, id, req, deadline).await
    }

    async fn holder_at(&self, id: AdvisoryId) -> Result<Option<HolderInfo>, Error> {
        PostgresBackend::holder_at(self, id).await
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.shared.pool
    }
}
