//! [`EtcdBackend`]: the lock primitives over etcd's KV, lease and watch APIs.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, GetResponse, KeyValue,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType,
    WatchOptions,
};
use leasehold_core::{
    Capabilities, DEFAULT_MAX_TTL, Error, ErrorKind, ExtendRequest, FencingKind, FencingToken,
    Grant, Held, HolderInfo, LeaseMonitor, LockBackend, LockKey, LockRequest, Owner, RenewalKind,
    SafetyClass, Validity, WaitKind, Waited, async_trait,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;

use crate::NAME;
use crate::config::{EtcdConfig, LeaseMode};
use crate::session::Session;

/// Locks on etcd: consensus-backed, with the lock key's create revision as fencing token.
///
/// Cheap to clone (clones share the connection and the session lease). See the crate
/// documentation for the key layout, guarantees and cancellation behaviour.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: EtcdConfig,
    /// The current session lease ([`LeaseMode::Session`]); replaced when lost.
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// In-process exclusion: one semaphore per waiter key (lock prefix + session lease), so
    /// two local tasks never share a waiter key (etcd would count them as one owner).
    local: Mutex<HashMap<Vec<u8>, Arc<Semaphore>>>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to etcd, checks that the key prefix can be read, and, in
    /// [`LeaseMode::Session`], grants the session lease (so a wrong address, password or
    /// missing permission shows here, not at the first lock).
    pub async fn connect(config: EtcdConfig) -> Result<Self, Error> {
        config.validate()?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_require_leader(true);
        if let Some(user) = &config.user {
            // etcd's auth tokens expire when unused for a while (5 min by default), and a
            // session that only sends keep-alives does not use its token: re-authenticate
            // when etcd says the token is invalid, instead of failing the next lock.
            opts = opts
                .with_user(user.clone(), config.password.clone().unwrap_or_default())
                .with_auto_token_refresh(true);
        }
        #[allow(unused_mut)]
        let mut endpoints = config.endpoints.clone();
        #[cfg(feature = "tls")]
        if let Some(tls) = &config.tls {
            let mut t = etcd_client::TlsOptions::new();
            if let Some(ca) = &tls.ca_pem {
                t = t.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some(domain) = &tls.domain {
                t = t.domain_name(domain.clone());
            }
            if let Some((cert, key)) = &tls.identity {
                t = t.identity(etcd_client::Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(t);
            endpoints = endpoints
                .iter()
                .map(|e| {
                    let bare = e.strip_prefix("http://").unwrap_or(e);
                    let bare = bare.strip_prefix("https://").unwrap_or(bare);
                    format!("https://{bare}")
                })
                .collect();
        }
        let timeout = config.connect_timeout + config.request_timeout;
        let client = with_timeout(timeout, "connect", || {
            Client::connect(endpoints.clone(), Some(opts.clone()))
        })
        .await
        .map_err(|e| e.into_core("connecting to etcd"))?;
        let backend = Self {
            inner: Arc::new(Inner {
                client,
                config,
                session: tokio::sync::Mutex::new(None),
                local: Mutex::new(HashMap::new()),
            }),
        };
        // A read under the prefix: a wrong address, a missing user or a user without access
        // to the prefix shows here, not at the first lock (etcd grants leases to anyone).
        let kv = backend.inner.client.kv_client();
        let prefix = backend.inner.config.prefix.clone();
        with_timeout(backend.inner.config.request_timeout, "probe", || {
            let (mut kv, prefix) = (kv.clone(), prefix.clone());
            async move {
                kv.get(prefix, Some(GetOptions::new().with_count_only()))
                    .await
            }
        })
        .await
        .map_err(|e| e.into_core("reaching etcd"))?;
        if backend.inner.config.lease_mode == LeaseMode::Session {
            backend.inner.session().await?;
        }
        Ok(backend)
    }

    /// The configuration in force.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The id of the current session lease, if one is alive ([`LeaseMode::Session`]), as
    /// `etcdctl lease list` shows it in hex.
    pub async fn session_lease_id(&self) -> Option<i64> {
        let s = self.inner.session.lock().await;
        s.as_ref().filter(|s| !s.is_lost()).map(|s| s.id())
    }

    /// The etcd key prefix under which `key`'s waiters live: `<prefix><key>/`.
    pub fn lock_prefix(&self, key: &LockKey) -> String {
        format!("{}{}/", self.inner.config.prefix, key.as_str())
    }

    async fn lock(&self, req: LockRequest<'_>, mode: Mode) -> Result<Option<Grant>, Error> {
        let prefix = self.lock_prefix(req.key).into_bytes();
        let (session, slot) = match self.inner.config.lease_mode {
            LeaseMode::PerLock => (None, None),
            LeaseMode::Session => loop {
                let session = self.inner.session().await?;
                let key = waiter_key(&prefix, session.id());
                let slot = LocalSlot::new(&self.inner, key);
                match mode {
                    Mode::Try => match Arc::clone(&slot.sem).try_acquire_owned() {
                        Ok(p) => break (Some(session), Some(slot.with(p))),
                        Err(_) => return Ok(None),
                    },
                    Mode::Wait(deadline) => tokio::select! {
                        p = Arc::clone(&slot.sem).acquire_owned() => match p {
                            Ok(p) => break (Some(session), Some(slot.with(p))),
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
        let job = Job {
            inner: Arc::clone(&self.inner),
            prefix,
            owner: req.owner.as_str().to_owned(),
            ttl: req.ttl,
            started: req.started,
            monitor: req.monitor.clone(),
            mode,
            session,
            slot,
            created: false,
        };
        // The etcd part runs in its own task, so a request that was sent always has its
        // outcome seen: if our caller is gone by then, the task deletes what it created.
        tokio::spawn(job.run(tx));
        rx.await.unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Backend,
                NAME,
                "the acquisition task ended without an answer",
            ))
        })
    }
}

impl Inner {
    /// The current session lease, or a new one if there is none or it was lost.
    async fn session(&self) -> Result<Arc<Session>, Error> {
        let mut cur = self.session.lock().await;
        if let Some(s) = cur.as_ref()
            && !s.is_lost()
        {
            return Ok(Arc::clone(s));
        }
        let s = Session::grant(
            self.client.lease_client(),
            self.config.session_ttl,
            self.config.request_timeout,
            true,
        )
        .await
        .map_err(|e| e.into_core("granting the session lease"))?;
        *cur = Some(Arc::clone(&s));
        Ok(s)
    }

    fn local(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Arc<Semaphore>>> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, EtcdError> {
        let kv = self.client.kv_client();
        with_timeout(self.config.request_timeout, what, || {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    async fn get(
        &self,
        what: &'static str,
        key: Vec<u8>,
        opts: Option<GetOptions>,
    ) -> Result<GetResponse, EtcdError> {
        let kv = self.client.kv_client();
        with_timeout(self.config.request_timeout, what, || {
            let (mut kv, key, opts) = (kv.clone(), key.clone(), opts.clone());
            async move { kv.get(key, opts).await }
        })
        .await
    }

    /// Deletes `key` if its value is `owner`: `Ok(true)` if it did.
    async fn delete_if_owner(&self, key: &[u8], owner: &str) -> Result<bool, EtcdError> {
        let txn = Txn::new()
            .when([Compare::value(key.to_vec(), CompareOp::Equal, owner)])
            .and_then([TxnOp::delete(key.to_vec(), None)]);
        Ok(self.txn("release", txn).await?.succeeded())
    }

    /// Every key under `prefix` whose value is `owner`.
    async fn find_owner(&self, prefix: &[u8], owner: &str) -> Result<Vec<KeyValue>, EtcdError> {
        let resp = self
            .get(
                "get",
                prefix.to_vec(),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter(|kv| kv.value() == owner.as_bytes())
            .cloned()
            .collect())
    }
}

/// The key a session lease waits on and holds a lock with: `<lock prefix><lease id in hex>`,
/// exactly as `etcdctl lock` (the v3 concurrency recipe) names it.
fn waiter_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Try,
    Wait(Instant),
}

/// One in-process lock slot: the semaphore of a waiter key, and our permit once we have it.
/// Dropping it frees the permit and forgets the semaphore if nobody else uses it.
struct LocalSlot {
    inner: Arc<Inner>,
    key: Vec<u8>,
    sem: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

impl LocalSlot {
    fn new(inner: &Arc<Inner>, key: Vec<u8>) -> Self {
        let sem = Arc::clone(
            inner
                .local()
                .entry(key.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(1))),
        );
        Self {
            inner: Arc::clone(inner),
            key,
            sem,
            permit: None,
        }
    }

    fn with(mut self, permit: OwnedSemaphorePermit) -> Self {
        self.permit = Some(permit);
        self
    }
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut map = self.inner.local();
        // Two references: the map's and ours. Nobody else waits on it: forget it.
        if Arc::strong_count(&self.sem) == 2 {
            map.remove(&self.key);
        }
    }
}

/// The etcd part of one acquisition, run in its own task.
struct Job {
    inner: Arc<Inner>,
    prefix: Vec<u8>,
    owner: String,
    ttl: Duration,
    /// The instant before our caller sent the request: no validity starts later.
    started: Instant,
    monitor: LeaseMonitor,
    mode: Mode,
    /// The session lease (given in session mode; granted by the job in per-lock mode).
    session: Option<Arc<Session>>,
    slot: Option<LocalSlot>,
    /// Whether a write of our key may have reached etcd.
    created: bool,
}

type Answer = oneshot::Sender<Result<Option<Grant>, Error>>;

impl Job {
    async fn run(mut self, mut tx: Answer) {
        let outcome = self.attempt(&mut tx).await;
        let per_lock = self.inner.config.lease_mode == LeaseMode::PerLock;
        match (outcome, self.session.take()) {
            (Ok(Some(rev)), Some(session)) => {
                let key = waiter_key(&self.prefix, session.id());
                let v = session.validity(self.ttl);
                // A per-lock lease was granted after our caller's request started; count
                // from the earlier instant, as the contract asks.
                let validity = Validity::new(v.from.min(self.started), v.ttl);
                session.watch(self.monitor.clone(), self.ttl);
                let state = EtcdGrant {
                    inner: Arc::clone(&self.inner),
                    key,
                    owner: std::mem::take(&mut self.owner),
                    session,
                    per_lock,
                    slot: Mutex::new(self.slot.take()),
                    done: AtomicBool::new(false),
                };
                let fencing = FencingToken::new(u64::try_from(rev).unwrap_or(0));
                let grant = Grant::new(validity).with_fencing(fencing).with_state(state);
                // If our caller is gone, dropping the grant releases it (EtcdGrant's Drop).
                drop(tx.send(Ok(Some(grant))));
            }
            (outcome, session) => {
                drop(tx.send(outcome.map(|_| None)));
                if let Some(session) = session {
                    if per_lock {
                        session.close();
                    } else if self.created {
                        let key = waiter_key(&self.prefix, session.id());
                        finish(&self.inner, &key, &self.owner, &session).await;
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
        let session = match &self.session {
            Some(s) => Arc::clone(s),
            None => {
                let s = Session::grant(
                    self.inner.client.lease_client(),
                    self.ttl,
                    self.inner.config.request_timeout,
                    true,
                )
                .await
                .map_err(|e| e.into_core("granting a lease"))?;
                self.session = Some(Arc::clone(&s));
                s
            }
        };
        let key = waiter_key(&self.prefix, session.id());
        let put = TxnOp::put(
            key.clone(),
            self.owner.clone(),
            Some(PutOptions::new().with_lease(session.id())),
        );
        let my_rev = match self.mode {
            Mode::Try => {
                // Create our key only if nothing at all is under the lock prefix: nobody holds
                // it and nobody is queued for it.
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(self.prefix.clone(), CompareOp::Equal, 0)
                            .with_prefix(),
                    ])
                    .and_then([put])
                    .or_else([TxnOp::get(key.clone(), None)]);
                if tx.is_closed() {
                    return Ok(None);
                }
                self.created = true;
                let resp = self
                    .inner
                    .txn("try lock", txn)
                    .await
                    .map_err(|e| e.into_core("try lock"))?;
                if !resp.succeeded() {
                    match first_kv(&resp, 0) {
                        // Our own key already: an earlier send of this very request landed.
                        Some(kv) if kv.value() == self.owner.as_bytes() => {
                            return Ok(Some(kv.create_revision()));
                        }
                        Some(stale) => self.drop_stale(&stale).await,
                        None => {}
                    }
                    self.created = false;
                    return Ok(None);
                }
                return Ok(Some(revision(&resp)?));
            }
            Mode::Wait(_) => {
                // The queued recipe: our key joins the queue; the oldest key holds the lock.
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([put, TxnOp::get(self.prefix.clone(), Some(first_created()))])
                    .or_else([TxnOp::get(key.clone(), None)]);
                if tx.is_closed() {
                    return Ok(None);
                }
                self.created = true;
                let resp = self
                    .inner
                    .txn("lock", txn)
                    .await
                    .map_err(|e| e.into_core("lock"))?;
                if resp.succeeded() {
                    let my_rev = revision(&resp)?;
                    if first_kv(&resp, 1).is_none_or(|kv| kv.create_revision() == my_rev) {
                        return Ok(Some(my_rev));
                    }
                    my_rev
                } else {
                    match first_kv(&resp, 0) {
                        // Our own key already: queued (or holding) since its create revision.
                        Some(kv) if kv.value() == self.owner.as_bytes() => kv.create_revision(),
                        stale => {
                            self.created = false;
                            if let Some(stale) = stale {
                                self.drop_stale(&stale).await;
                            }
                            return Err(Error::new(
                                ErrorKind::Unavailable,
                                NAME,
                                "found a stale waiter key of our own session; removed it, retry",
                            ));
                        }
                    }
                }
            }
        };
        let Mode::Wait(deadline) = self.mode else {
            return Ok(None);
        };
        loop {
            // Our predecessor: the newest key created before ours. Also check our own key is
            // still there (a lost session deletes it, and then there is nothing to wait for).
            let txn = Txn::new().and_then([
                TxnOp::get(
                    self.prefix.clone(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_max_create_revision(my_rev - 1)
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_limit(1),
                    ),
                ),
                TxnOp::get(key.clone(), None),
            ]);
            let resp = self
                .inner
                .txn("lock wait", txn)
                .await
                .map_err(|e| e.into_core("lock wait"))?;
            let ours = first_kv(&resp, 1);
            if ours.is_none_or(|kv| kv.value() != self.owner.as_bytes()) {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    NAME,
                    "our waiter key vanished while we waited (the session lease was lost)",
                ));
            }
            let Some(pred) = first_kv(&resp, 0) else {
                return Ok(Some(my_rev));
            };
            let from = resp.header().map_or(0, |h| h.revision()) + 1;
            let mut watch = self.inner.client.watch_client();
            let pred_key = pred.key().to_vec();
            let deleted = async move {
                let opts = WatchOptions::new()
                    .with_start_revision(from)
                    .with_filters([WatchFilterType::NoPut]);
                let mut stream = watch.watch(pred_key, Some(opts)).await?;
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
                Ok::<(), etcd_client::Error>(())
            };
            tokio::select! {
                r = deleted => {
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

/// The oldest key under a prefix: the lock's holder.
fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

fn first_kv(resp: &TxnResponse, op: usize) -> Option<KeyValue> {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
        _ => None,
    }
}

fn revision(resp: &TxnResponse) -> Result<i64, Error> {
    resp.header()
        .map(|h| h.revision())
        .filter(|r| *r > 0)
        .ok_or_else(|| Error::new(ErrorKind::Backend, NAME, "etcd answered without a revision"))
}

/// Deletes our key after an acquisition that did not end in a grant (or a grant nobody
/// took), retrying while the session lease lives; once the lease is gone, so is the key.
async fn finish(inner: &Inner, key: &[u8], owner: &str, session: &Session) {
    let mut delay = Duration::from_millis(50);
    for _ in 0..40 {
        match inner.delete_if_owner(key, owner).await {
            Ok(_) => return,
            Err(e) => {
                if session.is_lost() {
                    return;
                }
                tracing::debug!(error = %e, "leasehold.etcd: cleanup delete failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
    tracing::warn!("leasehold.etcd: gave up deleting an abandoned waiter key");
}

/// The backend-private state of a grant.
struct EtcdGrant {
    inner: Arc<Inner>,
    key: Vec<u8>,
    owner: String,
    session: Arc<Session>,
    per_lock: bool,
    /// Our in-process permit, freed once our key is deleted.
    slot: Mutex<Option<LocalSlot>>,
    done: AtomicBool,
}

impl EtcdGrant {
    fn take_slot(&self) -> Option<LocalSlot> {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Drop for EtcdGrant {
    fn drop(&mut self) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        // Never released (the grant was dropped before anyone took it, or release failed):
        // delete our key in the background, then free the permit.
        if self.per_lock {
            self.session.close();
            return;
        }
        let slot = self.take_slot();
        let (inner, key, owner, session) = (
            Arc::clone(&self.inner),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.owner),
            Arc::clone(&self.session),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(async move {
                finish(&inner, &key, &owner, &session).await;
                drop(slot);
            }));
        }
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(SafetyClass::Correctness, FencingKind::Monotonic)
            .with_wait(WaitKind::Native)
            .with_renewal(RenewalKind::Session)
            .with_ttl_range(Duration::from_secs(1), DEFAULT_MAX_TTL)
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.lock(req, Mode::Try).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let grant = self.lock(req, Mode::Wait(deadline)).await?;
        Ok(Waited::new(grant, 1))
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        match held.state::<EtcdGrant>() {
            Some(g) => {
                if g.done.load(Ordering::Acquire) {
                    return Ok(false);
                }
                let ours = g
                    .inner
                    .delete_if_owner(&g.key, &g.owner)
                    .await
                    .map_err(|e| e.into_core("release"))?;
                if !g.done.swap(true, Ordering::AcqRel) {
                    if g.per_lock {
                        g.session.close();
                    }
                    drop(g.take_slot());
                }
                Ok(ours)
            }
            None => {
                // An acquisition whose outcome the caller never saw: delete whatever key holds
                // its owner value (its own task also cleans up; both compare on the value).
                let prefix = self.lock_prefix(held.key).into_bytes();
                let owner = held.owner.as_str();
                let found = self
                    .inner
                    .find_owner(&prefix, owner)
                    .await
                    .map_err(|e| e.into_core("release"))?;
                let mut any = false;
                for kv in found {
                    any |= self
                        .inner
                        .delete_if_owner(kv.key(), owner)
                        .await
                        .map_err(|e| e.into_core("release"))?;
                    if self.inner.config.lease_mode == LeaseMode::PerLock {
                        crate::session::spawn_revoke(self.inner.client.lease_client(), kv.lease());
                    }
                }
                Ok(any)
            }
        }
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let (key, owner, session) = match req.held.state::<EtcdGrant>() {
            Some(g) => (
                g.key.clone(),
                g.owner.as_str(),
                Some(Arc::clone(&g.session)),
            ),
            None => {
                let prefix = self.lock_prefix(req.held.key).into_bytes();
                let owner = req.held.owner.as_str();
                let found = self
                    .inner
                    .find_owner(&prefix, owner)
                    .await
                    .map_err(|e| e.into_core("extend"))?;
                let current = self.inner.session.lock().await.clone();
                let session = current.filter(|s| found.iter().any(|kv| kv.lease() == s.id()));
                match (found.into_iter().next(), session) {
                    (Some(kv), Some(s)) => (kv.key().to_vec(), owner, Some(s)),
                    _ => return Ok(None),
                }
            }
        };
        let Some(session) = session.filter(|s| !s.is_lost()) else {
            return Ok(None);
        };
        // Confirm with etcd that our key is still there, on our lease.
        let validity = session.validity(req.ttl);
        let resp = self
            .inner
            .get("extend", key, None)
            .await
            .map_err(|e| e.into_core("extend"))?;
        let held = resp
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == owner.as_bytes() && kv.lease() == session.id());
        Ok(held.then_some(validity))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let prefix = self.lock_prefix(key);
        let resp = self
            .inner
            .get("inspect", prefix.into_bytes(), Some(first_created()))
            .await
            .map_err(|e| e.into_core("inspect"))?;
        let Some(holder) = resp.kvs().first() else {
            return Ok(None);
        };
        let mut info = HolderInfo::unknown()
            .with_fencing(FencingToken::new(
                u64::try_from(holder.create_revision()).unwrap_or(0),
            ))
            .with_detail(format!(
                "etcd key {:?} on lease {:x}",
                String::from_utf8_lossy(holder.key()),
                holder.lease()
            ));
        if !holder.value().is_empty() {
            info = info.with_owner(Owner::from_raw(String::from_utf8_lossy(holder.value())));
        }
        if holder.lease() != 0 {
            let lease = self.inner.client.lease_client();
            let id = holder.lease();
            if let Ok(ttl) = with_timeout(self.inner.config.request_timeout, "lease ttl", || {
                let mut lease = lease.clone();
                async move { lease.time_to_live(id, None).await }
            })
            .await
                && ttl.ttl() > 0
            {
                info =
                    info.with_remaining(Duration::from_secs(u64::try_from(ttl.ttl()).unwrap_or(0)));
            }
        }
        Ok(Some(info))
    }
}

/// A driver-private error, converted to [`Error`] at the boundary.
#[derive(Debug)]
pub(crate) enum EtcdError {
    Client(etcd_client::Error),
    Timeout(&'static str, Duration),
    Protocol(String),
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Client(e) => write!(f, "{e}"),
            Self::Timeout(what, d) => write!(f, "{what}: no answer within {d:?}"),
            Self::Protocol(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for EtcdError {}

impl EtcdError {
    /// Whether etcd said the lease does not exist.
    pub(crate) fn is_not_found(&self) -> bool {
        match self {
            Self::Client(etcd_client::Error::GRpcStatus(s)) => i32::from(s.code()) == 5,
            _ => false,
        }
    }

    fn into_core(self, what: &str) -> Error {
        let kind = match &self {
            Self::Timeout(..) => ErrorKind::Unavailable,
            Self::Protocol(_) => ErrorKind::Backend,
            Self::Client(e) if is_auth_refusal(e) => ErrorKind::InvalidConfig,
            Self::Client(e) => match e {
                etcd_client::Error::GRpcStatus(s) => match i32::from(s.code()) {
                    // permission denied, unauthenticated
                    7 | 16 => ErrorKind::InvalidConfig,
                    // invalid argument, failed precondition, out of range
                    3 | 9 | 11 => ErrorKind::Backend,
                    _ => ErrorKind::Unavailable,
                },
                etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => {
                    ErrorKind::InvalidConfig
                }
                etcd_client::Error::TransportError(_)
                | etcd_client::Error::IoError(_)
                | etcd_client::Error::LeaseKeepAliveError(_)
                | etcd_client::Error::WatchError(_) => ErrorKind::Unavailable,
                _ => ErrorKind::Backend,
            },
        };
        let msg = format!("{what}: {self}");
        Error::new(kind, NAME, msg).with_source(self)
    }
}

/// Whether etcd refused the credentials (or their absence): a configuration problem, which
/// retrying does not fix. etcd reports these with generic codes, so its messages (stable
/// strings of its `rpctypes`) tell them apart.
fn is_auth_refusal(e: &etcd_client::Error) -> bool {
    const REFUSALS: [&str; 4] = [
        "etcdserver: authentication failed, invalid user ID or password",
        "etcdserver: user name is empty",
        "etcdserver: authentication is not enabled",
        "etcdserver: user name not found",
    ];
    match e {
        etcd_client::Error::GRpcStatus(s) => REFUSALS.iter().any(|m| s.message().contains(m)),
        _ => false,
    }
}

impl From<etcd_client::Error> for EtcdError {
    fn from(e: etcd_client::Error) -> Self {
        Self::Client(e)
    }
}

/// Runs one etcd request with a time limit, trying again while it fails *without having been
/// sent* (the client's balancer picked a member it cannot connect to: a stopped member, or one
/// whose connection broke and has not been re-established yet). A request that may have been
/// sent is never repeated here.
pub(crate) async fn with_timeout<T, F, Fut>(
    limit: Duration,
    what: &'static str,
    mut request: F,
) -> Result<T, EtcdError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + limit;
    let mut delay = Duration::from_millis(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, request()).await {
            Ok(Err(e)) if is_unsent(&e) && Instant::now() + delay < deadline => {
                tracing::trace!(error = %e, what, "leasehold.etcd: request not sent; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(250));
            }
            Ok(r) => return r.map_err(EtcdError::Client),
            Err(_) => return Err(EtcdError::Timeout(what, limit)),
        }
    }
}

/// Whether the request certainly never reached etcd: the connection to the chosen member could
/// not be made.
fn is_unsent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            i32::from(s.code()) == 14 && s.message().contains("connect error")
        }
        _ => false,
    }
}
