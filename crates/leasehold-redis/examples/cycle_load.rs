//! Client and server CPU per lock cycle under concurrency, ours against a raw redis-rs cycle.
//!
//! ```text
//! scripts/services up
//! cargo run --release -p leasehold-redis --example cycle_load -- [redis|redlock] [C] [secs] [rounds]
//! ```
//!
//! C tasks on distinct keys share one `Locker` (ours) or one set of multiplexed connections
//! (raw: `SET NX PX` on every node at once, success at a majority, then the compare-and-delete
//! script on every node), taking turns for `rounds` runs of `secs` each. Prints cycles/s, the
//! client CPU per cycle (`getrusage`, user + system) and the servers' command CPU per cycle
//! (`usec` summed over `INFO commandstats`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use leasehold_core::{Locker, Owner, Renewal};
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::harness;
use leasehold_test_support::services::{Service, lookup};
use redis::aio::MultiplexedConnection;

#[path = "shared/rusage.rs"]
mod rusage;
use rusage::cpu;

const TTL: Duration = Duration::from_secs(30);
const RELEASE_LUA: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

async fn server_usec(urls: &[String]) -> u64 {
    let mut total = 0;
    for url in urls {
        let mut c = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        total += info
            .lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info"))
            .filter_map(|l| {
                l.split("usec=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    total
}

struct Raw {
    conns: Vec<MultiplexedConnection>,
    script: redis::Script,
}

impl Raw {
    async fn cycle(&self, key: &str) {
        let owner = Owner::random().unwrap();
        join_all(self.conns.iter().cloned().map(|mut c| {
            let owner = &owner;
            async move {
                let mut cmd = redis::cmd("SET");
                cmd.arg(key)
                    .arg(owner.as_str())
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000);
                let r = tokio::time::timeout(
                    Duration::from_millis(50),
                    cmd.query_async::<Option<String>>(&mut c),
                )
                .await;
                matches!(r, Ok(Ok(Some(_))))
            }
        }))
        .await;
        join_all(self.conns.iter().cloned().map(|mut c| {
            let owner = &owner;
            let script = &self.script;
            async move {
                let mut inv = script.key(key);
                inv.arg(owner.as_str());
                let call = inv.invoke_async::<i64>(&mut c);
                let _ = tokio::time::timeout(Duration::from_millis(50), call).await;
            }
        }))
        .await;
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "redlock".into());
    let c: usize = args.next().map_or(64, |a| a.parse().expect("C"));
    let secs: f64 = args.next().map_or(2.0, |a| a.parse().expect("secs"));
    let rounds: usize = args.next().map_or(3, |a| a.parse().expect("rounds"));
    let only = args.next();
    let prefix = harness::key_prefix("cycle-load", ":");
    let urls: Vec<String> = if which == "redis" {
        vec![lookup(Service::Redis).unwrap().url().to_owned()]
    } else {
        lookup(Service::Redlock).unwrap().urls().to_vec()
    };
    let locker: Arc<Locker> = Arc::new(if which == "redis" {
        let cfg = RedisConfig::from_url(&urls[0])
            .and_then(|c| c.with_prefix(&prefix))
            .unwrap();
        harness::locker(RedisBackend::connect(cfg).await.unwrap(), TTL, Renewal::Off)
    } else {
        let cfg = RedlockConfig::from_urls(&urls)
            .and_then(|c| c.with_prefix(&prefix))
            .unwrap();
        harness::locker(RedlockBackend::new(cfg).unwrap(), TTL, Renewal::Off)
    });
    let mut conns = Vec::new();
    for u in &urls {
        conns.push(
            redis::Client::open(u.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        );
    }
    let raw = Arc::new(Raw {
        conns,
        script: redis::Script::new(RELEASE_LUA),
    });
    for round in 0..=rounds {
        for ours in [true, false] {
            if only.as_deref() == Some(if ours { "raw" } else { "ours" }) {
                continue;
            }
            let run = if round == 0 { 0.2 } else { secs };
            let end = Instant::now() + Duration::from_secs_f64(run);
            let (cpu0, srv0, t0) = (cpu(), server_usec(&urls).await, Instant::now());
            let tasks: Vec<_> = (0..c)
                .map(|i| {
                    let (locker, raw) = (Arc::clone(&locker), Arc::clone(&raw));
                    let key = format!("{prefix}k{i}");
                    tokio::spawn(async move {
                        let mut n = 0u64;
                        while Instant::now() < end {
                            if ours {
                                // A loaded machine can time a node out: counted, not fatal.
                                if let Ok(Some(lease)) = locker.try_acquire(&key).await {
                                    let _ = lease.release().await;
                                }
                            } else {
                                raw.cycle(&key).await;
                            }
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            let mut n = 0;
            for t in tasks {
                n += t.await.unwrap();
            }
            let (el, cpu1, srv1) = (t0.elapsed(), cpu(), server_usec(&urls).await);
            if round == 0 {
                continue;
            }
            let nf = n as f64;
            println!(
                "{:4} C={c} {:8.0} cycles/s  client {:6.1} µs/cycle  server {:6.1} µs/cycle",
                if ours { "ours" } else { "raw" },
                nf / el.as_secs_f64(),
                (cpu1 - cpu0).as_secs_f64() * 1e6 / nf,
                (srv1 - srv0) as f64 / nf,
            );
        }
    }
}
