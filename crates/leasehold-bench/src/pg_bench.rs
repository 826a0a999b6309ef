//! PostgreSQL: our try-acquire + release cycle (with its fencing token) against the raw
//! prepared `pg_try_advisory_lock` + `pg_advisory_unlock` cycle on one connection (with and
//! without the token, and on a second connection as a control), our driver without `Locker`,
//! and with `--features peers` sqlx's `PgAdvisoryLock` and distributed-lock-postgres, over TCP
//! and over the unix socket of `scripts/services`. The bench and the server are pinned to
//! different CPUs ([`Placement`]) and every cell is measured `--repeats` times.

use std::time::Duration;

use leasehold_core::{
    Held, LeaseMonitor, LockBackend as _, LockKey, LockOptions, LockRequest, Locker, Owner,
};
use leasehold_postgres::{PostgresBackend, PostgresConfig, advisory_key};
use leasehold_test_support::services::{self, Service};
#[cfg(feature = "peers")]
use sqlx::Connection as _;
#[cfg(feature = "peers")]
use sqlx::postgres::{PgAdvisoryLock, PgConnectOptions, PgConnection};
use tokio::time::Instant;
#[cfg(feature = "peers")]
use tokio_postgres::config::Host;

use crate::Cli;
use crate::harness::{BoxError, Report, interleaved, runtime, runtimes};
use crate::perf::subject::RawPg;
use crate::report::{Bar, Table};
use crate::stats::{Spread, Summary, ms};

/// What one run of `leasehold-bench postgres` measures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    /// Sequential cycles per implementation, transport and repeat.
    pub(crate) iterations: usize,
    /// Measurements per transport and runtime, each on new connections.
    pub(crate) repeats: usize,
    /// Whether to pin the bench and PostgreSQL to different CPUs (see [`Placement`]).
    pub(crate) pin: bool,
}

/// The transport names `--transports` accepts.
pub(crate) const TRANSPORTS: [&str; 2] = ["tcp", "unix"];

const TTL: Duration = Duration::from_secs(30);

/// The `application_name` of the raw connections.
const RAW_APP: &str = "leasehold-bench-raw";

/// The cycles measured, in the order they run in each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cycle {
    /// `Locker::try_acquire` + `Lease::release` on [`PostgresBackend`] (token included).
    Ours,
    /// Prepared `SELECT pg_try_advisory_lock($1)` + `SELECT pg_advisory_unlock($1)`.
    Raw,
    /// The raw cycle with our one-statement token: `CASE WHEN pg_try_advisory_lock($1) THEN
    /// nextval(..) END` + unlock.
    RawToken,
    /// [`Cycle::RawToken`] on a second connection: the control row. Two identical cycles
    /// differ only by noise and by their server processes; their ratio shows how far the
    /// bench can be trusted.
    RawTokenB,
    /// [`PostgresBackend`] called through the `LockBackend` trait, without `Locker` and
    /// `Lease`: how the cost splits between the driver and the core.
    Driver,
    /// sqlx 0.9 `PgAdvisoryLock::try_acquire` + `PgAdvisoryLockGuard::release_now`.
    #[cfg(feature = "peers")]
    Sqlx,
    /// distributed-lock-postgres 0.2 `try_acquire` + `release` (its own sqlx 0.8 pool).
    #[cfg(feature = "peers")]
    DlPostgres,
}

#[cfg(feature = "peers")]
const CYCLES: [Cycle; 7] = [
    Cycle::Ours,
    Cycle::Raw,
    Cycle::RawToken,
    Cycle::RawTokenB,
    Cycle::Driver,
    Cycle::Sqlx,
    Cycle::DlPostgres,
];
#[cfg(not(feature = "peers"))]
const CYCLES: [Cycle; 5] = [
    Cycle::Ours,
    Cycle::Raw,
    Cycle::RawToken,
    Cycle::RawTokenB,
    Cycle::Driver,
];

/// Where `c` is in [`CYCLES`] (and so in each run's summaries).
fn at(c: Cycle) -> usize {
    CYCLES.iter().position(|x| *x == c).unwrap_or(0)
}

impl Cycle {
    fn label(self) -> &'static str {
        match self {
            Self::Ours => "leasehold PostgresBackend try_acquire + release (with fencing token)",
            Self::Raw => "raw prepared pg_try_advisory_lock + pg_advisory_unlock, one connection",
            Self::RawToken => "raw prepared try-lock-with-nextval + unlock, one connection",
            Self::RawTokenB => {
                "control: the raw try-lock-with-nextval + unlock on a second connection"
            }
            Self::Driver => {
                "leasehold PostgresBackend::try_lock + release, no Locker (driver only)"
            }
            #[cfg(feature = "peers")]
            Self::Sqlx => "sqlx 0.9 PgAdvisoryLock try_acquire + release_now",
            #[cfg(feature = "peers")]
            Self::DlPostgres => "distributed-lock-postgres 0.2 try_acquire + release",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Self::Ours => "leasehold",
            Self::Raw => "raw try+unlock",
            Self::RawToken => "raw try+nextval+unlock",
            Self::RawTokenB => "raw try+nextval+unlock, 2nd connection",
            Self::Driver => "leasehold driver only",
            #[cfg(feature = "peers")]
            Self::Sqlx => "sqlx PgAdvisoryLock",
            #[cfg(feature = "peers")]
            Self::DlPostgres => "distributed-lock-postgres",
        }
    }
}

/// Everything one transport's cycles need.
struct Fixture {
    ours: Locker,
    /// The same backend as `ours`, called without the `Locker`.
    driver: PostgresBackend,
    /// A long-lived owner value for the driver's requests (the `Locker` draws one per
    /// acquisition; PostgreSQL never sees it).
    owner: Owner,
    key: LockKey,
    raw: RawPg,
    /// A second raw connection running the same cycle: the control row.
    raw_b: RawPg,
    raw_id: i64,
    #[cfg(feature = "peers")]
    sqlx: PgConnection,
    #[cfg(feature = "peers")]
    sqlx_lock: PgAdvisoryLock,
    #[cfg(feature = "peers")]
    dl: crate::perf::peers::DlPostgres,
}

impl Fixture {
    /// `conninfo`: a `postgres://` URL or a libpq key=value string (unix socket).
    async fn new(conninfo: &str) -> Result<Self, BoxError> {
        let prefix = format!("{}/", services::unique_prefix("bench-pg"));
        let cfg = PostgresConfig::from_url(conninfo)?.with_prefix(prefix.clone())?;
        let backend = PostgresBackend::connect(cfg).await?;
        let seq = backend.config().fence_sequence_sql();
        let driver = backend.clone();
        let ours = Locker::new(backend).with_options(LockOptions::default().with_ttl(TTL))?;

        let raw = RawPg::connect_with_token(conninfo, RAW_APP, prefix.clone(), Some(&seq)).await?;
        let raw_b =
            RawPg::connect_with_token(conninfo, RAW_APP, prefix.clone(), Some(&seq)).await?;

        #[cfg(feature = "peers")]
        let sqlx = PgConnection::connect_with(&sqlx_options(conninfo)?).await?;
        #[cfg(feature = "peers")]
        let dl = crate::perf::peers::DlPostgres::connect(
            &crate::perf::peers::sqlx08_url(conninfo, "leasehold-bench")?,
            format!("{prefix}dl/"),
        )
        .await?;
        Ok(Self {
            ours,
            driver,
            owner: Owner::random()?,
            key: LockKey::new("cycle")?,
            raw,
            raw_b,
            raw_id: advisory_key(&format!("{prefix}raw")),
            #[cfg(feature = "peers")]
            sqlx,
            #[cfg(feature = "peers")]
            sqlx_lock: PgAdvisoryLock::new(format!("{prefix}sqlx")),
            #[cfg(feature = "peers")]
            dl,
        })
    }

    async fn cycle(&mut self, which: Cycle) -> Result<(), BoxError> {
        match which {
            Cycle::Ours => {
                let lease = self
                    .ours
                    .try_acquire(&self.key)
                    .await?
                    .ok_or("ours: an uncontended key was not granted")?;
                if !lease.release().await? {
                    return Err("ours: release reported the lock not held".into());
                }
            }
            Cycle::Driver => {
                let monitor = LeaseMonitor::detached();
                let ttl = TTL;
                let req = LockRequest::new(&self.key, &self.owner, ttl, Instant::now(), &monitor);
                let grant = self
                    .driver
                    .try_lock(req)
                    .await?
                    .ok_or("driver: an uncontended key was not granted")?;
                let state = grant.state.as_deref().map(|s| s as _);
                let held = Held::new(&self.key, &self.owner, grant.fencing, state);
                if !self.driver.release(held).await? {
                    return Err("driver: release reported the lock not held".into());
                }
            }
            Cycle::Raw => self.raw.cycle_id(self.raw_id, false).await?,
            Cycle::RawToken => self.raw.cycle_id(self.raw_id, true).await?,
            Cycle::RawTokenB => self.raw_b.cycle_id(self.raw_id, true).await?,
            #[cfg(feature = "peers")]
            Cycle::Sqlx => match self.sqlx_lock.try_acquire(&mut self.sqlx).await? {
                sqlx::Either::Left(guard) => {
                    guard.release_now().await?;
                }
                sqlx::Either::Right(_) => {
                    return Err("sqlx: an uncontended key was not granted".into());
                }
            },
            #[cfg(feature = "peers")]
            Cycle::DlPostgres => {
                crate::perf::subject::Client::cycle(&self.dl, "cycle").await?;
            }
        }
        Ok(())
    }
}

#[cfg(feature = "peers")]
/// sqlx connect options from a URL or a libpq key=value string (via tokio-postgres' parser).
pub(crate) fn sqlx_options(conninfo: &str) -> Result<PgConnectOptions, BoxError> {
    let pg: tokio_postgres::Config = conninfo.parse()?;
    let mut opts = PgConnectOptions::new_without_pgpass();
    match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => opts = opts.host(h),
        Some(Host::Unix(dir)) => opts = opts.socket(dir),
        None => return Err("no host in the connection string".into()),
    }
    if let Some(port) = pg.get_ports().first() {
        opts = opts.port(*port);
    }
    if let Some(user) = pg.get_user() {
        opts = opts.username(user);
    }
    if let Some(password) = pg.get_password() {
        opts = opts.password(std::str::from_utf8(password)?);
    }
    if let Some(db) = pg.get_dbname() {
        opts = opts.database(db);
    }
    Ok(opts)
}

/// One transport, on the current runtime: `p.repeats` measurements, each on new connections
/// (so on new server processes); a table of the medians over the repeats, and the chart's bars.
async fn transport(
    p: Params,
    rt: &str,
    name: &str,
    conninfo: &str,
    placement: &str,
) -> Result<(Table, Vec<Bar>), BoxError> {
    // Warm-up: idle sessions, prepared statements, the server's caches.
    let warmup = (p.iterations / 10).clamp(1, 50);
    let repeats = p.repeats.max(1);
    let mut runs = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let mut fx = Fixture::new(conninfo).await?;
        let s = interleaved(p.iterations, CYCLES.len(), warmup, async |i| {
            fx.cycle(CYCLES[i]).await
        })
        .await?;
        runs.push(s);
    }
    let median_of = |f: &dyn Fn(&[Summary]) -> f64| {
        let mut xs: Vec<f64> = runs.iter().map(|r| f(r)).collect();
        Spread::of(&mut xs)
    };
    let mut t = Table::new(
        &format!(
            "PostgreSQL over {name}: lock + unlock cycle ({rt} runtime, {} cycles each, \
             {repeats} repeats)",
            p.iterations
        ),
        &[
            "implementation",
            "p50",
            "p99",
            "cycles/s",
            "p50 vs raw (median [range] of repeats)",
        ],
    );
    let raw = at(Cycle::Raw);
    let mut bars = Vec::new();
    for (i, c) in CYCLES.iter().enumerate() {
        let p50 = median_of(&|r| r[i].p50.as_secs_f64());
        let p99 = median_of(&|r| r[i].p99.as_secs_f64());
        let rate = median_of(&|r| r[i].per_sec);
        let ratio = median_of(&|r| r[i].p50.as_secs_f64() / r[raw].p50.as_secs_f64());
        t.row(vec![
            c.label().to_owned(),
            secs_ms(p50.median),
            secs_ms(p99.median),
            format!("{:.0}", rate.median),
            ratio.times(),
        ]);
        bars.push(Bar {
            label: format!("pg {name}: {} ({rt})", c.short()),
            ms: p50.median * 1e3,
        });
    }
    let ours = at(Cycle::Ours);
    let token = at(Cycle::RawToken);
    let vs = |a: usize, b: usize| median_of(&|r| r[a].p50.as_secs_f64() / r[b].p50.as_secs_f64());
    t.note(format!(
        "Ours / raw prepared try + unlock, p50: **{}** (target ≤ 1.1×); ours / raw with the \
         same one-statement token: **{}** (the driver alone, without `Locker`: **{}**); \
         control, the raw cycle with token on a second connection / on the first: **{}**. \
         Each repeat measures every implementation in alternating rounds on new connections; \
         figures are medians over the repeats, with their range. Ours returns a fencing \
         token, registers a health check for the lease and checks `pg_advisory_unlock`'s \
         answer; the raw cycles do the last only. {placement}",
        vs(ours, raw).times(),
        vs(ours, token).times(),
        vs(at(Cycle::Driver), token).times(),
        vs(at(Cycle::RawTokenB), token).times(),
    ));
    #[cfg(feature = "peers")]
    t.note(format!(
        "sqlx PgAdvisoryLock / raw: **{}**; distributed-lock-postgres / raw: **{}**; ours / \
         distributed-lock-postgres: **{}**.",
        vs(at(Cycle::Sqlx), raw).times(),
        vs(at(Cycle::DlPostgres), raw).times(),
        vs(ours, at(Cycle::DlPostgres)).times(),
    ));
    #[cfg(not(feature = "peers"))]
    t.note("Peer crates (sqlx's PgAdvisoryLock, distributed-lock-postgres) not measured: build with `--features peers` to include them.".to_owned());
    Ok((t, bars))
}

fn secs_ms(secs: f64) -> String {
    ms(Duration::from_secs_f64(secs))
}

/// Where the bench and the server run: on a machine with two CPUs or more, the bench on the
/// first CPU it may use and PostgreSQL (postmaster and backends, via `scripts/services pin`) on
/// the last, restored to every CPU when dropped. On a 2-vCPU machine the ratio of two cycles
/// otherwise depends on which vCPU the scheduler gives each connection's server process (two
/// identical raw connections were seen 0.5–1.9× apart).
struct Placement {
    /// Said under every table.
    note: String,
    pinned: bool,
}

impl Placement {
    fn new(pin: bool) -> Result<Self, BoxError> {
        use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
        use nix::unistd::Pid;
        if !pin {
            return Ok(Self {
                note: "CPU placement left to the scheduler (`--no-pin`).".to_owned(),
                pinned: false,
            });
        }
        let allowed = sched_getaffinity(Pid::from_raw(0))?;
        let cpus: Vec<usize> = (0..CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .collect();
        let (Some(&client), Some(&server)) = (cpus.first(), cpus.last()) else {
            return Err("no CPU in this process's affinity mask".into());
        };
        if client == server {
            return Ok(Self {
                note: "One CPU: the bench and PostgreSQL share it.".to_owned(),
                pinned: false,
            });
        }
        let rt = runtime("current-thread")?;
        rt.block_on(services::pin_node("postgres", &server.to_string()))?;
        let placement = Self {
            note: format!(
                "The bench ran on CPU {client}, PostgreSQL (postmaster and backends) on CPU \
                 {server}."
            ),
            pinned: true,
        };
        // The runtimes are built after this: their threads inherit the main thread's mask.
        let mut mine = CpuSet::new();
        mine.set(client)?;
        sched_setaffinity(Pid::from_raw(0), &mine)?;
        Ok(placement)
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        if !self.pinned {
            return;
        }
        let restored = runtime("current-thread")
            .and_then(|rt| Ok(rt.block_on(services::pin_node("postgres", "all"))?));
        if let Err(e) = restored {
            eprintln!(
                "leasehold-bench: could not restore PostgreSQL's CPU affinity ({e}); \
                 run `scripts/services pin postgres all`"
            );
        }
    }
}

/// `leasehold-bench postgres`: the chosen transports on the chosen runtimes; prints Markdown
/// and writes `postgres.md` and `postgres.svg` to the output folder.
pub(crate) fn main(cli: &Cli, p: Params, transports: &[String]) -> Result<(), BoxError> {
    for t in transports {
        if !TRANSPORTS.contains(&t.as_str()) {
            return Err(format!("unknown transport {t:?}; expected some of {TRANSPORTS:?}").into());
        }
    }
    let placement = Placement::new(p.pin)?;
    let mut report = Report::new("postgres");
    for flavour in runtimes(cli.runtime) {
        let rt = runtime(flavour)?;
        for (short, name, service) in [
            ("tcp", "TCP (127.0.0.1)", Service::Postgres),
            ("unix", "the unix socket", Service::PostgresSocket),
        ] {
            if !transports.iter().any(|t| t == short) {
                continue;
            }
            let conninfo = services::lookup(service)?.url().to_owned();
            let (t, b) = rt.block_on(transport(p, flavour, name, &conninfo, &placement.note))?;
            report.table(&t);
            report.bars(b);
        }
    }
    report.write(&cli.out, "PostgreSQL lock cycle p50 (lower is better)")
}
