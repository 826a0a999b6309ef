//! The etcd part of one acquisition, run in a task of its own, and what it answers.

mod permits;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnResponse, WatchFilterType, WatchOptions,
};
use leasehold_core::{
    Error, ErrorKind, FencingToken, Grant, HolderInfo, LeaseMonitor, LockRequest, Owner, Validity,
};

use crate::error::with_timeout;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::NAME;
use crate::client::{
    Inner, Key, all_kvs, checked_revision, finish, first_created, first_kv, revision, token,
    waiter_key,
};
use crate::config::LeaseMode;
use crate::held::EtcdGrant;
use crate::local::LocalSlot;
use crate::session::Session;

pub(crate) use permits::Limit;

/// The queued recipe under `prefix`, writing `req.owner` as our key's value: locks, and (with
/// the candidate value as owner) election campaigns. In session mode, an in-process slot per
/// waiter key keeps two local tasks from sharing a key.
pub(crate) async fn lock_under(
    inner: &Arc<Inner>,
    prefix: Vec<u8>,
    req: LockRequest<'_>,
    mode: Mode,
) -> Result<Option<Grant>, Error> {
    queue_under(inner, prefix, Queue::One, req, mode).await
}

/// The queued recipe under `prefix` for `queue`: one holder (locks, elections), or the
/// `limit` oldest keys (semaphores, whose keys are unique per acquisition and need no
/// in-process slot).
pub(crate) async fn queue_under(
    inner: &Arc<Inner>,
    prefix: Vec<u8>,
    queue: Queue,
    req: LockRequest<'_>,
    mode: Mode,
) -> Result<Option<Grant>, Error> {
    let (session, slot) = match (inner.config.lease_mode, &queue) {
        (LeaseMode::PerLock, _) => (None, None),
        (LeaseMode::Session, Queue::Permits(_)) => (Some(inner.session(req.ttl).await?), None),
        (LeaseMode::Session, Queue::One) => loop {
            let session = inner.session(req.ttl).await?;
            let mut slot = LocalSlot::new(&inner.local, waiter_key(&prefix, session.id()).into());
            match mode {
                Mode::Try if slot.try_take() => break (Some(session), Some(slot)),
                Mode::Try => return Ok(None),
                Mode::Wait(deadline) => tokio::select! {
                    p = slot.take() => match p {
                        Ok(()) => break (Some(session), Some(slot)),
                        Err(_) => return Err(Error::new(ErrorKind::Backend, NAME,
                            "in-process lock table closed")),
                    },
                    // The local holder's session is gone: a new session means a new key.
                    () = session.lost() => continue,
                    () = tokio::time::sleep_until(deadline) => return Ok(None),
                },
            }
        },
    };
    let (tx, rx) = oneshot::channel();
    let job = Job::new(inner, prefix, queue, &req, mode, session, slot);
    // The etcd part runs in its own task, so a request that was sent always has its outcome
    // seen: if our caller is gone by then, the task deletes what it created. The task (which
    // the caller's thread allocates) holds only the job; the request's state is boxed by the
    // task itself on the thread that runs it, where it is freed too, so that the caller's
    // heap is not left with holes of it between the leases it keeps.
    tokio::spawn(async move { Box::pin(job.run(tx)).await });
    let answer = rx.await.unwrap_or_else(|_| {
        Err(Error::new(
            ErrorKind::Backend,
            NAME,
            "the acquisition task ended without an answer",
        ))
    });
    Ok(answer?.map(Granted::into_grant))
}

/// A grant as the acquisition task answers it: its parts, boxed into a [`Grant`] by the caller,
/// so that the state a held lock keeps is allocated where the lease that keeps it is (not
/// among the transient buffers of the task's thread).
pub(crate) struct Granted {
    validity: Validity,
    fencing: FencingToken,
    state: EtcdGrant,
}

impl Granted {
    fn into_grant(self) -> Grant {
        Grant::new(self.validity)
            .with_fencing(self.fencing)
            .with_state(self.state)
    }
}

/// What etcd says of the oldest key under `prefix`: the holder.
pub(crate) async fn first_holder(
    inner: &Inner,
    prefix: String,
) -> Result<Option<HolderInfo>, Error> {
    Ok(holders(inner, prefix, 1).await?.into_iter().next())
}

/// What etcd says of the `n` oldest keys under `prefix`, oldest first: the holders.
pub(crate) async fn holders(
    inner: &Inner,
    prefix: String,
    n: u32,
) -> Result<Vec<HolderInfo>, Error> {
    let resp = inner
        .get("inspect", prefix.into_bytes(), Some(permits::oldest(n)))
        .await
        .map_err(|e| e.into_core("inspect"))?;
    let mut found = Vec::with_capacity(resp.kvs().len());
    // Many permits share a session lease: ask for each lease's TTL once.
    let mut ttls = std::collections::HashMap::new();
    for holder in resp.kvs() {
        let remaining = match ttls.get(&holder.lease()) {
            Some(known) => *known,
            None => {
                let left = lease_remaining(inner, holder.lease()).await;
                ttls.insert(holder.lease(), left);
                left
            }
        };
        let mut info = holder_info(holder)?;
        if let Some(remaining) = remaining {
            info = info.with_remaining(remaining);
        }
        found.push(info);
    }
    Ok(found)
}

/// What a holder's key says of it: owner value, token (create revision), key and lease.
fn holder_info(holder: &KeyValue) -> Result<HolderInfo, Error> {
    let mut info = HolderInfo::unknown()
        .with_fencing(token(holder.create_revision())?)
        .with_detail(format!(
            "etcd key {:?} on lease {:x}",
            String::from_utf8_lossy(holder.key()),
            holder.lease()
        ));
    if !holder.value().is_empty() {
        info = info.with_owner(Owner::from_raw(String::from_utf8_lossy(holder.value())));
    }
    Ok(info)
}

/// What is left of lease `id`'s TTL, if etcd says (no lease, 0, has none).
async fn lease_remaining(inner: &Inner, id: i64) -> Option<Duration> {
    if id == 0 {
        return None;
    }
    let lease = inner.client.lease_client();
    let ttl = with_timeout(
        inner.config.request_timeout,
        "lease ttl",
        Some(&inner.reauth),
        || {
            let mut lease = lease.clone();
            async move { lease.time_to_live(id, None).await }
        },
    )
    .await
    .ok()?;
    crate::session::granted_ttl(ttl.ttl()).ok()
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode {
    Try,
    Wait(Instant),
}

/// Who holds under a prefix.
#[derive(Debug, Clone)]
pub(crate) enum Queue {
    /// A lock or an election: the oldest key, named by its lease (etcd's recipe).
    One,
    /// A semaphore: the `limit` oldest keys, each named by its lease and owner (one session
    /// lease carries many permits of a key).
    Permits(Limit),
}

impl Queue {
    /// How many of the oldest keys hold.
    fn holders(&self) -> u32 {
        match self {
            Self::One => 1,
            Self::Permits(l) => l.permits,
        }
    }
}

/// How long an acquisition that was not granted spends deleting its key before it answers;
/// past that, the key is deleted in the background (or goes with its lease).
const ANSWER_CLEANUP: Duration = Duration::from_secs(1);

/// The etcd part of one acquisition, run in its own task.
pub(crate) struct Job {
    inner: Arc<Inner>,
    prefix: Vec<u8>,
    queue: Queue,
    owner: Owner,
    ttl: Duration,
    /// The instant before the request that found our key first in line: our caller's, or
    /// the last check of a wait. No validity starts later.
    started: Instant,
    monitor: LeaseMonitor,
    mode: Mode,
    /// The session lease (given in session mode; granted by the job in per-lock mode).
    session: Option<Arc<Session>>,
    slot: Option<LocalSlot>,
    /// Whether a write of our key may have reached etcd.
    created: bool,
}

type Answer = oneshot::Sender<Result<Option<Granted>, Error>>;

impl Job {
    /// The etcd part of `req`, under the lock prefix `prefix`, on `session` (granted by the
    /// job itself when `None`) and holding the in-process `slot`.
    pub(crate) fn new(
        inner: &Arc<Inner>,
        prefix: Vec<u8>,
        queue: Queue,
        req: &LockRequest<'_>,
        mode: Mode,
        session: Option<Arc<Session>>,
        slot: Option<LocalSlot>,
    ) -> Self {
        Self {
            inner: Arc::clone(inner),
            prefix,
            queue,
            owner: req.owner.clone(),
            ttl: req.ttl,
            started: req.started,
            monitor: req.monitor.clone(),
            mode,
            session,
            slot,
            created: false,
        }
    }

    pub(crate) async fn run(mut self, mut tx: Answer) {
        let outcome = self.attempt(&mut tx).await;
        let per_lock = self.inner.config.lease_mode == LeaseMode::PerLock;
        match (outcome, self.session.take()) {
            (Ok(Some(rev)), Some(session)) => {
                let key = self.grant_key(session.id());
                let v = session.validity(self.ttl);
                // A per-lock lease was granted after our caller's request started; count
                // from the earlier instant, as the contract asks. After a wait, from the last
                // check (our key lived on its lease, renewed, meanwhile): counting from the
                // start of a wait longer than the TTL would make a grant born expired, given
                // back and queued again, behind later waiters, with a term nobody led under.
                let validity = Validity::new(v.from.min(self.started), v.ttl);
                session.watch(self.monitor.clone(), self.ttl);
                let state = EtcdGrant {
                    inner: Arc::clone(&self.inner),
                    key,
                    owner: self.owner.clone(),
                    session,
                    per_lock,
                    slot: Mutex::new(self.slot.take()),
                    done: AtomicBool::new(false),
                };
                let fencing = FencingToken::new(rev.unsigned_abs());
                let grant = Granted {
                    validity,
                    fencing,
                    state,
                };
                // If our caller is gone, dropping the grant releases it (EtcdGrant's Drop).
                drop(tx.send(Ok(Some(grant))));
            }
            (outcome, session) => {
                // Not granted (the wait ran out, or failed) while our caller still waits for
                // the answer: delete our key first, once and briefly, so that a caller that
                // exits at once (the CLI after `--wait` ran out) leaves no waiter behind to
                // take the lock when its holder releases and keep it until its lease expires.
                let mut deleted = false;
                if let Some(session) = &session
                    && self.created
                    && !tx.is_closed()
                {
                    let key = self.key_of(session.id());
                    let delete = self.inner.delete_if_owner(&key, self.owner.as_str());
                    deleted = matches!(
                        tokio::time::timeout(ANSWER_CLEANUP, delete).await,
                        Ok(Ok(_))
                    );
                }
                drop(tx.send(outcome.map(|_| None)));
                if let Some(session) = session {
                    if per_lock {
                        session.close();
                    } else if self.created && !deleted {
                        let key = self.key_of(session.id());
                        finish(&self.inner, &key, self.owner.as_str(), &session).await;
                    }
                }
                // The slot (our in-process permit) is freed only now, after our key is gone.
                drop(self.slot.take());
            }
        }
    }

    /// Returns the fencing token (our key's create revision) if granted; `Ok(None)` when not
    /// granted or when our caller went away (then `run` cleans up).
    async fn attempt(&mut self, tx: &mut Answer) -> Result<Option<i64>, Error> {
        // Our caller may be gone already (this task runs apart from it): then send nothing,
        // rather than write a key only to delete it again.
        if tx.is_closed() {
            return Ok(None);
        }
        let session = self.lease().await?;
        let key = self.key_of(session.id());
        let put = TxnOp::put(
            key.clone(),
            self.owner.as_str(),
            Some(PutOptions::new().with_lease(session.id())),
        );
        // The paths a lock taken at once does not go through (a semaphore's, a wait behind
        // another holder) are boxed, so that the task of every acquisition is only as large
        // as that common path needs: a fleet of acquisitions churns less memory.
        let queue = self.queue.clone();
        let deadline = match (self.mode, &queue) {
            (Mode::Try, Queue::One) => return self.try_create(tx, &key, put).await,
            (Mode::Try, Queue::Permits(l)) => {
                return Box::pin(self.try_permit(tx, &key, put, l)).await;
            }
            (Mode::Wait(deadline), _) => deadline,
        };
        let queued = match &queue {
            Queue::One => self.enqueue(tx, &key, put).await?,
            Queue::Permits(l) => Box::pin(self.enqueue_permit(tx, &key, put, l)).await?,
        };
        match queued {
            None => Ok(None),
            Some((rev, true)) => Ok(Some(rev)),
            Some((my_rev, false)) => {
                Box::pin(self.wait_turn(tx, &session, &key, my_rev, deadline)).await
            }
        }
    }

    /// Our key on lease `lease`: the lease in hex (etcd's recipe), and for a permit also our
    /// owner value, since one lease carries many permits of a key.
    fn key_of(&self, lease: i64) -> Vec<u8> {
        match self.queue {
            Queue::One => waiter_key(&self.prefix, lease),
            Queue::Permits(_) => permits::permit_key(&self.prefix, lease, self.owner.as_str()),
        }
    }

    /// The key a grant on `lease` keeps: the in-process slot's (the same key, stored once),
    /// or ours alone (a lease per lock, a permit).
    fn grant_key(&self, lease: i64) -> Key {
        match &self.slot {
            Some(slot) => Arc::clone(slot.key()),
            None => self.key_of(lease).into(),
        }
    }

    /// The lease our key goes on: the session's, or (per-lock mode) a new one.
    async fn lease(&mut self) -> Result<Arc<Session>, Error> {
        if let Some(s) = &self.session {
            return Ok(Arc::clone(s));
        }
        let s = Box::pin(Session::grant(
            self.inner.client.lease_client(),
            self.ttl,
            self.inner.config.request_timeout,
            true,
        ))
        .await
        .map_err(|e| e.into_core("granting a lease"))?;
        self.session = Some(Arc::clone(&s));
        Ok(s)
    }

    /// Sends a transaction that may create our key, unless our caller is gone (`None`).
    async fn create(
        &mut self,
        tx: &Answer,
        what: &'static str,
        txn: Txn,
    ) -> Result<Option<TxnResponse>, Error> {
        if tx.is_closed() {
            return Ok(None);
        }
        self.created = true;
        let resp = self.inner.txn(what, txn).await;
        resp.map(Some).map_err(|e| e.into_core(what))
    }

    /// `try_acquire`: creates our key only if nothing at all is under the lock prefix (nobody
    /// holds it and nobody is queued for it). Our key's create revision if granted.
    async fn try_create(
        &mut self,
        tx: &Answer,
        key: &[u8],
        put: TxnOp,
    ) -> Result<Option<i64>, Error> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(self.prefix.clone(), CompareOp::Equal, 0).with_prefix(),
            ])
            .and_then([put])
            .or_else([TxnOp::get(key.to_vec(), None)]);
        let Some(resp) = self.create(tx, "try lock", txn).await? else {
            return Ok(None);
        };
        if resp.succeeded() {
            return Ok(Some(revision(&resp)?));
        }
        match first_kv(&resp, 0) {
            // Our own key already: an earlier send of this very request landed.
            Some(kv) if kv.value() == self.owner.as_str().as_bytes() => {
                return checked_revision(kv.create_revision()).map(Some);
            }
            Some(stale) => self.drop_stale(&stale).await,
            None => {}
        }
        self.created = false;
        Ok(None)
    }

    /// The queued recipe: our key joins the queue; the oldest key holds the lock. Our key's
    /// create revision and whether it holds the lock already; `None` if our caller is gone.
    async fn enqueue(
        &mut self,
        tx: &Answer,
        key: &[u8],
        put: TxnOp,
    ) -> Result<Option<(i64, bool)>, Error> {
        let txn = Txn::new()
            .when([Compare::create_revision(key.to_vec(), CompareOp::Equal, 0)])
            .and_then([put, TxnOp::get(self.prefix.clone(), Some(first_created()))])
            .or_else([TxnOp::get(key.to_vec(), None)]);
        let Some(resp) = self.create(tx, "lock", txn).await? else {
            return Ok(None);
        };
        if resp.succeeded() {
            let my_rev = revision(&resp)?;
            let first = first_kv(&resp, 1).is_none_or(|kv| kv.create_revision() == my_rev);
            return Ok(Some((my_rev, first)));
        }
        match first_kv(&resp, 0) {
            // Our own key already: queued (or holding) since its create revision.
            Some(kv) if kv.value() == self.owner.as_str().as_bytes() => {
                Ok(Some((checked_revision(kv.create_revision())?, false)))
            }
            stale => {
                self.created = false;
                if let Some(stale) = stale {
                    self.drop_stale(&stale).await;
                }
                Err(Error::new(
                    ErrorKind::Unavailable,
                    NAME,
                    "found a stale waiter key of our own session; removed it, retry",
                ))
            }
        }
    }

    /// Waits until fewer keys than the queue has holders were created before ours (at
    /// `my_rev`) under the prefix — for a lock, until ours is the oldest: watches the deletion
    /// of the nearest of them (our predecessor for a lock; the `limit` nearest for a
    /// semaphore, since a release by any of them may make room), again and again. `Ok(None)`
    /// at the deadline or when our caller is gone.
    async fn wait_turn(
        &mut self,
        tx: &mut Answer,
        session: &Session,
        key: &[u8],
        my_rev: i64,
        deadline: Instant,
    ) -> Result<Option<i64>, Error> {
        let holders = self.queue.holders();
        loop {
            self.started = Instant::now();
            // Our predecessors: the newest keys created before ours. Also check our own key is
            // still there (a lost session deletes it, and then there is nothing to wait for).
            let txn = Txn::new().and_then([
                TxnOp::get(
                    self.prefix.clone(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_max_create_revision(my_rev.saturating_sub(1))
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(i64::from(holders)),
                    ),
                ),
                TxnOp::get(key.to_vec(), None),
            ]);
            let resp = self
                .inner
                .txn("lock wait", txn)
                .await
                .map_err(|e| e.into_core("lock wait"))?;
            let ours = first_kv(&resp, 1);
            if ours.is_none_or(|kv| kv.value() != self.owner.as_str().as_bytes()) {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    NAME,
                    "our waiter key vanished while we waited (the session lease was lost)",
                ));
            }
            let ahead = all_kvs(&resp, 0);
            if ahead.len() < holders as usize {
                return Ok(Some(my_rev));
            }
            let ahead = ahead.iter().map(|kv| kv.key().to_vec()).collect();
            let from = checked_revision(resp.header().map_or(0, |h| h.revision()))? + 1;
            tokio::select! {
                r = self.deleted(ahead, from) => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "leasehold.etcd: watch failed; checking again");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                () = tokio::time::sleep_until(deadline) => return Ok(None),
                () = tx.closed() => return Ok(None),
                () = session.lost() => return Err(Error::new(ErrorKind::Unavailable, NAME,
                    "the session lease was lost while waiting")),
            }
        }
    }

    /// Returns once one of `keys` is deleted (watched from revision `from` on, all over one
    /// watch stream), or the watch ends.
    async fn deleted(&self, keys: Vec<Vec<u8>>, from: i64) -> Result<(), etcd_client::Error> {
        let mut watch = self.inner.client.watch_client();
        let opts = WatchOptions::new()
            .with_start_revision(from)
            .with_filters([WatchFilterType::NoPut]);
        let mut keys = keys.into_iter();
        let Some(first) = keys.next() else {
            return Ok(());
        };
        let mut stream = watch.watch(first, Some(opts.clone())).await?;
        for key in keys {
            stream.watch(key, Some(opts.clone())).await?;
        }
        while let Some(resp) = stream.message().await? {
            if resp.canceled()
                || resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
            {
                break;
            }
        }
        Ok(())
    }

    /// A key of our own lease that no acquisition of ours owns (a cleanup that failed): delete
    /// it, so it does not block the lock until the session ends.
    async fn drop_stale(&self, stale: &KeyValue) {
        let Some(session) = &self.session else { return };
        if stale.lease() != session.id() {
            return;
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                stale.key().to_vec(),
                CompareOp::Equal,
                stale.mod_revision(),
            )])
            .and_then([TxnOp::delete(stale.key().to_vec(), None)]);
        if let Err(e) = self.inner.txn("delete stale key", txn).await {
            tracing::warn!(error = %e, "leasehold.etcd: could not delete a stale waiter key");
        }
    }
}
