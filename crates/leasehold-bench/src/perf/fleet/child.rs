//! One fleet measurement, in a process of its own (`leasehold-bench __fleet`), so that its CPU
//! time, resident memory and connections are those of one backend holding N leases and
//! nothing else: connect, take N leases, hold them, release them in one burst, count what is
//! left, and print one [`Measured`] line.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold_core::{Lease, LockBackend, Locker};
use leasehold_etcd::{EtcdBackend, EtcdConfig};
use leasehold_postgres::PostgresBackend;
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::services::{self, Service};
use tokio::time::Instant;

use super::probe::{self, NodeCount, Probe};
use super::{FLEET_TTL, Measured, Spec};
use crate::harness::BoxError;
use crate::perf::groups::pg_config;
use crate::subjects::Count;

/// Acquisitions in flight at once while taking the N leases.
pub(super) const IN_FLIGHT: usize = 64;
/// The wait budget of each acquisition: a transient fault (a Redlock node slower than its
/// per-node timeout, a PostgreSQL grant that came after its validity) is retried within it.
pub(super) const ACQUIRE_BUDGET: Duration = Duration::from_secs(30);

/// Redlock's per-node timeout here: the default for a 3 s TTL (TTL / 200 = 15 ms) fails most
/// of 64 concurrent acquisitions on a loaded machine, each failed attempt leaving keys on the
/// nodes that answered late (released in the background) that make the retries fail too;
/// 50 ms is the top of the default's range.
pub(super) const REDLOCK_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// A backend under measurement, with what watches it.
struct Setup {
    backend: Arc<dyn LockBackend>,
    probe: Probe,
    count: Count,
    /// The server ports its connections go to.
    ports: Vec<u16>,
    /// PostgreSQL's session bound (`max_sessions`).
    bound: Option<u64>,
}

pub(super) fn ports(service: Service) -> Result<Vec<u16>, BoxError> {
    Ok(services::lookup(service)?
        .addrs()
        .iter()
        .map(std::net::SocketAddr::port)
        .collect())
}

/// Connects the probe, then the backend (so the probe's own connections are in the baseline
/// of [`probe::connections_to`]); returns the baseline too.
async fn setup(backend: &str, prefix: &str, quick: bool) -> Result<(Setup, usize), BoxError> {
    let redis_count = |urls: &[String]| Count::Redis {
        urls: urls.to_vec(),
        needle: prefix.to_owned(),
    };
    let service = match backend {
        "redis" => Service::Redis,
        "redlock5" => Service::Redlock,
        "redis-cluster" => Service::RedisCluster,
        "postgres" => Service::Postgres,
        "etcd" => Service::Etcd,
        other => return Err(format!("no fleet backend {other:?}").into()),
    };
    let ep = services::lookup(service)?;
    let urls = ep.urls().to_vec();
    let ports = ports(service)?;
    let (probe, count) = match service {
        Service::Postgres => {
            let app = services::unique_prefix("fleet");
            (
                Probe::postgres(ep.url(), &app).await?,
                Count::Postgres {
                    conninfo: ep.url().to_owned(),
                    app,
                },
            )
        }
        Service::Etcd => (
            Probe::etcd(&urls),
            Count::Etcd {
                endpoints: urls.clone(),
                prefix: prefix.to_owned(),
                leases: None,
            },
        ),
        _ => (Probe::redis(&urls).await?, redis_count(&urls)),
    };
    let base = probe::connections_to(&ports)?;
    let mut bound = None;
    let backend: Arc<dyn LockBackend> = match service {
        Service::Redis => Arc::new(
            RedisBackend::connect(RedisConfig::from_url(ep.url())?.with_prefix(prefix)?).await?,
        ),
        Service::RedisCluster => Arc::new(
            RedisBackend::connect(RedisConfig::cluster(&urls)?.with_prefix(prefix)?).await?,
        ),
        Service::Redlock => Arc::new(RedlockBackend::new(
            RedlockConfig::from_urls(&urls)?
                .with_prefix(prefix)?
                .with_node_timeout(REDLOCK_NODE_TIMEOUT),
        )?),
        Service::Postgres => {
            let Count::Postgres { app, .. } = &count else {
                unreachable!("set above")
            };
            let cfg = pg_config(ep.url(), prefix.to_owned(), app.clone(), quick)?;
            bound = Some(u64::try_from(cfg.max_sessions())?);
            Arc::new(PostgresBackend::connect(cfg).await?)
        }
        _ => Arc::new(
            EtcdBackend::connect(EtcdConfig::new(urls.clone()).with_prefix(prefix)?).await?,
        ),
    };
    let s = Setup {
        backend,
        probe,
        count,
        ports,
        bound,
    };
    Ok((s, base))
}

/// Takes `n` leases, [`IN_FLIGHT`] at a time, each within [`ACQUIRE_BUDGET`]; an error if
/// any was refused.
async fn acquire_all(locker: &Locker, n: usize) -> Result<Vec<Lease>, BoxError> {
    // The leases go straight into their vector as they come: a vector of N results first
    // (each the size of an error) would be the bench's own memory, counted per lease.
    let mut results = futures_util::stream::iter(0..n)
        .map(|i| locker.acquire(format!("lease-{i}"), ACQUIRE_BUDGET))
        .buffer_unordered(IN_FLIGHT);
    let mut leases = Vec::with_capacity(n);
    let mut refused = 0usize;
    let mut first_error = None;
    while let Some(r) = results.next().await {
        match r {
            Ok(l) => leases.push(l),
            Err(e) => {
                refused += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    if refused > 0 {
        let why = first_error.map(|e| e.to_string()).unwrap_or_default();
        return Err(format!("{refused} of {n} acquisitions failed (first: {why})").into());
    }
    Ok(leases)
}

/// Per node, what it counted between `a` and `b`.
fn deltas(a: &[NodeCount], b: &[NodeCount]) -> Vec<NodeCount> {
    a.iter()
        .zip(b)
        .map(|(a, b)| NodeCount {
            scripts: b.scripts.saturating_sub(a.scripts),
            requests: b.requests.saturating_sub(a.requests),
        })
        .collect()
}

/// What the hold window showed of this process and of the servers.
pub(super) struct Observed {
    window: Duration,
    /// Client CPU time over the window, as a share of one core.
    cpu_share: f64,
    /// This process's connections to the servers, the most seen.
    connections: usize,
    /// PostgreSQL's sessions of the backend, the most seen.
    sessions: Option<u64>,
    /// Per node, what it counted over the window.
    counts: Vec<NodeCount>,
}

impl Observed {
    /// Writes the window's figures into `m`; `base`: the connections open before the backend.
    pub(super) fn fill(&self, m: &mut Measured, base: usize) {
        m.hold = self.window;
        m.cpu_pct = 100.0 * self.cpu_share;
        m.pg_sessions = self.sessions;
        m.connections = self.connections.saturating_sub(base);
        let periods = self.window.as_secs_f64() / (FLEET_TTL / 3).as_secs_f64();
        let per =
            |f: fn(&NodeCount) -> u64| self.counts.iter().map(f).max().map(|x| x as f64 / periods);
        m.nodes = self.counts.len();
        m.scripts_per_period = per(|c| c.scripts);
        m.requests_per_period = per(|c| c.requests);
    }
}

/// Watches the hold window of `hold`: the servers' counters, CPU time (the probe's own reads
/// of `/proc` taken out: they are not the client's work), connections and sessions.
pub(super) async fn observe(
    probe: &mut Probe,
    ports: &[u16],
    hold: Duration,
) -> Result<Observed, BoxError> {
    let c0 = probe.counts().await?;
    let cpu0 = probe::cpu_time()?;
    let h0 = Instant::now();
    let mut probe_cpu = Duration::ZERO;
    let mut connections = probe::connections_counted(ports, &mut probe_cpu)?;
    let mut sessions = probe.sessions().await?;
    for _ in 0..2 {
        tokio::time::sleep(hold / 2).await;
        connections = connections.max(probe::connections_counted(ports, &mut probe_cpu)?);
        sessions = sessions.max(probe.sessions().await?);
    }
    let cpu = probe::cpu_time()?
        .saturating_sub(cpu0)
        .saturating_sub(probe_cpu);
    let window = h0.elapsed();
    let c1 = probe.counts().await?;
    Ok(Observed {
        window,
        cpu_share: cpu.as_secs_f64() / window.as_secs_f64(),
        connections,
        sessions,
        counts: deltas(&c0, &c1),
    })
}

/// Runs the measurement of `spec` (on the current runtime).
pub(super) async fn measure(spec: &Spec) -> Result<Measured, BoxError> {
    let prefix = format!("{}:", services::unique_prefix("fleet"));
    let (mut s, base) = setup(&spec.backend, &prefix, spec.quick).await?;
    let locker = Locker::from_arc(Arc::clone(&s.backend)).with_ttl(FLEET_TTL)?;
    // Warm-up: connections open, scripts loaded, a session in the pool.
    locker
        .acquire("warm-up", ACQUIRE_BUDGET)
        .await?
        .release()
        .await?;
    let mut m = Measured {
        pg_bound: s.bound,
        ..Measured::default()
    };
    let rss0 = probe::rss_bytes()?;
    let t0 = Instant::now();
    let leases = acquire_all(&locker, spec.n).await?;
    m.acquire = t0.elapsed();

    let o = observe(&mut s.probe, &s.ports, spec.hold).await?;
    let rss1 = probe::rss_bytes()?;
    o.fill(&mut m, base);
    m.rss_per_lease = rss1.saturating_sub(rss0) as f64 / spec.n.max(1) as f64;
    m.lost = leases.iter().filter(|l| l.is_lost()).count();
    if let Some(why) = leases.iter().find_map(Lease::loss_reason) {
        eprintln!(
            "fleet {} N={}: {} lease(s) lost, the first because {why}",
            spec.backend, spec.n, m.lost
        );
    }

    // The burst release, then what is left at once and after the settle time.
    let peak = probe::Peak::start()?;
    let t1 = Instant::now();
    let released = futures_util::future::join_all(leases.iter().map(Lease::release)).await;
    m.release = t1.elapsed();
    m.release_peak_per_lease = peak.per_lease(spec.n)?;
    m.release_errors = released.iter().filter(|r| r.is_err()).count();
    drop(leases);
    m.left_at_once = s.count.leftovers().await?.unwrap_or(0);
    // The backend lives on meanwhile: a lock its session still carries must show.
    tokio::time::sleep(spec.settle).await;
    m.left_later = s.count.leftovers().await?.unwrap_or(0);
    drop(locker);
    drop(s);
    Ok(m)
}
