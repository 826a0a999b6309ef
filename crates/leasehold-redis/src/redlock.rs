//! [`RedlockBackend`]: the Redlock algorithm over N independent Redis nodes.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use leasehold_core::async_trait;
use leasehold_core::{
    Capabilities, Error, ErrorKind, ExtendRequest, FencingKind, Grant, Held, HolderInfo,
    LockBackend, LockKey, LockRequest, NodeError, Owner, SafetyClass, Validity, WaitKind, Waited,
};
use redis::aio::ConnectionManagerConfig;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::config::{REDLOCK as NAME, RedlockConfig};
use crate::keys::Names;
use crate::node::{Connector, Node, Taken, names};
use crate::renew::extend_on;

/// What Redlock guarantees and supports: a constant, as
/// [`LockBackend::capabilities`] requires.
const CAPABILITIES: Capabilities =
    Capabilities::new(NAME, SafetyClass::Efficiency, FencingKind::None)
        .with_wait(WaitKind::Poll)
        .with_ttl_range(Duration::from_millis(10), leasehold_core::DEFAULT_MAX_TTL);

/// How long counting a node's keys (SCAN, for leak checks) may take beyond the connect timeout.
const COUNT_BOUND: Duration = Duration::from_secs(5);

/// Redlock over N ≥ 3 independent Redis nodes: an *efficiency* lock whose safety rests on
/// timing assumptions (bounded network delay, pauses and clock drift), with no fencing token.
///
/// See the [crate docs](crate) for the algorithm as implemented, the crash-recovery hazard and
/// its mitigations. Cloning is cheap: clones share the connections.
#[derive(Clone, Debug)]
pub struct RedlockBackend {
    inner: Arc<Inner>,
}

/// What clones share. `Debug` shows the node names and the configuration, passwords
/// redacted.
#[derive(Debug)]
struct Inner {
    nodes: Vec<Arc<Node>>,
    config: RedlockConfig,
}

/// The backend-private state of a Redlock grant: per node, whether the acquire request of the
/// round is finished (answered, failed, or timed out and dropped).
///
/// One allocation for every node, kept as long as the lease: a `watch` channel per node cost
/// ~1.7 KiB per lease on five nodes.
struct Round {
    finished: Box<[AtomicBool]>,
    changed: Notify,
}

impl Round {
    fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            finished: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            changed: Notify::new(),
        })
    }

    /// Waits until the acquire request to node `i` is finished.
    async fn finished(&self, i: usize) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check: a `finish` after it wakes this one.
            changed.as_mut().enable();
            if self
                .finished
                .get(i)
                .is_none_or(|f| f.load(Ordering::Acquire))
            {
                return;
            }
            changed.await;
        }
    }
}

/// Marks node `i`'s request of a round finished when dropped: after its answer, or with its
/// future if that is dropped first.
struct Finish(Arc<Round>, usize);

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(f) = self.0.finished.get(self.1) {
            f.store(true, Ordering::Release);
        }
        self.0.changed.notify_waiters();
    }
}

/// What one node said.
#[derive(Debug)]
enum Outcome {
    /// Granted / extended / released.
    Yes,
    /// Held by another owner / not ours.
    No,
    /// No answer within the per-node timeout.
    TimedOut(Duration),
    /// An error.
    Failed(Error),
}

impl Outcome {
    fn from_result(
        r: Result<Result<bool, Error>, tokio::time::error::Elapsed>,
        t: Duration,
    ) -> Self {
        match r {
            Ok(Ok(true)) => Self::Yes,
            Ok(Ok(false)) => Self::No,
            Ok(Err(e)) => Self::Failed(e),
            Err(_) => Self::TimedOut(t),
        }
    }

    fn is_fault(&self) -> bool {
        matches!(self, Self::TimedOut(_) | Self::Failed(_))
    }
}

/// The tally of a fan-out, and how to report it.
struct Tally {
    what: &'static str,
    yes_word: &'static str,
    no_word: &'static str,
    outcomes: Vec<Option<Outcome>>,
    quorum: usize,
}

impl Tally {
    fn new(
        what: &'static str,
        yes: &'static str,
        no: &'static str,
        n: usize,
        quorum: usize,
    ) -> Self {
        Self {
            what,
            yes_word: yes,
            no_word: no,
            outcomes: (0..n).map(|_| None).collect(),
            quorum,
        }
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.outcomes.iter().flatten().filter(|o| f(o)).count()
    }

    fn yes(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Yes))
    }

    fn failed(&self) -> usize {
        self.count(|o| !matches!(o, Outcome::Yes))
    }

    fn faults(&self) -> usize {
        self.count(Outcome::is_fault)
    }

    /// Whether a quorum of "yes" is no longer possible.
    fn hopeless(&self) -> bool {
        self.outcomes.len() - self.failed() < self.quorum
    }

    /// Whether faults alone rule out a quorum (then it is an error, not contention).
    fn faults_decide(&self) -> bool {
        self.outcomes.len() - self.faults() < self.quorum
    }

    /// Records the outcomes of a fan-out as they arrive, until a quorum said yes (`true`) or
    /// can no longer say it (`false`).
    async fn until_decided(&mut self, rx: &mut mpsc::UnboundedReceiver<(usize, Outcome)>) -> bool {
        while let Some((i, outcome)) = rx.recv().await {
            if let Some(slot) = self.outcomes.get_mut(i) {
                *slot = Some(outcome);
            }
            if self.yes() >= self.quorum {
                return true;
            }
            if self.hopeless() {
                break;
            }
        }
        false
    }

    /// The answer without a quorum: an error if faults alone ruled it out, else `no`
    /// (contention, not a fault).
    fn no_quorum<T>(self, nodes: &[Arc<Node>], no: T) -> Result<T, Error> {
        if self.faults_decide() {
            Err(self.error(nodes))
        } else {
            Ok(no)
        }
    }

    fn error(self, nodes: &[Arc<Node>]) -> Error {
        let mut summary = Vec::new();
        let mut causes = Vec::new();
        for (node, outcome) in nodes.iter().zip(self.outcomes) {
            let said = match outcome {
                Some(Outcome::Yes) => self.yes_word.to_owned(),
                Some(Outcome::No) => self.no_word.to_owned(),
                Some(Outcome::TimedOut(t)) => {
                    causes.push(NodeError {
                        node: node.name.clone(),
                        error: Error::new(
                            ErrorKind::Unavailable,
                            NAME,
                            format!("no answer within {t:?}"),
                        ),
                    });
                    "timed out".to_owned()
                }
                Some(Outcome::Failed(e)) => {
                    causes.push(NodeError {
                        node: node.name.clone(),
                        error: e,
                    });
                    "failed".to_owned()
                }
                None => "no answer yet".to_owned(),
            };
            summary.push(format!("{} {said}", node.name));
        }
        Error::new(
            ErrorKind::QuorumNotReached,
            NAME,
            format!(
                "{}: quorum {} of {} not reached ({})",
                self.what,
                self.quorum,
                nodes.len(),
                summary.join(", ")
            ),
        )
        .with_node_errors(causes)
    }
}

impl RedlockBackend {
    /// Makes the backend; nodes connect lazily, so a node that is down now does not stop it, and
    /// a node that comes back is used again without rebuilding anything.
    pub fn new(config: RedlockConfig) -> Result<Self, Error> {
        let nodes = config
            .servers
            .iter()
            .map(|s| {
                let client = s.client(NAME, s.info.clone(), config.tls_ca.as_deref())?;
                // No response timeout of the client library: every request to a node is bounded
                // by our own per-node timeout (or by the background bound of a give-back), and a
                // second timer per request only costs instructions.
                let cm = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(1);
                Ok(Node::new(
                    NAME,
                    Connector::Single(client, cm),
                    s.name.clone(),
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Self {
            inner: Arc::new(Inner { nodes, config }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    /// Counts lock keys under `key_prefix` on every node (SCAN), per node; unreachable nodes
    /// give an error. The leak check of the tests.
    pub async fn count_lock_keys(&self, key_prefix: &str) -> Result<Vec<usize>, Error> {
        let pattern = format!(
            "{}{{{}*}}",
            self.inner.config.prefix,
            crate::node::glob_escape(key_prefix)
        );
        let mut counts = Vec::new();
        for node in &self.inner.nodes {
            let bound = self.inner.config.connect_timeout + COUNT_BOUND;
            let count = tokio::time::timeout(bound, node.count_keys(&pattern))
                .await
                .map_err(|_| {
                    Error::new(
                        ErrorKind::Unavailable,
                        NAME,
                        format!("counting keys on {}: no answer within {bound:?}", node.name),
                    )
                })??;
            counts.push(count);
        }
        Ok(counts)
    }

    fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    /// An empty tally of a fan-out to every node.
    fn tally(&self, what: &'static str, yes: &'static str, no: &'static str) -> Tally {
        Tally::new(what, yes, no, self.inner.nodes.len(), self.quorum())
    }

    /// The per-node bound for a request on a lease of `ttl`.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        let c = &self.inner.config;
        let t = c.node_timeout.unwrap_or_else(|| {
            (ttl / 200).clamp(Duration::from_millis(5), Duration::from_millis(50))
        });
        t.min(ttl.saturating_sub(c.drift.margin(ttl)))
            .max(Duration::from_millis(1))
    }

    /// The per-node bound for requests whose waiting costs nothing but time: a batch of
    /// renewals of leases of at least `ttl` (its validity counts from before it was sent) and
    /// a release. The [per-node timeout](Self::node_timeout), or a tenth of `ttl` if longer.
    /// These come in bursts (a batch of up to 2,000 keys in chunks, thousands of releases at
    /// once) that queue behind each other on a node's one connection, so a bound fit for one
    /// key's acquisition fails them on a loaded machine: whole batches, and their leases at
    /// their deadlines; and releases that, retried, load the nodes further. A dead node costs
    /// each of them that wait at most, and only when the others do not decide without it.
    fn patient_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout(ttl).max(ttl / 10)
    }

    /// How long a background release may keep trying (the key expires by itself after `ttl`).
    fn release_bound(ttl: Duration) -> Duration {
        ttl.clamp(Duration::from_millis(100), Duration::from_secs(10))
    }

    /// Validity left after `elapsed` since `started`, if at least the configured minimum.
    fn validity_left(&self, started: Instant, ttl: Duration) -> Option<Duration> {
        let c = &self.inner.config;
        let left = ttl
            .checked_sub(started.elapsed())?
            .checked_sub(c.drift.margin(ttl))?;
        (left >= c.min_validity).then_some(left)
    }

    /// Runs `op` on every node, all in one task, each driven to completion (bounded by `bound`)
    /// even after the caller has decided or been dropped; each node's outcome within `per_node`
    /// arrives on the returned channel. One task for the fan-out, not one per node: a spawn
    /// costs more than the rest of a node's request on the client.
    fn spawn_all<F, Fut>(
        &self,
        per_node: Duration,
        bound: Duration,
        mut op: F,
    ) -> mpsc::UnboundedReceiver<(usize, Outcome)>
    where
        F: FnMut(Arc<Node>) -> Fut,
        Fut: Future<Output = Result<bool, Error>> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let all: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let fut = op(Arc::clone(node));
                let tx = tx.clone();
                async move {
                    tokio::pin!(fut);
                    match tokio::time::timeout(per_node, &mut fut).await {
                        Ok(r) => drop(tx.send((i, Outcome::from_result(Ok(r), per_node)))),
                        Err(_) => {
                            drop(tx.send((i, Outcome::TimedOut(per_node))));
                            let _ = tokio::time::timeout(bound.saturating_sub(per_node), fut).await;
                        }
                    }
                }
            })
            .collect();
        tokio::spawn(all.for_each(|()| std::future::ready(())));
        rx
    }

    /// One Redlock acquisition round.
    async fn acquire_round(&self, req: &LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let names = names(&self.inner.config.prefix, req.key);
        let owner = req.owner.clone();
        let ttl = req.ttl;
        let per_node = self.node_timeout(ttl);
        let bound = Self::release_bound(ttl);
        let n = self.inner.nodes.len();
        let (tx, mut rx) = mpsc::unbounded_channel();
        // The decision: Some(true) keep, Some(false) give back. A dropped sender (the caller's
        // future was dropped) means give back.
        let (decide, decision) = watch::channel(None::<bool>);
        let round = Round::new(n);
        let (inner, nodes_round) = (Arc::clone(&self.inner), Arc::clone(&round));
        // One task drives the requests to every node (and any give-back after them) to
        // completion, whatever happens to this future.
        tokio::spawn(async move {
            let (names, owner, tx) = (&names, &owner, &tx);
            let all: FuturesUnordered<_> = inner
                .nodes
                .iter()
                .enumerate()
                .map(|(i, node)| {
                    let mut decision = decision.clone();
                    let done = Finish(Arc::clone(&nodes_round), i);
                    async move {
                        let r = tokio::time::timeout(per_node, node.take(names, owner, ttl, None))
                            .await
                            .map(|r| r.map(|t| matches!(t, Taken::Granted(_))));
                        // From here on no SET of this round can reach the node after a later
                        // command on the same connection: a release waits for this before it
                        // is sent.
                        drop(done);
                        let outcome = Outcome::from_result(r, per_node);
                        let may_hold = !matches!(outcome, Outcome::No);
                        drop(tx.send((i, outcome)));
                        if !may_hold {
                            return;
                        }
                        let keep = loop {
                            if let Some(keep) = *decision.borrow_and_update() {
                                break keep;
                            }
                            if decision.changed().await.is_err() {
                                break decision.borrow().unwrap_or(false);
                            }
                        };
                        if !keep {
                            give_back(node, names, owner, bound).await;
                        }
                    }
                })
                .collect();
            drop(decision);
            all.for_each(|()| std::future::ready(())).await;
        });
        let mut tally = self.tally("acquire", "granted", "held by another owner");
        if tally.until_decided(&mut rx).await {
            if self.validity_left(req.started, ttl).is_some() {
                decide.send_replace(Some(true));
                return Ok(Some(Grant::new(req.ttl_validity()).with_state(round)));
            }
            decide.send_replace(Some(false));
            return Err(Error::new(
                ErrorKind::Timeout,
                NAME,
                format!(
                    "quorum reached after {:?}, leaving less than the minimum validity of a \
                     {ttl:?} lease",
                    req.started.elapsed()
                ),
            ));
        }
        decide.send_replace(Some(false));
        tally.no_quorum(&self.inner.nodes, None)
    }
}

/// Compare-and-delete on one node, bounded; failures are logged (the key expires by TTL).
async fn give_back(node: &Node, names: &Names, owner: &Owner, bound: Duration) {
    match tokio::time::timeout(bound, node.release(names, owner, false)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(node = %node.name, error = %e, "redlock: give-back failed"),
        Err(_) => tracing::debug!(node = %node.name, "redlock: give-back timed out"),
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    leasehold_core::refuse_primitives!(
        "a majority of independent nodes keeps no count (A and B on one node, B and C on another, A and C on a third) and mints no term"
    );

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.acquire_round(&req).await
    }

    async fn wait_lock(&self, _req: LockRequest<'_>, _deadline: Instant) -> Result<Waited, Error> {
        Err(Error::no_native_wait(NAME, "Redlock has no native wait"))
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let names = Arc::new(names(&self.inner.config.prefix, held.key));
        let owner = held.owner.clone();
        // Releases are not bounded by the acquisition TTL (unknown here): a generous bound.
        let bound = Duration::from_secs(10);
        let per_node = self.patient_timeout(bound);
        let round = held.state::<Arc<Round>>();
        let mut i = 0;
        let mut rx = self.spawn_all(per_node, bound, |node| {
            let (names, owner) = (Arc::clone(&names), owner.clone());
            // The acquire request to this node may still be on its way (its task may not even
            // have run yet): release only after it, or it would land on nothing and the SET
            // would then leave a key until its TTL.
            let (round, node_index) = (round.cloned(), i);
            i += 1;
            async move {
                if let Some(round) = round {
                    round.finished(node_index).await;
                }
                node.release(&names, &owner, false).await
            }
        });
        let mut tally = self.tally("release", "released", "not ours");
        if tally.until_decided(&mut rx).await {
            return Ok(true);
        }
        tally.no_quorum(&self.inner.nodes, false)
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let names = Arc::new(names(&self.inner.config.prefix, req.held.key));
        let owner = req.held.owner.clone();
        let ttl = req.ttl;
        let per_node = self.node_timeout(ttl);
        let mut rx = self.spawn_all(per_node, Self::release_bound(ttl), |node| {
            let (names, owner) = (Arc::clone(&names), owner.clone());
            // Compare-and-pexpire only: a missing key is never set again, so an extend that
            // lands after a release (on any node) cannot bring the lock back.
            async move { node.extend(&names, &owner, ttl, false).await }
        });
        let mut tally = self.tally("extend", "extended", "held by another owner");
        if tally.until_decided(&mut rx).await {
            return Ok(self
                .validity_left(req.started, ttl)
                .map(|_| req.ttl_validity()));
        }
        tally.no_quorum(&self.inner.nodes, None)
    }

    async fn extend_many(
        &self,
        reqs: &[ExtendRequest<'_>],
    ) -> Vec<Result<Option<Validity>, Error>> {
        let Some(shortest) = reqs.iter().map(|r| r.ttl).min() else {
            return Vec::new();
        };
        // Every node at once, each script call bounded by the patient timeout. A key a node
        // lost (restarted empty, or released meanwhile) is not set again: see `extend`.
        let per_node = self.patient_timeout(shortest);
        let prefix = &self.inner.config.prefix;
        let all: Vec<_> = reqs.iter().map(|r| names(prefix, r.held.key)).collect();
        let answers = join_all(
            self.inner
                .nodes
                .iter()
                .map(|node| extend_on(node, &all, reqs, false, Some(per_node))),
        )
        .await;
        let mut by_node: Vec<_> = answers.into_iter().map(Vec::into_iter).collect();
        // The majority rule, per lease.
        reqs.iter()
            .map(|req| {
                let mut tally = self.tally("extend", "extended", "held by another owner");
                for (slot, answers) in tally.outcomes.iter_mut().zip(&mut by_node) {
                    *slot = answers.next().map(|a| match a {
                        Ok(true) => Outcome::Yes,
                        Ok(false) => Outcome::No,
                        Err(e) => Outcome::Failed(e),
                    });
                }
                if tally.yes() >= self.quorum() {
                    return Ok(self
                        .validity_left(req.started, req.ttl)
                        .map(|_| req.ttl_validity()));
                }
                tally.no_quorum(&self.inner.nodes, None)
            })
            .collect()
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let names = names(&self.inner.config.prefix, key);
        let per_node = self.node_timeout(Duration::from_secs(10));
        let mut found: Vec<(Owner, Option<Duration>)> = Vec::new();
        let mut reached = 0;
        let answers = join_all(self.inner.nodes.iter().map(|node| {
            let names = names.clone();
            async move { tokio::time::timeout(per_node, node.inspect(&names)).await }
        }))
        .await;
        for answer in answers {
            if let Ok(Ok(holder)) = answer {
                reached += 1;
                if let Some((owner, remaining, _)) = holder {
                    found.push((owner, remaining));
                }
            }
        }
        if reached < self.quorum() {
            return Err(Error::new(
                ErrorKind::QuorumNotReached,
                NAME,
                format!(
                    "inspect: reached {reached} of {} nodes",
                    self.inner.nodes.len()
                ),
            ));
        }
        if found.is_empty() {
            return Ok(None);
        }
        let top = found
            .iter()
            .max_by_key(|(o, _)| found.iter().filter(|(p, _)| p == o).count())
            .map(|(o, _)| o.clone());
        let Some(owner) = top else { return Ok(None) };
        let on: Vec<Option<Duration>> = found
            .iter()
            .filter(|(o, _)| *o == owner)
            .map(|(_, r)| *r)
            .collect();
        let mut info = HolderInfo::unknown().with_detail(format!(
            "held on {} of {} nodes (quorum {})",
            on.len(),
            self.inner.nodes.len(),
            self.quorum()
        ));
        if on.len() >= self.quorum() {
            info = info.with_owner(owner);
            if let Some(r) = on.iter().flatten().min() {
                info = info.with_remaining(*r);
            }
        }
        Ok(Some(info))
    }
}
