//! The [`LockBackend`] implementation of [`PostgresBackend`]: locks, and the permit view.

use std::sync::Arc;

use leasehold_core::{
    Candidate, Capabilities, DEFAULT_MAX_TTL, ElectionBackend, Error, ErrorKind, ExtendRequest,
    FencingKind, Grant, Held, HolderInfo, LockBackend, LockKey, LockRequest, PermitBackend,
    PermitLimit, RenewalKind, SafetyClass, Validity, WaitKind, Waited, async_trait,
};
use tokio::time::Instant;

use crate::NAME;
use crate::backend::{POLL, PostgresBackend, TryOutcome, internal};
use crate::error::pg_error;
use crate::grant::PgGrant;
use crate::key::LockId;
use crate::permits::PostgresPermits;
use crate::watch::lock;

#[async_trait]
impl LockBackend for PostgresBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(NAME, SafetyClass::Correctness, FencingKind::Monotonic)
            .with_wait(WaitKind::Native)
            .with_renewal(RenewalKind::Session)
            .with_ttl_range(
                self.shared.window(),
                DEFAULT_MAX_TTL.max(self.shared.window()),
            )
            .with_semaphores()
    }

    /// A [`PostgresPermits`] view on this backend's sessions.
    fn semaphore(self: Arc<Self>, limit: PermitLimit) -> Result<Arc<dyn PermitBackend>, Error> {
        Ok(Arc::new(PostgresPermits::new((*self).clone(), limit)))
    }

    fn election(self: Arc<Self>, _candidate: Candidate) -> Result<Arc<dyn ElectionBackend>, Error> {
        Err(Error::unsupported_primitive(
            NAME,
            "elections",
            "not built yet",
        ))
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let id = self.lock_id(req.key);
        let Some(gate) = self.shared.gates.try_enter(id) else {
            return Ok(None);
        };
        match self
            .one_try(LockId::Key(id), gate, req.started, None)
            .await?
        {
            TryOutcome::Granted(on, g, token, sent) => Ok(Some(self.grant(
                req.monitor,
                LockId::Key(id),
                on,
                g,
                token,
                sent,
            ))),
            TryOutcome::Busy(_) => Ok(None),
        }
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let id = self.lock_id(req.key);
        let Some(gate) = self.shared.gates.enter_until(id, deadline).await else {
            return Ok(Waited::new(None, 1));
        };
        let mut gate = Some(gate);
        let mut attempts = 0;
        loop {
            // A try first: one round trip when the lock is free.
            let Some(g) = gate.take() else {
                return Err(internal("gate vanished"));
            };
            attempts += 1;
            match self
                .one_try(LockId::Key(id), g, req.started, Some(deadline))
                .await?
            {
                TryOutcome::Granted(on, g, token, sent) => {
                    let grant = self.grant(req.monitor, LockId::Key(id), on, g, token, sent);
                    return Ok(Waited::new(Some(grant), attempts));
                }
                TryOutcome::Busy(g) => gate = g,
            }
            if Instant::now() >= deadline {
                return Ok(Waited::new(None, attempts));
            }
            // Then the server's fair queue, on a session lent whole if one is free.
            if let Some(lent) = self.shared.pool.exclusive().await? {
                attempts += 1;
                return Ok(match self.server_wait(lent, id, deadline).await? {
                    Some((on, token, started)) => {
                        let grant =
                            self.grant(req.monitor, LockId::Key(id), on, gate, token, started);
                        Waited::new(Some(grant), attempts)
                    }
                    None => Waited::new(None, attempts),
                });
            }
            // Every session carries locks or a wait: poll with backoff (jittered so that
            // pollers do not move in step) and look for a free session again.
            let pause = POLL
                .delay(attempts)
                .min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
        }
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
    async fn extend_many(
        &self,
        reqs: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<Result<Option<leasehold_core::Validity>, leasehold_core::Error>> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let id = self.lock_id(key);
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
