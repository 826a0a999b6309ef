//! The bounded pool of lock sessions: at most `max_sessions` connections per backend, shared by
//! every lock of the backend, with one lent whole to a waiting acquisition when one is free.

use std::cmp::Reverse;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use leasehold_core::{Error, ErrorKind, metrics};
use tokio::sync::{Notify, OnceCell};
use tokio::time::Instant;

use crate::NAME;
use crate::config::PostgresConfig;
use crate::session::Session;
use crate::watch::Watcher;

/// The sessions of one backend.
pub(crate) struct Pool {
    pub(crate) cfg: PostgresConfig,
    seq_sql: String,
    sequence_ready: OnceCell<()>,
    state: Mutex<State>,
    /// Woken when a session leaves the pool or stops being lent whole.
    freed: Notify,
    opened: AtomicU64,
    /// Whether the idle-session reaper runs (see [`Pool::start_reaper`]).
    reaper_started: AtomicBool,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    /// Sessions being opened (they count against the bound already).
    opening: usize,
    next_id: u64,
}

struct Slot {
    id: u64,
    session: Arc<Session>,
    /// Locks the session carries.
    grants: usize,
    /// Statements (or a whole lending) in flight on it.
    busy: usize,
    /// Lent whole to a waiting acquisition: nothing else runs on it meanwhile.
    exclusive: bool,
    /// When it last became unused (no lock, nothing in flight).
    since: Instant,
}

impl Slot {
    fn unused(&self) -> bool {
        self.grants == 0 && self.busy == 0 && !self.exclusive
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("sessions", &self.sessions())
            .field("max_sessions", &self.cfg.max_sessions)
            .field("opened", &self.opened())
            .finish_non_exhaustive()
    }
}

/// A session lent out for statements (or, `exclusive`, whole); dropping it gives it back, and
/// with `close` set takes it out of the pool, which closes it once nothing else holds it.
pub(crate) struct Lent {
    pool: Arc<Pool>,
    pub(crate) slot: u64,
    pub(crate) session: Arc<Session>,
    /// Just opened for this lending (its statement's validity starts after the connect).
    pub(crate) fresh: bool,
    exclusive: bool,
    pub(crate) close: bool,
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.give_back(self.slot, self.exclusive, self.close);
    }
}

/// Counts a session being opened against the bound until it is in the pool (or failed, or the
/// opening future was dropped).
struct Opening<'a>(Option<&'a Pool>);

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if let Some(pool) = self.0.take() {
            pool.state().opening -= 1;
            metrics::pool_sessions(NAME, -1.0);
            pool.freed.notify_waiters();
        }
    }
}

/// The error when every session is lent whole to waiting acquisitions.
pub(crate) fn pool_full(max: usize) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        NAME,
        format!(
            "all {max} sessions of the pool (max_sessions) are in use by waiting acquisitions; \
             raise max_sessions or retry"
        ),
    )
}

impl Pool {
    pub(crate) fn new(cfg: PostgresConfig) -> Self {
        let seq_sql = cfg.fence_sequence_sql();
        Self {
            cfg,
            seq_sql,
            sequence_ready: OnceCell::new(),
            state: Mutex::new(State::default()),
            freed: Notify::new(),
            opened: AtomicU64::new(0),
            reaper_started: AtomicBool::new(false),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sessions open (or opening) now.
    pub(crate) fn sessions(&self) -> usize {
        let st = self.state();
        st.slots.len() + st.opening
    }

    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// A session for a statement: the open one with the fewest statements in flight (and,
    /// among those, the most locks, so locks gather and other sessions fall idle), or a new
    /// one if all are busy and the bound allows. When every session is lent whole, waits until
    /// `deadline` (`None`: not at all) for one, then fails [`ErrorKind::Unavailable`].
    pub(crate) async fn shared(self: &Arc<Self>, deadline: Option<Instant>) -> Result<Lent, Error> {
        // Counts this request among the pool's waiters from its first wait to its end.
        let mut waiting = None;
        loop {
            let notified = self.freed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let (closed, id, opening) = {
                let mut st = self.state();
                let closed = st.take_closed();
                let max = self.cfg.max_sessions;
                let total = st.slots.len() + st.opening;
                let best = st
                    .slots
                    .iter_mut()
                    .filter(|s| !s.exclusive)
                    .min_by_key(|s| (s.busy, Reverse(s.grants)));
                match best {
                    Some(s) if s.busy == 0 || total >= max => {
                        s.busy += 1;
                        return Ok(self.lent(s, false, false));
                    }
                    _ if total < max => (closed, Some(st.reserve()), 0),
                    _ => {
                        let opening = st.opening;
                        (closed, None, opening)
                    }
                }
            };
            drop(closed); // outside the lock: dropping a session closes its connection
            if let Some(id) = id {
                return self.open(id, false).await;
            }
            // Every session is lent whole or still being opened: wait for one (a session being
            // opened is ready within the connect timeout, so a try waits for that too).
            let full = || pool_full(self.cfg.max_sessions);
            waiting.get_or_insert_with(|| metrics::pool_wait(NAME));
            match deadline {
                Some(d) if Instant::now() < d => {
                    if tokio::time::timeout_at(d, notified).await.is_err() {
                        return Err(full());
                    }
                }
                None if opening > 0 => notified.await,
                _ => return Err(full()),
            }
        }
    }

    /// A session lent whole, for a wait in `pg_advisory_lock`: one that carries no lock and
    /// runs nothing, or a new one if the bound allows; `None` if neither.
    pub(crate) async fn exclusive(self: &Arc<Self>) -> Result<Option<Lent>, Error> {
        let (closed, id) = {
            let mut st = self.state();
            let closed = st.take_closed();
            let total = st.slots.len() + st.opening;
            if let Some(s) = st.slots.iter_mut().find(|s| s.unused()) {
                s.busy += 1;
                s.exclusive = true;
                return Ok(Some(self.lent(s, true, false)));
            }
            if total >= self.cfg.max_sessions {
                return Ok(None);
            }
            (closed, st.reserve())
        };
        drop(closed);
        self.open(id, true).await.map(Some)
    }

    fn lent(self: &Arc<Self>, s: &Slot, exclusive: bool, fresh: bool) -> Lent {
        Lent {
            pool: Arc::clone(self),
            slot: s.id,
            session: Arc::clone(&s.session),
            fresh,
            exclusive,
            close: false,
        }
    }

    /// Opens the session of slot `id` (already counted in `opening`) and lends it.
    async fn open(self: &Arc<Self>, id: u64, exclusive: bool) -> Result<Lent, Error> {
        let mut opening = Opening(Some(self));
        // Boxed: connecting (login, TLS, prepares) is a large future, which inline would make
        // every acquisition's future several KB to allocate and move, though a pooled session
        // is the common case.
        let mut s = Box::pin(Session::open(
            &self.cfg,
            &self.seq_sql,
            &self.sequence_ready,
        ))
        .await?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        let pool = Arc::downgrade(self);
        let on_lost = Box::new(move || {
            if let Some(pool) = pool.upgrade() {
                pool.discard(id);
            }
        });
        s.watcher = Some(Watcher::spawn(
            s.weak_probe(),
            s.closed(),
            &self.cfg,
            on_lost,
        ));
        let slot = Slot {
            id,
            session: Arc::new(s),
            grants: 0,
            busy: 1,
            exclusive,
            since: Instant::now(),
        };
        let lent = self.lent(&slot, exclusive, true);
        {
            let mut st = self.state();
            st.slots.push(slot);
            st.opening -= 1;
        }
        opening.0 = None;
        self.freed.notify_waiters();
        self.start_reaper();
        Ok(lent)
    }

    fn give_back(&self, id: u64, exclusive: bool, close: bool) {
        let removed = {
            let mut st = self.state();
            let now = Instant::now();
            let Some(pos) = st.slots.iter().position(|s| s.id == id) else {
                return;
            };
            let s = &mut st.slots[pos];
            s.busy = s.busy.saturating_sub(1);
            if exclusive {
                s.exclusive = false;
            }
            if s.unused() {
                s.since = now;
            }
            if close {
                metrics::pool_sessions(NAME, -1.0);
                Some(st.slots.swap_remove(pos))
            } else {
                None
            }
        };
        drop(removed);
        if exclusive || close {
            self.freed.notify_waiters();
        }
    }

    /// Takes slot `id` out of the pool (its session is lost or in an unknown state); the
    /// connection closes once the last lending or grant of it is gone.
    pub(crate) fn discard(&self, id: u64) {
        let removed = {
            let mut st = self.state();
            st.slots
                .iter()
                .position(|s| s.id == id)
                .map(|pos| st.slots.swap_remove(pos))
        };
        if removed.is_some() {
            metrics::pool_sessions(NAME, -1.0);
            drop(removed);
            self.freed.notify_waiters();
        }
    }

    /// A lock was put on slot `id`'s session.
    pub(crate) fn add_grant(&self, id: u64) {
        if let Some(s) = self.state().slots.iter_mut().find(|s| s.id == id) {
            s.grants += 1;
        }
    }

    /// A lock left slot `id`'s session (released, or lost with it).
    pub(crate) fn remove_grant(&self, id: u64) {
        let mut st = self.state();
        if let Some(s) = st.slots.iter_mut().find(|s| s.id == id) {
            s.grants = s.grants.saturating_sub(1);
            if s.unused() {
                s.since = Instant::now();
            }
        }
    }

    /// Closes the sessions that carried no lock and ran nothing for the idle timeout.
    fn prune(&self) {
        let now = Instant::now();
        let closing: Vec<Slot> = {
            let mut st = self.state();
            let mut closing = st.take_closed();
            let idle = self.cfg.idle_timeout;
            let mut i = 0;
            while i < st.slots.len() {
                let s = &st.slots[i];
                if s.unused() && now.duration_since(s.since) >= idle {
                    closing.push(st.slots.swap_remove(i));
                    metrics::pool_sessions(NAME, -1.0);
                } else {
                    i += 1;
                }
            }
            closing
        };
        if !closing.is_empty() {
            drop(closing);
            self.freed.notify_waiters();
        }
    }

    /// Starts, once per backend, the task that closes sessions unused for the idle timeout
    /// (the pool shrinks back after a burst even if the application goes quiet). It ends when
    /// the backend is dropped.
    fn start_reaper(self: &Arc<Self>) {
        if self.reaper_started.load(Ordering::Acquire)
            || self.reaper_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reaper_started.store(false, Ordering::Release);
            return;
        };
        let pool: Weak<Self> = Arc::downgrade(self);
        let every = (self.cfg.idle_timeout / 4).clamp(Duration::from_millis(50), IDLE_CHECK_MAX);
        drop(rt.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(pool) = pool.upgrade() else {
                    return;
                };
                pool.prune();
            }
        }));
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let open = self.state().slots.len();
        #[allow(clippy::cast_precision_loss)] // pool sizes are far below 2^52
        metrics::pool_sessions(NAME, -(open as f64));
    }
}

/// The longest period of the idle-session reaper.
const IDLE_CHECK_MAX: Duration = Duration::from_secs(15);

impl State {
    /// Counts one more session being opened and names its slot.
    fn reserve(&mut self) -> u64 {
        self.opening += 1;
        metrics::pool_sessions(NAME, 1.0);
        self.next_id += 1;
        self.next_id
    }

    /// Takes the sessions whose connection ended out of the pool, for the caller to drop
    /// outside the lock.
    fn take_closed(&mut self) -> Vec<Slot> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].session.is_closed() {
                out.push(self.slots.swap_remove(i));
                metrics::pool_sessions(NAME, -1.0);
            } else {
                i += 1;
            }
        }
        out
    }
}
