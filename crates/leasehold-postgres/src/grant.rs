//! A grant on a pooled session, and its release: retried with backoff within a bound, then in
//! the background until the lock is gone or its session is.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{Error, ErrorKind};

use crate::NAME;
use crate::gate::Gate;
use crate::key::AdvisoryId;
use crate::pool::Pool;
use crate::session::Session;
use crate::watch::{Abandon, lock};

/// How many times `release` sends `pg_advisory_unlock` before it hands the unlock to the
/// background and reports the failure.
const RELEASE_TRIES: u32 = 4;
/// The first pause between those tries (doubled each time: 10 + 20 + 40 ms).
const RELEASE_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between background retries.
const BACKGROUND_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The backend-private state of a grant: the session carrying the lock.
#[derive(Debug)]
pub(crate) struct PgGrant(pub(crate) Arc<GrantInner>);

#[derive(Debug)]
pub(crate) struct GrantInner {
    pub(crate) id: AdvisoryId,
    /// The grant's entry in its session's health check.
    pub(crate) watch_id: u64,
    pub(crate) held: Mutex<Option<OnSession>>,
    pub(crate) gate: Mutex<Option<Gate>>,
}

/// Where a lock lives: a session of the pool.
#[derive(Debug)]
pub(crate) struct OnSession {
    pub(crate) pool: Arc<Pool>,
    pub(crate) slot: u64,
    pub(crate) session: Arc<Session>,
}

impl OnSession {
    /// Counts a lock (or a lock that a statement in flight may take) on slot `slot`.
    pub(crate) fn new(pool: Arc<Pool>, slot: u64, session: Arc<Session>) -> Self {
        pool.add_grant(slot);
        Self {
            pool,
            slot,
            session,
        }
    }

    /// Whether the lock can still be on the session (it ends with the session).
    fn alive(&self) -> bool {
        !self.session.is_closed() && !self.session.watcher.as_ref().is_some_and(|w| w.is_dead())
    }
}

impl Drop for OnSession {
    fn drop(&mut self) {
        self.pool.remove_grant(self.slot);
    }
}

impl Abandon for GrantInner {
    /// The session was lost (and taken out of the pool): leave it and let local contenders in.
    fn abandon(&self) {
        drop(lock(&self.held).take());
        drop(lock(&self.gate).take());
    }
}

impl GrantInner {
    /// Takes the lock's session back from the grant, out of its health check.
    pub(crate) fn take(&self) -> Option<OnSession> {
        let on = lock(&self.held).take();
        if let Some(w) = on.as_ref().and_then(|o| o.session.watcher.as_ref()) {
            drop(w.take(self.watch_id));
        }
        on
    }

    /// Unlocks: `Ok(true)` if the session held the lock. A transient failure (the connection
    /// is up but the statement failed or the future was dropped) is retried, a few times here
    /// and then in the background, until the unlock succeeds or the session ends (which ends
    /// the lock); the gate opens only then, so no task of ours takes the key meanwhile.
    pub(crate) async fn release(&self) -> Result<bool, Error> {
        let gate = lock(&self.gate).take();
        let Some(on) = self.take() else {
            drop(gate); // already released, or lost with its session
            return Ok(false);
        };
        if !on.alive() {
            return Ok(false);
        }
        let mut unlocking = Unlocking {
            on: Some(on),
            gate,
            id: self.id,
        };
        let mut pause = RELEASE_BACKOFF;
        let mut last = None;
        for attempt in 1..=RELEASE_TRIES {
            let Some(on) = unlocking.on.as_ref() else {
                break;
            };
            match on.session.unlock(self.id).await {
                Ok(held) => {
                    unlocking.done();
                    return Ok(held);
                }
                // The connection ended: so did the lock.
                Err(e) if e.is_closed() => {
                    unlocking.done();
                    return Ok(false);
                }
                Err(e) => {
                    tracing::debug!(error = %e, attempt, "leasehold-postgres: unlock failed");
                    last = Some(e);
                }
            }
            if attempt < RELEASE_TRIES {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        drop(unlocking); // goes on in the background
        let err = Error::new(ErrorKind::Unavailable, NAME, UNLOCK_HANDED_OVER);
        Err(match last {
            Some(e) => err.with_source(e),
            None => err,
        })
    }
}

const UNLOCK_HANDED_OVER: &str = "pg_advisory_unlock kept failing; it is retried in the \
     background until the lock is gone or its session ends";

/// An unlock not yet known done. Dropped armed (a failed or dropped release, or an abandoned
/// try), it goes on in the background: retried with backoff until it succeeds or the session
/// ends; the gate opens then. With no runtime left, the session is taken out of the pool
/// instead: it closes (ending the lock) once its other locks are released.
pub(crate) struct Unlocking {
    pub(crate) on: Option<OnSession>,
    pub(crate) gate: Option<Gate>,
    pub(crate) id: AdvisoryId,
}

impl Unlocking {
    pub(crate) fn done(&mut self) {
        drop(self.on.take());
        drop(self.gate.take());
    }
}

impl Drop for Unlocking {
    fn drop(&mut self) {
        let Some(on) = self.on.take() else {
            return;
        };
        let gate = self.gate.take();
        let id = self.id;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(unlock_until_gone(on, gate, id))),
            Err(_) => on.pool.discard(on.slot),
        }
    }
}

/// Sends `pg_advisory_unlock` until it answers or the session ends.
async fn unlock_until_gone(on: OnSession, gate: Option<Gate>, id: AdvisoryId) {
    let mut pause = RELEASE_BACKOFF;
    while on.alive() {
        match on.session.unlock(id).await {
            Ok(_) => break,
            Err(e) if e.is_closed() => break,
            Err(e) => {
                tracing::debug!(error = %e, "leasehold-postgres: background unlock failed");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BACKGROUND_BACKOFF_MAX);
            }
        }
    }
    drop(on);
    drop(gate);
}
