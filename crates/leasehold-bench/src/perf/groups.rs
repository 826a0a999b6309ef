//! The groups of `leasehold-bench perf` that compare subjects: one backend on one deployment,
//! the implementations compared on it (ours, the raw protocol cycle, the peers), and what must
//! live while they run (fault proxies, extra Redis nodes, a lock folder).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, MemoryBackend};
use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use leasehold_postgres::{PostgresBackend, PostgresConfig};
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::proxy::{FaultProxy, Mode};
use leasehold_test_support::services::{self, Service};
use tokio::time::Instant;

use crate::file_backend::{FileBackend, FileConfig};
use crate::harness::BoxError;
#[cfg(feature = "peers")]
use crate::subjects::peers;
use crate::subjects::raw::{RawEtcd, RawPg, RawRedis};
use crate::subjects::{Client, Count, Kind, Ours, Subject, make};

/// Delay added each way to the slowed Redlock node.
const SLOW: Duration = Duration::from_millis(20);
/// Per-node timeout of the raw Redlock fan-out (leasehold's default for a 30 s TTL).
const RAW_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// How long the Redis fair queue lets a woken waiter take the lock before the next.
const FAIR_GRACE: Duration = Duration::from_secs(2);
/// The PostgreSQL health timeout under `--quick` (default: 500 ms). The smoke test runs on
/// loaded CI machines, where one statement or health check can take longer than the default
/// validity window of 750 ms (it did once, in the throughput scenario): the lease is then
/// lost on arrival, correctly, and `--quick` would fail on a timing (so did a health check in
/// the fleet group once: a session's 110 leases reported lost). The full run keeps the default
/// that users get. 2.5 s: the window (250 ms + this, 2.75 s) stays under the fleet's 3 s TTL
/// (the backend refuses a TTL shorter than its window).
const QUICK_PG_HEALTH_TIMEOUT: Duration = Duration::from_millis(2_500);

/// A group: one backend on one deployment, the implementations compared on it, and what
/// must live while it runs (fault proxies, extra Redis nodes).
pub(super) struct Group {
    pub(super) title: String,
    /// Scenarios beyond the cycle.
    pub(super) full: bool,
    pub(super) subjects: Vec<Subject>,
    /// Turns the fault on (after the clients connected through the proxy).
    pub(super) fault: Option<(Arc<FaultProxy>, Mode)>,
    /// What each subject's last count found, so a scenario is charged only with what it
    /// added (keys left earlier live on until their TTL).
    pub(super) counted: std::sync::Mutex<Vec<u64>>,
    _keep: Vec<Box<dyn std::any::Any + Send>>,
}

/// The names one subject's locks and sessions go by on the servers.
#[derive(Clone)]
pub(super) struct Tag {
    /// Prefix of its keys.
    pub(super) prefix: String,
    /// `application_name` of its PostgreSQL sessions.
    pub(super) app: String,
}

/// A subject whose clients `connect` makes, and whose leftovers `count` says how to count,
/// each given the subject's own [`Tag`] (`what` starts its prefix).
pub(super) fn subject<F, Fut, C>(
    label: impl Into<String>,
    kind: Kind,
    what: &str,
    count: impl FnOnce(&Tag) -> Count,
    connect: F,
) -> Subject
where
    F: Fn(Tag) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<C, BoxError>> + Send + 'static,
    C: Client + 'static,
{
    let tag = Tag {
        prefix: format!("{}:", services::unique_prefix(what)),
        app: services::unique_prefix("perf"),
    };
    let count = count(&tag);
    Subject::new(label, kind, true, make(move || connect(tag.clone())), count)
}

/// Ours on Redis: one node (with the fair queue if `fair`), or Redlock over several.
async fn ours_redis(urls: Vec<String>, prefix: String, fair: bool) -> Result<Ours, BoxError> {
    Ours::new(redis_backend(urls, prefix, fair).await?)
}

/// Our Redis backend: one node (with the fair queue if `fair`), or Redlock over several.
pub(super) async fn redis_backend(
    urls: Vec<String>,
    prefix: String,
    fair: bool,
) -> Result<Arc<dyn LockBackend>, BoxError> {
    Ok(match &urls[..] {
        [url] => {
            let cfg = RedisConfig::from_url(url)?.with_prefix(prefix)?;
            let cfg = if fair {
                cfg.with_fair_queue(FAIR_GRACE)?
            } else {
                cfg
            };
            Arc::new(RedisBackend::connect(cfg).await?)
        }
        _ => Arc::new(RedlockBackend::new(
            RedlockConfig::from_urls(urls)?.with_prefix(prefix)?,
        )?),
    })
}

/// Redis through Sentinel (the topology of `scripts/services`): ours, without and with the
/// replica-sync check (`WAIT` for both replicas after each grant, on a connection of its own).
async fn sentinel_subjects() -> Result<Vec<Subject>, BoxError> {
    let sentinels = urls(Service::RedisSentinel)?;
    let url = format!("redis+sentinel://{}/leasehold", sentinels.join(","));
    let first = sentinels.first().ok_or("no sentinel")?;
    let mut c = redis::Client::open(format!("redis://{first}"))?
        .get_multiplexed_async_connection()
        .await?;
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg("leasehold")
        .query_async(&mut c)
        .await?;
    let master = vec![format!("redis://{host}:{port}")];
    let count = |t: &Tag| Count::Redis {
        urls: master.clone(),
        needle: t.prefix.clone(),
    };
    let synced = format!("{url}?replica_sync=2");
    Ok(vec![
        subject(
            "leasehold RedisBackend via Sentinel",
            Kind::Ours,
            "perf-sentinel",
            count,
            move |t| ours_redis(vec![url.clone()], t.prefix, false),
        ),
        subject(
            "leasehold RedisBackend via Sentinel, replica sync (WAIT 2)",
            Kind::Ours,
            "perf-sentinel-wait",
            count,
            move |t| ours_redis(vec![synced.clone()], t.prefix, false),
        ),
    ])
}

/// Redis (one node) or Redlock (several): ours, raw, and the peers. `count_urls` are the
/// nodes reached directly (not through a proxy) for counting leftovers.
fn redis_subjects(urls: &[String], count_urls: &[String]) -> Vec<Subject> {
    let single = urls.len() == 1;
    let count = |t: &Tag| Count::Redis {
        urls: count_urls.to_vec(),
        needle: t.prefix.clone(),
    };
    let (ours, raw) = if single {
        ("leasehold RedisBackend", "raw redis-rs SET NX PX + EVALSHA")
    } else {
        (
            "leasehold RedlockBackend",
            "raw concurrent fan-out (50 ms per node)",
        )
    };
    let (u, u2, u3) = (urls.to_vec(), urls.to_vec(), urls.to_vec());
    let mut v = vec![
        subject(ours, Kind::Ours, "perf-ours", count, move |t| {
            ours_redis(u.clone(), t.prefix, false)
        }),
        subject(raw, Kind::Raw, "perf-raw", count, move |t| {
            RawRedis::connect(u2.clone(), t.prefix, RAW_NODE_TIMEOUT)
        }),
    ];
    if single {
        let fair = "leasehold RedisBackend, fair queue";
        v.push(subject(fair, Kind::Ours, "perf-fair", count, move |t| {
            ours_redis(u3.clone(), t.prefix, true)
        }));
    }
    #[cfg(feature = "peers")]
    {
        let (u, u2) = (urls.to_vec(), urls.to_vec());
        v.push(subject(
            "rslock 0.10",
            Kind::Peer,
            "perf-rslock",
            count,
            move |t| std::future::ready(Ok(peers::Rslock::new(&u, t.prefix))),
        ));
        let dl = "distributed-lock-redis 0.2";
        v.push(subject(dl, Kind::Peer, "perf-dlredis", count, move |t| {
            peers::DlRedis::connect(u2.clone(), t.prefix)
        }));
    }
    v
}

/// Ours on PostgreSQL, its sessions named after the subject.
async fn ours_pg(conninfo: String, t: Tag, quick: bool) -> Result<Ours, BoxError> {
    Ours::new(pg_backend(&conninfo, t.prefix, t.app, quick).await?)
}

/// Our PostgreSQL backend, its keys under `prefix`, its sessions named `app`; `quick`: with
/// the health timeout of `--quick` ([`QUICK_PG_HEALTH_TIMEOUT`]).
pub(super) async fn pg_backend(
    conninfo: &str,
    prefix: String,
    app: String,
    quick: bool,
) -> Result<Arc<dyn LockBackend>, BoxError> {
    let cfg = pg_config(conninfo, prefix, app, quick)?;
    Ok(Arc::new(PostgresBackend::connect(cfg).await?))
}

/// The configuration of [`pg_backend`] (the fleet group's child builds from it too).
pub(super) fn pg_config(
    conninfo: &str,
    prefix: String,
    app: String,
    quick: bool,
) -> Result<PostgresConfig, BoxError> {
    let cfg = PostgresConfig::from_url(conninfo)?
        .with_prefix(prefix)?
        .with_application_name(app);
    if !quick {
        return Ok(cfg);
    }
    let interval = cfg.health_interval();
    Ok(cfg.with_health(interval, QUICK_PG_HEALTH_TIMEOUT)?)
}

async fn raw_pg(conninfo: String, t: Tag) -> Result<RawPg, BoxError> {
    RawPg::connect(&conninfo, &t.app, t.prefix).await
}

#[cfg(feature = "peers")]
async fn sqlx_pg(conninfo: String, t: Tag) -> Result<peers::SqlxAdvisory, BoxError> {
    peers::SqlxAdvisory::connect(&conninfo, &t.app, t.prefix).await
}

#[cfg(feature = "peers")]
async fn dl_pg(conninfo: String, t: Tag) -> Result<peers::DlPostgres, BoxError> {
    let url = peers::sqlx08_url(&conninfo, &t.app)?;
    peers::DlPostgres::connect(&url, t.prefix).await
}

fn postgres_subjects(conninfo: &str, quick: bool) -> Vec<Subject> {
    let count = |t: &Tag| Count::Postgres {
        conninfo: conninfo.to_owned(),
        app: t.app.clone(),
    };
    let (c, c2) = (conninfo.to_owned(), conninfo.to_owned());
    let ours = "leasehold PostgresBackend (shared sessions, max_sessions = 10)";
    let raw =
        "raw prepared pg_try_advisory_lock + unlock (one connection; waits in the server queue)";
    #[cfg_attr(not(feature = "peers"), allow(unused_mut))]
    let mut v = vec![
        subject(ours, Kind::Ours, "perf-ours", count, move |t| {
            ours_pg(c.clone(), t, quick)
        }),
        subject(raw, Kind::Raw, "perf-raw", count, move |t| {
            raw_pg(c2.clone(), t)
        }),
    ];
    #[cfg(feature = "peers")]
    {
        let (c, c2) = (conninfo.to_owned(), conninfo.to_owned());
        let sqlx = format!("sqlx 0.9 PgAdvisoryLock (pool of {})", peers::POOL);
        let dl = format!("distributed-lock-postgres 0.2 (pool of {})", peers::POOL);
        v.push(subject(sqlx, Kind::Peer, "perf-sqlx", count, move |t| {
            sqlx_pg(c.clone(), t)
        }));
        v.push(subject(dl, Kind::Peer, "perf-dlpg", count, move |t| {
            dl_pg(c2.clone(), t)
        }));
    }
    v
}

/// Ours on etcd, with its lease mode.
async fn ours_etcd(
    endpoints: Vec<String>,
    prefix: String,
    mode: LeaseMode,
) -> Result<Ours, BoxError> {
    let cfg = EtcdConfig::new(endpoints)
        .with_prefix(prefix)?
        .with_lease_mode(mode);
    Ours::new(etcd_backend(cfg).await?)
}

/// Our etcd backend on `cfg`.
pub(super) async fn etcd_backend(cfg: EtcdConfig) -> Result<Arc<dyn LockBackend>, BoxError> {
    Ok(Arc::new(EtcdBackend::connect(cfg).await?))
}

fn etcd_subjects(endpoints: &[String]) -> Vec<Subject> {
    let count = |t: &Tag| Count::Etcd {
        endpoints: endpoints.to_vec(),
        prefix: t.prefix.clone(),
        leases: None,
    };
    let leases = Arc::new(std::sync::Mutex::new(Vec::new()));
    let l = Arc::clone(&leases);
    let count_leases = |t: &Tag| Count::Etcd {
        endpoints: endpoints.to_vec(),
        prefix: t.prefix.clone(),
        leases: Some(leases),
    };
    let (e, e2, e3, e4) = (
        endpoints.to_vec(),
        endpoints.to_vec(),
        endpoints.to_vec(),
        endpoints.to_vec(),
    );
    let session = "leasehold EtcdBackend (session lease)";
    let per_lock = "leasehold EtcdBackend (a lease per lock)";
    let raw = "raw Lock + Unlock RPCs on one kept lease";
    let raw_per_lock = "etcd-client 0.21 Lock, a lease per lock";
    vec![
        subject(session, Kind::Ours, "perf-ours", count, move |t| {
            ours_etcd(e.clone(), t.prefix, LeaseMode::Session)
        }),
        subject(per_lock, Kind::Ours, "perf-ours-lpl", count, move |t| {
            ours_etcd(e2.clone(), t.prefix, LeaseMode::PerLock)
        }),
        subject(raw, Kind::Raw, "perf-raw", count, move |t| {
            RawEtcd::connect(e3.clone(), t.prefix)
        }),
        subject(
            raw_per_lock,
            Kind::Peer,
            "perf-lpl",
            count_leases,
            move |t| RawEtcd::lease_per_lock(e4.clone(), t.prefix, Arc::clone(&l)),
        ),
    ]
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
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn memory_subjects() -> Vec<Subject> {
    let backend = Arc::new(MemoryBackend::new());
    let b: Arc<dyn LockBackend> = backend.clone();
    let make = make(move || std::future::ready(Ours::new(Arc::clone(&b))));
    let count = Count::Local(Box::new(move || backend.held_count()));
    vec![Subject::new(
        "leasehold MemoryBackend",
        Kind::Ours,
        true,
        make,
        count,
    )]
}

/// File backends on the lock folder `dir`, a backend per client (as separate processes would
/// have): what opens one, and the count of what all of them hold.
pub(super) fn file_backends(
    dir: PathBuf,
) -> (
    impl Fn() -> Result<Arc<dyn LockBackend>, BoxError> + Send + Sync + 'static,
    Count,
) {
    let made: Arc<std::sync::Mutex<Vec<Arc<FileBackend>>>> = Arc::default();
    let m = Arc::clone(&made);
    let open = move || -> Result<Arc<dyn LockBackend>, BoxError> {
        let b = Arc::new(FileBackend::new(FileConfig::new(dir.clone()))?);
        if let Ok(mut v) = m.lock() {
            v.push(Arc::clone(&b));
        }
        Ok(b)
    };
    let held = move || {
        let all = made.lock();
        all.map(|v| v.iter().map(|b| b.held_count()).sum())
            .unwrap_or(usize::MAX)
    };
    (open, Count::Local(Box::new(held)))
}

/// The file backend on a lock folder under `dir`, a backend per client, each kept to count
/// what it holds.
fn file_subjects(dir: PathBuf) -> Vec<Subject> {
    let (open, count) = file_backends(dir);
    let label = "leasehold FileBackend (a backend per client)";
    let make = make(move || std::future::ready(open().and_then(Ours::new)));
    vec![Subject::new(label, Kind::Ours, false, make, count)]
}

/// The URLs of a service of `scripts/services`.
pub(super) fn urls(service: Service) -> Result<Vec<String>, BoxError> {
    Ok(services::lookup(service)?.urls().to_vec())
}

/// Redlock on the first `n` nodes, or on the five and `n - 5` the bench starts (kept in `g`).
async fn redlock_nodes(g: &mut Group, n: usize) -> Result<Vec<String>, BoxError> {
    let mut urls: Vec<String> = urls(Service::Redlock)?.into_iter().take(n).collect();
    while urls.len() < n && n > 5 {
        let extra = ExtraRedis::start().await?;
        urls.push(extra.url.clone());
        g._keep.push(Box::new(extra));
    }
    if urls.len() < n {
        return Err(format!("only {} Redlock nodes", urls.len()).into());
    }
    Ok(urls)
}

/// Five Redlock nodes, the fifth behind a fault proxy that black-holes it or slows it (kept in
/// `g`, turned on once the clients connected).
async fn faulty_redlock(g: &mut Group, mode: Mode) -> Result<Vec<Subject>, BoxError> {
    let direct = urls(Service::Redlock)?;
    let last = direct.len().checked_sub(1).ok_or("no Redlock nodes")?;
    let addr = *services::lookup(Service::Redlock)?
        .addrs()
        .get(last)
        .ok_or("no address for the last Redlock node")?;
    let proxy = Arc::new(FaultProxy::start(addr).await?);
    let mut via = direct.clone();
    via[last] = format!("redis://{}", proxy.addr());
    g.fault = Some((proxy, mode));
    Ok(redis_subjects(&via, &direct))
}

impl Group {
    pub(super) fn new(full: bool) -> Self {
        Self {
            title: String::new(),
            full,
            subjects: Vec::new(),
            fault: None,
            counted: std::sync::Mutex::default(),
            _keep: Vec::new(),
        }
    }

    /// A lock folder under `out`, removed with the group.
    pub(super) fn lock_dir(&mut self, out: &Path) -> Result<PathBuf, BoxError> {
        let dir = out.join(format!("file-locks-{}", services::unique_prefix("perf")));
        std::fs::create_dir_all(&dir)?;
        self._keep.push(Box::new(RemoveDir(dir.clone())));
        Ok(dir)
    }
}

/// Sets group `name` up (`out`: where the file backend's lock folder goes; `quick`: the
/// `--quick` settings).
pub(super) async fn build_group(
    name: &'static str,
    out: &Path,
    quick: bool,
) -> Result<Group, BoxError> {
    let mut g = Group::new(
        matches!(name, "memory" | "file" | "redis" | "redlock5")
            || name.starts_with("postgres")
            || name.starts_with("etcd"),
    );
    let (title, subjects) = match name {
        "memory" => ("memory (in process)".to_owned(), memory_subjects()),
        "file" => (
            "file (flock, local disk)".to_owned(),
            file_subjects(g.lock_dir(out)?),
        ),
        "redis" => {
            let url = urls(Service::Redis)?;
            ("redis (single node)".to_owned(), redis_subjects(&url, &url))
        }
        "redis-sentinel" => (
            "redis through Sentinel (master + 2 replicas)".to_owned(),
            sentinel_subjects().await?,
        ),
        "redlock3" | "redlock5" | "redlock7" => {
            let n = if name == "redlock3" {
                3
            } else if name == "redlock5" {
                5
            } else {
                7
            };
            let urls = redlock_nodes(&mut g, n).await?;
            let title = if n > 5 {
                "redlock, 7 nodes (5 + 2 started by the bench)".to_owned()
            } else {
                format!("redlock, {n} nodes")
            };
            (title, redis_subjects(&urls, &urls))
        }
        "redlock5-blackhole" => (
            "redlock, 5 nodes, one black-holed".to_owned(),
            faulty_redlock(&mut g, Mode::Blackhole).await?,
        ),
        "redlock5-slow" => (
            format!("redlock, 5 nodes, one slowed by {SLOW:?} each way"),
            faulty_redlock(&mut g, Mode::Latency(SLOW)).await?,
        ),
        "postgres-tcp" => (
            "postgres over TCP".to_owned(),
            postgres_subjects(services::lookup(Service::Postgres)?.url(), quick),
        ),
        "postgres-unix" => (
            "postgres over the unix socket".to_owned(),
            postgres_subjects(services::lookup(Service::PostgresSocket)?.url(), quick),
        ),
        "etcd" => (
            "etcd, single member".to_owned(),
            etcd_subjects(&urls(Service::Etcd)?),
        ),
        "etcd-cluster" => (
            "etcd, 3-member cluster".to_owned(),
            etcd_subjects(&urls(Service::EtcdCluster)?),
        ),
        other => return Err(format!("no subjects for group {other:?}").into()),
    };
    g.title = title;
    g.subjects = subjects;
    Ok(g)
}
