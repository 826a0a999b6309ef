//! PostgreSQL: our try-acquire + release cycle (with its fencing token) against the raw
//! prepared `pg_try_advisory_lock` + `pg_advisory_unlock` cycle on one connection, and
//! against sqlx's `PgAdvisoryLock`, over TCP and over the unix socket of `scripts/services`.

use std::time::Duration;

use leasehold_core::{LockKey, LockOptions, Locker};
use leasehold_postgres::{PostgresBackend, PostgresConfig, advisory_key};
use leasehold_test_support::services::{self, Service};
#[cfg(feature = "peers")]
use sqlx::Connection as _;
#[cfg(feature = "peers")]
use sqlx::postgres::{PgAdvisoryLock, PgConnectOptions, PgConnection};
#[cfg(feature = "peers")]
use tokio_postgres::config::Host;
use tokio_postgres::{Client, NoTls, Statement};

use crate::Cli;
use crate::harness::{BoxError, Report, interleaved, runtime, runtimes};
use crate::report::{Bar, Table};
use crate::stats::{Summary, ms};

/// What one run of `leasehold-bench postgres` measures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    /// Sequential cycles per implementation and transport.
    pub(crate) iterations: usize,
}

/// The transport names `--transports` accepts.
pub(crate) const TRANSPORTS: [&str; 2] = ["tcp", "unix"];

const TTL: Duration = Duration::from_secs(30);

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
    /// sqlx 0.9 `PgAdvisoryLock::try_acquire` + `PgAdvisoryLockGuard::release_now`.
    #[cfg(feature = "peers")]
    Sqlx,
}

#[cfg(feature = "peers")]
const CYCLES: [Cycle; 4] = [Cycle::Ours, Cycle::Raw, Cycle::RawToken, Cycle::Sqlx];
#[cfg(not(feature = "peers"))]
const CYCLES: [Cycle; 3] = [Cycle::Ours, Cycle::Raw, Cycle::RawToken];

impl Cycle {
    fn label(self) -> &'static str {
        match self {
            Self::Ours => "leasehold PostgresBackend try_acquire + release (with fencing token)",
            Self::Raw => "raw prepared pg_try_advisory_lock + pg_advisory_unlock, one connection",
            Self::RawToken => "raw prepared try-lock-with-nextval + unlock, one connection",
            #[cfg(feature = "peers")]
            Self::Sqlx => "sqlx 0.9 PgAdvisoryLock try_acquire + release_now",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Self::Ours => "leasehold",
            Self::Raw => "raw try+unlock",
            Self::RawToken => "raw try+nextval+unlock",
            #[cfg(feature = "peers")]
            Self::Sqlx => "sqlx PgAdvisoryLock",
        }
    }
}

/// Everything one transport's cycles need.
struct Fixture {
    ours: Locker,
    key: LockKey,
    raw: Client,
    raw_id: i64,
    try_lock: Statement,
    try_lock_token: Statement,
    unlock: Statement,
    #[cfg(feature = "peers")]
    sqlx: PgConnection,
    #[cfg(feature = "peers")]
    sqlx_lock: PgAdvisoryLock,
}

impl Fixture {
    /// `conninfo`: a `postgres://` URL or a libpq key=value string (unix socket).
    async fn new(conninfo: &str) -> Result<Self, BoxError> {
        let prefix = format!("{}/", services::unique_prefix("bench-pg"));
        let cfg = PostgresConfig::from_url(conninfo)?.with_prefix(prefix.clone())?;
        let backend = PostgresBackend::connect(cfg).await?;
        let seq = backend.config().fence_sequence_sql();
        let ours = Locker::new(backend).with_options(LockOptions::default().with_ttl(TTL))?;

        let (raw, conn) = tokio_postgres::connect(conninfo, NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                eprintln!("leasehold-bench: raw connection ended: {e}");
            }
        });
        let try_lock = raw
            .prepare("SELECT pg_try_advisory_lock($1::bigint)")
            .await?;
        let try_lock_token = raw
            .prepare(&format!(
                "SELECT CASE WHEN pg_try_advisory_lock($1::bigint) THEN nextval('{}') END",
                seq.replace('\'', "''")
            ))
            .await?;
        let unlock = raw.prepare("SELECT pg_advisory_unlock($1::bigint)").await?;

        #[cfg(feature = "peers")]
        let sqlx = PgConnection::connect_with(&sqlx_options(conninfo)?).await?;
        Ok(Self {
            ours,
            key: LockKey::new("cycle")?,
            raw,
            raw_id: advisory_key(&format!("{prefix}raw")),
            try_lock,
            try_lock_token,
            unlock,
            #[cfg(feature = "peers")]
            sqlx,
            #[cfg(feature = "peers")]
            sqlx_lock: PgAdvisoryLock::new(format!("{prefix}sqlx")),
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
            Cycle::Raw | Cycle::RawToken => {
                let id = self.raw_id;
                let granted = if which == Cycle::Raw {
                    self.raw
                        .query_one(&self.try_lock, &[&id])
                        .await?
                        .try_get::<_, bool>(0)?
                } else {
                    self.raw
                        .query_one(&self.try_lock_token, &[&id])
                        .await?
                        .try_get::<_, Option<i64>>(0)?
                        .is_some()
                };
                if !granted {
                    return Err("raw: an uncontended key was not granted".into());
                }
                let unlocked: bool = self.raw.query_one(&self.unlock, &[&id]).await?.try_get(0)?;
                if !unlocked {
                    return Err("raw: unlock reported the lock not held".into());
                }
            }
            #[cfg(feature = "peers")]
            Cycle::Sqlx => match self.sqlx_lock.try_acquire(&mut self.sqlx).await? {
                sqlx::Either::Left(guard) => {
                    guard.release_now().await?;
                }
                sqlx::Either::Right(_) => {
                    return Err("sqlx: an uncontended key was not granted".into());
                }
            },
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

/// One transport, on the current runtime: a table and the chart's bars.
async fn transport(
    p: Params,
    rt: &str,
    name: &str,
    conninfo: &str,
) -> Result<(Table, Vec<Bar>), BoxError> {
    let mut fx = Fixture::new(conninfo).await?;
    // Warm-up: idle sessions, prepared statements, the server's caches.
    let warmup = (p.iterations / 10).clamp(1, 50);
    let s = interleaved(p.iterations, CYCLES.len(), warmup, async |i| {
        fx.cycle(CYCLES[i]).await
    })
    .await?;
    let mut t = Table::new(
        &format!(
            "PostgreSQL over {name}: lock + unlock cycle ({rt} runtime, {} cycles each)",
            p.iterations
        ),
        &["implementation", "p50", "p99", "cycles/s", "p50 vs raw"],
    );
    let raw_p50 = s[1].p50.as_secs_f64();
    let ratio = |x: &Summary| x.p50.as_secs_f64() / raw_p50;
    let mut bars = Vec::new();
    for (c, x) in CYCLES.iter().zip(&s) {
        t.row(vec![
            c.label().to_owned(),
            ms(x.p50),
            ms(x.p99),
            format!("{:.0}", x.per_sec),
            format!("{:.2}×", ratio(x)),
        ]);
        bars.push(Bar {
            label: format!("pg {name}: {} ({rt})", c.short()),
            ms: x.p50.as_secs_f64() * 1e3,
        });
    }
    t.note(format!(
        "Ours / raw prepared try + unlock, p50: **{:.3}×** (target ≤ 1.1×); ours / raw with the \
         same one-statement token: **{:.3}×**. Ours returns a fencing token, registers a health \
         check for the lease and checks `pg_advisory_unlock`'s answer; the raw cycles do the \
         last only.",
        ratio(&s[0]),
        s[0].p50.as_secs_f64() / s[2].p50.as_secs_f64(),
    ));
    #[cfg(feature = "peers")]
    t.note(format!(
        "sqlx PgAdvisoryLock / raw: **{:.3}×**.",
        ratio(&s[3])
    ));
    #[cfg(not(feature = "peers"))]
    t.note("Peer crates (sqlx's PgAdvisoryLock) not measured: build with `--features peers` to include them.".to_owned());
    Ok((t, bars))
}

/// `leasehold-bench postgres`: the chosen transports on the chosen runtimes; prints Markdown
/// and writes `postgres.md` and `postgres.svg` to the output folder.
pub(crate) fn main(cli: &Cli, p: Params, transports: &[String]) -> Result<(), BoxError> {
    for t in transports {
        if !TRANSPORTS.contains(&t.as_str()) {
            return Err(format!("unknown transport {t:?}; expected some of {TRANSPORTS:?}").into());
        }
    }
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
            let (t, b) = rt.block_on(transport(p, flavour, name, &conninfo))?;
            report.table(&t);
            report.bars(b);
        }
    }
    report.write(&cli.out, "PostgreSQL lock cycle p50 (lower is better)")
}
