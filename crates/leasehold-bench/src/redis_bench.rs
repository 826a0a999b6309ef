//! Redis and Redlock: our cycles against raw redis-rs cycles, rslock, redis-benchmark and
//! PostgreSQL's server-side queue.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{LockOptions, Locker, Owner, Renewal};
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::services::{self, Service};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::harness::{self, BoxError};
use crate::report::{Bar, Table};
use crate::stats::{Contention, Grant, Summary, ms};

/// What one run of `leasehold-bench redis` measures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    pub(crate) iterations: usize,
    pub(crate) contention: Duration,
    pub(crate) throughput: Duration,
}

/// The tables and chart bars of one runtime flavour.
pub(crate) struct Outcome {
    pub(crate) tables: Vec<Table>,
    pub(crate) bars: Vec<Bar>,
}

const TTL: Duration = Duration::from_secs(30);

/// The note in place of the peer crates' rows when they are not built.
#[cfg(not(feature = "peers"))]
const PEERS_OFF: &str =
    "Peer crates (rslock) not measured: build with `--features peers` to include them.";

fn locker(backend: impl leasehold_core::LockBackend) -> Result<Locker, BoxError> {
    Ok(Locker::new(backend).with_options(
        LockOptions::default()
            .with_ttl(TTL)
            .with_renewal(Renewal::Off),
    )?)
}

fn prefix(what: &str) -> String {
    format!("{}:", services::unique_prefix(what))
}

/// Runs `a` and `b` in alternating rounds (see [`harness::interleaved`]).
async fn interleaved<A, FA, B, FB>(
    n: usize,
    mut a: A,
    mut b: B,
) -> Result<(Summary, Summary), BoxError>
where
    A: FnMut() -> FA,
    FA: Future<Output = Result<(), BoxError>>,
    B: FnMut() -> FB,
    FB: Future<Output = Result<(), BoxError>>,
{
    // Warm-up: connections, scripts, caches.
    let warmup = (n / 10).clamp(1, 100);
    let s = harness::interleaved(
        n,
        2,
        warmup,
        async |i| {
            if i == 0 { a().await } else { b().await }
        },
    )
    .await?;
    match s[..] {
        [o, r] => Ok((o, r)),
        _ => Err("interleaved: expected two summaries".into()),
    }
}

fn summary_row(table: &mut Table, name: &str, s: &Summary) {
    table.row(vec![
        name.to_owned(),
        ms(s.p50),
        ms(s.p99),
        format!("{:.0}", s.per_sec),
    ]);
}

async fn raw_connection(url: &str) -> Result<MultiplexedConnection, BoxError> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// The raw acquire: `SET key owner NX PX 30000`; true if it was set.
async fn raw_set_nx(
    c: &mut MultiplexedConnection,
    key: &str,
    owner: &Owner,
) -> Result<bool, redis::RedisError> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(owner.as_str())
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(c)
        .await?;
    Ok(set.is_some())
}

fn release_script() -> redis::Script {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
}

/// Our single-node cycle (with fencing token) against raw `SET NX PX` + `EVALSHA`.
async fn single(p: Params, rt: &str, out: &mut Outcome) -> Result<(), BoxError> {
    let url = services::lookup(Service::Redis)?.url().to_owned();
    let ours = locker(
        RedisBackend::connect(RedisConfig::from_url(&url)?.with_prefix(prefix("single"))?).await?,
    )?;
    let raw = raw_connection(&url).await?;
    let script = release_script();
    let raw_key = format!("{}raw", prefix("single"));
    let (o, r) = interleaved(
        p.iterations,
        || {
            let ours = ours.clone();
            async move {
                let lease = ours.try_acquire("k").await?.ok_or("ours: key held")?;
                lease.release().await?;
                Ok(())
            }
        },
        || {
            let (mut c, script, key) = (raw.clone(), &script, raw_key.clone());
            async move {
                let owner = Owner::random()?;
                if !raw_set_nx(&mut c, &key, &owner).await? {
                    return Err("raw: key held".into());
                }
                let _: i64 = script
                    .key(&key)
                    .arg(owner.as_str())
                    .invoke_async(&mut c)
                    .await?;
                Ok(())
            }
        },
    )
    .await?;
    let mut t = Table::new(
        &format!(
            "Single node: acquire + release cycle ({rt} runtime, {} cycles each)",
            p.iterations
        ),
        &["implementation", "p50", "p99", "cycles/s"],
    );
    summary_row(&mut t, "leasehold RedisBackend (with fencing token)", &o);
    summary_row(&mut t, "raw redis-rs SET NX PX + EVALSHA", &r);
    t.note(format!(
        "Ratio ours / raw, p50: **{:.3}×** (target ≤ 1.05×).",
        o.p50.as_secs_f64() / r.p50.as_secs_f64()
    ));
    out.bars.push(Bar {
        label: format!("redis: leasehold ({rt})"),
        ms: o.p50.as_secs_f64() * 1e3,
    });
    out.bars.push(Bar {
        label: format!("redis: raw redis-rs ({rt})"),
        ms: r.p50.as_secs_f64() * 1e3,
    });
    out.tables.push(t);
    Ok(())
}

/// Our 5-node Redlock against a raw concurrent fan-out and against rslock.
async fn redlock(p: Params, rt: &str, out: &mut Outcome) -> Result<(), BoxError> {
    let urls = services::lookup(Service::Redlock)?.urls().to_vec();
    let ours = locker(RedlockBackend::new(
        RedlockConfig::from_urls(&urls)?.with_prefix(prefix("redlock"))?,
    )?)?;
    let mut conns = Vec::new();
    for u in &urls {
        conns.push(raw_connection(u).await?);
    }
    let script = release_script();
    let quorum = urls.len() / 2 + 1;
    let raw_key = format!("{}raw", prefix("redlock"));
    let node_timeout = Duration::from_millis(50);
    let raw_cycle = || {
        let (conns, script, key) = (conns.clone(), &script, raw_key.clone());
        async move {
            let owner = Owner::random()?;
            let sets = join_all(conns.iter().cloned().map(|mut c| {
                let (key, owner) = (key.clone(), owner.clone());
                async move {
                    let r =
                        tokio::time::timeout(node_timeout, raw_set_nx(&mut c, &key, &owner)).await;
                    matches!(r, Ok(Ok(true)))
                }
            }))
            .await;
            if sets.iter().filter(|&&ok| ok).count() < quorum {
                return Err("raw: no quorum".into());
            }
            join_all(conns.iter().cloned().map(|mut c| {
                let (key, owner) = (key.clone(), owner.clone());
                async move {
                    let _: Result<i64, _> = script
                        .key(&key)
                        .arg(owner.as_str())
                        .invoke_async(&mut c)
                        .await;
                }
            }))
            .await;
            Ok(())
        }
    };
    let ours_cycle = || {
        let ours = ours.clone();
        async move {
            let lease = ours.try_acquire("k").await?.ok_or("ours: key held")?;
            lease.release().await?;
            Ok(())
        }
    };
    let (o, r) = interleaved(p.iterations, ours_cycle, raw_cycle).await?;

    let mut t = Table::new(
        &format!(
            "Redlock over 5 nodes: acquire + release cycle ({rt} runtime, {} cycles each)",
            p.iterations
        ),
        &["implementation", "p50", "p99", "cycles/s"],
    );
    summary_row(&mut t, "leasehold RedlockBackend (vs raw)", &o);
    summary_row(&mut t, "raw concurrent fan-out, 50 ms per node", &r);
    out.bars.push(Bar {
        label: format!("redlock: leasehold ({rt})"),
        ms: o.p50.as_secs_f64() * 1e3,
    });
    out.bars.push(Bar {
        label: format!("redlock: raw fan-out ({rt})"),
        ms: r.p50.as_secs_f64() * 1e3,
    });
    #[cfg(feature = "peers")]
    {
        let rs = rslock::LockManager::new(urls.clone());
        let rs_key = format!("{}rslock", prefix("redlock"));
        let (o2, s) = interleaved(p.iterations, ours_cycle, || {
            let (rs, key) = (&rs, rs_key.clone());
            async move {
                let lock = rs
                    .lock(key.as_bytes(), TTL)
                    .await
                    .map_err(|e| format!("rslock: {e:?}"))?;
                rs.unlock(&lock).await;
                Ok(())
            }
        })
        .await?;
        summary_row(&mut t, "leasehold RedlockBackend (vs rslock)", &o2);
        summary_row(&mut t, "rslock 0.10", &s);
        t.note(format!(
            "Throughput ours / rslock: **{:.2}×** (target ≥ 1.2×).",
            o2.per_sec / s.per_sec
        ));
        out.bars.push(Bar {
            label: format!("redlock: rslock ({rt})"),
            ms: s.p50.as_secs_f64() * 1e3,
        });
    }
    #[cfg(not(feature = "peers"))]
    t.note(PEERS_OFF.to_owned());
    t.note(format!(
        "Ratio ours / raw fan-out, p50: **{:.3}×** (target ≤ 1.1×).",
        o.p50.as_secs_f64() / r.p50.as_secs_f64(),
    ));
    out.tables.push(t);
    Ok(())
}

/// 64 tasks on distinct keys for a while, against `redis-benchmark` SET throughput.
async fn throughput(p: Params, rt: &str, out: &mut Outcome) -> Result<(), BoxError> {
    let ep = services::lookup(Service::Redis)?;
    let url = ep.url().to_owned();
    let ours = locker(
        RedisBackend::connect(RedisConfig::from_url(&url)?.with_prefix(prefix("tput"))?).await?,
    )?;
    let end = Instant::now() + p.throughput;
    let mut tasks = Vec::new();
    for t in 0..64 {
        let ours = ours.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let key = format!("k{t}");
            while Instant::now() < end {
                let lease = ours.try_acquire(&key).await?.ok_or("ours: key held")?;
                lease.release().await?;
                n += 1;
            }
            Ok::<u64, BoxError>(n)
        }));
    }
    let mut cycles = 0;
    for t in tasks {
        cycles += t.await??;
    }
    let ours_rate = cycles as f64 / p.throughput.as_secs_f64();
    let addr = ep.addr().ok_or("redis: no TCP address")?;
    let bench = tokio::process::Command::new("redis-benchmark")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-t", "set", "-c", "64", "-n", "200000", "-q"])
        .output()
        .await?;
    let text = String::from_utf8_lossy(&bench.stdout);
    let set_rate: f64 = text
        .split(['\r', '\n'])
        .filter_map(|l| l.trim().strip_prefix("SET: "))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|v| v.parse().ok())
        .next_back()
        .ok_or_else(|| format!("could not read redis-benchmark output: {text}"))?;
    let mut t = Table::new(
        &format!(
            "64 concurrent tasks on distinct keys ({rt} runtime, {:?})",
            p.throughput
        ),
        &[
            "implementation",
            "operations/s",
            "Redis commands per operation",
        ],
    );
    t.row(vec![
        "leasehold RedisBackend acquire + release cycles".into(),
        format!("{ours_rate:.0}"),
        "2 (acquire script, release script)".into(),
    ]);
    t.row(vec![
        "redis-benchmark -t set -c 64 (one process, C)".into(),
        format!("{set_rate:.0}"),
        "1 (SET)".into(),
    ]);
    t.note(format!(
        "Our cycles/s against redis-benchmark SETs/s: **{:.2}×** (each cycle is two scripted commands).",
        ours_rate / set_rate
    ));
    out.tables.push(t);
    Ok(())
}

/// Handoff (release → next holder, when it is a different task) p50, longest wait, and how
/// often the releasing task took the lock straight back.
fn contention_row(name: &str, grants: Vec<Grant>) -> Vec<String> {
    let c = Contention::of(grants);
    vec![
        name.to_owned(),
        c.grants.to_string(),
        ms(c.handoff_p50.unwrap_or_default()),
        ms(c.longest_wait.unwrap_or_default()),
        format!("{:.0}%", c.straight_back_pct),
    ]
}

async fn contend<F, Fut>(tasks: usize, make: F) -> Result<Vec<Grant>, BoxError>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<Vec<Grant>, BoxError>> + Send + 'static,
{
    let handles: Vec<_> = (0..tasks).map(|t| tokio::spawn(make(t))).collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await??);
    }
    Ok(all)
}

const HOLD: Duration = Duration::from_millis(1);

/// C tasks on one key: ours (one backend shared, and one per task as separate processes would
/// have), rslock (a client per task), PostgreSQL's `pg_advisory_lock` (a session per task).
async fn contention(p: Params, rt: &str, out: &mut Outcome) -> Result<(), BoxError> {
    let redis_url = services::lookup(Service::Redis)?.url().to_owned();
    let pg_url = services::lookup(Service::Postgres)?.url().to_owned();
    for c in [2usize, 8] {
        let mut t = Table::new(
            &format!(
                "{c} tasks contending on one key for {:?}, holding {HOLD:?} ({rt} runtime)",
                p.contention
            ),
            &[
                "implementation",
                "grants",
                "handoff p50",
                "longest wait",
                "taken straight back",
            ],
        );
        let end = Instant::now() + p.contention;
        // Ours, one backend shared by the tasks (local FIFO queue).
        let pre = prefix("contend");
        let shared = locker(
            RedisBackend::connect(RedisConfig::from_url(&redis_url)?.with_prefix(&pre)?).await?,
        )?;
        let grants = contend(c, |task| {
            let l = shared.clone();
            async move { ours_loop(l, task, end).await }
        })
        .await?;
        t.row(contention_row(
            "leasehold RedisBackend, one backend (local FIFO)",
            grants,
        ));

        let end = Instant::now() + p.contention;
        let pre = prefix("contend");
        let mut lockers = Vec::new();
        for _ in 0..c {
            lockers.push(locker(
                RedisBackend::connect(RedisConfig::from_url(&redis_url)?.with_prefix(&pre)?)
                    .await?,
            )?);
        }
        let lockers = Arc::new(lockers);
        let grants = contend(c, |task| {
            let l = lockers[task].clone();
            async move { ours_loop(l, task, end).await }
        })
        .await?;
        t.row(contention_row(
            "leasehold RedisBackend, one backend per task (as separate processes)",
            grants,
        ));

        let end = Instant::now() + p.contention;
        let pre = prefix("contend");
        let mut lockers = Vec::new();
        for _ in 0..c {
            let config = RedisConfig::from_url(&redis_url)?
                .with_prefix(&pre)?
                .with_fair_queue(Duration::from_secs(2))?;
            lockers.push(locker(RedisBackend::connect(config).await?)?);
        }
        let lockers = Arc::new(lockers);
        let grants = contend(c, |task| {
            let l = lockers[task].clone();
            async move { ours_loop(l, task, end).await }
        })
        .await?;
        t.row(contention_row(
            "leasehold RedisBackend in fair mode, one backend per task",
            grants,
        ));

        #[cfg(feature = "peers")]
        {
            let end = Instant::now() + p.contention;
            let key = format!("{}rslock", prefix("contend"));
            let grants = contend(c, |task| {
                let (url, key) = (redis_url.clone(), key.clone());
                async move {
                    let rs = rslock::LockManager::new(vec![url]);
                    harness::grants_until(task, end, || async {
                        let guard = rs
                            .acquire(key.as_bytes(), TTL)
                            .await
                            .map_err(|e| format!("rslock: {e:?}"))?;
                        let held = harness::held_for(HOLD).await;
                        guard.release().await;
                        Ok::<_, BoxError>(held)
                    })
                    .await
                }
            })
            .await?;
            t.row(contention_row("rslock 0.10, a client per task", grants));
        }
        #[cfg(not(feature = "peers"))]
        t.note(PEERS_OFF.to_owned());

        let end = Instant::now() + p.contention;
        let lock_id: i64 = rand_id();
        let grants = contend(c, |task| {
            let url = pg_url.clone();
            async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                let lock = client.prepare("SELECT pg_advisory_lock($1)").await?;
                let unlock = client.prepare("SELECT pg_advisory_unlock($1)").await?;
                harness::grants_until(task, end, || async {
                    client.execute(&lock, &[&lock_id]).await?;
                    let held = harness::held_for(HOLD).await;
                    client.execute(&unlock, &[&lock_id]).await?;
                    Ok::<_, BoxError>(held)
                })
                .await
            }
        })
        .await?;
        t.row(contention_row(
            "PostgreSQL pg_advisory_lock, a session per task",
            grants,
        ));
        t.note("Handoff: from a release to the next grant to a *different* task. \"Taken straight back\": share of grants that went to the task that had just released.".to_owned());
        out.tables.push(t);
    }
    Ok(())
}

fn rand_id() -> i64 {
    i64::from(std::process::id()) << 20 | 0x1eaf
}

async fn ours_loop(l: Locker, task: usize, end: Instant) -> Result<Vec<Grant>, BoxError> {
    harness::grants_until(task, end, || async {
        let lease = l.acquire("hot", Duration::from_secs(60)).await?;
        let held = harness::held_for(HOLD).await;
        lease.release().await?;
        Ok::<_, BoxError>(held)
    })
    .await
}

/// The scenario names `--scenarios` accepts.
pub(crate) const SCENARIOS: [&str; 4] = ["single", "redlock", "throughput", "contention"];

/// The chosen Redis scenarios, on the current runtime.
pub(crate) async fn run(p: Params, rt: &str, scenarios: &[String]) -> Result<Outcome, BoxError> {
    let mut out = Outcome {
        tables: Vec::new(),
        bars: Vec::new(),
    };
    let on = |name: &str| scenarios.iter().any(|s| s == name);
    if on("single") {
        single(p, rt, &mut out).await?;
    }
    if on("redlock") {
        redlock(p, rt, &mut out).await?;
    }
    if on("throughput") {
        throughput(p, rt, &mut out).await?;
    }
    if on("contention") {
        contention(p, rt, &mut out).await?;
    }
    Ok(out)
}
