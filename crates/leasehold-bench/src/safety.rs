//! `leasehold-bench safety`: the torture table. Every backend against every fault that applies
//! to it, N times, watched by the real-time checker of [`crate::safety_check`].
//!
//! Each trial has two clients, A and B, each a "process" of its own (see
//! [`Client`]). A takes a free lock and writes once; then the fault strikes while A holds the
//! lock; B tries to take the lock for a while and writes if it gets it; then A writes again
//! (checking its lease first, as a careful holder does, except where the fault is a pause
//! between that check and the write). The checker counts, per trial, whether two holders
//! overlapped and which stale writes the plain and the fenced store accepted.
//!
//! Destructive Redis faults (restart, clock jump) hit the dedicated nodes `safety1..3` of
//! `scripts/services`, never the shared ones; the etcd member kill stops and restarts one
//! member of the shared 3-member cluster (the leader).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use leasehold_core::{Capabilities, FencingKind, LockOptions, Locker, MemoryBackend};
use leasehold_etcd::{EtcdBackend, EtcdConfig};
use leasehold_file::{FileBackend, FileConfig};
use leasehold_postgres::{PostgresBackend, PostgresConfig, advisory_key, pg_locks_ids};
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::services::{self, NodeAction, Service};

use crate::harness::BoxError;
use crate::report::Table;
use crate::safety_check::{Acquired, Client, Trial, Wrote};

/// The backends, in table order.
pub(crate) const BACKENDS: [&str; 6] = ["memory", "file", "redis", "redlock", "postgres", "etcd"];

/// The faults, in table order, with their column titles.
pub(crate) const FAULTS: [(&str, &str); 8] = [
    ("pause", "client pause past the TTL"),
    ("delay", "response delayed past the TTL"),
    ("restart", "node restarted empty"),
    ("restart-delayed", "node restarted empty after the TTL"),
    ("clock-jump", "clock jump on one node"),
    ("pg-terminate", "pg_terminate_backend"),
    ("member-kill", "etcd leader killed"),
    ("lease-revoke", "etcd lease revoked"),
];

/// Env variables of the dedicated nodes (written by `scripts/services`).
const SAFETY_URLS_VAR: &str = "LEASEHOLD_TEST_SAFETY_REDIS_URLS";
const SAFETY_CLOCK_VAR: &str = "LEASEHOLD_TEST_SAFETY_CLOCK_FILE";
const SAFETY_NODES: [&str; 3] = ["safety1", "safety2", "safety3"];
/// Index of the node whose clock moves (safety3).
const CLOCK_NODE: usize = 2;
/// Index of the node the restart faults restart (safety2 for Redlock; safety1 serves the
/// single-node backend).
const RESTART_NODE: usize = 1;
const ETCD_CLUSTER_NODES: [&str; 3] = ["etcd-c1", "etcd-c2", "etcd-c3"];

/// Options of one run.
pub(crate) struct Params {
    pub(crate) runs: usize,
    pub(crate) backends: Vec<String>,
    pub(crate) faults: Vec<String>,
}

/// Whether `fault` applies to `backend`.
fn applies(backend: &str, fault: &str) -> bool {
    match fault {
        "pause" => true,
        "delay" => !matches!(backend, "memory" | "file"),
        "restart" | "restart-delayed" | "clock-jump" => matches!(backend, "redis" | "redlock"),
        "pg-terminate" => backend == "postgres",
        "member-kill" | "lease-revoke" => backend == "etcd",
        _ => false,
    }
}

/// Cells where an overlap breaks a promise the backend makes, whatever its safety class: the
/// invariants `--quick` enforces (with "stale writes accepted with fencing = 0" for every
/// backend whose fencing is monotonic). Each comes with the reason.
fn must_not_overlap(backend: &str, fault: &str) -> Option<&'static str> {
    match (backend, fault) {
        (_, "delay") => Some(
            "validity counts from before the request, so a grant that arrives after its TTL \
             is never acted on",
        ),
        ("postgres", "pause") => {
            Some("a paused holder's session still holds the advisory lock on the server")
        }
        ("file", "pause") => Some("a paused holder's process still holds the OS file lock"),
        ("etcd", "member-kill") => Some("the cluster keeps quorum, so the lease lives on"),
        ("redis" | "redlock", "restart-delayed") => Some(
            "the node returns only after every lease on it has run out (the documented mitigation)",
        ),
        _ => None,
    }
}

/// Cells where the fault must hand the lock to B within the trial (B took it in 10 of 10 runs
/// of the committed full table): a fault that silently did nothing (a proxy that added no
/// latency, a restart that never happened, a clock that did not move) shows as no takeover
/// there, and `--quick` fails. Each comes with what hands the lock over.
fn must_take_over(backend: &str, fault: &str) -> Option<&'static str> {
    match (backend, fault) {
        ("memory" | "redis" | "redlock" | "etcd", "pause") => {
            Some("the paused holder's lease runs out on the server while it sleeps")
        }
        ("redis" | "redlock" | "postgres" | "etcd", "delay") => {
            Some("the late grant is refused and given back, or runs out")
        }
        ("redis" | "redlock", "restart" | "restart-delayed") => {
            Some("the restarted node comes back empty")
        }
        ("redis" | "redlock", "clock-jump") => {
            Some("the jumped clock expires every key on the node")
        }
        ("postgres", "pg-terminate") => Some("the terminated session's advisory lock is freed"),
        ("etcd", "lease-revoke") => Some("the revoked lease deletes the holder's key"),
        _ => None,
    }
}

/// The tally of one (backend, fault) cell.
#[derive(Debug, Default, Clone)]
struct Cell {
    runs: u32,
    overlaps: u32,
    stale_plain: u32,
    stale_fenced: u32,
    rightful_rejected: u32,
    takeovers: u32,
    late_grants: u32,
    errors: Vec<String>,
    caps: Option<Capabilities>,
}

/// What one trial saw.
struct Outcome {
    overlap: bool,
    takeover: bool,
    late_grant: bool,
    trial: Arc<Trial>,
    caps: Capabilities,
}

/// Where the servers are, and what every trial of a run shares.
struct Env {
    tag: String,
    safety: Vec<String>,
    clock_file: Option<PathBuf>,
    postgres: Option<String>,
    etcd: Option<Vec<String>>,
    etcd_cluster: Option<Vec<String>>,
    file_dir: PathBuf,
    memory: MemoryBackend,
}

impl Env {
    fn load(backends: &[String]) -> Result<Self, BoxError> {
        let want = |b: &str| backends.iter().any(|x| x == b);
        let need = |s: Service| -> Result<Vec<String>, BoxError> {
            services::lookup(s)
                .map_err(|e| format!("{e}; run scripts/services up").into())
                .map(|ep| ep.urls().to_vec())
        };
        let safety: Vec<String> = if want("redis") || want("redlock") {
            let v = services::var(SAFETY_URLS_VAR).ok_or_else(|| {
                format!(
                    "{SAFETY_URLS_VAR} is not set (env file {}): run scripts/services up",
                    services::env_file().display()
                )
            })?;
            v.split(',').map(|s| s.trim().to_owned()).collect()
        } else {
            Vec::new()
        };
        if !safety.is_empty() && safety.len() != SAFETY_NODES.len() {
            return Err(format!("{SAFETY_URLS_VAR} must name 3 nodes, got {safety:?}").into());
        }
        let tag = services::unique_prefix("safety");
        Ok(Self {
            file_dir: std::env::temp_dir().join(&tag),
            tag,
            safety,
            clock_file: services::var(SAFETY_CLOCK_VAR).map(PathBuf::from),
            postgres: if want("postgres") {
                need(Service::Postgres)?.into_iter().next()
            } else {
                None
            },
            etcd: if want("etcd") {
                Some(need(Service::Etcd)?)
            } else {
                None
            },
            etcd_cluster: if want("etcd") {
                Some(need(Service::EtcdCluster)?)
            } else {
                None
            },
            memory: MemoryBackend::new(),
        })
    }
}

/// How to build one client's locker (on the client's own runtime).
#[derive(Clone)]
enum Spec {
    Memory(MemoryBackend),
    File(PathBuf),
    Redis {
        url: String,
        response_timeout: Duration,
    },
    Redlock(Vec<String>),
    Postgres(String),
    Etcd {
        endpoints: Vec<String>,
        session: Duration,
    },
}

const HEALTH: Duration = Duration::from_millis(100);

impl Spec {
    fn factory(
        self,
        ttl: Duration,
    ) -> impl FnOnce() -> futures_util::future::LocalBoxFuture<'static, Result<Locker, BoxError>>
    + Send
    + 'static {
        move || {
            async move {
                let opts = LockOptions::default().with_ttl(ttl);
                let locker = match self {
                    Spec::Memory(m) => Locker::new(m),
                    Spec::File(dir) => Locker::new(FileBackend::new(
                        FileConfig::new(dir).with_check_interval(Duration::from_millis(50)),
                    )?),
                    Spec::Redis {
                        url,
                        response_timeout,
                    } => {
                        let cfg = RedisConfig::from_url(&url)?
                            .with_timeouts(Duration::from_secs(1), response_timeout);
                        Locker::new(RedisBackend::connect(cfg).await?)
                    }
                    Spec::Redlock(urls) => {
                        Locker::new(RedlockBackend::new(RedlockConfig::from_urls(urls)?)?)
                    }
                    Spec::Postgres(url) => {
                        let cfg = PostgresConfig::from_url(&url)?
                            .with_health(HEALTH, HEALTH)?
                            .with_application_name("leasehold-bench-safety");
                        Locker::new(PostgresBackend::connect(cfg).await?)
                    }
                    Spec::Etcd { endpoints, session } => {
                        let cfg = EtcdConfig::new(endpoints)
                            .with_session_ttl(session)
                            .with_request_timeout(Duration::from_secs(10));
                        Locker::new(EtcdBackend::connect(cfg).await?)
                    }
                };
                Ok(locker.with_options(opts)?)
            }
            .boxed_local()
        }
    }
}

/// TTLs and pauses per backend: short, so that the full table takes minutes, and long enough
/// that a trial's own overhead (a node restart takes about half a second) does not decide it.
struct Timing {
    ttl: Duration,
    pause: Duration,
}

fn timing(backend: &str) -> Timing {
    match backend {
        // etcd's shortest lease is 2 s with the harness's 1 s election timeout; the pause
        // must outlast the session lease plus the lessor's expiry sweep (500 ms).
        "etcd" => Timing {
            ttl: Duration::from_secs(1),
            pause: Duration::from_millis(3_500),
        },
        "postgres" => Timing {
            ttl: Duration::from_millis(400),
            pause: Duration::from_millis(1_200),
        },
        _ => Timing {
            ttl: Duration::from_millis(300),
            pause: Duration::from_millis(1_000),
        },
    }
}

/// Runs the table, prints it and writes `safety.md` and `safety.csv` to `out`; an error if an
/// invariant failed or a trial could not run.
pub(crate) fn main(out: &Path, params: &Params) -> Result<(), BoxError> {
    for b in &params.backends {
        if !BACKENDS.contains(&b.as_str()) {
            return Err(format!("unknown backend {b:?}; expected some of {BACKENDS:?}").into());
        }
    }
    for f in &params.faults {
        if !FAULTS.iter().any(|(n, _)| n == f) {
            let names: Vec<_> = FAULTS.iter().map(|(n, _)| *n).collect();
            return Err(format!("unknown fault {f:?}; expected some of {names:?}").into());
        }
    }
    let rt = crate::harness::runtime("multi-thread")?;
    let started = Instant::now();
    let cells = rt.block_on(run_all(params))?;
    let elapsed = started.elapsed();
    let (md, csv, violations) = render(params, &cells, elapsed);
    println!("{md}");
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("safety.md"), &md)?;
    std::fs::write(out.join("safety.csv"), &csv)?;
    eprintln!(
        "wrote {} and {}",
        out.join("safety.md").display(),
        out.join("safety.csv").display()
    );
    if violations.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} safety invariant(s) failed:\n  {}",
            violations.len(),
            violations.join("\n  ")
        )
        .into())
    }
}

async fn run_all(params: &Params) -> Result<BTreeMap<(usize, usize), Cell>, BoxError> {
    let env = Env::load(&params.backends)?;
    let mut cells = BTreeMap::new();
    for (bi, backend) in BACKENDS.iter().enumerate() {
        if !params.backends.iter().any(|b| b == backend) {
            continue;
        }
        for (fi, (fault, _)) in FAULTS.iter().enumerate() {
            if !params.faults.iter().any(|f| f == fault) || !applies(backend, fault) {
                continue;
            }
            let mut cell = Cell::default();
            for i in 0..params.runs {
                let t0 = Instant::now();
                let result = trial(&env, backend, fault, i).await;
                match result {
                    Ok(o) => {
                        let w = o.trial.writes();
                        cell.runs += 1;
                        cell.overlaps += u32::from(o.overlap);
                        cell.takeovers += u32::from(o.takeover);
                        cell.late_grants += u32::from(o.late_grant);
                        cell.stale_plain += w.stale_plain;
                        cell.stale_fenced += w.stale_fenced;
                        cell.rightful_rejected += w.rightful_rejected;
                        cell.caps = Some(o.caps);
                    }
                    Err(e) => cell.errors.push(e.to_string()),
                }
                eprintln!(
                    "safety: {backend:>8} {fault:<15} run {}/{} {:>6} ms{}",
                    i + 1,
                    params.runs,
                    t0.elapsed().as_millis(),
                    cell.errors
                        .last()
                        .filter(|_| cell.runs as usize <= i)
                        .map(|e| format!("  ERROR: {e}"))
                        .unwrap_or_default()
                );
            }
            cells.insert((bi, fi), cell);
        }
    }
    let _ = std::fs::remove_dir_all(&env.file_dir);
    Ok(cells)
}

/// B tries `try_acquire` every 20 ms until it holds the lock (then writes once) or `until`.
async fn contend(b: &Client, key: &str, until: Instant) -> bool {
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
/// slowly than Redlock's per-node timeout, on a busy machine) is retried a few times: the
/// trial starts only once A holds the lock.
async fn a_takes(a: &Client, key: &str) -> Result<(), BoxError> {
    let mut last = Acquired::Failed;
    for _ in 0..10 {
        last = a.acquire(key).await;
        if last != Acquired::Failed {
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

/// Runs `scripts/services ACTION NODE` for any node, including the dedicated ones.
async fn ctl(node: &str, action: NodeAction) -> Result<(), BoxError> {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(services::services_script())
        .arg(action.as_str())
        .arg(node)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = services::var(services::SERVICES_DIR_VAR) {
        cmd.env(services::SERVICES_DIR_VAR, dir);
    }
    let out = cmd.output().await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "scripts/services {action} {node}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into())
    }
}

fn addr_of(url: &str) -> Result<std::net::SocketAddr, BoxError> {
    let hostport = url
        .split_once("://")
        .map_or(url, |(_, r)| r)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let hostport = hostport.rsplit_once('@').map_or(hostport, |(_, h)| h);
    Ok(hostport.parse()?)
}

/// A proxy in front of `url`'s server, and `url` rewritten to go through it.
async fn proxied(url: &str) -> Result<(FaultProxy, String), BoxError> {
    let addr = addr_of(url)?;
    let proxy = FaultProxy::start(addr).await?;
    let via = url.replacen(&addr.to_string(), &proxy.addr().to_string(), 1);
    Ok((proxy, via))
}

fn opt<'a, T>(v: &'a Option<T>, what: &str) -> Result<&'a T, BoxError> {
    v.as_ref()
        .ok_or_else(|| format!("{what} is not configured").into())
}

/// Moves the wall clock of the clock node forward by an hour: every TTL on it runs out.
fn jump_clock(env: &Env) -> Result<(), BoxError> {
    let file = opt(&env.clock_file, SAFETY_CLOCK_VAR)?;
    let now: i64 = std::fs::read_to_string(file)?.trim().parse()?;
    replace_file(file, format!("{}\n", now + 3_600_000).as_bytes())
}

/// Writes `contents` to a temporary file beside `file` (with `file`'s permissions) and renames
/// it over `file`: the clock shim of `scripts/services` reads the file on every clock call, and
/// a truncate-then-write would let it read an empty file (offset 0: the clock steps back).
fn replace_file(file: &Path, contents: &[u8]) -> Result<(), BoxError> {
    let mut name = file
        .file_name()
        .ok_or_else(|| format!("{} names no file", file.display()))?
        .to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    let tmp = file.with_file_name(name);
    let written = std::fs::write(&tmp, contents)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::metadata(file)?.permissions()))
        .and_then(|()| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(written?)
}

/// The spec of the backend under test for both clients, when they connect alike.
fn plain_spec(env: &Env, backend: &str) -> Result<Spec, BoxError> {
    Ok(match backend {
        "memory" => Spec::Memory(env.memory.clone()),
        "file" => Spec::File(env.file_dir.clone()),
        "redis" => Spec::Redis {
            url: env.safety[0].clone(),
            response_timeout: Duration::from_secs(1),
        },
        "redlock" => Spec::Redlock(env.safety.clone()),
        "postgres" => Spec::Postgres(opt(&env.postgres, "postgres")?.clone()),
        "etcd" => Spec::Etcd {
            endpoints: opt(&env.etcd, "etcd")?.clone(),
            session: Duration::from_secs(2),
        },
        other => return Err(format!("no spec for {other}").into()),
    })
}

async fn start_pair(
    trial: &Arc<Trial>,
    key: &str,
    a: Spec,
    b: Spec,
    ttl: Duration,
) -> Result<(Client, Client, Capabilities), BoxError> {
    let (a, caps) = Client::start("A", Arc::clone(trial), a.factory(ttl)).await?;
    let (b, _) = Client::start("B", Arc::clone(trial), b.factory(ttl)).await?;
    // Connect ahead: Redlock connects to its nodes lazily, and a first request that includes
    // the connection can miss a 5 ms per-node timeout.
    for c in [&a, &b] {
        for _ in 0..5 {
            if c.acquire(&format!("{key}-connect")).await == Acquired::Held {
                c.release().await;
                break;
            }
        }
    }
    Ok((a, b, caps))
}

/// One trial of `fault` on `backend`.
async fn trial(env: &Env, backend: &str, fault: &str, i: usize) -> Result<Outcome, BoxError> {
    let key = format!("{}/{backend}-{fault}-{i}", env.tag);
    let trial = Trial::new(&key);
    let Timing { ttl, pause } = timing(backend);
    let spec = plain_spec(env, backend)?;
    // Proxies live on this runtime, which never pauses.
    let mut proxies: Vec<FaultProxy> = Vec::new();
    let takeover;
    let mut late_grant = false;
    let (a, b, caps) = match fault {
        "pause" => {
            let (a, b, caps) = start_pair(&trial, &key, spec.clone(), spec, ttl).await?;
            a_takes(&a, &key).await?;
            let wrote = a.write_start(pause);
            takeover = contend(&b, &key, Instant::now() + pause).await;
            let _ = wrote.await;
            (a, b, caps)
        }
        "delay" => {
            let (a_spec, latency) = match spec.clone() {
                Spec::Redis { url, .. } => {
                    let (p, via) = proxied(&url).await?;
                    proxies.push(p);
                    (
                        Spec::Redis {
                            url: via,
                            response_timeout: Duration::from_secs(5),
                        },
                        ttl * 3 / 2,
                    )
                }
                Spec::Redlock(urls) => {
                    let mut via = Vec::new();
                    for u in &urls {
                        let (p, v) = proxied(u).await?;
                        proxies.push(p);
                        via.push(v);
                    }
                    (Spec::Redlock(via), ttl * 3 / 2)
                }
                Spec::Postgres(url) => {
                    let (p, via) = proxied(&url).await?;
                    proxies.push(p);
                    (Spec::Postgres(via), ttl * 3 / 2)
                }
                Spec::Etcd { endpoints, session } => {
                    let mut via = Vec::new();
                    for e in &endpoints {
                        let (p, v) = proxied(&format!("http://{e}")).await?;
                        proxies.push(p);
                        via.push(v.trim_start_matches("http://").to_owned());
                    }
                    (
                        Spec::Etcd {
                            endpoints: via,
                            session,
                        },
                        ttl * 3 / 2,
                    )
                }
                other @ (Spec::Memory(_) | Spec::File(_)) => (other, Duration::ZERO),
            };
            let (a, b, caps) = start_pair(&trial, &key, a_spec, spec, ttl).await?;
            // start_pair connected both clients (scripts loaded, sessions open) before the
            // network slows down.
            for p in &proxies {
                p.latency(latency);
            }
            let got = a.acquire_start(&key);
            // B starts once A's request has reached the server: the grant exists there, and
            // its answer is on the way back while the TTL runs out.
            tokio::time::sleep(latency + Duration::from_millis(50)).await;
            takeover = contend(&b, &key, Instant::now() + latency * 3 + ttl).await;
            match got.await {
                Ok(Acquired::Held) => {
                    let _ = a.write().await;
                }
                Ok(Acquired::LostOnArrival) => late_grant = true,
                _ => {}
            }
            (a, b, caps)
        }
        "restart" | "restart-delayed" | "clock-jump" => {
            let delayed = fault == "restart-delayed";
            let ttl = if delayed {
                Duration::from_secs(1)
            } else {
                // Long enough that A's lease outlives the restart itself.
                Duration::from_secs(5)
            };
            let (a_spec, node) = match (backend, fault) {
                ("redis", "clock-jump") => (
                    Spec::Redis {
                        url: env.safety[CLOCK_NODE].clone(),
                        response_timeout: Duration::from_secs(1),
                    },
                    CLOCK_NODE,
                ),
                ("redis", _) => (spec.clone(), 0),
                (_, f) => {
                    // Redlock: A cannot reach one node (a partition), so it holds a bare
                    // majority of two, and the fault hits the other node of that majority.
                    let hit = if f == "clock-jump" {
                        CLOCK_NODE
                    } else {
                        RESTART_NODE
                    };
                    let cut = (0..3).find(|n| *n != hit && *n != 0).unwrap_or(2);
                    let mut urls = env.safety.clone();
                    let (p, via) = proxied(&urls[cut]).await?;
                    p.blackhole();
                    proxies.push(p);
                    urls[cut] = via;
                    (Spec::Redlock(urls), hit)
                }
            };
            let b_spec = match (backend, fault) {
                ("redis", "clock-jump") => a_spec.clone(),
                _ => spec,
            };
            let (a, b, caps) = start_pair(&trial, &key, a_spec, b_spec, ttl).await?;
            // Some history on the key, so A's token is not the first (a reset shows).
            for _ in 0..2 {
                if b.acquire(&key).await == Acquired::Held {
                    b.release().await;
                }
            }
            a_takes(&a, &key).await?;
            let name = SAFETY_NODES[node];
            let mut early = false;
            match fault {
                "restart" => ctl(name, NodeAction::Restart).await?,
                "clock-jump" => jump_clock(env)?,
                _ => {
                    // Down for longer than any lease on it; B keeps trying meanwhile.
                    ctl(name, NodeAction::Stop).await?;
                    let down = Instant::now() + ttl * 3 / 2;
                    early = contend(&b, &key, down).await;
                    tokio::time::sleep_until(down.into()).await;
                    ctl(name, NodeAction::Start).await?;
                }
            }
            takeover = early || contend(&b, &key, Instant::now() + Duration::from_secs(1)).await;
            let _ = a.write().await;
            (a, b, caps)
        }
        "pg-terminate" => {
            let (a, b, caps) = start_pair(&trial, &key, spec.clone(), spec, ttl).await?;
            a_takes(&a, &key).await?;
            terminate(opt(&env.postgres, "postgres")?, &key).await?;
            takeover = contend(&b, &key, Instant::now() + Duration::from_secs(1)).await;
            let _ = a.write().await;
            (a, b, caps)
        }
        "member-kill" => {
            let endpoints = opt(&env.etcd_cluster, "etcd cluster")?.clone();
            let spec = Spec::Etcd {
                endpoints: endpoints.clone(),
                session: Duration::from_secs(3),
            };
            let (a, b, caps) = start_pair(&trial, &key, spec.clone(), spec, ttl).await?;
            a_takes(&a, &key).await?;
            let leader = etcd_leader(&endpoints).await?;
            let stopped = ctl(leader, NodeAction::Stop).await;
            takeover = contend(&b, &key, Instant::now() + Duration::from_secs(4)).await;
            let _ = a.write().await;
            ctl(leader, NodeAction::Start).await?;
            stopped?;
            (a, b, caps)
        }
        "lease-revoke" => {
            let (a, b, caps) = start_pair(&trial, &key, spec.clone(), spec, ttl).await?;
            a_takes(&a, &key).await?;
            revoke(opt(&env.etcd, "etcd")?, &key).await?;
            takeover = contend(&b, &key, Instant::now() + Duration::from_secs(1)).await;
            let _ = a.write().await;
            (a, b, caps)
        }
        other => return Err(format!("unknown fault {other}").into()),
    };
    b.release().await;
    a.release().await;
    drop((a, b));
    for p in &proxies {
        p.pass();
    }
    Ok(Outcome {
        overlap: trial.overlapped(),
        takeover,
        late_grant,
        trial,
        caps,
    })
}

/// `pg_terminate_backend` of the session holding `key`'s advisory lock.
async fn terminate(url: &str, key: &str) -> Result<(), BoxError> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(conn);
    let (classid, objid) = pg_locks_ids(advisory_key(key));
    let rows = client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
             AND granted AND classid = $1 AND objid = $2 AND objsubid = 1",
            &[&classid, &objid],
        )
        .await?;
    drop(client);
    let _ = conn.await;
    if rows.len() == 1 {
        Ok(())
    } else {
        Err(format!("expected one session holding {key:?}, found {}", rows.len()).into())
    }
}

/// Revokes the etcd lease of `key`'s holder (default prefix `leasehold/`).
async fn revoke(endpoints: &[String], key: &str) -> Result<(), BoxError> {
    let mut c = etcd_client::Client::connect(endpoints, None).await?;
    let prefix = format!("{}{key}/", leasehold_etcd::DEFAULT_PREFIX);
    let resp = c
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    let lease = resp
        .kvs()
        .iter()
        .min_by_key(|kv| kv.create_revision())
        .map(|kv| kv.lease())
        .ok_or_else(|| format!("no etcd key under {prefix:?}"))?;
    c.lease_revoke(lease).await?;
    Ok(())
}

/// The node name of the etcd cluster's leader (endpoints in etcd-c1..3 order).
async fn etcd_leader(endpoints: &[String]) -> Result<&'static str, BoxError> {
    for _ in 0..50 {
        let mut ids = Vec::new();
        let mut leader = None;
        for ep in endpoints {
            let status = match etcd_client::Client::connect([ep.as_str()], None).await {
                Ok(mut c) => c.status().await.ok(),
                Err(_) => None,
            };
            ids.push(
                status
                    .as_ref()
                    .and_then(|s| s.header())
                    .map(|h| h.member_id()),
            );
            if let Some(l) = status.map(|s| s.leader()).filter(|l| *l != 0) {
                leader = Some(l);
            }
        }
        if let Some(l) = leader
            && let Some(i) = ids.iter().position(|id| *id == Some(l))
            && let Some(name) = ETCD_CLUSTER_NODES.get(i)
        {
            return Ok(name);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err("no etcd cluster leader found".into())
}

/// The Markdown report, the CSV, and the invariant violations.
fn render(
    params: &Params,
    cells: &BTreeMap<(usize, usize), Cell>,
    elapsed: Duration,
) -> (String, String, Vec<String>) {
    let mut violations = Vec::new();
    let faults: Vec<(usize, &(&str, &str))> = FAULTS
        .iter()
        .enumerate()
        .filter(|(_, (f, _))| params.faults.iter().any(|x| x == f))
        .collect();
    let backends: Vec<(usize, &&str)> = BACKENDS
        .iter()
        .enumerate()
        .filter(|(_, b)| params.backends.iter().any(|x| x == *b))
        .collect();

    let mut header = vec!["backend"];
    header.extend(faults.iter().map(|(_, (_, title))| *title));
    let mut matrix = Table::new(
        &format!(
            "Overlapping holders / stale writes accepted without fencing / with fencing ({} run{} per cell)",
            params.runs,
            if params.runs == 1 { "" } else { "s" }
        ),
        &header,
    );
    let mut detail = Table::new(
        "Per cell",
        &[
            "backend",
            "fault",
            "runs",
            "B took the lock",
            "A's grant came back expired",
            "overlapping holders",
            "stale writes accepted, no fencing",
            "stale writes accepted, fenced",
            "newest holder's writes rejected",
            "errors",
        ],
    );
    let mut csv = String::from(
        "backend,fault,applies,runs,takeovers,late_grants,overlaps,stale_plain,stale_fenced,rightful_rejected,errors,fencing\n",
    );
    for (bi, backend) in &backends {
        let mut row = vec![format!("**{backend}**")];
        for (fi, (fault, _)) in &faults {
            let Some(c) = cells.get(&(*bi, *fi)) else {
                row.push("n/a".to_owned());
                let _ = writeln!(csv, "{backend},{fault},false,0,,,,,,,,");
                continue;
            };
            let fencing = c.caps.map(|k| k.fencing);
            let fenced = if fencing.is_some_and(FencingKind::mints_tokens) {
                c.stale_fenced.to_string()
            } else if fencing.is_none() {
                "?".to_owned()
            } else {
                "–".to_owned()
            };
            let err = if c.errors.is_empty() {
                String::new()
            } else {
                format!(" ({} failed)", c.errors.len())
            };
            row.push(format!(
                "{} / {} / {}{err}",
                c.overlaps, c.stale_plain, fenced
            ));
            detail.row(vec![
                (*backend).to_string(),
                (*fault).to_owned(),
                c.runs.to_string(),
                c.takeovers.to_string(),
                c.late_grants.to_string(),
                c.overlaps.to_string(),
                c.stale_plain.to_string(),
                if fenced == "–" {
                    "n/a (no token)".to_owned()
                } else {
                    fenced.clone()
                },
                c.rightful_rejected.to_string(),
                c.errors.len().to_string(),
            ]);
            let _ = writeln!(
                csv,
                "{backend},{fault},true,{},{},{},{},{},{},{},{},{}",
                c.runs,
                c.takeovers,
                c.late_grants,
                c.overlaps,
                c.stale_plain,
                if fenced == "–" {
                    String::new()
                } else {
                    c.stale_fenced.to_string()
                },
                c.rightful_rejected,
                c.errors.len(),
                match fencing {
                    Some(FencingKind::Monotonic) => "monotonic",
                    Some(FencingKind::BestEffort) => "best-effort",
                    Some(FencingKind::None) => "none",
                    _ => "unknown",
                }
            );
            for e in &c.errors {
                violations.push(format!("{backend} / {fault}: a trial failed: {e}"));
            }
            if fencing == Some(FencingKind::Monotonic) && c.stale_fenced > 0 {
                violations.push(format!(
                    "{backend} / {fault}: claims monotonic fencing, yet the fenced store \
                     accepted {} stale write(s)",
                    c.stale_fenced
                ));
            }
            if fencing == Some(FencingKind::Monotonic) && c.rightful_rejected > 0 {
                violations.push(format!(
                    "{backend} / {fault}: claims monotonic fencing, yet the fenced store \
                     rejected {} write(s) of the newest holder (its token went back)",
                    c.rightful_rejected
                ));
            }
            if let Some(why) = must_take_over(backend, fault)
                && c.runs > 0
                && c.takeovers == 0
            {
                violations.push(format!(
                    "{backend} / {fault}: B never took the lock in {} run(s), though {why}: \
                     did the fault strike?",
                    c.runs
                ));
            }
            if let Some(why) = must_not_overlap(backend, fault)
                && c.overlaps > 0
            {
                violations.push(format!(
                    "{backend} / {fault}: {} overlapping holder(s), impossible because {why}",
                    c.overlaps
                ));
            }
        }
        matrix.row(row);
    }
    matrix.note(
        "Each cell: trials in which two holders overlapped / stale writes the plain store \
         accepted / stale writes the fenced store accepted (– where the backend mints no token). \
         n/a: the fault does not apply."
            .to_owned(),
    );
    let mut md = String::from("## leasehold-bench safety\n\n");
    md.push_str(&matrix.markdown());
    md.push('\n');
    md.push_str(&detail.markdown());
    let _ = write!(
        md,
        "\n{} invariant(s) failed; {} s in all.\n",
        violations.len(),
        elapsed.as_secs()
    );
    for v in &violations {
        let _ = writeln!(md, "- FAILED: {v}");
    }
    (md, csv, violations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_invariant_names_a_cell_that_runs_and_every_fault_applies_somewhere() {
        for (fault, _) in FAULTS {
            assert!(
                BACKENDS.iter().any(|b| applies(b, fault)),
                "{fault} applies to no backend"
            );
            for b in BACKENDS {
                if must_not_overlap(b, fault).is_some() && !matches!(fault, "delay") {
                    assert!(
                        applies(b, fault),
                        "invariant on {b}/{fault}, which never runs"
                    );
                }
                if must_take_over(b, fault).is_some() {
                    assert!(
                        applies(b, fault),
                        "takeover on {b}/{fault}, which never runs"
                    );
                    assert!(
                        !matches!((b, fault), ("file" | "postgres", "pause")),
                        "a session-held lock cannot be taken over under a pause"
                    );
                }
            }
        }
        assert!(!applies("memory", "delay") && !applies("file", "restart"));
    }

    #[test]
    fn quick_mode_fails_on_a_fenced_stale_write_a_forbidden_overlap_or_a_fault_that_did_nothing() {
        use leasehold_core::SafetyClass;
        let params = Params {
            runs: 1,
            backends: BACKENDS.iter().map(|b| (*b).to_owned()).collect(),
            faults: FAULTS.iter().map(|(f, _)| (*f).to_owned()).collect(),
        };
        let idx = |b: &str, f: &str| {
            let bi = BACKENDS.iter().position(|x| *x == b).unwrap_or(usize::MAX);
            let fi = FAULTS
                .iter()
                .position(|(x, _)| *x == f)
                .unwrap_or(usize::MAX);
            (bi, fi)
        };
        let cell = |fencing, overlaps, stale_fenced| Cell {
            runs: 1,
            takeovers: 1,
            overlaps,
            stale_plain: overlaps,
            stale_fenced,
            caps: Some(Capabilities::new("test", SafetyClass::Correctness, fencing)),
            ..Cell::default()
        };
        let mut cells = BTreeMap::new();
        // Expected: an overlap under a pause; best-effort tokens that went back.
        cells.insert(idx("etcd", "pause"), cell(FencingKind::Monotonic, 1, 0));
        // ... whose rightful holder's writes the fenced store then rejects; a session-held
        // lock nobody took over under a pause.
        cells.insert(
            idx("redis", "restart"),
            Cell {
                rightful_rejected: 1,
                ..cell(FencingKind::BestEffort, 1, 1)
            },
        );
        cells.insert(
            idx("file", "pause"),
            Cell {
                takeovers: 0,
                ..cell(FencingKind::Monotonic, 0, 0)
            },
        );
        let (md, csv, violations) = render(&params, &cells, Duration::ZERO);
        assert!(violations.is_empty(), "{violations:?}");
        assert!(
            md.contains("| 1 / 1 / 0 |") && csv.contains("etcd,pause,true,1,"),
            "{md}"
        );
        // Violations: a monotonic token that let a stale write through; a forbidden overlap.
        cells.insert(
            idx("postgres", "pg-terminate"),
            cell(FencingKind::Monotonic, 1, 1),
        );
        cells.insert(idx("postgres", "pause"), cell(FencingKind::Monotonic, 1, 0));
        let (_, _, violations) = render(&params, &cells, Duration::ZERO);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains("postgres / pause"), "{violations:?}");
        assert!(
            violations[1].contains("monotonic fencing"),
            "{violations:?}"
        );
        // A fault that did nothing: nobody took the lock where the fault must hand it over.
        // A monotonic token that went back: the newest holder's write was rejected.
        cells.clear();
        cells.insert(
            idx("etcd", "lease-revoke"),
            Cell {
                takeovers: 0,
                ..cell(FencingKind::Monotonic, 0, 0)
            },
        );
        cells.insert(
            idx("memory", "pause"),
            Cell {
                rightful_rejected: 1,
                ..cell(FencingKind::Monotonic, 1, 0)
            },
        );
        let (_, _, violations) = render(&params, &cells, Duration::ZERO);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(
            violations[0].contains("memory / pause") && violations[0].contains("went back"),
            "{violations:?}"
        );
        assert!(
            violations[1].contains("etcd / lease-revoke")
                && violations[1].contains("never took the lock"),
            "{violations:?}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn replacing_a_file_keeps_its_permissions_and_leaves_no_temporary() -> Result<(), BoxError> {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = std::env::temp_dir().join(services::unique_prefix("safety-replace"));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("clock-offset-ms");
        std::fs::write(&file, "0\n")?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        let before = std::fs::metadata(&file)?;
        replace_file(&file, b"3600000\n")?;
        let after = std::fs::metadata(&file)?;
        assert_eq!(std::fs::read_to_string(&file)?, "3600000\n");
        assert_eq!(after.permissions().mode() & 0o777, 0o600);
        // A new inode: a reader that opened the old file sees it whole, never truncated.
        assert_ne!(before.ino(), after.ino());
        assert_eq!(
            std::fs::read_dir(&dir)?.count(),
            1,
            "a temporary file was left"
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn proxied_urls_keep_everything_but_the_address() -> Result<(), BoxError> {
        assert_eq!(
            addr_of("postgres://u:p@127.0.0.1:17432/db")?.to_string(),
            "127.0.0.1:17432"
        );
        assert_eq!(addr_of("redis://127.0.0.1:17451")?.port(), 17451);
        assert_eq!(addr_of("http://127.0.0.1:17479")?.port(), 17479);
        Ok(())
    }
}
