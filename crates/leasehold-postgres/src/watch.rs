//! The health check of a session: one task per session that checks every grant the session
//! carries with one statement, and tells each holder when the session is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use leasehold_core::{LeaseMonitor, Validity};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::config::PostgresConfig;
use crate::probe::WeakProbe;

/// A grant as its session's health check sees it: something to give up when the session is
/// lost (leave the session, let local contenders in).
pub(crate) trait Abandon: std::fmt::Debug + Send + Sync {
    fn abandon(&self);
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A grant a lock session carries, as the session's health check sees it.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) grant: Weak<dyn Abandon>,
    pub(crate) monitor: LeaseMonitor,
    /// When the grant was put on the session: only a check that started later renews it.
    pub(crate) since: Instant,
}

impl Watched {
    /// The grant is gone: tell the holder and let local contenders in.
    pub(crate) fn lose(&self, why: &str) {
        tracing::warn!(reason = %why, "leasehold.lost: postgres lock session");
        self.monitor.lost(why.to_owned());
        if let Some(g) = self.grant.upgrade() {
            g.abandon();
        }
    }
}

type Slots = Arc<Mutex<foldhash::HashMap<u64, Watched>>>;

/// Called once when the session is found lost, to take it out of the pool (which closes it
/// once nothing uses it any more).
pub(crate) type OnLost = Box<dyn FnOnce() + Send>;

/// The health check of one session: a task, started with the session and stopped when it is
/// dropped, that checks the session every `health_interval` while it carries at least one
/// grant (one `SELECT 1` for all of them), and at once notices the connection ending. A
/// failed check loses every grant on the session, each told the reason, and takes the session
/// out of the pool; grants on other sessions are not touched.
#[derive(Debug)]
pub(crate) struct Watcher {
    slots: Slots,
    /// Set before the grants of a lost session are reported, so a grant put on it afterwards
    /// is reported by its putter instead (see [`Watcher::is_dead`]).
    dead: Arc<AtomicBool>,
    task: AbortHandle,
}

impl Watcher {
    pub(crate) fn spawn(
        probe: WeakProbe,
        closed: watch::Receiver<bool>,
        cfg: &PostgresConfig,
        on_lost: OnLost,
    ) -> Self {
        let slots = Slots::default();
        let dead = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(watch_session(
            Arc::clone(&slots),
            Arc::clone(&dead),
            probe,
            closed,
            Timing {
                interval: cfg.health_interval,
                timeout: cfg.health_timeout,
                window: cfg.validity_window(),
            },
            on_lost,
        ));
        Self {
            slots,
            dead,
            task: task.abort_handle(),
        }
    }

    /// Whether the session was found lost: a grant put on it after that is not reported by
    /// the check, so whoever puts one checks this afterwards.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    pub(crate) fn watch(&self, id: u64, w: Watched) {
        lock(&self.slots).insert(id, w);
    }

    /// Takes grant `id` out of the check; `Some` if it was still watched.
    pub(crate) fn take(&self, id: u64) -> Option<Watched> {
        lock(&self.slots).remove(&id)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a grant is lost when its session's connection ends.
pub(crate) const CONNECTION_ENDED: &str =
    "the lock session's connection ended (server restart, pg_terminate_backend, network failure)";

#[derive(Clone, Copy)]
struct Timing {
    interval: Duration,
    timeout: Duration,
    window: Duration,
}

/// Loses every grant in `slots` with `why`, outside the lock.
fn lose_all(slots: &Slots, why: &str) {
    let all: Vec<Watched> = lock(slots).drain().map(|(_, w)| w).collect();
    for w in all {
        w.lose(why);
    }
}

/// The loop of a [`Watcher`]. A grant is first checked within one `interval` of being put on
/// the session (its validity, counted from the statement that took the lock, lasts
/// `interval + timeout`), then every `interval`; a check renews only the grants that were on
/// the session when it started.
async fn watch_session(
    slots: Slots,
    dead: Arc<AtomicBool>,
    probe: WeakProbe,
    mut closed: watch::Receiver<bool>,
    t: Timing,
    on_lost: OnLost,
) {
    let mut next = Instant::now() + t.interval;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = closed.wait_for(|c| *c) => {
                dead.store(true, Ordering::SeqCst);
                on_lost();
                lose_all(&slots, CONNECTION_ENDED);
                return;
            }
        }
        next = Instant::now() + t.interval;
        if lock(&slots).is_empty() {
            continue;
        }
        let Some(probe) = probe.upgrade() else {
            return; // the session is gone
        };
        let started = Instant::now();
        // Checks start `interval` apart however long each takes, so a check that answers
        // within `timeout` renews the validity before it runs out.
        next = started + t.interval;
        let why = match tokio::time::timeout(t.timeout, probe.ping()).await {
            Ok(Ok(())) => {
                let renew: Vec<LeaseMonitor> = lock(&slots)
                    .values()
                    .filter(|w| w.since <= started)
                    .map(|w| w.monitor.clone())
                    .collect();
                for m in renew {
                    m.renewed(Validity::new(started, t.window));
                }
                continue;
            }
            Ok(Err(e)) => format!("health check failed: {e}"),
            Err(_) => format!("health check did not answer within {:?}", t.timeout),
        };
        drop(probe);
        dead.store(true, Ordering::SeqCst);
        // The session is no longer trusted: out of the pool (closing it ends whatever locks
        // the server still has on it), and every grant on it is lost.
        on_lost();
        lose_all(&slots, &why);
        return;
    }
}
