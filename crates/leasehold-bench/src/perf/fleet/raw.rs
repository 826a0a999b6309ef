//! The fleet scenario's floor: the same leases renewed by a bare redis-rs client, with no
//! lease bookkeeping (`leasehold-bench __fleet --backend redis-raw` or `redlock5-raw`).
//!
//! What a careful user of Redis's own commands would write to hold N locks on one server or on
//! a majority of five: the N keys set with `SET key owner NX PX` (pipelined, every node at
//! once), then every renewal period (TTL / 3) the keys renewed in eight slices spread over the
//! period, each slice in script calls of at most [`CHUNK`] keys (one compare-and-`PEXPIRE`
//! over many keys, answered as one string of `1`/`0`), every node at once, each call bounded
//! by a timer; at the end the keys deleted the same way. Measured like ours (the hold window's
//! server counters, client CPU, resident memory growth over N), so the gap between a row of
//! ours and this one is what our lease bookkeeping costs, and this row is what the same traffic
//! costs any client on this machine.

use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::Owner;
use leasehold_test_support::services::{self, Service};
use redis::aio::MultiplexedConnection;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::child::{observe, ports};
use super::probe::{self, Probe};
use super::{FLEET_TTL, Measured, Spec};
use crate::harness::BoxError;
use crate::subjects::Count;

/// The most keys in one script call (as the Redis backend's batches).
pub(super) const CHUNK: usize = 250;
/// Slices of the keys renewed per renewal period, spread evenly over it.
pub(super) const SLICES: usize = 8;
/// Each call's bound.
const CALL_BOUND: Duration = Duration::from_millis(500);

/// Compare-and-`PEXPIRE` of every key (`ARGV[1]`: the TTL in ms, then one owner per key).
const EXTEND_LUA: &str = "local out = {} \
    for i, k in ipairs(KEYS) do \
      if redis.call('GET', k) == ARGV[i + 1] then redis.call('PEXPIRE', k, ARGV[1]); out[i] = '1' \
      else out[i] = '0' end \
    end return table.concat(out)";
/// Compare-and-delete of every key (`ARGV[1]` unused, then one owner per key).
const RELEASE_LUA: &str = "local out = {} \
    for i, k in ipairs(KEYS) do \
      if redis.call('GET', k) == ARGV[i + 1] then redis.call('DEL', k); out[i] = '1' \
      else out[i] = '0' end \
    end return table.concat(out)";

/// The raw rows: the fleet backend name and the servers it runs on.
pub(super) const RAW: [(&str, Service); 2] = [
    ("redis-raw", Service::Redis),
    ("redlock5-raw", Service::Redlock),
];

/// The service of a raw row's backend name.
pub(super) fn service(backend: &str) -> Option<Service> {
    RAW.iter().find(|(b, _)| *b == backend).map(|(_, s)| *s)
}

/// The raw row of our backend `backend` (`redis` → `redis-raw`), if it has one.
pub(super) fn of(backend: &str) -> Option<&'static str> {
    RAW.iter()
        .map(|(b, _)| *b)
        .find(|b| b.strip_suffix("-raw") == Some(backend))
}

/// The N locks, each a key and its owner value.
struct Locks {
    keys: Vec<String>,
    owners: Vec<String>,
}

/// A bare client of every node.
struct Nodes {
    conns: Vec<MultiplexedConnection>,
    extend: String,
    release: String,
}

impl Nodes {
    async fn connect(urls: &[String]) -> Result<Self, BoxError> {
        let mut conns = Vec::new();
        let (mut extend, mut release) = (String::new(), String::new());
        for u in urls {
            let mut c = redis::Client::open(u.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            for (lua, sha) in [(EXTEND_LUA, &mut extend), (RELEASE_LUA, &mut release)] {
                *sha = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(lua)
                    .query_async(&mut c)
                    .await?;
            }
            conns.push(c);
        }
        Ok(Self {
            conns,
            extend,
            release,
        })
    }

    fn quorum(&self) -> usize {
        self.conns.len() / 2 + 1
    }

    /// Runs script `sha` over the locks `range` in calls of [`CHUNK`] keys, every node at
    /// once: how many nodes answered `1`, per lock of the range.
    async fn script(
        &self,
        sha: &str,
        locks: &Locks,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<usize>, BoxError> {
        let ttl = FLEET_TTL.as_millis() as u64;
        let cmds: Vec<(usize, redis::Cmd)> = (range.start..range.end)
            .step_by(CHUNK)
            .map(|lo| {
                let hi = (lo + CHUNK).min(range.end);
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha)
                    .arg(hi - lo)
                    .arg(&locks.keys[lo..hi])
                    .arg(ttl)
                    .arg(&locks.owners[lo..hi]);
                (lo, cmd)
            })
            .collect();
        let calls = cmds.iter().flat_map(|(lo, cmd)| {
            self.conns.iter().map(move |c| {
                let mut c = c.clone();
                async move {
                    let call = cmd.query_async::<Vec<u8>>(&mut c);
                    (*lo, tokio::time::timeout(CALL_BOUND, call).await)
                }
            })
        });
        let mut yes = vec![0; range.len()];
        for (lo, answer) in join_all(calls).await {
            let answer = answer.map_err(|_| format!("no answer within {CALL_BOUND:?}"))??;
            for (i, a) in answer.iter().enumerate() {
                if *a == b'1' {
                    yes[lo - range.start + i] += 1;
                }
            }
        }
        Ok(yes)
    }

    /// Sets every lock (`SET NX PX`, pipelined by [`CHUNK`], every node at once); an error
    /// unless a majority granted each.
    async fn set_all(&self, locks: &Locks) -> Result<(), BoxError> {
        let ttl = FLEET_TTL.as_millis() as u64;
        let pipes: Vec<(usize, redis::Pipeline)> = (0..locks.keys.len())
            .step_by(CHUNK)
            .map(|lo| {
                let hi = (lo + CHUNK).min(locks.keys.len());
                let mut pipe = redis::pipe();
                for i in lo..hi {
                    pipe.set_options(
                        &locks.keys[i],
                        &locks.owners[i],
                        redis::SetOptions::default()
                            .conditional_set(redis::ExistenceCheck::NX)
                            .with_expiration(redis::SetExpiry::PX(ttl)),
                    );
                }
                (lo, pipe)
            })
            .collect();
        let mut yes = vec![0; locks.keys.len()];
        // One pipeline at a time (on every node at once): about as many requests in flight as
        // ours has (64 acquisitions), so that the memory a burst leaves to the allocator is
        // alike in both resident-memory figures.
        for (lo, pipe) in &pipes {
            let calls = self.conns.iter().map(|c| {
                let mut c = c.clone();
                async move { pipe.query_async::<Vec<Option<String>>>(&mut c).await }
            });
            for answer in join_all(calls).await {
                for (i, a) in answer?.iter().enumerate() {
                    yes[lo + i] += usize::from(a.is_some());
                }
            }
        }
        let refused = yes.iter().filter(|&&y| y < self.quorum()).count();
        if refused > 0 {
            return Err(format!("{refused} of {} locks refused", yes.len()).into());
        }
        Ok(())
    }
}

/// Renews `locks` until `stop` fires: one slice every period / [`SLICES`]. Returns the locks
/// lost (a renewal a majority of nodes refused: the key was gone or not ours).
async fn renew(
    nodes: &Nodes,
    locks: &Locks,
    mut stop: oneshot::Receiver<()>,
) -> Result<usize, BoxError> {
    let n = locks.keys.len();
    let mut lost = vec![false; n];
    let mut tick = tokio::time::interval_at(
        Instant::now() + FLEET_TTL / 3 / SLICES as u32,
        FLEET_TTL / 3 / SLICES as u32,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for slice in (0..SLICES).cycle() {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        let range = slice * n / SLICES..(slice + 1) * n / SLICES;
        let start = range.start;
        let yes = nodes.script(&nodes.extend, locks, range).await?;
        for (i, y) in yes.into_iter().enumerate() {
            lost[start + i] |= y < nodes.quorum();
        }
    }
    Ok(lost.into_iter().filter(|&l| l).count())
}

/// Runs the raw measurement of `spec` on `service`'s servers (on the current runtime).
pub(super) async fn measure(spec: &Spec, service: Service) -> Result<Measured, BoxError> {
    let prefix = format!("{}:", services::unique_prefix("fleet-raw"));
    let urls = services::lookup(service)?.urls().to_vec();
    let ports = ports(service)?;
    let mut probe = Probe::redis(&urls).await?;
    let count = Count::Redis {
        urls: urls.clone(),
        needle: prefix.clone(),
    };
    let base = probe::connections_to(&ports)?;
    let nodes = Nodes::connect(&urls).await?;
    let mut m = Measured::default();
    let rss0 = probe::rss_bytes()?;
    let t0 = Instant::now();
    let locks = Locks {
        keys: (0..spec.n).map(|i| format!("{prefix}lease-{i}")).collect(),
        owners: (0..spec.n)
            .map(|_| Owner::random().map(|o| o.as_str().to_owned()))
            .collect::<Result<_, _>>()?,
    };
    nodes.set_all(&locks).await?;
    m.acquire = t0.elapsed();

    let (stop, stopped) = oneshot::channel();
    let renewing = renew(&nodes, &locks, stopped);
    let watching = async {
        let o = observe(&mut probe, &ports, spec.hold).await;
        // The renewals end with the window (a send fails only if they ended already).
        stop.send(()).ok();
        o
    };
    let (lost, o) = tokio::join!(renewing, watching);
    let rss1 = probe::rss_bytes()?;
    o?.fill(&mut m, base);
    m.rss_per_lease = rss1.saturating_sub(rss0) as f64 / spec.n.max(1) as f64;
    m.lost = lost?;

    let peak = probe::Peak::start()?;
    let t1 = Instant::now();
    let released = nodes.script(&nodes.release, &locks, 0..spec.n).await?;
    m.release = t1.elapsed();
    m.release_peak_per_lease = peak.per_lease(spec.n)?;
    m.release_errors = released.iter().filter(|&&y| y < nodes.quorum()).count();
    m.left_at_once = count.leftovers().await?.unwrap_or(0);
    tokio::time::sleep(spec.settle).await;
    m.left_later = count.leftovers().await?.unwrap_or(0);
    Ok(m)
}
