//! The backend: sessions, the idle pool, grants and their health checks.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use leasehold_core::{
    Capabilities, DEFAULT_MAX_TTL, Error, ErrorKind, ExtendRequest, FencingKind, FencingToken,
    Grant, Held, HolderInfo, LeaseMonitor, LockBackend, LockKey, LockRequest, RenewalKind,
    SafetyClass, Validity, WaitKind, Waited, async_trait,
};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::NAME;
use crate::config::PostgresConfig;
use crate::error::{is_lock_timeout, pg_error};
use crate::gate::{Gate, Gates};
use crate::key::{advisory_key, explicit_key};
use crate::probe::Probe;
use crate::session::{Canceller, Session};
use crate::watch::{Abandon, CONNECTION_ENDED, Watched, Watcher, lock};

/// How long a cleanup statement (the unlock after an abandoned try) may take before its
/// session is closed instead.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How far past the caller's deadline a native wait may run (the server's `lock_timeout` ends
/// it first) before the session counts as unresponsive and is closed.
const WAIT_GRACE: Duration = Duration::from_secs(5);
/// How many key → advisory-lock id mappings a backend remembers (then it starts over).
const ID_CACHE: usize = 1024;

/// Locks on PostgreSQL session-level advisory locks.
///
/// See the [crate documentation](crate) for the guarantees, the key mapping and cancellation.
/// Cheap to clone: clones share the sessions, the idle pool and the in-process gate.
#[derive(Clone)]
pub struct PostgresBackend {
    shared: Arc<Shared>,
}

struct Shared {
    cfg: PostgresConfig,
    seq_sql: String,
    /// Idle sessions with the instant each was returned, oldest first (reused from the end).
    idle: Mutex<Vec<(Session, Instant)>>,
    sequence_ready: OnceCell<()>,
    gates: Arc<Gates>,
    opened: AtomicU64,
    /// Whether the idle-session reaper runs (see [`Shared::start_reaper`]).
    reaper_started: AtomicBool,
    /// Advisory-lock ids of recently used keys (see [`PostgresBackend::lock_id`]).
    ids: Mutex<foldhash::HashMap<LockKey, i64>>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("config", &self.shared.cfg)
            .field("idle_sessions", &self.shared.idle().len())
            .field("sessions_opened", &self.sessions_opened())
            .finish()
    }
}

impl Shared {
    fn idle(&self) -> MutexGuard<'_, Vec<(Session, Instant)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ids(&self) -> MutexGuard<'_, foldhash::HashMap<LockKey, i64>> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle session that is still open, else a new one.
    async fn checkout(&self, allow_idle: bool) -> Result<Session, Error> {
        if allow_idle {
            loop {
                let Some((mut s, _)) = self.idle().pop() else {
                    break;
                };
                if !s.is_closed() {
                    s.fresh = false;
                    return Ok(s);
                }
            }
        }
        // Boxed: connecting (login, TLS, prepares) is a large future, which inline would make
        // every acquisition's future several KB to allocate and move (4.7 KB, against 1.5 KB
        // boxed), though a pooled session is the common case.
        let mut s = Box::pin(Session::open(
            &self.cfg,
            &self.seq_sql,
            &self.sequence_ready,
        ))
        .await?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        s.watcher = Some(Watcher::spawn(s.weak_probe(), s.closed(), &self.cfg));
        Ok(s)
    }

    /// Returns a session that holds no lock to the idle pool, and closes the idle sessions
    /// that went unused for the idle timeout or exceed `max_idle_sessions` (oldest first).
    fn checkin(self: &Arc<Self>, s: Session) {
        let now = Instant::now();
        let reuse = !s.is_closed();
        let closing = {
            let mut idle = self.idle();
            if reuse {
                idle.push((s, now));
            }
            self.expired(&mut idle, now)
        };
        drop(closing); // outside the lock: dropping a session closes its connection
        if reuse {
            self.start_reaper();
        }
    }

    /// Closes the idle sessions unused for the idle timeout, and the oldest ones beyond
    /// `max_idle_sessions`.
    fn prune(&self) {
        let closing = self.expired(&mut self.idle(), Instant::now());
        drop(closing); // outside the lock: dropping a session closes its connection
    }

    /// Takes out of `idle` the sessions unused for the idle timeout at `now`, and the oldest
    /// ones beyond `max_idle_sessions`, for the caller to drop outside the lock.
    fn expired(&self, idle: &mut Vec<(Session, Instant)>, now: Instant) -> Vec<(Session, Instant)> {
        let stale = idle
            .iter()
            .take_while(|(_, since)| now.duration_since(*since) > self.cfg.idle_timeout)
            .count();
        let excess = idle.len().saturating_sub(self.cfg.max_idle_sessions);
        match stale.max(excess) {
            0 => Vec::new(),
            n => idle.drain(..n).collect(),
        }
    }

    /// Starts, once per backend, the task that closes idle sessions past the idle timeout
    /// when no release comes to do it (the pool shrinks back after a burst even if the
    /// application goes quiet). It ends when the backend is dropped.
    fn start_reaper(self: &Arc<Self>) {
        // A plain load first: this runs on every release, the swap only once.
        if self.reaper_started.load(Ordering::Acquire)
            || self.reaper_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reaper_started.store(false, Ordering::Release);
            return;
        };
        let shared = Arc::downgrade(self);
        let every = (self.cfg.idle_timeout / 2).max(Duration::from_millis(100));
        drop(rt.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                shared.prune();
            }
        }));
    }

    fn window(&self) -> Duration {
        self.cfg.validity_window()
    }
}

impl PostgresBackend {
    /// A backend for `config`. Connects lazily, on the first acquisition.
    pub fn new(config: PostgresConfig) -> Self {
        let seq_sql = config.fence_sequence_sql();
        Self {
            shared: Arc::new(Shared {
                cfg: config,
                seq_sql,
                idle: Mutex::new(Vec::new()),
                sequence_ready: OnceCell::new(),
                gates: Arc::new(Gates::default()),
                opened: AtomicU64::new(0),
                reaper_started: AtomicBool::new(false),
                ids: Mutex::new(foldhash::HashMap::default()),
            }),
        }
    }

    /// A backend for `config`, checked by opening one session now (which also creates the
    /// fencing sequence if it is missing); the session is kept for reuse.
    pub async fn connect(config: PostgresConfig) -> Result<Self, Error> {
        let backend = Self::new(config);
        let s = backend.shared.checkout(false).await?;
        backend.shared.checkin(s);
        Ok(backend)
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.cfg
    }

    /// The advisory-lock key (`bigint`) this backend uses for `key`: the number itself for
    /// keys of the form `advisory:<i64>`, else [`advisory_key`](crate::advisory_key)`(prefix + key)`.
    pub fn lock_id(&self, key: &LockKey) -> i64 {
        // The derivation is two HMAC-SHA256s (some 28k instructions, more than the rest of a
        // lock cycle on the client): remember the ids of recently used keys.
        if let Some(id) = self.shared.ids().get(key) {
            return *id;
        }
        let id = match explicit_key(key) {
            Some(id) => id,
            None if self.shared.cfg.prefix.is_empty() => advisory_key(key.as_str()),
            None => advisory_key(&format!("{}{}", self.shared.cfg.prefix, key.as_str())),
        };
        let mut ids = self.shared.ids();
        if ids.len() >= ID_CACHE {
            ids.clear();
        }
        ids.insert(key.clone(), id);
        id
    }

    /// How many sessions this backend has opened so far (for measurements and tests).
    pub fn sessions_opened(&self) -> u64 {
        self.shared.opened.load(Ordering::Relaxed)
    }

    /// How many idle sessions are kept right now.
    pub fn idle_sessions(&self) -> usize {
        self.shared.idle().len()
    }

    /// Runs `f` on a session, retrying once on a fresh session if a pooled one turns out to be
    /// closed (after a server restart the pool holds dead sessions; a closed session holds no
    /// lock, so retrying cannot double-grant).
    ///
    /// `asked`: when the caller's request began (before the gate and the checkout); on a
    /// pooled session it serves as the instant the statement left, which it precedes by
    /// microseconds (a validity counted from earlier is only more cautious). After a fresh
    /// connect, the clock is read again.
    async fn one_try(&self, id: i64, gate: Gate, asked: Instant) -> Result<TryOutcome, Error> {
        let mut gate = Some(gate);
        let mut allow_idle = true;
        loop {
            let session = self.shared.checkout(allow_idle).await?;
            let fresh = session.fresh;
            let mut pending = Pending {
                shared: Arc::clone(&self.shared),
                session: Some(session),
                gate: gate.take(),
                id,
            };
            // The validity starts when the lock statement leaves, not before a connect that
            // may have preceded it: the grant's life is tied to this session only.
            let sent = if fresh { Instant::now() } else { asked };
            let r = match pending.session.as_ref() {
                Some(s) => s.try_lock(id).await,
                None => return Err(internal("session vanished")),
            };
            let Some((session, g)) = pending.defuse() else {
                return Err(internal("session vanished"));
            };
            match r {
                Ok(Some(token)) => {
                    let token = match u64::try_from(token) {
                        Ok(t) if t > 0 => FencingToken::new(t),
                        _ => {
                            // Closing the session drops the lock it just took.
                            return Err(internal(
                                "the fencing sequence returned a non-positive value",
                            ));
                        }
                    };
                    return Ok(TryOutcome::Granted(session, g, token, sent));
                }
                Ok(None) => return Ok(TryOutcome::Busy(session, g)),
                Err(e) if e.is_closed() && !fresh => {
                    tracing::debug!("leasehold-postgres: pooled session was closed; reconnecting");
                    drop(session);
                    gate = g;
                    allow_idle = false;
                }
                Err(e) => return Err(pg_error("pg_try_advisory_lock", e)),
            }
        }
    }

    /// Builds the grant for a locked session and puts it under its session's health check.
    fn grant(
        &self,
        monitor: &LeaseMonitor,
        id: i64,
        session: Session,
        gate: Option<Gate>,
        token: FencingToken,
        from: Instant,
    ) -> Grant {
        let inner = Arc::new(GrantInner {
            id,
            session: Mutex::new(None),
            gate: Mutex::new(gate),
        });
        if let Some(w) = &session.watcher {
            let grant: Weak<GrantInner> = Arc::downgrade(&inner);
            w.watch(Watched {
                grant,
                monitor: monitor.clone(),
            });
        }
        let closed = session.is_closed();
        *lock(&inner.session) = Some(session);
        // The watcher reports a closed connection once and then ends: if the connection closed
        // before the grant was put on it (terminated right after the lock statement), nobody
        // else would report this loss. Whichever side takes the grant out of the slot reports.
        if closed {
            let watched = lock(&inner.session)
                .as_ref()
                .and_then(|s| s.watcher.as_ref())
                .and_then(|w| w.take(&inner));
            if let Some(watched) = watched {
                watched.lose(CONNECTION_ENDED.to_owned());
            }
        }
        Grant::new(Validity::new(from, self.shared.window()))
            .with_fencing(token)
            .with_state(PgGrant(inner))
    }
}

enum TryOutcome {
    /// Locked, with the token and the instant the statement was sent.
    Granted(Session, Option<Gate>, FencingToken, Instant),
    Busy(Session, Option<Gate>),
}

/// A try in flight. If the acquire future is dropped before the answer, the statement may
/// still take the lock; dropping this queues `pg_advisory_unlock` behind it on the same
/// connection (statements on one connection run in order), then returns the session to the
/// pool. Without a runtime the session is closed instead, which ends its locks too.
struct Pending {
    shared: Arc<Shared>,
    session: Option<Session>,
    gate: Option<Gate>,
    id: i64,
}

impl Pending {
    /// Takes the session back once the statement's answer is in.
    fn defuse(&mut self) -> Option<(Session, Option<Gate>)> {
        let s = self.session.take()?;
        Some((s, self.gate.take()))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let gate = self.gate.take();
        let shared = Arc::clone(&self.shared);
        let id = self.id;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(async move {
                match tokio::time::timeout(CLEANUP_TIMEOUT, session.unlock(id)).await {
                    Ok(Ok(_)) => shared.checkin(session),
                    _ => drop(session),
                }
                drop(gate);
            }));
        }
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

/// The backend-private state of a grant: the session holding the lock.
#[derive(Debug)]
struct PgGrant(Arc<GrantInner>);

#[derive(Debug)]
struct GrantInner {
    id: i64,
    session: Mutex<Option<Session>>,
    gate: Mutex<Option<Gate>>,
}

impl Abandon for GrantInner {
    /// The grant is gone: close its session (ending the lock if the server still has it) and
    /// let local contenders in.
    fn abandon(&self) {
        drop(self.take_session());
        drop(lock(&self.gate).take());
    }
}

impl GrantInner {
    /// Takes the session back from the grant, out of its health check.
    fn take_session(&self) -> Option<Session> {
        let session = lock(&self.session).take();
        if let Some(w) = session.as_ref().and_then(|s| s.watcher.as_ref()) {
            w.unwatch();
        }
        session
    }

    fn probe(&self) -> Option<Probe> {
        lock(&self.session).as_ref().map(Session::probe)
    }
}

fn internal(msg: &str) -> Error {
    Error::new(ErrorKind::Backend, NAME, msg)
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(SafetyClass::Correctness, FencingKind::Monotonic)
            .with_wait(WaitKind::Native)
            .with_renewal(RenewalKind::Session)
            .with_ttl_range(
                self.shared.window(),
                DEFAULT_MAX_TTL.max(self.shared.window()),
            )
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let id = self.lock_id(req.key);
        let Some(gate) = self.shared.gates.try_enter(id) else {
            return Ok(None);
        };
        match self.one_try(id, gate, req.started).await? {
            TryOutcome::Granted(s, g, token, sent) => {
                Ok(Some(self.grant(req.monitor, id, s, g, token, sent)))
            }
            TryOutcome::Busy(s, g) => {
                self.shared.checkin(s);
                drop(g);
                Ok(None)
            }
        }
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let id = self.lock_id(req.key);
        let Some(gate) = self.shared.gates.enter_until(id, deadline).await else {
            return Ok(Waited::new(None, 1));
        };
        // First a try: one round trip when the lock is free.
        let (session, gate) = match self.one_try(id, gate, req.started).await? {
            TryOutcome::Granted(s, g, token, sent) => {
                let grant = self.grant(req.monitor, id, s, g, token, sent);
                return Ok(Waited::new(Some(grant), 1));
            }
            TryOutcome::Busy(s, g) => (s, g),
        };
        let now = Instant::now();
        let remaining = deadline.saturating_duration_since(now);
        // Round up: a budget of 0.3 ms still waits 1 ms, never "0 = forever".
        let ms = u64::try_from(remaining.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        if remaining.is_zero() || ms == 0 {
            self.shared.checkin(session);
            return Ok(Waited::new(None, 1));
        }
        let mut cancel = CancelOnDrop(Some(session.canceller()));
        let give_up = deadline.checked_add(WAIT_GRACE).unwrap_or(deadline);
        let waited = tokio::time::timeout_at(give_up, session.wait_lock(id, ms)).await;
        match waited {
            Ok(Ok(())) => {
                cancel.0 = None;
                // Granted; the token's round trip starts the validity: the wait itself may have
                // lasted longer than the window. If this future is dropped now, the session is
                // closed, which releases the lock.
                let started = Instant::now();
                match session.nextval().await {
                    Ok(token) => match u64::try_from(token) {
                        Ok(t) if t > 0 => {
                            let token = FencingToken::new(t);
                            let grant = self.grant(req.monitor, id, session, gate, token, started);
                            Ok(Waited::new(Some(grant), 2))
                        }
                        _ => Err(internal(
                            "the fencing sequence returned a non-positive value",
                        )),
                    },
                    Err(e) => Err(pg_error("nextval", e)),
                }
            }
            Ok(Err(e)) if is_lock_timeout(&e) => {
                // Not granted (the server's timeout and a grant are exclusive); the session is
                // clean: the aborted implicit transaction rolled the SET back.
                cancel.0 = None;
                self.shared.checkin(session);
                drop(gate);
                Ok(Waited::new(None, 2))
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

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        // No state: an acquisition whose outcome the Locker never saw. Our own guards already
        // unlocked or closed its session (see `Pending` and `CancelOnDrop`).
        let Some(PgGrant(inner)) = held.state::<PgGrant>() else {
            return Ok(false);
        };
        let Some(session) = inner.take_session() else {
            // Already released, or lost and closed by the health check.
            drop(lock(&inner.gate).take());
            return Ok(false);
        };
        if session.is_closed() {
            drop(lock(&inner.gate).take());
            return Ok(false);
        }
        // If this future is dropped mid-statement, `session` is dropped and closed: the server
        // then ends the lock with the session.
        let result = session.unlock(inner.id).await;
        match result {
            Ok(true) => {
                self.shared.checkin(session);
                drop(lock(&inner.gate).take());
                Ok(true)
            }
            Ok(false) => {
                // The session did not hold it (someone ran pg_advisory_unlock_all on it?):
                // don't reuse a session in an unknown state.
                drop(session);
                drop(lock(&inner.gate).take());
                Ok(false)
            }
            Err(e) => {
                drop(session);
                drop(lock(&inner.gate).take());
                Err(pg_error(
                    "pg_advisory_unlock (the session was closed, which ends the lock)",
                    e,
                ))
            }
        }
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let Some(PgGrant(inner)) = req.held.state::<PgGrant>() else {
            return Ok(None);
        };
        let Some(probe) = inner.probe() else {
            return Ok(None);
        };
        if probe.is_closed() {
            return Ok(None);
        }
        match tokio::time::timeout(self.shared.cfg.health_timeout, probe.ping()).await {
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
        let session = self.shared.checkout(true).await?;
        let pid = session
            .holder_pid(id)
            .await
            .map_err(|e| pg_error("pg_locks", e))?;
        self.shared.checkin(session);
        Ok(pid.map(|pid| {
            HolderInfo::unknown()
                .with_detail(format!("advisory lock {id} held by backend pid {pid}"))
        }))
    }
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
        let numeric = crate::numeric_key(-42);
        assert_eq!(backend.lock_id(&numeric), -42);
        assert_eq!(backend.lock_id(&numeric), -42);
    }
}
