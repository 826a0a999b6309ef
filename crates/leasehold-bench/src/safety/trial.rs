//! One trial of the safety table: two clients, A and B, each a "process" of its own (see
//! [`Client`]). A takes a free lock and writes once; then the fault strikes while A holds the
//! lock; B tries to take the lock for a while and writes if it gets it; then A writes again
//! (checking its lease first, as a careful holder does, except where the fault is a pause
//! between that check and the write).

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::Capabilities;
use leasehold_test_support::netns::Net;
use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::services::NodeAction;

use super::check::{Acquired, Client, Trial, Wrote};
use super::env::{
    CLOCK_NODE, Env, RESTART_NODE, SAFETY_NODES, Spec, Timing, opt, plain_spec, proxied, timing,
};
use super::faults::{ctl, etcd_leader, jump_clock, revoke, terminate};
use crate::harness::BoxError;

/// What one trial saw.
pub(super) struct Outcome {
    pub(super) overlap: bool,
    pub(super) takeover: bool,
    pub(super) late_grant: bool,
    pub(super) trial: Arc<Trial>,
    pub(super) caps: Capabilities,
}

/// B tries `try_acquire` every 20 ms until it holds the lock (then writes once) or `until`.
pub(super) async fn contend(b: &Client, key: &str, until: Instant) -> bool {
    loop {
        if b.acquire(key).await == Acquired::Held {
            let _ = b.write().await;
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A takes the free lock and writes once. A fault while taking it (a node that answers more
/// slowly than Redlock's per-node timeout, on a busy machine) is retried for a few seconds,
/// and so is `Busy` once an attempt has failed: the failed attempt's keys on the nodes that
/// answered late hold the lock until its give-back (in the background) or their TTL. The
/// trial starts only once A holds the lock.
pub(super) async fn a_takes(a: &Client, key: &str) -> Result<(), BoxError> {
    let until = Instant::now() + Duration::from_secs(5);
    let mut failed = false;
    let mut last;
    loop {
        last = a.acquire(key).await;
        failed |= last == Acquired::Failed;
        let again = last == Acquired::Failed || (failed && last == Acquired::Busy);
        if !again || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if last != Acquired::Held {
        let why = a.last_error().map(|e| format!(" (last fault: {e})"));
        return Err(format!(
            "A could not take a free lock: {last:?}{}",
            why.unwrap_or_default()
        )
        .into());
    }
    match a.write().await {
        Wrote::Yes(false) => Ok(()),
        other => Err(format!("A's first write: {other:?}").into()),
    }
}

/// A and B, both connected, and A's backend's capabilities.
pub(super) struct Pair {
    pub(super) a: Client,
    pub(super) b: Client,
    caps: Capabilities,
}

/// One trial under way: the key, the checker, the proxies the fault put in (they live on this
/// runtime, which never pauses), whether A's grant came back expired, and the namespaces of a
/// partition.
pub(super) struct Run<'a> {
    pub(super) env: &'a Env,
    pub(super) key: String,
    trial: Arc<Trial>,
    proxies: Vec<FaultProxy>,
    late_grant: bool,
    /// The network namespaces of a partition, dropped (servers and all) after the clients.
    pub(super) net: Option<Net>,
}

impl Run<'_> {
    /// Starts A on `a` and B on `b` and connects both ahead: Redlock connects to its nodes
    /// lazily, and a first request that includes the connection can miss a 5 ms per-node
    /// timeout.
    pub(super) async fn start(&self, a: Spec, b: Spec, ttl: Duration) -> Result<Pair, BoxError> {
        let (a, caps) = Client::start("A", Arc::clone(&self.trial), a.factory(ttl)).await?;
        let (b, _) = Client::start("B", Arc::clone(&self.trial), b.factory(ttl)).await?;
        for c in [&a, &b] {
            for _ in 0..5 {
                if c.acquire(&format!("{}-connect", self.key)).await == Acquired::Held {
                    c.release().await;
                    break;
                }
            }
        }
        Ok(Pair { a, b, caps })
    }

    /// A pauses between its lease check and its write, past the TTL.
    async fn pause(&self, spec: Spec, t: &Timing) -> Result<(Pair, bool), BoxError> {
        let pair = self.start(spec.clone(), spec, t.ttl).await?;
        a_takes(&pair.a, &self.key).await?;
        let wrote = pair.a.write_start(t.pause);
        let takeover = contend(&pair.b, &self.key, Instant::now() + t.pause).await;
        let _ = wrote.await;
        Ok((pair, takeover))
    }

    /// `spec` through proxies (kept in `self`), and the latency they are to add: half as much
    /// again as the TTL (none for the in-process backends, which have no network).
    async fn through_proxies(
        &mut self,
        spec: Spec,
        ttl: Duration,
    ) -> Result<(Spec, Duration), BoxError> {
        let latency = ttl * 3 / 2;
        Ok(match spec {
            Spec::Redis { url, .. } => {
                let (p, url) = proxied(&url).await?;
                self.proxies.push(p);
                let response_timeout = Duration::from_secs(5);
                (
                    Spec::Redis {
                        url,
                        response_timeout,
                    },
                    latency,
                )
            }
            Spec::Redlock(urls) => {
                let mut all = Vec::new();
                for u in &urls {
                    let (p, v) = proxied(u).await?;
                    self.proxies.push(p);
                    all.push(v);
                }
                (Spec::Redlock(all), latency)
            }
            Spec::Postgres(url) => {
                let (p, url) = proxied(&url).await?;
                self.proxies.push(p);
                (Spec::Postgres(url), latency)
            }
            Spec::Etcd { endpoints, session } => {
                let mut all = Vec::new();
                for e in &endpoints {
                    let (p, v) = proxied(&format!("http://{e}")).await?;
                    self.proxies.push(p);
                    all.push(v.trim_start_matches("http://").to_owned());
                }
                (
                    Spec::Etcd {
                        endpoints: all,
                        session,
                    },
                    latency,
                )
            }
            other @ (Spec::Memory(_) | Spec::File(_)) => (other, Duration::ZERO),
        })
    }

    /// A's grant is answered after its TTL (A reaches the servers through slowed proxies).
    async fn delay(&mut self, spec: Spec, t: &Timing) -> Result<(Pair, bool), BoxError> {
        let (a_spec, latency) = self.through_proxies(spec.clone(), t.ttl).await?;
        let pair = self.start(a_spec, spec, t.ttl).await?;
        // Both clients connected (scripts loaded, sessions open) before the network slows.
        for p in &self.proxies {
            p.latency(latency);
        }
        let got = pair.a.acquire_start(&self.key);
        // B starts once A's request has reached the server: the grant exists there, and its
        // answer is on the way back while the TTL runs out.
        tokio::time::sleep(latency + Duration::from_millis(50)).await;
        let takeover = contend(&pair.b, &self.key, Instant::now() + latency * 3 + t.ttl).await;
        match got.await {
            Ok(Acquired::Held) => {
                let _ = pair.a.write().await;
            }
            Ok(Acquired::LostOnArrival) => self.late_grant = true,
            _ => {}
        }
        Ok((pair, takeover))
    }

    /// A's spec for a node fault on `backend`, and the node it hits. Redlock: A cannot reach
    /// one node (a partition), so it holds a bare majority of two, and the fault hits the
    /// other node of that majority.
    async fn node_fault_spec(
        &mut self,
        backend: &str,
        fault: &str,
        spec: &Spec,
    ) -> Result<(Spec, usize), BoxError> {
        Ok(match (backend, fault) {
            ("redis", "clock-jump") => (
                Spec::Redis {
                    url: self.env.safety[CLOCK_NODE].clone(),
                    response_timeout: Duration::from_secs(1),
                },
                CLOCK_NODE,
            ),
            ("redis", _) => (spec.clone(), 0),
            (_, f) => {
                let hit = if f == "clock-jump" {
                    CLOCK_NODE
                } else {
                    RESTART_NODE
                };
                let cut = (0..3).find(|n| *n != hit && *n != 0).unwrap_or(2);
                let mut urls = self.env.safety.clone();
                let (p, via) = proxied(&urls[cut]).await?;
                p.blackhole();
                self.proxies.push(p);
                urls[cut] = via;
                (Spec::Redlock(urls), hit)
            }
        })
    }

    /// A Redis node restarted empty (at once, or after the TTL), or its clock jumped.
    async fn node_fault(
        &mut self,
        backend: &str,
        fault: &str,
        spec: Spec,
    ) -> Result<(Pair, bool), BoxError> {
        let delayed = fault == "restart-delayed";
        // Long enough that A's lease outlives the restart itself.
        let ttl = Duration::from_secs(if delayed { 1 } else { 5 });
        let (a_spec, node) = self.node_fault_spec(backend, fault, &spec).await?;
        let b_spec = match (backend, fault) {
            ("redis", "clock-jump") => a_spec.clone(),
            _ => spec,
        };
        let pair = self.start(a_spec, b_spec, ttl).await?;
        // Some history on the key, so A's token is not the first (a reset shows).
        for _ in 0..2 {
            if pair.b.acquire(&self.key).await == Acquired::Held {
                pair.b.release().await;
            }
        }
        a_takes(&pair.a, &self.key).await?;
        let name = SAFETY_NODES[node];
        let mut early = false;
        match fault {
            "restart" => ctl(name, NodeAction::Restart).await?,
            "clock-jump" => jump_clock(self.env)?,
            _ => {
                // Down for longer than any lease on it; B keeps trying meanwhile.
                ctl(name, NodeAction::Stop).await?;
                let down = Instant::now() + ttl * 3 / 2;
                early = contend(&pair.b, &self.key, down).await;
                tokio::time::sleep_until(down.into()).await;
                ctl(name, NodeAction::Start).await?;
            }
        }
        let takeover =
            early || contend(&pair.b, &self.key, Instant::now() + Duration::from_secs(1)).await;
        let _ = pair.a.write().await;
        Ok((pair, takeover))
    }

    /// The server drops A's hold: its session terminated (PostgreSQL) or its lease revoked
    /// (etcd).
    async fn server_drop(
        &self,
        fault: &str,
        spec: Spec,
        ttl: Duration,
    ) -> Result<(Pair, bool), BoxError> {
        let pair = self.start(spec.clone(), spec, ttl).await?;
        a_takes(&pair.a, &self.key).await?;
        if fault == "pg-terminate" {
            terminate(opt(&self.env.postgres, "postgres")?, &self.key).await?;
        } else {
            revoke(opt(&self.env.etcd, "etcd")?, &self.key).await?;
        }
        let takeover = contend(&pair.b, &self.key, Instant::now() + Duration::from_secs(1)).await;
        let _ = pair.a.write().await;
        Ok((pair, takeover))
    }

    /// The etcd cluster's leader is stopped while A holds the lock, and started again.
    async fn member_kill(&self, ttl: Duration) -> Result<(Pair, bool), BoxError> {
        let endpoints = opt(&self.env.etcd_cluster, "etcd cluster")?.clone();
        let spec = Spec::Etcd {
            endpoints: endpoints.clone(),
            session: Duration::from_secs(3),
        };
        let pair = self.start(spec.clone(), spec, ttl).await?;
        a_takes(&pair.a, &self.key).await?;
        let leader = etcd_leader(&endpoints).await?;
        let stopped = ctl(leader, NodeAction::Stop).await;
        let takeover = contend(&pair.b, &self.key, Instant::now() + Duration::from_secs(4)).await;
        let _ = pair.a.write().await;
        ctl(leader, NodeAction::Start).await?;
        stopped?;
        Ok((pair, takeover))
    }
}

/// Trial `i` of `fault` on `backend`.
pub(super) async fn trial(
    env: &Env,
    backend: &str,
    fault: &str,
    i: usize,
) -> Result<Outcome, BoxError> {
    let key = format!("{}/{backend}-{fault}-{i}", env.tag);
    let mut run = Run {
        env,
        trial: Trial::new(&key),
        key,
        proxies: Vec::new(),
        late_grant: false,
        net: None,
    };
    let t = timing(backend);
    let spec = plain_spec(env, backend)?;
    let (pair, takeover) = match fault {
        "pause" => run.pause(spec, &t).await?,
        "delay" => run.delay(spec, &t).await?,
        "restart" | "restart-delayed" | "clock-jump" => {
            run.node_fault(backend, fault, spec).await?
        }
        "pg-terminate" | "lease-revoke" => run.server_drop(fault, spec, t.ttl).await?,
        "member-kill" => run.member_kill(t.ttl).await?,
        "partition" => run.partition(backend, &t).await?,
        "failover" | "failover-wait" => run.failover(fault == "failover-wait").await?,
        other => return Err(format!("unknown fault {other}").into()),
    };
    let Pair { a, b, caps } = pair;
    b.release().await;
    a.release().await;
    drop((a, b));
    for p in &run.proxies {
        p.pass();
    }
    if let Some(net) = run.net.take() {
        tokio::task::spawn_blocking(move || drop(net)).await?;
    }
    Ok(Outcome {
        overlap: run.trial.overlapped(),
        takeover,
        late_grant: run.late_grant,
        trial: run.trial,
        caps,
    })
}
