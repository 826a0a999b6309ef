//! `leasehold-bench perf`: every backend, its raw protocol cycle and the peer crates, side by
//! side in one run, on both Tokio runtimes.
//!
//! Scenarios, per group of implementations (a backend on one deployment):
//! - **cycle**: uncontended try-acquire + release latency (p50, p99, cycles/s), the
//!   implementations of a group taking turns in rounds;
//! - **throughput**: C tasks (1, 8, 64) cycling on distinct keys for a while;
//! - **contention**: C clients (one each, as separate processes would have) on one key, each
//!   holding it 1 ms: handoff latency, longest wait (fairness), grants taken straight back, and a
//!   check that no two grants overlapped.
//!
//! Redlock runs on 3, 5 and 7 nodes (the 7-node run adds two `redis-server` processes the
//! benchmark starts itself next to the five Redlock nodes of `scripts/services`), and on 5
//! nodes with the fifth behind a [`FaultProxy`] that black-holes it or delays it by 20 ms each
//! way. After each scenario the keys or locks each implementation left on the servers are
//! counted. `--quick` runs everything with tiny counts and fails (exit status 1) on any error,
//! leftover or nonsensical figure; it never judges timings.

mod charts;
#[cfg(feature = "peers")]
pub(crate) mod peers;
pub(crate) mod subject;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, MemoryBackend};
use leasehold_etcd::{EtcdBackend, EtcdConfig};
use leasehold_file::{FileBackend, FileConfig};
use leasehold_postgres::{PostgresBackend, PostgresConfig};
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::services::{self, Service};
use tokio::time::Instant;

use crate::Cli;
use crate::harness::{BoxError, grants_until, runtime, runtimes};
use crate::report::Table;
use crate::stats::{Contention, Grant, Summary, ms};
use subject::{Client, Count, Kind, MakeClient, Ours, Subject};

/// What one run of `leasehold-bench perf` measures.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    /// Cycles per implementation in the cycle scenario.
    pub(crate) iterations: usize,
    /// Upper bound on the time one implementation spends in the cycle scenario.
    pub(crate) cycle_budget: Duration,
    /// Task counts of the throughput scenario.
    pub(crate) concurrency: Vec<usize>,
    /// Duration of each throughput run.
    pub(crate) throughput: Duration,
    /// Clients on the one key of the contention scenario.
    pub(crate) clients: usize,
    /// Duration of each contention run.
    pub(crate) contention: Duration,
    /// Which groups to run (empty: all).
    pub(crate) groups: Vec<String>,
    /// The quick smoke-test mode.
    pub(crate) quick: bool,
}

impl Params {
    /// The `--quick` figures: everything runs, a few cycles each.
    pub(crate) fn quick(groups: Vec<String>) -> Self {
        Self {
            iterations: 20,
            cycle_budget: Duration::from_millis(300),
            concurrency: vec![1, 4],
            throughput: Duration::from_millis(100),
            clients: 2,
            contention: Duration::from_millis(150),
            groups,
            quick: true,
        }
    }
}

/// Every group name `--groups` accepts, in run order.
pub(crate) const GROUPS: [&str; 12] = [
    "memory",
    "file",
    "redis",
    "redlock3",
    "redlock5",
    "redlock7",
    "redlock5-blackhole",
    "redlock5-slow",
    "postgres-tcp",
    "postgres-unix",
    "etcd",
    "etcd-cluster",
];

/// A hard bound on one cycle (a hung implementation fails instead of stalling the run).
const CYCLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a contender may wait for the key.
const WAIT: Duration = Duration::from_secs(10);
/// How long a contender holds the key.
const HOLD: Duration = Duration::from_millis(1);
/// Pause before counting leftovers, for releases still on the wire (the slowed node's
/// round trip is 40 ms).
const SETTLE: Duration = Duration::from_millis(100);
/// The same in `--quick` mode.
const SETTLE_QUICK: Duration = Duration::from_millis(50);
/// When a count found new locks: how long before counting again (far below the 30 s TTL).
const RECOUNT: Duration = Duration::from_secs(1);
/// Delay added each way to the slowed Redlock node.
const SLOW: Duration = Duration::from_millis(20);
/// Per-node timeout of the raw Redlock fan-out (leasehold's default for a 30 s TTL).
const RAW_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// One measured line of the report (one implementation, one scenario, one concurrency).
#[derive(Debug, Clone, Default)]
pub(crate) struct Row {
    pub(crate) runtime: String,
    pub(crate) group: String,
    pub(crate) scenario: &'static str,
    pub(crate) label: String,
    pub(crate) kind: &'static str,
    pub(crate) concurrency: usize,
    pub(crate) cycles: usize,
    pub(crate) p50: Option<Duration>,
    pub(crate) p99: Option<Duration>,
    pub(crate) per_sec: Option<f64>,
    pub(crate) grants: Option<usize>,
    pub(crate) handoff_p50: Option<Duration>,
    pub(crate) longest_wait: Option<Duration>,
    pub(crate) straight_back: Option<f64>,
    pub(crate) leftovers: Option<u64>,
    pub(crate) error: Option<String>,
}

/// A group: one backend on one deployment, the implementations compared on it, and what
/// must live while it runs (fault proxies, extra Redis nodes).
struct Group {
    name: &'static str,
    title: String,
    /// Scenarios beyond the cycle.
    full: bool,
    subjects: Vec<Subject>,
    /// Turns the fault on (after the clients connected through the proxy).
    fault: Option<Arc<FaultProxy>>,
    fault_mode: Option<leasehold_test_support::proxy::Mode>,
    /// What each subject's last count found, so a scenario is charged only with what it
    /// added (keys left earlier live on until their TTL).
    counted: std::sync::Mutex<Vec<u64>>,
    _keep: Vec<Box<dyn std::any::Any + Send>>,
}

fn make<F, Fut, C>(f: F) -> MakeClient
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<C, BoxError>> + Send + 'static,
    C: Client + 'static,
{
    Box::new(move || {
        let fut = f();
        Box::pin(async move { Ok(Arc::new(fut.await?) as Arc<dyn Client>) })
    })
}

fn prefix(what: &str) -> String {
    format!("{}:", services::unique_prefix(what))
}

/// A unique `application_name` for one subject's PostgreSQL sessions.
fn app_name() -> String {
    services::unique_prefix("perf")
}

/// Redis (one node) or Redlock (several): ours, raw, and the peers. `count_urls` are the
/// nodes reached directly (not through a proxy) for counting leftovers.
fn redis_subjects(urls: &[String], count_urls: &[String]) -> Vec<Subject> {
    let single = urls.len() == 1;
    let mut v = Vec::new();
    let p = prefix("perf-ours");
    let (u, pp) = (urls.to_vec(), p.clone());
    v.push(Subject::new(
        if single {
            "leasehold RedisBackend"
        } else {
            "leasehold RedlockBackend"
        },
        Kind::Ours,
        true,
        make(move || {
            let (u, pp) = (u.clone(), pp.clone());
            async move {
                let backend: Arc<dyn LockBackend> = if u.len() == 1 {
                    Arc::new(
                        RedisBackend::connect(RedisConfig::from_url(&u[0])?.with_prefix(pp)?)
                            .await?,
                    )
                } else {
                    Arc::new(RedlockBackend::new(
                        RedlockConfig::from_urls(&u)?.with_prefix(pp)?,
                    )?)
                };
                Ok(Ours(Ours::locker(backend)?))
            }
        }),
        Count::Redis {
            urls: count_urls.to_vec(),
            needle: p,
        },
    ));
    let p = prefix("perf-raw");
    let (u, pp) = (urls.to_vec(), p.clone());
    v.push(Subject::new(
        if single {
            "raw redis-rs SET NX PX + EVALSHA"
        } else {
            "raw concurrent fan-out (50 ms per node)"
        },
        Kind::Raw,
        true,
        make(move || subject::RawRedis::connect_owned(u.clone(), pp.clone(), RAW_NODE_TIMEOUT)),
        Count::Redis {
            urls: count_urls.to_vec(),
            needle: p,
        },
    ));
    #[cfg(feature = "peers")]
    {
        let p = prefix("perf-rslock");
        let (u, pp) = (urls.to_vec(), p.clone());
        v.push(Subject::new(
            "rslock 0.10",
            Kind::Peer,
            true,
            make(move || {
                let c = peers::Rslock::new(&u, pp.clone());
                async move { Ok(c) }
            }),
            Count::Redis {
                urls: count_urls.to_vec(),
                needle: p,
            },
        ));
        let p = prefix("perf-dlredis");
        let (u, pp) = (urls.to_vec(), p.clone());
        v.push(Subject::new(
            "distributed-lock-redis 0.2",
            Kind::Peer,
            true,
            make(move || {
                let (u, pp) = (u.clone(), pp.clone());
                async move { peers::DlRedis::connect(&u, pp).await }
            }),
            Count::Redis {
                urls: count_urls.to_vec(),
                needle: p,
            },
        ));
    }
    v
}

fn postgres_subjects(conninfo: &str) -> Vec<Subject> {
    let mut v = Vec::new();
    let (p, app) = (prefix("perf-ours"), app_name());
    let (c, pp, a) = (conninfo.to_owned(), p.clone(), app.clone());
    v.push(Subject::new(
        "leasehold PostgresBackend (a session per held lock)",
        Kind::Ours,
        true,
        make(move || {
            let (c, pp, a) = (c.clone(), pp.clone(), a.clone());
            async move {
                let cfg = PostgresConfig::from_url(&c)?
                    .with_prefix(pp)?
                    .with_application_name(a);
                Ok(Ours(Ours::locker(Arc::new(
                    PostgresBackend::connect(cfg).await?,
                ))?))
            }
        }),
        Count::Postgres {
            conninfo: conninfo.to_owned(),
            app,
        },
    ));
    let (p, app) = (prefix("perf-raw"), app_name());
    let (c, pp, a) = (conninfo.to_owned(), p, app.clone());
    v.push(Subject::new(
        "raw prepared pg_try_advisory_lock + unlock (one connection)",
        Kind::Raw,
        true,
        make(move || {
            let (c, pp, a) = (c.clone(), pp.clone(), a.clone());
            async move { subject::RawPg::connect(&c, &a, pp).await }
        }),
        Count::Postgres {
            conninfo: conninfo.to_owned(),
            app,
        },
    ));
    #[cfg(feature = "peers")]
    {
        let (p, app) = (prefix("perf-sqlx"), app_name());
        let (c, pp, a) = (conninfo.to_owned(), p, app.clone());
        v.push(Subject::new(
            format!("sqlx 0.9 PgAdvisoryLock (pool of {})", peers::POOL),
            Kind::Peer,
            true,
            make(move || {
                let (c, pp, a) = (c.clone(), pp.clone(), a.clone());
                async move { peers::SqlxAdvisory::connect(&c, &a, pp).await }
            }),
            Count::Postgres {
                conninfo: conninfo.to_owned(),
                app,
            },
        ));
        let (p, app) = (prefix("perf-dlpg"), app_name());
        let (c, pp, a) = (conninfo.to_owned(), p, app.clone());
        v.push(Subject::new(
            format!("distributed-lock-postgres 0.2 (pool of {})", peers::POOL),
            Kind::Peer,
            true,
            make(move || {
                let (c, pp, a) = (c.clone(), pp.clone(), a.clone());
                async move {
                    let url = peers::sqlx08_url(&c, &a)?;
                    peers::DlPostgres::connect(&url, pp).await
                }
            }),
            Count::Postgres {
                conninfo: conninfo.to_owned(),
                app,
            },
        ));
    }
    v
}

fn etcd_subjects(endpoints: &[String]) -> Vec<Subject> {
    let mut v = Vec::new();
    let p = prefix("perf-ours");
    let (e, pp) = (endpoints.to_vec(), p.clone());
    v.push(Subject::new(
        "leasehold EtcdBackend (session lease)",
        Kind::Ours,
        true,
        make(move || {
            let (e, pp) = (e.clone(), pp.clone());
            async move {
                let backend = EtcdBackend::connect(EtcdConfig::new(e).with_prefix(pp)?).await?;
                Ok(Ours(Ours::locker(Arc::new(backend))?))
            }
        }),
        Count::Etcd {
            endpoints: endpoints.to_vec(),
            prefix: p,
            leases: None,
        },
    ));
    let p = prefix("perf-raw");
    let (e, pp) = (endpoints.to_vec(), p.clone());
    v.push(Subject::new(
        "raw Lock + Unlock RPCs on one kept lease",
        Kind::Raw,
        true,
        make(move || {
            let (e, pp) = (e.clone(), pp.clone());
            async move { subject::RawEtcd::connect(&e, pp).await }
        }),
        Count::Etcd {
            endpoints: endpoints.to_vec(),
            prefix: p,
            leases: None,
        },
    ));
    let p = prefix("perf-lpl");
    let leases = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (e, pp, l) = (endpoints.to_vec(), p.clone(), Arc::clone(&leases));
    v.push(Subject::new(
        "etcd-client 0.21 Lock, a lease per lock",
        Kind::Peer,
        true,
        make(move || {
            let (e, pp, l) = (e.clone(), pp.clone(), Arc::clone(&l));
            async move { subject::EtcdLeasePerLock::connect(&e, pp, l).await }
        }),
        Count::Etcd {
            endpoints: endpoints.to_vec(),
            prefix: p,
            leases: Some(leases),
        },
    ));
    v
}

/// A `redis-server` the benchmark starts for the 7-node Redlock run (no persistence, an
/// ephemeral port); killed when dropped.
struct ExtraRedis {
    _child: tokio::process::Child,
    url: String,
}

impl ExtraRedis {
    async fn start() -> Result<Self, BoxError> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let child = tokio::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting redis-server for the 7-node Redlock run: {e}"))?;
        let url = format!("redis://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let ping = async {
                let mut c = redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                redis::cmd("PING").query_async::<String>(&mut c).await
            };
            match ping.await {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("extra redis-server on {port} did not answer: {e}").into());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        Ok(Self { _child: child, url })
    }
}

/// Removes the file backend's lock folder when the group is done.
struct RemoveDir(std::path::PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn build_group(name: &'static str, out: &Path) -> Result<Group, BoxError> {
    let mut g = Group {
        name,
        title: String::new(),
        full: true,
        subjects: Vec::new(),
        fault: None,
        fault_mode: None,
        counted: std::sync::Mutex::default(),
        _keep: Vec::new(),
    };
    let redlock = || -> Result<Vec<String>, BoxError> {
        Ok(services::lookup(Service::Redlock)?.urls().to_vec())
    };
    match name {
        "memory" => {
            g.title = "memory (in process)".into();
            let backend = Arc::new(MemoryBackend::new());
            let b = Arc::clone(&backend);
            g.subjects.push(Subject::new(
                "leasehold MemoryBackend",
                Kind::Ours,
                true,
                make(move || {
                    let b: Arc<dyn LockBackend> = b.clone();
                    async move { Ok(Ours(Ours::locker(b)?)) }
                }),
                Count::Local(Box::new(move || backend.held_count())),
            ));
        }
        "file" => {
            g.title = "file (flock, local disk)".into();
            let dir = out.join(format!("file-locks-{}", services::unique_prefix("perf")));
            std::fs::create_dir_all(&dir)?;
            g._keep.push(Box::new(RemoveDir(dir.clone())));
            let made: Arc<std::sync::Mutex<Vec<Arc<FileBackend>>>> = Arc::default();
            let (d, m) = (dir.clone(), Arc::clone(&made));
            g.subjects.push(Subject::new(
                "leasehold FileBackend (a backend per client)",
                Kind::Ours,
                false,
                make(move || {
                    let (d, m) = (d.clone(), Arc::clone(&m));
                    async move {
                        let b = Arc::new(FileBackend::new(FileConfig::new(d))?);
                        if let Ok(mut v) = m.lock() {
                            v.push(Arc::clone(&b));
                        }
                        Ok(Ours(Ours::locker(b)?))
                    }
                }),
                Count::Local(Box::new(move || {
                    made.lock()
                        .map(|v| v.iter().map(|b| b.held_count()).sum())
                        .unwrap_or(usize::MAX)
                })),
            ));
        }
        "redis" => {
            g.title = "redis (single node)".into();
            let url = services::lookup(Service::Redis)?.url().to_owned();
            g.subjects = redis_subjects(std::slice::from_ref(&url), std::slice::from_ref(&url));
        }
        "redlock3" | "redlock5" => {
            let n = if name == "redlock3" { 3 } else { 5 };
            let urls: Vec<String> = redlock()?.into_iter().take(n).collect();
            if urls.len() < n {
                return Err(format!("{name}: only {} Redlock nodes", urls.len()).into());
            }
            g.title = format!("redlock, {n} nodes");
            g.full = n == 5;
            g.subjects = redis_subjects(&urls, &urls);
        }
        "redlock7" => {
            let mut urls = redlock()?;
            for _ in 0..2 {
                let extra = ExtraRedis::start().await?;
                urls.push(extra.url.clone());
                g._keep.push(Box::new(extra));
            }
            g.title = "redlock, 7 nodes (5 + 2 started by the bench)".into();
            g.full = false;
            g.subjects = redis_subjects(&urls, &urls);
        }
        "redlock5-blackhole" | "redlock5-slow" => {
            let direct = redlock()?;
            let last = direct.len().checked_sub(1).ok_or("no Redlock nodes")?;
            let addr = *services::lookup(Service::Redlock)?
                .addrs()
                .get(last)
                .ok_or("no address for the last Redlock node")?;
            let proxy = Arc::new(FaultProxy::start(addr).await?);
            let mut urls = direct.clone();
            urls[last] = format!("redis://{}", proxy.addr());
            let blackhole = name == "redlock5-blackhole";
            g.title = if blackhole {
                "redlock, 5 nodes, one black-holed".into()
            } else {
                format!("redlock, 5 nodes, one slowed by {SLOW:?} each way")
            };
            g.full = false;
            g.fault_mode = Some(if blackhole {
                leasehold_test_support::proxy::Mode::Blackhole
            } else {
                leasehold_test_support::proxy::Mode::Latency(SLOW)
            });
            g.fault = Some(proxy);
            g.subjects = redis_subjects(&urls, &direct);
        }
        "postgres-tcp" | "postgres-unix" => {
            let (service, title) = if name == "postgres-tcp" {
                (Service::Postgres, "postgres over TCP")
            } else {
                (Service::PostgresSocket, "postgres over the unix socket")
            };
            g.title = title.into();
            g.subjects = postgres_subjects(services::lookup(service)?.url());
        }
        "etcd" | "etcd-cluster" => {
            let (service, title) = if name == "etcd" {
                (Service::Etcd, "etcd, single member")
            } else {
                (Service::EtcdCluster, "etcd, 3-member cluster")
            };
            g.title = title.into();
            g.subjects = etcd_subjects(services::lookup(service)?.urls());
        }
        other => {
            return Err(format!("unknown group {other:?}; expected some of {GROUPS:?}").into());
        }
    }
    Ok(g)
}

fn base_row(rt: &str, g: &Group, s: &Subject, scenario: &'static str, c: usize) -> Row {
    Row {
        runtime: rt.to_owned(),
        group: g.title.clone(),
        scenario,
        label: s.label.clone(),
        kind: s.kind.as_str(),
        concurrency: c,
        ..Row::default()
    }
}

/// Counts what each subject left (clients still alive), after a moment for releases that
/// are still on the wire.
async fn count_leftovers(p: &Params, g: &Group, rows: &mut [Row]) {
    tokio::time::sleep(if p.quick { SETTLE_QUICK } else { SETTLE }).await;
    let mut found = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        match s.leftovers().await {
            Ok(n) => found.push(n),
            Err(e) => {
                r.error
                    .get_or_insert_with(|| format!("counting leftovers: {e}"));
                found.push(None);
            }
        }
    }
    let Ok(mut counted) = g.counted.lock().map(|c| c.clone()) else {
        return;
    };
    counted.resize(found.len(), 0);
    // A key that is gone a moment later was released late (through the slowed node's proxy,
    // on a loaded machine), not left behind: those live until their 30 s TTL. Recount once.
    if found
        .iter()
        .zip(&counted)
        .any(|(n, before)| n.is_some_and(|n| n > *before))
    {
        tokio::time::sleep(RECOUNT).await;
        for ((s, n), before) in g.subjects.iter().zip(found.iter_mut()).zip(&counted) {
            if n.is_some_and(|n| n > *before)
                && let Ok(again) = s.leftovers().await
            {
                if again < *n {
                    eprintln!(
                        "perf: {} / {}: {} lock(s) found right after the scenario were \
                         released within {RECOUNT:?}",
                        g.title,
                        s.label,
                        n.unwrap_or(0) - again.unwrap_or(0)
                    );
                }
                *n = again;
            }
        }
    }
    for ((r, n), before) in rows.iter_mut().zip(&found).zip(counted.iter_mut()) {
        if let Some(n) = *n {
            r.leftovers = Some(n.saturating_sub(*before));
            *before = n;
        }
    }
    if let Ok(mut c) = g.counted.lock() {
        *c = counted;
    }
}

async fn timed<T>(
    fut: impl Future<Output = Result<T, BoxError>>,
    limit: Duration,
) -> Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// The cycle scenario: the group's subjects take turns in rounds.
async fn cycle_scenario(p: &Params, rt: &str, g: &Group) -> Vec<Row> {
    const ROUNDS: usize = 10;
    let mut rows: Vec<Row> = g
        .subjects
        .iter()
        .map(|s| base_row(rt, g, s, "cycle", 1))
        .collect();
    let mut clients: Vec<Option<Arc<dyn Client>>> = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        match timed((s.make)(), CYCLE_TIMEOUT).await {
            Ok(c) => clients.push(Some(c)),
            Err(e) => {
                r.error = Some(format!("connect: {e}"));
                clients.push(None);
            }
        }
    }
    if let (Some(proxy), Some(mode)) = (&g.fault, g.fault_mode) {
        proxy.set_mode(mode);
    }
    let warmup = (p.iterations / 10).clamp(1, 20);
    let per = (p.iterations / ROUNDS).max(1);
    let round_budget = p.cycle_budget / ROUNDS as u32;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); clients.len()];
    // Time spent measuring each subject: one that is out of budget sits out the remaining
    // rounds once it has a sample (a black-holed node can make a cycle take seconds).
    let mut spent = vec![Duration::ZERO; clients.len()];
    for round in 0..=ROUNDS {
        for (i, slot) in clients.iter_mut().enumerate() {
            let Some(c) = slot.clone() else { continue };
            if round > 0 && !samples[i].is_empty() && spent[i] >= p.cycle_budget {
                continue;
            }
            let started = Instant::now();
            let n = if round == 0 { warmup } else { per };
            for _ in 0..n {
                let t0 = Instant::now();
                if let Err(e) = timed(c.cycle("u"), CYCLE_TIMEOUT).await {
                    rows[i].error = Some(e);
                    *slot = None;
                    break;
                }
                if round > 0 {
                    samples[i].push(t0.elapsed());
                }
                if started.elapsed() >= round_budget {
                    break;
                }
            }
            if round > 0 {
                spent[i] += started.elapsed();
            }
        }
    }
    for (r, s) in rows.iter_mut().zip(samples) {
        r.cycles = s.len();
        if !s.is_empty() {
            let sum = Summary::of(s);
            r.p50 = Some(sum.p50);
            r.p99 = Some(sum.p99);
            r.per_sec = Some(sum.per_sec);
        } else if r.error.is_none() {
            r.error = Some("no cycle measured".into());
        }
    }
    count_leftovers(p, g, &mut rows).await;
    if let Some(proxy) = &g.fault {
        proxy.pass();
    }
    drop(clients);
    rows
}

/// The throughput scenario: `c` tasks on distinct keys for `p.throughput`.
async fn throughput_scenario(p: &Params, rt: &str, g: &Group, c: usize) -> Vec<Row> {
    let mut rows: Vec<Row> = g
        .subjects
        .iter()
        .map(|s| base_row(rt, g, s, "throughput", c))
        .collect();
    // Clients made and warmed up first, all tasks at once (pools open their connections,
    // sessions are made); then the subjects take turns, `TPUT_ROUNDS` runs each.
    let mut fleets: Vec<Option<Fleet>> = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        let fleet = async {
            let mut clients = Vec::new();
            for i in 0..c {
                if i == 0 || !s.shared {
                    clients.push(timed((s.make)(), CYCLE_TIMEOUT).await?);
                } else {
                    clients.push(Arc::clone(&clients[0]));
                }
            }
            let tag = services::unique_prefix("t");
            run_tasks(&clients, &tag, None).await?;
            Ok::<_, String>((clients, tag))
        }
        .await;
        match fleet {
            Ok(f) => fleets.push(Some(f)),
            Err(e) => {
                r.error = Some(e);
                fleets.push(None);
            }
        }
    }
    let mut totals = vec![(0usize, Duration::ZERO); fleets.len()];
    for _ in 0..TPUT_ROUNDS {
        for (i, slot) in fleets.iter_mut().enumerate() {
            let Some((clients, tag)) = slot.as_ref() else {
                continue;
            };
            let t0 = Instant::now();
            match run_tasks(clients, tag, Some(p.throughput / TPUT_ROUNDS)).await {
                Ok(n) => {
                    totals[i].0 += n;
                    totals[i].1 += t0.elapsed();
                }
                Err(e) => {
                    rows[i].error = Some(e);
                    *slot = None;
                }
            }
        }
    }
    for (r, (n, elapsed)) in rows.iter_mut().zip(totals) {
        if r.error.is_none() {
            r.cycles = n;
            r.per_sec = Some(n as f64 / elapsed.as_secs_f64());
        }
    }
    count_leftovers(p, g, &mut rows).await;
    drop(fleets);
    rows
}

/// One subject's clients in a throughput run, and the prefix of their keys.
type Fleet = (Vec<Arc<dyn Client>>, String);

/// Throughput runs per subject and task count, alternating between subjects.
const TPUT_ROUNDS: u32 = 2;

/// One task per client, each cycling on a key of its own: once (`run: None`) or until `run`
/// has passed. Returns the cycles completed.
async fn run_tasks(
    clients: &[Arc<dyn Client>],
    tag: &str,
    run: Option<Duration>,
) -> Result<usize, String> {
    let end = run.map(|d| Instant::now() + d);
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| {
            let (client, key) = (Arc::clone(client), format!("{tag}-{i}"));
            tokio::spawn(async move {
                let mut n = 0usize;
                loop {
                    timed(client.cycle(&key), CYCLE_TIMEOUT).await?;
                    n += 1;
                    if end.is_none_or(|end| Instant::now() >= end) {
                        return Ok::<usize, String>(n);
                    }
                }
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| e.to_string())??;
    }
    Ok(total)
}

/// The contention scenario: `p.clients` clients, each its own, on one key.
async fn contention_scenario(p: &Params, rt: &str, g: &Group) -> Vec<Row> {
    let mut rows: Vec<Row> = g
        .subjects
        .iter()
        .map(|s| base_row(rt, g, s, "contention", p.clients))
        .collect();
    let mut keep = Vec::new();
    for (s, r) in g.subjects.iter().zip(rows.iter_mut()) {
        let result = async {
            let mut clients = Vec::new();
            for _ in 0..p.clients {
                clients.push(timed((s.make)(), CYCLE_TIMEOUT).await?);
            }
            let key = services::unique_prefix("hot");
            // Warm-up on keys of their own: connections opened, scripts loaded.
            for (i, client) in clients.iter().enumerate() {
                timed(client.cycle(&format!("{key}-warm-{i}")), CYCLE_TIMEOUT).await?;
            }
            let end = Instant::now() + p.contention;
            let tasks: Vec<_> = clients
                .iter()
                .enumerate()
                .map(|(task, client)| {
                    let (client, key) = (Arc::clone(client), key.clone());
                    tokio::spawn(async move {
                        grants_until(task, end, || {
                            timed(client.hold(&key, WAIT, HOLD), WAIT + CYCLE_TIMEOUT)
                        })
                        .await
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.map_err(|e| e.to_string())??);
            }
            keep.push(clients);
            Ok::<_, String>(all)
        }
        .await;
        match result {
            Ok(grants) => fill_contention(r, grants),
            Err(e) => r.error = Some(e),
        }
    }
    count_leftovers(p, g, &mut rows).await;
    drop(keep);
    rows
}

fn fill_contention(r: &mut Row, grants: Vec<Grant>) {
    let c = Contention::of(grants);
    if c.overlap.is_some() {
        r.error = c.overlap;
    }
    r.grants = Some(c.grants);
    r.cycles = c.grants;
    r.longest_wait = c.longest_wait;
    if c.handoff_p50.is_some() {
        r.handoff_p50 = c.handoff_p50;
    }
    r.straight_back = Some(c.straight_back_pct);
}

/// Every chosen group on the current runtime.
async fn run_runtime(p: &Params, rt: &str, out: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    for &name in GROUPS.iter() {
        if !p.groups.is_empty() && !p.groups.iter().any(|g| g == name) {
            continue;
        }
        let started = Instant::now();
        let g = match build_group(name, out).await {
            Ok(g) => g,
            Err(e) => {
                rows.push(Row {
                    runtime: rt.to_owned(),
                    group: name.to_owned(),
                    scenario: "setup",
                    label: "(group setup)".into(),
                    error: Some(e.to_string()),
                    ..Row::default()
                });
                continue;
            }
        };
        rows.extend(cycle_scenario(p, rt, &g).await);
        if g.full {
            for &c in &p.concurrency {
                rows.extend(throughput_scenario(p, rt, &g, c).await);
            }
            rows.extend(contention_scenario(p, rt, &g).await);
        }
        eprintln!(
            "perf [{rt}] {} ({}): {:.1} s",
            g.name,
            g.title,
            started.elapsed().as_secs_f64()
        );
    }
    rows
}

/// What makes a run fail: errors, leftovers, figures that make no sense. Timings never do.
fn problems(rows: &[Row]) -> Vec<String> {
    let mut v = Vec::new();
    for r in rows {
        let what = format!(
            "[{}] {} / {} / {} (C={})",
            r.runtime, r.group, r.scenario, r.label, r.concurrency
        );
        if let Some(e) = &r.error {
            v.push(format!("{what}: {e}"));
            continue;
        }
        if let Some(n) = r.leftovers.filter(|&n| n > 0) {
            v.push(format!("{what}: left {n} lock(s) on the server(s)"));
        }
        match r.scenario {
            "cycle" => {
                if r.cycles == 0 || r.p50.is_none_or(|d| d.is_zero()) {
                    v.push(format!("{what}: no sensible latency"));
                }
                if let (Some(a), Some(b)) = (r.p50, r.p99)
                    && b < a
                {
                    v.push(format!("{what}: p99 below p50"));
                }
            }
            "throughput"
                if r.cycles == 0 || !r.per_sec.is_some_and(|x| x.is_finite() && x > 0.0) =>
            {
                v.push(format!("{what}: no cycle completed"));
            }
            "contention" if r.grants.unwrap_or(0) == 0 => {
                v.push(format!("{what}: no grant"));
            }
            _ => {}
        }
    }
    v
}

fn fmt_ms(d: Option<Duration>) -> String {
    d.map(ms).unwrap_or_else(|| "–".into())
}

fn ratio(x: Option<f64>, base: Option<f64>) -> String {
    match (x, base) {
        (Some(x), Some(b)) if b > 0.0 => format!("{:.2}×", x / b),
        _ => "–".into(),
    }
}

fn left(r: &Row) -> String {
    match (&r.error, r.leftovers) {
        (Some(e), _) => format!("**failed**: {}", e.replace('|', "/")),
        (None, Some(n)) => n.to_string(),
        (None, None) => "–".into(),
    }
}

/// The p50 (cycle) or rate (throughput) of the group's raw row and best peer.
fn baselines<'a>(
    rows: &'a [&'a Row],
    value: impl Fn(&Row) -> Option<f64>,
    lower_is_better: bool,
) -> (Option<f64>, Option<f64>) {
    let raw = rows.iter().find(|r| r.kind == "raw").and_then(|r| value(r));
    let peers = rows
        .iter()
        .filter(|r| r.kind == "peer" && r.error.is_none())
        .filter_map(|r| value(r));
    let best = if lower_is_better {
        peers.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
    } else {
        peers.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    (raw, best)
}

fn tables(rows: &[Row], rt: &str, p: &Params) -> Vec<Table> {
    let mine: Vec<&Row> = rows.iter().filter(|r| r.runtime == rt).collect();
    let mut groups: Vec<&str> = Vec::new();
    for r in &mine {
        if !groups.contains(&r.group.as_str()) {
            groups.push(&r.group);
        }
    }
    let mut cycle = Table::new(
        &format!("Uncontended acquire + release cycle ({rt} runtime)"),
        &[
            "backend",
            "implementation",
            "p50",
            "p99",
            "cycles/s",
            "p50 vs raw",
            "p50 vs best peer",
            "locks left",
        ],
    );
    let mut tput_header = vec!["backend".to_owned(), "implementation".to_owned()];
    for c in &p.concurrency {
        tput_header.push(format!("C={c} cycles/s"));
    }
    let top = p.concurrency.last().copied().unwrap_or(1);
    tput_header.push(format!("vs raw at C={top}"));
    tput_header.push(format!("vs best peer at C={top}"));
    tput_header.push("locks left".into());
    let hdr: Vec<&str> = tput_header.iter().map(String::as_str).collect();
    let mut tput = Table::new(
        &format!(
            "Throughput: C tasks on distinct keys for {:?} each ({rt} runtime)",
            p.throughput
        ),
        &hdr,
    );
    let mut cont = Table::new(
        &format!(
            "One key, {} clients contending for {:?}, each holding it {HOLD:?} ({rt} runtime)",
            p.clients, p.contention
        ),
        &[
            "backend",
            "implementation",
            "grants",
            "handoff p50",
            "longest wait",
            "taken straight back",
            "locks left",
        ],
    );
    for g in groups {
        let in_group: Vec<&Row> = mine.iter().copied().filter(|r| r.group == g).collect();
        let cyc: Vec<&Row> = in_group
            .iter()
            .copied()
            .filter(|r| r.scenario == "cycle" || r.scenario == "setup")
            .collect();
        let (raw, best) = baselines(&cyc, |r| r.p50.map(|d| d.as_secs_f64()), true);
        for r in &cyc {
            let p50 = r.p50.map(|d| d.as_secs_f64());
            cycle.row(vec![
                g.to_owned(),
                format!("{} *({})*", r.label, r.kind),
                fmt_ms(r.p50),
                fmt_ms(r.p99),
                r.per_sec.map(|x| format!("{x:.0}")).unwrap_or("–".into()),
                ratio(p50, raw),
                ratio(p50, best),
                left(r),
            ]);
        }
        let labels: Vec<&str> = in_group
            .iter()
            .filter(|r| r.scenario == "throughput")
            .map(|r| r.label.as_str())
            .fold(Vec::new(), |mut v, l| {
                if !v.contains(&l) {
                    v.push(l);
                }
                v
            });
        let at_top: Vec<&Row> = in_group
            .iter()
            .copied()
            .filter(|r| r.scenario == "throughput" && r.concurrency == top)
            .collect();
        let (raw_t, best_t) = baselines(&at_top, |r| r.per_sec, false);
        for l in labels {
            let mut cells = vec![g.to_owned(), l.to_owned()];
            let (mut failed, mut left_total) = (None::<String>, None::<u64>);
            let mut kind = "";
            let mut top_rate = None;
            for &c in &p.concurrency {
                let r = in_group
                    .iter()
                    .find(|r| r.scenario == "throughput" && r.label == l && r.concurrency == c);
                cells.push(match r {
                    Some(r) if r.error.is_none() => {
                        r.per_sec.map(|x| format!("{x:.0}")).unwrap_or("–".into())
                    }
                    Some(_) => "failed".into(),
                    None => "–".into(),
                });
                if let Some(r) = r {
                    kind = r.kind;
                    if let Some(e) = &r.error {
                        failed.get_or_insert_with(|| e.clone());
                    }
                    if let Some(n) = r.leftovers {
                        left_total = Some(left_total.unwrap_or(0) + n);
                    }
                    if c == top {
                        top_rate = r.per_sec;
                    }
                }
            }
            cells[1] = format!("{l} *({kind})*");
            cells.push(ratio(top_rate, raw_t));
            cells.push(ratio(top_rate, best_t));
            cells.push(match (failed, left_total) {
                (Some(e), _) => format!("**failed**: {}", e.replace('|', "/")),
                (None, Some(n)) => n.to_string(),
                (None, None) => "–".into(),
            });
            tput.row(cells);
        }
        for r in in_group.iter().filter(|r| r.scenario == "contention") {
            cont.row(vec![
                g.to_owned(),
                format!("{} *({})*", r.label, r.kind),
                r.grants.map(|n| n.to_string()).unwrap_or("–".into()),
                fmt_ms(r.handoff_p50),
                fmt_ms(r.longest_wait),
                r.straight_back
                    .map(|x| format!("{x:.0}%"))
                    .unwrap_or("–".into()),
                left(r),
            ]);
        }
    }
    cycle.note(
        "Ratios are against the group's raw protocol cycle and its fastest peer, measured in the \
         same run with the implementations taking turns. *locks left*: lock keys (or advisory \
         locks, or etcd keys and leases) the scenario added on the servers, counted right \
         after it while its clients were still connected (and, when that finds any, once \
         more a second later, so a release still on the wire does not count)."
            .to_owned(),
    );
    tput.note(
        "Shared clients (a `Locker`, a multiplexed connection, a peer's pool) serve all C tasks; \
         our PostgreSQL backend opens a session per held lock. Each figure is two runs that \
         alternate with the other implementations of the row's backend; *locks left* sums \
         over the task counts."
            .to_owned(),
    );
    cont.note(
        "Each contender has its own client, as separate processes would. Handoff: from a \
         release to the next grant to a *different* client. Longest wait: the fairness figure. \
         \"Taken straight back\": grants that went to the client that had just released."
            .to_owned(),
    );
    let mut v = vec![cycle];
    if !tput.rows.is_empty() {
        v.push(tput);
    }
    if !cont.rows.is_empty() {
        v.push(cont);
    }
    v
}

fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "runtime,group,scenario,implementation,kind,concurrency,cycles,p50_ms,p99_ms,per_sec,grants,handoff_p50_ms,longest_wait_ms,straight_back_pct,leftovers,error\n",
    );
    let q = |x: &str| format!("\"{}\"", x.replace('"', "\"\""));
    let d = |x: Option<Duration>| {
        x.map(|d| format!("{:.4}", d.as_secs_f64() * 1e3))
            .unwrap_or_default()
    };
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            q(&r.runtime),
            q(&r.group),
            r.scenario,
            q(&r.label),
            r.kind,
            r.concurrency,
            r.cycles,
            d(r.p50),
            d(r.p99),
            r.per_sec.map(|x| format!("{x:.1}")).unwrap_or_default(),
            r.grants.map(|x| x.to_string()).unwrap_or_default(),
            d(r.handoff_p50),
            d(r.longest_wait),
            r.straight_back
                .map(|x| format!("{x:.1}"))
                .unwrap_or_default(),
            r.leftovers.map(|x| x.to_string()).unwrap_or_default(),
            q(r.error.as_deref().unwrap_or("")),
        );
    }
    s
}

/// `leasehold-bench perf`: runs, prints Markdown, writes `perf.md`, `perf.csv` and the SVG
/// charts to the output folder; fails when [`problems`] finds any.
pub(crate) fn main(cli: &Cli, p: Params) -> Result<(), BoxError> {
    for g in &p.groups {
        if !GROUPS.contains(&g.as_str()) {
            return Err(format!("unknown group {g:?}; expected some of {GROUPS:?}").into());
        }
    }
    let started = std::time::Instant::now();
    std::fs::create_dir_all(&cli.out)?;
    let mut rows = Vec::new();
    let flavours = runtimes(cli.runtime);
    for &flavour in &flavours {
        let rt = runtime(flavour)?;
        rows.extend(rt.block_on(run_runtime(&p, flavour, &cli.out)));
        // Background releases and the extra Redis nodes end with the runtime.
        rt.shutdown_timeout(Duration::from_secs(2));
    }
    let mut md = format!(
        "## leasehold-bench perf{}\n\n",
        if p.quick { " --quick" } else { "" }
    );
    for &flavour in &flavours {
        for t in tables(&rows, flavour, &p) {
            let text = t.markdown();
            println!("{text}");
            md.push_str(&text);
            md.push('\n');
        }
    }
    let md_path = cli.out.join("perf.md");
    let csv_path = cli.out.join("perf.csv");
    std::fs::write(&md_path, &md)?;
    std::fs::write(&csv_path, csv(&rows))?;
    let charts = charts::draw(&cli.out, &rows, &flavours).map_err(|e| e.to_string())?;
    eprintln!(
        "wrote {}, {} and {} chart(s) in {:.0} s",
        md_path.display(),
        csv_path.display(),
        charts,
        started.elapsed().as_secs_f64()
    );
    let problems = problems(&rows);
    if problems.is_empty() {
        eprintln!("perf: every implementation ran, no lock was left behind");
        Ok(())
    } else {
        for x in &problems {
            eprintln!("perf: FAILED {x}");
        }
        Err(format!("{} problem(s), listed above", problems.len()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(task: usize, at: Instant, got_ms: u64, held_ms: u64) -> Grant {
        let got = at + Duration::from_millis(got_ms);
        Grant {
            task,
            asked: at,
            got,
            freed: got + Duration::from_millis(held_ms),
        }
    }

    #[test]
    fn contention_figures_from_grants() {
        let t0 = Instant::now();
        let mut r = Row::default();
        // Task 0 holds 0–1 ms, task 0 again 2–3 ms, task 1 from 5 ms (asked at 0).
        fill_contention(
            &mut r,
            vec![grant(1, t0, 5, 1), grant(0, t0, 0, 1), grant(0, t0, 2, 1)],
        );
        assert_eq!(r.error, None);
        assert_eq!(r.grants, Some(3));
        assert_eq!(r.longest_wait, Some(Duration::from_millis(5)));
        assert_eq!(r.handoff_p50, Some(Duration::from_millis(2)));
        assert_eq!(r.straight_back.map(|x| x.round()), Some(50.0));
    }

    #[test]
    fn overlapping_grants_are_an_error() {
        let t0 = Instant::now();
        let mut r = Row::default();
        fill_contention(&mut r, vec![grant(0, t0, 0, 5), grant(1, t0, 3, 1)]);
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("two holders at once")),
            "{:?}",
            r.error
        );
        assert!(
            !problems(&[Row {
                scenario: "contention",
                ..r
            }])
            .is_empty()
        );
    }

    fn cycle_row(label: &str, kind: &'static str, p50_ms: u64) -> Row {
        Row {
            runtime: "rt".into(),
            group: "g".into(),
            scenario: "cycle",
            label: label.into(),
            kind,
            concurrency: 1,
            cycles: 10,
            p50: Some(Duration::from_millis(p50_ms)),
            p99: Some(Duration::from_millis(p50_ms * 2)),
            per_sec: Some(1000.0 / p50_ms as f64),
            leftovers: Some(0),
            ..Row::default()
        }
    }

    #[test]
    fn problems_flag_errors_leftovers_and_nonsense_but_not_timings() {
        let clean = cycle_row("ours", "ours", 3);
        assert!(problems(std::slice::from_ref(&clean)).is_empty());
        let slow = cycle_row("ours", "ours", 30_000);
        assert!(problems(&[slow]).is_empty(), "timings never fail a run");
        let leaky = Row {
            leftovers: Some(2),
            ..clean.clone()
        };
        assert!(problems(&[leaky])[0].contains("left 2 lock(s)"));
        let failed = Row {
            error: Some("boom".into()),
            ..clean.clone()
        };
        assert!(problems(&[failed])[0].ends_with("boom"));
        let empty = Row {
            cycles: 0,
            p50: None,
            ..clean.clone()
        };
        assert!(problems(&[empty])[0].contains("no sensible latency"));
        let idle = Row {
            scenario: "throughput",
            cycles: 0,
            per_sec: Some(0.0),
            ..clean
        };
        assert!(problems(&[idle])[0].contains("no cycle completed"));
    }

    #[test]
    fn ratios_are_against_raw_and_the_fastest_peer() {
        let rows = vec![
            cycle_row("ours", "ours", 6),
            cycle_row("raw", "raw", 4),
            cycle_row("slow peer", "peer", 12),
            cycle_row("fast peer", "peer", 3),
        ];
        let p = Params::quick(Vec::new());
        let t = tables(&rows, "rt", &p);
        let ours = &t[0].rows[0];
        assert_eq!(ours[5], "1.50×", "{ours:?}");
        assert_eq!(ours[6], "2.00×", "{ours:?}");
        let md = t[0].markdown();
        assert!(md.contains("| g | fast peer *(peer)* |"), "{md}");
    }

    #[test]
    fn csv_quotes_text_fields() {
        let r = Row {
            error: Some("said \"no\", twice".into()),
            ..cycle_row("a, b", "peer", 1)
        };
        let text = csv(&[r]);
        let line = text.lines().nth(1).unwrap_or_default();
        assert!(line.contains("\"a, b\""), "{line}");
        assert!(line.ends_with("\"said \"\"no\"\", twice\""), "{line}");
    }
}
