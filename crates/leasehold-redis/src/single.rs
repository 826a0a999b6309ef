//! [`RedisBackend`]: one Redis server, with a best-effort fencing counter and release wake-ups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::async_trait;
use leasehold_core::{
    Candidate, Capabilities, ElectionBackend, Error, ExtendRequest, FencingKind, Grant, Held,
    HolderInfo, LockBackend, LockKey, LockRequest, PermitBackend, PermitLimit, ReleaseGate,
    SafetyClass, Validity, WaitKind, Waited,
};
use redis::ProtocolVersion;
use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClient;
use tokio::time::Instant;

use crate::config::{Deployment, REDIS as NAME, RedisConfig, invalid};
use crate::fence::FenceExpiry;
use crate::keys::{NameList, Names};
use crate::node::{Connector, Node, Taken, names};
use crate::renew::extend_on;
use crate::replica::{ReplicaSync, Source};
use crate::semaphore::RedisPermits;
use crate::sentinel::SentinelConnector;
use crate::wake::{Subscription, WakeHub, pushes_to, wait_on};

/// What single-node Redis guarantees and supports: a constant, as
/// [`LockBackend::capabilities`] requires.
const CAPABILITIES: Capabilities =
    Capabilities::new(NAME, SafetyClass::Efficiency, FencingKind::BestEffort)
        .with_wait(WaitKind::Native)
        .with_ttl_range(Duration::from_millis(10), leasehold_core::DEFAULT_MAX_TTL)
        .with_semaphores()
        .with_elections();

/// How long a waiter's announcement outlives the longest pause between its attempts (each
/// failed attempt renews it).
const ANNOUNCE_SLACK: Duration = Duration::from_secs(1);

/// Locks on one Redis server: an *efficiency* lock with a best-effort fencing token.
///
/// See the [crate docs](crate) for the key mapping, the scripts and what this does not
/// guarantee. Cloning is cheap: clones share the connection.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
    /// Whether this is the election view's lock: the names of elections (`…:elect`).
    elect: bool,
}

struct Inner {
    node: Arc<Node>,
    /// The replica-sync check, when configured.
    sync: Option<ReplicaSync>,
    config: RedisConfig,
    wake: Arc<WakeHub>,
    /// Local FIFO queues: one Redis contender per key per backend.
    queues: Mutex<HashMap<(bool, LockKey), Arc<KeyQueue>>>,
    releases: Arc<ReleaseGate>,
}

#[derive(Default)]
struct KeyQueue {
    turn: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl RedisBackend {
    /// Connects to the server in `config`.
    pub async fn connect(config: RedisConfig) -> Result<Self, Error> {
        let wake = Arc::new(WakeHub::default());
        let manager = |hub: &Arc<WakeHub>| {
            let cm = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.response_timeout))
                .set_number_of_retries(1);
            pushes_to(cm, hub)
        };
        let mut sync = None;
        let connector = match &config.deployment {
            Deployment::Server(server) => {
                let client = server.client(NAME, server.resp3(), config.tls_ca.as_deref())?;
                sync = Some(Source::Client(Box::new(client.clone())));
                Connector::Single(client, manager(&wake))
            }
            Deployment::Sentinel(target) => {
                let client = target.client(NAME, config.tls_ca.as_deref())?;
                let s = Arc::new(SentinelConnector::new(client, manager(&wake)));
                sync = Some(Source::Sentinel(Arc::clone(&s)));
                Connector::Sentinel(s)
            }
            Deployment::Cluster(seeds) => {
                let mut builder = ClusterClient::builder(seeds.iter().map(|s| s.resp3()));
                if seeds.iter().any(|s| s.is_tls()) {
                    crate::config::install_crypto_provider();
                    if let Some(ca) = &config.tls_ca {
                        builder = builder.certs(redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(ca.clone()),
                        });
                    }
                }
                let client = builder
                    .use_protocol(ProtocolVersion::RESP3)
                    .connection_timeout(config.connect_timeout)
                    .response_timeout(config.response_timeout)
                    // A master that is down must fail its slots' requests quickly, not after
                    // the client library's default sixteen retries.
                    .retries(2)
                    .push_sender(WakeHub::sender(&wake))
                    .build()
                    .map_err(|e| {
                        invalid(NAME, format!("{}: {}", config.redacted_url(), e.category()))
                    })?;
                Connector::Cluster(client)
            }
        };
        let name = config.deployment.name();
        let sync = config.replica_sync.zip(sync).map(|(wait, source)| {
            ReplicaSync::new(
                wait,
                config.connect_timeout,
                &config.prefix,
                source,
                name.clone(),
            )
        });
        let node = Node::new(NAME, connector, name);
        node.conn().await?;
        let releases = Arc::new(ReleaseGate::new(config.releases_in_flight));
        Ok(Self {
            inner: Arc::new(Inner {
                node,
                sync,
                config,
                wake,
                queues: Mutex::new(HashMap::new()),
                releases,
            }),
            elect: false,
        })
    }

    /// Counts the lock keys under this backend's prefix on the server (SCAN): the leak check
    /// of the tests. Fence counters are not counted. Not available on a Redis Cluster (SCAN
    /// sees one node): count on each master instead.
    pub async fn count_lock_keys(&self, key_prefix: &str) -> Result<usize, Error> {
        if self.inner.node.is_cluster() {
            return Err(Error::new(
                leasehold_core::ErrorKind::Unsupported,
                NAME,
                "counting keys needs one connection per master on a Redis Cluster",
            ));
        }
        let pattern = format!(
            "{}{{{}*}}",
            self.inner.config.prefix,
            crate::node::glob_escape(key_prefix)
        );
        self.inner.node.count_keys(&pattern).await
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// What a permit view shares with this backend: the node, its wake-ups, the release gate.
    pub(crate) fn parts(&self) -> (&Arc<Node>, &Arc<WakeHub>, &Arc<ReleaseGate>) {
        (&self.inner.node, &self.inner.wake, &self.inner.releases)
    }

    /// One attempt; see [`Attempt`].
    async fn attempt(&self, req: &LockRequest<'_>, how: Attempt) -> Result<Option<Grant>, Error> {
        let names = self.names(req.key);
        let fence = FenceExpiry(self.inner.config.fence_ttl);
        let node = &self.inner.node;
        let taken = match (self.inner.config.fair, how) {
            // A try (the uncontended path) is a plain `SET NX`, in fair mode too: a release
            // hands a lock with a line to its head, so a free lock has no line to jump (unless
            // its holder let it expire).
            (_, Attempt::Try) | (None, Attempt::First) => {
                node.take(&names, req.owner, req.ttl, Some(fence)).await?
            }
            // Fair mode, a wait's first attempt: a free lock only if nobody is in line (the
            // one case a try cannot see), without joining the line yet.
            (Some(grace), Attempt::First) => {
                node.take_fair(&names, req.owner, req.ttl, false, grace, fence)
                    .await?
            }
            (Some(grace), Attempt::Announce) => {
                node.take_fair(&names, req.owner, req.ttl, true, grace, fence)
                    .await?
            }
            // A waiting attempt announces the waiter when the lock is held, so the release
            // hands it the lock and wakes it; in the order of the server's clock.
            (None, Attempt::Announce) => {
                let announce = self.inner.config.wait_backoff.max * 2 + ANNOUNCE_SLACK;
                node.take_or_wait(&names, req.owner, req.ttl, Some(fence), announce, None)
                    .await?
            }
        };
        match taken {
            Taken::Granted(token) => {
                if let Some(sync) = &self.inner.sync
                    && let Err(e) = sync.check(names.lock(), req.owner).await
                {
                    self.give_back(req.key, req.owner);
                    return Err(e);
                }
                let grant = Grant::new(req.ttl_validity());
                Ok(Some(match token {
                    Some(t) => grant.with_fencing(t),
                    None => grant,
                }))
            }
            Taken::Held => Ok(None),
        }
    }

    /// Releases `owner`'s grant (or place in the fair line or on the wait list) on `key` in a
    /// task counted by `settle`.
    fn give_back(&self, key: &LockKey, owner: &leasehold_core::Owner) {
        let fair = self.inner.config.fair;
        let (node, names, owner) = (Arc::clone(&self.inner.node), self.names(key), owner.clone());
        leasehold_core::spawn_detached(async move {
            if let Err(e) = node.release(names, &owner, fair).await {
                tracing::debug!(error = %e, "leasehold-redis: giving a grant back failed");
            }
        });
    }

    /// The Redis names of `key`: a lock's, or in the election view an election's.
    fn names(&self, key: &LockKey) -> Names {
        if self.elect {
            Names::election(&self.inner.config.prefix, key)
        } else {
            names(&self.inner.config.prefix, key)
        }
    }

    fn queue(&self, key: &LockKey) -> Arc<KeyQueue> {
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(queues.entry((self.elect, key.clone())).or_default())
    }

    /// Drops the local queue of `key` once nobody waits in it.
    fn tidy_queue(&self, key: &LockKey, queue: Arc<KeyQueue>) {
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drop(queue);
        let entry = (self.elect, key.clone());
        if queues
            .get(&entry)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            queues.remove(&entry);
        }
    }
}

/// Removes a key's local queue when its last waiter leaves, even if the wait was cancelled.
/// What an attempt does besides taking a free lock.
#[derive(Clone, Copy)]
enum Attempt {
    /// Nothing: `try_lock`.
    Try,
    /// A wait's first attempt, before it subscribes: nothing in plain mode; in fair mode it
    /// also yields to a line.
    First,
    /// A waiting attempt after subscribing: announces the waiter when the lock is held (fair
    /// mode: joins the line, refreshes its place, or claims the lock a release handed it).
    Announce,
}

struct QueueGuard<'a> {
    backend: &'a RedisBackend,
    key: &'a LockKey,
    queue: Option<Arc<KeyQueue>>,
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.queue.take() {
            self.backend.tidy_queue(self.key, q);
        }
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    /// A `LockElection` over this server's locks under the election names (`…:elect`).
    fn election(self: Arc<Self>, candidate: Candidate) -> Result<Arc<dyn ElectionBackend>, Error> {
        let node = Arc::clone(&self.inner.node);
        let locks = Self {
            inner: Arc::clone(&self.inner),
            elect: true,
        };
        let store = crate::election::RedisLeaders::new(node, self.inner.config.prefix.clone());
        Ok(Arc::new(leasehold_core::LockElection::new(
            Arc::new(locks),
            Arc::new(store),
            candidate,
            crate::election::POLL,
        )))
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// A [`RedisPermits`] view (see [`semaphore`](crate::semaphore)).
    fn semaphore(self: Arc<Self>, limit: PermitLimit) -> Result<Arc<dyn PermitBackend>, Error> {
        let config = &self.inner.config;
        Ok(Arc::new(RedisPermits::new(
            self.parts(),
            config.prefix.clone(),
            config.wait_backoff,
            limit,
            CAPABILITIES,
        )))
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.attempt(&req, Attempt::Try).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let queue = QueueGuard {
            backend: self,
            key: req.key,
            queue: Some(self.queue(req.key)),
        };
        let Some(q) = queue.queue.as_ref() else {
            return Ok(Waited::new(None, 0));
        };
        // Local FIFO: tokio's mutex serves waiters in order, so one task per key contends with
        // other processes and the others queue behind it.
        let Ok(_turn) = tokio::time::timeout_at(deadline, q.turn.lock()).await else {
            return Ok(Waited::new(None, 0));
        };
        // A free lock is taken by one plain attempt, with no subscription: subscribing first
        // cost every uncontended acquisition two more round trips (`SUBSCRIBE`, and the
        // `UNSUBSCRIBE` after it). Only a lock found taken is waited for; the wait's first
        // attempt comes after the subscription, so a release in between is not missed. Not in
        // the election view: its term is the fence counter, which a plain attempt that finds
        // the lock held still counts up (see `Node::take`).
        let first = !self.elect;
        if first && let Some(grant) = self.attempt(&req, Attempt::First).await? {
            return Ok(Waited::new(Some(grant), 1));
        }
        let names = self.names(req.key);
        let channel = names.waiter_channel(req.owner);
        let sub = Subscription::new(&self.inner.node, &self.inner.wake, &channel).await?;
        // Woken by a release message on our own channel (a release wakes one waiter: the one
        // it handed the lock to, the first in line or on the wait list), or
        // after a jittered backoff in case a message was lost or went to a waiter that left.
        // In fair mode the backoff also keeps our place in line: we ask again well within the
        // grace period.
        let config = &self.inner.config;
        let pause = |attempts| match config.fair {
            Some(grace) => config.wait_backoff.delay(attempts).min(grace / 3),
            None => config.wait_backoff.delay(attempts),
        };
        let waited = wait_on(std::slice::from_ref(&sub), deadline, pause, |started| {
            let attempt = LockRequest::new(req.key, req.owner, req.ttl, started, req.monitor);
            async move { self.attempt(&attempt, Attempt::Announce).await }
        })
        .await?;
        // Ended without the lock: off the fair line or the wait list, so that no release hands
        // the lock to a waiter that left, or spends its one wake-up on it.
        if waited.grant.is_none() {
            self.give_back(req.key, req.owner);
        }
        Ok(Waited::new(
            waited.grant,
            waited.attempts + u32::from(first),
        ))
    }

    fn release_gate(&self) -> Option<&ReleaseGate> {
        Some(&self.inner.releases)
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let names = self.names(held.key);
        self.inner
            .node
            .release(names, held.owner, self.inner.config.fair)
            .await
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let names = self.names(req.held.key);
        let ok = self
            .inner
            .node
            .extend(&names, req.held.owner, req.ttl)
            .await?;
        Ok(ok.then(|| req.ttl_validity()))
    }

    async fn extend_many(
        &self,
        reqs: &[ExtendRequest<'_>],
    ) -> Vec<Result<Option<Validity>, Error>> {
        // The names as this view maps keys: an election view's leases are elections.
        let keys = reqs.iter().map(|r| r.held.key);
        let all = NameList::new(&self.inner.config.prefix, keys, self.elect);
        let answers = extend_on(&self.inner.node, &all, reqs, None).await;
        answers
            .into_iter()
            .zip(reqs)
            .map(|(held, req)| held.map(|h| h.then(|| req.ttl_validity())))
            .collect()
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let names = self.names(key);
        Ok(self
            .inner
            .node
            .inspect(&names)
            .await?
            .map(|(owner, remaining, fence)| {
                let mut info = HolderInfo::unknown().with_owner(owner);
                if let Some(r) = remaining {
                    info = info.with_remaining(r);
                }
                if let Some(f) = fence {
                    info = info.with_fencing(leasehold_core::FencingToken::new(f));
                }
                info
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::{Handoff, ReleaseCall};
    use leasehold_core::{LeaseMonitor, Owner};
    use leasehold_test_support::require_service;
    use leasehold_test_support::services::{Service, unique_prefix};

    /// A config for `url` with a fresh prefix named after `test`.
    fn config(url: &str, test: &str) -> RedisConfig {
        let prefix = format!("{}:", unique_prefix(test));
        RedisConfig::from_url(url)
            .and_then(|c| c.with_prefix(&prefix))
            .unwrap()
    }

    /// Held by each test of this module for its whole run: `SCRIPT FLUSH` (below) empties the
    /// server's script cache under the others' feet, and a flush between another test's reload
    /// and its retry fails that test's request (seen once, as `NoScript`).
    static SCRIPTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// The scripts run by SHA. After `SCRIPT FLUSH` (what a restarted server without them looks
    /// like) every request loads its script again and succeeds: acquire (plain and fair),
    /// extend and release.
    #[tokio::test]
    async fn scripts_are_loaded_again_after_script_flush() {
        let ep = require_service!(Service::Redis);
        let _alone = SCRIPTS.lock().await;
        let config = config(ep.url(), "noscript");
        let plain = RedisBackend::connect(config.clone()).await.unwrap();
        let fair = RedisBackend::connect(config.with_fair_queue(Duration::from_secs(1)).unwrap())
            .await
            .unwrap();
        let flush = async || {
            let mut c = plain.inner.node.conn().await.unwrap();
            let () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut c)
                .await
                .unwrap();
        };
        let key = LockKey::new("k").unwrap();
        let ttl = Duration::from_secs(5);
        let mut last = 0;
        for backend in [&plain, &fair] {
            for _ in 0..2 {
                let owner = Owner::random().unwrap();
                let monitor = LeaseMonitor::detached();
                flush().await;
                let req = LockRequest::new(&key, &owner, ttl, Instant::now(), &monitor);
                let grant = backend.try_lock(req).await.unwrap().expect("free");
                let token = grant.fencing.expect("a fencing token").get();
                assert!(token > last, "token {token} after {last}");
                last = token;
                flush().await;
                let held = Held::new(&key, &owner, grant.fencing, None);
                let extended = backend.extend(ExtendRequest::new(held, ttl, Instant::now()));
                assert!(extended.await.unwrap().is_some(), "extend lost the grant");
                flush().await;
                assert!(
                    backend.release(held).await.unwrap(),
                    "release found nothing"
                );
                assert!(!backend.release(held).await.unwrap(), "released twice");
            }
        }
    }

    /// A Redlock waiter's give-back (`RELEASE` with `K`, after a round short of a quorum) on a
    /// node whose lock another holds keeps the waiter on that node's wait list, so the node's
    /// next release still hands the lock to it; a plain release by a waiter (it gave up) takes
    /// it off. The give-back once took the waiter off too: nodes that answered last could then
    /// name different waiters.
    #[tokio::test]
    async fn a_waiters_give_back_keeps_its_place_on_the_wait_list() {
        let ep = require_service!(Service::Redis);
        let _alone = SCRIPTS.lock().await;
        let config = config(ep.url(), "giveback");
        let backend = RedisBackend::connect(config).await.unwrap();
        let node = &backend.inner.node;
        let key = LockKey::new("k").unwrap();
        let names = backend.names(&key);
        let ttl = Duration::from_secs(10);
        let (holder, waiter) = (Owner::random().unwrap(), Owner::random().unwrap());
        let listed = async |who: &Owner| -> bool {
            let mut c = node.conn().await.unwrap();
            let score: Option<f64> = redis::cmd("ZSCORE")
                .arg(names.wait_list())
                .arg(who.as_str())
                .query_async(&mut c)
                .await
                .unwrap();
            score.is_some()
        };
        let taken = node.take(&names, &holder, ttl, None).await.unwrap();
        assert!(matches!(taken, Taken::Granted(_)), "the key is free");
        let announce = Duration::from_secs(10);
        let waited = node.take_or_wait(&names, &waiter, ttl, None, announce, Some(7));
        assert!(
            matches!(waited.await.unwrap(), Taken::Held),
            "held by the holder"
        );
        assert!(listed(&waiter).await, "the waiter did not announce itself");

        assert!(
            !node
                .run_release(&ReleaseCall::new(
                    names.clone(),
                    &waiter,
                    Handoff::Nobody,
                    false
                ))
                .await
                .unwrap(),
            "not the waiter's"
        );
        assert!(
            listed(&waiter).await,
            "the give-back took the waiter off the wait list"
        );
        // The holder's release hands the lock to the waiter still listed.
        assert!(node.release(names.clone(), &holder, None).await.unwrap());
        let mut c = node.conn().await.unwrap();
        let value: Option<String> = redis::cmd("GET")
            .arg(names.lock())
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            value.as_deref(),
            Some(waiter.as_str()),
            "not handed to the waiter"
        );
        let claimed = node.take_or_wait(&names, &waiter, ttl, None, announce, Some(7));
        assert!(matches!(claimed.await.unwrap(), Taken::Granted(_)));

        // A waiter that gives up (a plain release of a lock it does not hold) leaves the list.
        let other = Owner::random().unwrap();
        let waited = node.take_or_wait(&names, &other, ttl, None, announce, Some(8));
        assert!(matches!(waited.await.unwrap(), Taken::Held));
        assert!(listed(&other).await);
        assert!(!node.release(names.clone(), &other, None).await.unwrap());
        assert!(
            !listed(&other).await,
            "a waiter that gave up is still listed"
        );
        assert!(node.release(names.clone(), &waiter, None).await.unwrap());
    }
}
