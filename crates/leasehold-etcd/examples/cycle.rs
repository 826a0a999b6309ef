//! Measures one lock + unlock cycle, in one run, on the endpoints given (default: the single
//! member of `scripts/services`): our session-lease cycle, our per-lock-lease cycle, and the
//! raw etcd Lock + Unlock RPCs on a shared lease. Prints a Markdown table.
//!
//! `cargo run -p leasehold-etcd --example cycle -- 127.0.0.1:17479 [rounds]`

use std::time::Duration;

use etcd_client::{Client, LockOptions as RawLockOptions};
use leasehold_core::{Error, Locker};
use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use tokio::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoints: Vec<String> = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:17479".to_owned())
        .split(',')
        .map(str::to_owned)
        .collect();
    let rounds: u32 = args.next().and_then(|r| r.parse().ok()).unwrap_or(200);
    let prefix = format!("lh-bench-{:08x}/", rand::random::<u32>());

    let session = ours(&endpoints, &prefix, LeaseMode::Session).await?;
    let per_lock = ours(&endpoints, &prefix, LeaseMode::PerLock).await?;
    let mut raw = Client::connect(&endpoints, None).await?;
    let lease = raw.lease_grant(60, None).await?.id();

    let mut rows = Vec::new();
    // Interleave the three so machine noise hits each alike.
    let (mut t_session, mut t_per, mut t_raw) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        t_session += cycle(&session, "s").await?;
        t_per += cycle(&per_lock, "p").await?;
        let t0 = Instant::now();
        let key = raw
            .lock(
                format!("{prefix}raw"),
                Some(RawLockOptions::new().with_lease(lease)),
            )
            .await?
            .key()
            .to_vec();
        raw.unlock(key).await?;
        t_raw += t0.elapsed();
    }
    raw.lease_revoke(lease).await?;
    let per = |t: Duration| t / rounds;
    rows.push(("raw Lock + Unlock RPC, shared lease", per(t_raw)));
    rows.push(("leasehold, session lease (default)", per(t_session)));
    rows.push(("leasehold, lease per lock", per(t_per)));
    println!("endpoints {endpoints:?}, {rounds} rounds\n");
    println!("| cycle | mean | vs raw |\n|---|---|---|");
    for (name, t) in rows {
        println!(
            "| {name} | {:.2} ms | {:.2}× |",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / per(t_raw).as_secs_f64()
        );
    }
    Ok(())
}

async fn ours(endpoints: &[String], prefix: &str, mode: LeaseMode) -> Result<Locker, Error> {
    let cfg = EtcdConfig::new(endpoints.iter().cloned())
        .with_prefix(prefix)
        .with_lease_mode(mode);
    Ok(Locker::new(EtcdBackend::connect(cfg).await?))
}

async fn cycle(locker: &Locker, key: &str) -> Result<Duration, Error> {
    let t0 = Instant::now();
    let lease = locker.acquire(key, Duration::from_secs(5)).await?;
    lease.release().await?;
    Ok(t0.elapsed())
}
