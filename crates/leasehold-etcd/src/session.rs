//! An etcd lease kept alive in the background, and the grants that depend on it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use leasehold_core::{LeaseMonitor, Validity};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::error::{EtcdError, with_timeout};

/// The shortest lease leasehold asks etcd for: etcd grants whole seconds, and with its
/// default election timeout (1 s) it raises shorter leases to its own minimum (≈ 1.5 s) anyway.
pub(crate) const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The longest lease TTL accepted from a server: one that answers more than a day is lying
/// (it would keep a crashed holder's locks that long) and is refused as a protocol error.
const MAX_GRANTED_TTL: Duration = leasehold_core::DEFAULT_MAX_TTL;

/// The lease TTL, in whole seconds, for locks of `ttl`: rounded up, at least
/// [`MIN_LEASE_TTL`], so a crashed holder's lock is free within that.
pub(crate) fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0))
        .max(MIN_LEASE_TTL.as_secs());
    i64::try_from(secs.min(MAX_GRANTED_TTL.as_secs())).unwrap_or(i64::MAX)
}

/// The TTL a lease grant or keep-alive answered, checked: positive and at most a day (a
/// hostile or broken server must not make leasehold overflow a deadline or keep a lock for
/// ever).
pub(crate) fn granted_ttl(ttl: i64) -> Result<Duration, EtcdError> {
    u64::try_from(ttl)
        .ok()
        .filter(|s| *s > 0 && *s <= MAX_GRANTED_TTL.as_secs())
        .map(Duration::from_secs)
        .ok_or_else(|| EtcdError::Protocol(format!("etcd answered a lease TTL of {ttl} s")))
}

/// One etcd lease, kept alive by a background task over one keep-alive stream (reopened on
/// another member when the stream fails), until it is dropped, closed, or lost.
pub(crate) struct Session {
    id: i64,
    /// The TTL the server granted.
    ttl: Duration,
    state: Mutex<State>,
    /// `Some(reason)` once the lease is lost or closed; final.
    lost: watch::Sender<Option<Arc<str>>>,
    lease: LeaseClient,
    /// Revoke the lease when the last reference goes (per-lock leases, and session leases of a
    /// dropped backend).
    revoke_on_drop: bool,
    /// Wakes the keep-alive loop when a grant is watched: its cap may shorten the interval.
    /// Shared with the loop, which holds the session only weakly while it sleeps.
    replan: Arc<Notify>,
}

#[derive(Debug)]
struct State {
    /// The instant before the last acknowledged keep-alive (or the grant) was sent.
    last_ack: Instant,
    /// The grants on this lease, grouped by the longest validity each may report (grants of
    /// one TTL share a group: one word per grant, however many a lease carries).
    monitors: Vec<(Duration, Vec<LeaseMonitor>)>,
}

impl State {
    /// Adds `monitor` to the group of `cap`. Monitors of leases released or lost meanwhile
    /// are dropped when a group is full (each acknowledgement drops them too), so that a group
    /// grows only with the grants it still carries, at amortised constant cost per grant.
    fn add(&mut self, monitor: LeaseMonitor, cap: Duration) {
        let group = match self.monitors.iter().position(|(c, _)| *c == cap) {
            Some(i) => &mut self.monitors[i].1,
            None => {
                self.monitors.push((cap, Vec::new()));
                let last = self.monitors.len() - 1;
                &mut self.monitors[last].1
            }
        };
        if group.len() == group.capacity() {
            group.retain(|m| !m.is_closed());
        }
        group.push(monitor);
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &format_args!("{:x}", self.id))
            .field("ttl", &self.ttl)
            .field("lost", &*self.lost.borrow())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Grants a lease of `ttl` ([rounded up](lease_secs) to whole seconds, at least
    /// [`MIN_LEASE_TTL`]) and starts keeping it alive.
    pub(crate) async fn grant(
        lease: LeaseClient,
        ttl: Duration,
        timeout: Duration,
        revoke_on_drop: bool,
    ) -> Result<Arc<Self>, EtcdError> {
        let secs = lease_secs(ttl);
        let sent = Instant::now();
        let resp = with_timeout(timeout, "lease grant", None, || {
            let mut lease = lease.clone();
            async move { lease.grant(secs, None).await }
        })
        .await?;
        if !resp.error().is_empty() {
            return Err(EtcdError::Protocol(format!(
                "lease grant refused: {}",
                resp.error()
            )));
        }
        let granted = granted_ttl(resp.ttl())?;
        let (lost, _) = watch::channel(None);
        let session = Arc::new(Self {
            id: resp.id(),
            ttl: granted,
            state: Mutex::new(State {
                last_ack: sent,
                monitors: Vec::new(),
            }),
            lost,
            lease: lease.clone(),
            revoke_on_drop,
            replan: Arc::new(Notify::new()),
        });
        tracing::debug!(lease = %format_args!("{:x}", session.id), ttl = ?granted, "leasehold.etcd: lease granted");
        let replan = Arc::clone(&session.replan);
        tokio::spawn(keep_alive(Arc::downgrade(&session), replan, lease, timeout));
        Ok(session)
    }

    /// The lease id.
    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the lease is gone, if it is. Past its TTL since the last acknowledgement it is
    /// gone for good: see [`expire`](Self::expire).
    pub(crate) fn lost_reason(&self) -> Option<Arc<str>> {
        if let Some(r) = self.lost.borrow().clone() {
            return Some(r);
        }
        if Instant::now() < self.expires_at() {
            return None;
        }
        self.expire("the lease's TTL ran out unrenewed");
        self.lost.borrow().clone()
    }

    /// The lease's TTL since the last acknowledged keep-alive has run out: the server may have
    /// expired it, so every grant on it is lost, for good. A keep-alive already on its way may
    /// still renew it on the server, and an acknowledgement that comes late must not bring it
    /// back: grants on it have been told they are lost, and releases of them answered that
    /// their key went with the lease. So the lease is revoked in the background, and its keys
    /// go now rather than a TTL after that late renewal.
    fn expire(&self, reason: &str) {
        if self.lose(reason) {
            spawn_revoke(self.lease.clone(), self.id);
        }
    }

    /// Whether the lease is gone (lost, closed, or past its TTL since the last acknowledgement).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Completes when the lease is lost or closed.
    pub(crate) async fn lost(&self) {
        let mut rx = self.lost.subscribe();
        loop {
            if rx.borrow_and_update().is_some() {
                return;
            }
            let expires = self.expires_at();
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(expires) => {
                    if self.lost_reason().is_some() { return }
                }
            }
        }
    }

    /// The instant past which the server may have expired the lease.
    fn expires_at(&self) -> Instant {
        self.state().last_ack + self.ttl
    }

    /// The validity of a grant on this lease, at most `cap` long.
    pub(crate) fn validity(&self, cap: Duration) -> Validity {
        Validity::new(self.state().last_ack, self.ttl.min(cap))
    }

    /// Reports renewals and loss of this lease to `monitor`, with validities at most `cap`.
    pub(crate) fn watch(&self, monitor: LeaseMonitor, cap: Duration) {
        let mut state = self.state();
        if let Some(reason) = self.lost.borrow().clone() {
            drop(state);
            monitor.lost(reason);
            return;
        }
        state.add(monitor, cap);
        drop(state);
        self.replan.notify_one();
    }

    /// Marks the lease lost and fires the lost signal of every grant on it. Idempotent: true
    /// the first time.
    pub(crate) fn lose(&self, reason: impl Into<Arc<str>>) -> bool {
        let reason: Arc<str> = reason.into();
        let first = self.lost.send_if_modified(|r| {
            if r.is_some() {
                return false;
            }
            *r = Some(Arc::clone(&reason));
            true
        });
        if !first {
            return false;
        }
        tracing::warn!(lease = %format_args!("{:x}", self.id), %reason, "leasehold.lost: etcd lease");
        let monitors = std::mem::take(&mut self.state().monitors);
        for m in monitors.into_iter().flat_map(|(_, group)| group) {
            m.lost(Arc::clone(&reason));
        }
        true
    }

    /// Stops keeping the lease alive and revokes it in the background (a released per-lock
    /// lease). Its grant is being released, so it is not told of a loss.
    pub(crate) fn close(&self) {
        self.state().monitors.clear();
        if self.lose("the lease was revoked on release") {
            spawn_revoke(self.lease.clone(), self.id);
        }
    }

    /// A keep-alive was acknowledged with `ttl`: renew every grant, unless the lease has
    /// [expired](Self::expire) meanwhile.
    fn acked(&self, sent: Instant, ttl: Duration) {
        if self.lost.borrow().is_some() {
            return;
        }
        let mut state = self.state();
        if Instant::now() >= state.last_ack + self.ttl {
            drop(state);
            self.expire("the lease's TTL ran out before a keep-alive was acknowledged");
            return;
        }
        state.last_ack = sent;
        state.monitors.retain_mut(|(cap, group)| {
            let v = Validity::new(sent, ttl.min(*cap).min(self.ttl));
            // `renewed` returns false once the lease is gone or lost: stop watching it.
            group.retain(|m| m.renewed(v));
            !group.is_empty()
        });
    }

    /// How long to wait between keep-alives: a third of the shortest validity we promise.
    fn interval(&self) -> Duration {
        let state = self.state();
        let shortest = state
            .monitors
            .iter()
            .map(|(cap, _)| *cap)
            .fold(self.ttl, Duration::min);
        (shortest / 3).max(Duration::from_millis(100))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.revoke_on_drop && self.lost.borrow().is_none() {
            spawn_revoke(self.lease.clone(), self.id);
        }
    }
}

/// Revokes a lease in the background, a few times if etcd is briefly unreachable. A lease that
/// cannot be revoked expires by its TTL: nothing keeps it alive any more.
pub(crate) fn spawn_revoke(lease: LeaseClient, id: i64) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    drop(rt.spawn(async move {
        for attempt in 0..3u32 {
            let revoke = with_timeout(Duration::from_secs(3), "lease revoke", None, || {
                let mut lease = lease.clone();
                async move { lease.revoke(id).await }
            });
            match revoke.await {
                Ok(_) => return,
                Err(e) if e.is_not_found() => return,
                Err(e) => {
                    tracing::debug!(lease = %format_args!("{id:x}"), error = %e, attempt,
                        "leasehold.etcd: lease revoke failed");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
    }));
}

/// The keep-alive loop of one lease: one request at a time over one stream; a failed stream is
/// reopened (the client's balancer picks a live member) until the lease's TTL since the last
/// acknowledgement has run out, and then the lease is lost.
async fn keep_alive(
    session: Weak<Session>,
    replan: Arc<Notify>,
    mut lease: LeaseClient,
    timeout: Duration,
) {
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    // When `next` was planned: the interval may shrink after that.
    let mut planned = Instant::now();
    let mut next = match session.upgrade() {
        Some(s) => planned + s.interval(),
        None => return,
    };
    loop {
        // A grant watched after `next` was planned (the first grant on a fresh session, with a
        // TTL shorter than the session's) needs an earlier keep-alive: `watch` wakes us to plan
        // again.
        loop {
            let Some(s) = session.upgrade() else { return };
            let due = next.min(planned + s.interval());
            drop(s);
            tokio::select! {
                () = tokio::time::sleep_until(due) => break,
                () = replan.notified() => {}
            }
        }
        let Some(s) = session.upgrade() else { return };
        if s.lost.borrow().is_some() {
            return;
        }
        let expires = s.expires_at();
        let now = Instant::now();
        if now >= expires {
            s.expire("keep-alive failed until the lease's TTL ran out");
            return;
        }
        let limit = timeout.min(expires - now).max(Duration::from_millis(1));
        let id = s.id;
        let sent = Instant::now();
        let outcome = tokio::time::timeout(limit, async {
            match &mut stream {
                Some((keeper, st)) => {
                    keeper.keep_alive().await?;
                    match st.message().await? {
                        Some(resp) => Ok(resp.ttl()),
                        None => Err(etcd_client::Error::LeaseKeepAliveError(
                            "keep-alive stream ended".to_owned(),
                        )),
                    }
                }
                None => {
                    // Opening the stream sends one keep-alive and waits for its answer; it
                    // fails with "lease not found" if the lease is gone.
                    let (keeper, st) = lease.keep_alive(id).await?;
                    stream = Some((keeper, st));
                    Ok(i64::try_from(s.ttl.as_secs()).unwrap_or(1))
                }
            }
        })
        .await;
        match outcome {
            Ok(Ok(ttl)) if ttl > 0 => {
                // More than the lease was granted with is not believed (`acked` caps it).
                s.acked(sent, granted_ttl(ttl).unwrap_or(s.ttl));
                planned = sent;
                next = sent + s.interval();
            }
            Ok(Ok(_)) => {
                s.lose(format!(
                    "etcd lease {id:x} expired or was revoked (keep-alive answered TTL 0)"
                ));
                return;
            }
            Ok(Err(e)) if is_lease_gone(&e) => {
                s.lose(format!("etcd lease {id:x} expired or was revoked: {e}"));
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(lease = %format_args!("{id:x}"), error = %e,
                    "leasehold.etcd: keep-alive failed; reopening the stream");
                stream = None;
                planned = Instant::now();
                next = retry_at(&s);
            }
            Err(_) => {
                tracing::debug!(lease = %format_args!("{id:x}"), ?limit,
                    "leasehold.etcd: keep-alive unanswered; reopening the stream");
                stream = None;
                planned = Instant::now();
                next = retry_at(&s);
            }
        }
    }
}

fn retry_at(s: &Session) -> Instant {
    let now = Instant::now();
    let left = s.expires_at().saturating_duration_since(now);
    now + (left / 4).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

fn is_lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ttls_round_up_to_whole_seconds_of_at_least_two() {
        let ms = Duration::from_millis;
        assert_eq!(lease_secs(ms(1)), 2);
        assert_eq!(lease_secs(ms(2_000)), 2);
        assert_eq!(lease_secs(ms(3_000)), 3);
        assert_eq!(lease_secs(ms(3_001)), 4);
        assert_eq!(lease_secs(Duration::MAX), 86_400);
    }

    #[test]
    fn grants_are_grouped_by_cap_and_gone_ones_pruned_as_a_group_fills() {
        let mut state = State {
            last_ack: Instant::now(),
            monitors: Vec::new(),
        };
        let (short, long) = (Duration::from_secs(1), Duration::from_secs(3));
        // Monitors of no live lease (as of leases released meanwhile): the group never grows
        // past the first few, however many come.
        for _ in 0..1_000 {
            state.add(LeaseMonitor::detached(), long);
        }
        state.add(LeaseMonitor::detached(), short);
        assert_eq!(state.monitors.len(), 2, "one group per cap");
        let (cap, group) = &state.monitors[0];
        assert_eq!(*cap, long);
        assert!(group.len() <= 8, "gone monitors kept: {}", group.len());
        assert_eq!(state.monitors[1].1.len(), 1);
    }

    #[test]
    fn hostile_lease_ttls_are_errors_not_panics() {
        assert_eq!(granted_ttl(5).ok(), Some(Duration::from_secs(5)));
        for bad in [0, -1, i64::MIN, i64::MAX, 86_401] {
            assert!(granted_ttl(bad).is_err(), "{bad}");
        }
    }
}
