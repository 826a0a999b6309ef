//! How many script calls and how much client CPU renewing many leases costs on one Redis.
//!
//! ```text
//! scripts/services up
//! cargo run --release -p leasehold-redis --example renewal_load -- [N] [batch|per-lease]
//! ```
//!
//! Takes N leases (default 10,000) with a 3 s TTL, holds them 10 s, and prints the top-level
//! script calls (`evalsha` + `eval` in `INFO commandstats`) per renewal period (ttl / 3) over
//! the hold window, and the client CPU (`getrusage`, user + system) as a share of one core.
//! `batch` is the renewal engine; `per-lease` renews each lease from a task of its own with
//! `Lease::extend`, one round trip per lease (what renewal did before the engine), for
//! comparison. The Redis server should have no other clients while it runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{Lease, Renewal};
use leasehold_redis::{RedisBackend, RedisConfig};
use leasehold_test_support::harness;
use leasehold_test_support::services::{Service, lookup};

#[path = "../tests/common/commandstats.rs"]
mod commandstats;

#[path = "shared/rusage.rs"]
mod rusage;
use rusage::cpu;

const TTL: Duration = Duration::from_secs(3);
const HOLD: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(10_000, |a| a.parse().expect("N"));
    let per_lease = args.next().as_deref() == Some("per-lease");
    let ep = lookup(Service::Redis).expect("scripts/services up");
    let prefix = harness::key_prefix("renewal-load", ":");
    let config = RedisConfig::from_url(ep.url())
        .and_then(|c| c.with_prefix(&prefix))
        .unwrap();
    let backend = RedisBackend::connect(config).await.unwrap();
    let renewal = if per_lease {
        Renewal::Off
    } else {
        Renewal::Auto
    };
    let l = harness::locker(backend.clone(), TTL, renewal);

    let mut leases = Vec::with_capacity(n);
    for start in (0..n).step_by(100) {
        let batch = (start..(start + 100).min(n)).map(|i| l.try_acquire(format!("k{i}")));
        for r in join_all(batch).await {
            leases.push(Arc::new(r.unwrap().expect("free")));
        }
    }
    let tasks: Vec<_> = if per_lease {
        leases
            .iter()
            .map(|lease| {
                let lease = Arc::clone(lease);
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(TTL / 3).await;
                        if lease.extend(TTL).await.is_err() {
                            return;
                        }
                    }
                })
            })
            .collect()
    } else {
        Vec::new()
    };

    let calls0 = commandstats::script_calls(ep.url()).await;
    let cpu0 = cpu();
    tokio::time::sleep(HOLD).await;
    let calls = commandstats::script_calls(ep.url()).await - calls0;
    let used = cpu() - cpu0;
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    for t in tasks {
        t.abort();
    }
    let periods = HOLD.as_secs_f64() / (TTL / 3).as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let per_period = calls as f64 / periods;
    println!(
        "mode={} N={n} ttl={TTL:?} hold={HOLD:?}: script calls per renewal period {per_period:.1}, \
         client CPU {:.2}% of a core, leases lost {lost}",
        if per_lease { "per-lease" } else { "batch" },
        100.0 * used.as_secs_f64() / HOLD.as_secs_f64(),
    );
    let released = join_all(leases.iter().map(|l| Lease::release(l))).await;
    assert!(released.iter().all(Result::is_ok), "releases failed");
    assert_eq!(backend.count_lock_keys("").await.unwrap(), 0, "keys left");
}
