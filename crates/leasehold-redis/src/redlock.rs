//! [`RedlockBackend`]: the Redlock algorithm over N independent Redis nodes.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use leasehold_core::async_trait;
use leasehold_core::{
    Backoff, Capabilities, Error, ErrorKind, ExtendRequest, FencingKind, Grant, Held, HolderInfo,
    LockBackend, LockKey, LockRequest, Owner, ReleaseGate, SafetyClass, Validity, WaitKind, Waited,
};
use redis::Cmd;
use redis::aio::ConnectionManagerConfig;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::{REDLOCK as NAME, RedlockConfig};
use crate::keys::{NameList, Names};
use crate::node::{Connector, Node, Taken, names, take_call};
use crate::quorum::{Outcome, Tally};
use crate::release::{Handoff, ReleaseCall};
use crate::renew::{Plan, copy};
use crate::round::{Announce, GiveBack, Settled};
use crate::wake::{Subscription, WakeHub, pushes_to, wait_on};

/// What Redlock guarantees and supports: a constant, as
/// [`LockBackend::capabilities`] requires.
const CAPABILITIES: Capabilities =
    Capabilities::new(NAME, SafetyClass::Efficiency, FencingKind::None)
        .with_wait(WaitKind::Native)
        .with_ttl_range(Duration::from_millis(10), leasehold_core::DEFAULT_MAX_TTL);

/// A waiter's fallback backoff, in case no release message comes (a holder that expired, a
/// lost connection): it is woken by the nodes' release messages first.
const WAIT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(1),
};

/// How long a waiter's announcement on a node lives (each failed attempt renews it): past the
/// longest fallback pause.
const ANNOUNCE: Duration = Duration::from_secs(3);

/// How long an extend short of a quorum waits for the late answers of nodes that timed out
/// (their requests go on in the background), before it says "lost". A release has no such
/// window: its per-node bound is already the patient one.
const LATE_ANSWERS: Duration = Duration::from_secs(1);

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
struct Inner {
    nodes: Vec<Arc<Node>>,
    /// Per node, the routing of its release messages to local waiters.
    hubs: Vec<Arc<WakeHub>>,
    config: RedlockConfig,
    releases: ReleaseGate,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("nodes", &self.nodes)
            .field("config", &self.config)
            .finish()
    }
}

impl RedlockBackend {
    /// Makes the backend; nodes connect lazily, so a node that is down now does not stop it, and
    /// a node that comes back is used again without rebuilding anything.
    pub fn new(config: RedlockConfig) -> Result<Self, Error> {
        let hubs: Vec<Arc<WakeHub>> = config.servers.iter().map(|_| Arc::default()).collect();
        let nodes = config
            .servers
            .iter()
            .zip(&hubs)
            .map(|(s, hub)| {
                // RESP3: release messages are pushed on the node's shared connection.
                let client = s.client(NAME, s.resp3(), config.tls_ca.as_deref())?;
                // No response timeout of the client library: every request to a node is bounded
                // by our own per-node timeout (or by the background bound of a give-back), and a
                // second timer per request only costs instructions.
                let cm = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(1);
                let cm = pushes_to(cm, hub);
                Ok(Node::new(
                    NAME,
                    Connector::Single(client, cm),
                    s.name.clone(),
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let releases = ReleaseGate::new(config.releases_in_flight);
        Ok(Self {
            inner: Arc::new(Inner {
                nodes,
                hubs,
                config,
                releases,
            }),
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
        self.validity_left_at(started, ttl, Instant::now())
    }

    /// [`validity_left`](Self::validity_left) as of `now`.
    fn validity_left_at(&self, started: Instant, ttl: Duration, now: Instant) -> Option<Duration> {
        let c = &self.inner.config;
        let left = ttl
            .checked_sub(now.saturating_duration_since(started))?
            .checked_sub(c.drift.margin(ttl))?;
        (left >= c.min_validity).then_some(left)
    }

    /// Runs `op` on every node, all in one task, each driven to completion (bounded by `bound`)
    /// even after the caller has decided or been dropped; each node's outcome within `per_node`
    /// arrives on the returned channel, and for a node that timed out, its late answer too (see
    /// [`Tally::late_quorum`]). One task for the fan-out, not one per node: a spawn
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
        let connect = self.inner.config.connect_timeout;
        let all: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let fut = op(Arc::clone(node));
                let tx = tx.clone();
                let node = Arc::clone(node);
                async move {
                    node.first_connect(connect).await;
                    tokio::pin!(fut);
                    match tokio::time::timeout(per_node, &mut fut).await {
                        Ok(r) => drop(tx.send((i, Outcome::from_result(Ok(r), per_node)))),
                        Err(_) => {
                            drop(tx.send((i, Outcome::TimedOut(per_node))));
                            let rest = bound.saturating_sub(per_node);
                            // `&mut fut`: moving it into a second timeout would keep room for
                            // two copies of it in this future.
                            if let Ok(r) = tokio::time::timeout(rest, &mut fut).await {
                                drop(tx.send((i, Outcome::from_result(Ok(r), per_node))));
                            }
                        }
                    }
                }
            })
            .collect();
        // Counted by `settle`: a holder that exits right after its release returns at the
        // quorum (the CLI's does, and settles first) must not cut off the requests to the
        // nodes that had not answered yet; `redlock_end_to_end` found a key left on one of
        // five nodes that way.
        leasehold_core::spawn_detached(all.for_each(|()| std::future::ready(())));
        rx
    }

    /// Takes the waiter `owner` off every node's wait list (a release by its owner value, in
    /// the fan-out task) after a wait that ended without the lock: no release should spend its
    /// one wake-up on it. Best effort: an entry left behind expires with the announcement.
    fn leave_wait_lists(&self, names: Names, owner: Owner) {
        let call = Arc::new(ReleaseCall::new(names, &owner, Handoff::Plain, false));
        let bound = Duration::from_secs(1);
        drop(self.spawn_all(bound, bound, |node| {
            let call = Arc::clone(&call);
            async move { node.run_release(&call).await }
        }));
    }

    /// One Redlock acquisition round; with `announce`, a waiter's: each node that finds the
    /// lock held records that someone waits (see [`Announce`]), so its release hands the lock
    /// on and publishes.
    ///
    /// The requests run in the caller's future, in no task of their own: a round that keeps
    /// its grant drops the requests still unanswered (those already sent still run on their
    /// nodes, before the release that goes after them on the same connection; the others are
    /// never sent), and any other round gives back in a task (see [`GiveBack`]). A task per
    /// round cost more client CPU than the requests themselves, and capped how many cycles per
    /// second many tasks sharing a backend could make.
    ///
    /// `after`: the give-back of the previous round of the same owner value; this round's
    /// request to a node waits until it is settled there (bounded like a give-back), or the
    /// give-back could delete what this round takes. Returns the same signal for this round.
    async fn acquire_round(
        &self,
        req: &LockRequest<'_>,
        announce: Option<Announce>,
        after: Option<&Settled>,
    ) -> (Result<Option<Grant>, Error>, Option<Arc<Settled>>) {
        let names = names(&self.inner.config.prefix, req.key);
        let (owner, ttl) = (req.owner, req.ttl);
        let per_node = self.node_timeout(ttl);
        let connect = self.inner.config.connect_timeout;
        let bound = Self::release_bound(ttl);
        // Declared before the requests, so that a dropped round drops them first.
        let mut give_back = GiveBack {
            nodes: &self.inner.nodes,
            names: &names,
            owner,
            bound,
            may_hold: vec![true; self.inner.nodes.len()],
            armed: true,
            handoff: Handoff::Plain,
        };
        // A waiter's round sends its script; any other round one `SET NX PX`, the same for
        // every node (Redlock nodes are single servers).
        enum Round {
            Wait(Announce),
            Take(Cmd),
        }
        let round = match announce {
            Some(a) => Round::Wait(a),
            None => Round::Take(take_call(&names, owner, ttl)),
        };
        let (names, round) = (&names, &round);
        let mut all: FuturesUnordered<_> = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| async move {
                // Before the per-node timer: a give-back still on its way must not cost this
                // round the node.
                if let Some(prev) = after {
                    let _ = tokio::time::timeout(bound, prev.settled(i)).await;
                }
                node.first_connect(connect).await;
                let attempt = async {
                    match round {
                        Round::Wait(a) => {
                            node.take_or_wait(names, owner, ttl, None, ANNOUNCE, Some(a.ticket))
                                .await
                        }
                        Round::Take(take) => node.run_take(take).await,
                    }
                };
                let r = tokio::time::timeout(per_node, attempt)
                    .await
                    .map(|r| r.map(|t| matches!(t, Taken::Granted(_))));
                (i, Outcome::from_result(r, per_node))
            })
            .collect();
        let mut tally = self.tally("acquire", "granted", "held by another owner");
        let mut quorum = false;
        while let Some((i, outcome)) = all.next().await {
            if matches!(outcome, Outcome::No)
                && let Some(may_hold) = give_back.may_hold.get_mut(i)
            {
                *may_hold = false;
            }
            if let Some(decided) = tally.record(i, outcome) {
                quorum = decided;
                break;
            }
        }
        drop(all);
        if quorum && self.validity_left(req.started, ttl).is_some() {
            give_back.armed = false;
            return (Ok(Some(Grant::new(req.ttl_validity()))), None);
        }
        if announce.is_some() && !quorum {
            give_back.handoff = Handoff::Nobody;
        }
        let settled = give_back.send();
        if quorum {
            let e = Error::new(
                ErrorKind::Timeout,
                NAME,
                format!(
                    "quorum reached after {:?}, leaving less than the minimum validity of a \
                     {ttl:?} lease",
                    req.started.elapsed()
                ),
            );
            return (Err(e), settled);
        }
        (tally.no_quorum(&self.inner.nodes, None), settled)
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
        self.acquire_round(&req, None, None).await.0
    }

    /// Waits on the nodes' release messages: subscribed to its own wake-up channel on every
    /// node it can reach (as on single-node Redis), each round puts the waiter on the wait
    /// list of the nodes that found the key held, and the first message from any node starts
    /// the next round. A node's release hands its lock to the first waiter of its list and
    /// wakes it; the lists are ordered alike on every node (by the waiter's ticket), so they name the
    /// same waiter, and a release never wakes the whole herd (which, woken together, split the
    /// nodes' votes round after round). A jittered backoff covers a message that never comes.
    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        // A free lock is taken by one plain round, with no subscription: subscribing on every
        // node first made each uncontended acquisition cost about three times as long (the
        // fleet scenario's 10,000 acquisitions: 0.4 s before the native wait, 1.1–1.5 s with
        // it). Only a lock found taken is waited for; the first attempt of the wait comes
        // after the subscriptions, so a release in between is not missed.
        let (first, settled) = self.acquire_round(&req, None, None).await;
        if let Some(grant) = first? {
            return Ok(Waited::new(Some(grant), 1));
        }
        let names = names(&self.inner.config.prefix, req.key);
        let channel = names.waiter_channel(req.owner);
        let per_node = self.node_timeout(req.ttl);
        let connect = self.inner.config.connect_timeout;
        let channel = &channel;
        // A node that cannot subscribe now only wakes us late (by the backoff): left out.
        let subs: Vec<Subscription> = join_all(self.inner.nodes.iter().zip(&self.inner.hubs).map(
            |(node, hub)| async move {
                node.first_connect(connect).await;
                tokio::time::timeout(per_node, Subscription::new(node, hub, channel)).await
            },
        ))
        .await
        .into_iter()
        .filter_map(|r| r.ok().and_then(Result::ok))
        .collect();
        // Every round of this wait uses the same owner value: each round's request to a node
        // goes after the previous round's give-back there.
        let previous = Mutex::new(settled);
        let announce = Announce::now();
        let waited = wait_on(
            &subs,
            deadline,
            |a| WAIT_BACKOFF.delay(a),
            |started| {
                let attempt = LockRequest::new(req.key, req.owner, req.ttl, started, req.monitor);
                let previous = &previous;
                async move {
                    let after = std::mem::take(
                        &mut *previous.lock().unwrap_or_else(PoisonError::into_inner),
                    );
                    let (result, settled) = self
                        .acquire_round(&attempt, Some(announce), after.as_deref())
                        .await;
                    *previous.lock().unwrap_or_else(PoisonError::into_inner) = settled;
                    result
                }
            },
        )
        .await?;
        if waited.grant.is_none() {
            self.leave_wait_lists(names, req.owner.clone());
        }
        Ok(Waited::new(waited.grant, waited.attempts + 1))
    }

    fn release_gate(&self) -> Option<&ReleaseGate> {
        Some(&self.inner.releases)
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let names = names(&self.inner.config.prefix, held.key);
        // One call for every node (Redlock nodes are single servers).
        let call = Arc::new(ReleaseCall::new(names, held.owner, Handoff::Plain, false));
        // Releases are not bounded by the acquisition TTL (unknown here): a generous bound.
        let bound = Duration::from_secs(10);
        let per_node = self.patient_timeout(bound);
        // Every node's request starts at once in the fan-out task, not in the caller's future:
        // a holder often exits as soon as its release returns (the CLI's does). With the
        // requests in the caller's future and only those unanswered at the quorum's decision
        // spawned, `leasehold-cli`'s `redlock_end_to_end` found the key left on 2 of 5 nodes
        // after a release (requests the exit stopped before they went out, we think).
        let mut rx = self.spawn_all(per_node, bound, |node| {
            let call = Arc::clone(&call);
            async move { node.run_release(&call).await }
        });
        // One wait for slow nodes: the patient per-node bound (at least 1 s). A late-answer
        // window on top of it (as `extend` has, whose per-node bound is the short one) would
        // let a release wait for a slow node twice.
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
            async move { node.extend(&names, &owner, ttl).await }
        });
        let mut tally = self.tally("extend", "extended", "held by another owner");
        let late = (req.started + ttl).min(Instant::now() + LATE_ANSWERS);
        if tally.until_decided(&mut rx).await || tally.late_quorum(&mut rx, late).await {
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
        let all = NameList::new(prefix, reqs.iter().map(|r| r.held.key), false);
        // Encoded once, the same calls to every node (Redlock nodes are single servers).
        let plan = Plan::single(&all, reqs);
        drop(all);
        let answers = join_all(
            self.inner
                .nodes
                .iter()
                .map(|node| plan.send(node, Some(per_node))),
        )
        .await;
        let quorum = self.quorum();
        // Every answer is in: the validity left is judged as of now, once per start and TTL
        // (a batch's leases share both, and the clock and the drift margin cost more than the
        // rest of a lease's tally).
        let now = Instant::now();
        let mut judged: Option<(Instant, Duration, bool)> = None;
        // The majority rule, per lease: counted first (the usual case, a quorum said yes),
        // the full tally only for a lease without one.
        reqs.iter()
            .enumerate()
            .map(|(i, req)| {
                let yes = answers
                    .iter()
                    .filter(|a| matches!(a.get(i), Some(Ok(true))))
                    .count();
                if yes >= quorum {
                    let valid = match judged {
                        Some((started, ttl, valid)) if (started, ttl) == (req.started, req.ttl) => {
                            valid
                        }
                        _ => {
                            let valid = self.validity_left_at(req.started, req.ttl, now).is_some();
                            judged = Some((req.started, req.ttl, valid));
                            valid
                        }
                    };
                    return Ok(valid.then(|| req.ttl_validity()));
                }
                let mut tally = self.tally("extend", "extended", "held by another owner");
                for (slot, answers) in tally.outcomes.iter_mut().zip(&answers) {
                    *slot = answers.get(i).map(|a| match a {
                        Ok(true) => Outcome::Yes,
                        Ok(false) => Outcome::No,
                        Err(e) => Outcome::Failed(copy(e)),
                    });
                }
                tally.no_quorum(&self.inner.nodes, None)
            })
            .collect()
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let names = names(&self.inner.config.prefix, key);
        // Not on the lock path, and often a new process's first request (the CLI's `status`):
        // each node's bound includes the connect. With only the per-node timeout (50 ms), a
        // `status` on a loaded machine reached 1 of 5 nodes and failed for want of a quorum.
        let per_node =
            self.inner.config.connect_timeout + self.node_timeout(Duration::from_secs(10));
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
