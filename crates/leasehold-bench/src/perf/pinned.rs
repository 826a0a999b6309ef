//! The pinned PostgreSQL groups (`postgres-tcp-pinned`, `postgres-unix-pinned`): our
//! try-acquire + release cycle (with its fencing token) against the raw prepared
//! `pg_try_advisory_lock` + `pg_advisory_unlock` cycle on one connection (with and without the
//! token, and on a second connection as a control), our driver without `Locker`, and with
//! `--features peers` sqlx's `PgAdvisoryLock` and distributed-lock-postgres. The raw
//! connections are plaintext, so ours are compared with `sslmode=disable`; one more row is ours
//! with the default `sslmode=prefer`, which takes TLS where the server offers it (over TCP; a
//! unix socket never uses TLS), against ours in plaintext: what TLS costs a cycle. The bench and the
//! server are pinned to different CPUs ([`Placement`]) and every figure is the median of
//! `--repeats` measurements, each on new connections.

use std::time::Duration;

use leasehold_core::{
    Held, LeaseMonitor, LockBackend as _, LockKey, LockOptions, LockRequest, Locker, Owner,
};
use leasehold_postgres::{PostgresBackend, PostgresConfig, advisory_key};
use leasehold_test_support::services::{self, Service};
#[cfg(feature = "peers")]
use sqlx::Connection as _;
#[cfg(feature = "peers")]
use sqlx::postgres::{PgAdvisoryLock, PgConnection};
use tokio::time::Instant;

use super::model::{Params, Row, Scenario};
use crate::harness::{BoxError, interleaved, runtime};
use crate::stats::{Spread, Summary};
#[cfg(feature = "peers")]
use crate::subjects::peers;
use crate::subjects::raw::RawPg;

const TTL: Duration = Duration::from_secs(30);

/// The `application_name` of the raw connections.
const RAW_APP: &str = "leasehold-bench-raw";

/// The cycles measured, in the order they run in each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cycle {
    /// `Locker::try_acquire` + `Lease::release` on [`PostgresBackend`] (token included),
    /// `sslmode=disable` as the raw connections.
    Ours,
    /// [`Cycle::Ours`] with the default `sslmode=prefer`: TLS where the server offers it.
    OursTls,
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
const CYCLES: [Cycle; 8] = [
    Cycle::Ours,
    Cycle::OursTls,
    Cycle::Raw,
    Cycle::RawToken,
    Cycle::RawTokenB,
    Cycle::Driver,
    Cycle::Sqlx,
    Cycle::DlPostgres,
];
#[cfg(not(feature = "peers"))]
const CYCLES: [Cycle; 6] = [
    Cycle::Ours,
    Cycle::OursTls,
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
    fn kind(self) -> &'static str {
        match self {
            Self::Ours | Self::OursTls | Self::Driver => "ours",
            Self::Raw | Self::RawToken | Self::RawTokenB => "raw",
            #[cfg(feature = "peers")]
            Self::Sqlx | Self::DlPostgres => "peer",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Ours => {
                "leasehold PostgresBackend try_acquire + release (with fencing token; \
                 sslmode=disable, as the raw connections)"
            }
            Self::OursTls => {
                "leasehold PostgresBackend try_acquire + release, default sslmode=prefer (TLS \
                 where offered)"
            }
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
}

/// Everything one transport's cycles need.
struct Fixture {
    ours: Locker,
    /// As `ours`, on a backend with the default `sslmode=prefer`.
    ours_tls: Locker,
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
    dl: peers::DlPostgres,
}

impl Fixture {
    /// `conninfo`: a `postgres://` URL or a libpq key=value string (unix socket).
    async fn new(conninfo: &str) -> Result<Self, BoxError> {
        let prefix = format!("{}/", services::unique_prefix("bench-pg"));
        let cfg = PostgresConfig::from_url(conninfo)?.with_prefix(prefix.clone())?;
        let options = LockOptions::default().with_ttl(TTL);
        let ours_tls = Locker::new(PostgresBackend::connect(cfg.clone()).await?)
            .with_options(options.clone())?;
        let backend = PostgresBackend::connect(cfg.with_tls("disable", None)?).await?;
        let seq = backend.config().fence_sequence_sql();
        let driver = backend.clone();
        let ours = Locker::new(backend).with_options(options)?;

        let raw = RawPg::connect_with_token(conninfo, RAW_APP, prefix.clone(), Some(&seq)).await?;
        let raw_b =
            RawPg::connect_with_token(conninfo, RAW_APP, prefix.clone(), Some(&seq)).await?;

        #[cfg(feature = "peers")]
        let sqlx = PgConnection::connect_with(&peers::sqlx_options(conninfo)?).await?;
        #[cfg(feature = "peers")]
        let dl = peers::DlPostgres::connect(
            &peers::sqlx08_url(conninfo, "leasehold-bench")?,
            format!("{prefix}dl/"),
        )
        .await?;
        Ok(Self {
            ours,
            ours_tls,
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
            Cycle::Ours => locker_cycle(&self.ours, &self.key).await?,
            Cycle::OursTls => locker_cycle(&self.ours_tls, &self.key).await?,
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
                crate::subjects::Lock::cycle(&self.dl, "cycle").await?;
            }
        }
        Ok(())
    }
}

/// One `try_acquire` + `release` of `key` on `locker`.
async fn locker_cycle(locker: &Locker, key: &LockKey) -> Result<(), BoxError> {
    let lease = locker
        .try_acquire(key)
        .await?
        .ok_or("ours: an uncontended key was not granted")?;
    if !lease.release().await? {
        return Err("ours: release reported the lock not held".into());
    }
    Ok(())
}

/// The ratios the pinned table gives, as `(numerator, denominator, what)`.
fn ratios() -> Vec<(Cycle, Cycle, &'static str)> {
    #[cfg_attr(not(feature = "peers"), allow(unused_mut))]
    let mut v = vec![
        // Against the raw cycle that mints the same one-statement token: the least a lock
        // with a fencing token sends, and the baseline of the PostgreSQL cycle target.
        (
            Cycle::Ours,
            Cycle::RawToken,
            "ours / raw with the same token",
        ),
        (
            Cycle::OursTls,
            Cycle::Ours,
            "ours, default sslmode / ours in plaintext",
        ),
        (Cycle::RawToken, Cycle::Raw, "raw with token / raw"),
        (
            Cycle::RawTokenB,
            Cycle::RawToken,
            "control: 2nd connection / 1st",
        ),
        (
            Cycle::Driver,
            Cycle::RawToken,
            "driver only / raw with the same token",
        ),
    ];
    #[cfg(feature = "peers")]
    v.extend([
        (Cycle::Sqlx, Cycle::Raw, "sqlx / raw"),
        (
            Cycle::DlPostgres,
            Cycle::Raw,
            "distributed-lock-postgres / raw",
        ),
    ]);
    v
}

/// One transport, on the current runtime: `p.repeats` measurements, each on new connections
/// (so on new server processes); a row per cycle with the medians over the repeats.
/// `placement` says where the bench and the server ran.
pub(super) async fn run(
    p: &Params,
    rt: &str,
    group: &str,
    service: Service,
    placement: &str,
) -> Vec<Row> {
    let base = Row {
        runtime: rt.to_owned(),
        group: format!("{group} ({placement})"),
        scenario: Scenario::Repeated,
        concurrency: 1,
        ..Row::default()
    };
    match measure(p, service).await {
        Ok(runs) => rows(&runs, &base, p.pinned_iterations),
        Err(e) => vec![Row {
            label: "(pinned PostgreSQL cycles)".into(),
            kind: "ours",
            error: Some(e.to_string()),
            ..base
        }],
    }
}

/// The summaries of every repeat, one per cycle of [`CYCLES`] each.
async fn measure(p: &Params, service: Service) -> Result<Vec<Vec<Summary>>, BoxError> {
    let conninfo = services::lookup(service)?.url().to_owned();
    // Warm-up: idle sessions, prepared statements, the server's caches.
    let warmup = (p.pinned_iterations / 10).clamp(1, 50);
    let mut runs = Vec::new();
    for _ in 0..p.repeats.max(1) {
        let mut fx = Fixture::new(&conninfo).await?;
        let s = interleaved(p.pinned_iterations, CYCLES.len(), warmup, async |i| {
            fx.cycle(CYCLES[i]).await
        })
        .await?;
        runs.push(s);
    }
    Ok(runs)
}

/// A row per cycle: medians over the repeats, and the cycle's ratio.
fn rows(runs: &[Vec<Summary>], base: &Row, iterations: usize) -> Vec<Row> {
    let median_of = |f: &dyn Fn(&[Summary]) -> f64| {
        let mut xs: Vec<f64> = runs.iter().map(|r| f(r)).collect();
        Spread::of(&mut xs)
    };
    let secs = |x: f64| Some(Duration::from_secs_f64(x));
    let ratios = ratios();
    CYCLES
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let ratio = ratios.iter().find(|(a, _, _)| a == c).map(|&(a, b, what)| {
                let (a, b) = (at(a), at(b));
                let s = median_of(&|r| r[a].p50.as_secs_f64() / r[b].p50.as_secs_f64());
                (s, what.to_owned())
            });
            Row {
                label: c.label().to_owned(),
                kind: c.kind(),
                cycles: iterations * runs.len(),
                p50: secs(median_of(&|r| r[i].p50.as_secs_f64()).median),
                p99: secs(median_of(&|r| r[i].p99.as_secs_f64()).median),
                per_sec: Some(median_of(&|r| r[i].per_sec).median),
                ratio,
                ..base.clone()
            }
        })
        .collect()
}

/// Where the bench and the server run: on a machine with two CPUs or more, the bench on the
/// first CPU it may use and PostgreSQL (postmaster and backends, via `scripts/services pin`) on
/// the last, both restored to every CPU when dropped. On a 2-vCPU machine the ratio of two
/// cycles otherwise depends on which vCPU the scheduler gives each connection's server process
/// (two identical raw connections were seen 0.5–1.9× apart). Runtimes built while it lives
/// inherit the bench's CPU.
pub(super) struct Placement {
    /// Said with every row of the pinned groups.
    pub(super) note: String,
    /// The bench's CPU mask before, when it pinned anything.
    restore: Option<nix::sched::CpuSet>,
}

impl Placement {
    /// Pins when `pin` and there are two CPUs or more.
    pub(super) fn new(pin: bool) -> Result<Self, BoxError> {
        use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
        use nix::unistd::Pid;
        let unpinned = |note: &str| Self {
            note: note.to_owned(),
            restore: None,
        };
        if !pin {
            return Ok(unpinned("CPU placement left to the scheduler"));
        }
        let allowed = sched_getaffinity(Pid::from_raw(0))?;
        let cpus: Vec<usize> = (0..CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .collect();
        let (Some(&client), Some(&server)) = (cpus.first(), cpus.last()) else {
            return Err("no CPU in this process's affinity mask".into());
        };
        if client == server {
            return Ok(unpinned("one CPU, shared"));
        }
        let rt = runtime("current-thread")?;
        rt.block_on(services::pin_node("postgres", &server.to_string()))?;
        let placement = Self {
            note: format!("bench on CPU {client}, PostgreSQL on CPU {server}"),
            restore: Some(allowed),
        };
        let mut mine = CpuSet::new();
        mine.set(client)?;
        sched_setaffinity(Pid::from_raw(0), &mine)?;
        Ok(placement)
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        let Some(mask) = self.restore.take() else {
            return;
        };
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &mask);
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
