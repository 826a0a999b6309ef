//! The backend: acquisitions on the pooled sessions and their grants (its `LockBackend`
//! implementation is in `lock_impl`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_core::{
    Backoff, Error, ErrorKind, FencingToken, Grant, LeaseMonitor, LockKey, LockRequest,
    ReleaseGate, Validity, Waited,
};
use tokio::time::Instant;

use crate::NAME;
use crate::config::PostgresConfig;
use crate::error::{is_lock_timeout, pg_error};
use crate::gate::{Gate, Gates};
use crate::grant::{GrantInner, OnSession, PgGrant, Unlocking};
use crate::key::{AdvisoryId, advisory_key, explicit_key};
use crate::pool::{Lent, Pool};
use crate::session::Canceller;
use crate::watch::{CONNECTION_ENDED, Watched};

/// How far past the caller's deadline a native wait may run (the server's `lock_timeout` ends
/// it first) before the session counts as unresponsive and is closed.
const WAIT_GRACE: Duration = Duration::from_secs(5);
/// How many key → advisory-lock id mappings a backend remembers (then it starts over).
const ID_CACHE: usize = 1024;
/// The pauses of a waiting acquisition that polls (no session was free for a wait in the
/// server): jittered, up to 4, 8, … 50 ms.
const POLL: Backoff = Backoff {
    initial: Duration::from_millis(4),
    max: Duration::from_millis(50),
};

/// Locks on PostgreSQL session-level advisory locks.
///
/// See the [crate documentation](crate) for the guarantees, the sessions, the key mapping and
/// cancellation. Cheap to clone: clones share the session pool and the in-process gate.
#[derive(Clone)]
pub struct PostgresBackend {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) pool: Arc<Pool>,
    pub(crate) gates: Arc<Gates>,
    /// Names the grants in their sessions' health checks.
    next_grant: AtomicU64,
    /// Advisory-lock ids of recently used keys (see [`PostgresBackend::lock_id`]).
    ids: Mutex<foldhash::HashMap<LockKey, i64>>,
    pub(crate) releases: ReleaseGate,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("config", &self.shared.pool.cfg)
            .field("sessions", &self.sessions())
            .field("sessions_opened", &self.sessions_opened())
            .finish()
    }
}

impl Shared {
    fn ids(&self) -> MutexGuard<'_, foldhash::HashMap<LockKey, i64>> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn window(&self) -> Duration {
        self.pool.cfg.validity_window()
    }
}

impl PostgresBackend {
    /// A backend for `config`. Connects lazily, on the first acquisition.
    pub fn new(config: PostgresConfig) -> Self {
        let releases = ReleaseGate::new(config.releases_in_flight);
        Self {
            shared: Arc::new(Shared {
                pool: Arc::new(Pool::new(config)),
                gates: Arc::new(Gates::default()),
                next_grant: AtomicU64::new(0),
                ids: Mutex::new(foldhash::HashMap::default()),
                releases,
            }),
        }
    }

    /// A backend for `config`, checked by opening one session now (which also creates the
    /// fencing sequence if it is missing); the session is kept for reuse.
    pub async fn connect(config: PostgresConfig) -> Result<Self, Error> {
        let backend = Self::new(config);
        drop(backend.shared.pool.shared(None).await?);
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.pool.cfg
    }

    /// The advisory-lock key (`bigint`) this backend uses for `key`:
    /// [`advisory_key`](crate::advisory_key)`(prefix + key)`, or, only where the configuration
    /// opts in (`advisory_keys=true`), the number itself for keys of the form `advisory:<i64>`.
    pub fn lock_id(&self, key: &LockKey) -> i64 {
        // The derivation is two HMAC-SHA256s (some 28k instructions, more than the rest of a
        // lock cycle on the client): remember the ids of recently used keys.
        if let Some(id) = self.shared.ids().get(key) {
            return *id;
        }
        let cfg = &self.shared.pool.cfg;
        let id = derive_id(&cfg.prefix, cfg.advisory_keys, key);
        let mut ids = self.shared.ids();
        if ids.len() >= ID_CACHE {
            ids.clear();
        }
        ids.insert(key.clone(), id);
        id
    }

    /// How many sessions this backend has opened so far (for measurements and tests).
    pub fn sessions_opened(&self) -> u64 {
        self.shared.pool.opened()
    }

    /// How many sessions (server connections) this backend has open right now: at most
    /// `max_sessions`.
    pub fn sessions(&self) -> usize {
        self.shared.pool.sessions()
    }

    /// One `pg_try_advisory_lock` on a shared session, retried once on another session if the
    /// one lent turns out to be closed (after a server restart the pool holds dead sessions;
    /// a closed session holds no lock, so retrying cannot double-grant). `until`: how long to
    /// wait for a session when every one is lent whole (`None`: fail at once).
    ///
    /// The validity of a grant counts from the clock read after the checkout, just before the
    /// statement is sent: not from the caller's request, which may have waited at the gate,
    /// for a session, or between the polls of a wait (counting from there made a grant that
    /// came after such a wait look expired on arrival).
    async fn one_try(
        &self,
        id: AdvisoryId,
        gate: Gate,
        until: Option<Instant>,
    ) -> Result<TryOutcome, Error> {
        let mut gate = Some(gate);
        let mut tries = 0;
        loop {
            tries += 1;
            let lent = self.shared.pool.shared(until).await?;
            let fresh = lent.fresh;
            let sent = Instant::now();
            // If this future is dropped before the answer, the statement may still take the
            // lock: the guard then unlocks behind it on the same session.
            let mut pending = Unlocking {
                on: Some(OnSession::new(
                    Arc::clone(&self.shared.pool),
                    lent.slot,
                    Arc::clone(&lent.session),
                )),
                gate: gate.take(),
                id,
            };
            let r = lent.session.try_lock(id).await;
            let on = pending.on.take();
            let g = pending.gate.take();
            match r {
                Ok(Some(token)) => {
                    let Some(on) = on else {
                        return Err(internal("session vanished"));
                    };
                    let token = positive(token)?;
                    return Ok(TryOutcome::Granted(on, g, token, sent));
                }
                Ok(None) => return Ok(TryOutcome::Busy(g)),
                Err(e) if e.is_closed() && !fresh && tries < 2 => {
                    tracing::debug!("leasehold-postgres: pooled session was closed; reconnecting");
                    drop(on);
                    self.shared.pool.discard(lent.slot);
                    gate = g;
                }
                Err(e) => return Err(pg_error("pg_try_advisory_lock", e)),
            }
        }
    }

    /// Builds the grant for a lock on `on`'s session and puts it under that session's health
    /// check.
    fn grant(
        &self,
        monitor: &LeaseMonitor,
        id: AdvisoryId,
        on: OnSession,
        gate: Option<Gate>,
        token: FencingToken,
        from: Instant,
    ) -> Grant {
        let watch_id = self.shared.next_grant.fetch_add(1, Ordering::Relaxed);
        let session = Arc::clone(&on.session);
        let inner = Arc::new(GrantInner {
            id,
            watch_id,
            held: Mutex::new(Some(on)),
            gate: Mutex::new(gate),
        });
        if let Some(w) = &session.watcher {
            let grant: std::sync::Weak<GrantInner> = Arc::downgrade(&inner);
            w.watch(
                watch_id,
                Watched {
                    grant,
                    monitor: monitor.clone(),
                    since: from,
                },
            );
            // The check reports a lost session once and then ends: if the session was lost
            // before the grant was put on it (terminated right after the lock statement),
            // nobody else would report this loss. Whichever side takes the grant out reports.
            if (session.is_closed() || w.is_dead())
                && let Some(watched) = w.take(watch_id)
            {
                watched.lose(CONNECTION_ENDED);
            }
        }
        Grant::new(Validity::new(from, self.shared.window()))
            .with_fencing(token)
            .with_state(PgGrant(inner))
    }

    /// Waits in the server's queue (`pg_advisory_lock` under `lock_timeout`) on a session lent
    /// whole. `None`: the wait timed out, the lock is not ours.
    async fn server_wait(
        &self,
        lent: Lent,
        id: AdvisoryId,
        deadline: Instant,
    ) -> Result<Option<(OnSession, FencingToken, Instant)>, Error> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        // Round up: a budget of 0.3 ms still waits 1 ms, never "0 = forever".
        let ms = u64::try_from(remaining.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        if remaining.is_zero() || ms == 0 {
            return Ok(None);
        }
        // Dropped from here on, the lent session is closed (it carries nothing else): a
        // grant that won the race dies with it, and the cancel cannot hit a later statement.
        let mut lent = lent;
        lent.close = true;
        let mut cancel = CancelOnDrop(Some(lent.session.canceller()));
        let give_up = deadline.checked_add(WAIT_GRACE).unwrap_or(deadline);
        let waited = tokio::time::timeout_at(give_up, lent.session.wait_lock(id, ms)).await;
        match waited {
            Ok(Ok(())) => {
                cancel.0 = None;
                // Granted; the token's round trip starts the validity: the wait itself may have
                // lasted longer than the window. If this future is dropped now, the session is
                // closed, which releases the lock.
                let started = Instant::now();
                let token = lent
                    .session
                    .nextval()
                    .await
                    .map_err(|e| pg_error("nextval", e))?;
                let token = positive(token)?;
                let on = OnSession::new(
                    Arc::clone(&self.shared.pool),
                    lent.slot,
                    Arc::clone(&lent.session),
                );
                lent.close = false;
                Ok(Some((on, token, started)))
            }
            Ok(Err(e)) if is_lock_timeout(&e) => {
                // Not granted (the server's timeout and a grant are exclusive); the session is
                // clean: the aborted implicit transaction rolled the SET back.
                cancel.0 = None;
                lent.close = false;
                Ok(None)
            }
            Ok(Err(e)) => {
                cancel.0 = None;
                Err(pg_error("pg_advisory_lock", e))
            }
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                NAME,
                format!(
                    "the server did not end a lock wait within {WAIT_GRACE:?} of its lock_timeout"
                ),
            )),
        }
    }

    /// `try_lock` on advisory key `id` (either key space).
    pub(crate) async fn try_at(
        &self,
        id: AdvisoryId,
        req: LockRequest<'_>,
    ) -> Result<Option<Grant>, Error> {
        let Some(gate) = self.shared.gates.try_enter(id) else {
            return Ok(None);
        };
        match self.one_try(id, gate, None).await? {
            TryOutcome::Granted(on, g, token, sent) => {
                Ok(Some(self.grant(req.monitor, id, on, g, token, sent)))
            }
            TryOutcome::Busy(_) => Ok(None),
        }
    }

    /// `wait_lock` on advisory key `id` (either key space).
    pub(crate) async fn wait_at(
        &self,
        id: AdvisoryId,
        req: LockRequest<'_>,
        deadline: Instant,
    ) -> Result<Waited, Error> {
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
            match self.one_try(id, g, Some(deadline)).await? {
                TryOutcome::Granted(on, g, token, sent) => {
                    let grant = self.grant(req.monitor, id, on, g, token, sent);
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
                        let grant = self.grant(req.monitor, id, on, gate, token, started);
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
}

enum TryOutcome {
    /// Locked, with the token and the instant the statement was sent.
    Granted(OnSession, Option<Gate>, FencingToken, Instant),
    Busy(Option<Gate>),
}

/// The advisory-lock key of `key` under `prefix` (see "Key mapping" in the crate docs).
pub(crate) fn derive_id(prefix: &str, advisory_keys: bool, key: &LockKey) -> i64 {
    match explicit_key(key).filter(|_| advisory_keys) {
        Some(id) => id,
        None if prefix.is_empty() => advisory_key(key.as_str()),
        None => advisory_key(&format!("{prefix}{}", key.as_str())),
    }
}

/// The fencing token of a value the fence sequence returned: positive, or an error.
pub(crate) fn positive(token: i64) -> Result<FencingToken, Error> {
    match u64::try_from(token) {
        Ok(t) if t > 0 => Ok(FencingToken::new(t)),
        // The caller's guards close or unlock the session, which drops the lock just taken.
        _ => Err(internal(
            "the fencing sequence returned a non-positive value",
        )),
    }
}

/// Sends a cancel request for the session's running statement when dropped armed: a dropped
/// native wait must not stay queued on the server. The session itself is closed as well, so
/// the cancel cannot hit a later statement.
struct CancelOnDrop(Option<Canceller>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(canceller) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            drop(rt.spawn(async move {
                if let Err(e) = canceller.cancel().await {
                    tracing::debug!(error = %e, "leasehold-postgres: cancel request failed");
                }
            }));
        }
    }
}

pub(crate) fn internal(msg: &str) -> Error {
    Error::new(ErrorKind::Backend, NAME, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remembered ids are the derived ones, also for numeric keys and after the cache starts
    /// over; the cache stays bounded.
    #[test]
    fn remembered_lock_ids_equal_derived_ones() {
        let cfg = PostgresConfig::from_url("postgres://u@127.0.0.1/db")
            .and_then(|c| c.with_prefix("app/"))
            .unwrap();
        let backend = PostgresBackend::new(cfg);
        let keys: Vec<LockKey> = (0..2 * ID_CACHE + 7)
            .map(|i| LockKey::new(format!("job-{i}")).unwrap())
            .collect();
        for round in 0..2 {
            for key in &keys {
                let want = advisory_key(&format!("app/{}", key.as_str()));
                assert_eq!(backend.lock_id(key), want, "{key:?}, round {round}");
            }
            assert!(backend.shared.ids().len() <= ID_CACHE);
        }
        // Without the opt-in, `advisory:<n>` is a name like any other: hashed, prefixed.
        let numeric = crate::numeric_key(-42);
        assert_eq!(backend.lock_id(&numeric), advisory_key("app/advisory:-42"));
        let cfg = backend.config().clone().with_advisory_keys(true);
        let opted = PostgresBackend::new(cfg);
        assert_eq!(opted.lock_id(&numeric), -42);
        assert_eq!(opted.lock_id(&numeric), -42);
        let from_url =
            PostgresConfig::from_url("postgres://u@127.0.0.1/db?advisory_keys=true").unwrap();
        assert!(from_url.advisory_keys());
    }
}
