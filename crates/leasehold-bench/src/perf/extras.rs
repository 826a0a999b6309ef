//! The groups that compare us with something other than a lock: `redis-benchmark` (the
//! server's own tool, SETs at 64 clients) and `tower-layer` (what `LockLayer` adds to a
//! request, on the in-memory backend).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Locker, MemoryBackend};
use leasehold_redis::{RedisBackend, RedisConfig};
use leasehold_test_support::services::{self, Service};
use leasehold_tower::LockLayer;
use tower::{Layer as _, Service as _, ServiceExt as _, service_fn};

use super::model::{Params, Row, Scenario};
use super::scenarios::run_tasks;
use crate::harness::{BoxError, runtime};
use crate::stats::Spread;
use crate::subjects::raw::RawRedis;
use crate::subjects::{Client, Kind, Ours};

/// Tasks (our side) and clients (redis-benchmark's) of the redis-benchmark group.
const CLIENTS: usize = 64;

/// Our cycles at 64 tasks on distinct keys against `redis-benchmark -t set -c 64`.
pub(super) async fn redis_benchmark(p: &Params, rt: &str) -> Vec<Row> {
    let base = Row {
        runtime: rt.to_owned(),
        group: format!("redis, {CLIENTS} clients, against redis-benchmark"),
        scenario: Scenario::Repeated,
        concurrency: CLIENTS,
        ..Row::default()
    };
    let ours = Row {
        label: "leasehold RedisBackend acquire + release (SET NX + INCR, then a script)".into(),
        kind: Kind::Ours.as_str(),
        ..base.clone()
    };
    let tool = Row {
        label: format!("redis-benchmark -t set -c {CLIENTS} (1 SET, one C process)"),
        kind: Kind::Tool.as_str(),
        ..base
    };
    match redis_rates(p).await {
        Ok((cycles, ours_rate, set_rate)) => {
            let ratio = Spread::of(&mut [ours_rate / set_rate]);
            vec![
                Row {
                    cycles,
                    per_sec: Some(ours_rate),
                    ratio: Some((ratio, "our cycles/s / its SETs/s".into())),
                    ..ours
                },
                Row {
                    cycles: usize::try_from(p.benchmark_requests()).unwrap_or(usize::MAX),
                    per_sec: Some(set_rate),
                    ..tool
                },
            ]
        }
        Err(e) => vec![Row {
            error: Some(e.to_string()),
            ..ours
        }],
    }
}

/// Our cycles, our cycles/s, redis-benchmark's SETs/s.
async fn redis_rates(p: &Params) -> Result<(usize, f64, f64), BoxError> {
    let ep = services::lookup(Service::Redis)?;
    let prefix = format!("{}:", services::unique_prefix("perf-vs-tool"));
    let cfg = RedisConfig::from_url(ep.url())?.with_prefix(prefix)?;
    let ours: Arc<dyn Client> = Arc::new(Ours::new(Arc::new(RedisBackend::connect(cfg).await?))?);
    let clients = vec![ours; CLIENTS];
    let tag = services::unique_prefix("t");
    run_tasks(&clients, &tag, None).await?;
    let t0 = tokio::time::Instant::now();
    let cycles = run_tasks(&clients, &tag, Some(p.throughput)).await?;
    let ours_rate = cycles as f64 / t0.elapsed().as_secs_f64();
    let addr = ep.addr().ok_or("redis: no TCP address")?;
    let out = tokio::process::Command::new("redis-benchmark")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-t", "set", "-c", &CLIENTS.to_string()])
        .args(["-n", &p.benchmark_requests().to_string(), "-q"])
        .output()
        .await
        .map_err(|e| format!("running redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let set_rate: f64 = text
        .split(['\r', '\n'])
        .filter_map(|l| l.trim().strip_prefix("SET: "))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|v| v.parse().ok())
        .next_back()
        .ok_or_else(|| format!("could not read redis-benchmark output: {text}"))?;
    Ok((cycles, ours_rate, set_rate))
}

/// A subject of the Redis CPU rows: its label, kind, client, and the commands it sends itself
/// (its top-level commands; what runs inside a script or transaction is counted in them).
struct CpuSubject {
    label: &'static str,
    kind: Kind,
    client: Arc<dyn Client>,
    top_level: &'static [&'static str],
}

/// Cycles per subject and round of the Redis CPU rows.
fn cpu_cycles(p: &Params) -> usize {
    if p.quick { 50 } else { 2_000 }
}

/// Redis CPU per uncontended cycle: each subject cycles alone on one key for a round, the
/// subjects taking turns (`4 × repeats + 1` rounds, the order rotating), and the server's
/// `INFO commandstats` before and after each turn gives the `usec` of the subject's top-level
/// commands per cycle. A `PUBLISH` during our uncontended cycles (nobody waits) is an error.
pub(super) async fn redis_cpu(p: &Params, rt: &str) -> Vec<Row> {
    let base = Row {
        runtime: rt.to_owned(),
        group: "redis (single node), server CPU per uncontended cycle".to_owned(),
        scenario: Scenario::Repeated,
        concurrency: 1,
        ..Row::default()
    };
    let subjects = match cpu_subjects().await {
        Ok(s) => s,
        Err(e) => {
            return vec![Row {
                label: "Redis CPU per cycle".into(),
                error: Some(e.to_string()),
                ..base
            }];
        }
    };
    let mut rows: Vec<Row> = subjects
        .iter()
        .map(|s| Row {
            label: format!(
                "{} (Redis CPU per cycle: usec of {} incl. their inner calls)",
                s.label,
                s.top_level.join(" + ")
            ),
            kind: s.kind.as_str(),
            ..base.clone()
        })
        .collect();
    match cpu_rounds(p, &subjects).await {
        Ok(per_round) => {
            let raw = subjects.iter().position(|s| s.kind == Kind::Raw);
            for (i, r) in rows.iter_mut().enumerate() {
                let us = Spread::of(&mut per_round.iter().map(|x| x[i]).collect::<Vec<_>>());
                r.cycles = per_round.len() * cpu_cycles(p);
                r.p50 = Some(Duration::from_secs_f64(us.median * 1e-6));
                // Per second: the cycles one fully busy Redis core could serve.
                r.per_sec = (us.median > 0.0).then(|| 1e6 / us.median);
                r.ratio = raw.filter(|&j| j != i).map(|j| {
                    let mut x: Vec<f64> = per_round.iter().map(|x| x[i] / x[j]).collect();
                    (Spread::of(&mut x), "Redis CPU per cycle / raw's".to_owned())
                });
            }
        }
        Err(e) => {
            for r in &mut rows {
                r.error = Some(e.to_string());
            }
        }
    }
    rows
}

async fn cpu_subjects() -> Result<Vec<CpuSubject>, BoxError> {
    let ep = services::lookup(Service::Redis)?;
    let cfg = RedisConfig::from_url(ep.url())?;
    let prefix = || format!("{}:", services::unique_prefix("perf-cpu"));
    let ours = cfg.clone().with_prefix(prefix())?;
    let fair = cfg
        .with_prefix(prefix())?
        .with_fair_queue(Duration::from_secs(2))?;
    let raw = RawRedis::connect(vec![ep.url().to_owned()], prefix(), Duration::from_secs(1));
    Ok(vec![
        CpuSubject {
            label: "leasehold RedisBackend",
            kind: Kind::Ours,
            client: Arc::new(Ours::new(Arc::new(RedisBackend::connect(ours).await?))?),
            top_level: &["set", "incr", "evalsha"],
        },
        CpuSubject {
            label: "leasehold RedisBackend, fair queue",
            kind: Kind::Ours,
            client: Arc::new(Ours::new(Arc::new(RedisBackend::connect(fair).await?))?),
            top_level: &["set", "incr", "evalsha"],
        },
        CpuSubject {
            label: "raw redis-rs SET NX PX + compare-and-delete EVALSHA",
            kind: Kind::Raw,
            client: Arc::new(raw.await?),
            top_level: &["set", "evalsha"],
        },
    ])
}

/// Per round, per subject: Redis CPU µs per cycle.
async fn cpu_rounds(p: &Params, subjects: &[CpuSubject]) -> Result<Vec<Vec<f64>>, BoxError> {
    let ep = services::lookup(Service::Redis)?;
    let mut stats = redis::Client::open(ep.url())?
        .get_multiplexed_async_connection()
        .await?;
    let n = cpu_cycles(p);
    let key = services::unique_prefix("cpu");
    // Warm-up: connections made, scripts loaded.
    for s in subjects {
        for _ in 0..10 {
            s.client.cycle(&key).await?;
        }
    }
    let mut rounds = Vec::new();
    for round in 0..p.repeats.max(1) * 4 + 1 {
        let mut us = vec![0.0; subjects.len()];
        for k in 0..subjects.len() {
            let i = (round + k) % subjects.len();
            let s = &subjects[i];
            let before = commandstats(&mut stats).await?;
            for _ in 0..n {
                s.client.cycle(&key).await?;
            }
            let after = commandstats(&mut stats).await?;
            let delta = |name: &str, field: usize| {
                let get = |m: &std::collections::HashMap<String, (u64, u64)>| {
                    m.get(name)
                        .map_or(0, |v| if field == 0 { v.0 } else { v.1 })
                };
                get(&after).saturating_sub(get(&before))
            };
            if s.kind == Kind::Ours && delta("publish", 0) > 0 {
                return Err(format!(
                    "{} published {} wake-up(s) in {n} uncontended cycles, with nobody waiting",
                    s.label,
                    delta("publish", 0)
                )
                .into());
            }
            let usec: u64 = s.top_level.iter().map(|c| delta(c, 1)).sum();
            us[i] = usec as f64 / n as f64;
        }
        rounds.push(us);
    }
    Ok(rounds)
}

/// `INFO commandstats`: per command, (calls, usec).
async fn commandstats(
    c: &mut redis::aio::MultiplexedConnection,
) -> Result<std::collections::HashMap<String, (u64, u64)>, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await?;
    let mut out = std::collections::HashMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .trim()
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_owned(), (field("calls"), field("usec")));
    }
    Ok(out)
}

/// The ways to serve the same trivial request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// The inner service alone.
    Bare,
    /// By hand: `Locker::try_acquire`, the inner service, `Lease::release`.
    Locker,
    /// Behind `LockLayer` (try mode), which releases on drop in the background.
    Layer,
    /// The layer under a no-op metrics recorder, while the others run under a recording
    /// one (`metrics` feature): their ratio is the cost of recording.
    #[cfg(feature = "metrics")]
    LayerNoRecorder,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Self::Bare => "bare service (no lock)",
            Self::Locker => "Locker by hand (try_acquire, call, release)",
            Self::Layer => "LockLayer (try mode)",
            #[cfg(feature = "metrics")]
            Self::LayerNoRecorder => "LockLayer (try mode), no-op metrics recorder",
        }
    }
}

#[cfg(not(feature = "metrics"))]
const VARIANTS: [Variant; 3] = [Variant::Bare, Variant::Locker, Variant::Layer];
#[cfg(feature = "metrics")]
const VARIANTS: [Variant; 4] = [
    Variant::Bare,
    Variant::Locker,
    Variant::Layer,
    Variant::LayerNoRecorder,
];

/// The request: an `http` request whose body is its key (the layer puts the lease into its
/// extensions, as it would for a real service).
type Req = http::Request<String>;

async fn inner(req: Req) -> Result<usize, Infallible> {
    Ok(std::hint::black_box(req.body().len()))
}

/// Serves `n` requests (fresh keys from `base`) the `variant` way; every request is followed
/// by one `yield_now`, so background releases run (and are paid for) inside the measurement.
async fn serve(variant: Variant, locker: &Locker, n: u64, base: u64) -> Result<Duration, BoxError> {
    #[cfg(feature = "metrics")]
    let noop = metrics::NoopRecorder;
    #[cfg(feature = "metrics")]
    let _guard =
        (variant == Variant::LayerNoRecorder).then(|| metrics::set_default_local_recorder(&noop));
    let svc = service_fn(inner);
    let layered = LockLayer::new(locker.clone(), |req: &Req| Some(req.body().clone())).layer(svc);
    let started = std::time::Instant::now();
    for i in 0..n {
        let key = format!("bench/{}", base + i);
        let req = http::Request::new(key.clone());
        let out = if variant == Variant::Locker {
            let lease = locker.try_acquire(key.as_str()).await?.ok_or("key held")?;
            let out = svc.oneshot(req).await?;
            lease.release().await?;
            out
        } else if variant == Variant::Bare {
            svc.oneshot(req).await?
        } else {
            let mut s = layered.clone();
            s.ready().await?.call(req).await?
        };
        std::hint::black_box(out);
        tokio::task::yield_now().await;
    }
    Ok(started.elapsed())
}

/// The LockLayer group, on a current-thread runtime of its own: every variant in rounds (the
/// order rotating each round), `4 × repeats + 1` rounds of `layer_requests` requests; the
/// medians over rounds of the time per request, and of the per-round ratios.
pub(super) fn tower_layer(p: &Params) -> Vec<Row> {
    let base = Row {
        runtime: "current-thread".to_owned(),
        group: "tower-layer (memory backend)".to_owned(),
        scenario: Scenario::Repeated,
        kind: "ours",
        concurrency: 1,
        ..Row::default()
    };
    let measured = runtime("current-thread").and_then(|rt| {
        #[cfg(feature = "metrics")]
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        #[cfg(feature = "metrics")]
        let _guard = metrics::set_default_local_recorder(&recorder);
        rt.block_on(layer_rounds(p))
    });
    let ns = match measured {
        Ok(ns) => ns,
        Err(e) => {
            return vec![Row {
                label: Variant::Layer.label().into(),
                error: Some(e.to_string()),
                ..base
            }];
        }
    };
    let per_round =
        |f: &dyn Fn(&[f64]) -> f64| Spread::of(&mut ns.iter().map(|r| f(r)).collect::<Vec<_>>());
    let rounds = ns.len();
    VARIANTS
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let median = per_round(&|r| r[i]).median;
            let ratio = match v {
                Variant::Layer => Some((per_round(&|r| r[2] / r[1]), "LockLayer / Locker by hand")),
                #[cfg(feature = "metrics")]
                Variant::LayerNoRecorder => {
                    Some((per_round(&|r| r[2] / r[3]), "recording / no-op recorder"))
                }
                _ => None,
            };
            Row {
                label: v.label().to_owned(),
                kind: if *v == Variant::Bare { "raw" } else { "ours" },
                cycles: rounds * usize::try_from(p.layer_requests()).unwrap_or(0),
                p50: Some(Duration::from_secs_f64(median * 1e-9)),
                per_sec: (median > 0.0).then(|| 1e9 / median),
                ratio: ratio.map(|(s, what)| (s, what.to_owned())),
                ..base.clone()
            }
        })
        .collect()
}

/// Nanoseconds per request of each variant, one array per round.
async fn layer_rounds(p: &Params) -> Result<Vec<Vec<f64>>, BoxError> {
    let locker = Locker::new(MemoryBackend::new());
    let n = p.layer_requests().max(1);
    let mut base = 0;
    for v in VARIANTS {
        serve(v, &locker, n / 10, base).await?;
        base += n;
    }
    let mut rounds = Vec::new();
    for round in 0..p.repeats.max(1) * 4 + 1 {
        let mut ns = vec![0.0; VARIANTS.len()];
        for k in 0..VARIANTS.len() {
            let i = (round + k) % VARIANTS.len();
            let elapsed = serve(VARIANTS[i], &locker, n, base).await?;
            base += n;
            ns[i] = elapsed.as_nanos() as f64 / n as f64;
        }
        rounds.push(ns);
    }
    Ok(rounds)
}
