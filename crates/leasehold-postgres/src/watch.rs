//! The health check of a session: one task per session that checks the grant it holds, and
//! tells the holder when the session is gone.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use leasehold_core::{LeaseMonitor, Validity};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::config::PostgresConfig;
use crate::probe::WeakProbe;

/// A grant as its session's health check sees it: something to give up when the session is
/// lost (close the session, let local contenders in).
pub(crate) trait Abandon: std::fmt::Debug + Send + Sync {
    fn abandon(&self);
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The grant a lock session holds, as the session's health check sees it.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) grant: Weak<dyn Abandon>,
    pub(crate) monitor: LeaseMonitor,
}

impl Watched {
    /// The grant is gone: tell the holder, close the session (ending the lock if the server
    /// still has it) and let local contenders in.
    pub(crate) fn lose(&self, why: String) {
        tracing::warn!(reason = %why, "leasehold.lost: postgres lock session");
        self.monitor.lost(why);
        if let Some(g) = self.grant.upgrade() {
            g.abandon();
        }
    }
}

/// The health check of one session: a task, started with the session and stopped when it is
/// dropped, that checks the grant the session holds (if any) every `health_interval`, and at
/// once when the connection ends. One task per session rather than one per lease: sessions are
/// pooled, and spawning and aborting a task on every acquisition cost more client time than the
/// rest of the cycle's bookkeeping.
#[derive(Debug)]
pub(crate) struct Watcher {
    slot: Arc<Mutex<Option<Watched>>>,
    task: AbortHandle,
}

impl Watcher {
    pub(crate) fn spawn(
        probe: WeakProbe,
        closed: watch::Receiver<bool>,
        cfg: &PostgresConfig,
    ) -> Self {
        let slot = Arc::new(Mutex::new(None));
        let task = tokio::spawn(watch_session(
            Arc::clone(&slot),
            probe,
            closed,
            cfg.health_interval,
            cfg.health_timeout,
            cfg.validity_window(),
        ));
        Self {
            slot,
            task: task.abort_handle(),
        }
    }

    pub(crate) fn watch(&self, w: Watched) {
        *lock(&self.slot) = Some(w);
    }

    pub(crate) fn unwatch(&self) {
        drop(lock(&self.slot).take());
    }

    /// Takes `grant` out of the slot if it is still the one watched.
    pub(crate) fn take<G>(&self, grant: &Arc<G>) -> Option<Watched> {
        let mut slot = lock(&self.slot);
        if slot
            .as_ref()
            .is_some_and(|w| std::ptr::addr_eq(w.grant.as_ptr(), Arc::as_ptr(grant)))
        {
            slot.take()
        } else {
            None
        }
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

/// The loop of a [`Watcher`]. A grant is first checked within one `interval` of being put on
/// the session (its validity, counted from the statement that took the lock, lasts
/// `interval + timeout`), then every `interval`; a check counts only if it started after the
/// grant was put on the session.
async fn watch_session(
    slot: Arc<Mutex<Option<Watched>>>,
    probe: WeakProbe,
    mut closed: watch::Receiver<bool>,
    interval: Duration,
    timeout: Duration,
    window: Duration,
) {
    let mut next = Instant::now() + interval;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = closed.wait_for(|c| *c) => {
                let watched = lock(&slot).take();
                if let Some(w) = watched {
                    w.lose(CONNECTION_ENDED.to_owned());
                }
                return;
            }
        }
        let current = lock(&slot)
            .as_ref()
            .map(|w| (w.grant.clone(), w.monitor.clone()));
        next = Instant::now() + interval;
        let Some((grant, monitor)) = current else {
            continue;
        };
        if monitor.is_closed() || grant.strong_count() == 0 {
            continue;
        }
        let Some(probe) = probe.upgrade() else {
            return; // the session is gone
        };
        let started = Instant::now();
        // Checks start `interval` apart however long each takes, so a check that answers
        // within `timeout` renews the validity before it runs out.
        next = started + interval;
        let why = match tokio::time::timeout(timeout, probe.ping()).await {
            Ok(Ok(())) => {
                monitor.renewed(Validity::new(started, window));
                continue;
            }
            Ok(Err(e)) => format!("health check failed: {e}"),
            Err(_) => format!("health check did not answer within {timeout:?}"),
        };
        drop(probe);
        // The grant we checked is lost; the session may hold another one by now (ours was
        // released meanwhile), which stays watched.
        {
            let mut current = lock(&slot);
            if current.as_ref().is_some_and(|w| w.grant.ptr_eq(&grant)) {
                *current = None;
            }
        }
        Watched { grant, monitor }.lose(why);
    }
}
