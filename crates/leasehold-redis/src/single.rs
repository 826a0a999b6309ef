//! [`RedisBackend`]: one Redis server, with a best-effort fencing counter and release wake-ups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::async_trait;
use leasehold_core::{
    Capabilities, Error, ExtendRequest, FencingKind, Grant, Held, HolderInfo, LockBackend, LockKey,
    LockRequest, SafetyClass, Validity, WaitKind, Waited,
};
use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClient;
use redis::{ProtocolVersion, PushInfo};
use tokio::time::Instant;

use crate::config::{Deployment, REDIS as NAME, RedisConfig, invalid};
use crate::node::{Connector, Node, Taken, names};
use crate::renew::extend_on;
use crate::wake::{Subscription, WakeHub, pushes_to};

/// What single-node Redis guarantees and supports: a constant, as
/// [`LockBackend::capabilities`] requires.
const CAPABILITIES: Capabilities =
    Capabilities::new(NAME, SafetyClass::Efficiency, FencingKind::BestEffort)
        .with_wait(WaitKind::Native)
        .with_ttl_range(Duration::from_millis(10), leasehold_core::DEFAULT_MAX_TTL);

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
}

struct Inner {
    node: Arc<Node>,
    config: RedisConfig,
    wake: Arc<WakeHub>,
    /// Local FIFO queues: one Redis contender per key per backend.
    queues: Mutex<HashMap<LockKey, Arc<KeyQueue>>>,
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
        let hub = Arc::clone(&wake);
        let connector = match &config.deployment {
            Deployment::Server(server) => {
                let client = server.client(NAME, server.resp3(), config.tls_ca.as_deref())?;
                let cm = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.response_timeout))
                    .set_number_of_retries(1);
                let cm = pushes_to(cm, &hub);
                Connector::Single(client, cm)
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
                    .push_sender(move |push: PushInfo| {
                        hub.on_push(push);
                        Ok::<(), redis::aio::SendError>(())
                    })
                    .build()
                    .map_err(|e| {
                        invalid(NAME, format!("{}: {}", config.redacted_url(), e.category()))
                    })?;
                Connector::Cluster(client)
            }
        };
        let node = Node::new(NAME, connector, config.deployment.name());
        node.conn().await?;
        Ok(Self {
            inner: Arc::new(Inner {
                node,
                config,
                wake,
                queues: Mutex::new(HashMap::new()),
            }),
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

    /// One attempt; `enqueue` (a waiting attempt) announces the waiter, in fair mode by joining
    /// the line (or refreshing our place in it, or claiming the lock a release handed us).
    async fn attempt(&self, req: &LockRequest<'_>, enqueue: bool) -> Result<Option<Grant>, Error> {
        let names = names(&self.inner.config.prefix, req.key);
        let taken = match self.inner.config.fair {
            Some(grace) if enqueue => {
                self.inner
                    .node
                    .take_fair(&names, req.owner, req.ttl, enqueue, grace)
                    .await?
            }
            // A waiting attempt announces the waiter when the lock is held, so the release
            // wakes it; a try (the uncontended path) is a plain `SET NX`, in fair mode too: a
            // release hands a lock with a line to its head, so a free lock has no line to jump
            // (unless its holder let it expire).
            None if enqueue => {
                let announce = self.inner.config.wait_backoff.max * 2 + ANNOUNCE_SLACK;
                self.inner
                    .node
                    .take_or_wait(&names, req.owner, req.ttl, true, announce)
                    .await?
            }
            _ => {
                self.inner
                    .node
                    .take(&names, req.owner, req.ttl, true)
                    .await?
            }
        };
        match taken {
            Taken::Granted(token) => {
                let grant = Grant::new(req.ttl_validity());
                Ok(Some(match token {
                    Some(t) => grant.with_fencing(t),
                    None => grant,
                }))
            }
            Taken::Held => Ok(None),
        }
    }

    /// Fair mode: leaves the line after a wait that ended without the lock, in a task, so it
    /// happens even if nobody awaits it.
    fn leave_line(&self, key: &LockKey, owner: &leasehold_core::Owner) {
        let Some(grace) = self.inner.config.fair else {
            return;
        };
        let (node, names, owner) = (
            Arc::clone(&self.inner.node),
            names(&self.inner.config.prefix, key),
            owner.clone(),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(async move {
                if let Err(e) = node.release(&names, &owner, Some(grace)).await {
                    tracing::debug!(error = %e, "leasehold-redis: leaving the fair queue failed");
                }
            }));
        }
    }

    fn queue(&self, key: &LockKey) -> Arc<KeyQueue> {
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(queues.entry(key.clone()).or_default())
    }

    /// Drops the local queue of `key` once nobody waits in it.
    fn tidy_queue(&self, key: &LockKey, queue: Arc<KeyQueue>) {
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drop(queue);
        if queues.get(key).is_some_and(|q| Arc::strong_count(q) == 1) {
            queues.remove(key);
        }
    }
}

/// Removes a key's local queue when its last waiter leaves, even if the wait was cancelled.
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
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.attempt(&req, false).await
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
        let names = names(&self.inner.config.prefix, req.key);
        let sub = Subscription::new(
            &self.inner.node,
            &self.inner.wake,
            &names.channel().to_string(),
        )
        .await?;
        let mut attempts = 0u32;
        loop {
            let woken = sub.channel.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            attempts += 1;
            let started = Instant::now();
            let attempt = LockRequest::new(req.key, req.owner, req.ttl, started, req.monitor);
            if let Some(grant) = self.attempt(&attempt, true).await? {
                return Ok(Waited::new(Some(grant), attempts));
            }
            let now = Instant::now();
            if now >= deadline {
                self.leave_line(req.key, req.owner);
                return Ok(Waited::new(None, attempts));
            }
            // Woken by the release message, or after a jittered backoff in case a message was
            // lost (a reconnect, a holder that expired instead of releasing). In fair mode the
            // backoff also keeps our place in line: we ask again well within the grace period.
            let mut fallback = self.inner.config.wait_backoff.delay(attempts);
            if let Some(grace) = self.inner.config.fair {
                fallback = fallback.min(grace / 3);
            }
            let until = (now + fallback.max(Duration::from_millis(1))).min(deadline);
            let fair = self.inner.config.fair.is_some();
            loop {
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep_until(until) => break,
                }
                // In fair mode a release message names the waiter it handed the lock to: the
                // others wait on (their backoff keeps their place), no herd of attempts.
                if !fair || sub.channel.last_names(req.owner.as_str()) {
                    break;
                }
                woken.set(sub.channel.notify.notified());
                woken.as_mut().enable();
                // A message for us that came before we listened again is in `last`.
                if sub.channel.last_names(req.owner.as_str()) {
                    break;
                }
            }
        }
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let names = names(&self.inner.config.prefix, held.key);
        self.inner
            .node
            .release(&names, held.owner, self.inner.config.fair)
            .await
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let names = names(&self.inner.config.prefix, req.held.key);
        let ok = self
            .inner
            .node
            .extend(&names, req.held.owner, req.ttl, false)
            .await?;
        Ok(ok.then(|| req.ttl_validity()))
    }

    async fn extend_many(
        &self,
        reqs: &[ExtendRequest<'_>],
    ) -> Vec<Result<Option<Validity>, Error>> {
        let prefix = &self.inner.config.prefix;
        let answers = extend_on(&self.inner.node, prefix, reqs, false, None).await;
        answers
            .into_iter()
            .zip(reqs)
            .map(|(held, req)| held.map(|h| h.then(|| req.ttl_validity())))
            .collect()
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let names = names(&self.inner.config.prefix, key);
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
    use leasehold_core::{LeaseMonitor, Owner};
    use leasehold_test_support::require_service;
    use leasehold_test_support::services::{Service, unique_prefix};

    /// The scripts run by SHA. After `SCRIPT FLUSH` (what a restarted server without them looks
    /// like) every request loads its script again and succeeds: acquire (plain and fair),
    /// extend and release.
    #[tokio::test]
    async fn scripts_are_loaded_again_after_script_flush() {
        let ep = require_service!(Service::Redis);
        let prefix = format!("{}:", unique_prefix("noscript"));
        let config = RedisConfig::from_url(ep.url())
            .and_then(|c| c.with_prefix(&prefix))
            .unwrap();
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
}
